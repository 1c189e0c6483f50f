"""Tiny Args for the trainers, written once for the tests that run them.

A test's sizes are part of what it tests (its asserts count the steps, iterations and minibatches they make), so
each test keeps its own numbers: the size sets below (EIGHT_ENVS, FOUR_ENVS, TWO_SAVED_ITERATIONS, TWO_ENVS) hold the
values that several test files share, and a test adds to or overrides one, e.g.
``tiny_args("ppo_ddp", tmp_path, EIGHT_ENVS, total_timesteps=160)``.

- `tiny_args`: a trainer's Args from a size set and overrides, `fit` to the trainer.
- `fit`: a size set adapted to a trainer the way each test used to by hand: GRPO (grpo, grpo_vla) needs a group
  size, 2 unless the test gives one; a VLA trainer (ppo_vla, ppo_vla_ddp, ppo_vla_async, grpo_vla) has no network of
  its own, so no ``hidden_sizes`` (`without_network`), and its policy is tests/toy_policies.py's ``ToyVLA`` unless
  the test names another.
- `trainer`, `trainers`, `is_vla`: the trainer modules by name, and which of them are VLA trainers.
- `cli_flags`: such a dict as a trainer's command line, for the tests that run a trainer as a subprocess."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

TOY_VLA = "toy_policies:ToyVLA"  # a VLA trainer's policy in the tests (tests/toy_policies.py, no transformers)

# One trainer of each kind: single-process PPO, PPO over DDP ranks (a world of one in-process), a VLA trainer
# (the asynchronous one, on ToyVLA) and GRPO.
ONE_OF_EACH_KIND = ("ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo")

# 8 envs x 10 steps (80 env steps an iteration), 2 epochs of 2 minibatches, a 32 x 32 network, 4 eval episodes on 4
# envs. The test adds how many steps it runs.
EIGHT_ENVS = dict(num_envs=8, num_steps=10, num_minibatches=2, update_epochs=2, num_eval_envs=4, num_eval_episodes=4,
                  hidden_sizes=(32, 32), cuda=False)  # fmt: skip

# 4 envs in 2 minibatches, 2 eval episodes on 2 envs. The test adds its steps, epochs and network.
FOUR_ENVS = dict(num_envs=4, num_minibatches=2, num_eval_envs=2, num_eval_episodes=2, cuda=False)

# Two iterations of PushCubeRL (4 envs x 5 steps), a checkpoint after each, no evaluation during the run.
TWO_SAVED_ITERATIONS = dict(
    FOUR_ENVS, num_steps=5, update_epochs=1, hidden_sizes=(8, 8), eval_freq=0, save_freq=1, total_timesteps=2 * 20
)

# A smoke run on a real simulator (MuJoCo, EnvPool, ManiSkill): 2 envs, a 16 x 16 network, one eval episode. The test
# adds the env, its steps and epochs.
TWO_ENVS = dict(num_envs=2, hidden_sizes=(16, 16), num_eval_envs=1, num_eval_episodes=1, cuda=False)


def trainer(name: str | ModuleType) -> ModuleType:
    """The trainer module ``cleanrl_embodied.<name>`` (given a module, that module)."""
    return name if isinstance(name, ModuleType) else importlib.import_module(f"cleanrl_embodied.{name}")


def trainers(names) -> dict[str, ModuleType]:
    """``{name: trainer module}`` for ``names``, in their order."""
    return {name: trainer(name) for name in names}


def is_vla(name: str | ModuleType) -> bool:
    """Whether the trainer has no network of its own (a VLA trainer: it takes its policy from --policy)."""
    return "hidden_sizes" not in trainer(name).Args.__dataclass_fields__


def without_network(config: dict) -> dict:
    """``config`` without ``hidden_sizes``, for a VLA trainer (it has no network of its own)."""
    return {k: v for k, v in config.items() if k != "hidden_sizes"}


def fit(name: str | ModuleType, config: dict, group_size: int = 2) -> dict:
    """``config`` for this trainer: GRPO's ``group_size`` added unless given; for a VLA trainer, ``hidden_sizes``
    left out and the policy ``ToyVLA`` unless ``config`` names one."""
    fields = trainer(name).Args.__dataclass_fields__
    config = {"group_size": group_size, **config} if "group_size" in fields else dict(config)
    if is_vla(name):
        config = {"policy": TOY_VLA, **without_network(config)}
    return config


def tiny_args(name: str | ModuleType, output_dir: str | Path, sizes: dict, default_group_size: int = 2, **overrides):
    """The trainer's Args for a run under ``output_dir``: ``sizes`` with ``overrides`` on top, `fit` to it (GRPO's
    groups of ``default_group_size`` where neither gives a ``group_size``)."""
    return trainer(name).Args(output_dir=str(output_dir), **fit(name, {**sizes, **overrides}, default_group_size))


def cli_flags(config: dict) -> list[str]:
    """An Args dict as command-line flags (tyro's spelling: ``--num-envs 8``, ``--no-cuda``, ``--hidden-sizes 8 8``)."""
    flags = []
    for key, value in config.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(name if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, tuple):
            flags += [name, *map(str, value)]
        else:
            flags += [name, str(value)]
    return flags
