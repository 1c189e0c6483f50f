"""Checkpoint plumbing: loading with its compatibility checks, and the random state a resume restores; what trains
and what is frozen (`model_state`, `frozen_fingerprint`, and `inference_copy`, a copy that shares the frozen part).

What a checkpoint *holds* is the trainer's business (it builds the dict); this module only loads one
safely and says, in one line, why a file cannot serve the run at hand. Files are written with
``atomic_save`` (shared.atomic_files) and read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator

from cleanrl_embodied.shared.builders import EnvOptions
from cleanrl_embodied.shared.cli import fail, flag
from cleanrl_embodied.shared.envs import BUILTIN_ENVS, OBSERVATION_KWARGS, resolve_env_id
from cleanrl_embodied.shared.envs.wrappers import FlattenDictObservation, SelectObservation
from cleanrl_embodied.shared.model_state import frozen_fingerprint, model_state
from cleanrl_embodied.shared.observations import flat_dim
from cleanrl_embodied.shared.trainer_file import network_differences

__all__ = [
    "HARMLESS_ENV_KWARGS",
    "check_env_sizes",
    "env_record",
    "load_checkpoint",
    "load_model_state",
    "load_optimizer",
    "observation_layout",
    "without_privileged_critic",
]

HARMLESS_ENV_KWARGS = ("randomize_interval", "info_keys", "render_mode", "max_episode_steps")
"""Env options that change neither what a policy sees nor what its actions mean, whatever the env: a checkpoint may
be resumed or evaluated with other values. For the built-in tasks (PushCubeRL, PushCubeLangRL) only their
``INTERFACE_KWARGS`` and make_env's ``OBSERVATION_KWARGS`` (``flatten_obs``, ``obs_indices``, ``obs_keys``) must
match; for every other id (whose options this code cannot judge) every option but these."""


SPLIT_OFF = {"ppo_continuous": "ppo_vla", "ppo_ddp": "ppo_vla_ddp", "ppo_async": "ppo_vla_async", "grpo": "grpo_vla"}
"""The classic trainers (and ppo_async.py, which became ppo_vla_async.py) with the VLA trainer that took over their
token bins, action chunks, micro-batches, autocast and FSDP. A VLA trainer refuses their checkpoints, and a classic
trainer refuses one of its own written with one of the ``VLA_ONLY_FLAGS``, each in one line that says so."""

VLA_ONLY_FLAGS = {"action_head": "gaussian", "action_chunk": 1, "micro_batch_size": None, "autocast": "none",
                  "fsdp": False}  # fmt: skip
"""Flags the classic trainers had before the VLA trainers split off, with the one value a classic trainer can serve."""


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists and NumPy scalars as Python numbers, nested (what JSON and a saved
    checkpoint give back), so that equal settings compare equal."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def _leaves(space: gym.Space, prefix: tuple[str, ...] = ()) -> list[list]:
    """[key path, shape, dtype] of every leaf of an observation space, in sorted key-path order."""
    if isinstance(space, gym.spaces.Dict):
        return sorted((leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, (*prefix, key))))
    return [["/".join(prefix), list(space.shape), str(space.dtype)]]


def observation_layout(envs) -> dict:
    """What a policy of ``envs`` is fed: the observation's leaves (``[key path, shape, dtype]`` in sorted key-path
    order, the order in which flattening and the trainers' state vectors concatenate them; one leaf with path ""
    for a Box) and whether make_env ``flattened`` a Dict of them into one vector (then ``indices``: the positions of
    that vector its ``obs_indices`` kept, where it has them)."""
    env, indices = envs, None
    while not isinstance(env, FlattenDictObservation) and env is not env.unwrapped and hasattr(env, "env"):
        indices = env.indices if isinstance(env, SelectObservation) else indices  # (obs_indices of the flat vector)
        env = env.env
    if isinstance(env, FlattenDictObservation):
        layout = {"flattened": True, "leaves": _leaves(env.env.single_observation_space)}
        return layout if indices is None else {**layout, "indices": indices}
    return {"flattened": False, "leaves": _leaves(envs.single_observation_space)}


def env_record(options: EnvOptions, envs) -> dict:
    """What a checkpoint records of its env: the id, the options its training and eval envs were built with (as
    dicts, :meth:`EnvOptions.kwargs`) and the :func:`observation_layout` of ``envs``."""
    return {
        "env_id": options.env_id,
        "env_kwargs": options.kwargs(eval_envs=False),
        "eval_env_kwargs": options.kwargs(eval_envs=True),
        "observation": observation_layout(envs),
    }


def _env_defaults(env_id: str) -> dict:
    """The default of every option of ``env_id`` that can be found (its constructor's signature, a Gymnasium
    spec's kwargs) and of make_env's own options, so that an option given with its default equals one not given."""
    defaults = {
        "flatten_obs": None,
        "randomize_interval": None,
        "info_keys": (),
        "obs_indices": None,
        "obs_keys": None,
        "frame_stack": 1,
    }  # make_env's own options
    try:
        name = resolve_env_id(env_id)
        if name in BUILTIN_ENVS:
            creator, spec_kwargs = load_env_creator(BUILTIN_ENVS[name]), {}
        else:
            spec = gym.spec(name)
            creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
            spec_kwargs = spec.kwargs
        # a class's defaults include its bases' (PushCubeLangRLVecEnv passes the rest on to PushCubeRLVecEnv)
        for fn in [c.__init__ for c in reversed(creator.__mro__)] if inspect.isclass(creator) else [creator]:
            params = inspect.signature(fn).parameters.items()
            defaults.update({k: p.default for k, p in params if p.default is not inspect.Parameter.empty})
        defaults.update(spec_kwargs)
    except Exception:  # noqa: BLE001 - unknown defaults: options are then compared as given
        pass
    return defaults


def _env_differences(env_id: str, theirs: dict, ours: dict) -> list[tuple[str, Any, Any, bool]]:
    """(option, their value, our value, whether it changes what the policy sees or what its actions mean) for every
    option whose value differs (a default counts as given; ``"<not given>"`` where none is known)."""
    if resolve_env_id(env_id) in BUILTIN_ENVS:
        from cleanrl_embodied.shared.envs.push_cube import INTERFACE_KWARGS

        interface = lambda key: key in (*INTERFACE_KWARGS, *OBSERVATION_KWARGS)  # noqa: E731
    else:
        interface = lambda key: key not in HARMLESS_ENV_KWARGS  # noqa: E731
    defaults, differences = _env_defaults(env_id), []
    for key in sorted(set(theirs) | set(ours)):
        a, b = (_plain(d.get(key, defaults.get(key, "<not given>"))) for d in (theirs, ours))
        if a != b:
            differences.append((key, a, b, interface(key)))
    return differences


def _check_env(ckpt: dict, path: str, flag_name: str, options: EnvOptions, eval_envs: bool, show: bool) -> None:
    """Refuse, in one line, a checkpoint whose env had other options that change what the policy sees or what its
    actions mean than this run's training envs (or eval envs: ``eval_envs``); name the allowed differences in a note. An
    ``--eval-checkpoint`` may also match the checkpoint's own eval envs. Checkpoints written by older versions, which
    did not record their env, are checked against the options in their ``args``."""
    record = ckpt.get("env") or {
        key: json.loads(ckpt["args"].get(key) or "{}") for key in ("env_kwargs", "eval_env_kwargs")
    }
    ours = options.kwargs(eval_envs)
    kwargs_flag = "eval_env_kwargs" if eval_envs else "env_kwargs"
    theirs = [("--env-kwargs", record["env_kwargs"])]
    if flag_name == "eval_checkpoint":
        theirs.append(("--eval-env-kwargs", record["eval_env_kwargs"]))
    differences = [(their_flag, _env_differences(options.env_id, kwargs, ours)) for their_flag, kwargs in theirs]
    if any(not found for _, found in differences):
        return
    for their_flag, found in differences:
        if not any(interface for *_, interface in found):
            if show:
                changes = ", ".join(f"{key} {a!r} -> {b!r}" for key, a, b, _ in found)
                print(
                    f"note: {flag(flag_name)} {path}: env options differ from its {their_flag}: {changes} (allowed: "
                    "they change neither what the policy sees nor what its actions mean)",
                    flush=True,
                )
            return
    their_flag, found = differences[0]
    key, a, b, _ = next(d for d in found if d[3])
    fail(
        f"{flag(flag_name)} {path}: its env had {key}={a!r} ({their_flag}), this run's {flag(kwargs_flag)} give "
        f"{key}={b!r}; that changes what the policy sees or what its actions mean: pass the same value",
        show,
    )


def load_checkpoint(
    path: str,
    flag_name: str,
    scripts: Iterable[str] | None,
    same: dict[str, Any],
    env: EnvOptions | None = None,
    eval_envs: bool = False,
    show: bool = True,
    trainer: dict | None = None,
) -> dict:
    """Load ``path`` on the CPU (``weights_only=True``) and check it can serve this run.

    Which trainer's checkpoints are accepted (docs/runs.md, "Which file a checkpoint belongs to"):

    - ``trainer``: the loading file's record (``shared.describe_trainer(__file__)``). A checkpoint that records the
      network of the file that wrote it is accepted when that network is this file's (the same code builds and runs
      it: ``shared.trainer_file``), whatever the file's name; otherwise one line names both files and the
      definitions that differ. For ``--resume`` (``flag_name`` "resume") its ``script`` must also be one of
      ``scripts``: the rest of what a resume reads (optimizer, reward trace, env state) is laid out by the trainer
      that wrote it.
    - ``scripts``: the names whose checkpoints are accepted (the loading one first, then the trainers it also
      continues), for ``--resume`` and for checkpoints written before trainers recorded their network, which are
      judged by name alone; None: any.

    ``same``: {Args field: this run's value} of the flags that must equal the checkpoint's (each mismatch is one line
    naming the flag; a flag the checkpoint's trainer did not have is not compared); ``env``: the env options this run
    uses the checkpoint's policy with (its training envs, or its eval envs with ``eval_envs``), which must agree with
    the checkpoint's on everything that changes what the policy sees or what its actions mean (see
    :data:`HARMLESS_ENV_KWARGS`; None: not checked). Fails with one line for a missing or unreadable file, another
    trainer's checkpoint or a mismatch.
    """
    scripts = None if scripts is None else tuple(scripts)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        fail(f"{flag(flag_name)}: no such checkpoint file {path!r}", show)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user mistake
        reason = (str(e).strip().splitlines() or [""])[0]
        fail(f"{flag(flag_name)} {path}: not a readable checkpoint ({type(e).__name__}: {reason})", show)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("script"), str) or not isinstance(ckpt.get("args"), dict):
        fail(f"{flag(flag_name)} {path}: not a checkpoint of a trainer (no script and args entries)", show)
    writer = ckpt.get("trainer")
    if trainer is not None and isinstance(writer, dict) and "network" in writer:
        _check_trainer(ckpt, path, flag_name, scripts, trainer, show)
    elif scripts is not None and ckpt["script"] not in scripts:
        found = ckpt["script"]
        split = SPLIT_OFF.get(found) in scripts  # (the VLA trainer's forerunner)
        fail(
            f"{flag(flag_name)} {path}: not a checkpoint of {' or '.join(s + '.py' for s in scripts)} (it is from "
            f"{found}.py)"
            + (
                f": a checkpoint of {found}.py, whose policies {scripts[0]}.py does not read (a checkpoint of the "
                f"old {found}.py, from before the VLA trainers split off, resumes only with the version that wrote "
                f"it); train with {scripts[0]}.py"
                if split
                else ""
            ),
            show,
        )
    used = [f"{flag(k)} {ckpt['args'][k]}" for k, ok in VLA_ONLY_FLAGS.items() if ckpt["args"].get(k, ok) != ok]
    if used and ckpt["script"] in SPLIT_OFF:  # the VLA sibling of the trainer that loads it (listed first)
        vla = SPLIT_OFF.get((scripts or ("",))[0], SPLIT_OFF[ckpt["script"]])
        fail(
            f"{flag(flag_name)} {path}: written by the old {ckpt['script']}.py with {', '.join(used)}, which only "
            f"{vla}.py has since the VLA trainers split off: train such a policy with {vla}.py, or use this checkpoint "
            "with the version that wrote it",
            show,
        )
    for key, ours in same.items():
        theirs = ckpt["args"].get(key, ours)
        if _plain(theirs) != _plain(ours):
            fail(
                f"{flag(flag_name)} {path} was trained with {flag(key)} {theirs}, this run has {ours}; "
                "pass the same value",
                show,
            )
    if env is not None:
        if env.env_id != ckpt["args"].get("env_id", env.env_id):
            fail(f"{flag(flag_name)} {path} was trained on --env-id {ckpt['args']['env_id']}, this run has "
                 f"{env.env_id}; pass the same value", show)  # fmt: skip
        _check_env(ckpt, path, flag_name, env, eval_envs, show)
    return ckpt


def _check_trainer(ckpt: dict, path: str, flag_name: str, scripts, trainer: dict, show: bool) -> None:
    """The rule of :func:`load_checkpoint` for a checkpoint that records the file that wrote it."""
    writer, here = ckpt["trainer"], trainer["path"]
    there = writer.get("path") or f"{ckpt['script']}.py"
    differences = network_differences(writer["network"], trainer["network"])
    if differences:
        fail(
            f"{flag(flag_name)} {path}: written by {there}, whose network code is not this file's ({here}): "
            f"{', '.join(differences)}; use the checkpoint with the file that wrote it",
            show,
        )
    if flag_name == "resume" and scripts is not None and ckpt["script"] not in scripts:
        fail(
            f"--resume {path}: written by {there}, a run that {trainer['script']}.py ({here}) does not continue (it "
            f"resumes the runs of {' and '.join(s + '.py' for s in scripts)}); resume it with the file that wrote it",
            show,
        )
    if show and writer.get("sha256") != trainer["sha256"]:
        what = "another file" if writer.get("path") != here else "this file as it was then"
        print(
            f"note: {flag(flag_name)} {path}: written by {what} ({there}, sha256 {str(writer.get('sha256'))[:12]}, "
            f"here {trainer['sha256'][:12]}); its network code is this file's",
            flush=True,
        )


def load_resume_or_eval(
    resume: str | None,
    eval_checkpoint: str | None,
    trainer: dict,
    env: EnvOptions,
    same: dict[str, Any],
    resume_same: dict[str, Any] | None = None,
    resumes: Iterable[str] = (),
    read: bool = True,
) -> tuple[dict | None, str, str | None]:
    """The checkpoint ``--resume`` or ``--eval-checkpoint`` names (None if neither is given), that flag's name and the
    path, for later messages. ``trainer``: the loading file's record (``shared.describe_trainer(__file__)``); the
    checkpoint must come from a file with the same network code, and a resumed one from this file or one of
    ``resumes`` (names of the trainers whose runs this one also continues; see :func:`load_checkpoint`). ``same``:
    {Args field: value} of what both uses must share with the checkpoint (the network and what it sees, besides the
    env id and options, which ``env`` gives); ``resume_same``: what a resumed run must also keep. ``read=False`` (DDP
    ranks other than 0, which get the content by broadcast): nothing is read."""
    flag_name, path = ("resume", resume) if resume else ("eval_checkpoint", eval_checkpoint)
    if not path or not read:
        return None, flag_name, path
    same = {**same, **(resume_same or {})} if resume else same
    scripts = (trainer["script"], *resumes)
    ckpt = load_checkpoint(path, flag_name, scripts, same, env, eval_envs=not resume, trainer=trainer)
    return ckpt, flag_name, path


def _describe_leaf(leaf: list | None) -> str:
    return "nothing" if leaf is None else f"{leaf[0] or '(a vector)'} {tuple(leaf[1])} {leaf[2]}"


def check_env_sizes(envs, *checkpoints: tuple[dict | None, str], show: bool = True) -> tuple[int, int]:
    """The flat observation size and the action size of ``envs``; fails with one line if a checkpoint, given
    as ``(ckpt, flag_name)`` (``ckpt`` None: nothing loaded), was saved for an env with other sizes, or, where it
    recorded its env's :func:`observation_layout`, with other observation entries (keys, order, shapes, dtypes)."""
    obs_dim, act_dim = flat_dim(envs.single_observation_space), int(np.prod(envs.single_action_space.shape))
    layout = None
    for ckpt, flag_name in checkpoints:
        if ckpt is None:
            continue
        if (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
            fail(
                f"{flag(flag_name)}: the checkpoint has observation/action sizes {ckpt['obs_dim']}/{ckpt['act_dim']}, "
                f"the env here {obs_dim}/{act_dim} (pass the env options it was trained with)",
                show,
            )
        theirs = (ckpt.get("env") or {}).get("observation")
        layout = layout or _plain(observation_layout(envs))
        if theirs is None or _plain(theirs) == layout:
            continue
        theirs = _plain(theirs)
        if theirs["flattened"] != layout["flattened"]:
            what = "observations were " + (
                "flattened into one vector, here they are not"
                if theirs["flattened"]
                else "not flattened, here they are"
            )
        elif theirs["leaves"] == layout["leaves"]:  # the same entries, other positions kept of the flat vector
            what = f"obs_indices kept {theirs.get('indices')} of the flat observation, here {layout.get('indices')}"
        else:
            n = max(len(theirs["leaves"]), len(layout["leaves"]))
            there, here = ([*leaves, *[None] * (n - len(leaves))] for leaves in (theirs["leaves"], layout["leaves"]))
            i = next(i for i in range(n) if there[i] != here[i])
            what = f"observation entry {i} is {_describe_leaf(there[i])} there, {_describe_leaf(here[i])} here"
        fail(f"{flag(flag_name)}: the checkpoint's {what} (pass the env options it was trained with)", show)
    return obs_dim, act_dim


PRIVILEGED_CRITIC_POLICY = "policy."
"""Where ppo_vla.py's ``--privileged-critic`` wrapper keeps the policy in its checkpoints ("critic." holds its MLP)."""


def without_privileged_critic(ckpt: dict | None, flag_name: str, path: str | None) -> dict | None:
    """``ckpt`` for a trainer that has no ``--privileged-critic`` (ppo_vla_ddp.py) but takes ppo_vla.py's checkpoints.
    One that ppo_vla.py wrote with that flag holds the policy's entries under "policy." and the trainer's critic MLP
    under "critic.": ``--eval-checkpoint`` gets the policy's entries alone (an evaluation runs only the actor, which
    is that policy; its frozen weights are compared under their names in the wrapper), ``--resume`` is refused in one
    line (the run would go on without the critic it trained, on the policy's own value head). Any other checkpoint
    (or None) is returned as it is."""
    if ckpt is None or not ckpt["args"].get("privileged_critic"):
        return ckpt
    if flag_name == "resume":
        fail(
            f"--resume {path} was trained with --privileged-critic, which only ppo_vla.py has: resume it with "
            "ppo_vla.py (--eval-checkpoint evaluates its actor here)"
        )
    prefix = PRIVILEGED_CRITIC_POLICY
    model = {k.removeprefix(prefix): v for k, v in ckpt["model"].items() if k.startswith(prefix)}
    return {**ckpt, "model": model, "frozen_prefix": prefix}


def load_model_state(module: torch.nn.Module, ckpt: dict, flag_name: str, path: str, show: bool = True) -> None:
    """Load a checkpoint's ``"model"`` (:func:`model_state`) into ``module``, built by the same factory: the
    entries it holds must be exactly the module's trainable parameters and buffers, and its frozen parameters
    must be the ones the checkpoint was trained on (``ckpt["frozen"]``, :func:`frozen_fingerprint`; checkpoints
    written before it was recorded hold every entry; ``ckpt["frozen_prefix"]``: see :func:`without_privileged_critic`);
    otherwise one line naming ``flag_name`` and ``path``."""
    if ckpt.get("frozen") is not None and ckpt["frozen"] != frozen_fingerprint(module, ckpt.get("frozen_prefix", "")):
        fail(
            f"{flag(flag_name)} {path}: the policy's frozen weights (e.g. a pretrained backbone) are not the ones this "
            "checkpoint was trained on; build them as that run did (the same --policy-kwargs model_path, --seed)",
            show,
        )
    ours = model_state(module) if ckpt.get("frozen") is not None else module.state_dict()
    shapes = [k for k, v in ckpt["model"].items() if k in ours and tuple(v.shape) != tuple(ours[k].shape)]
    if set(ckpt["model"]) != set(ours) or shapes:
        missing, extra = sorted(set(ours) - set(ckpt["model"])), sorted(set(ckpt["model"]) - set(ours))
        what = f"missing {missing[:3]}, unexpected {extra[:3]}" if missing or extra else f"other shapes of {shapes[:3]}"
        fail(f"{flag(flag_name)} {path}: the checkpoint's model does not fit the network built here ({what}); "
             f"{_misfit_cause(ckpt)}", show)  # fmt: skip
    module.load_state_dict(ckpt["model"], strict=False)


def _misfit_cause(ckpt: dict) -> str:
    """Why a checkpoint that passed :func:`load_checkpoint` can still not fit the network built from its flags."""
    policy = ckpt["args"].get("policy")
    if policy:
        return (f"--policy {policy} builds another network than the one that trained it (its code changed since, or "
                "it builds by --policy-kwargs or --seed)")  # fmt: skip
    if not isinstance(ckpt.get("trainer"), dict):
        return (f"it was written by a {ckpt['script']}.py from before checkpoints recorded their trainer's network "
                "(a copy whose network was changed?): use it with the file that wrote it")  # fmt: skip
    return "the network code outside the trainer file (shared/) changed since it was written"


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict, sharded: torch.nn.Module | None = None) -> None:
    """``optimizer.load_state_dict(state)``, keeping each learning rate the tensor it was (a compiled optimizer step
    reads it without recompiling when the schedule changes it); a checkpoint's plain float learning rate (older
    runs) is copied into that tensor. ``sharded``: the module (under FSDP) whose parameters the optimizer holds;
    ``state`` is then whole and keyed by parameter names (``shared.distributed.unsharded_state``), and every rank
    takes its shards of it."""
    lrs = [group["lr"] for group in optimizer.param_groups]
    if sharded is None:
        optimizer.load_state_dict(state)
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        # strict=False: a trainable parameter that never got a gradient (e.g. LoRA on a module the policy does not
        # use) has no optimizer state in the checkpoint, as in the run that wrote it; torch's strict check refuses it
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_optimizer_state_dict(sharded, optimizer, state, options=options)
    for group, lr in zip(optimizer.param_groups, lrs):
        if isinstance(lr, torch.Tensor):
            group["lr"] = lr.fill_(float(group["lr"]))
