"""Gymnasium MuJoCo tasks through make_env (extra `mujoco`): the contract, SAME_STEP autoreset against plain
Gymnasium envs (sync and async), actions at the boundary, headless rendering, and short trainer smoke runs.
Skipped with a reason where MuJoCo is not installed or can't render headless."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_embodied.shared import make_env
from tests.trainer_args import FOUR_ENVS, TWO_ENVS, tiny_args

needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason="needs the mujoco extra: uv sync --extra mujoco"
)
pytestmark = [needs_mujoco, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    """Plain Gymnasium envs made before make_env installs its MuJoCo warning handler write ./MUJOCO_LOG.TXT."""
    monkeypatch.chdir(tmp_path)


def _render_probe(cwd: Path) -> str | None:
    """None when plain Gymnasium MuJoCo renders here (fresh process, EGL unless MUJOCO_GL/DISPLAY say
    otherwise, as our SafeRender does); else why not."""
    if importlib.util.find_spec("mujoco") is None:
        return "mujoco not installed"
    env = dict(os.environ)
    if not any(env.get(k) for k in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")):
        env["MUJOCO_GL"] = "egl"
    code = (
        "import gymnasium as gym; e = gym.make('InvertedPendulum-v5', render_mode='rgb_array', width=32, "
        "height=32); e.reset(seed=0); assert e.render().shape == (32, 32, 3); e.close()"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        return "render probe timed out"
    if result.returncode == 0:
        return None
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    return f"MuJoCo can't render headless here (MUJOCO_GL={env.get('MUJOCO_GL')}): {lines[-1] if lines else '?'}"


REQUIRE_RENDER = "CLEANRL_EMBODIED_REQUIRE_RENDER"
"""Set (to anything but "" or "0") where rendering must work, as in CI (.ci/run installs what EGL needs): then a
machine that can't render fails the render tests instead of skipping them, so video capture is never unchecked."""


def render_required() -> bool:
    return os.environ.get(REQUIRE_RENDER, "") not in ("", "0")


def skip_or_fail(reason: str | None) -> None:
    """Nothing when the render probe passed (``reason`` None); else skip the test, or fail it where rendering
    is required."""
    if reason is not None and render_required():
        pytest.fail(f"{reason} (and {REQUIRE_RENDER} is set: rendering must work here)")
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def can_render(tmp_path_factory):
    skip_or_fail(_render_probe(tmp_path_factory.mktemp("render_probe")))


def test_a_machine_that_must_render_fails_the_render_tests_instead_of_skipping(monkeypatch, tmp_path):
    """Where CLEANRL_EMBODIED_REQUIRE_RENDER is set, a render probe that fails is a failure (OpenGL forced to a
    backend that can't exist makes it fail); unset, the same probe is a skip; a probe that passes is neither."""
    monkeypatch.setenv("MUJOCO_GL", "no_such_backend")
    reason = _render_probe(tmp_path)
    assert reason is not None and "no_such_backend" in reason
    for required, outcome in (("1", pytest.fail.Exception), ("", pytest.skip.Exception), ("0", pytest.skip.Exception)):
        monkeypatch.setenv(REQUIRE_RENDER, required)
        with pytest.raises(outcome):
            skip_or_fail(reason)
        skip_or_fail(None)


# ---------------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------------
def test_halfcheetah_contract():
    env = make_env("HalfCheetah-v5", num_envs=2, seed=0)
    assert env.single_observation_space.shape == (17,) and env.single_observation_space.dtype == np.float32
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    obs, info = env.reset()
    assert obs.shape == (2, 17) and obs.dtype == torch.float32
    obs, reward, terminated, truncated, info = env.step(torch.zeros(2, 6))
    assert reward.shape == (2,) and reward.dtype == torch.float32
    assert terminated.dtype == truncated.dtype == torch.bool
    assert info["final_obs"].shape == (2, 17) and info["_final_obs"].tolist() == [False, False]
    assert set(info["episode"]) == {"r", "l", "success"} and "success" not in info  # no success signal
    assert all(isinstance(v, (torch.Tensor, dict)) for v in info.values())
    # render_mode="rgb_array" by default, yet no renderer is built before the first render()
    sub_env = env.unwrapped.envs[0].unwrapped
    assert sub_env.render_mode == "rgb_array" and not sub_env.mujoco_renderer._viewers
    env.close()


def test_pusher_actions_rescaled_and_clipped_at_the_boundary():
    """Pusher-v5 acts in [-2, 2]: the policy's [-1, 1] is mapped onto it, out-of-range actions are clipped."""
    env = make_env("Pusher-v5", num_envs=5, seed=0)
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
    env.reset()
    policy_actions = torch.tensor([-1.0, 0.5, 1.0, 7.0, -3.0])[:, None].expand(5, 7)
    env.step(policy_actions)
    ctrl = np.stack([e.unwrapped.data.ctrl.copy() for e in env.unwrapped.envs])
    np.testing.assert_array_equal(ctrl, np.array([-2.0, 1.0, 2.0, 2.0, -2.0])[:, None].repeat(7, axis=1))
    env.close()


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_hopper_same_step_autoreset_matches_plain_gymnasium(vectorization):
    """Every step equals a plain Gymnasium Hopper's step, across terminations (falls) and truncations (a
    25-step limit): the first obs of the next episode comes in the same step as the end (SAME_STEP), and no
    NEXT_STEP-style fake transition (reset obs, reward 0) ever reaches the trainer, or the streams would drift."""
    num_envs, seed, limit = 3, 5, 25
    env = make_env("Hopper-v5", num_envs=num_envs, seed=seed, vectorization=vectorization, max_episode_steps=limit)
    assert env.spec.max_episode_steps == limit  # what GRPO reads as its horizon
    refs = [gym.make("Hopper-v5", max_episode_steps=limit) for _ in range(num_envs)]
    obs, _ = env.reset()
    ref_obs = np.stack([ref.reset(seed=seed + i)[0] for i, ref in enumerate(refs)])
    np.testing.assert_allclose(obs.numpy(), ref_obs, rtol=1e-6, atol=1e-6)

    rng = np.random.default_rng(0)
    ref_return, ref_length = np.zeros(num_envs), np.zeros(num_envs, dtype=int)
    n_terminated = n_truncated = 0
    for _ in range(120):
        action = rng.uniform(-1.0, 1.0, size=(num_envs, 3)).astype(np.float32)
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        ref_steps = [ref.step(action[i]) for i, ref in enumerate(refs)]
        ref_reward = np.array([s[1] for s in ref_steps])
        ref_term, ref_trunc = np.array([s[2] for s in ref_steps]), np.array([s[3] for s in ref_steps])
        ref_final = np.stack([s[0] for s in ref_steps])
        ref_return += ref_reward
        ref_length += 1
        np.testing.assert_allclose(reward.numpy(), ref_reward, rtol=1e-5, atol=1e-6)
        assert terminated.tolist() == ref_term.tolist() and truncated.tolist() == ref_trunc.tolist()
        done = ref_term | ref_trunc
        assert info["_final_obs"].tolist() == info["_episode"].tolist() == done.tolist()
        # final_obs: the last obs of finished episodes, the current obs elsewhere
        np.testing.assert_allclose(info["final_obs"].numpy(), ref_final, rtol=1e-5, atol=1e-6)
        for i in np.flatnonzero(done):
            assert info["episode"]["l"][i].item() == ref_length[i]
            assert info["episode"]["r"][i].item() == pytest.approx(ref_return[i], rel=1e-4)
            ref_final[i] = refs[i].reset()[0]  # the vector env resets without a seed, as the reference does
            ref_return[i], ref_length[i] = 0.0, 0
        n_terminated += int(ref_term.sum())
        n_truncated += int((ref_trunc & ~ref_term).sum())
        np.testing.assert_allclose(obs.numpy(), ref_final, rtol=1e-5, atol=1e-6)
    assert n_terminated > 0 and n_truncated > 0  # both kinds of episode end were exercised
    env.close()
    for ref in refs:
        ref.close()


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------
def test_render_gives_the_first_sub_env_frame(can_render):
    env = make_env("InvertedPendulum-v5", num_envs=2, seed=0, width=64, height=48)
    env.reset()
    env.step(torch.zeros(2, 1))
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.shape == (48, 64, 3)
    assert frame.std() > 0  # a picture, not a blank
    renderers = [e.unwrapped.mujoco_renderer for e in env.unwrapped.envs]
    assert renderers[0]._viewers and not renderers[1]._viewers  # only the first sub-env rendered
    env.close()


def test_render_failure_is_none_with_one_warning_and_the_env_goes_on(monkeypatch):
    from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

    def broken(self, render_mode):
        raise RuntimeError("no OpenGL here")

    monkeypatch.setattr(MujocoRenderer, "render", broken)
    env = make_env("InvertedPendulum-v5", num_envs=2, seed=0)
    env.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert env.render() is None
        assert env.render() is None
    messages = [str(w.message) for w in caught if "cannot render" in str(w.message)]
    assert len(messages) == 1 and "no OpenGL here" in messages[0] and "MUJOCO_GL" in messages[0]
    assert env.step(torch.zeros(2, 1))[0].shape == (2, 4)
    env.close()


def test_async_render_failure_keeps_the_workers_alive(monkeypatch):
    """GLFW without a display fails inside the async workers; they must answer None, not die."""
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    env = make_env("InvertedPendulum-v5", num_envs=2, seed=0, vectorization="async", width=32, height=32)
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert env.render() is None
    obs, *_ = env.step(torch.zeros(2, 1))
    assert obs.shape == (2, 4)
    env.close()


# ---------------------------------------------------------------------------------------------------
# Trainers run unchanged
# ---------------------------------------------------------------------------------------------------
def test_ppo_smoke_run_on_halfcheetah(tmp_path):
    from cleanrl_embodied import ppo_continuous as ppo

    out = ppo.main(
        tiny_args(
            ppo,
            tmp_path,
            TWO_ENVS,
            env_id="HalfCheetah-v5",
            num_steps=64,
            total_timesteps=2 * 64 * 2,
            num_minibatches=4,
            update_epochs=2,
            gamma=0.99,
            norm_obs=True,
            norm_reward=True,
            target_kl=None,
            eval_env_kwargs='{"max_episode_steps": 20}',
        )
    )
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 256 and summary["env_id"] == "HalfCheetah-v5"
    assert summary["eval"]["episodic_length"] == 20 and summary["eval"]["success_rate"] is None
    assert math.isfinite(summary["eval"]["episodic_return"])
    assert math.isfinite(summary["train"]["losses/value_loss"])


def test_ppo_capture_video_on_inverted_pendulum(tmp_path, can_render):
    from cleanrl_embodied import ppo_continuous as ppo

    eval_env_kwargs = '{"max_episode_steps": 10, "width": 64, "height": 64}'
    out = ppo.main(
        tiny_args(ppo, tmp_path, TWO_ENVS, env_id="InvertedPendulum-v5", num_steps=16, total_timesteps=32,
                  num_minibatches=2, update_epochs=1, capture_video=True, eval_env_kwargs=eval_env_kwargs)
    )  # fmt: skip
    videos = list((Path(out["run_dir"]) / "videos").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 0 for v in videos)


def test_grpo_smoke_run_on_hopper(tmp_path):
    """GRPO needs identical group starts: MuJoCo's seeded resets give them."""
    from cleanrl_embodied import grpo

    out = grpo.main(
        tiny_args(grpo, tmp_path, FOUR_ENVS, env_id="Hopper-v5", group_size=2, num_steps=10, total_timesteps=80,
                  update_epochs=1, hidden_sizes=(16, 16), eval_env_kwargs='{"max_episode_steps": 10}')
    )  # fmt: skip
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["global_step"] == 2 * 4 * 10  # both iterations of 4 envs x 10 steps
    assert math.isfinite(summary["eval"]["episodic_return"]) and 0 < summary["eval"]["episodic_length"] <= 10
    train = summary["train"]
    assert math.isfinite(train["losses/policy_loss"]) and train["grpo/zero_adv_group_frac"] < 1  # groups differed
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 2
    assert any(not torch.equal(ckpt["model"][k], ckpt["ref_model"][k]) for k in ckpt["model"])  # it trained


QUIET_CHECK = """
import warnings
import mujoco
import torch
from cleanrl_embodied.shared import make_env

for vectorization in ("sync", "async"):
    env = make_env("{env_id}", num_envs=2, seed=0, vectorization=vectorization)
    env.reset(seed=0)
    env.step(torch.zeros(2, env.single_action_space.shape[0]))
    env.close()
xml = "<mujoco><worldbody><body><freejoint/><geom size='1'/></body></worldbody></mujoco>"
model = mujoco.MjModel.from_xml_string(xml)
data = mujoco.MjData(model)
data.qpos[0] = float("nan")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mujoco.mj_checkPos(model, data)  # any other MuJoCo warning still reaches the user, as a Python warning
print("passed on:", [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
"""


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Hopper-v5"])
def test_a_mujoco_task_leaves_the_console_clean_and_the_working_directory_untouched(tmp_path, env_id):
    """Gymnasium's model files set the deprecated compiler attribute 'settotalmass': MuJoCo's default handler prints
    a warning for each sub-env (sync and async) and writes MUJOCO_LOG.TXT into the working directory. make_env drops
    that one warning and passes any other on as a Python RuntimeWarning, with no file."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    result = subprocess.run(
        [sys.executable, "-c", QUIET_CHECK.format(env_id=env_id)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "settotalmass" not in result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []
    assert "passed on: ['MuJoCo: " in result.stdout and "QPOS" in result.stdout, result.stdout
