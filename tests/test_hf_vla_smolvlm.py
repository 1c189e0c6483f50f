"""examples/hf_vla's second model family: SmolVLM / Idefics3 (SmolVLA's backbone: SigLIP, a pixel-shuffle connector,
SmolLM2), built offline from a config with a tokenizer built in code: both heads and the value head, the image between
its processor's markers as the model's own forward reads it, bidirectional attention, LoRA on what it names, saving
and loading a directory (bfloat16 kept), a plain checkpoint directory, ppo_vla, and one line for what is refused.

The action tokens on SmolVLM's real vocabulary layout are pinned in tests/test_hf_vla_layouts.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

from transformers import Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration

from cleanrl_embodied import ppo_vla
from cleanrl_embodied.shared.envs import make_env
from examples.hf_vla import build_tokenizer, default_corpus, make_policy, tiny_smolvlm
from tests.checks import one_line_exit
from tests.hf_vla_policies import outputs, policy_flags, train_steps

SIZE = 32  # 4x4 patches of 8 pixels, shuffled 2x2 into 4 image tokens
ENV_KWARGS = {"obs_mode": "state+rgb", "image_size": SIZE, "action_mode": "ee_delta_pos"}
SMOL = {"model_type": "smolvlm", "lora_rank": 4}
MARKERS = ["<fake_token_around_image>", "<global-img>"]


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/conftest.py


def lang_env(num_envs: int = 4, **kw):
    return make_env("PushCubeLangRL", num_envs=num_envs, seed=0, **{**ENV_KWARGS, **kw})


def build(env, head: str = "bins", bins: int = 16, **kwargs):
    flags = policy_flags(head, bins)
    return make_policy(env.single_observation_space, env.single_action_space, flags, **{**SMOL, **kwargs})


def load(env, head: str, path: Path, **kwargs):
    """The directory fixes the family: no model_type."""
    flags = policy_flags(head)
    return make_policy(env.single_observation_space, env.single_action_space, flags, model_path=str(path), **kwargs)


def first_obs(env):
    return env.reset(seed=0)[0]


# ---- building and acting ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type, model_class", [("smolvlm", SmolVLMForConditionalGeneration),
                                                     ("idefics3", Idefics3ForConditionalGeneration)])  # fmt: skip
def test_builds_a_tiny_smolvlm_offline_and_acts_with_both_heads(model_type, model_class):
    env = lang_env()
    obs = first_obs(env)
    policy = build(env, "bins", model_type=model_type)
    assert isinstance(policy.backbone, model_class) and policy.config.model_type == model_type
    assert policy.config.prompt_suffix == "\n" and policy.config.image_resample == "bilinear"
    tokenizer, vocab = policy.tokenizer, len(policy.tokenizer)
    assert tokenizer.convert_ids_to_tokens(list(range(vocab - 16, vocab))) == [f"<bin_{i}>" for i in range(16)]
    assert tokenizer.convert_ids_to_tokens(list(range(vocab - 18, vocab - 16))) == MARKERS  # then the bins
    assert policy.backbone.get_output_embeddings().weight.shape[0] == vocab
    image = policy.image_tokens(obs, torch.float32)
    assert policy.backbone.model.image_seq_len == 4 and image.shape == (4, 2 + 4 + 1, 64)
    dist, value = policy(obs)
    action = dist.sample()
    assert action.shape == (4, 3) and value.shape == (4,) and value.dtype == torch.float32
    assert dist.logits.shape == (4, 3, 16) and dist.log_prob(action).dtype == torch.float32
    env.step(policy.env_action(action))
    gaussian = build(env, "gaussian", model_type=model_type)
    dist, value = gaussian(obs)
    logp = dist.log_prob(dist.sample())
    assert logp.shape == (4, 3) and logp.dtype == torch.float32 and torch.isfinite(logp).all()
    again = build(env, "bins", model_type=model_type)  # every build is the same policy (init_seed)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), again.state_dict().values()))


def test_the_image_is_what_the_models_own_forward_reads_and_attention_is_bidirectional():
    """The model's forward, given input_ids with the processor's markers around image_seq_len <image> tokens (then
    the prompt and the action slots' <act>) and pixel_values [B, 1, 3, H, W], computes the same hidden states as the
    policy's own embedding of the image (fresh queries are zero, so the slots embed <act> alone). And every token sees
    every other: changing the last input changes the first output (a causal SmolLM2 would not)."""
    env = make_env("PushCubeRL", num_envs=2, seed=0, obs_mode="rgb", image_size=SIZE)  # no state, a fixed prompt
    policy = build(env, "gaussian", instruction="push the cube to the goal")
    obs = first_obs(env)
    tokenizer, model = policy.tokenizer, policy.backbone.model
    prompt, _ = policy._prompt(obs)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert model.config.image_token_id == image_id
    fake, glob = tokenizer.convert_tokens_to_ids(MARKERS)
    image = [fake, glob] + [image_id] * model.image_seq_len + [fake]  # the real processor's one global image
    slots = [policy.act_id] * policy.num_slots
    ids = torch.cat([torch.tensor(image).expand(2, -1), prompt, torch.tensor(slots).expand(2, -1)], 1)
    length = ids.shape[1]
    with torch.no_grad():
        mine_slots, mine_pooled = policy.features(obs, policy.action_head)
        out = model(
            input_ids=ids,
            pixel_values=policy.pixels(obs["rgb"], torch.float32)[:, None],
            attention_mask=torch.ones(2, 1, length, length, dtype=torch.bool),
            position_ids=torch.arange(length).expand(2, -1),
        ).last_hidden_state
    torch.testing.assert_close(mine_slots, out[:, -policy.num_slots :], rtol=0, atol=1e-5)
    torch.testing.assert_close(mine_pooled, out.mean(1), rtol=0, atol=1e-5)
    embeds = torch.randn(2, 6, 64, generator=torch.Generator().manual_seed(0))
    changed = embeds.clone()
    changed[:, -1] += 1.0
    mask = torch.ones(2, 6, dtype=torch.long)
    with torch.no_grad():
        first, second = (policy.language_model(e, mask)[:, 0] for e in (embeds, changed))
    assert not torch.allclose(first, second, atol=1e-4)


# ---- what trains --------------------------------------------------------------------------------------------------
TEXT_LINEAR = r".*text_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


@pytest.mark.parametrize("head, targets", [("bins", "all-linear"), ("gaussian", TEXT_LINEAR)])
def test_only_adapters_and_heads_train_and_lora_goes_where_it_is_told(head, targets):
    env = lang_env()
    policy = build(env, head, lora_targets=targets)
    adapted = {n.rsplit(".lora_A", 1)[0] for n in policy.trainable_parameters() if ".lora_A" in n}
    assert any(".text_model.layers.0.self_attn.q_proj" in n for n in adapted)
    assert any(".text_model.layers.1.mlp.down_proj" in n for n in adapted)
    vision = any(".vision_model." in n or ".connector." in n for n in adapted)
    assert vision == (targets == "all-linear")  # the regex: SmolLM2's linear layers only
    assert not any("lm_head" in n for n in adapted)
    dist, value = policy(first_obs(env))
    (-dist.log_prob(dist.sample()).sum(-1).mean() + value.pow(2).mean()).backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    assert all("lora_" in n or n.startswith(("action_head.", "value_head.")) for n in grads), sorted(grads)
    assert all(p.grad is None for p in policy.parameters() if not p.requires_grad)
    assert any("lora_B" in n and g.abs().sum() > 0 for n, g in grads.items())
    key = "action_head.token_delta" if head == "bins" else "action_head.mean.2.weight"
    assert grads[key].abs().sum() > 0 and grads["value_head.2.weight"].abs().sum() > 0
    assert grads["action_head.state_proj.weight"].abs().sum() > 0  # the state token reaches the slots


# ---- saving and loading -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["bins", "gaussian"])
def test_save_load_round_trip_gives_the_same_actions_and_log_probs(head, tmp_path):
    env = lang_env()
    obs = first_obs(env)
    policy = build(env, head)
    train_steps(policy, obs)
    policy.save_pretrained(tmp_path / "a")
    assert json.loads((tmp_path / "a" / "config.json").read_text())["model_type"] == "smolvlm"
    saved = json.loads((tmp_path / "a" / "vla_config.json").read_text())
    assert saved["model_type"] == "smolvlm" and saved["prompt_suffix"] == "\n"
    loaded = load(env, head, tmp_path / "a")
    assert isinstance(loaded.backbone, SmolVLMForConditionalGeneration)
    with torch.no_grad():
        mine, theirs = policy.dist(obs), loaded.dist(obs)
        action = mine.sample(generator=torch.Generator().manual_seed(0)) if head == "bins" else mine.mean
        if head == "bins":
            assert torch.equal(action, theirs.sample(generator=torch.Generator().manual_seed(0)))
            assert torch.equal(mine.mode, theirs.mode)
        torch.testing.assert_close(mine.log_prob(action), theirs.log_prob(action), rtol=0, atol=1e-5)
    for a, b in zip(outputs(policy, obs), outputs(loaded, obs)):  # the adapters merged: float rounding only
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    loaded.save_pretrained(tmp_path / "b")  # and a loaded policy round-trips bit for bit
    again = load(env, head, tmp_path / "b")
    for a, b in zip(outputs(loaded, obs), outputs(again, obs)):
        assert torch.equal(a, b)


def test_a_bfloat16_smolvlm_stays_bfloat16_on_loading_with_float32_heads_and_log_probs(tmp_path):
    env = lang_env(num_envs=2)
    obs = first_obs(env)
    build(env, "bins", dtype="bfloat16").save_pretrained(tmp_path / "vla")
    loaded = load(env, "bins", tmp_path / "vla")
    assert loaded.backbone.get_input_embeddings().weight.dtype == torch.bfloat16
    assert loaded.backbone.model.vision_model.embeddings.patch_embedding.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in loaded.trainable_parameters().values())
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            dist, value = loaded(obs)
        logp = dist.log_prob(dist.sample())
        assert logp.dtype == torch.float32 and value.dtype == torch.float32 and torch.isfinite(logp).all()


def test_loads_a_plain_smolvlm_checkpoint_with_the_familys_conventions(tmp_path):
    """A local SmolVLM directory (config, weights, tokenizer; no vla_config.json) at 64x64 while the env gives 32x32
    images: the smolvlm action tokens (the ids below <global-img>), SmolVLA's bilinear resize and prompt newline (its
    preprocessor_config.json's LANCZOS has no torch equivalent and is not taken), and statistics required."""
    tokenizer = build_tokenizer(default_corpus("{instruction}"), num_bins=0, extra_tokens=MARKERS)
    special = {n: tokenizer.convert_tokens_to_ids(f"<{n}>") for n in ("pad", "bos", "eos", "image")}
    model = SmolVLMForConditionalGeneration(tiny_smolvlm(len(tokenizer), (64, 64), special, hidden_size=32))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"resample": 1, "image_mean": [0.5] * 3}))
    env = lang_env(num_envs=2)
    flags = policy_flags()
    space = (env.single_observation_space, env.single_action_space)
    with pytest.raises(SystemExit) as e:
        make_policy(*space, flags, model_path=str(tmp_path))
    assert "dataset_statistics.json" in one_line_exit(e)
    policy = make_policy(*space, flags, model_path=str(tmp_path), action_stats="env_bounds")
    glob = tokenizer.convert_tokens_to_ids("<global-img>")
    assert policy.token_map.convention == "smolvlm"
    assert list(policy.token_map.ids) == list(range(glob - 1, glob - 17, -1))
    assert policy.vision_size == (64, 64) and policy.config.image_resample == "bilinear"
    assert policy.config.prompt_suffix == "\n" and policy.config.model_type == "smolvlm"
    dist, value = policy(first_obs(env))
    assert dist.logits.shape == (2, 3, 16) and value.shape == (2,)


# ---- training -----------------------------------------------------------------------------------------------------
def test_ppo_vla_trains_a_smolvlm_one_iteration(tmp_path):
    args = ppo_vla.Args(
        env_id="PushCubeLangRL", env_kwargs=json.dumps(ENV_KWARGS), policy="examples.hf_vla:make_policy",
        policy_kwargs=json.dumps({**SMOL, "head_hidden": 16}), action_head="bins", action_bins=16, num_envs=4,
        num_steps=4, total_timesteps=16, num_minibatches=1, update_epochs=1, num_eval_envs=2, num_eval_episodes=2,
        eval_freq=0, save_freq=0, output_dir=str(tmp_path), seed=1, cuda=False,
    )  # fmt: skip
    result = ppo_vla.main(args)
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 16 and abs(summary["train"]["losses/approx_kl"]) < 1e-5
    model = torch.load(Path(summary["checkpoint"]), weights_only=True)["model"]
    fresh = build(lang_env(num_envs=1), "bins", 16, head_hidden=16).state_dict()
    moved = [k for k, v in model.items() if not torch.equal(v, fresh[k])]
    assert moved and all("lora_" in k or k.startswith(("action_head.", "value_head.")) for k in moved), moved
    assert any("text_model" in k for k in moved)


# ---- one line for what is refused ---------------------------------------------------------------------------------
def test_an_unsupported_family_and_bad_smolvlm_kwargs_are_one_line(tmp_path):
    env = lang_env(num_envs=2)
    (tmp_path / "llava").mkdir()
    config = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}
    (tmp_path / "llava" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as e:
        build(env, model_type="paligemma", model_path=str(tmp_path / "llava"))
    assert "model_type" in one_line_exit(e)  # a directory fixes the family
    flags = policy_flags()
    with pytest.raises(SystemExit) as e:
        make_policy(env.single_observation_space, env.single_action_space, flags, model_path=str(tmp_path / "llava"))
    msg = one_line_exit(e)
    assert "model_type 'llava'" in msg and "smolvlm (SmolVLMForConditionalGeneration)" in msg
    assert "idefics3 (Idefics3ForConditionalGeneration)" in msg
    assert "paligemma (PaliGemmaForConditionalGeneration)" in msg
    for kwargs, words in (
        ({"model_type": "llava"}, ["model_type", "smolvlm"]),
        ({"model_type": "paligemma", "scale_factor": 2}, ["scale_factor"]),
        ({"scale_factor": 3}, ["scale_factor", "4x4 patches"]),
        ({"patch_size": 5}, ["patch_size"]),
    ):
        with pytest.raises(SystemExit) as e:
            build(env, **kwargs)
        assert all(word in one_line_exit(e) for word in words), (kwargs, one_line_exit(e))
