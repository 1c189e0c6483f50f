"""examples/hf_vla with several cameras: every image entry of the observation goes through the vision tower, their
tokens one camera's after the other as PaliGemma lays out several images of a sample; the order is saved with the
model, and a checkpoint refuses an env with other cameras in one line. Tiny models built offline, CPU, seconds."""

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

from cleanrl_embodied import grpo_vla
from cleanrl_embodied.shared.envs import make_env
from examples.hf_vla import Bins, HFVLAPolicy, make_policy
from tests.checks import exits_in_one_line
from tests.hf_vla_policies import policy_flags

SIZE = 32  # 2x2 patches of 16 pixels: 4 image tokens per camera
ENV_KWARGS = {"obs_mode": "rgb", "image_size": SIZE, "action_mode": "ee_delta_pos"}
TWO = {**ENV_KWARGS, "obs_cameras": ["top", "wrist"]}


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/conftest.py


def env_of(num_envs: int = 3, **kwargs):
    return make_env("PushCubeLangRL", num_envs=num_envs, seed=0, **{**TWO, **kwargs})


def build(env, head: str = "bins", **kwargs) -> HFVLAPolicy:
    args = policy_flags(head)
    return make_policy(env.single_observation_space, env.single_action_space, args, **kwargs)


def outputs(policy: HFVLAPolicy, obs) -> torch.Tensor:
    with torch.no_grad():
        dist, value = policy(obs)
    assert isinstance(dist, Bins)
    return torch.cat((dist.logits.flatten(1), value[:, None]), 1)


def test_a_policy_acts_on_two_cameras_and_reads_the_second():
    env = env_of()
    policy = build(env)
    assert policy.config.cameras == ["rgb", "wrist"]  # the image entries, sorted
    obs, _ = env.reset(seed=0)
    with torch.no_grad():
        dist, value = policy(obs)
        action = dist.sample()
    assert action.shape == (3, 3) and value.shape == (3,)
    env.step(policy.env_action(action))
    tokens = policy.image_tokens(obs, torch.float32)
    assert tokens.shape == (3, 2 * 4, 64)  # cameras x (32 / 16)^2 tokens, hidden size 64
    base = outputs(policy, obs)
    other = obs.clone()
    other["wrist"] = obs["wrist"].roll(1, 0)  # another env's wrist view, the top view unchanged
    changed = outputs(policy, other)
    assert all(not torch.allclose(base[i], changed[i]) for i in range(3))  # the wrist image is read
    with torch.no_grad():
        log_probs = [policy.dist(o).log_prob(action).sum(-1) for o in (obs, other)]
    assert (log_probs[0] - log_probs[1]).abs().min() > 0
    top = obs.clone()
    top["rgb"] = obs["rgb"].roll(1, 0)
    assert not torch.allclose(outputs(policy, top), base)  # and so is the top one


def test_image_tokens_are_paligemmas_own_layout_of_several_images():
    """PaliGemma's forward with C*T ``<image>`` tokens and ``pixel_values`` [B*C, ...] (its processor's layout of C
    images per sample) puts the same embeddings before the text as the policy's image tokens."""
    env = env_of()
    policy = build(env)
    obs, _ = env.reset(seed=1)
    model = policy.backbone.model
    images = torch.stack([obs["rgb"], obs["wrist"]], 1).flatten(0, 1)  # [B*C, 3, H, W], sample-major
    text = torch.tensor([[2, 7, 9, 11]]).expand(3, -1)  # <bos> and a few text ids
    image_id = model.config.image_token_id
    ids = torch.cat((torch.full((3, 2 * 4), image_id), text), 1)
    ones = torch.ones_like(ids)
    with torch.no_grad():
        theirs = model(input_ids=ids, pixel_values=policy.pixels(images, torch.float32), attention_mask=ones,
                       token_type_ids=torch.zeros_like(ids), use_cache=False).last_hidden_state  # fmt: skip
        embeds = torch.cat((policy.image_tokens(obs, torch.float32), model.get_input_embeddings()(text)), 1)
        mine = model(inputs_embeds=embeds, attention_mask=ones, token_type_ids=torch.zeros_like(ids),
                     use_cache=False).last_hidden_state  # fmt: skip
    assert torch.allclose(mine, theirs, atol=1e-6)


def test_save_and_load_keep_the_camera_order(tmp_path: Path):
    env = env_of()
    obs, _ = env.reset(seed=0)
    policy = build(env, cameras=["wrist", "rgb"])  # an explicit order: the wrist camera's tokens first
    assert policy.config.cameras == ["wrist", "rgb"]
    assert not torch.allclose(outputs(policy, obs), outputs(build(env), obs))  # the order matters
    policy.save_pretrained(tmp_path / "vla")
    assert json.loads((tmp_path / "vla" / "vla_config.json").read_text())["cameras"] == ["wrist", "rgb"]
    loaded = build(env, model_path=str(tmp_path / "vla"))
    assert loaded.config.cameras == ["wrist", "rgb"]
    assert torch.allclose(outputs(loaded, obs), outputs(policy, obs), atol=1e-5)


def test_other_cameras_than_the_checkpoints_are_one_line(tmp_path: Path):
    two, one = env_of(), env_of(obs_cameras=["top"])
    build(two).save_pretrained(tmp_path / "two")
    build(one).save_pretrained(tmp_path / "one")
    message = exits_in_one_line(lambda: build(one, model_path=str(tmp_path / "two")))
    assert "saved for the cameras ['rgb', 'wrist']" in message and "image entries ['rgb']" in message
    message = exits_in_one_line(lambda: build(two, model_path=str(tmp_path / "one")))
    assert "saved for the cameras ['rgb']" in message and "['rgb', 'wrist']" in message
    # a VLA saved before it recorded its cameras read "rgb" alone
    config = json.loads((tmp_path / "one" / "vla_config.json").read_text())
    del config["cameras"]
    (tmp_path / "one" / "vla_config.json").write_text(json.dumps(config))
    assert build(one, model_path=str(tmp_path / "one")).config.cameras == ["rgb"]
    assert "saved for the cameras ['rgb']" in exits_in_one_line(lambda: build(two, model_path=str(tmp_path / "one")))
    for cameras in (["rgb"], ["rgb", "rgb", "wrist"], "rgb", ["rgb", "side"], [], ["rgb", 1]):
        message = exits_in_one_line(lambda cameras=cameras: build(two, cameras=cameras))
        assert "--policy-kwargs: cameras must" in message
    wrist_only = env_of(obs_cameras=["wrist"])
    assert build(wrist_only).config.cameras == ["wrist"]


def test_grpo_vla_trains_one_iteration_on_two_cameras(tmp_path: Path):
    args = grpo_vla.Args(
        env_id="PushCubeLangRL", env_kwargs=json.dumps(TWO), policy="examples.hf_vla:make_policy",
        policy_kwargs=json.dumps({"lora_rank": 4, "head_hidden": 16}), action_head="bins", action_bins=8,
        num_envs=4, group_size=2, num_steps=4, total_timesteps=16, num_minibatches=1, update_epochs=1,
        num_eval_envs=2, num_eval_episodes=2, eval_freq=0, save_freq=0, output_dir=str(tmp_path), seed=1,
        cuda=False, compile="off",
    )  # fmt: skip
    result = grpo_vla.main(args)
    summary = json.loads((Path(result["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 16 and summary["eval"]["success_rate"] is not None
    model = torch.load(Path(summary["checkpoint"]), weights_only=True)["model"]
    vision = [k for k in model if "vision_tower" in k and "lora_B" in k]
    assert vision and any(model[k].abs().sum() > 0 for k in vision)  # the vision adapters learnt from the images
