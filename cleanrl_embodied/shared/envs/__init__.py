"""Environments behind one torch vector-env contract: ``make_env``, ``check_env_id``, ``BUILTIN_ENV_IDS``.

``make_env(env_id, num_envs, device, seed, **env_kwargs)`` returns a ``gymnasium.vector.VectorEnv`` whose
data are torch tensors on ``device`` (docs/ENV_CONTRACT.md):

- ``"PushCubeRL"``: the built-in batched torch task, registered with Gymnasium on import, so
  ``gymnasium.make_vec("PushCubeRL", num_envs=N, device=...)`` works too.
- ManiSkill3 ids (extra ``maniskill``, e.g. ``PushCube-v1``): see :mod:`.maniskill`.
- any other registered Gymnasium id with a Box action space (MuJoCo ids with the extra ``mujoco``): numpy
  sub-envs (SAME_STEP autoreset, ``vectorization="sync"`` or ``"async"``, ``render_mode="rgb_array"`` where
  the env has it) -> :func:`numpy_vector_to_torch` (:class:`GymnasiumToTorch`: actions rescaled from [-1, 1]
  and clipped, torch outputs, episode statistics; :class:`FlattenDictObservation` for Dict observations).
- ``"module:EnvId"`` (Gymnasium's own form, as in ``gymnasium.make``): ``module`` is imported first, so that a
  package that registers its ids on import (gymnasium-robotics, a lab's task package, a ``.py`` file in the
  current directory) works from the command line; then ``EnvId`` is treated as above (:func:`resolve_env_id`).
- ``vectorization="envpool"`` (extra ``envpool``): the ids EnvPool provides run in its C++ thread pool, converted
  to the same contract (SAME_STEP, Gymnasium's time-limit semantics): :mod:`.envpool_backend`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import sys

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode, VectorEnv

from cleanrl_embodied.shared.envs.maniskill import is_maniskill_id
from cleanrl_embodied.shared.envs.wrappers import (
    EpisodeStatistics,
    FlattenDictObservation,
    IntervalRandomization,
    SafeRender,
    flattens,
    numpy_vector_to_torch,
)

__all__ = ["BUILTIN_ENV_IDS", "check_env_id", "env_state_dict", "load_env_state_dict", "make_env", "resolve_env_id"]

BUILTIN_ENV_IDS = ("PushCubeRL",)


def _make_push_cube_vec(
    num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None, **kwargs
) -> VectorEnv:
    """Gymnasium ``vector_entry_point`` of PushCubeRL: the raw torch task plus episode statistics."""
    from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv  # lazy: torch task, heavier import

    return EpisodeStatistics(PushCubeRLVecEnv(num_envs=num_envs, device=device, seed=seed, **kwargs))


if "PushCubeRL" not in gym.registry:  # importing this module twice (or reloading it) must not re-register
    gym.register(id="PushCubeRL", vector_entry_point=_make_push_cube_vec)


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
    name = resolve_env_id(env_id)
    if name in BUILTIN_ENV_IDS or name in gym.registry or is_maniskill_id(name):
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
        "MuJoCo ids need `uv sync --extra mujoco`, ManiSkill ids need `uv sync --extra maniskill`"
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
    """Build ``num_envs`` copies of ``env_id`` behind the torch env contract, on ``device``.

    ``seed`` seeds the first ``reset()`` called with ``seed=None``. ``env_kwargs`` go to the env constructor;
    ``vectorization="async"`` steps Gymnasium and CPU ManiSkill sub-envs in worker processes
    (``AsyncVectorEnv``; default ``"sync"``; natively batched envs ignore it); ``vectorization="envpool"`` runs
    a Gymnasium id through EnvPool's C++ thread pool instead (extra ``envpool``; ids EnvPool provides, e.g. the
    MuJoCo ones; :mod:`.envpool_backend`); for Gymnasium ids
    ``render_mode`` defaults to ``"rgb_array"`` where the env offers it (MuJoCo
    builds its renderer only at the first ``render()``, so this costs nothing until a video is asked for);
    ``randomize_interval=K`` resamples the env's randomized parameters every K steps (IntervalRandomization).
    ``info_keys``: info entries of Gymnasium sub-envs to pass on besides ``rewards`` and ``metrics`` (a list of
    names, or ``"all"``; see GymnasiumToTorch; EnvPool ids alike; PushCubeRL and ManiSkill pass all theirs).
    ``env_id`` may be ``"module:EnvId"``: the module is imported first (its import registers ``EnvId``).
    ``flatten_obs``: Dict observations become one float32 vector (True), stay TensorDicts with their dtypes
    (False; also ``info["final_obs"]``), or (None, the default) are flattened unless they hold an image
    (a uint8 ``[3, H, W]`` leaf): state stays a vector, pixels stay pixels.
    Bad input (unknown id, bad ``num_envs``, non-Box action space, missing extra) raises a one-line
    ValueError.
    """
    env_id = check_env_id(env_id)
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ValueError(f"--num-envs must be a positive integer, got {num_envs!r}")
    num_envs = int(num_envs)
    if vectorization not in ("sync", "async", "envpool"):
        raise ValueError(f"--env-vectorization must be 'sync', 'async' or 'envpool', got {vectorization!r}")

    randomize_interval = env_kwargs.pop("randomize_interval", None)
    info_keys = env_kwargs.pop("info_keys", ())  # Gymnasium and EnvPool ids; the other backends pass all entries
    if vectorization == "envpool" and env_id not in BUILTIN_ENV_IDS and not is_maniskill_id(env_id):
        from cleanrl_embodied.shared.envs.envpool_backend import make_envpool_env  # lazy: optional extra

        env = make_envpool_env(env_id, num_envs, device, seed, info_keys=info_keys, **env_kwargs)
    elif env_id == "PushCubeRL":
        env = gym.make_vec("PushCubeRL", num_envs=num_envs, device=device, seed=seed, **env_kwargs)
        if flattens(env.single_observation_space, flatten_obs):
            env = FlattenDictObservation(env)
    elif is_maniskill_id(env_id):
        from cleanrl_embodied.shared.envs.maniskill import make_maniskill_env

        env = make_maniskill_env(
            env_id, num_envs, device, seed, vectorization=vectorization, flatten_obs=flatten_obs, **env_kwargs
        )
    else:
        env = _make_gymnasium_env(env_id, num_envs, device, seed, vectorization, flatten_obs, info_keys, **env_kwargs)
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
    of every wrapper that has one (episode statistics, interval randomization), keyed by class name, with
    tensors on the CPU. None when the raw env cannot save its state (numpy Gymnasium sub-envs, ManiSkill)."""
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


def _offers_rgb_array(env_id: str) -> bool:
    """Whether the env class behind a Gymnasium id lists "rgb_array" among its render modes."""
    try:
        entry_point = gym.spec(env_id).entry_point
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
        return "rgb_array" in (getattr(creator, "metadata", None) or {}).get("render_modes", ())
    except Exception:  # a missing dependency is reported by make_vec itself, with its own message
        return False


def _make_gymnasium_env(
    env_id: str,
    num_envs: int,
    device,
    seed: int | None,
    vectorization: str,
    flatten_obs: bool | None,
    info_keys=(),
    **env_kwargs,
) -> VectorEnv:
    """A registered numpy Gymnasium id -> the torch env contract."""
    if "render_mode" not in env_kwargs and _offers_rgb_array(env_id):
        env_kwargs["render_mode"] = "rgb_array"  # for --capture-video; see GymnasiumToTorch.render
    try:
        env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=[SafeRender],  # render() never raises, in async workers too
            **env_kwargs,
        )
    except gym.error.DependencyNotInstalled as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(
            f"--env-id {env_id!r} needs a package that is not installed ({reason}); "
            "MuJoCo ids need `uv sync --extra mujoco`, ManiSkill ids need `uv sync --extra maniskill`"
        ) from None
    if env_kwargs.get("max_episode_steps") and env.spec is not None:  # make_vec keeps the registered limit
        env.spec = dataclasses.replace(env.spec, max_episode_steps=int(env_kwargs["max_episode_steps"]))
    return numpy_vector_to_torch(env, device=device, seed=seed, flatten_obs=flatten_obs, info_keys=info_keys)
