"""Export a trained policy for a robot: one checkpoint in, files that run without this package out.

    uv run python cleanrl_embodied/export.py --checkpoint runs/<run>/checkpoints/best.pt --out exported/

The exported policy is the trainer's own deterministic evaluation action, nothing re-implemented: the trainer file
that wrote the checkpoint is imported (the path the checkpoint records, so a copy of a trainer exports its own
network; `--trainer` names the file where it has moved), its policy is built from the checkpoint's flags and weights,
and its
`eval_action(..., deterministic=True)` (observation normalizer, encoders, the Gaussian's mean; with a VLA trainer's
policy, `env_action(dist.mode)`: a bin's centre, a chunk of K actions) is wrapped in a module whose inputs are plain
tensors, one per observation entry the actor reads. That module is traced into

- `actor.pt`: TorchScript, loaded with `torch.jit.load` alone (no import of this package);
- `actor.onnx`: ONNX, run with onnxruntime (extra `export`: onnx, onnxscript, onnxruntime);
- `export.json`: the inputs (names, order, shapes, dtypes), the output, the action bounds, where it came from and
  the check below. It is also embedded in both files (TorchScript extra file, ONNX metadata).

Before writing export.json the command checks its work: on observations recorded from the checkpoint's env it runs
both files and compares their actions with the trainer's deterministic evaluation actions (one line if they differ).

A policy with a `save_pretrained` method (a VLA fine-tuned with LoRA, examples/hf_vla) is exported by that method
instead: the adapters merged into the backbone, a directory that transformers' `from_pretrained` (and the policy's
factory, `model_path`) loads. docs/export.md has the files' contents and a robot control loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import logging
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied import shared
from cleanrl_embodied.shared.checkpoints import observation_layout
from cleanrl_embodied.shared.trainer_file import PACKAGE_DIR, network_definitions, network_differences

FORMAT_VERSION = 1
"""export.json's `format_version`: raised when its meaning changes."""


@dataclass
class Args:
    checkpoint: str
    """a checkpoint a trainer wrote, e.g. runs/<run>/checkpoints/best.pt"""
    trainer: str | None = None
    """the trainer file that wrote it (its network is rebuilt from that file); default: the path the checkpoint
    records, else this package's trainer of the checkpoint's name. Its network code must be the writer's"""
    out: str = "exported"
    """folder the files are written to (created; files of an earlier export there are replaced)"""
    inputs: tuple[str, ...] | None = None
    """the observation entries the exported actor takes, in this order ('/'-joined key paths, e.g. rgb state
    instruction/input_ids instruction/attention_mask); default: exactly the entries the actor reads, in sorted key
    order. Each must be one the actor reads: a privileged (critic-only) entry is refused"""
    clip: bool = True
    """clip the action to the bounds of the policy's action space, as the env does with what it gets (--no-clip:
    the deterministic action as the trainer's evaluation computes it, before the env clips it)"""
    format: Literal["auto", "trace", "pretrained"] = "auto"
    """trace: actor.pt and actor.onnx; pretrained: the policy's own save_pretrained (a VLA: LoRA adapters merged);
    auto: pretrained for a policy with a save_pretrained method, trace otherwise"""
    onnx: bool = True
    """write actor.onnx besides actor.pt (needs the `export` extra: uv sync --extra export)"""
    check: bool = True
    """run the written files on observations recorded from the checkpoint's env and compare their actions with the
    trainer's deterministic evaluation actions (fails in one line if they differ)"""
    num_check_envs: int = 8
    """envs whose observations the check records (each of 4 steps: reset, then 3 random actions)"""
    seed: int = 0
    """seed of those envs and of their random actions"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    if not Path(args.checkpoint).is_file():
        shared.fail(f"--checkpoint: no such checkpoint file {args.checkpoint!r}")
    if args.num_check_envs < 2:  # the traced batch dimension must not be specialised to 1
        shared.fail(f"--num-check-envs must be >= 2, got {args.num_check_envs}")
    if args.inputs is not None and len(set(args.inputs)) != len(args.inputs):
        shared.fail(f"--inputs names an entry twice: {' '.join(args.inputs)}")
    if args.trainer is not None and not (Path(args.trainer).is_file() and args.trainer.endswith(".py")):
        shared.fail(f"--trainer: no such trainer file {args.trainer!r} (a .py file)")


# ---- the checkpoint's policy, rebuilt by its own trainer ----------------------------------------------------------
def import_trainer(path: Path):
    """The trainer file at `path` as a module: this package's trainers by their module name, any other file (a copy
    somewhere else) under a name of its own; its `main` does not run."""
    path = path.resolve()
    if path.parent == PACKAGE_DIR:
        return importlib.import_module(f"cleanrl_embodied.{path.stem}")
    name = f"trainer_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (a dataclass looks its module up while it is being built)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - whatever the file raises on import is the same failure
            del sys.modules[name]
            shared.fail(f"--trainer {path}: importing it failed ({first_line(e)})")
    return sys.modules[name]


def trainer_of(args: Args, ckpt: dict):
    """The module of the trainer file that wrote `ckpt`: --trainer, else the file it records, else this package's
    trainer of its name. Where the checkpoint records its network, the file's must be the same code."""
    recorded = ckpt.get("trainer") if isinstance(ckpt.get("trainer"), dict) else {}
    package_file = PACKAGE_DIR / f"{ckpt['script']}.py"
    there = recorded.get("path") or f"{ckpt['script']}.py"
    if args.trainer is not None:
        path, source = Path(args.trainer), f"--trainer {args.trainer}"
    elif recorded.get("path") and Path(recorded["path"]).is_file():
        path, source = Path(recorded["path"]), f"the file it records ({recorded['path']})"
    elif package_file.is_file():
        path, source = package_file, f"this package's {package_file.name}"
    else:
        shared.fail(f"--checkpoint {args.checkpoint}: written by {there}, which is not here; pass --trainer PATH, "
                    "the file that wrote it")  # fmt: skip
    if recorded.get("network"):
        differences = network_differences(recorded["network"], network_definitions(path.read_text()))
        if differences:
            shared.fail(f"--checkpoint {args.checkpoint}: written by {there}, whose network code is not that of "
                        f"{source}: {', '.join(differences)}; pass --trainer with the file that wrote it, as it was "
                        "then")  # fmt: skip
    module = import_trainer(path)
    for name in ("Args", "make_agent", "eval_action"):
        if not hasattr(module, name):
            shared.fail(f"--checkpoint {args.checkpoint}: {path} has no {name}; export needs a trainer's Args, "
                        "make_agent and eval_action")  # fmt: skip
    return module


def trainer_args(module, ckpt: dict):
    """The trainer's `Args` with the checkpoint's values (a flag the checkpoint does not know keeps its default;
    tuples come back as tuples whatever the file held)."""
    fields = {f.name for f in dataclasses.fields(module.Args)}
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items() if k in fields}
    return module.Args(**saved)


def build_policy(module, envs, targs) -> nn.Module:
    """The policy the trainer builds for `envs` (its `make_agent`), wrapped as ppo_vla.py wraps it under
    --privileged-critic (the critic's weights are in the checkpoint; no actor reads them). Nothing trains here: no
    value head is asked of the policy."""
    value_head = {"value_head": False} if "value_head" in inspect.signature(module.make_agent).parameters else {}
    agent = module.make_agent(envs, targs, **value_head)
    wrapper = getattr(module, "PrivilegedCritic", None)
    if wrapper is not None and getattr(targs, "privileged_critic", False):
        agent = wrapper(agent, envs.single_observation_space)
    return agent


def deterministic_action(module, agent: nn.Module) -> Callable:
    """obs -> the trainer's deterministic evaluation action (a VLA trainer's `eval_action` takes a `size`: the most
    rows of a forward pass, here all of them). A trainer with memory (its `eval_action` takes the actor's `memory`):
    (obs, memory) -> (action, memory after the step), no episode start inside (whoever runs the file zeroes the
    memory where an episode starts)."""
    parameters = inspect.signature(module.eval_action).parameters
    act = partial(module.eval_action, agent, generator=None, deterministic=True)
    if "memory" in parameters:
        return lambda obs, memory: act(obs, starts=torch.zeros_like(memory[:, 0], dtype=torch.bool), memory=memory)
    return partial(act, starts=None, **({"size": sys.maxsize} if "size" in parameters else {}))


def memory_size(agent: nn.Module, module) -> int:
    """The width of the actor's memory (`actor_state_size`) for a trainer with memory, else 0."""
    return int(agent.actor_state_size) if "memory" in inspect.signature(module.eval_action).parameters else 0


def actor_of(module, agent: nn.Module) -> nn.Module:
    """What acts: the agent, or under ppo_vla's --privileged-critic the policy its `PrivilegedCritic` wraps (that
    wrapper adds the trainer's critic MLP, which no actor reads, and passes on only the policy's `dist` and
    `env_action`): the policy's own methods (`save_pretrained`) and weights are what gets exported."""
    wrapper = getattr(module, "PrivilegedCritic", None)
    return agent.policy if wrapper is not None and isinstance(agent, wrapper) else agent


def policy_name(targs) -> str:
    return f"--policy {targs.policy}" if targs.policy else "the built-in agent"


# ---- observation entries ------------------------------------------------------------------------------------------
def entry_keys(space: gym.Space, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths of the leaves of an observation space in sorted order (the order the trainers concatenate them
    in); [()] for a plain Box (one tensor)."""
    if not isinstance(space, gym.spaces.Dict):
        return [prefix]
    return sorted(key for name, sub in space.spaces.items() for key in entry_keys(sub, (*prefix, name)))


def entry_name(key: tuple[str, ...]) -> str:
    """An entry's input name: its '/'-joined key path, "obs" for a plain observation tensor."""
    return "/".join(key) or "obs"


def get_entry(obs: torch.Tensor | TensorDict, key: tuple[str, ...]) -> torch.Tensor:
    return obs if key == () else obs.get(key)


def entries(obs: torch.Tensor | TensorDict, keys: list[tuple[str, ...]]) -> tuple[torch.Tensor, ...]:
    return tuple(get_entry(obs, k) for k in keys)


def leaf_space(space: gym.Space, key: tuple[str, ...]) -> gym.spaces.Box:
    for name in key:
        space = space.spaces[name]
    return space


def privileged_entries(agent: nn.Module) -> set[tuple[str, ...]]:
    """The observation entries the actor must never read (privileged, critic-only): what the policy declares in a
    `privileged_keys` attribute (key paths, '/'-joined strings or tuples). Empty when it declares none."""
    keys = getattr(agent, "privileged_keys", ()) or ()
    return {tuple(k.split("/")) if isinstance(k, str) else tuple(k) for k in keys}


def assemble(keys: list[tuple[str, ...]], entries: tuple[torch.Tensor, ...]) -> torch.Tensor | TensorDict:
    """Positional entries -> the observation the policy takes: the tensor itself for a plain observation, else a
    (nested) TensorDict of batch size [B]."""
    if keys == [()]:
        return entries[0]
    tree: dict = {}
    for key, value in zip(keys, entries):
        node = tree
        for name in key[:-1]:
            node = node.setdefault(name, {})
        node[key[-1]] = value
    return TensorDict(tree, batch_size=entries[0].shape[:1])


class DeterministicActor(nn.Module):
    """What the exported files hold: the observation entries `keys` as positional tensors [B, ...] -> the trainer's
    deterministic evaluation action [B, *action shape], clipped to [low, high] when `clip`. With a memory of
    `memory` columns, the last input is the actor's memory [B, memory] and the output (action, memory after it)."""

    def __init__(self, agent: nn.Module, act: Callable, keys: list, space: gym.spaces.Box, clip: bool, memory: int):
        super().__init__()
        self.agent, self.act, self.keys, self.clip, self.memory = agent, act, keys, clip, memory
        self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def clipped(self, action: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(action.float(), self.low), self.high) if self.clip else action.float()

    def forward(self, *inputs: torch.Tensor):
        if not self.memory:
            return self.clipped(self.act(assemble(self.keys, inputs)))
        action, memory = self.act(assemble(self.keys, inputs[:-1]), inputs[-1])
        return self.clipped(action), memory

    def example(self, obs) -> tuple[torch.Tensor, ...]:
        """The inputs for the observations `obs` (a zero memory: episodes that begin)."""
        first = entries(obs, self.keys)
        return first + ((torch.zeros(first[0].shape[0], self.memory),) if self.memory else ())


@contextlib.contextmanager
def quiet():
    """No deprecation or tracer warnings, progress lines, exporter logs or printed graphs (a failed torch.export prints
    its partial graph to stderr) while tracing and exporting: the check after writing is what tells whether the files
    are right, and a failure is one line."""
    names = ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx", "onnxscript")  # (torch.fx: symbolic shapes)
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def first_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # (no terminal colour codes in the line)
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def trace(actor: DeterministicActor, example: tuple[torch.Tensor, ...], who: str) -> torch.jit.ScriptModule:
    """`torch.jit.trace` of the actor, or one line naming the policy that cannot be traced."""
    try:
        with torch.no_grad(), quiet():
            return torch.jit.trace(actor, example, check_trace=False)
    except Exception as e:  # noqa: BLE001 - whatever the policy's code raises under tracing is the same failure
        shared.fail(f"{who} cannot be traced to TorchScript ({first_line(e)}); export needs a policy whose "
                    "deterministic action is tensor operations only (docs/export.md)")  # fmt: skip


def used_entries(traced: torch.jit.ScriptModule) -> list[bool]:
    """Which of the traced module's inputs its computation reads (graph inputs past `self` that have uses)."""
    return [bool(value.uses()) for value in list(traced.graph.inputs())[1:]]


def actor_reads(actor: DeterministicActor, obs, keys: list, who: str) -> list[tuple[str, ...]]:
    """The entries among `keys` whose values the traced actor's computation uses (the memory is not an entry)."""
    actor.keys = keys
    return [k for k, used in zip(keys, used_entries(trace(actor, actor.example(obs), who))) if used]


def choose_inputs(
    args: Args, actor: DeterministicActor, obs: torch.Tensor | TensorDict, all_keys: list, privileged: set, who: str
) -> list[tuple[str, ...]]:
    """The entries the exported actor takes: exactly the ones the traced actor reads (traced once with every entry
    of the observation), in sorted key order or in the order --inputs names them. An actor that reads a privileged
    entry is refused, and so is --inputs naming one, naming an entry the actor does not read or leaving out one it
    does."""
    reads = actor_reads(actor, obs, all_keys, who)
    leaks = [entry_name(k) for k in reads if k in privileged]
    if leaks:  # what the policy declares is checked, not trusted
        shared.fail(f"{who} reads the privileged entr{'ies' if len(leaks) > 1 else 'y'} {', '.join(leaks)} in its "
                    "action; the actor must never read one (the critic alone may)")  # fmt: skip
    if args.inputs is None:
        return reads or all_keys[:1]  # (an actor that reads nothing still takes a batch)
    names = {entry_name(k): k for k in all_keys}
    for name in args.inputs:
        if name not in names:
            shared.fail(f"--inputs {name}: the observation has no such entry (its entries: {', '.join(names)})")
        if names[name] in privileged:
            shared.fail(f"--inputs {name}: a privileged entry (critic only), which the actor never reads")
    asked = [names[name] for name in args.inputs]
    unread = [entry_name(k) for k in asked if k not in reads]
    if unread:
        shared.fail(f"--inputs {' '.join(unread)}: {who} does not read {'them' if len(unread) > 1 else 'it'}")
    missing = [entry_name(k) for k in reads if k not in asked]
    if missing:
        shared.fail(f"--inputs: {who} also reads {', '.join(missing)}; name every entry it reads")
    return asked


# ---- observations to check the files on --------------------------------------------------------------------------
def record_observations(envs, seed: int, steps: int = 4) -> torch.Tensor | TensorDict:
    """`steps` batches of observations: the reset's, then after random actions (uniform within finite bounds,
    standard normal where a bound is infinite), concatenated along the batch."""
    generator = torch.Generator().manual_seed(seed)
    space = envs.single_action_space
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (space.low, space.high))
    finite = torch.isfinite(low) & torch.isfinite(high)
    obs, _ = envs.reset(seed=seed)
    batches = [obs]
    for _ in range(steps - 1):
        u = torch.rand((envs.num_envs, *space.shape), generator=generator)
        z = torch.randn((envs.num_envs, *space.shape), generator=generator)
        action = torch.where(finite, low + u * (high - low).nan_to_num(), z)
        obs, *_ = envs.step(action)
        batches.append(obs)
    return torch.cat([b.cpu() for b in batches])


# ---- the description ------------------------------------------------------------------------------------------
def describe_input(key: tuple[str, ...], space: gym.spaces.Box, flat_layout: dict | None) -> dict:
    dtype = str(np.dtype(space.dtype))
    info = {"name": entry_name(key), "key": list(key), "shape": ["batch", *space.shape], "dtype": dtype}
    if dtype == "uint8" and len(space.shape) == 3:
        info["what"] = "image, channels first [C, H, W], values 0..255 as the env renders them"
    elif key[-1:] in (("input_ids",), ("attention_mask",)) and dtype == "int64":
        info["what"] = ("instruction tokens: UTF-8 byte b as id b + 1, 0 pads" if key[-1] == "input_ids"
                        else "instruction mask: 1 on the instruction's tokens, 0 on the padding")  # fmt: skip
    else:
        info["what"] = "float entries, raw as the env gives them (a --norm-obs normalizer is inside the actor)"
    if flat_layout is not None:  # a Dict observation the env flattened: where each entry sits in the vector
        offset, parts = 0, []
        for path, shape, leaf_dtype in flat_layout["leaves"]:
            size = int(np.prod(shape))
            parts.append({"key": path, "offset": offset, "size": size, "shape": shape, "dtype": leaf_dtype})
            offset += size
        info["layout"] = parts
        info["what"] = "the env's Dict observation flattened into one float vector (sorted key order, see layout)"
    return info


def describe(args: Args, ckpt: dict, targs, script: str, envs, space, keys: list | None, memory: int) -> dict:
    """export.json: what was written (traced: actor.pt and actor.onnx taking the entries `keys`; else the policy's
    save_pretrained), the inputs and output, the action's meaning and bounds, the source."""
    obs_space, layout = envs.single_observation_space, observation_layout(envs)
    flat = layout if layout["flattened"] else None
    head, chunk = getattr(targs, "action_head", "gaussian"), getattr(targs, "action_chunk", 1)
    decoding = (
        "mean of the Gaussian" if head == "gaussian" else f"centre of the most likely of {targs.action_bins} bins"
    )
    description = {"format_version": FORMAT_VERSION, "kind": "traced" if keys is not None else "save_pretrained"}
    if keys is not None:
        description["inputs"] = [describe_input(k, leaf_space(obs_space, k), flat) for k in keys]
        description["outputs"] = [{"name": "action", "shape": ["batch", *space.shape], "dtype": "float32"}]
        if memory:  # a policy with memory: its state goes in and comes out
            what = ("the actor's memory: zeros where an episode starts, else the next_memory of the step before "
                    f"(an {getattr(targs, 'rnn_type', 'rnn').upper()}'s state)")  # fmt: skip
            description["inputs"].append({"name": "memory", "shape": ["batch", memory], "dtype": "float32",
                                          "what": what})  # fmt: skip
            description["outputs"].append({"name": "next_memory", "shape": ["batch", memory], "dtype": "float32"})
    description["action"] = {
        "decoding": decoding + (f"; a chunk of {chunk} actions [K, D], to be run in order" if chunk > 1 else ""),
        "chunk": chunk,
        "low": np.asarray(space.low, dtype=np.float64).tolist(),
        "high": np.asarray(space.high, dtype=np.float64).tolist(),
        "clipped": args.clip if keys is not None else False,
        "space": "the policy's action space: for a Gymnasium id, make_env maps [-1, 1] linearly onto the env's own "
        "bounds (docs/export.md)",
    }
    description["normalization"] = "inside the actor, frozen" if getattr(targs, "norm_obs", False) else "none"
    description["source"] = {
        "checkpoint": str(args.checkpoint),
        "script": script,
        "trainer": {k: (ckpt.get("trainer") or {}).get(k) for k in ("path", "sha256")},
        "policy": targs.policy,
        "policy_kwargs": json.loads(targs.policy_kwargs),
        "env_id": targs.env_id,
        "env_kwargs": shared.EnvOptions(targs.env_id, targs.env_kwargs, targs.eval_env_kwargs).kwargs(True),
        "iteration": ckpt.get("iteration"),
        "global_step": ckpt.get("global_step"),
    }
    description["versions"] = {"torch": torch.__version__}
    return description


# ---- writing and checking -----------------------------------------------------------------------------------------
def write_onnx(actor: DeterministicActor, example: tuple[torch.Tensor, ...], path: Path, who: str, meta: str) -> None:
    """torch.export -> ONNX, every input's first dimension the batch, export.json in the model's metadata."""
    import onnx

    names = [entry_name(k) for k in actor.keys] + (["memory"] if actor.memory else [])
    outputs = ["action"] + (["next_memory"] if actor.memory else [])
    batch = torch.export.Dim("batch")
    try:
        with torch.no_grad(), quiet():
            torch.onnx.export(
                actor, example, str(path), dynamo=True, external_data=False, verbose=False, input_names=names,
                output_names=outputs, dynamic_shapes=(tuple({0: batch} for _ in names),),
            )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - any failure of torch.export or the ONNX translation
        shared.fail(f"{who} cannot be exported to ONNX ({first_line(e)}); --no-onnx writes actor.pt alone")
    model = onnx.load(str(path))
    model.metadata_props.add(key="export.json", value=meta)
    onnx.save(model, str(path))


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max()) if a.numel() else 0.0


def replay(run: Callable, keys: list, steps: list, memory: int) -> torch.Tensor:
    """The actions of an exported file (`run(*inputs)`) on the recorded `steps` [(obs, starts)], concatenated: with a
    memory, the file gets back the memory it returned at the step before, zeroed where an episode starts."""
    actions, state = [], None
    for obs, starts in steps:
        inputs = entries(obs, keys)
        if memory:
            state = torch.zeros(len(starts), memory) if state is None else torch.where(starts[:, None], 0.0, state)
            action, state = run(*inputs, state)
        else:
            action = run(*inputs)
        actions.append(action)
    return torch.cat(actions)


def check_files(out: Path, keys, steps: list, reference: torch.Tensor, onnx: bool, memory: int, who: str) -> dict:
    """Run the written files on the recorded steps (more rows than the trace saw, most of them other ones; with a
    memory, whole episodes step by step): the largest difference from the trainer's actions, or one line if a file
    fails or differs."""
    why = "a trace holds tensor operations only, not Python control flow on tensor values, .item() or numpy"

    def compare(what: str, run: Callable) -> float:
        try:
            diff = max_difference(replay(run, keys, steps, memory), reference)
        except Exception as e:  # noqa: BLE001 - e.g. a size the trace froze
            shared.fail(f"{who} cannot be traced: the {what} file fails on observations other than the traced "
                        f"ones ({first_line(e)}); {why}")  # fmt: skip
        if not diff <= 1e-4:
            shared.fail(f"{who} cannot be traced: the {what} file's actions differ from the trainer's deterministic "
                        f"evaluation actions by up to {diff:.3g} on recorded observations; {why}")  # fmt: skip
        return diff

    result = {"observations": int(reference.shape[0]), "torchscript_max_abs_diff": None, "onnx_max_abs_diff": None}
    if memory:
        result["steps"] = len(steps)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated in favour of torch.export
        traced = torch.jit.load(str(out / "actor.pt"))
        result["torchscript_max_abs_diff"] = compare("actor.pt", traced)
    if onnx:
        try:
            import onnxruntime
        except ImportError:
            result["onnx_max_abs_diff"] = "not checked: onnxruntime is not installed"
        else:
            session = onnxruntime.InferenceSession(str(out / "actor.onnx"), providers=["CPUExecutionProvider"])
            names = [entry_name(k) for k in keys] + (["memory"] if memory else [])

            def run(*inputs):
                got = [torch.from_numpy(y) for y in session.run(None, dict(zip(names, (x.numpy() for x in inputs))))]
                return tuple(got) if memory else got[0]

            result["onnx_max_abs_diff"] = compare("actor.onnx", run)
    return result


def export_pretrained(args: Args, agent: nn.Module, who: str, description: dict) -> None:
    """The policy's own `save_pretrained(out)` (examples/hf_vla: the backbone with the LoRA adapters merged, the
    tokenizer, the heads and vla_config.json), described in export.json."""
    if not callable(getattr(agent, "save_pretrained", None)):
        shared.fail(f"--format pretrained: {who} has no save_pretrained method; use --format trace")
    out = Path(args.out)
    with torch.no_grad():
        agent.save_pretrained(out)
    description["files"] = {"save_pretrained": sorted(p.name for p in out.iterdir() if p.name != "export.json")}
    description["load"] = (
        f'the policy\'s factory with --policy-kwargs \'{{"model_path": "{out}"}}\' (examples/hf_vla: the merged '
        "backbone through transformers' from_pretrained, then the tokenizer and heads)"
    )


def check_onnx_installed() -> None:
    """One line where the packages that write actor.onnx are missing."""
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        shared.fail(f"--onnx needs {' and '.join(missing)} (the `export` extra: uv sync --extra export); "
                    "--no-onnx writes actor.pt alone")  # fmt: skip


def write_traced(args: Args, actor: DeterministicActor, steps: list, reference, description: dict, who: str) -> None:
    """Trace the actor into actor.pt (and actor.onnx), export.json embedded, then check both on the recorded `steps`
    against the trainer's own actions `reference` (`description["check"]`). A failure removes what was written: no
    file is left behind that the check did not pass."""
    out = Path(args.out)
    example = actor.example(steps[0][0][: args.num_check_envs])  # traced on the first batch, checked on all steps
    traced = trace(actor, example, who)
    meta = json.dumps(description, indent=2)
    try:
        with quiet():
            torch.jit.save(traced, str(out / "actor.pt"), _extra_files={"export.json": meta})
        if args.onnx:
            write_onnx(actor, example, out / "actor.onnx", who, meta)
        if args.check:
            description["check"] = check_files(out, actor.keys, steps, reference, args.onnx, actor.memory, who)
    except BaseException:
        for name in ("actor.pt", "actor.onnx"):
            (out / name).unlink(missing_ok=True)
        raise


def record_episodes(envs, module, agent: nn.Module, memory: int, seed: int, after: int = 5, max_steps: int = 1000):
    """Whole episodes of the trainer's own deterministic evaluation (its `eval_action`, told where episodes start, as
    the evaluator tells it) on `envs` from a reset with `seed`, until every env has ended one and run `after` steps
    of the next (or `max_steps`): the steps [(obs, starts)] and the actions."""
    obs, _ = envs.reset(seed=seed)
    starts, ended = torch.ones(envs.num_envs, dtype=torch.bool), torch.zeros(envs.num_envs, dtype=torch.bool)
    state, steps, actions, left = torch.zeros(envs.num_envs, memory), [], [], after
    with torch.no_grad():
        for _ in range(max_steps):
            action, state = module.eval_action(agent, obs, None, starts, True, state)
            steps.append((obs.cpu(), starts.cpu()))
            actions.append(action.float().cpu())
            obs, _, terminated, truncated, _ = envs.step(action)
            starts = terminated | truncated
            ended |= starts
            left -= bool(ended.all())
            if left < 0:
                break
    return steps, torch.cat(actions)


def main(args: Args) -> dict:
    validate(args)
    ckpt = shared.load_checkpoint(args.checkpoint, "checkpoint", None, same={})  # any trainer's
    script = ckpt["script"]
    module = trainer_of(args, ckpt)
    targs = trainer_args(module, ckpt)
    # seeded as the trainer seeds before building its policy (a factory that draws frozen weights at random could
    # still draw others here: load_model_state then refuses the checkpoint in one line)
    torch.manual_seed(targs.seed)
    options = shared.EnvOptions(targs.env_id, targs.env_kwargs, targs.eval_env_kwargs, "sync")
    envs = shared.build_env(options, args.num_check_envs, args.seed, torch.device("cpu"), eval_envs=True)
    shared.check_env_sizes(envs, (ckpt, "checkpoint"))
    agent = build_policy(module, envs, targs)
    shared.load_model_state(agent, ckpt, "checkpoint", args.checkpoint)
    privileged = privileged_entries(agent)  # (what a wrapper's critic alone reads)
    agent = actor_of(module, agent).eval()
    who = policy_name(targs)
    space = module.action_space(envs, targs) if hasattr(module, "action_space") else envs.single_action_space  # [K, D]
    pretrained = args.format == "pretrained" or (
        args.format == "auto" and callable(getattr(agent, "save_pretrained", None))
    )
    if not pretrained and args.onnx:
        check_onnx_installed()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("actor.pt", "actor.onnx", "export.json"):  # nothing of an earlier export survives to mislead
        (out / name).unlink(missing_ok=True)
    if pretrained:
        description = describe(args, ckpt, targs, script, envs, space, None, 0)
        export_pretrained(args, agent, who, description)
    else:
        memory = memory_size(agent, module)
        all_keys = entry_keys(envs.single_observation_space)
        actor = DeterministicActor(agent, deterministic_action(module, agent), all_keys, space, args.clip, memory)
        if memory:  # the trainer's actions over whole episodes, step by step
            steps, reference = record_episodes(envs, module, agent, memory, args.seed)
        else:  # the trainer's actions on observations recorded under random actions, all at once
            steps = [(record_observations(envs, args.seed), None)]
            with torch.no_grad():
                reference = actor.act(steps[0][0]).float()
        reference = actor.clipped(reference)
        actor.keys = choose_inputs(args, actor, steps[0][0][: args.num_check_envs], all_keys, privileged, who)
        description = describe(args, ckpt, targs, script, envs, space, actor.keys, memory)
        description["files"] = {"torchscript": "actor.pt", "onnx": "actor.onnx" if args.onnx else None}
        write_traced(args, actor, steps, reference, description, who)
    envs.close()
    (out / "export.json").write_text(json.dumps(description, indent=2) + "\n")
    names = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"exported {script} checkpoint {args.checkpoint} ({who}) to {out}/: {names}", flush=True)
    return description


if __name__ == "__main__":
    main(tyro.cli(Args))
