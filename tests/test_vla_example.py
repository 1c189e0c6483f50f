"""examples/tiny_vla.py: the pretrained-file round trip, the factory's space check, training with ppo_vla_async.py
(resume, --eval-checkpoint), GRPO fine-tuning from a ppo_continuous.py checkpoint with a KL penalty, and a frozen
encoder."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from cleanrl_embodied import grpo, ppo_continuous, ppo_vla_async
from cleanrl_embodied.shared.model_state import frozen_fingerprint
from examples import tiny_vla
from examples.tiny_vla import TinyVLA, TinyVLAConfig, load_pretrained, make_policy, save_pretrained
from tests.checks import one_line_exit
from tests.trainer_args import EIGHT_ENVS, fit

REPO = Path(__file__).resolve().parents[1]
SIZE = 36
ENV_KWARGS = json.dumps({"obs_mode": "rgb", "image_size": SIZE})
POLICY = "examples.tiny_vla:make_policy"
PPO_ITERATIONS = 4
PPO_SIZES = dict(EIGHT_ENVS, eval_freq=0, save_freq=0, env_kwargs=ENV_KWARGS, eval_env_kwargs=ENV_KWARGS, policy=POLICY)
PPO = fit(ppo_vla_async, PPO_SIZES)  # (no network sizes: the example's policy; ppo_continuous takes it too)


pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


def rgb_spaces(size: int = SIZE, act_dim: int = 7) -> tuple[gym.spaces.Dict, gym.spaces.Box]:
    obs = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (3, size, size), np.uint8)})
    return obs, gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)


def scalars(run_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> str:
    """The VLA page's first step: `python examples/tiny_vla.py --out ... --image-size 36`, in process."""
    path = str(tmp_path_factory.mktemp("vla") / "tiny_vla.pt")
    argv = sys.argv
    sys.argv = ["tiny_vla.py", "--out", path, "--image-size", str(SIZE)]
    try:
        tiny_vla.main()
    finally:
        sys.argv = argv
    return path


@pytest.fixture(scope="module")
def ppo_run(pretrained, tmp_path_factory) -> dict:
    out_dir = tmp_path_factory.mktemp("ppo")
    args = ppo_vla_async.Args(
        **PPO,
        output_dir=str(out_dir),
        total_timesteps=PPO_ITERATIONS * 80,
        policy_kwargs=json.dumps({"model_path": pretrained}),
    )
    return ppo_vla_async.main(args) | {"args": args}


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(3)
    model = TinyVLA(TinyVLAConfig(image_size=[SIZE, 40], state_dim=31, instruction="push it"))
    with torch.no_grad():
        model.action_logstd.uniform_(-2, 0)  # not the initial value
    save_pretrained(model, tmp_path / "m.pt")
    blob = torch.load(tmp_path / "m.pt", weights_only=True)
    assert blob["model_class"] == "examples.tiny_vla:TinyVLA"
    assert blob["model_config"]["image_size"] == (SIZE, 40) and blob["model_config"]["instruction"] == "push it"
    loaded = load_pretrained(tmp_path / "m.pt")
    assert type(loaded) is TinyVLA and loaded.config == model.config
    obs = TensorDict(
        rgb=torch.randint(0, 256, (5, 3, SIZE, 40), dtype=torch.uint8), state=torch.randn(5, 31), batch_size=[5]
    )
    with torch.no_grad():
        (d1, v1), (d2, v2) = model(obs), loaded(obs)
        other = TinyVLA(TinyVLAConfig(image_size=(SIZE, 40), state_dim=31)).dist(obs).mean  # another init differs
    assert torch.equal(d1.mean, d2.mean) and torch.equal(d1.stddev, d2.stddev) and torch.equal(v1, v2)
    assert torch.equal(loaded.get_value(obs), v1) and torch.equal(loaded.dist(obs).mean, d1.mean)
    assert not torch.allclose(other, d1.mean)
    # the instruction is part of the model: another instruction gives another embedding, the same one the same
    assert torch.equal(loaded.instruction, tiny_vla.embed_instruction("push it", 32))
    assert not torch.allclose(loaded.instruction, tiny_vla.embed_instruction("push the cube", 32))


def test_script_writes_a_file_that_names_the_importable_class(tmp_path):
    """`python examples/tiny_vla.py --out F` (the VLA page's first step) runs as __main__ yet records the class
    under its importable name, so the trainers can rebuild it; it reports the inference latency."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tiny_vla.py"), "--out", str(tmp_path / "f.pt"), "--image-size", "40"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"inference [0-9.]+ ms per call \(median, batch 8, 40x40", out.stdout), out.stdout
    assert torch.load(tmp_path / "f.pt", weights_only=True)["model_class"] == "examples.tiny_vla:TinyVLA"
    assert load_pretrained(tmp_path / "f.pt").config.image_size == (40, 40)


def test_factory_rejects_mismatched_spaces_in_one_line(tmp_path, pretrained):
    args = ppo_vla_async.Args()
    assert make_policy(*rgb_spaces(), args, model_path=pretrained).config.image_size == (SIZE, SIZE)
    for obs_space, act_space, needle in (
        (*rgb_spaces(size=48), "(3, 36, 36)"),
        (*rgb_spaces(act_dim=3), "(3,)"),
        (gym.spaces.Box(-1, 1, (31,)), rgb_spaces()[1], "obs_mode"),
    ):
        with pytest.raises(SystemExit) as excinfo:
            make_policy(obs_space, act_space, args, model_path=pretrained)
        assert needle in one_line_exit(excinfo)
    for kwargs, needle in (
        ({"model_path": pretrained, "width": 8}, "fixes the config"),
        ({"widht": 8}, "widht"),
        ({"model_path": str(tmp_path / "none.pt")}, "none.pt"),
    ):
        with pytest.raises(SystemExit) as excinfo:
            make_policy(*rgb_spaces(), args, **kwargs)
        assert needle in one_line_exit(excinfo)
    fresh = make_policy(*rgb_spaces(size=40), args, width=24)  # no file: sizes from the spaces, the rest from kwargs
    assert (fresh.config.image_size, fresh.config.width, fresh.config.action_dim) == ((40, 40), 24, 7)
    with pytest.raises(SystemExit) as excinfo:  # a fresh model on state observations: no image to read
        make_policy(gym.spaces.Box(-1, 1, (31,)), rgb_spaces()[1], args)
    assert "'rgb'" in one_line_exit(excinfo)
    with pytest.raises(SystemExit) as excinfo:
        make_policy(*rgb_spaces(), ppo_continuous.Args(norm_obs=True))  # (a classic trainer's flag)
    assert "--norm-obs" in one_line_exit(excinfo)
    # through a trainer: the env's images are 48 x 48, the pretrained model reads 36 x 36
    big = json.dumps({"obs_mode": "rgb", "image_size": 48})
    with pytest.raises(SystemExit) as excinfo:
        ppo_vla_async.main(
            ppo_vla_async.Args(
                **{**PPO, "env_kwargs": big, "eval_env_kwargs": big},
                output_dir=str(tmp_path),
                policy_kwargs=json.dumps({"model_path": pretrained}),
            )
        )
    assert "48" in one_line_exit(excinfo)


def test_ppo_vla_async_trains_resumes_and_evaluates_the_checkpoint(tmp_path, pretrained, ppo_run):
    summary = json.loads((Path(ppo_run["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == PPO_ITERATIONS * 80 and summary["dropped_rollouts"] == 0
    logged = scalars(ppo_run["run_dir"])
    assert len(logged["charts/policy_staleness"]) == PPO_ITERATIONS and max(logged["charts/policy_staleness"]) <= 1
    assert all(math.isfinite(v) for v in logged["losses/value_loss"])
    last = Path(ppo_run["run_dir"]) / "checkpoints" / "last.pt"
    ckpt, start = torch.load(last, weights_only=True), load_pretrained(pretrained).state_dict()
    assert set(ckpt["model"]) == set(start)
    for prefix in ("encoder.", "film.", "action_mean.", "value.", "action_logstd"):  # everything trains
        assert any(not torch.equal(v, start[k]) for k, v in ckpt["model"].items() if k.startswith(prefix)), prefix
    assert torch.equal(ckpt["model"]["instruction"], start["instruction"])  # a buffer: fixed
    # --eval-checkpoint rebuilds the policy through the factory and gives the training's final evaluation
    args = ppo_run["args"]
    ev = ppo_vla_async.main(
        ppo_vla_async.Args(**PPO, output_dir=str(tmp_path), policy_kwargs=args.policy_kwargs, eval_checkpoint=str(last))
    )
    assert ev["eval"] == ppo_run["eval"] and ev["global_step"] == PPO_ITERATIONS * 80
    # --resume continues the run for one more iteration
    res = ppo_vla_async.main(
        ppo_vla_async.Args(
            **PPO,
            output_dir=str(tmp_path),
            policy_kwargs=args.policy_kwargs,
            resume=str(last),
            total_timesteps=(PPO_ITERATIONS + 1) * 80,
        )
    )
    assert res["global_step"] == (PPO_ITERATIONS + 1) * 80 and len(res["timeline"]) == 1
    with pytest.raises(SystemExit) as excinfo:  # the checkpoint records the policy: another one is refused
        ppo_vla_async.main(
            ppo_vla_async.Args(**PPO, output_dir=str(tmp_path), policy_kwargs="{}", eval_checkpoint=str(last))
        )
    assert "--policy-kwargs" in one_line_exit(excinfo)


def test_grpo_fine_tunes_a_ppo_checkpoint_with_a_kl_penalty(tmp_path, pretrained):
    """The classic family: grpo.py with a --ref-checkpoint of ppo_continuous.py, both with the Gaussian tiny VLA."""
    kwargs = json.dumps({"model_path": pretrained})
    ppo_run = ppo_continuous.main(ppo_continuous.Args(**PPO, output_dir=str(tmp_path / "ppo"), policy_kwargs=kwargs,
                                                      total_timesteps=PPO_ITERATIONS * 80))  # fmt: skip
    ppo_run["args"] = ppo_continuous.Args(policy_kwargs=kwargs)
    ppo_ckpt = Path(ppo_run["run_dir"]) / "checkpoints" / "last.pt"
    args = grpo.Args(
        **PPO,
        group_size=4,
        policy_kwargs=ppo_run["args"].policy_kwargs,
        ref_checkpoint=str(ppo_ckpt),
        kl_coef=0.02,
        total_timesteps=2 * 80,
        output_dir=str(tmp_path),
    )
    out = grpo.main(args)
    ckpt, reference = torch.load(out["checkpoint"], weights_only=True), torch.load(ppo_ckpt, weights_only=True)
    assert ckpt["args"]["kl_coef"] == 0.02
    for key, value in reference["model"].items():  # the reference is the PPO policy, critic included
        assert torch.equal(ckpt["ref_model"][key], value), key
    assert not torch.equal(ckpt["model"]["action_mean.2.weight"], reference["model"]["action_mean.2.weight"])
    kl = scalars(out["run_dir"])["grpo/kl_ref"]
    assert len(kl) == 2 and all(math.isfinite(v) and v >= 0 for v in kl) and kl[-1] > 0  # the policy moved


def test_freeze_encoder_trains_the_heads_only(tmp_path, pretrained, ppo_run):
    kwargs = json.dumps({"model_path": pretrained, "freeze_encoder": True})
    out = ppo_vla_async.main(
        ppo_vla_async.Args(**PPO, output_dir=str(tmp_path), total_timesteps=2 * 80, policy_kwargs=kwargs)
    )
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    start = load_pretrained(pretrained)
    encoder = [k for k in start.state_dict() if k.startswith("encoder.")]
    # the frozen encoder is not in the checkpoint, only its fingerprint, which is still the pretrained one's
    assert encoder and not any(k in ckpt["model"] for k in encoder)
    start.encoder.requires_grad_(False)  # as freeze_encoder does
    assert ckpt["frozen"] == frozen_fingerprint(start)
    start = start.state_dict()
    assert not torch.equal(ckpt["model"]["action_mean.2.weight"], start["action_mean.2.weight"])
    assert not torch.equal(ckpt["model"]["value.2.weight"], start["value.2.weight"])
    # the optimizer holds state only for the parameters that train (the unfrozen run's: all of them)
    n_params = len(list(load_pretrained(pretrained).parameters()))
    n_encoder = len(list(load_pretrained(pretrained).encoder.parameters()))
    unfrozen = torch.load(Path(ppo_run["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert len(unfrozen["optimizer"]["state"]) == n_params
    assert len(ckpt["optimizer"]["state"]) == n_params - n_encoder
