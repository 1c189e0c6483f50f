"""examples/hf_vla: the transformers VLA policy (PaliGemma + LoRA + bins/Gaussian heads + value head), its tokenizer,
save/load, the reference policy, and training with the trainers and the behaviour-cloning script.

Everything is built offline from configs (no model hub). CI installs the vla extra: there a missing transformers or
peft fails the module instead of skipping it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

from tensordict import TensorDict
from transformers import AutoTokenizer, PaliGemmaForConditionalGeneration

from cleanrl_embodied import ppo_vla
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.chunks import chunk_space, step_chunk
from cleanrl_embodied.shared.envs.push_cube import HELDOUT_INSTRUCTIONS, LANG_TASKS, TASKS, expert_action
from cleanrl_embodied.shared.language import encode_instructions
from examples.hf_vla import (
    Bins,
    HFVLAPolicy,
    PromptCache,
    bc,
    build_tokenizer,
    default_corpus,
    make_policy,
    tiny_paligemma,
)
from tests.checks import one_line_exit
from tests.hf_vla_policies import outputs, policy_flags, train_steps

SIZE = 32  # 2x2 patches of 16 pixels: the smallest images, for speed
ENV_KWARGS = {"obs_mode": "rgb", "image_size": SIZE, "action_mode": "ee_delta_pos"}
INSTRUCTIONS = [text for _, text in TASKS.values()]


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/conftest.py


class Chunked:
    """The env as a policy of chunks sees it: a (K, D) action space, and a step that runs the chunk."""

    def __init__(self, env, chunk: int):
        self.env, self.single_action_space = env, chunk_space(env.single_action_space, chunk)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        obs, rewards, executed, terminated, truncated, info = step_chunk(self.env, action)
        return obs, torch.where(executed, rewards, 0.0).sum(0), terminated, truncated, info


def lang_env(num_envs: int = 6, chunk: int = 1, **kw):
    env = make_env("PushCubeLangRL", num_envs=num_envs, seed=0, **{**ENV_KWARGS, **kw})
    return Chunked(env, chunk) if chunk > 1 else env


def build(env, head: str = "bins", bins: int = 16, **kwargs) -> HFVLAPolicy:
    chunk = env.single_action_space.shape[0] if len(env.single_action_space.shape) == 2 else 1
    return make_policy(env.single_observation_space, env.single_action_space, policy_flags(head, bins, chunk), **kwargs)


def first_obs(env, seed: int = 0) -> TensorDict:
    obs, _ = env.reset(seed=seed)
    return obs


# ---- building, tokenizer, prompts -------------------------------------------------------------------------------
def test_factory_builds_offline_a_paligemma_with_adapters_and_the_bins_as_the_last_ids():
    env = lang_env()
    policy = build(env, bins=16)
    assert isinstance(policy.backbone, PaliGemmaForConditionalGeneration)
    vocab = len(policy.tokenizer)
    assert policy.backbone.config.text_config.vocab_size == vocab
    assert policy.tokenizer.convert_ids_to_tokens(list(range(vocab - 16, vocab))) == [f"<bin_{i}>" for i in range(16)]
    trainable = policy.trainable_parameters()
    assert any("lora_A" in name for name in trainable) and any("lora_B" in name for name in trainable)
    assert all("lora_" in n or n.startswith(("action_head.", "value_head.")) for n in trainable), sorted(trainable)
    frozen = [n for n, p in policy.named_parameters() if not p.requires_grad]
    assert any("vision_tower" in n for n in frozen) and any("embed_tokens" in n for n in frozen)
    assert all(not n.startswith(("action_head.", "value_head.")) for n in frozen)
    total = sum(p.numel() for p in policy.parameters())
    assert 0 < sum(p.numel() for p in trainable.values()) < total / 3
    again = build(env, bins=16)  # the trainers build twice: the same weights, adapters and heads every time
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), again.state_dict().values()))


def test_tokenizer_round_trips_through_save_and_autotokenizer(tmp_path):
    tokenizer = build_tokenizer(default_corpus("{instruction}"), num_bins=8)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer)
    for text in [*INSTRUCTIONS, "stack the red block on the blue one", "schieb den Würfel nach links"]:
        ids = tokenizer(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids and ids[0] == tokenizer.bos_token_id
        assert loaded.decode(ids, skip_special_tokens=True) == text  # byte-level: any text, no unknown token
    assert tokenizer.unk_token_id not in tokenizer("schieb den Würfel nach links")["input_ids"]
    assert len(tokenizer("push the cube to the left")["input_ids"]) == 7  # <bos> + one token per word
    for phrase in (p for name in LANG_TASKS for p in HELDOUT_INSTRUCTIONS[name]):  # held out, yet known words
        assert len(tokenizer(phrase)["input_ids"]) == 1 + len(phrase.split())
    assert loaded.convert_ids_to_tokens(len(loaded) - 1) == "<bin_7>"
    # deterministic: building again gives the same vocabulary and merges (two policies tokenize alike)
    again = build_tokenizer(default_corpus("{instruction}"), num_bins=8)
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


class CountingTokenizer:
    def __init__(self, tokenizer):
        self.tokenizer, self.calls, self.pad_token_id = tokenizer, [], tokenizer.pad_token_id

    def __call__(self, text):
        self.calls.append(text)
        return self.tokenizer(text)


def test_prompt_cache_tokenizes_each_instruction_once_and_left_pads():
    tokenizer = CountingTokenizer(build_tokenizer(default_corpus("{instruction}"), num_bins=4))
    cache = PromptCache(tokenizer, "In: {instruction}\nOut:")
    texts = [INSTRUCTIONS[i] for i in (0, 1, 0, 0, 1, 1)]
    ids, mask = cache(encode_instructions(texts, 32))
    assert sorted(tokenizer.calls) == sorted({f"In: {t}\nOut:" for t in texts})  # once per distinct instruction
    for row, text in enumerate(texts):
        want = tokenizer.tokenizer(f"In: {text}\nOut:")["input_ids"]
        assert ids[row, -len(want) :].tolist() == want and mask[row].sum() == len(want)
        assert mask[row, -len(want) :].all() and not mask[row, : ids.shape[1] - len(want)].any()  # left padding
    calls = len(tokenizer.calls)
    again, _ = cache(encode_instructions(texts[::-1], 32))
    assert len(tokenizer.calls) == calls and torch.equal(again, ids.flip(0))  # all known: no tokenizer call
    cache(encode_instructions([INSTRUCTIONS[2], INSTRUCTIONS[0]], 32))
    assert tokenizer.calls[calls:] == [f"In: {INSTRUCTIONS[2]}\nOut:"]  # only the new one


def test_padding_and_batch_neighbours_do_not_change_a_rows_outputs():
    """Left padding with positions numbered from the mask: a short instruction gives the same distribution alone as
    next to a longer one (which pads it), and the instruction does change the output."""
    env = lang_env(num_envs=2)
    policy = build(env, prompt_format="In: What action should the robot take to {instruction}?\nOut:")
    obs = first_obs(env)
    short, long = "push the cube back", "push the cube to the left"
    alone = obs.clone()
    alone["instruction"] = encode_instructions([short, short], 32)
    mixed = obs.clone()
    mixed["instruction"] = encode_instructions([short, long], 32)
    fresh = build(env, prompt_format="In: What action should the robot take to {instruction}?\nOut:")
    a, _ = outputs(fresh, alone)  # a fresh cache that has seen only the short instruction: no padding
    b, _ = outputs(policy, mixed)
    assert torch.allclose(a[0], b[0], atol=1e-5)
    swapped = obs.clone()
    swapped["instruction"] = encode_instructions([long, long], 32)
    assert not torch.allclose(outputs(policy, swapped)[0][0], b[0], atol=1e-4)  # the words matter


def test_a_batch_gives_the_same_bits_whatever_the_policy_saw_before():
    """The prompt width is the batch's own (not the longest instruction seen so far): a policy that has seen longer
    instructions computes a batch of short ones exactly as a fresh one does (what makes resume bit-identical)."""
    env = lang_env(num_envs=64)  # (at smaller sizes the padding happens not to change the float rounding)
    obs = first_obs(env)
    short = obs.clone()
    short["instruction"] = encode_instructions(["push the cube back"] * 64, 32)
    long = obs.clone()
    long["instruction"] = encode_instructions(["push the cube to the left"] * 64, 32)
    openvla = "In: What action should the robot take to {instruction}?\nOut:"
    seasoned, fresh = build(env, prompt_format=openvla), build(env, prompt_format=openvla)
    outputs(seasoned, long)
    for mine, theirs in zip(outputs(seasoned, short), outputs(fresh, short)):
        assert torch.equal(mine, theirs)


# ---- gradients, reference, heads --------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_only_adapters_and_heads_get_gradients(head):
    env = lang_env()
    policy = build(env, head)
    obs = first_obs(env)
    dist, value = policy(obs)
    action = dist.sample()
    (-dist.log_prob(action).flatten(1).sum(-1).mean() + value.pow(2).mean()).backward()
    for name, p in policy.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, name
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert all("lora_" in n or n.startswith(("action_head.", "value_head.")) for n in grads)
    assert any("lora_B" in n and g.abs().sum() > 0 for n, g in grads.items())  # B starts at zero, gets gradient
    assert grads["value_head.2.weight"].abs().sum() > 0
    key = "action_head.token_delta" if head == "bins" else "action_head.mean.2.weight"
    assert grads[key].abs().sum() > 0
    assert all(n not in grads for n, _ in policy.reference_head.named_parameters(prefix="reference_head"))


@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_reference_is_the_policy_at_build_and_departs_after_a_step(head):
    env = lang_env()
    policy = build(env, head)
    obs = first_obs(env)
    with torch.no_grad():
        dist, ref = policy.dist(obs), policy.reference_dist(obs)
        action = dist.sample()
        assert torch.equal(dist.log_prob(action), ref.log_prob(action))  # zero-effect adapters, heads as built
    train_steps(policy, obs, steps=1)
    with torch.no_grad():
        after, ref_after = policy.dist(obs).log_prob(action), policy.reference_dist(obs).log_prob(action)
    assert torch.equal(ref_after, ref.log_prob(action))  # the reference never moves
    assert not torch.allclose(after, ref_after, atol=1e-4)
    with torch.no_grad(), policy.vlm.disable_adapter():  # the adapters alone moved it too (not just the heads)
        heads_only = policy._dist(policy.features(obs, policy.action_head)[0], policy.action_head).log_prob(action)
    assert not torch.allclose(after, heads_only, atol=1e-6)


@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_chunks_give_k_by_d_actions_and_bins_decode_inside_the_bounds(head):
    env = lang_env(num_envs=4, chunk=3)
    assert env.single_action_space.shape == (3, 3)
    policy = build(env, head, bins=8)
    obs = first_obs(env)
    with torch.no_grad():
        dist, value = policy(obs)
    action = dist.sample()
    assert action.shape == (4, 3, 3) and dist.log_prob(action).shape == (4, 3, 3) and value.shape == (4,)
    assert dist.entropy().shape == (4, 3, 3) and dist.mode.shape == (4, 3, 3)
    env_action = policy.env_action(action)
    if head == "bins":
        assert isinstance(dist, Bins) and dist.logits.shape == (4, 3, 3, 8)
        every_bin = policy.env_action(torch.arange(8.0).view(8, 1, 1).expand(8, 3, 3))
        assert (every_bin > -1).all() and (every_bin < 1).all()
        assert torch.allclose(every_bin[:, 0, 0], torch.linspace(-1 + 1 / 8, 1 - 1 / 8, 8))
    else:
        assert torch.equal(env_action, action)
    env.step(env_action)  # the env takes it


def test_bf16_autocast_gives_float32_distributions():
    env = lang_env()
    obs = first_obs(env)
    for head in ("bins", "gaussian"):
        policy = build(env, head)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            dist, value = policy(obs)
            ref = policy.reference_dist(obs)
        logp = dist.log_prob(dist.sample())
        assert logp.dtype == torch.float32 and value.dtype == torch.float32 and torch.isfinite(logp).all()
        assert ref.log_prob(dist.mode).dtype == torch.float32
        exact, _ = outputs(policy, obs)
        approx = dist.logits if head == "bins" else torch.stack([dist.mean, dist.stddev])
        assert torch.allclose(approx, exact, atol=0.1)  # bf16 rounding only


def test_a_bfloat16_backbone_keeps_float32_adapters_and_heads():
    env = lang_env()
    policy = build(env, "gaussian", dtype="bfloat16")
    assert policy.backbone.get_input_embeddings().weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters().values())
    dist, value = policy(first_obs(env))
    assert dist.mean.dtype == torch.float32 and value.dtype == torch.float32


# ---- FSDP units and gradient checkpointing -----------------------------------------------------------------------
LAYER_PATHS = {  # where each family's transformer layers live (transformers' module names)
    "paligemma": ("model.vision_tower.encoder.layers.", "model.language_model.layers."),
    "smolvlm": ("model.vision_model.encoder.layers.", "model.text_model.layers."),
}


@pytest.mark.parametrize("model_type", ["paligemma", "smolvlm"])
@pytest.mark.parametrize("num_layers", [1, 3])
def test_fsdp_units_are_every_transformer_layer_of_both_towers(model_type, num_layers):
    """ppo_vla_ddp --fsdp shards each unit on its own: every layer of the vision tower and of the language model."""
    policy = build(lang_env(num_envs=2), model_type=model_type, num_layers=num_layers, hidden_size=32)
    units = policy.fsdp_units()
    names = {id(m): n for n, m in policy.backbone.named_modules()}
    assert len(units) == 2 * num_layers and len({id(u) for u in units}) == len(units)
    for tower in LAYER_PATHS[model_type]:  # (peft's wrapper renames nothing in the base model)
        found = sorted(names[id(u)] for u in units if names[id(u)].startswith(tower))
        assert [n.rsplit(".", 1)[-1] for n in found] == [str(i) for i in range(num_layers)], (tower, found)


@pytest.mark.parametrize("model_type", ["paligemma", "smolvlm"])
def test_gradient_checkpointing_recomputes_the_layers_for_the_same_loss_and_gradients(model_type):
    """--policy-kwargs gradient_checkpointing: transformers' non-reentrant checkpointing of every layer. A training
    forward and backward run each layer twice (the backward recomputes it) and give the loss and gradients of the
    policy without it; a forward without gradients (the rollout) runs each layer once."""
    env = lang_env(num_envs=3)
    obs = first_obs(env)
    results = {}
    for checkpointing in (False, True):
        policy = build(env, model_type=model_type, gradient_checkpointing=checkpointing)
        assert policy.backbone.is_activation_checkpointing == checkpointing
        with torch.no_grad():  # adapters that act (B starts at zero), the same in both builds
            for name, p in sorted(policy.named_parameters()):
                if "lora_B" in name:
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).view_as(p))
        calls = []
        mlp = policy.fsdp_units()[-1].mlp  # a submodule of the language model's last layer
        mlp.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))  # (a recompute may stop inside it)
        with torch.no_grad():
            policy(obs)
        assert len(calls) == 1
        dist, value = policy(obs)
        loss = -dist.log_prob(dist.mode).sum() + value.pow(2).sum()
        loss.backward()
        assert len(calls) == 1 + 1 + checkpointing, checkpointing  # recomputed in the backward
        grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert any("lora_A" in n and "layers" in n for n in grads)
        results[checkpointing] = loss.detach(), grads
    (loss, grads), (loss_ckpt, grads_ckpt) = results[False], results[True]
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads_ckpt.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, msg=name)


def test_gradient_checkpointing_is_a_run_option_a_saved_vla_does_not_record(tmp_path):
    env = lang_env(num_envs=2)
    build(env, gradient_checkpointing=True).save_pretrained(tmp_path / "vla")
    assert "checkpointing" not in (tmp_path / "vla" / "vla_config.json").read_text()
    assert not build(env, model_path=str(tmp_path / "vla")).backbone.is_activation_checkpointing
    loaded = build(env, model_path=str(tmp_path / "vla"), gradient_checkpointing=True)
    assert loaded.backbone.is_activation_checkpointing
    with pytest.raises(SystemExit) as e:
        build(env, gradient_checkpointing="yes")
    assert "gradient_checkpointing" in one_line_exit(e)


# ---- saving and loading -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_save_load_restores_the_policy_and_starts_fresh_adapters(head, tmp_path):
    env = lang_env(num_envs=4, chunk=2)
    policy = build(env, head)
    obs = first_obs(env)
    train_steps(policy, obs)  # adapters, token delta and heads all moved
    policy.save_pretrained(tmp_path / "a")
    assert {"config.json", "model.safetensors", "tokenizer.json", "heads.safetensors", "vla_config.json"} <= {
        p.name for p in (tmp_path / "a").iterdir()
    }
    loaded = build(env, head, model_path=str(tmp_path / "a"))
    # the adapters were merged into the weights: the same policy up to float rounding of the merge
    for mine, theirs in zip(outputs(policy, obs), outputs(loaded, obs)):
        assert torch.allclose(mine, theirs, atol=1e-5)
    # a loaded policy is saved and loaded bit for bit, and its adapters are fresh (zero-effect, but trainable)
    loaded.save_pretrained(tmp_path / "b")
    again = build(env, head, model_path=str(tmp_path / "b"))
    for mine, theirs in zip(outputs(loaded, obs), outputs(again, obs)):
        assert torch.equal(mine, theirs)
    twin = build(env, head, model_path=str(tmp_path / "a"))
    for mine, theirs in zip(outputs(loaded, obs), outputs(twin, obs)):
        assert torch.equal(mine, theirs)
    with torch.no_grad():
        action = loaded.dist(obs).sample()
        assert torch.equal(loaded.dist(obs).log_prob(action), loaded.reference_dist(obs).log_prob(action))
    assert any("lora_B" in n for n in loaded.trainable_parameters())
    assert all(p.abs().sum() == 0 for n, p in loaded.trainable_parameters().items() if "lora_B" in n)
    assert json.loads((tmp_path / "a" / "vla_config.json").read_text())["action_chunk"] == 2


def test_start_logstd_sets_the_exploration_noise_of_policy_and_reference_alike(tmp_path):
    """Behaviour cloning fits the Gaussian's std to its own errors; RL may start from another noise level: the loaded
    mean is kept, the std replaced in the policy and in its KL reference (equal at the start)."""
    env = lang_env()
    policy = build(env, "gaussian")
    obs = first_obs(env)
    train_steps(policy, obs)
    policy.save_pretrained(tmp_path / "vla")
    loaded = build(env, "gaussian", model_path=str(tmp_path / "vla"))
    quiet = build(env, "gaussian", model_path=str(tmp_path / "vla"), start_logstd=-2.5)
    with torch.no_grad():
        dist, ref = quiet.dist(obs), quiet.reference_dist(obs)
        assert torch.equal(dist.mean, loaded.dist(obs).mean)
        assert torch.allclose(dist.stddev, torch.full_like(dist.stddev, math.exp(-2.5)))
        assert not torch.allclose(loaded.dist(obs).stddev, dist.stddev)
        assert torch.equal(ref.stddev, dist.stddev) and torch.equal(ref.mean, dist.mean)
    assert quiet.action_head.log_std.requires_grad  # it still trains
    with pytest.raises(SystemExit) as e:
        build(env, "bins", bins=16, start_logstd=-2.0)
    assert "start_logstd" in one_line_exit(e) and "gaussian" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, "gaussian", start_logstd="low")
    assert "start_logstd" in one_line_exit(e)


def test_loads_a_plain_transformers_checkpoint_with_new_heads(tmp_path):
    """A local PaliGemma checkpoint (config, weights, tokenizer; no vla_config.json), here at 48x48 while the env
    gives 32x32 images (resized): its action tokens follow the family's convention unless action_tokens names
    another (this tokenizer is this module's, whose bins are its <bin_k> tokens, not PaliGemma's vocabulary), and
    without dataset statistics it is refused unless action_stats asks for the env's bounds."""
    tokenizer = build_tokenizer(default_corpus("{instruction}"), num_bins=16)
    special = {n: tokenizer.convert_tokens_to_ids(f"<{n}>") for n in ("pad", "bos", "eos", "image")}
    model = PaliGemmaForConditionalGeneration(tiny_paligemma(len(tokenizer), (48, 48), special, hidden_size=32))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    env = lang_env()
    kw = {"model_path": str(tmp_path), "prompt_format": "In: {instruction}\nOut:"}
    with pytest.raises(SystemExit) as e:
        build(env, "bins", bins=16, action_stats="env_bounds", **kw)
    assert "<loc0000>" in one_line_exit(e) and "action_tokens" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, "bins", bins=16, action_tokens="bin_tokens", **kw)
    assert "dataset_statistics.json" in one_line_exit(e) and '"action_stats": "env_bounds"' in one_line_exit(e)
    policy = build(env, "bins", bins=16, action_tokens="bin_tokens", action_stats="env_bounds", **kw)
    assert policy.vision_size == (48, 48) and policy.config.prompt_format == "In: {instruction}\nOut:"
    assert policy.config.prompt_suffix == "\n" and policy.config.image_resample == "bicubic"  # PaliGemma's processor
    bin_ids = tokenizer.convert_tokens_to_ids([f"<bin_{k}>" for k in range(16)])
    assert list(policy.token_map.ids) == bin_ids == list(range(len(tokenizer) - 16, len(tokenizer)))
    state = model.state_dict()
    assert torch.equal(policy.backbone.get_output_embeddings().weight, state["lm_head.weight"])
    dist, value = policy(first_obs(env))
    assert dist.logits.shape == (6, 3, 16) and value.shape == (6,)


def test_images_are_resized_bicubically_as_paligemmas_processor_does():
    """A real checkpoint's vision tower wants another size (224): the 8-bit image is resized with antialiased bicubic
    interpolation and rounded back to 8 bits, as transformers' SigLIP processor does (its torchvision backend). PIL's
    bicubic resize of the same image agrees to one 8-bit level (on images without the sharp edges where PIL, which
    rounds to 8 bits between its two passes, clips the overshoot), bilinear interpolation does not."""
    from PIL import Image

    policy = build(lang_env(num_envs=2), "gaussian")
    policy.vision_size = (224, 224)  # as if its vision tower were 224x224 (the env gives 32x32)
    coarse = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(0)) * 255
    rgb = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False).round().to(torch.uint8)
    mine = policy.pixels(rgb, torch.float32)
    assert mine.shape == (2, 3, 224, 224)
    levels = (mine * 0.5 + 0.5) * 255  # back to 8-bit levels: whole numbers
    assert torch.allclose(levels, levels.round(), atol=1e-3)
    pil = [np.array(Image.fromarray(img.permute(1, 2, 0).numpy()).resize((224, 224), Image.BICUBIC)) for img in rgb]
    theirs = torch.stack([torch.from_numpy(img).permute(2, 0, 1) for img in pil]).float()
    assert (levels - theirs).abs().max() <= 1 + 1e-3
    policy.config.image_resample = "bilinear"
    assert ((policy.pixels(rgb, torch.float32) * 0.5 + 0.5) * 255 - theirs).abs().max() > 2


def test_prompts_end_with_the_familys_newline_and_an_older_vla_keeps_its_own(tmp_path):
    """PaliGemma's processor ends the prefix with a newline: so do the policy's prompts. A VLA saved before the
    suffix and the action-token map were written loads as it was saved: no suffix, its <bin_k> tokens."""
    env = lang_env(num_envs=2)
    policy = build(env, "bins", bins=16)
    ids, _ = policy.prompts.texts(["push the cube back"])
    newline = policy.tokenizer("\n")["input_ids"][-1]
    assert ids[0, -1] == newline and ids[0, -2] != newline
    assert policy.tokenizer.decode(ids[0], skip_special_tokens=True) == "push the cube back\n"
    policy.save_pretrained(tmp_path / "vla")
    config = json.loads((tmp_path / "vla" / "vla_config.json").read_text())
    assert config["prompt_suffix"] == "\n" and config["action_tokens"]["convention"] == "bin_tokens"
    for key in ("prompt_suffix", "action_tokens", "image_resample", "image_mean", "image_std"):
        del config[key]
    (tmp_path / "vla" / "vla_config.json").write_text(json.dumps(config))
    older = build(env, "bins", bins=16, model_path=str(tmp_path / "vla"))
    assert older.config.prompt_suffix == "" and older.token_map.ids == policy.token_map.ids
    ids, _ = older.prompts.texts(["push the cube back"])
    assert ids[0, -1] != newline


def test_statistics_decode_actions_normalise_the_state_and_travel_with_the_model(tmp_path):
    """Dataset statistics: a bin decodes to offset + scale * its value (q01/q99: the centre and half-width of
    [q01, q99]; masked-out dimensions stay normalised), the state token reads (state - mean) / std, and
    save_pretrained writes them to dataset_statistics.json, which loading reads; a directory without that file is
    refused in one line unless action_stats asks for the env's bounds."""
    from examples.hf_vla.statistics import DatasetStatistics, Normalizer

    env = lang_env(num_envs=2, obs_mode="state+rgb")
    policy = build(env, "bins", bins=8)
    obs = first_obs(env)
    before, _ = outputs(policy, obs)
    dim = obs["state"].shape[-1]
    mean, std = torch.linspace(-0.5, 0.5, dim), torch.linspace(0.5, 2.0, dim)
    action = Normalizer("bounds_q99", {"q01": [-0.5, 0.0, -9.0], "q99": [0.5, 0.4, 9.0]}, [True, True, False])
    state = Normalizer("normal", {"mean": mean.tolist(), "std": std.tolist()}, [True] * dim)
    policy.set_statistics(DatasetStatistics("demos", action, state, extra={"num_transitions": 3}))
    values = torch.linspace(-1 + 1 / 8, 1 - 1 / 8, 8)
    every_bin = policy.env_action(torch.arange(8.0).view(8, 1).expand(8, 3))
    torch.testing.assert_close(every_bin, torch.stack([0.5 * values, 0.2 + 0.2 * values, values], -1))
    assert torch.equal(policy.action_bins(every_bin), torch.arange(8.0).view(8, 1).expand(8, 3))
    torch.testing.assert_close(policy.normalize_state(obs["state"]), (obs["state"] - mean) / std)
    after, _ = outputs(policy, obs)
    assert not torch.allclose(before, after, atol=1e-4)  # the state token reads the normalised state
    policy.save_pretrained(tmp_path / "vla")
    saved = json.loads((tmp_path / "vla" / "dataset_statistics.json").read_text())
    assert set(saved) == {"demos"} and saved["demos"]["action"]["normalization"] == "bounds_q99"
    assert saved["demos"]["proprio"]["normalization"] == "normal" and saved["demos"]["num_transitions"] == 3
    loaded = build(env, "bins", bins=8, model_path=str(tmp_path / "vla"))
    torch.testing.assert_close(loaded.env_action(torch.arange(8.0).view(8, 1).expand(8, 3)), every_bin)
    torch.testing.assert_close(outputs(loaded, obs)[0], after, atol=1e-5, rtol=0)
    (tmp_path / "vla" / "dataset_statistics.json").unlink()
    with pytest.raises(SystemExit) as e:
        build(env, "bins", bins=8, model_path=str(tmp_path / "vla"))
    assert "dataset_statistics.json" in one_line_exit(e) and "env_bounds" in one_line_exit(e)
    bounds = build(env, "bins", bins=8, model_path=str(tmp_path / "vla"), action_stats="env_bounds")
    torch.testing.assert_close(bounds.env_action(torch.arange(8.0).view(8, 1).expand(8, 3))[:, 0], values)


def test_an_openvla_statistics_file_picks_its_entry_by_unnorm_key_and_post_processes_the_gripper(tmp_path):
    """OpenVLA's dataset_statistics.json layout (one entry per dataset): several entries need unnorm_key; the
    gripper dimension, left out of the normalisation (mask false), maps [0, 1] to [-1, 1], is binarised and
    inverted (OpenVLA's LIBERO evaluation)."""
    entry = {"q01": [-1.0, -2.0, 0.0], "q99": [1.0, 2.0, 1.0], "mean": [0.0] * 3, "std": [1.0] * 3,
             "min": [-1.0, -2.0, 0.0], "max": [1.0, 2.0, 1.0], "mask": [True, True, False]}  # fmt: skip
    gripper = {"dims": [2], "from_unit": True, "binarize": True, "invert": True}
    file = tmp_path / "stats.json"
    file.write_text(json.dumps({"bridge": {"action": entry}, "libero": {"action": {**entry, "gripper": gripper}}}))
    env = lang_env(num_envs=2)
    with pytest.raises(SystemExit) as e:
        build(env, "bins", bins=8, action_stats=str(file))
    assert "unnorm_key" in one_line_exit(e) and "libero" in one_line_exit(e)
    policy = build(env, "bins", bins=8, action_stats=str(file), unnorm_key="libero")
    action = policy.env_action(torch.tensor([[0.0, 7.0, 0.0], [7.0, 0.0, 7.0]]))
    values = torch.linspace(-1 + 1 / 8, 1 - 1 / 8, 8)
    # bin 0 -> gripper value -7/8 (not normalised) -> 2g - 1 < 0 -> sign -1 -> inverted: +1; bin 7 -> -1
    torch.testing.assert_close(
        action, torch.tensor([[values[0], 2 * values[7], 1.0], [values[7], 2 * values[0], -1.0]])
    )
    with pytest.raises(SystemExit) as e:
        build(lang_env(num_envs=2, action_mode="joint_delta"), "bins", bins=8, action_stats=str(file),
              unnorm_key="libero")  # fmt: skip
    assert "size" in one_line_exit(e)


def test_a_bfloat16_checkpoint_loads_as_bfloat16_and_its_bins_logits_are_float32(tmp_path):
    """A directory keeps its dtype on loading (unless dtype names another), and the bins' logits come from a
    float32 product of the slots and the action tokens' rows, not a bfloat16 one cast afterwards."""
    env = lang_env(num_envs=2)
    build(env, "bins", dtype="bfloat16").save_pretrained(tmp_path / "vla")
    loaded = build(env, "bins", model_path=str(tmp_path / "vla"))
    assert loaded.backbone.get_input_embeddings().weight.dtype == torch.bfloat16
    as_float = build(env, "bins", model_path=str(tmp_path / "vla"), dtype="float32")
    assert as_float.backbone.get_input_embeddings().weight.dtype == torch.float32
    obs = first_obs(env)
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            slots, _ = loaded.features(obs, loaded.action_head)
            dist = loaded._dist(slots, loaded.action_head)
        assert slots.dtype == torch.bfloat16 and dist.logits.dtype == torch.float32
        rows = loaded.backbone.get_output_embeddings().weight[list(loaded.token_map.ids)]
        exact = torch.log_softmax(F.linear(slots.float(), rows.float()), -1).view_as(dist.logits)
        rounded = torch.log_softmax(F.linear(slots, rows).float(), -1).view_as(dist.logits)
        assert torch.equal(dist.logits, exact) and not torch.equal(dist.logits, rounded)


def test_a_directory_of_another_family_is_refused_naming_what_it_is(tmp_path):
    env = lang_env(num_envs=2)
    for name, config, said in (
        ("lerobot", {"type": "smolvla", "n_obs_steps": 1}, "a LeRobot policy of type 'smolvla'"),
        ("llava", {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}, "model_type 'llava'"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        with pytest.raises(SystemExit) as e:
            build(env, model_path=str(tmp_path / name))
        assert said in one_line_exit(e) and "paligemma (PaliGemmaForConditionalGeneration)" in one_line_exit(e)


def test_bad_policy_kwargs_and_mismatched_checkpoints_are_refused_with_one_line(tmp_path):
    env = lang_env()
    with pytest.raises(SystemExit) as e:
        build(env, lora_rnk=4)
    assert "lora_rnk" in one_line_exit(e) and "lora_rank" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, model_path=str(tmp_path / "nowhere"))
    assert "model_path" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, lora_rank=0)
    assert "lora_rank" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, dtype="float8")
    assert "dtype" in one_line_exit(e)
    policy = build(env, bins=16)
    policy.save_pretrained(tmp_path / "vla")
    for kwargs, what in (({"bins": 32}, "action_bins"), ({"head": "gaussian"}, "action_head")):
        with pytest.raises(SystemExit) as e:
            build(env, model_path=str(tmp_path / "vla"), **kwargs)
        assert what in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(lang_env(chunk=2), bins=16, model_path=str(tmp_path / "vla"))
    assert "action_chunk" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:  # joint_delta: 7-D actions, the checkpoint has 3
        build(lang_env(action_mode="joint_delta"), bins=16, model_path=str(tmp_path / "vla"))
    assert "action_dim" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        build(env, bins=16, model_path=str(tmp_path / "vla"), hidden_size=32)
    assert "hidden_size" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:  # PushCubeRL's observations hold no instruction
        state_env = make_env("PushCubeRL", num_envs=2, seed=0, obs_mode="rgb", image_size=SIZE)
        build(state_env)
    assert "instruction" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        make_policy(env.single_observation_space, env.single_action_space, SimpleNamespace(norm_obs=True))
    assert "--norm-obs" in one_line_exit(e)


def test_a_fixed_instruction_serves_envs_without_one():
    env = make_env("PushCubeRL", num_envs=2, seed=0, obs_mode="rgb", image_size=SIZE)
    policy = build(env, "gaussian", instruction="push the cube to the goal")
    dist, value = policy(first_obs(env))
    assert dist.mean.shape == (2, 7) and value.shape == (2,)


# ---- training -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head, chunk", [("gaussian", 1), ("bins", 2)])
def test_ppo_vla_trains_the_vla_one_iteration(head, chunk, tmp_path):
    args = ppo_vla.Args(
        env_id="PushCubeLangRL", env_kwargs=json.dumps(ENV_KWARGS), policy="examples.hf_vla:make_policy",
        policy_kwargs=json.dumps({"lora_rank": 4}), action_head=head, action_bins=16, action_chunk=chunk,
        num_envs=4, num_steps=4, total_timesteps=16 * chunk, num_minibatches=1, update_epochs=1, num_eval_envs=4,
        num_eval_episodes=4, eval_freq=0, save_freq=0, output_dir=str(tmp_path), seed=1, cuda=False,
    )  # fmt: skip
    result = ppo_vla.main(args)
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 16 * chunk
    train = summary["train"]
    assert abs(train["losses/approx_kl"]) < 1e-5 and train["losses/clipfrac"] == 0.0  # one minibatch: ratio 1
    assert summary["eval"]["success_rate"] is not None
    model = torch.load(Path(summary["checkpoint"]), weights_only=True)["model"]
    fresh = build(lang_env(num_envs=1, chunk=chunk), head, 16, lora_rank=4).state_dict()
    moved = [k for k, v in model.items() if not torch.equal(v, fresh[k])]
    assert moved and all("lora_" in k or k.startswith(("action_head.", "value_head.")) for k in moved), moved


def test_bc_script_records_demos_trains_saves_and_reports(tmp_path):
    out = tmp_path / "bc"
    args = bc.Args(
        out=str(out), env_kwargs=json.dumps(ENV_KWARGS), action_head="bins", action_bins=8, action_chunk=2,
        demo_episodes=4, num_envs=4, steps=4, batch_size=8, eval_episodes=4, num_eval_envs=4, eval_every=2,
        policy_kwargs=json.dumps({"lora_rank": 4}),
    )  # fmt: skip
    report = bc.main(args)
    saved = json.loads((out / "bc_eval.json").read_text())
    assert saved["eval"]["success_rate"] == report["eval"]["success_rate"]
    assert all(f"success_rate/{task}" in saved["eval"] for task in LANG_TASKS)
    assert saved["samples"] > 0 and [point["step"] for point in saved["curve"]] == [2, 4]
    env = lang_env(num_envs=4, chunk=2)
    policy = build(env, "bins", bins=8, model_path=str(out), lora_rank=4)
    assert policy.config.action_chunk == 2 and policy.config.action_bins == 8
    stats = json.loads((out / "dataset_statistics.json").read_text())["PushCubeLangRL"]  # the demos' statistics
    assert stats["num_transitions"] == saved["samples"] and stats["action"]["normalization"] == "bounds_q99"
    assert all(a <= b for a, b in zip(stats["action"]["q01"], stats["action"]["q99"]))
    assert policy.statistics.action.stats["q99"] == stats["action"]["q99"]  # what the loaded policy decodes with


def test_dagger_labels_the_learners_states_with_the_expert_and_trains_on_the_aggregate(tmp_path):
    """dagger.py: the labels are the expert's actions in the states the learner's own actions lead to (replayed on
    a second env with the same seed), the dataset grows by the rounds' samples on top of the start's
    demonstrations, the saved policy loads and was trained, and a start that is not a bc.py output is refused."""
    from examples.hf_vla import dagger

    start = tmp_path / "bc"
    bc.main(bc.Args(out=str(start), env_kwargs=json.dumps(ENV_KWARGS), action_bins=8, demo_episodes=4, num_envs=4,
                    steps=2, batch_size=8, eval_episodes=4, num_eval_envs=4))  # fmt: skip
    env, replay = lang_env(num_envs=3), lang_env(num_envs=3)
    policy = build(env, bins=8, model_path=str(start))
    obs, _ = env.reset(seed=4)
    observations, labels, _ = dagger.label_rollout(policy, env, obs, 3, "mode")
    assert labels.shape == (9, 1, 3) and observations.batch_size == torch.Size([9])
    replay_obs, _ = replay.reset(seed=4)
    for t in range(3):  # the learner acts, the expert labels what the learner reached
        assert torch.equal(observations[3 * t : 3 * t + 3]["rgb"], replay_obs["rgb"])
        assert torch.equal(labels[3 * t : 3 * t + 3, 0], expert_action(replay))
        with torch.no_grad():
            replay_obs, *_ = replay.step(policy.env_action(policy.dist(replay_obs).mode))
    out = tmp_path / "dagger"
    report = dagger.main(dagger.Args(model_path=str(start), out=str(out), cpu_minutes=0.02, num_envs=2,
                                     round_steps=3, updates_per_round=2, batch_size=4, eval_episodes=2,
                                     num_eval_envs=2))  # fmt: skip
    assert report["rounds"] >= 1 and report["samples"] == report["demo_samples"] + 6 * report["rounds"]
    assert report["cpu_s"] >= 0.02 * 60 and json.loads((out / "dagger.json").read_text())["rounds"] == report["rounds"]
    trained = build(lang_env(num_envs=1), bins=8, model_path=str(out))
    before = build(lang_env(num_envs=1), bins=8, model_path=str(start))
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), before.state_dict().values()))
    with pytest.raises(SystemExit, match="no bc_eval.json"):
        dagger.main(dagger.Args(model_path=str(tmp_path)))


def test_dagger_rounds_without_an_update_record_no_loss_and_the_output_is_written(tmp_path, monkeypatch):
    """A round whose rollout uses up the budget makes no update: it records loss None (not the previous round's),
    and the policy and dagger.json are written even when the first round is such a round."""
    from examples.hf_vla import dagger

    start = tmp_path / "bc"
    bc.main(bc.Args(out=str(start), env_kwargs=json.dumps(ENV_KWARGS), action_bins=8, demo_episodes=2, num_envs=2,
                    steps=1, batch_size=4, eval_episodes=2, num_eval_envs=2))  # fmt: skip
    clock, rollouts, label_rollout = [0.0], [], dagger.label_rollout

    def costly_rollout(*args, **kwargs):  # the n-th round's rollout costs what the plan says, updates nothing
        rollouts.append(1)
        clock[0] += plan[len(rollouts) - 1]
        return label_rollout(*args, **kwargs)

    monkeypatch.setattr(dagger.time, "process_time", lambda: clock[0])
    monkeypatch.setattr(dagger, "label_rollout", costly_rollout)
    small = dict(model_path=str(start), cpu_minutes=1.0, num_envs=2, round_steps=2, updates_per_round=2,
                 batch_size=4, eval_episodes=2, num_eval_envs=2)  # fmt: skip
    for plan, losses, updates in (([60.0], [None], [0]), ([0.0, 60.0], ["float", None], [2, 2])):
        rollouts.clear()
        clock[0] = 0.0
        out = tmp_path / f"dagger_{len(plan)}"
        report = dagger.main(dagger.Args(out=str(out), **small))
        saved = json.loads((out / "dagger.json").read_text())
        assert [type(p["loss"]).__name__ if p["loss"] is not None else None for p in saved["curve"]] == losses
        assert [p["updates"] for p in saved["curve"]] == updates  # (counted from the start)
        assert saved["rounds"] == report["rounds"] == len(plan) and (out / "vla_config.json").is_file()


def test_bc_statistics_are_the_demonstrations_and_their_bins_invert_the_decoding():
    """bc.py's statistics: quantiles, mean and std of the expert's actions and of the state; the bins head's
    targets are the bins whose decoded values are nearest to the (normalised, clipped) expert action."""
    env = make_env("PushCubeLangRL", num_envs=3, seed=0, **{**ENV_KWARGS, "obs_mode": "state+rgb"})
    obs, targets, _ = bc.collect_demos(env, num_episodes=3, seed=0, chunk=1)
    args = bc.Args(env_kwargs=json.dumps({**ENV_KWARGS, "obs_mode": "state+rgb"}))
    stats = bc.demo_statistics(args, obs, targets, 3)
    actions = targets[:, 0].double()
    q = torch.quantile(actions, torch.tensor([0.01, 0.99], dtype=torch.float64), dim=0)
    assert stats.action.stats["q01"] == q[0].tolist() and stats.action.stats["q99"] == q[1].tolist()
    assert stats.state.normalization == "normal" and stats.state.stats["mean"] == obs["state"].double().mean(0).tolist()
    policy = build(make_env("PushCubeLangRL", num_envs=1, seed=0, **{**ENV_KWARGS, "obs_mode": "state+rgb"}), bins=16)
    policy.set_statistics(stats)
    index = policy.action_bins(targets[:, 0])
    decoded = policy.env_action(index)
    every = policy.env_action(torch.arange(16.0).view(16, 1).expand(16, 3))  # each bin's value, per dimension
    low, high = every[0], every[-1]
    nearest = (targets[:, 0].clamp(low - (every[1] - every[0]) / 2, high + (every[1] - every[0]) / 2)[:, None]
               - every[None]).abs().argmin(1)  # fmt: skip
    assert torch.equal(index.long(), nearest) and decoded.shape == targets[:, 0].shape


def test_demo_noise_executes_noisy_actions_and_labels_the_clean_expert():
    """DART: the env runs expert + noise, the sample's target is the expert's own action at the state reached."""

    class Recording:  # the env, recording the actions it is given
        def __init__(self, env):
            self.env, self.executed = env, []

        def __getattr__(self, name):
            return getattr(self.env, name)

        def step(self, action):
            self.executed.append(action.clone())
            return self.env.step(action)

    runs = {}
    for noise in (0.0, 0.3):
        env = Recording(make_env("PushCubeLangRL", num_envs=3, seed=0, **ENV_KWARGS))
        obs, targets, valid = bc.collect_demos(env, num_episodes=3, seed=0, chunk=1, noise=noise)
        runs[noise] = (obs, targets[:, 0], torch.stack(env.executed).reshape(-1, 3))
    clean_obs, clean_targets, clean_executed = runs[0.0]
    noisy_obs, noisy_targets, noisy_executed = runs[0.3]
    assert torch.equal(clean_executed, clean_targets)  # no noise: the env runs the labels
    gap = (noisy_executed - noisy_targets).flatten()
    assert (noisy_executed.abs() <= 1).all() and 0.2 < float(gap.std()) < 0.35  # noise 0.3, clipped at the bounds
    assert torch.equal(noisy_obs[:3]["rgb"], clean_obs[:3]["rgb"])  # the same starts and first labels ...
    assert torch.equal(noisy_targets[:3], clean_targets[:3])
    assert not torch.equal(noisy_obs[3:6]["rgb"], clean_obs[3:6]["rgb"])  # ... then the noise moves the arm


def test_demo_chunks_hold_the_expert_actions_of_the_same_episode():
    env = make_env("PushCubeLangRL", num_envs=3, seed=0, max_episode_steps=5, **ENV_KWARGS)
    obs, targets, valid = bc.collect_demos(env, num_episodes=6, seed=0, chunk=3)
    steps = len(targets) // 3
    assert steps == 10  # two episodes of 5 steps per env
    assert obs.batch_size[0] == len(targets) and targets.shape[1:] == (3, 3)
    t, v = targets.view(steps, 3, 3, 3), valid.view(steps, 3, 3)
    assert v[:, :, 0].all()  # the first action of a chunk is always the sample's own
    for step in range(steps - 2):  # within an episode, entry j of step t is entry 0 of step t + j
        for j in (1, 2):
            same = v[step, :, j]
            assert torch.equal(t[step, same, j], t[step + j, same, 0])
    # max_episode_steps 5: the chunks of the 4th and 5th steps reach past their episode's end (truncated there)
    assert not v[4, :, 1:].any() and v[3, :, 1].all() and not v[3, :, 2].any() and v[2].all()
    assert v[5].all() and not v[9, :, 1:].any()  # the next episode's chunks are whole; the rollout ends at 10


def test_bins_decode_to_centres_inside_the_bounds():
    from examples.action_bins import decode_bins

    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 10.0])
    index = torch.tensor([[0.0, 0.0], [255.0, 255.0], [127.0, 128.0]])
    values = decode_bins(index, low, high, 256)
    assert (values > low).all() and (values < high).all()
    assert torch.allclose(values[0], low + (high - low) / 512) and torch.allclose(values[1], high - (high - low) / 512)
    logits = torch.randn(5, 4, 3, 7)
    dist = Bins(logits)
    assert torch.equal(dist.mode, logits.argmax(-1).float())
    draws = dist.sample(generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, dist.sample(generator=torch.Generator().manual_seed(0)))  # the generator's stream
    assert ((draws >= 0) & (draws < 7)).all() and torch.equal(draws, draws.round())
    expected = torch.log_softmax(logits, -1).gather(-1, draws.long().unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(dist.log_prob(draws), expected)
    with pytest.raises(NotImplementedError):
        dist.mean  # noqa: B018 - a categorical has no meaningful mean: evaluation uses the mode


def test_bins_on_an_unbounded_action_space_are_one_line():
    """Token bins need a finite range to spread over: an unbounded Box is refused in one line naming the flag."""
    env = lang_env(num_envs=2)
    unbounded = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    with pytest.raises(SystemExit) as e:
        make_policy(env.single_observation_space, unbounded, policy_flags("bins", 16))
    assert "--action-head" in one_line_exit(e) and "bounded" in one_line_exit(e)
