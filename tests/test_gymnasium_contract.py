"""GymnasiumToTorch's own SAME_STEP loop over a SyncVectorEnv's sub-envs, against the vector env's step(), and which
info entries pass (make_env's ``info_keys``).

The reference is the same sub-envs stepped by Gymnasium's ``SyncVectorEnv.step`` and converted (a vector env that is
not a bare SyncVectorEnv, here one behind a pass-through ``VectorWrapper``, is stepped that way, as async ones are):
every output, info entries included, must be equal bit for bit, step by step, across terminations and truncations,
resets with and without seeds and group resets.

At an episode end, ``info["rewards"]`` and ``info["metrics"]`` of a Gymnasium id describe the episode's last step,
not the reset that followed it, in the vector env and in a trainer's logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorWrapper
from gymnasium.wrappers.utils import rescale_box
from tensordict import TensorDict

import tests.envs_for_tests  # noqa: F401  (registers PointReach-v0, PointReachDict-v0, PointReachPixels-v0)
import tests.test_env_wrappers  # noqa: F401  (registers CleanrlEmbodiedDictTest-v0: nested Dict obs, is_success)
from cleanrl_embodied import ppo_continuous
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.envs.gymnasium_backend import GymnasiumToTorch, numpy_vector_to_torch
from cleanrl_embodied.shared.envs.numpy_to_torch import INFO_KEYS
from cleanrl_embodied.shared.envs.render import SafeRender
from cleanrl_embodied.shared.evaluation import evaluate
from tests.trainer_args import TWO_SAVED_ITERATIONS, tiny_args

INFO_ENV_ID = "CleanrlEmbodiedInfoTest-v0"


class InfoEnv(gym.Env):
    """float64 observations (their float32 rounding is visible), an action space that needs rescaling, and an info
    with the contract's optional ``rewards``/``metrics`` dicts, an extra number (``cost``), an entry only resets give
    (``reset_only``) and an ``is_success`` missing at every third step; episodes end at random (terminated) or
    after ``max_episode_steps`` (truncated)."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float64)
    action_space = gym.spaces.Box(np.array([-2.0, 0.0]), np.array([3.0, 0.5]), dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self.np_random.normal(size=5) * np.pi, 0
        return self.x.copy(), {"cost": 0.0, "reset_only": 1}

    def step(self, action):
        self.t += 1
        self.x = self.x * 0.9 + np.concatenate([action, action[:1] * 1e-3, [np.sqrt(2)], [self.t / 3]])
        reward = float(-np.sum(self.x**2) * 1e-2)
        info = {
            "rewards": {"a": reward / 2, "b": reward / 2},
            "metrics": {"dist": float(abs(self.x[0]))},
            "cost": self.t * 0.1,
        }
        if self.t % 3:
            info["is_success"] = bool(self.x[0] > 0)
        return self.x.copy(), reward, bool(self.np_random.random() < 0.05), False, info


if INFO_ENV_ID not in gym.registry:
    gym.register(INFO_ENV_ID, entry_point=InfoEnv, max_episode_steps=17)


def _pair(env_id: str, num_envs: int, seed: int, info_keys="all", **kwargs):
    """(GymnasiumToTorch stepping the sub-envs itself, the same over the vector env's own step()), same seed."""

    def vector_env():
        return gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            wrappers=[SafeRender],
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **kwargs,
        )

    direct = numpy_vector_to_torch(vector_env(), seed=seed, info_keys=info_keys)
    reference = numpy_vector_to_torch(VectorWrapper(vector_env()), seed=seed, info_keys=info_keys)
    gymnasium_to_torch = lambda env: env if isinstance(env, GymnasiumToTorch) else env.env
    assert gymnasium_to_torch(direct)._sub_envs is not None and gymnasium_to_torch(reference)._sub_envs is None
    return direct, reference


def _assert_equal(a, b, path="out"):
    """Same structure, dtypes, shapes and values, bit for bit (NaN included)."""
    if isinstance(a, TensorDict) or isinstance(b, TensorDict):
        assert type(a) is type(b) and a.batch_size == b.batch_size, path
        a, b = a.to_dict(), b.to_dict()
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (path, list(a), list(b))
        for key in a:
            _assert_equal(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{path}[{i}]")
    else:
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, (path, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(
            a.view(torch.uint8) if a.is_floating_point() else a, b.view(torch.uint8) if b.is_floating_point() else b
        ), (path, a, b)


@pytest.mark.parametrize(
    "env_id, num_envs, kwargs",
    [
        ("tests.envs_for_tests:PointReach-v0", 3, {"success_radius": 0.6, "max_episode_steps": 11}),  # both ends
        ("tests.envs_for_tests:PointReach-v0", 2, {"terminate_at_step": 5, "max_episode_steps": 5}),  # both at once
        ("tests.envs_for_tests:PointReachDict-v0", 2, {"max_episode_steps": 9}),  # Dict obs, flattened
        ("tests.envs_for_tests:PointReachPixels-v0", 2, {"max_episode_steps": 6}),  # images stay uint8 TensorDicts
        ("CleanrlEmbodiedDictTest-v0", 3, {}),  # nested Dict obs, is_success at the terminal step, 3-step episodes
        (INFO_ENV_ID, 4, {}),  # rewards/metrics/extra info entries, float64 obs, rescaled actions
    ],
)
def test_sub_env_loop_equals_sync_vector_env_step_by_step(env_id, num_envs, kwargs):
    from cleanrl_embodied.shared.envs import resolve_env_id

    direct, reference = _pair(resolve_env_id(env_id), num_envs, seed=3, **kwargs)
    rng = np.random.default_rng(0)
    act_dim = direct.single_action_space.shape[0]
    _assert_equal(direct.reset(), reference.reset())
    ends = {"terminated": 0, "truncated": 0}
    for t in range(120):
        if t == 50:
            _assert_equal(direct.reset(seed=11), reference.reset(seed=11))
        if t == 80 and "Pixels" not in env_id:
            _assert_equal(direct.reset(options={"group_size": 1}), reference.reset(options={"group_size": 1}))
        actions = torch.from_numpy(rng.uniform(-1.5, 1.5, (num_envs, act_dim)).astype(np.float32))  # some clipped
        out = direct.step(actions)
        _assert_equal(out, reference.step(actions), f"step {t}")
        ends["terminated"] += int(out[2].sum())
        ends["truncated"] += int(out[3].sum())
        info = out[4]
        assert torch.equal(info["_final_obs"], out[2] | out[3]) and info["_episode"] is info["_final_obs"]
    assert ends["terminated"] > 0 and (ends["truncated"] > 0 or "DictTest" in env_id or "Info" in env_id), ends


def test_info_keys_pass_rewards_metrics_and_what_is_named():
    """By default only the contract's entries and the sub-envs' ``rewards``/``metrics`` pass; ``info_keys`` adds
    entries (with their ``_<key>`` masks; a finished env's from its reset, as Gymnasium batches them, except
    ``rewards``/``metrics``, which come from its last step); ``"all"`` passes every numeric entry; sync and async
    alike."""
    contract = {"final_obs", "_final_obs", "success", "episode", "_episode"}
    assert INFO_KEYS == ("rewards", "metrics")
    for vectorization in ("sync", "async"):
        for info_keys, extra in (
            ((), set()),
            (["cost"], {"cost", "_cost"}),
            ("all", {"cost", "_cost", "reset_only", "_reset_only"}),
        ):
            env = make_env(INFO_ENV_ID, num_envs=3, seed=0, vectorization=vectorization, info_keys=info_keys)
            _, reset_info = env.reset()
            assert set(reset_info) == extra  # resets give cost and reset_only only
            seen = set()
            for _ in range(40):
                *_, info = env.step(torch.zeros(3, 2))
                seen |= set(info)
                # the terms and metrics without Gymnasium's `_<key>` masks (they would read as terms)
                assert set(info["rewards"]) == {"a", "b"} and set(info["metrics"]) == {"dist"}
                assert info["rewards"]["a"].dtype == torch.float32
            assert seen == contract | {"rewards", "_rewards", "metrics", "_metrics"} | extra, (info_keys, seen)
            env.close()


def test_info_keys_for_mujoco_and_bad_values(tmp_path, monkeypatch):
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to ./MUJOCO_LOG.TXT
    env = make_env("HalfCheetah-v5", num_envs=2, seed=0)
    env.reset()
    *_, info = env.step(torch.zeros(2, 6))
    assert set(info) == {"final_obs", "_final_obs", "episode", "_episode"}  # no x_position, reward_ctrl, ...
    env.close()
    env = make_env("HalfCheetah-v5", num_envs=2, seed=0, info_keys=["x_position", "reward_ctrl"])
    env.reset()
    *_, info = env.step(torch.zeros(2, 6))
    assert {"x_position", "_x_position", "reward_ctrl", "_reward_ctrl"} <= set(info) and "x_velocity" not in info
    assert info["x_position"].dtype == torch.float32 and info["_x_position"].tolist() == [True, True]
    env.close()
    for bad in ("x_position", 3, [1, 2]):
        with pytest.raises(ValueError, match="info_keys") as err:
            make_env("Pendulum-v1", num_envs=2, info_keys=bad)
        assert "\n" not in str(err.value)


def test_step_outputs_are_fresh_tensors():
    """The running episode sums become the next step's ``info["episode"]`` arrays (no copy): nothing may change
    a tensor that a step returned, neither later steps nor a reset."""
    env = make_env(INFO_ENV_ID, num_envs=3, seed=0)
    env.reset()
    kept = []
    for t in range(60):
        out = env.step(torch.full((3, 2), 0.3))
        kept.append((out, [x.clone() for x in (*out[:4], out[4]["final_obs"], *out[4]["episode"].values())]))
        if t == 30:
            env.reset()
    for out, copies in kept:
        now = [*out[:4], out[4]["final_obs"], *out[4]["episode"].values()]
        assert all(torch.equal(a, b) for a, b in zip(now, copies))
        assert out[0].data_ptr() != out[4]["final_obs"].data_ptr()
    env.close()


@pytest.mark.parametrize("env_id", ["tests.envs_for_tests:PointReach-v0", INFO_ENV_ID])
def test_actions_rescaled_and_clipped_as_gymnasium_does(monkeypatch, env_id):
    """What the sub-envs get is ``clip(rescale_box(space, -1, 1) backward(action))``, bit for bit, for actions
    inside and outside [-1, 1] (for a [-1, 1] space the map is the identity and is left out), and the caller's
    tensor is not changed."""
    env = make_env(env_id, num_envs=4, seed=0)
    space = env.unwrapped.single_action_space
    ones = np.ones(space.shape, dtype=space.dtype)
    _, _, backward = rescale_box(space, -ones, ones)
    seen = []
    sub_env_class = type(env.unwrapped.envs[0].unwrapped)
    original_step = sub_env_class.step
    monkeypatch.setattr(sub_env_class, "step", lambda self, a: (seen.append(np.array(a)), original_step(self, a))[1])
    env.reset()
    rng = np.random.default_rng(1)
    for _ in range(5):
        actions = rng.uniform(-1.3, 1.3, (4, space.shape[0])).astype(np.float32)
        actions[0, 0], actions[1, 0] = -0.0, 1.0
        given = torch.from_numpy(actions.copy())
        env.step(given)
        expected = np.clip(backward(actions.astype(space.dtype)), space.low, space.high)
        got = np.stack(seen[-4:])
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()  # -0.0 included
        assert torch.equal(given, torch.from_numpy(actions))
    env.close()


def test_direct_loop_only_for_a_bare_sync_vector_env():
    env = make_env("Pendulum-v1", num_envs=2, seed=0)
    assert type(env.env) is SyncVectorEnv and env._sub_envs is env.env.envs
    env.close()
    env = make_env("Pendulum-v1", num_envs=2, seed=0, vectorization="async")
    assert env._sub_envs is None
    env.close()


def test_info_conversion_keeps_a_passed_on_dict_whole_and_drops_what_is_not_numeric():
    """The top-level filter picks entries; a dict that passes (rewards, metrics) keeps every term inside it,
    whatever the terms are called. Both backends (Gymnasium ids, EnvPool) convert through this function."""
    from cleanrl_embodied.shared.envs.numpy_to_torch import numeric_info_to_torch

    info = {
        "rewards": {"reach": np.array([1.0, 2.0]), "push": np.array([0.5, 0.0], dtype=np.float32)},
        "x_position": np.array([3.0, 4.0]),
        "names": np.array(["a", "b"], dtype=object),
        "count": np.array([1, 2], dtype=np.int32),
    }
    out = numeric_info_to_torch(info, torch.from_numpy, passes=lambda key: key in ("rewards", "names", "count"))
    assert set(out) == {"rewards", "count"} and set(out["rewards"]) == {"reach", "push"}
    assert out["rewards"]["reach"].dtype == torch.float32 and out["rewards"]["reach"].tolist() == [1.0, 2.0]
    assert out["count"].dtype == torch.int32
    assert set(numeric_info_to_torch(info, torch.from_numpy)) == {"rewards", "x_position", "count"}


def test_channels_last_images_of_a_gymnasium_env_come_channels_first():
    """A Gymnasium pixel env's [H, W, 3] images reach the trainers as the contract's [3, H, W], the same pixels as an
    env that gives them channels-first (not read as a 36-channel image)."""
    from cleanrl_embodied.shared import make_env

    pixels_id = "tests.envs_for_tests:PointReachPixels-v0"
    last = make_env(pixels_id, num_envs=3, seed=0, channels_last=True)
    first = make_env(pixels_id, num_envs=3, seed=0)
    assert (
        last.single_observation_space["pixels"].shape == (3, 36, 36) == first.single_observation_space["pixels"].shape
    )
    a, _ = last.reset(seed=0)
    b, _ = first.reset(seed=0)
    assert a["pixels"].dtype == torch.uint8 and torch.equal(a["pixels"], b["pixels"]) and a["pixels"].any()
    action = torch.full((3, 2), 0.5)
    for _ in range(3):
        a, *_, info_a = last.step(action)
        b, *_, info_b = first.step(action)
        assert torch.equal(a["pixels"], b["pixels"]) and torch.equal(
            info_a["final_obs"]["pixels"], info_b["final_obs"]["pixels"]
        )


# At an episode end, info["rewards"] and info["metrics"] describe the last step, not the reset that follows it.
TERMS_ENV_ID = "CleanrlEmbodiedTermsTest-v0"


class TermsEnv(gym.Env):
    """Every step reports reward term ``a`` = 1 and metric ``m`` = 7; resets report other numbers (-100, -1), as an
    env may; episodes end (terminated) every third step."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {"rewards": {"a": -100.0}, "metrics": {"m": -1.0}}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t == 3, False, {"rewards": {"a": 1.0}, "metrics": {"m": 7.0}}


if TERMS_ENV_ID not in gym.registry:
    gym.register(TERMS_ENV_ID, entry_point=TermsEnv, max_episode_steps=50)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_gymnasium_rewards_and_metrics_at_episode_ends_come_from_the_last_step(vectorization):
    env = make_env(TERMS_ENV_ID, num_envs=3, seed=0, vectorization=vectorization)
    env.reset()
    ends = 0
    for _ in range(7):
        _, _, terminated, _, info = env.step(torch.zeros(3, 1))
        ends += int(terminated.sum())
        assert set(info["rewards"]) == {"a"} and set(info["metrics"]) == {"m"}  # no Gymnasium `_a` masks
        assert info["rewards"]["a"].tolist() == [1.0, 1.0, 1.0], (terminated, info["rewards"])
        assert info["metrics"]["m"].tolist() == [7.0, 7.0, 7.0], (terminated, info["metrics"])
    assert ends == 6
    result = evaluate(lambda obs, gen, starts: torch.zeros(obs.shape[0], 1), env, 4, seed=5)
    assert result["m"] == 7.0 and result["episodic_length"] == 3.0
    env.close()


def test_a_trainer_logs_the_terms_of_a_gymnasium_id_without_masks(tmp_path):
    env_id = f"tests.test_gymnasium_contract:{TERMS_ENV_ID}"
    out = ppo_continuous.main(tiny_args(ppo_continuous, tmp_path, TWO_SAVED_ITERATIONS, env_id=env_id))
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["train"]["rewards/a"] == 1.0 and "rewards/_a" not in summary["train"]
    assert summary["eval"]["m"] == 7.0
