"""Isaac Lab-API environments behind the torch env contract: mjlab's tasks (extra ``mjlab``), ``--env-id mjlab:<task>``.

mjlab implements Isaac Lab's manager-based API (``ManagerBasedRlEnv``: observation groups, reward / termination /
command / event managers, ``reset(env_ids=...)``) on MuJoCo Warp. :class:`IsaacLabToTorch` adapts an env of that
API; only :func:`make_isaaclab_env` knows how mjlab builds one (``mjlab.tasks.registry``). What it reads of the env:

- ``step(actions)`` -> ``(obs groups, reward, terminated, time_outs, extras)`` and ``reset(env_ids=...)``;
  ``observation_manager.{active_terms, group_obs_dim, group_obs_concatenate}``; ``reward_manager`` (``active_terms``,
  ``_step_reward``, ``_episode_sums``), ``termination_manager.{active_terms, get_term}``,
  ``command_manager.{active_terms, get_term}`` (each term's ``metrics``; ``compute_success()`` where a term has it),
  ``metrics_manager`` (mjlab's, where present), ``episode_length_buf``, ``max_episode_length(_s)``, ``step_dt``,
  ``cfg.is_finite_horizon``.

The contract, and how it is met:

- SAME_STEP autoreset with the true final observation: mjlab is built with ``auto_reset=False``, so ``step()``
  returns the terminal state of every env; the adapter then resets the finished envs with ``reset(env_ids=ids)``
  and returns their new first observation in ``obs`` and the terminal one in ``info["final_obs"]``. ``ids`` needs
  the finished envs' indices on the host: ``done.nonzero()`` is the adapter's one host sync per step (mjlab's own
  step syncs too: ``torch.any`` of its pending resets with ``auto_reset=False``, ``nonzero`` of its reset buffer,
  of each command's resampling timers; its reset path calls ``.item()`` per termination term and command metric).
  Steps where some env finished cost one more ``forward()``, ``sense()`` and observation computation of the whole
  batch (mjlab's reset path), as the auto-reset path of mjlab's own step does inside ``step()``.
- ``terminated`` / ``truncated`` are the termination manager's: time-out terms are truncations; with
  ``cfg.is_finite_horizon`` a time-out is a true end, reported as terminated (rsl_rl's wrapper does the same).
- Observations: the groups of the task's ``obs_groups`` (its rsl_rl config: ``{"actor": ("actor",), "critic":
  ("critic",)}``) -- each actor group is an entry named after it, the critic group(s) the ``"privileged"`` entry
  (``--privileged-critic``: the critic reads it alone, as rsl_rl's critic reads the critic group). Without a
  distinct critic group the observation is flattened as usual (``flatten_obs``).
- ``info["rewards"]``: each reward term's weighted contribution to this step's reward; ``info["metrics"]``: what
  mjlab logs at an episode's end, per env (``Episode_Reward/<term>``: the episode's sum over its length in seconds,
  ``Episode_Termination/<term>``: 1 where that term ended it, ``Metrics/<command>/<metric>``, mjlab's
  ``Episode_Metrics/<term>``), read at the step before the reset, so the evaluation averages finished episodes;
  ``info["success"]``: the commands' ``compute_success()`` where a task has one (mjlab's lift task).
- Actions: the policy's own scale is mjlab's (its action terms scale and offset them); the space is unbounded
  unless ``clip_actions`` (the rsl_rl config's, or an env kwarg) clips them to ``[-c, c]``, as rsl_rl's wrapper does.
- Randomness: mjlab draws from torch's global generators. The adapter gives each env its own generator state
  (CPU and the sim's CUDA device), swapped in around every call into mjlab, seeded from ``seed``: the trainer's
  streams never see mjlab's draws, an evaluation never shifts the training envs', and a checkpoint carries them.
  ``reset(seed=s)`` reseeds that state (mjlab's own ``seed()`` would reseed the process: it is never called).
- ``reset(options={"group_size": G})`` (GRPO): G rounds of ``reset(env_ids=...)``, round k resetting the k-th env
  of every group, each from the same generator state, so every group's envs draw the same start (mjlab's reset
  draws a batch per call, row i for the i-th env given). Domain randomization applied once at startup (e.g.
  Go1's foot friction) stays each env's own, and observation noise differs as at every step.
- ``reset(options={"reset_mask": mask})``: a partial reset of the envs in ``mask`` (action chunks).
- ``state_dict()`` / ``load_state_dict()``: the whole env as it stands (physics integration state and the
  per-world model fields that events randomize, every tensor and number the managers, entities and sensors hold,
  the generator states), so a resume continues bit for bit (see :class:`EnvSnapshot`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import os
import sys
import types
import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict

from cleanrl_embodied.shared.envs.render import first_frame
from cleanrl_embodied.shared.envs.wrappers import EpisodeStatistics, FlattenDictObservation, flattens
from cleanrl_embodied.shared.observations import PRIVILEGED_KEY

__all__ = [
    "ADAPTER_KWARGS",
    "IsaacLabToTorch",
    "apply_task_options",
    "check_isaaclab_id",
    "is_isaaclab_task",
    "make_isaaclab_env",
    "mjlab_task_name",
]

PREFIX = "mjlab:"
INSTALL_HINT = (
    "`uv sync --extra mjlab` (it conflicts with the mujoco extra, mjlab pins MuJoCo 3.11; beside .venv: "
    "`UV_PROJECT_ENVIRONMENT=.venv-mjlab uv sync --extra mjlab`)"
)
ADAPTER_KWARGS = ("obs_groups", "clip_actions", "init_at_random_ep_len", "render_mode")
"""Env kwargs of the adapter's own; every other one is an option of the task's configuration (dotted paths)."""
RESERVED_OPTIONS = {
    "seed": "the trainer's --seed seeds the envs",
    "scene.num_envs": "--num-envs sets it",
    "auto_reset": "the adapter resets finished envs itself (auto_reset=False) to keep their final observation",
}


# ---- ids -------------------------------------------------------------------------------------------------
def mjlab_task_name(env_id: str) -> str | None:
    """``"mjlab:<task>"`` -> ``"<task>"``; None for any other id (nothing is imported)."""
    return env_id[len(PREFIX) :] if env_id.startswith(PREFIX) else None


def _registry():
    """mjlab's task registry, with mjlab's own tasks (and those of packages registered by entry point) in it."""
    if importlib.util.find_spec("mjlab") is None:
        raise ValueError(f"mjlab ids need the mjlab package: {INSTALL_HINT}")
    if "mjlab.tasks.registry" in sys.modules:
        return sys.modules["mjlab.tasks.registry"]
    from cleanrl_embodied.shared.envs.maniskill_backend import _HeldOutput

    try:
        with _HeldOutput() as held, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script, from a dependency's import
            importlib.import_module("mjlab.tasks")
            from mjlab.tasks import registry
    except Exception as e:
        held.replay()
        reason = (str(e).splitlines() or [""])[0]
        raise ValueError(f"mjlab is installed but can't be imported ({type(e).__name__}: {reason})") from None
    if os.environ.get("MJLAB_WARP_QUIET", "1").lower() not in ("0", "false", "no"):
        import warp as wp  # a line per kernel module Warp loads (its log level INFO); MJLAB_WARP_QUIET=0 keeps them

        wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)
    return registry


def is_isaaclab_task(name: str) -> bool:
    """Whether ``name`` is a task in mjlab's registry, asked only where mjlab's registry is already imported (a
    ``module:Task`` id whose module registers mjlab tasks imported it): no other id ever imports mjlab."""
    registry = sys.modules.get("mjlab.tasks.registry")
    return registry is not None and name in registry.list_tasks()


def check_isaaclab_id(env_id: str) -> str:
    """The task name of ``mjlab:<task>``, or one ValueError line (mjlab missing, the task unknown)."""
    name = mjlab_task_name(env_id)
    if not name:
        raise ValueError(f"--env-id {env_id!r}: use mjlab:<task>, e.g. mjlab:Mjlab-Velocity-Flat-Unitree-Go1")
    tasks = _registry().list_tasks()
    if name not in tasks:
        close = difflib.get_close_matches(name, tasks, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"--env-id {env_id!r}: mjlab has no task {name!r}; {hint}its tasks: {', '.join(tasks)}")
    return name


# ---- the task's configuration options (--env-kwargs) ------------------------------------------------------
def _option_paths(options: Mapping, prefix: str = "") -> list[tuple[str, Any]]:
    """{"a": {"b": 1}, "c.d": 2} -> [("a.b", 1), ("c.d", 2)]: nested objects and dotted keys alike."""
    out = []
    for key, value in options.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(_option_paths(value, path + "."))
        else:
            out.append((path, value))
    return out


def _children(node: Any) -> list[str]:
    if isinstance(node, Mapping):
        return [str(k) for k in node]
    if dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    return []


def _converted(value: Any, current: Any, where: str) -> Any:
    """A JSON value for an option whose current value is ``current``: lists become tuples where it is one, ints
    floats where it is a float; a value of another kind is refused."""
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} is a bool ({current!r}), got {value!r}")
        return value
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} is a number ({current!r}), got {value!r}")
        return float(value) if isinstance(current, float) else value
    if isinstance(current, (tuple, list)):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} is a sequence ({current!r}), got {value!r}")
        items = [_converted(v, current[0] if current else None, where) for v in value]
        return tuple(items) if isinstance(current, tuple) else items
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ValueError(f"{where} is a string ({current!r}), got {value!r}")
        return value
    if dataclasses.is_dataclass(current) or isinstance(current, Mapping):
        if value is not None:
            raise ValueError(f"{where} is a group of options ({', '.join(_children(current))}); set them one by one")
    return value


def apply_task_options(cfg: Any, options: Mapping, task: str) -> None:
    """Set options of a task's configuration (an mjlab / Isaac Lab env cfg: dataclasses and dicts of term cfgs) by
    their dotted paths, e.g. ``{"episode_length_s": 10, "rewards.upright.weight": 2.0,
    "observations.actor.enable_corruption": false, "commands.twist.ranges.lin_vel_x": [-1, 1]}`` (nested objects
    work too; ``null`` removes a term, as in mjlab's configs). An unknown path, a reserved one or a value of the
    wrong kind is one ValueError line naming the path and what is there."""
    for path, value in _option_paths(options):
        for reserved, why in RESERVED_OPTIONS.items():
            if path == reserved:
                raise ValueError(f"mjlab task {task}: option {path!r} can't be set here ({why})")
        node, parts = cfg, path.split(".")
        for depth, part in enumerate(parts):
            known = _children(node)
            if part not in known:
                where = ".".join(parts[:depth]) or "the task's configuration"
                close = difflib.get_close_matches(part, known, n=2, cutoff=0.6)
                hint = f" (did you mean {' or '.join(close)}?)" if close else ""
                listed = ", ".join(known) if known else f"none: it is {type(node).__name__} {node!r}"[:200]
                raise ValueError(f"mjlab task {task}: no option {path!r}{hint}; options at {where}: {listed}")
            if depth == len(parts) - 1:
                current = node[part] if isinstance(node, Mapping) else getattr(node, part)
                new = _converted(value, current, f"mjlab task {task}: option {path!r}")
                if isinstance(node, Mapping):
                    node[part] = new
                else:
                    setattr(node, part, new)
            else:
                node = node[part] if isinstance(node, Mapping) else getattr(node, part)


# ---- randomness ---------------------------------------------------------------------------------------------
class PrivateGenerators:
    """An env's own state of torch's global generators (the CPU one and, on CUDA, the sim device's): ``with gens:``
    swaps it in and, on leaving, keeps what the env drew and puts the caller's back. A few microseconds a swap and no
    host sync (a CUDA generator's state is its seed and offset, held on the host)."""

    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.cuda = device.type == "cuda"
        self.seed(seed)

    def seed(self, seed: int) -> None:
        self.cpu = torch.Generator().manual_seed(int(seed)).get_state()
        self.gpu = torch.Generator(self.device).manual_seed(int(seed)).get_state() if self.cuda else None

    def __enter__(self) -> PrivateGenerators:
        self._saved = torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.cuda else None
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state(self.gpu, self.device)
        return self

    def __exit__(self, *exc) -> None:
        self.cpu = torch.get_rng_state()
        torch.set_rng_state(self._saved[0])
        if self.cuda:
            self.gpu = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(self._saved[1], self.device)

    def state_dict(self) -> dict:
        return {"cpu": self.cpu, "gpu": self.gpu}

    def load_state_dict(self, state: dict) -> None:
        self.cpu = state["cpu"].clone()
        if self.cuda:
            self.gpu = state["gpu"].clone() if state.get("gpu") is not None else self.gpu


# ---- the env's state, for checkpoints -------------------------------------------------------------------------
# Physics state of MuJoCo (Warp) Data that the next step depends on (MuJoCo's mjSTATE_INTEGRATION): the rest of Data
# is derived from it by forward(), which load_state_dict runs.
_INTEGRATION_FIELDS = (
    "time", "qpos", "qvel", "act", "history", "qacc_warmstart", "ctrl", "qfrc_applied", "xfrc_applied", "eq_active",
    "mocap_pos", "mocap_quat", "userdata", "tree_asleep",
)  # fmt: skip
_OPAQUE_MODULES = ("warp", "mujoco", "mujoco_warp", "torch", "numpy", "mjlab.sim", "viser", "trimesh", "prettytable")


def _opaque(obj: Any) -> bool:
    """Objects the snapshot does not look into: simulator handles (their state is saved as physics state), torch and
    numpy internals, modules, classes and functions."""
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return True
    module = type(obj).__module__ or ""
    return any(module == m or module.startswith(m + ".") for m in _OPAQUE_MODULES)


class EnvSnapshot:
    """Everything a Isaac Lab-API env (mjlab's) continues from, gathered generically, since mjlab has no state API.

    - Physics: the integration state of MuJoCo Warp's Data (qpos, qvel, act, ctrl, warm start, applied forces,
      mocap, time, ...) and the model fields expanded per world (what domain randomization writes); loading it runs
      ``forward()`` and ``sense()``, which recompute everything else in Data from it, as mjlab's step does.
    - Python: every tensor, number and generator that the env's objects (managers and their terms, entities,
      sensors, counters) hold, found by walking their attributes, dicts, lists and tuples from the env, each by its
      path (``reward_manager/_episode_sums/upright``); simulator handles (``env.sim``) are left to the physics part.

    Loading walks a freshly built env of the same task and options the same way and writes each saved value at its
    path (tensors in place, so every alias of a buffer sees it); a path the fresh env lacks is reported (``missing``).
    """

    @staticmethod
    def _walk(root: Any, visit) -> None:
        seen: set[int] = {id(root)}  # the managers' back-references to the env (``_env``) are not walked again

        def walk(obj: Any, path: str, parent: Any, key: Any) -> None:
            if isinstance(obj, (torch.Tensor, torch.Generator, np.ndarray, bool, int, float)) or obj is None:
                visit(path, obj, parent, key)
                return
            if isinstance(obj, (str, bytes, np.generic)) or id(obj) in seen or _opaque(obj):
                return
            seen.add(id(obj))
            if isinstance(obj, dict):
                for k, v in list(obj.items()):
                    walk(v, f"{path}/{k}", obj, k)
            elif isinstance(obj, (list, tuple)):
                for i, v in enumerate(obj):
                    walk(v, f"{path}/{i}", obj, i)
            elif hasattr(obj, "__dict__"):
                for k, v in list(vars(obj).items()):
                    walk(v, f"{path}/{k}", obj, k)

        for k, v in list(vars(root).items()):
            if k != "sim":
                walk(v, k, root, k)

    @classmethod
    def save(cls, env: Any) -> dict:
        values: dict[str, Any] = {}

        def visit(path, obj, parent, key):
            if isinstance(obj, torch.Tensor):
                values[path] = obj.detach().clone()
            elif isinstance(obj, torch.Generator):
                values[path] = {"generator": obj.get_state()}
            elif isinstance(obj, np.ndarray):
                if obj.dtype.kind in "biuf":
                    values[path] = {"numpy": torch.from_numpy(np.array(obj))}
            else:
                values[path] = obj

        cls._walk(env, visit)
        return {"physics": cls._physics(env, save=True), "python": values}

    @classmethod
    def load(cls, env: Any, state: dict) -> list[str]:
        """Write ``state`` into ``env``; returns the saved paths the env lacks."""
        import warp as wp

        cls._physics(env, save=False, state=state["physics"])
        saved, found = state["python"], set()

        def visit(path, obj, parent, key):
            if path not in saved:
                return
            found.add(path)
            value = saved[path]
            if isinstance(obj, torch.Tensor) and isinstance(value, torch.Tensor):
                if obj.shape == value.shape and obj.dtype == value.dtype:
                    obj.copy_(value)
                    return
                value = value.to(obj.device)
            elif isinstance(obj, torch.Generator) and isinstance(value, dict):
                obj.set_state(value["generator"])
                return
            elif isinstance(obj, np.ndarray) and isinstance(value, dict):
                value = value["numpy"].numpy().copy()
                if obj.shape == value.shape and obj.dtype == value.dtype and obj.flags.writeable:
                    obj[...] = value
                    return
            if obj is value or (type(obj) is type(value) and not isinstance(obj, np.ndarray) and obj == value):
                return
            if isinstance(parent, (dict, list)):
                parent[key] = value
            elif not isinstance(parent, tuple):
                object.__setattr__(parent, key, value)

        cls._walk(env, visit)
        for path in set(saved) - found:  # what only step() creates on the env (reset_buf, reward_buf, ...)
            value = saved[path]
            if "/" not in path and not hasattr(env, path) and not isinstance(value, dict):
                setattr(env, path, value.to(env.device) if isinstance(value, torch.Tensor) else value)
                found.add(path)
        with wp.ScopedDevice(env.sim.wp_device):
            env.sim.forward()
        env.sim.sense()
        return sorted(set(saved) - found)

    @staticmethod
    def _physics(env: Any, save: bool, state: dict | None = None) -> dict | None:
        import warp as wp

        sim, out = env.sim, {}
        sources = [("data", sim.wp_data, _INTEGRATION_FIELDS), ("model", sim.wp_model, sorted(sim.expanded_fields))]
        for kind, obj, names in sources:
            for name in names:
                array = getattr(obj, name, None)
                if not isinstance(array, wp.array) or array.size == 0:
                    continue
                view = wp.to_torch(array)
                if save:
                    out[f"{kind}/{name}"] = view.clone()
                elif f"{kind}/{name}" in state:
                    view.copy_(state[f"{kind}/{name}"].to(view.device))
        return out if save else None


# ---- the adapter ------------------------------------------------------------------------------------------------
def _group_space(manager, group: str, task: str) -> gym.Space:
    """The Gymnasium space of one observation group: a float32 Box, or a Dict of Boxes for a group whose terms are
    kept apart (``concatenate_terms=False``); image-like groups are refused."""
    dims = manager.group_obs_dim[group]
    if manager.group_obs_concatenate[group]:
        shapes = {None: tuple(dims)}
    else:
        shapes = dict(zip(manager.active_terms[group], (tuple(d) for d in dims)))
    for term, shape in shapes.items():
        if len(shape) != 1:
            what = f"group {group!r}" + (f", term {term!r}," if term else "")
            raise ValueError(
                f"mjlab task {task}: observation {what} has shape {list(shape)} per env (images); this backend serves "
                'state vectors: leave it out of obs_groups (e.g. {"actor": ["actor"], "critic": ["critic"]})'
            )
    boxes = {term: gym.spaces.Box(-np.inf, np.inf, shape, np.float32) for term, shape in shapes.items()}
    return boxes[None] if None in boxes else gym.spaces.Dict(boxes)


class IsaacLabToTorch(VectorEnv):
    """An Isaac Lab-API env (``ManagerBasedRlEnv``, built with ``auto_reset=False``) seen through the torch env
    contract; the module docstring says how each guarantee is met. ``env`` is the raw env (``self.lab_env``)."""

    partial_reset = True  # reset(options={"reset_mask": ...}) resets just those envs (action chunks)
    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": [None, "rgb_array"]}

    def __init__(
        self,
        env: Any,
        task: str,
        generators: PrivateGenerators,
        seed: int,
        obs_groups: Mapping[str, Any],
        clip_actions: float | None = None,
        init_at_random_ep_len: bool = False,
    ):
        self.lab_env, self.task, self.generators = env, task, generators
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self._seed, self._first_reset = seed, True
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = {**type(self).metadata, "render_fps": 1.0 / env.step_dt}
        self.spec = EnvSpec(
            id=task, entry_point="mjlab.envs:ManagerBasedRlEnv", max_episode_steps=env.max_episode_length
        )
        self.finite_horizon = bool(getattr(env.cfg, "is_finite_horizon", False))
        self.init_at_random_ep_len = bool(init_at_random_ep_len)
        self._render_failed = False

        manager = env.observation_manager
        groups = list(manager.active_terms)
        self.actor_groups, self.critic_groups = self._groups(obs_groups, groups)
        spaces = {g: _group_space(manager, g, task) for g in self.actor_groups}
        if self.critic_groups:
            critic = {g: _group_space(manager, g, task) for g in self.critic_groups}
            spaces[PRIVILEGED_KEY] = critic[self.critic_groups[0]] if len(critic) == 1 else gym.spaces.Dict(critic)
        self.single_observation_space = gym.spaces.Dict(spaces)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)

        act_dim = int(sum(env.action_manager.action_term_dim))
        if clip_actions is not None and (isinstance(clip_actions, bool) or not clip_actions > 0):
            raise ValueError(
                f"clip_actions must be a positive number (actions are clipped to [-c, c]), got {clip_actions!r}"
            )
        self.clip = None if clip_actions is None else float(clip_actions)
        bound = np.inf if self.clip is None else self.clip
        self.single_action_space = gym.spaces.Box(-bound, bound, (act_dim,), np.float32)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        self._reward_terms = list(env.reward_manager.active_terms)
        self._reward_scale = env.step_dt if getattr(env.reward_manager, "_scale_by_dt", True) else 1.0
        commands = getattr(env, "command_manager", None)
        self._commands = {n: commands.get_term(n) for n in getattr(commands, "active_terms", None) or ()}
        self._success_terms = [t for t in self._commands.values() if callable(getattr(t, "compute_success", None))]
        self._last_obs: TensorDict | None = None

    def _groups(self, obs_groups: Mapping[str, Any], groups: list[str]) -> tuple[list[str], list[str]]:
        if not isinstance(obs_groups, Mapping) or not set(obs_groups) <= {"actor", "critic", "policy"}:
            raise ValueError(
                f"obs_groups must map 'actor' (and optionally 'critic') to observation groups of {self.task} "
                f"({', '.join(groups)}), got {obs_groups!r}"
            )
        actor = list(obs_groups.get("actor", obs_groups.get("policy", ())) or ())
        critic = list(obs_groups.get("critic", ()) or ())
        for name in (*actor, *critic):
            if name not in groups:
                raise ValueError(
                    f"obs_groups: {self.task} has no observation group {name!r} (it has {', '.join(groups)})"
                )
        if not actor:
            raise ValueError(f"obs_groups: name the actor's observation group(s) of {self.task} ({', '.join(groups)})")
        if PRIVILEGED_KEY in actor:
            raise ValueError(f"obs_groups: an actor group can't be named {PRIVILEGED_KEY!r} (the critic's entry)")
        return actor, ([] if set(critic) <= set(actor) else critic)

    # ---- conversions ---------------------------------------------------------------------------------------
    def _obs(self, groups: Mapping[str, Any]) -> TensorDict:
        """The contract's observation of mjlab's groups. A concatenated group is a fresh tensor at every compute; a
        group kept as terms may hold views of history buffers, which later steps shift in place: copied."""
        group = lambda g: {k: v.clone() for k, v in groups[g].items()} if isinstance(groups[g], Mapping) else groups[g]
        out = {g: group(g) for g in self.actor_groups}
        if self.critic_groups:
            critic = {g: group(g) for g in self.critic_groups}
            out[PRIVILEGED_KEY] = critic[self.critic_groups[0]] if len(critic) == 1 else critic
        return TensorDict(out, batch_size=[self.num_envs], device=self.device)

    def _metrics(self) -> dict[str, torch.Tensor]:
        """Per env, what mjlab logs when an episode ends, as it stands after this step (before any reset)."""
        env, out = self.lab_env, {}
        rewards = env.reward_manager
        if self._reward_terms:
            sums = torch.stack([rewards._episode_sums[n] for n in self._reward_terms]) / env.max_episode_length_s
            out.update({f"Episode_Reward/{n}": v for n, v in zip(self._reward_terms, sums.unbind(0))})
        terminations = env.termination_manager
        out.update({f"Episode_Termination/{n}": terminations.get_term(n).float() for n in terminations.active_terms})
        for name, term in self._commands.items():
            out.update({f"Metrics/{name}/{m}": v.float().clone() for m, v in getattr(term, "metrics", {}).items()})
        metrics = getattr(env, "metrics_manager", None)
        for i, name in enumerate(getattr(metrics, "active_terms", None) or ()):
            reduce = metrics._term_cfgs[i].reduce
            if reduce == "max":
                value = metrics._episode_max[name].clone()
            elif reduce == "last":
                value = metrics._step_values[:, i].clone()
            elif reduce == "sum":
                value = metrics._episode_sums[name].clone()
            else:
                value = metrics._episode_sums[name] / metrics._step_count.clamp_min(1)
            out[f"Episode_Metrics/{name}"] = value.float()
        return out

    def _success(self) -> torch.Tensor:
        success = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        for term in self._success_terms:
            success = success | term.compute_success().bool()
        return success

    # ---- VectorEnv API -------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        group_size, mask = options.pop("group_size", None), options.pop("reset_mask", None)
        if options:
            raise ValueError(f"reset(options=...): unknown option(s) {sorted(options)} (group_size, reset_mask)")
        if seed is None and self._first_reset:
            seed = self._seed
        if seed is not None:
            self.generators.seed(seed)
        self._first_reset = False
        env = self.lab_env
        with self.generators:
            if mask is not None and self._last_obs is not None:
                mask = torch.as_tensor(mask, dtype=torch.bool, device=self.device).reshape(self.num_envs)
                ids = mask.nonzero().squeeze(-1)
                obs = self._last_obs
                if ids.numel():
                    obs = torch.where(mask, self._obs(env.reset(env_ids=ids)[0]), obs)
            elif group_size not in (None, 1):
                obs = self._group_reset(group_size)
            else:
                obs = self._obs(env.reset()[0])
                if self.init_at_random_ep_len:  # rsl_rl's init_at_random_ep_len: time-outs spread from the start
                    env.episode_length_buf = torch.randint_like(env.episode_length_buf, high=env.max_episode_length)
        self._last_obs = obs
        return obs, {}

    def _group_reset(self, group_size: int) -> TensorDict:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
        if self.num_envs % group_size:
            raise ValueError(f"group_size {group_size} must divide num_envs {self.num_envs}")
        start, obs = self.generators.cpu.clone(), None
        start_gpu = self.generators.gpu.clone() if self.generators.cuda else None
        for k in range(group_size):  # round k: the k-th env of every group, each round from the same draws
            torch.set_rng_state(start)
            if start_gpu is not None:
                torch.cuda.set_rng_state(start_gpu, self.device)
            ids = torch.arange(k, self.num_envs, group_size, device=self.device)
            round_obs = self._obs(self.lab_env.reset(env_ids=ids)[0])
            if obs is None:
                obs = round_obs
            else:
                obs[ids] = round_obs[ids]
        return obs

    def step(self, actions):
        actions = torch.as_tensor(actions, dtype=torch.float32).to(self.device)
        if self.clip is not None:
            actions = actions.clamp(-self.clip, self.clip)
        env = self.lab_env
        with self.generators:
            groups, reward, terminated, truncated, _ = env.step(actions)
            step_obs = self._obs(groups)  # the terminal state of the envs that finished
            reward = reward.float().clone()  # (mjlab's buffers are overwritten in place by the next step)
            terminated, truncated = terminated.clone(), truncated.clone()
            if self.finite_horizon:  # the time limit ends the task: no value beyond it
                terminated, truncated = terminated | truncated, torch.zeros_like(truncated)
            terms = (env.reward_manager._step_reward * self._reward_scale).unbind(1)
            info: dict[str, Any] = {"rewards": dict(zip(self._reward_terms, terms)), "metrics": self._metrics()}
            if self._success_terms:
                info["success"] = self._success()
            done = terminated | truncated
            ids = done.nonzero().squeeze(-1)  # the adapter's one host sync: reset(env_ids) takes indices
            if ids.numel():
                obs = torch.where(done, self._obs(env.reset(env_ids=ids)[0]), step_obs)
                final_obs = step_obs
            else:
                obs, final_obs = step_obs, step_obs.clone()
        info["final_obs"], info["_final_obs"] = final_obs, done
        self._last_obs = obs
        return obs, reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode is None or self._render_failed:
            return None
        try:
            return first_frame(self.lab_env.render())
        except Exception as e:  # no video, never a crash
            self._render_failed = True
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:200]
            warnings.warn(
                f"{self.task} cannot render here ({reason}); render() returns None; MuJoCo renders headless "
                "with MUJOCO_GL=egl (libegl1) or MUJOCO_GL=osmesa (libosmesa6)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None

    def close(self, **kwargs) -> None:
        close = getattr(self.lab_env, "close", None)
        if close is not None:
            close()

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The env as it stands (:class:`EnvSnapshot`), its generators and the observation it returned last."""
        last = self._last_obs.to_dict() if self._last_obs is not None else None
        return {
            "env": EnvSnapshot.save(self.lab_env),
            "generators": self.generators.state_dict(),
            "last_obs": last,
            "first_reset": self._first_reset,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into an env built by the same ``make_env`` call (same task and options)."""
        missing = EnvSnapshot.load(self.lab_env, state["env"])
        if missing:
            warnings.warn(
                f"{self.task}: {len(missing)} saved entries have no place in this env ({', '.join(missing[:4])}"
                f"{', ...' if len(missing) > 4 else ''}); the resume may not continue exactly",
                RuntimeWarning,
                stacklevel=2,
            )
        self.generators.load_state_dict(state["generators"])
        last = state.get("last_obs")
        if last is not None:
            self._last_obs = TensorDict(last, batch_size=[self.num_envs]).to(self.device)
        self._first_reset = bool(state.get("first_reset", False))


# ---- make_env's branch --------------------------------------------------------------------------------------------
def _mjlab_device(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("mjlab on CUDA: torch sees no CUDA device")
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    if device.type != "cpu":
        raise ValueError(f"mjlab runs on the CPU or CUDA, not {device.type}")
    return "cpu"


def make_isaaclab_env(
    task: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    flatten_obs: bool | None = None,
    **env_kwargs,
) -> VectorEnv:
    """``num_envs`` copies of mjlab's task ``task`` behind the torch env contract (module docstring), on ``device``.

    ``env_kwargs``: the adapter's own (``obs_groups``, ``clip_actions``: default from the task's rsl_rl config;
    ``init_at_random_ep_len``: start each env at a random point of its first episode, as mjlab's train script does;
    ``render_mode="rgb_array"`` for videos, built at construction) and options of the task's configuration by dotted
    path (:func:`apply_task_options`). Bad options and a task that fails to build are one ValueError line."""
    registry = _registry()
    own = {k: env_kwargs.pop(k) for k in ADAPTER_KWARGS if k in env_kwargs}
    cfg = registry.load_env_cfg(task)
    rl_cfg = registry.load_rl_cfg(task)
    apply_task_options(cfg, env_kwargs, task)
    cfg.scene.num_envs, cfg.auto_reset, cfg.seed = num_envs, False, None
    obs_groups = own.get("obs_groups", getattr(rl_cfg, "obs_groups", None) or {"actor": ("actor",)})
    if isinstance(obs_groups, str):
        obs_groups = json.loads(obs_groups)
    clip_actions = own.get("clip_actions", getattr(rl_cfg, "clip_actions", None))
    render_mode = own.get("render_mode")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be null or 'rgb_array', got {render_mode!r}")
    sim_device = _mjlab_device(device)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") >> 1
    generators = PrivateGenerators(torch.device(sim_device), seed)

    from mjlab.envs import ManagerBasedRlEnv

    from cleanrl_embodied.shared.envs.maniskill_backend import _HeldOutput

    np_state = np.random.get_state()
    np.random.seed(seed % 2**32)  # what building draws from numpy (terrain generation without a seed of its own)
    try:
        with _HeldOutput() as held, generators:  # mjlab prints its managers' tables while it builds
            env = ManagerBasedRlEnv(cfg, device=sim_device, render_mode=render_mode)
    except Exception as e:
        held.replay()
        reason = (str(e).splitlines() or [""])[0][:300]
        raise ValueError(f"mjlab task {task} failed to build ({type(e).__name__}: {reason})") from None
    finally:
        np.random.set_state(np_state)
    try:
        adapter = IsaacLabToTorch(
            env, task, generators, seed, obs_groups, clip_actions, own.get("init_at_random_ep_len")
        )
    except ValueError:
        env.close()
        raise
    out: VectorEnv = adapter
    if flattens(adapter.single_observation_space, flatten_obs):
        out = FlattenDictObservation(out)
    return EpisodeStatistics(out)
