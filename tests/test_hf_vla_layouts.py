"""Golden tests of examples/hf_vla's action-token map on real vocabulary layouts, built offline: which vocabulary ids
the bins read, pinned, on

- PaliGemma-3B's layout: Gemma's 256,000 text tokens (with Gemma's special tokens where Gemma has them: <pad> 0,
  <eos> 1, <bos> 2, <unk> 3, <mask> 4, <2mass> 5, [@BOS@] 6, <unused0..98> 7-105, <start_of_turn> 106,
  <end_of_turn> 107), then <loc0000>..<loc1023> (256,000-257,023), <seg000>..<seg127> (257,024-257,151) and
  <image> 257,152: a tokenizer of 257,153 tokens, and an LM head of 257,216 rows (63 padding rows no token has);
- OpenVLA's: Llama-2's 32,000 tokens (<unk> 0, <s> 1, </s> 2, the 256 byte tokens 3-258) plus the <PAD> OpenVLA
  adds (32,000), and an LM head of 32,064 rows;
- SmolVLM2's (SmolVLA's backbone, SmolVLM2-500M-Video-Instruct; SmolVLM's is the same): SmolLM2's 49,152 tokens (its
  17 special tokens <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2, ..., <empty_output> 16), then the 128 SmolVLM adds:
  <global-img> 49,152, <row_1_col_1>..<row_6_col_6> 49,153-49,188, <fake_token_around_image> 49,189, <image> 49,190,
  <|reserved_special_token_0..87|> 49,191-49,278, <end_of_utterance> 49,279: 49,280 tokens and LM-head rows.

The models (PaliGemma for the first two, SmolVLM for the third) have the real vocabulary sizes and special-token
positions, one layer, the smallest widths and random weights, saved to a directory and loaded with
``from_pretrained`` as a real checkpoint is. The text tokens are placeholders (``t<id>``): what is pinned is
positions, not Gemma's, Llama's or SmolLM2's pieces."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PaliGemmaForConditionalGeneration, PreTrainedTokenizerFast, SmolVLMForConditionalGeneration

from cleanrl_embodied.shared.envs import make_env
from examples.hf_vla import make_policy, tiny_paligemma, tiny_smolvlm
from examples.hf_vla.action_tokens import ActionTokenMap, build_action_token_map
from tests.checks import one_line_exit
from tests.hf_vla_policies import policy_flags

SIZE = 32
ENV_KWARGS = {"obs_mode": "rgb", "image_size": SIZE, "action_mode": "ee_delta_pos"}
PALIGEMMA_TOKENS, PALIGEMMA_ROWS = 257_153, 257_216
LLAMA_TOKENS, OPENVLA_ROWS = 32_000, 32_064
SMOLLM2_TOKENS, SMOLVLM_TOKENS = 49_152, 49_280


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/conftest.py


def word_level(vocab: dict[str, int], unk: str, **special) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=unk, **special)


def paligemma_tokenizer() -> PreTrainedTokenizerFast:
    """PaliGemma's layout: Gemma's 256,000 (specials at Gemma's ids), 1024 <loc>, 128 <seg>, then <image>."""
    names = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 5: "<2mass>", 6: "[@BOS@]"}
    names.update({7 + i: f"<unused{i}>" for i in range(99)})
    names.update({106: "<start_of_turn>", 107: "<end_of_turn>"})
    vocab = {names.get(i, f"t{i}"): i for i in range(256_000)}
    vocab.update({f"<loc{i:04d}>": 256_000 + i for i in range(1024)})
    vocab.update({f"<seg{i:03d}>": 257_024 + i for i in range(128)})
    tokenizer = word_level(vocab, "<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tokenizer


def llama_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-2's layout (<unk> 0, <s> 1, </s> 2, bytes 3-258, 32,000 tokens) and OpenVLA's added <PAD> (32,000)."""
    names = {0: "<unk>", 1: "<s>", 2: "</s>"} | {3 + b: f"<0x{b:02X}>" for b in range(256)}
    tokenizer = word_level({names.get(i, f"t{i}"): i for i in range(LLAMA_TOKENS)}, "<unk>", bos_token="<s>",
                           eos_token="</s>")  # fmt: skip
    tokenizer.add_special_tokens({"pad_token": "<PAD>"})
    return tokenizer


def save_checkpoint(path, tokenizer, rows: int, image_id: int) -> None:
    """A PaliGemma of ``rows`` vocabulary rows (one layer, width 16, random weights) with ``tokenizer``, saved."""
    special = {"pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id,
               "image": image_id}  # fmt: skip
    torch.manual_seed(0)
    config = tiny_paligemma(rows, (SIZE, SIZE), special, hidden_size=16, num_layers=1, num_heads=2,
                            intermediate_size=32)  # fmt: skip
    PaliGemmaForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="module")
def paligemma_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("paligemma_3b_layout")
    tokenizer = paligemma_tokenizer()
    assert len(tokenizer) == PALIGEMMA_TOKENS and tokenizer.convert_tokens_to_ids("<image>") == 257_152
    save_checkpoint(path, tokenizer, PALIGEMMA_ROWS, 257_152)
    return path


@pytest.fixture(scope="module")
def openvla_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("openvla_layout")
    tokenizer = llama_tokenizer()
    assert len(tokenizer) == LLAMA_TOKENS + 1 and tokenizer.vocab_size == LLAMA_TOKENS
    save_checkpoint(path, tokenizer, OPENVLA_ROWS, image_id=LLAMA_TOKENS)  # (no image token: the VLA embeds images)
    return path


def load(path, bins: int, **kwargs):
    env = make_env("PushCubeLangRL", num_envs=2, seed=0, **ENV_KWARGS)
    flags = policy_flags("bins", bins)
    policy = make_policy(env.single_observation_space, env.single_action_space, flags, model_path=str(path),
                         action_stats="env_bounds", lora_rank=2, **kwargs)  # fmt: skip
    return policy, env


def reads_rows(policy, env, ids: list[int]) -> None:
    """The bins' logits are the slots' hidden states times exactly the LM-head rows ``ids`` (in float32)."""
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        slots, _ = policy.features(obs, policy.action_head)
        dist = policy._dist(slots, policy.action_head)
    rows = policy.backbone.get_output_embeddings().weight[ids].float()
    expected = torch.log_softmax(F.linear(slots.float(), rows), -1).view_as(dist.logits)
    torch.testing.assert_close(dist.logits, expected, rtol=0, atol=1e-6)


# ---- PaliGemma-3B ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bins", [16, 256])
def test_paligemma_bins_are_the_top_of_gemmas_text_vocabulary(paligemma_dir, bins):
    policy, env = load(paligemma_dir, bins)
    ids = list(policy.token_map.ids)
    assert policy.token_map.convention == "paligemma"  # the family's default for a plain PaliGemma checkpoint
    assert ids[:3] == [255_999, 255_998, 255_997] and ids[-1] == 256_000 - bins
    assert ids == list(range(255_999, 255_999 - bins, -1))  # bin k -> id 255,999 - k
    assert policy.tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == ["t255999", f"t{256_000 - bins}"]
    assert policy.token_map.skipped == (
        (256_000, 257_023, "<loc>"),
        (257_024, 257_151, "<seg>"),
        (257_152, 257_152, "<image>"),
        (257_153, 257_215, "LM-head padding (no token)"),
    )
    assert policy.config.action_tokens["ids"] == ids  # what vla_config.json records
    assert policy.backbone.get_output_embeddings().weight.shape[0] == PALIGEMMA_ROWS
    reads_rows(policy, env, ids)
    values = torch.tensor(policy.token_map.values)  # N equal cells over [-1, 1], at their centres
    assert torch.allclose(values, torch.linspace(-1 + 1 / bins, 1 - 1 / bins, bins).double().float())


def test_paligemma_openpi_convention_counts_down_through_the_loc_block(paligemma_dir):
    """openpi (pi0-FAST, and its binning baseline) maps token t to sp.vocab_size() - 1 - 128 - t with the 257,152-
    piece PaliGemma SentencePiece model: 257,023 - t, from <loc1023> down."""
    policy, env = load(paligemma_dir, 256, action_tokens="openpi")
    ids = list(policy.token_map.ids)
    assert ids == [257_152 - 1 - 128 - t for t in range(256)] and ids[0] == 257_023 and ids[-1] == 256_768
    assert policy.tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == ["<loc1023>", "<loc0768>"]
    assert policy.token_map.skipped[0] == (257_024, 257_151, "<seg>")
    reads_rows(policy, env, ids)


def openpi_binning(tokens: np.ndarray, x: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """openpi's BinningTokenizer (src/openpi/models/tokenizer.py), as its source states it: action token t (counted
    from the top, after the 128 <seg>) decodes to t / n_bins * 2 - 1 (extract_actions); a value in [-1, 1] is
    discretised as its state is, np.digitize(x, np.linspace(-1, 1, n_bins + 1)[:-1]) - 1."""
    return tokens / n_bins * 2 - 1, np.digitize(x, bins=np.linspace(-1, 1, n_bins + 1)[:-1]) - 1


@pytest.mark.parametrize("bins", [16, 256])
def test_openpi_bins_decode_and_encode_as_openpis_binning_tokenizer(paligemma_dir, bins):
    """openpi's bins are N equal cells over [-1, 1] decoded at their lower ends (t / N * 2 - 1, not the centre,
    which is 1/N higher), and a value falls in the cell that holds it, its lower end included: golden values from
    openpi's formulas, on the real layout, through the policy's decoding and binning."""
    policy, env = load(paligemma_dir, bins, action_tokens="openpi")
    token_map, t = policy.token_map, np.arange(bins)
    expected, _ = openpi_binning(t, np.zeros(1), bins)
    assert token_map.values == tuple(expected.tolist())  # exactly: -1, -1 + 2/N, ..., 1 - 2/N
    assert token_map.values[0] == -1.0 and token_map.values[bins // 2] == 0.0
    x = np.concatenate([np.linspace(-1, 1, 4001), expected, [1.0]])
    _, reference = openpi_binning(t, x, bins)
    index = torch.bucketize(torch.tensor(x), torch.tensor(token_map.edges, dtype=torch.float64), right=True)
    assert torch.equal(index, torch.from_numpy(reference))
    # the policy over the env's bounds [-1, 1]: bin t -> t / N * 2 - 1, and each value back to its own bin
    every_bin = policy.env_action(torch.arange(float(bins)).view(bins, 1).expand(bins, 3))
    torch.testing.assert_close(every_bin[:, 0], torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-7)
    assert torch.equal(policy.action_bins(every_bin), torch.arange(float(bins)).view(bins, 1).expand(bins, 3))


def test_a_map_onto_padding_rows_or_special_tokens_is_refused(paligemma_dir):
    """The old mapping, the LM head's last N rows, reads 16 padding rows on PaliGemma: refused, as is a map onto a
    special token or past the head."""
    tokenizer = AutoTokenizerFrom(paligemma_dir)
    values, edges = [0.0] * 16, [0.0] * 15
    tail = ActionTokenMap("tail", tuple(range(PALIGEMMA_ROWS - 16, PALIGEMMA_ROWS)), tuple(values), tuple(edges))
    with pytest.raises(ValueError, match="padding row"):
        tail.check(tokenizer, PALIGEMMA_ROWS)
    with pytest.raises(ValueError, match="outside the LM head"):
        tail.check(tokenizer, PALIGEMMA_ROWS - 8)
    with pytest.raises(ValueError, match="special tokens"):
        ActionTokenMap("x", tuple(range(16)), tuple(values), tuple(edges)).check(tokenizer, PALIGEMMA_ROWS)
    with pytest.raises(ValueError, match="special tokens"):  # so many bins that they reach <bos> (id 2)
        build_action_token_map("paligemma", tokenizer, PALIGEMMA_ROWS, 255_998)
    with pytest.raises(ValueError, match="<seg127>"):  # OpenVLA's count from vocab_size (257,152 here) down
        build_action_token_map("openvla", tokenizer, PALIGEMMA_ROWS, 16)


def AutoTokenizerFrom(path):  # noqa: N802 - reads as the class it stands for
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# ---- OpenVLA ------------------------------------------------------------------------------------------------------
def openvla_action_tokenizer(x: np.ndarray, vocab_size: int = LLAMA_TOKENS, n_bins: int = 256):
    """OpenVLA's ActionTokenizer, as its source states it: token = vocab_size - digitize(clip(x), linspace(-1, 1,
    n_bins)); decoded to bin_centers[clip(vocab_size - token - 1, 0, n_bins - 2)]."""
    bins = np.linspace(-1, 1, n_bins)
    centers = (bins[:-1] + bins[1:]) / 2.0
    tokens = vocab_size - np.digitize(np.clip(x, -1, 1), bins)
    return tokens, centers[np.clip(vocab_size - tokens - 1, 0, n_bins - 2)]


@pytest.mark.parametrize("bins", [16, 256])
def test_openvla_bins_count_down_from_the_base_vocabulary_as_openvla_does(openvla_dir, bins):
    policy, env = load(openvla_dir, bins, action_tokens="openvla")
    token_map = policy.token_map
    assert list(token_map.ids) == list(range(31_999, 31_999 - bins, -1))  # bin k -> id 31,999 - k
    assert token_map.skipped == ((32_000, 32_000, "<PAD>"), (32_001, 32_063, "LM-head padding (no token)"))
    reads_rows(policy, env, list(token_map.ids))
    # encoding and decoding agree with OpenVLA's formulas, at the edges and in between
    x = np.concatenate([np.linspace(-1.2, 1.2, 2001), np.linspace(-1, 1, bins), [0.0, 1.0, -1.0]])
    tokens, decoded = openvla_action_tokenizer(x, n_bins=bins)
    index = torch.bucketize(
        torch.tensor(x).clamp(-1, 1), torch.tensor(token_map.edges, dtype=torch.float64), right=True
    )
    assert torch.equal(torch.tensor(token_map.ids)[index], torch.from_numpy(tokens))
    np.testing.assert_allclose(np.array(token_map.values)[index.numpy()], decoded, rtol=0, atol=1e-7)
    if bins == 256:  # the pinned extremes: -1 -> 31,999, 0 -> 31,872, 1 -> 31,744 (decoded like 31,745)
        assert [int(t) for t in openvla_action_tokenizer(np.array([-1.0, 0.0, 1.0]))[0]] == [31_999, 31_872, 31_744]
        assert token_map.values[255] == token_map.values[254] == pytest.approx(1 - 1 / 255)
        # the policy decodes bin k over the env's bounds [-1, 1]: bin 0 -> -1 + 1/255
        assert float(policy.env_action(torch.zeros(1, 3))[0, 0]) == pytest.approx(-1 + 1 / 255)


def test_gemma_conventions_refuse_the_llama_vocabulary(openvla_dir):
    with pytest.raises(SystemExit) as e:
        load(openvla_dir, 16)  # a plain PaliGemma-class checkpoint: the paligemma convention by default
    msg = one_line_exit(e)
    assert "<loc0000>" in msg and "action_tokens" in msg, msg


# ---- SmolVLM2 -----------------------------------------------------------------------------------------------------
SMOLLM2_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>",
    "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
    "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>",
]  # fmt: skip
SMOLVLM_ADDED = (["<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
                 + ["<fake_token_around_image>", "<image>"]
                 + [f"<|reserved_special_token_{i}|>" for i in range(88)] + ["<end_of_utterance>"])  # fmt: skip


def smolvlm_tokenizer() -> PreTrainedTokenizerFast:
    """SmolVLM2's layout: SmolLM2's 49,152 (its 17 special tokens first), then SmolVLM's 128 added tokens in order;
    bos <|im_start|>, eos <end_of_utterance>, pad <|im_end|>, unk <|endoftext|> as its tokenizer_config names them."""
    names = dict(enumerate(SMOLLM2_SPECIAL))
    vocab = {names.get(i, f"t{i}"): i for i in range(SMOLLM2_TOKENS)}
    tokenizer = word_level(vocab, "<|endoftext|>", bos_token="<|im_start|>", pad_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SMOLLM2_SPECIAL[3:]})  # in the vocabulary: ids kept
    tokenizer.add_tokens(SMOLVLM_ADDED, special_tokens=True)  # appended in order: 49,152 ... 49,279
    tokenizer.add_special_tokens({"eos_token": "<end_of_utterance>"})
    return tokenizer


@pytest.fixture(scope="module")
def smolvlm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("smolvlm2_layout")
    tokenizer = smolvlm_tokenizer()
    assert len(tokenizer) == SMOLVLM_TOKENS and tokenizer.vocab_size == SMOLLM2_TOKENS
    ids = tokenizer.convert_tokens_to_ids(["<global-img>", "<row_6_col_6>", "<fake_token_around_image>", "<image>",
                                           "<end_of_utterance>", "<empty_output>"])  # fmt: skip
    assert ids == [49_152, 49_188, 49_189, 49_190, 49_279, 16]
    special = {"pad": 2, "bos": 1, "eos": 49_279, "image": 49_190}
    torch.manual_seed(0)
    config = tiny_smolvlm(SMOLVLM_TOKENS, (SIZE, SIZE), special, hidden_size=16, num_layers=1, num_heads=2,
                          intermediate_size=32)  # fmt: skip
    SmolVLMForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("bins", [16, 256])
def test_smolvlm_bins_are_the_top_of_smollm2s_text_vocabulary(smolvlm_dir, bins):
    policy, env = load(smolvlm_dir, bins)
    ids = list(policy.token_map.ids)
    assert isinstance(policy.backbone, SmolVLMForConditionalGeneration)
    assert policy.token_map.convention == "smolvlm"  # the family's default for a plain SmolVLM checkpoint
    assert ids[:3] == [49_151, 49_150, 49_149] and ids[-1] == 49_152 - bins
    assert ids == list(range(49_151, 49_151 - bins, -1))  # bin k -> id 49,151 - k
    assert policy.tokenizer.convert_ids_to_tokens([ids[0], ids[-1]]) == ["t49151", f"t{49_152 - bins}"]
    assert policy.token_map.skipped == (
        (49_152, 49_152, "<global-img>"),
        (49_153, 49_188, "<row_r_col_c>"),
        (49_189, 49_189, "<fake_token_around_image>"),
        (49_190, 49_190, "<image>"),
        (49_191, 49_278, "<|reserved_special_token_k|>"),
        (49_279, 49_279, "<end_of_utterance>"),
    )
    assert policy.config.action_tokens["ids"] == ids
    assert policy.backbone.get_output_embeddings().weight.shape[0] == SMOLVLM_TOKENS
    assert policy.image_start_ids.tolist() == [49_189, 49_152] and policy.image_end_ids.tolist() == [49_189]
    reads_rows(policy, env, ids)
    # OpenVLA's count from the base vocabulary reads the same rows here
    openvla = build_action_token_map("openvla", policy.tokenizer, SMOLVLM_TOKENS, bins)
    assert list(openvla.ids) == ids


def test_smolvlm_conventions_refuse_what_is_not_their_vocabulary(smolvlm_dir, paligemma_dir):
    tokenizer = AutoTokenizerFrom(smolvlm_dir)
    with pytest.raises(ValueError, match="special tokens"):  # so many bins that they reach <empty_output> (id 16)
        build_action_token_map("smolvlm", tokenizer, SMOLVLM_TOKENS, 49_136)
    assert build_action_token_map("smolvlm", tokenizer, SMOLVLM_TOKENS, 49_135).ids[-1] == 17
    with pytest.raises(SystemExit) as e:  # a PaliGemma convention on SmolVLM's vocabulary
        load(smolvlm_dir, 16, action_tokens="paligemma")
    assert "<loc0000>" in str(e.value.code) and "\n" not in str(e.value.code)
    with pytest.raises(ValueError, match="<global-img>"):  # and SmolVLM's on PaliGemma's
        build_action_token_map("smolvlm", AutoTokenizerFrom(paligemma_dir), PALIGEMMA_ROWS, 16)
