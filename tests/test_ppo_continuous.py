"""ppo_continuous.py end to end: smoke runs, outputs, bad input, resume, compile, faults, Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous as ppo
from tests import envs_for_tests, trainer_args
from tests.checks import compiled_grads_match
from tests.envs_for_tests import spaces
from tests.subprocesses import ctrl_c_a_long_run, subprocess_env
from tests.trainer_args import EIGHT_ENVS

SCRIPT = Path(ppo.__file__)
TEST_ENV = "tests.envs_for_tests:PointReach-v0"  # registered by a test module; its kwargs inject faults
TINY = dict(EIGHT_ENVS, total_timesteps=4 * 8 * 10)


def tiny_args(tmp_path, **overrides) -> ppo.Args:
    return trainer_args.tiny_args(ppo, tmp_path, TINY, **overrides)


def finite_numbers(obj) -> bool:
    if isinstance(obj, dict):
        return all(finite_numbers(v) for v in obj.values())
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def test_smoke_run_writes_events_summary_checkpoints_and_video(tmp_path):
    out = ppo.main(tiny_args(tmp_path, eval_freq=2, save_freq=2, capture_video=True, norm_obs=True, norm_reward=True))
    run_dir = Path(out["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["script"] == "ppo_continuous" and summary["env_id"] == "PushCubeRL"
    assert summary["global_step"] == 4 * 8 * 10
    assert summary["sps"] > 0 and summary["wall_time_s"] > 0
    assert summary["eval"]["success_rate"] is not None and 0.0 <= summary["eval"]["success_rate"] <= 1.0
    assert summary["eval"]["episodic_length"] > 0
    assert finite_numbers(summary["train"]) and finite_numbers(summary["eval"])
    for name in (
        "losses/value_loss",
        "losses/policy_loss",
        "losses/approx_kl",
        "charts/SPS",
        "losses/explained_variance",
    ):
        assert name in summary["train"], name
    assert summary["versions"]["torch"] == torch.__version__

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"charts/SPS", "losses/value_loss", "eval/success_rate", "eval/episodic_return"} <= set(tags)
    assert all(math.isfinite(e.value) for e in acc.Scalars("losses/value_loss"))
    assert [e.step for e in acc.Scalars("charts/SPS")] == [80, 160, 240, 320]

    ckpt_dir = run_dir / "checkpoints"
    assert {"last.pt", "best.pt", "iter_000002.pt", "iter_000004.pt"} <= {p.name for p in ckpt_dir.iterdir()}
    ckpt = torch.load(ckpt_dir / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 320
    assert not any("_orig_mod" in k for k in ckpt["model"])
    assert "obs_rms.mean" in ckpt["model"] and ckpt["model"]["obs_rms.count"] > 1
    assert ckpt["reward_rms"]["count"] > 1
    videos = list((run_dir / "videos").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 0 for v in videos)


def test_runs_unchanged_on_pendulum(tmp_path):
    out = ppo.main(tiny_args(tmp_path, env_id="Pendulum-v1", num_eval_episodes=4, gamma=0.99))
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["eval"]["success_rate"] is None  # Pendulum has no success signal
    assert summary["eval"]["episodic_length"] == 200
    assert math.isfinite(summary["eval"]["episodic_return"])


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
        ({"num_minibatches": 1000}, "--num-minibatches"),
        ({"num_minibatches": 3}, "--num-minibatches"),
        ({"num_envs": -1}, "--num-envs"),
        ({"total_timesteps": 0}, "--total-timesteps"),
        ({"resume": "/no/such/file.pt"}, "--resume"),
        ({"env_kwargs": "not json"}, "--env-kwargs"),
        ({"policy": "no_such_module:make_agent"}, "--policy"),
        ({"policy": "toy_policies"}, "--policy"),
        ({"policy": "toy_policies:without_forward"}, "forward"),  # a module that lacks the one-pass forward
        ({"num_envs": 2, "num_steps": 2, "num_minibatches": 4}, "--num-minibatches"),  # minibatches of 1 sample
        ({"env_kwargs": '{"no_such_option": 1}'}, "--env-kwargs"),
        ({"cudagraphs": True}, "--cudagraphs"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, overrides, flag):
    if flag == "--cudagraphs" and torch.cuda.is_available():
        pytest.skip("--cudagraphs is valid where CUDA exists")
    with pytest.raises(SystemExit) as e:
        ppo.main(tiny_args(tmp_path, **overrides))
    message = str(e.value.code)
    assert message.startswith("error:") and flag in message and "\n" not in message
    if flag == "--env-id":
        assert "PushCubeRL" in message
    assert not list(tmp_path.glob("*/summary.json"))  # refused before any run started


def test_bad_input_from_the_command_line_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--env-id", "NoSuchEnv-v0"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--env-id" in lines[0] and "PushCubeRL" in lines[0]


def test_resume_is_bit_identical_to_a_straight_run(tmp_path):
    common = dict(
        total_timesteps=6 * 8 * 10, save_freq=3, eval_freq=2, norm_obs=True, norm_reward=True, torch_deterministic=True
    )
    straight = ppo.main(tiny_args(tmp_path / "a", **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    resumed = ppo.main(tiny_args(tmp_path / "b", resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 480
    a = torch.load(Path(straight["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["reward_rms"]["var"], b["reward_rms"]["var"])
    # logging steps continue where the first half stopped, and episodes that span the resume keep their
    # return and length so far (the episode statistics are part of the env state in the checkpoint)
    acc, full = EventAccumulator(resumed["run_dir"]), EventAccumulator(straight["run_dir"])
    acc.Reload()
    full.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [320, 400, 480]
    for tag in ("charts/episodic_return", "charts/episodic_length"):
        after = [(e.step, e.value) for e in full.Scalars(tag) if e.step > 240]
        assert after and [(e.step, e.value) for e in acc.Scalars(tag)] == after, tag


def test_resume_refuses_a_checkpoint_of_another_env(tmp_path):
    first = ppo.main(tiny_args(tmp_path / "a"))
    last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    with pytest.raises(SystemExit) as e:
        ppo.main(tiny_args(tmp_path / "b", env_id="Pendulum-v1", resume=str(last)))
    assert "--env-id" in str(e.value.code) and "\n" not in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        ppo.main(tiny_args(tmp_path / "c", hidden_sizes=(16,), resume=str(last)))
    assert "--hidden-sizes" in str(e.value.code)


def test_eval_checkpoint_evaluates_without_training(tmp_path):
    first = ppo.main(tiny_args(tmp_path / "a"))
    last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    out = ppo.main(tiny_args(tmp_path / "b", eval_checkpoint=str(last), capture_video=True))
    assert out["global_step"] == first["global_step"]
    run_dir = Path(out["run_dir"])
    assert not list((run_dir / "checkpoints").glob("*.pt"))  # nothing trained, nothing saved
    assert list((run_dir / "videos").glob("*.mp4"))
    assert json.loads((run_dir / "summary.json").read_text())["eval"]["episodic_length"] > 0


def test_non_finite_observation_stops_with_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:  # every sub-env's 3rd step returns NaN: rollout step 2 of 8 envs
        ppo.main(tiny_args(tmp_path, env_id=TEST_ENV, env_kwargs='{"nan_obs_at_step": 3}'))
    message = str(e.value.code)
    assert message.startswith("error: non-finite observation from env(s) [0, 1, 2, 3, 4, 5, 6, 7] at global step 24")
    assert "\n" not in message


def test_non_finite_final_observation_is_named_not_blamed_on_the_loss(tmp_path):
    """A NaN in the last observation of an episode (seen only in info["final_obs"], the env has reset
    already) must stop the run with one line naming it, not spread through V(final_obs) into the loss."""
    with pytest.raises(SystemExit) as e:  # episodes terminate at their 4th step with a NaN final obs
        ppo.main(
            tiny_args(
                tmp_path,
                env_id=TEST_ENV,
                env_kwargs='{"terminate_at_step": 4, "nan_final_obs": true, "success_radius": 0}',
            )
        )
    assert str(e.value.code).startswith(
        "error: non-finite observation from env(s) [0, 1, 2, 3, 4, 5, 6, 7] at global step 32"
    ), e.value.code


def test_compiled_and_eager_first_update_agree(tmp_path):
    torch.manual_seed(0)
    args = tiny_args(tmp_path)
    agent = ppo.Agent(*spaces(31, 7), args)
    batch = TensorDict(
        obs=torch.randn(64, 31),
        action=torch.randn(64, 7),
        logprob=torch.randn(64) - 5,
        value=torch.randn(64),
        advantages=torch.randn(64),
        returns=torch.randn(64),
        batch_size=[64],
    )
    compiled_grads_match(ppo.ppo_loss, agent, batch, args)
    rew, val, nxt = torch.randn(3, 10, 4).unbind(0)
    term, done = torch.rand(10, 4) < 0.1, torch.rand(10, 4) < 0.2
    eager = ppo.compute_gae(rew, val, nxt, term, done | term, 0.9, 0.95)
    compiled = torch.compile(ppo.compute_gae)(rew, val, nxt, term, done | term, 0.9, 0.95)
    torch.testing.assert_close(compiled, eager)


def test_compile_flag_trains_and_saves_plain_state_dict(tmp_path):
    """--compile trains as the eager run does (same seed: the same weights up to float rounding, which an
    update that did nothing, or another one, would not give) and saves the plain module's state dict."""
    common = dict(total_timesteps=2 * 8 * 10, eval_freq=0, num_eval_episodes=4, norm_obs=True)
    runs = {c: ppo.main(tiny_args(tmp_path / c, compile=c, **common)) for c in ("on", "off")}  # (eager's draws)
    compiled, eager = (
        torch.load(Path(runs[c]["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for c in ("on", "off")
    )
    assert not any("_orig_mod" in k for k in compiled["model"]) and compiled["model"].keys() == eager["model"].keys()
    assert compiled["global_step"] == 160
    torch.manual_seed(1)
    initial = ppo.Agent(*spaces(31, 7), tiny_args(tmp_path, **common)).state_dict()
    for key, value in eager["model"].items():
        torch.testing.assert_close(compiled["model"][key], value, rtol=1e-3, atol=1e-4)
    moved = max(
        (eager["model"][k] - initial[k]).abs().max().item() for k in initial if k.startswith(("actor", "critic"))
    )
    assert moved > 1e-3  # and they did train: far from the initial weights


def test_ctrl_c_writes_last_checkpoint_and_summary(tmp_path):
    summary, _ = ctrl_c_a_long_run(SCRIPT, tmp_path, env=subprocess_env())
    assert summary["checkpoint"].endswith("last.pt")


def test_default_ppo_learns_to_push_the_cube(tmp_path):
    """A short but real run at the default hyperparameters: a random policy succeeds in < 5% of
    episodes (tests/test_push_cube.py), PPO must get most eval episodes right after 200k steps. Eager: `--compile
    auto` compiles where an iteration is slow enough for it to pay, and the run then differs by rounding."""
    args = ppo.Args(output_dir=str(tmp_path), total_timesteps=200_000, cuda=False, eval_freq=0, save_freq=0)
    out = ppo.main(dataclasses.replace(args, compile="off"))
    assert out["eval"]["success_rate"] >= 0.8, out["eval"]


def test_env_kwargs_reach_train_envs_and_eval_envs_inherit_them_with_overrides(tmp_path):
    envs_for_tests.CONSTRUCTED.clear()
    ppo.main(
        tiny_args(
            tmp_path,
            env_id=TEST_ENV,
            env_kwargs='{"record": true, "terminate_at_step": 7, "success_radius": 0.05}',
            eval_env_kwargs='{"success_radius": 0.2}',
        )
    )
    made = sorted((c["terminate_at_step"], c["success_radius"]) for c in envs_for_tests.CONSTRUCTED)
    assert made == [(7, 0.05)] * 8 + [(7, 0.2)] * 4  # 8 training envs; the 4 eval envs inherit, with the override


def test_resume_refuses_another_env_layout_and_unreadable_files(tmp_path):
    first = ppo.main(tiny_args(tmp_path / "a"))
    last = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    with pytest.raises(SystemExit) as e:
        ppo.main(tiny_args(tmp_path / "b", num_envs=16, resume=str(last)))
    assert "--num-envs" in str(e.value.code) and "\n" not in str(e.value.code)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(last.read_bytes()[:100])  # a file cut short
    with pytest.raises(SystemExit) as e:
        ppo.main(tiny_args(tmp_path / "c", resume=str(broken)))
    assert "not a readable" in str(e.value.code) and "\n" not in str(e.value.code)


def test_non_finite_loss_steps_are_skipped_counted_and_eventually_stop(tmp_path):
    # every third training forward gives a NaN loss: 4 iterations x 2 epochs x 2 minibatches = 16 steps, 5 NaN
    out = ppo.main(tiny_args(tmp_path / "a", policy="toy_policies:nan_loss_every"))
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["train"]["charts/skipped_updates"] == 5
    assert all(math.isfinite(v) for k, v in summary["train"].items() if k.startswith("losses/"))
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())  # NaN never reached the weights

    with pytest.raises(SystemExit) as e:
        ppo.main(
            tiny_args(
                tmp_path / "b",
                max_consecutive_skips=3,
                policy="toy_policies:nan_loss_every",
                policy_kwargs='{"every": 1}',
            )
        )
    assert "3 optimizer steps in a row" in str(e.value.code) and "\n" not in str(e.value.code)


def test_capture_video_on_an_env_that_cannot_render_warns_once_and_trains(tmp_path, capsys):
    out = ppo.main(tiny_args(tmp_path, env_id="Pendulum-v1", capture_video=True, eval_freq=1))
    assert out["global_step"] == 320
    assert capsys.readouterr().out.count("cannot render") == 1
    assert not list(Path(out["run_dir"]).glob("videos/*.mp4"))


OLD_FLAGS = dict(action_head="gaussian", action_bins=256, action_chunk=1, micro_batch_size=None, autocast="none")
"""What the args of a checkpoint written before the VLA trainers split off (issue 37) held besides today's flags."""


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_ddp"])
def test_old_checkpoints_load_unless_they_used_what_only_the_vla_trainers_have_now(tmp_path, script):
    """A checkpoint of the old ppo_continuous.py / ppo_ddp.py (its args with the action and update flags, its model
    with a frozen-weight fingerprint) resumes here when it is a Gaussian one; one written with token bins, action
    chunks, micro-batches, autocast or FSDP is refused in one line naming the VLA trainer that has them now."""
    first = ppo.main(tiny_args(tmp_path / "a", save_freq=2))
    ckpt = torch.load(Path(first["run_dir"]) / "checkpoints" / "iter_000002.pt", weights_only=True)
    old = dict(ckpt, script=script, args={**ckpt["args"], **OLD_FLAGS}, frozen="")
    if script == "ppo_ddp":
        old.update(world_size=1, other_ranks=[])
        old["args"]["fsdp"] = False
    path = tmp_path / "old.pt"
    torch.save(old, path)
    resumed = ppo.main(tiny_args(tmp_path / "b", resume=str(path)))
    assert resumed["global_step"] == first["global_step"] == 320
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (first, resumed))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # it went on where it stopped

    vla = "ppo_vla.py"  # the VLA sibling of the trainer that loads it (ppo_ddp.py would name ppo_vla_ddp.py)
    cases = [("action_head", "bins"), ("action_chunk", 4), ("micro_batch_size", 7), ("autocast", "bf16")]
    for key, value in cases + ([("fsdp", True)] if script == "ppo_ddp" else []):
        torch.save(dict(old, args={**old["args"], key: value}), path)
        for flag in ("resume", "eval_checkpoint"):
            with pytest.raises(SystemExit) as e:
                ppo.main(tiny_args(tmp_path / "c", **{flag: str(path)}))
            message = str(e.value.code)
            assert message.startswith(f"error: --{flag.replace('_', '-')} {path}: written by the old {script}.py")
            assert f"--{key.replace('_', '-')} {value}" in message and vla in message and "\n" not in message
    assert not list((tmp_path / "c").glob("*/summary.json"))  # refused before any run started


def test_a_checkpoint_of_a_two_rank_ppo_ddp_run_resumes_at_its_env_step(tmp_path, capsys):
    """A two-rank ppo_ddp.py checkpoint counts iterations of both ranks' batches: after its iteration 3 the world
    has taken 6 of ppo_continuous.py's batches, so a resume starts at iteration 7 and stops at the planned total
    (not 3 + 1, which would run 6 batches too many and restart the learning-rate schedule from 0.75 of its base)."""
    first = ppo.main(tiny_args(tmp_path / "a", save_freq=6, total_timesteps=12 * 8 * 10))  # 12 iterations of 80
    ckpt = torch.load(Path(first["run_dir"]) / "checkpoints" / "iter_000006.pt", weights_only=True)
    assert ckpt["global_step"] == 6 * 80
    world = dict(ckpt, script="ppo_ddp", iteration=3, num_iterations=6)  # what rank 0 of two ranks writes there
    torch.save(world, tmp_path / "ddp.pt")
    capsys.readouterr()
    resumed = ppo.main(tiny_args(tmp_path / "b", resume=str(tmp_path / "ddp.pt"), total_timesteps=12 * 8 * 10))
    assert "start=7" in capsys.readouterr().out and resumed["global_step"] == 12 * 80
