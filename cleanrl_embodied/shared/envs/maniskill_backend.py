"""ManiSkill3 ids (extra ``maniskill``: ``PushCube-v1``, ``PickCube-v1``, ...) behind the torch env contract.

``make_env`` sends ManiSkill ids here (:func:`make_maniskill_env`). Defaults: ``obs_mode="state"``,
``reward_mode="normalized_dense"``, ``render_mode="rgb_array"`` where a rendering device exists; every other
env kwarg goes to ManiSkill's ``gym.make`` (``control_mode``, ``max_episode_steps``, ``sim_backend`` ...).
Two adapter-level kwargs: ``ignore_terminations`` (ManiSkill's: episodes end only at the time limit) and, for
the CPU backend, ``vectorization`` (``"sync"``/``"async"``).

- GPU simulation (``sim_backend="physx_cuda"``, the default when ``device`` is CUDA): ManiSkill's own
  ``ManiSkillVectorEnv`` (SAME_STEP autoreset through partial resets) -> :class:`ManiSkillToTorch`.
- CPU simulation (``physx_cpu``, the default otherwise; ManiSkill allows one env per CPU scene): ``num_envs``
  single envs behind ManiSkill's ``CPUGymWrapper`` in a Gymnasium ``SyncVectorEnv``/``AsyncVectorEnv`` ->
  the same numpy path as every Gymnasium id (:func:`~.gymnasium_backend.numpy_vector_to_torch`).

Without a rendering device (no GPU / Vulkan driver), SAPIEN can't create even the render *materials* that
ManiSkill's scene builders make unconditionally, although nothing is ever drawn with them. Then this module
switches ManiSkill to ``render_backend="none"`` and replaces SAPIEN's material/texture classes with inert
records (see :func:`_render_free_sapien`), so state-only training runs; ``render()`` returns None (one warning).
Nothing here imports ``mani_skill`` before it is needed.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import importlib.util
import io
import os
import sys
import tempfile
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict

from cleanrl_embodied.shared.envs.gymnasium_backend import numpy_vector_to_torch
from cleanrl_embodied.shared.envs.numpy_to_torch import float32_space
from cleanrl_embodied.shared.envs.render import RenderFirstEnv, SafeRender, env_name
from cleanrl_embodied.shared.envs.wrappers import EpisodeStatistics, FlattenDictObservation, flattens

__all__ = ["ManiSkillToTorch", "is_maniskill_id", "make_maniskill_env", "maniskill_vector_to_torch"]

MANISKILL_DEFAULTS = {"obs_mode": "state", "reward_mode": "normalized_dense"}
MANISKILL_RENDER_HINT = "; ManiSkill (SAPIEN) renders only with a Vulkan-capable GPU driver"


# ---- which ids are ManiSkill's -------------------------------------------------------------------------
def _from_maniskill(spec: gym.envs.registration.EnvSpec) -> bool:
    """A Gymnasium spec that ManiSkill registered (its entry points are partials of ``mani_skill`` functions)."""
    for entry_point in (spec.entry_point, spec.vector_entry_point):
        if isinstance(entry_point, str):
            module = entry_point.split(":")[0]
        else:
            module = getattr(getattr(entry_point, "func", entry_point), "__module__", None) or ""
        if module.split(".")[0] == "mani_skill":
            return True
    return False


def is_maniskill_id(env_id: str) -> bool:
    """True for ids registered by ManiSkill. An id Gymnasium knows is decided from its registration, without
    importing anything. Only for an id Gymnasium doesn't know, and only when ``mani_skill`` is installed, is
    ``mani_skill.envs`` imported (seconds) to look; whatever that import prints (SAPIEN's Vulkan/render device
    warnings) is held back and shown only if the id does turn out to be ManiSkill's, so a run that doesn't use
    ManiSkill (a typo, an id of another package) prints nothing about it."""
    spec = gym.registry.get(env_id)
    if spec is None and importlib.util.find_spec("mani_skill") is not None:
        with _HeldOutput() as held:
            _import_maniskill()
        spec = gym.registry.get(env_id)
        if spec is not None and _from_maniskill(spec):
            held.replay()
    return spec is not None and _from_maniskill(spec)


class _HeldOutput:
    """Hold back what this process prints inside a ``with`` block: Python-level writes to ``sys.stdout`` /
    ``sys.stderr`` and, at the file-descriptor level, what C++ libraries (SAPIEN) write to fds 1 and 2;
    ``replay()`` writes it all to stderr afterwards."""

    def __enter__(self) -> _HeldOutput:
        self._file, self._python = tempfile.TemporaryFile(), io.StringIO()
        self._streams, self._saved_fds = (sys.stdout, sys.stderr), []
        for stream, fd in zip(self._streams, (1, 2)):
            try:
                stream.flush()
                saved = os.dup(fd)
            except (OSError, ValueError, AttributeError):  # no such fd (an embedded interpreter): leave it
                continue
            os.dup2(self._file.fileno(), fd)
            self._saved_fds.append((fd, saved))
        sys.stdout = sys.stderr = self._python
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout, sys.stderr = self._streams
        try:  # C stdio buffers: out before the fds go back
            ctypes.CDLL(None).fflush(None)
        except Exception:
            pass
        for fd, saved in self._saved_fds:
            os.dup2(saved, fd)
            os.close(saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace") + self._python.getvalue()
        self._file.close()

    def replay(self) -> None:
        if self.text:
            sys.stderr.write(self.text)
            sys.stderr.flush()


def _import_maniskill() -> None:
    """Import ``mani_skill.envs``, which registers every ManiSkill id with Gymnasium; failures in one line."""
    try:
        importlib.import_module("mani_skill.envs")
    except Exception as e:
        reason = (str(e).splitlines() or [""])[0]
        raise ValueError(f"mani_skill is installed but can't be imported ({type(e).__name__}: {reason})") from None


# ---- running without a rendering device -----------------------------------------------------------------
@functools.cache
def sapien_can_render() -> bool:
    """Whether SAPIEN finds a rendering (Vulkan) device in this process; probed once (warning once if not)."""
    import sapien

    try:
        sapien.render.RenderMaterial()
    except RuntimeError:  # "failed to find a rendering device", vk::...ErrorIncompatibleDriver
        warnings.warn(
            "ManiSkill: SAPIEN finds no rendering (Vulkan) device here; running physics only "
            "(render_backend='none', state observations, no videos)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


class _InertRenderRecord:
    """Stands in for SAPIEN's ``RenderMaterial`` / ``RenderTexture2D`` where no rendering device exists: it
    keeps what it is given and is never drawn (ManiSkill builds no render bodies when its scene can't render)."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)


# Modules that hold their own reference to SAPIEN's material/texture classes (``from ... import RenderMaterial``).
_SAPIEN_RENDER_MODULES = (
    "sapien.render",
    "sapien.pysapien.render",
    "sapien.wrapper.urdf_loader",
    "mani_skill.utils.building._mjcf_loader",
)


def _render_free_sapien() -> None:
    """Make SAPIEN's material/texture constructors inert, for a process that can't render anyway (where they
    would raise "failed to find a rendering device"). Idempotent; called in every (sub)process that builds an env."""
    for name in _SAPIEN_RENDER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in ("RenderMaterial", "RenderTexture2D"):
            if hasattr(module, attr):
                setattr(module, attr, _InertRenderRecord)


def _is_hwc_image(x) -> bool:
    """A batch of camera images as ManiSkill gives them: uint8 [N, H, W, C] (a tensor) or uint8 [H, W, C] (a Box)."""
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.uint8 and x.dim() == 4
    return isinstance(x, gym.spaces.Box) and x.dtype == np.uint8 and len(x.shape) == 3


def _contract_space(space: gym.Space) -> gym.Space:
    """ManiSkill's observation space as this adapter's outputs: uint8 HWC images -> uint8 CHW Boxes, the rest
    float32; ``sensor_param`` (the cameras' constant matrices) dropped."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict(
            [(key, _contract_space(sub)) for key, sub in space.spaces.items() if key != "sensor_param"]
        )
    if isinstance(space, gym.spaces.Box) and _is_hwc_image(space):
        height, width, channels = space.shape
        return gym.spaces.Box(0, 255, (channels, height, width), np.uint8)
    return float32_space(space)


# ---- the GPU path: ManiSkillVectorEnv -> contract ---------------------------------------------------------
class ManiSkillToTorch(RenderFirstEnv):
    """A ManiSkill-style torch vector env seen through the torch env contract.

    The wrapped env follows ``mani_skill.vector.wrappers.gymnasium.ManiSkillVectorEnv`` (auto_reset=True): torch
    obs/reward/terminated/truncated on the sim device; when some envs finish it resets just those
    (``reset(options={"env_idx": ...})``) and returns the new episodes' obs, with ``info`` = the *reset* info plus
    ``final_observation`` (the whole batch before the reset) and ``final_info`` (the whole step info), masked
    by ``_final_observation`` / ``_final_info``. Here, for every step:

    - ``info["final_obs"]`` = ``final_observation`` (dense, ``[N, ...]``) or a copy of obs; ``_final_obs`` =
      terminated | truncated;
    - ``info["success"]`` (bool) and the other ``[N]`` info tensors come from the step's own info (``final_info``
      where it exists), so a finished env reports the success of its final state, not of its new episode;
    - actions in [-1, 1] are clipped and rescaled to the env's bounds (unbounded spaces: passed unchanged) and
      moved to the sim device; outputs are moved to ``device``;
    - ``reset(options={"group_size": G})`` with G > 1 raises (ManiSkill's batched reset draws each env's start
      from one random stream; identical group starts are not available).
    """

    render_hint = MANISKILL_RENDER_HINT

    def __init__(self, env: VectorEnv, device: torch.device | str = "cpu", seed: int | None = None):
        super().__init__(env)
        self.device = torch.device(device)
        self._seed, self._first_reset = seed, True
        space = env.single_action_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"--env-id {env_name(env)!r} has a {type(space).__name__} action space; "
                "make_env supports continuous (Box) action spaces only"
            )
        self._low = torch.as_tensor(space.low, dtype=torch.float32)
        self._high = torch.as_tensor(space.high, dtype=torch.float32)
        self._rescale = bool(np.all(np.isfinite(space.low) & np.isfinite(space.high)))
        if self._rescale:
            self.single_action_space = gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)
            self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.single_observation_space = _contract_space(env.single_observation_space)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

    # ---- conversions -------------------------------------------------------------------------------
    def _obs(self, obs) -> torch.Tensor | TensorDict:
        if not isinstance(obs, dict):
            return torch.as_tensor(obs).to(self.device, dtype=torch.float32)
        obs = {key: value for key, value in obs.items() if key != "sensor_param"}  # constant camera matrices
        td = TensorDict(obs, batch_size=[self.num_envs]).to(self.device)
        # camera images [N, H, W, C] uint8 -> [N, C, H, W] uint8 (the contract's image layout); the rest float32
        return td.apply(lambda x: x.permute(0, 3, 1, 2).contiguous() if _is_hwc_image(x) else x.float())

    def _info(self, info: dict) -> dict:
        """``[N]`` numeric/bool tensors of a step info (float64 -> float32, ``success`` -> bool); the rest dropped."""
        out = {}
        for key, value in info.items():
            if key.startswith("_") or key in ("final_observation", "final_info"):
                continue
            if isinstance(value, torch.Tensor) and value.shape == (self.num_envs,) and not value.is_complex():
                value = value.to(self.device)
                out[key] = value.bool() if key == "success" else value.float() if value.is_floating_point() else value
        return out

    def _actions(self, actions) -> torch.Tensor:
        actions = torch.as_tensor(actions, dtype=torch.float32)
        low, high = self._low.to(actions.device), self._high.to(actions.device)
        if self._rescale:
            actions = low + (actions.clamp(-1.0, 1.0) + 1.0) * (0.5 * (high - low))
        sim_device = getattr(self.env.unwrapped, "device", actions.device)
        return torch.minimum(torch.maximum(actions, low), high).to(sim_device)

    # ---- VectorEnv API -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options) if options else {}
        group_size = options.pop("group_size", None)
        if group_size is not None and group_size != 1:
            raise ValueError(
                f"reset(options={{'group_size': {group_size}}}): {env_name(self.env)} on the GPU backend "
                "can't give identical group starts; use sim_backend='physx_cpu' (seeded sub-envs) "
                "or PushCubeRL"
            )
        if seed is None and self._first_reset:
            seed = self._seed
        obs, info = self.env.reset(seed=seed, options=options or None)
        self._first_reset = False
        info = self._info(info)
        info.pop("success", None)  # a reset describes no transition
        return self._obs(obs), info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(self._actions(actions))
        obs_t = self._obs(obs)
        out = self._info(info.get("final_info", info))  # after a partial reset, `info` is the new episodes'
        out["final_obs"] = self._obs(info["final_observation"]) if "final_observation" in info else obs_t.clone()
        terminated = torch.as_tensor(terminated).to(self.device, dtype=torch.bool).reshape(self.num_envs)
        truncated = torch.as_tensor(truncated).to(self.device, dtype=torch.bool).reshape(self.num_envs)
        out["_final_obs"] = terminated | truncated
        reward = torch.as_tensor(reward).to(self.device, dtype=torch.float32).reshape(self.num_envs)
        return obs_t, reward, terminated, truncated, out


def maniskill_vector_to_torch(
    env: VectorEnv, device: torch.device | str = "cpu", seed: int | None = None, flatten_obs: bool | None = None
):
    """A ManiSkillVectorEnv-like env -> :class:`ManiSkillToTorch` (+ flatten for Dict obs, see ``flattens``) +
    episode statistics."""
    env = ManiSkillToTorch(env, device=device, seed=seed)
    if flattens(env.single_observation_space, flatten_obs):
        env = FlattenDictObservation(env)
    return EpisodeStatistics(env)


# ---- make_env's ManiSkill branch ---------------------------------------------------------------------------
def _cpu_sub_env(env_id: str, kwargs: dict, ignore_terminations: bool, render_free: bool) -> gym.Env:
    """One ManiSkill env on the CPU backend as a plain numpy Gymnasium env (runs in async workers too)."""
    _import_maniskill()
    from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

    if render_free:
        _render_free_sapien()
    env = CPUGymWrapper(gym.make(env_id, num_envs=1, **kwargs), ignore_terminations=ignore_terminations)
    return SafeRender(env, hint=MANISKILL_RENDER_HINT)


def make_maniskill_env(
    env_id: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    vectorization: str = "sync",
    flatten_obs: bool | None = None,
    **env_kwargs,
) -> VectorEnv:
    """``num_envs`` copies of a ManiSkill id behind the torch env contract (see the module docstring)."""
    _import_maniskill()
    ignore_terminations = bool(env_kwargs.pop("ignore_terminations", False))
    kwargs = {**MANISKILL_DEFAULTS, **env_kwargs}
    on_cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    kwargs.setdefault("sim_backend", "physx_cuda" if on_cuda else "physx_cpu")
    gpu_sim = kwargs["sim_backend"] not in ("cpu", "physx_cpu")

    render_free = not sapien_can_render()
    if render_free and any(mode in str(kwargs["obs_mode"]) for mode in ("rgb", "depth", "segmentation")):
        raise ValueError(
            f"--env-id {env_id}: obs_mode={kwargs['obs_mode']!r} renders camera images, and this "
            "machine has no rendering device (SAPIEN found no Vulkan GPU); use obs_mode='state' here"
        )
    if render_free:
        _render_free_sapien()
        kwargs.update(render_backend="none", render_mode=None)
    else:
        kwargs.setdefault("render_mode", "rgb_array")

    if gpu_sim:
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        env = ManiSkillVectorEnv(
            gym.make(env_id, num_envs=num_envs, **kwargs),
            auto_reset=True,
            ignore_terminations=ignore_terminations,
            record_metrics=False,
        )
        _declare_time_limit(env, env_id, kwargs.get("max_episode_steps"))
        return maniskill_vector_to_torch(env, device=device, seed=seed, flatten_obs=flatten_obs)
    make_one = functools.partial(_cpu_sub_env, env_id, kwargs, ignore_terminations, render_free)
    vector_cls = SyncVectorEnv if vectorization == "sync" else AsyncVectorEnv
    env = vector_cls([make_one] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
    _declare_time_limit(env, env_id, kwargs.get("max_episode_steps"))
    # every info entry, as the GPU backend gives them (a ManiSkill step costs milliseconds: converting them is cheap)
    return numpy_vector_to_torch(env, device=device, seed=seed, flatten_obs=flatten_obs, info_keys="all")


def _declare_time_limit(env: VectorEnv, env_id: str, max_episode_steps: int | None) -> None:
    """Give the vector env a spec whose ``max_episode_steps`` is ManiSkill's limit (ManiSkill enforces it in its
    own wrapper; a SyncVectorEnv has no spec), so that trainers that read it (GRPO's horizon) see it."""
    spec = env.spec if env.spec is not None else gym.spec(env_id)
    steps = max_episode_steps or spec.max_episode_steps or gym.spec(env_id).max_episode_steps
    env.spec = dataclasses.replace(spec, max_episode_steps=steps)
