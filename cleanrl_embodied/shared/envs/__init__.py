"""Environments behind one torch vector-env contract: ``make_env``, ``check_env_id``, ``BUILTIN_ENVS``.

``make_env(env_id, num_envs, device, seed, **env_kwargs)`` returns a ``gymnasium.vector.VectorEnv`` whose data
are torch tensors on ``device`` (docs/env-contract.md). It is the one place that decides which backend serves an
id (its docstring has the table); each backend lives in its own file:

- built-in batched torch tasks (``BUILTIN_ENVS``: PushCubeRL), registered with Gymnasium on import, so
  ``gymnasium.make_vec("PushCubeRL", num_envs=N, device=...)`` works too: :mod:`.push_cube`;
- ManiSkill3 ids (extra ``maniskill``, e.g. ``PushCube-v1``): :mod:`.maniskill_backend`;
- Isaac Lab-API tasks: mjlab's (extra ``mjlab``), ``mjlab:<task>`` (e.g. ``mjlab:Mjlab-Velocity-Flat-Unitree-Go1``),
  or ``module:<task>`` for a package that registers tasks with mjlab's registry: :mod:`.isaaclab_backend`;
- Gymnasium ids with ``vectorization="envpool"`` (extra ``envpool``): :mod:`.envpool_backend`;
- every other registered Gymnasium id with a Box action space (MuJoCo ids with the extra ``mujoco``): numpy
  sub-envs -> :func:`~.gymnasium_backend.make_gymnasium_env` in :mod:`.gymnasium_backend`;
- ``"module:EnvId"`` (Gymnasium's own form, as in ``gymnasium.make``): ``module`` is imported first, so that a
  package that registers its ids on import (gymnasium-robotics, a lab's task package, a ``.py`` file in the
  current directory) works from the command line; then ``EnvId`` is served as above (:func:`resolve_env_id`).

``RANDOMIZATION_KWARGS`` names the env kwargs that randomize or disturb an env; the eval envs do not inherit them
from ``--env-kwargs`` (``shared/builders.py``: ``EnvOptions.kwargs``). ``OBSERVATION_KWARGS`` names make_env's own
options that change what a policy sees (``flatten_obs``, ``obs_indices``, ``obs_keys``, ``frame_stack``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import VectorEnv

from cleanrl_embodied.shared.envs import (  # none imports its package yet
    envpool_backend,
    isaaclab_backend,
    maniskill_backend,
)
from cleanrl_embodied.shared.envs.gymnasium_backend import make_gymnasium_env
from cleanrl_embodied.shared.envs.wrappers import (
    EpisodeStatistics,
    FlattenDictObservation,
    FrameStack,
    IntervalRandomization,
    SelectObservation,
    flattens,
    frame_stack_size,
    observation_indices,
    observation_keys,
)

__all__ = [
    "BUILTIN_ENVS",
    "BUILTIN_ENV_IDS",
    "OBSERVATION_KWARGS",
    "RANDOMIZATION_KWARGS",
    "check_env_id",
    "env_state_dict",
    "load_env_state_dict",
    "make_env",
    "resolve_env_id",
]

# The built-in tasks: id -> the ``module:callable`` that builds the batched torch VecEnv (called with num_envs,
# device, seed and the env kwargs). Adding a built-in id is one line here: it is registered with Gymnasium below
# and served by make_env's first branch.
BUILTIN_ENVS = {
    "PushCubeRL": "cleanrl_embodied.shared.envs.push_cube:PushCubeRLVecEnv",
    "PushCubeLangRL": "cleanrl_embodied.shared.envs.push_cube:PushCubeLangRLVecEnv",
}
BUILTIN_ENV_IDS = tuple(BUILTIN_ENVS)

# Env kwargs that randomize or disturb an env (domain randomization ranges, noise, events): the eval envs do not
# inherit them from --env-kwargs, so evaluation measures the nominal task unless --eval-env-kwargs names them.
# PushCubeRL's (docs/env-contract.md), make_env's own ``randomize_interval`` and the mjlab backend's
# ``init_at_random_ep_len`` (first episodes cut short at random: an evaluation would average partial episodes);
# other envs' kwargs are inherited.
RANDOMIZATION_KWARGS = (
    "randomize",
    "randomize_every",
    "randomize_at",
    "randomize_interval",
    "cube_half_size_range",
    "push_friction_range",
    "obs_noise_std",
    "action_noise_std",
    "event_cube_shift_std",
    "init_at_random_ep_len",
)

# make_env's own options that change what a policy sees (for every env id): a checkpoint resumes or evaluates only
# with the same values. Not randomization: the eval envs inherit them (see RANDOMIZATION_KWARGS).
OBSERVATION_KWARGS = ("flatten_obs", "obs_indices", "obs_keys", "frame_stack")


def _builtin_vector_entry_point(entry_point: str):
    """The Gymnasium ``vector_entry_point`` of a built-in id: the task (imported at the first call) plus
    episode statistics."""

    def make_vec(num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None, **kwargs):
        return EpisodeStatistics(load_env_creator(entry_point)(num_envs=num_envs, device=device, seed=seed, **kwargs))

    return make_vec


for _id, _entry_point in BUILTIN_ENVS.items():
    if _id not in gym.registry:  # importing this module twice (or reloading it) must not re-register
        gym.register(id=_id, vector_entry_point=_builtin_vector_entry_point(_entry_point))


def _import_env_module(env_id: str, module: str) -> None:
    """Import the ``module`` of a ``module:EnvId`` id (its import registers the id); a module (``.py`` file or
    package) in the current directory is found too. A failure is one ``ValueError`` line; a missing package is
    named with the command that installs it."""
    for attempt in (1, 2):
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as e:
            missing = e.name or module
            not_found = missing.split(".")[0] == module.split(".")[0]
            if attempt == 1 and not_found and os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())  # `python script.py` puts the script's folder on sys.path, not the cwd
                continue
            top = missing.split(".")[0]
            if importlib.util.find_spec(top) is not None:  # installed, yet a submodule is missing: no install hint
                raise ValueError(
                    f"--env-id {env_id!r}: importing module {module!r} failed (No module named {missing!r})"
                ) from None
            package = top.replace("_", "-")  # the usual distribution name of an importable name
            what = (
                f"module {module!r} can't be imported"
                if not_found
                else (f"module {module!r} needs {missing!r}, which can't be imported")
            )
            raise ValueError(
                f"--env-id {env_id!r}: {what}; install the package that provides it, e.g. "
                f"`uv pip install {package}` (without uv: `pip install {package}`)"
            ) from None
        except Exception as e:  # the module itself is broken: say how, in one line
            reason = (str(e).splitlines() or [""])[0]
            raise ValueError(
                f"--env-id {env_id!r}: importing module {module!r} failed ({type(e).__name__}: {reason})"
            ) from None


def resolve_env_id(env_id: str) -> str:
    """The registry id behind ``env_id``: for ``"module:EnvId"`` the module is imported and ``"EnvId"`` returned;
    any other id is returned unchanged. Importing the module is the only side effect (nothing is checked here)."""
    if ":" not in env_id:
        return env_id
    module, _, name = env_id.partition(":")
    if not module or not name or ":" in name:
        raise ValueError(
            f"--env-id {env_id!r}: use an id (e.g. Pendulum-v1) or module:EnvId "
            "(e.g. gymnasium_robotics:PointMaze_UMazeDense-v3), with one ':'"
        )
    _import_env_module(env_id, module)
    return name


def check_env_id(env_id: str) -> str:
    """Return the registry id of ``env_id`` (see :func:`resolve_env_id`), or raise a one-line ``ValueError`` if it is
    neither built in, nor a registered Gymnasium id, nor a ManiSkill id. ManiSkill is looked up (imported, seconds;
    only when installed) only for an id Gymnasium doesn't know, even after importing the ``module:`` part."""
    if isaaclab_backend.mjlab_task_name(env_id) is not None:  # mjlab:<task>: mjlab's registry, not Gymnasium's
        return isaaclab_backend.check_isaaclab_id(env_id)
    name = resolve_env_id(env_id)
    if name in BUILTIN_ENV_IDS or name in gym.registry or maniskill_backend.is_maniskill_id(name):
        return name
    if isaaclab_backend.is_isaaclab_task(name):  # module:<task>, the module registered it with mjlab
        return name
    close = difflib.get_close_matches(name, [*BUILTIN_ENV_IDS, *gym.registry], n=3, cutoff=0.75)
    if name != env_id:
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(
            f"--env-id {env_id!r} is unknown: no Gymnasium id {name!r} is registered after importing "
            f"{env_id.partition(':')[0]!r}{hint}"
        )
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise ValueError(
        f"--env-id {env_id!r} is unknown{hint}: use a built-in id ({', '.join(BUILTIN_ENV_IDS)}), any registered "
        "Gymnasium id (e.g. Pendulum-v1) or module:EnvId to import the package that registers it first; "
        "MuJoCo ids need `uv sync --extra mujoco`, ManiSkill ids need `uv sync --extra maniskill`, mjlab's tasks "
        "are mjlab:<task> (`uv sync --extra mjlab`)"
    )


def make_env(
    env_id: str,
    num_envs: int = 1,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    vectorization: str = "sync",
    flatten_obs: bool | None = None,
    **env_kwargs,
) -> VectorEnv:
    """Build ``num_envs`` copies of ``env_id`` behind the torch env contract, on ``device``. The one place that
    decides which backend serves an id, in this order:

    =======================================  ====================================================  ====================
    ``env_id`` (after ``module:`` import)    backend                                               module
    =======================================  ====================================================  ====================
    a built-in id (``BUILTIN_ENVS``)         the batched torch task, through ``gym.make_vec``      push_cube/
    a ManiSkill id (e.g. PushCube-v1)        ManiSkill's GPU or CPU simulation                     maniskill_backend.py
    ``mjlab:<task>`` (Isaac Lab API)         mjlab's ManagerBasedRlEnv on MuJoCo Warp (CPU/CUDA)  isaaclab_backend.py
    Gymnasium id, ``vectorization=envpool``  EnvPool's C++ thread pool                             envpool_backend.py
    any other registered Gymnasium id        numpy sub-envs (sync / async) -> GymnasiumToTorch     gymnasium_backend.py
    =======================================  ====================================================  ====================

    ``env_id`` may be ``"module:EnvId"``: the module is imported first (its import registers ``EnvId``); an id none
    of these knows is one ValueError line (:func:`check_env_id`).

    ``seed`` seeds the first ``reset()`` called with ``seed=None``. ``env_kwargs`` go to the env constructor;
    ``vectorization="async"`` steps Gymnasium and CPU ManiSkill sub-envs in worker processes
    (``AsyncVectorEnv``; default ``"sync"``; natively batched envs ignore it); ``vectorization="envpool"`` runs
    a Gymnasium id through EnvPool instead (extra ``envpool``; the ids EnvPool provides, e.g. the MuJoCo ones).
    For Gymnasium ids ``render_mode`` defaults to ``"rgb_array"`` where the env offers it (MuJoCo builds its
    renderer only at the first ``render()``, so this costs nothing until a video is asked for).
    Two kwargs are make_env's own, for every backend: ``randomize_interval=K`` resamples the env's randomized
    parameters every K steps (IntervalRandomization); ``info_keys``: info entries of Gymnasium sub-envs to pass
    on besides ``rewards`` and ``metrics`` (a list of names, or ``"all"``; see GymnasiumToTorch; EnvPool ids
    alike; the built-in tasks and ManiSkill pass all theirs).
    Two more keep only part of the observation, for partially observed tasks (:class:`~.wrappers.SelectObservation`,
    also on ``info["final_obs"]``): ``obs_keys``, entries of a Dict observation ('/'-joined key paths such as
    ``"robot"`` or ``"object/cube_pos"``), applied before the flattening below, and ``obs_indices``, positions in a
    flat Box observation (after any flattening), in the order given: e.g. Pendulum-v1 with ``obs_indices=[0, 1]``
    sees cos and sin of its angle and not its velocity.
    ``frame_stack=K`` (an integer >= 1; 1, the default, stacks nothing) gives the policy the latest K observations
    side by side, oldest first (:class:`~.wrappers.FrameStack`: a flat ``[N, D]`` becomes ``[N, K * D]``; the
    stack of the finished episode in ``info["final_obs"]``, a fresh one of the new episode's first observation in
    ``obs``); it is applied last, to exactly what the policy would otherwise see.
    ``flatten_obs``: Dict observations become one float32 vector (True), stay TensorDicts with their dtypes
    (False; also ``info["final_obs"]``), or (None, the default) are flattened unless they hold an image
    (a uint8 ``[3, H, W]`` leaf): state stays a vector, pixels stay pixels.
    Bad input (unknown id, bad ``num_envs``, non-Box action space, missing extra) raises a one-line
    ValueError.
    """
    lab_task = isaaclab_backend.mjlab_task_name(env_id) is not None
    env_id = check_env_id(env_id)  # "module:EnvId" -> "EnvId", the module imported; "mjlab:<task>" -> "<task>"
    lab_task = lab_task or (env_id not in BUILTIN_ENVS and env_id not in gym.registry
                            and isaaclab_backend.is_isaaclab_task(env_id))  # fmt: skip
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"--num-envs must be a positive integer, got {num_envs!r}")
    num_envs = int(num_envs)
    if vectorization not in ("sync", "async", "envpool"):
        raise ValueError(f"--env-vectorization must be 'sync', 'async' or 'envpool', got {vectorization!r}")
    if lab_task and vectorization != "sync":
        raise ValueError(
            f"--env-vectorization {vectorization}: an mjlab task steps all its envs in one MuJoCo Warp simulation; "
            "leave it at sync"
        )
    randomize_interval = env_kwargs.pop("randomize_interval", None)
    info_keys = env_kwargs.pop("info_keys", ())  # Gymnasium and EnvPool ids; the other backends pass all entries
    obs_indices, obs_keys = env_kwargs.pop("obs_indices", None), env_kwargs.pop("obs_keys", None)
    frame_stack = frame_stack_size(env_kwargs.pop("frame_stack", 1))
    if obs_indices is not None:  # (their types before an env is built; their values against its space below)
        obs_indices = observation_indices(obs_indices)
    if obs_keys is not None:
        obs_keys = observation_keys(obs_keys)
    flatten = False if obs_keys is not None else flatten_obs  # obs_keys: the backend keeps the Dict, flattened below

    if lab_task:
        env = isaaclab_backend.make_isaaclab_env(env_id, num_envs, device, seed, flatten_obs=flatten, **env_kwargs)
    elif env_id in BUILTIN_ENVS:
        env = gym.make_vec(env_id, num_envs=num_envs, device=device, seed=seed, **env_kwargs)
        if flattens(env.single_observation_space, flatten):
            env = FlattenDictObservation(env)
    elif maniskill_backend.is_maniskill_id(env_id):
        env = maniskill_backend.make_maniskill_env(
            env_id, num_envs, device, seed, vectorization=vectorization, flatten_obs=flatten, **env_kwargs
        )
    elif vectorization == "envpool":
        env = envpool_backend.make_envpool_env(env_id, num_envs, device, seed, info_keys=info_keys, **env_kwargs)
    else:
        env = make_gymnasium_env(env_id, num_envs, device, seed, vectorization, flatten, info_keys, **env_kwargs)
    try:
        if obs_keys is not None:
            env = SelectObservation(env, keys=obs_keys)
            if flattens(env.single_observation_space, flatten_obs):
                env = FlattenDictObservation(env)
        if obs_indices is not None:
            env = SelectObservation(env, indices=obs_indices)
        if frame_stack > 1:  # the outermost observation wrapper: it stacks what the policy would see
            env = FrameStack(env, frame_stack)
    except ValueError:
        env.close()
        raise
    if randomize_interval is not None:
        env = IntervalRandomization(env, randomize_interval)
    return env


def _layers(env: VectorEnv) -> list:
    """The wrappers of `env`, outermost first, down to and including `env.unwrapped`."""
    layers = [env]
    while layers[-1] is not env.unwrapped and hasattr(layers[-1], "env"):
        layers.append(layers[-1].env)
    return layers


def env_state_dict(env: VectorEnv) -> dict | None:
    """Everything needed to continue `env` exactly (for checkpoints): the raw env's ``state_dict()`` and that
    of every wrapper that has one (episode statistics, interval randomization, the frame stack), keyed by class
    name, with tensors on the CPU. None when the raw env cannot save its state (numpy Gymnasium sub-envs, ManiSkill)."""
    layers = _layers(env)
    if not hasattr(layers[-1], "state_dict"):
        return None
    to_cpu = lambda v: (
        {k: to_cpu(x) for k, x in v.items()} if isinstance(v, dict) else (v.cpu() if isinstance(v, torch.Tensor) else v)
    )
    return {type(layer).__name__: to_cpu(layer.state_dict()) for layer in layers if hasattr(layer, "state_dict")}


def load_env_state_dict(env: VectorEnv, state: dict) -> None:
    """Restore what :func:`env_state_dict` returned into an env built by the same ``make_env`` call. A wrapper the
    saved env did not have (e.g. ``randomize_interval`` added on a resume) starts as built; the saved state of a
    wrapper this env lacks is ignored. The raw env's own state must be there."""
    for layer in _layers(env):
        if hasattr(layer, "load_state_dict"):
            if type(layer).__name__ not in state:
                if layer is not env.unwrapped:
                    continue
                raise KeyError(f"env state has no entry for {type(layer).__name__} (it has {sorted(state)})")
            layer.load_state_dict(state[type(layer).__name__])
