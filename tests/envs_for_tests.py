"""Tiny Gymnasium envs for the tests, registered when this module is imported.

They stand in for a package that registers its own ids (gymnasium-robotics, a lab's task package), so tests can
use Gymnasium's ``module:EnvId`` form, e.g. ``make_env("tests.envs_for_tests:PointReach-v0", num_envs=4)`` or
``--env-id tests.envs_for_tests:PointReach-v0`` (the repository root is on ``sys.path`` through the editable
install, or as the current directory).

``PointReach-v0`` (:class:`PointReach`): a point in ``[-1, 1]^dim`` moves by ``0.1 * action`` (actions clipped
to ``[-1, 1]``) towards a target drawn at reset. Observation ``float32 [2 * dim]`` = (position, target - position);
reward ``-|target - position|``; ``info["success"]`` (bool) when within 0.1 of the target, which also terminates
the episode; truncated after 50 steps (``max_episode_steps``). A policy that pushes along the observed offset
succeeds within about 10 steps, so a few hundred PPO steps already show learning.

``PointReachDict-v0``: the same task with a ``Dict`` observation ``{"position", "offset"}`` (like
gymnasium-robotics' goal-conditioned envs), for code paths that flatten dict observations.

``PointReachPixels-v0``: the same task seen as ``{"position", "pixels"}``: ``pixels`` is a uint8 ``[3, 36, 36]``
image of the square ``[-1, 1]^2`` (``dim`` 2 only) with the point in the red channel and the target in the
green one, so the target is known from the image alone; for the image observation paths. ``channels_last=True``
gives it as ``[36, 36, 3]``, Gymnasium's usual pixel layout.

Keyword arguments (``gym.make(..., **kwargs)``, ``make_env(..., **kwargs)``, ``--env-kwargs '{...}'``), so that
other tests can inject faults:

- ``dim`` (int, default 2): dimension of the point, the action and half the observation.
- ``nan_obs_at_step`` (int or None): the observation returned by the k-th ``step()`` of this env (counted from 1
  over the env's whole life, across resets) is all NaN; every other observation is finite.
- ``raise_at_step`` (int or None): the k-th ``step()`` (counted the same way) raises ``RuntimeError``.
- ``success_radius`` (float, default 0.1): distance to the target that counts as success (0: never).
- ``terminate_at_step`` (int or None): episodes also terminate (a true end) at their k-th step.
- ``nan_final_obs`` (bool): the observation an episode ends on (its final obs) is all NaN.
- ``record`` (bool): append this env's keyword arguments to ``CONSTRUCTED`` (which envs got what).
- ``pid_file`` (str or None): append the id of the process that builds this env to that file (one line each),
  so a test sees in which processes sub-envs run (``--env-vectorization async``: worker processes).
- ``reward_terms`` (bool): also report ``info["rewards"] = {"time": k}`` at the episode's k-th step, a reward term
  whose per-step mean over any stretch of steps is known in advance.
- ``fixed_target`` (list of ``dim`` floats or None): every episode's target, instead of a random one (then every
  env runs the same episodes, whatever the seeds).

``Echo-v0`` (:class:`Echo`): episodes of one step that report what the action asked for: observation ``[0.0]``,
action ``[a0, a1]`` in ``[-1, 1]^2``, reward ``a0``, ``info["success"] = a1 > 0``, terminated at once. An
evaluation with one episode per eval env is then one policy call, and its return and success rate are what that
call's actions say.

``Cue-v0`` (:class:`Cue`): a task only memory solves. The first observation shows a cue, +1 or -1 at random, then
it is gone: observation ``[cue, 0]`` at the reset, ``[0, t / delay]`` after step t. The episode ends (terminated)
at step ``delay + 1`` (``delay`` kwarg, default 3), whose reward is ``action * cue`` (the action clipped to
``[-1, 1]``; every other step's is 0) and ``info["success"]`` whether its sign was the cue's. A policy without
memory sees the same last observation for both cues: its expected return is 0 and its success 0.5.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

__all__ = ["PointReach"]

ENV_IDS = ("PointReach-v0", "PointReachDict-v0", "PointReachPixels-v0")
ECHO_ID = "Echo-v0"
CUE_ID = "Cue-v0"
PIXELS = 36  # the smallest image the trainers' CNN takes
CONSTRUCTED: list[dict] = []


class PointReach(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        dim: int = 2,
        dict_obs: bool = False,
        pixels: bool = False,
        channels_last: bool = False,
        nan_obs_at_step: int | None = None,
        raise_at_step: int | None = None,
        success_radius: float = 0.1,
        terminate_at_step: int | None = None,
        nan_final_obs: bool = False,
        record: bool = False,
        pid_file: str | None = None,
        reward_terms: bool = False,
        fixed_target: list | None = None,
    ):
        if record:
            CONSTRUCTED.append(
                {
                    "dim": dim,
                    "nan_obs_at_step": nan_obs_at_step,
                    "raise_at_step": raise_at_step,
                    "success_radius": success_radius,
                    "terminate_at_step": terminate_at_step,
                    "nan_final_obs": nan_final_obs,
                }
            )
        if pid_file is not None:
            with open(pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")
        self.reward_terms = bool(reward_terms)
        self.fixed_target = None if fixed_target is None else np.asarray(fixed_target, dtype=np.float64)
        self.dim, self.dict_obs, self.success_radius = int(dim), bool(dict_obs), float(success_radius)
        self.pixels, self.channels_last = bool(pixels), bool(channels_last)
        self.nan_obs_at_step, self.raise_at_step = nan_obs_at_step, raise_at_step
        self.terminate_at_step, self.nan_final_obs = terminate_at_step, bool(nan_final_obs)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.dim,), np.float32)
        box = gym.spaces.Box(-np.inf, np.inf, (self.dim,), np.float32)
        self.observation_space = (
            gym.spaces.Dict({"position": box, "offset": box})
            if self.dict_obs
            else gym.spaces.Box(-np.inf, np.inf, (2 * self.dim,), np.float32)
        )
        if self.pixels:
            image = gym.spaces.Box(0, 255, (PIXELS, PIXELS, 3) if self.channels_last else (3, PIXELS, PIXELS), np.uint8)
            self.observation_space = gym.spaces.Dict({"position": box, "pixels": image})
        self.steps_taken = 0  # over the env's life, for nan_obs_at_step / raise_at_step

    def _obs(self, nan: bool = False):
        position = self.position.astype(np.float32)
        offset = (self.target - self.position).astype(np.float32)
        if nan:
            position, offset = np.full_like(position, np.nan), np.full_like(offset, np.nan)
        if self.pixels:
            image = np.zeros((3, PIXELS, PIXELS), np.uint8)
            for channel, (x, y) in ((0, self.position[:2]), (1, self.target[:2])):
                col, row = (int(np.clip((v + 1) / 2 * PIXELS, 0, PIXELS - 1)) for v in (x, y))
                image[channel, max(row - 2, 0) : row + 3, max(col - 2, 0) : col + 3] = 255
            return {"position": position, "pixels": image.transpose(1, 2, 0) if self.channels_last else image}
        return {"position": position, "offset": offset} if self.dict_obs else np.concatenate([position, offset])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.episode_steps = np.zeros(self.dim), 0
        self.target = self.np_random.uniform(-0.5, 0.5, self.dim)
        if self.fixed_target is not None:
            self.target = self.fixed_target.copy()
        return self._obs(), {}

    def step(self, action):
        self.steps_taken += 1
        self.episode_steps += 1
        if self.raise_at_step is not None and self.steps_taken == self.raise_at_step:
            raise RuntimeError(f"PointReach: raise_at_step={self.raise_at_step} reached")
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        self.position = np.clip(self.position + 0.1 * action, -1.0, 1.0)
        distance = float(np.linalg.norm(self.target - self.position))
        success = distance < self.success_radius
        terminated = success or (self.terminate_at_step is not None and self.episode_steps >= self.terminate_at_step)
        nan = (self.nan_obs_at_step is not None and self.steps_taken == self.nan_obs_at_step) or (
            self.nan_final_obs and terminated
        )
        info = {"success": success}
        if self.reward_terms:
            info["rewards"] = {"time": float(self.episode_steps)}
        return self._obs(nan), -distance, terminated, False, info


class Echo(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        success = bool(action[1] > 0)
        return np.zeros(1, np.float32), float(action[0]), True, False, {"success": success}


class Cue(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 3):
        self.delay, self.cue, self.t = delay, 1.0, 0
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cue, self.t = float(self.np_random.choice([-1.0, 1.0])), 0
        return np.array([self.cue, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([0.0, self.t / self.delay], np.float32)
        if self.t <= self.delay:
            return obs, 0.0, False, False, {"success": False}
        reward = float(np.clip(action[0], -1.0, 1.0)) * self.cue
        return obs, reward, True, False, {"success": reward > 0}


for _id, _kwargs in zip(ENV_IDS, ({}, {"dict_obs": True}, {"pixels": True})):
    if _id not in gym.registry:  # importing twice (or reloading) must not re-register
        gym.register(_id, entry_point=PointReach, max_episode_steps=50, kwargs=_kwargs)
if ECHO_ID not in gym.registry:
    gym.register(ECHO_ID, entry_point=Echo, max_episode_steps=1)
if CUE_ID not in gym.registry:
    gym.register(CUE_ID, entry_point=Cue, max_episode_steps=50)


def spaces(obs_dim: int, act_dim: int) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """Observation and action Boxes of these sizes, for building a trainer's Agent directly."""
    return gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32), gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)


def random_actions(shape, seed: int) -> torch.Tensor:
    """Uniform actions in [-1, 1] of ``shape`` from their own seeded generator."""
    return 2 * torch.rand(shape, generator=torch.Generator().manual_seed(seed)) - 1


TASK_NAMES = ("east", "north", "west", "south")
TASK_TARGETS = np.array([(0.5, 0.0), (0.0, 0.5), (-0.5, 0.0), (0.0, -0.5)], dtype=np.float32)


class MultiTaskReachVec(gym.vector.VectorEnv):
    """A numpy vector env that a multi-task suite would register with a ``vector_entry_point`` only: sub-env i runs
    task i % 4 (reach one of four targets from the origin), seen as ``[position (2), one-hot task (4)]``; reward
    ``-distance``, success and termination within 0.1 of the target, truncation after ``max_steps``. It says which
    task each sub-env runs (``info["task_id"]``, ``metadata["task_names"]``) and resets finished sub-envs in the
    ``autoreset_mode`` it is given (SAME_STEP: ``info["final_obs"]`` / ``info["final_info"]`` as SyncVectorEnv)."""

    def __init__(self, num_envs: int = 1, max_steps: int = 20, autoreset_mode=AutoresetMode.SAME_STEP):
        self.num_envs, self.max_steps = num_envs, max_steps
        self.metadata = {"autoreset_mode": AutoresetMode(autoreset_mode), "task_names": TASK_NAMES}
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.task = np.arange(num_envs) % len(TASK_NAMES)
        self.position = np.zeros((num_envs, 2), np.float32)
        self.steps = np.zeros(num_envs, np.int64)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.position, np.eye(len(TASK_NAMES), dtype=np.float32)[self.task]], axis=1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        self.position[mask], self.steps[mask] = 0.0, 0
        ids = self.task.copy()
        return self._obs(), {"task_id": ids, "_task_id": np.ones(self.num_envs, bool)}

    def step(self, actions):
        self.position += 0.1 * np.clip(np.asarray(actions, np.float32), -1.0, 1.0)
        self.steps += 1
        distance = np.linalg.norm(self.position - TASK_TARGETS[self.task], axis=1)
        success = distance < 0.1
        terminated, truncated = success, (self.steps >= self.max_steps) & ~success
        done = terminated | truncated
        info = {"success": success, "_success": np.ones(self.num_envs, bool), "task_id": self.task.copy(),
                "_task_id": np.ones(self.num_envs, bool)}  # fmt: skip
        if done.any():
            final_obs = np.empty(self.num_envs, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = self._obs()[i]
            info["final_info"] = {"success": success, "_success": done, "task_id": self.task.copy(), "_task_id": done}
            info["final_obs"], info["_final_obs"] = final_obs, done
            self.position[done], self.steps[done] = 0.0, 0
        return self._obs(), -distance.astype(np.float32), terminated, truncated, info


MULTI_TASK_ID = "MultiTaskReachVec-v0"
NEXT_STEP_ID = "MultiTaskReachVecNextStep-v0"
if MULTI_TASK_ID not in gym.registry:  # a vector entry point only: gym.make cannot build it, gym.make_vec can
    gym.register(MULTI_TASK_ID, vector_entry_point=MultiTaskReachVec)
if NEXT_STEP_ID not in gym.registry:  # one whose creator cannot be asked for SAME_STEP
    gym.register(
        NEXT_STEP_ID, vector_entry_point=lambda num_envs=1: MultiTaskReachVec(num_envs, 20, AutoresetMode.NEXT_STEP)
    )


SUITE_TASKS = ("always", "never")
"""The tasks of :func:`multi_task_suite`: PointReach towards (0.5, 0.5) within 20 steps, where ``always`` counts any
step as a success (radius 10: its episodes succeed at their first step) and ``never`` none (radius 0)."""
SUITE_ID = "MultiTaskSuite-v0"
SUITE_NAMES_BY = ("task_name", "task", "spec", "info")


class TaskInfo(gym.Wrapper):
    """A sub-env that reports its task the way PushCubeLangRL does: ``info["task_id"]`` at every reset and step,
    ``metadata["task_names"]`` naming the tasks."""

    def __init__(self, env: gym.Env, task_id: int):
        super().__init__(env)
        self.task_id = task_id
        self.metadata = {**env.metadata, "task_names": SUITE_TASKS}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "task_id": self.task_id}

    def step(self, action):
        *out, info = self.env.step(action)
        return *out, {**info, "task_id": self.task_id}


def _suite_sub_env(task_id: int, names_by: str) -> gym.Env:
    name = SUITE_TASKS[task_id]
    if names_by == "spec":  # an id of its own per task: the sub-envs' specs tell them apart
        return gym.make(f"SuiteTask{name.capitalize()}-v0")
    env = gym.make("PointReach-v0", max_episode_steps=20, **SUITE_KWARGS[name])  # the same spec for every task
    if names_by == "info":
        return TaskInfo(env, task_id)
    setattr(env.unwrapped, names_by, name)  # Meta-World's sub-envs have a task_name, LeRobot's LIBERO ones a task
    return env


def multi_task_suite(num_envs: int = 2, names_by: str = "task_name", vector_strategy: str = "sync",
                     autoreset_mode=AutoresetMode.SAME_STEP) -> gym.vector.VectorEnv:  # fmt: skip
    """A multi-task suite's vector env built as Meta-World's MT ids and LeRobot's LIBERO envs build theirs: a
    Gymnasium ``SyncVectorEnv`` (``vector_strategy="async"``: ``AsyncVectorEnv``) whose sub-env i runs task
    ``SUITE_TASKS[i % 2]`` and says so only by ``names_by``: a ``task_name`` attribute (Meta-World's), a ``task``
    attribute (LeRobot's LIBERO envs'), its spec (an id per task), or ``info["task_id"]`` with
    ``metadata["task_names"]`` (``info``). The observation does not show the task."""
    if names_by not in SUITE_NAMES_BY:
        raise ValueError(f"names_by must be one of {SUITE_NAMES_BY}, got {names_by!r}")
    vector = gym.vector.AsyncVectorEnv if vector_strategy == "async" else gym.vector.SyncVectorEnv
    fns = [lambda i=i: _suite_sub_env(i % len(SUITE_TASKS), names_by) for i in range(num_envs)]
    return vector(fns, autoreset_mode=autoreset_mode)


SUITE_KWARGS = {name: {"fixed_target": [0.5, 0.5], "success_radius": r} for name, r in zip(SUITE_TASKS, (10.0, 0.0))}
for _name in SUITE_TASKS:
    if f"SuiteTask{_name.capitalize()}-v0" not in gym.registry:
        gym.register(f"SuiteTask{_name.capitalize()}-v0", entry_point=PointReach, max_episode_steps=20,
                     kwargs=SUITE_KWARGS[_name])  # fmt: skip
if SUITE_ID not in gym.registry:  # a vector entry point only, as Meta-World registers its MT ids
    gym.register(SUITE_ID, vector_entry_point=multi_task_suite)
