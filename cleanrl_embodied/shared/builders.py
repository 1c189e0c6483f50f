"""Building what the flags name: the envs (`EnvOptions`, `build_env`) and a `--policy module:factory` module
(`build_policy`). Every helper here takes values; a bad value ends in one line naming the flag that carried it."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from cleanrl_embodied.shared.cli import fail, flag
from cleanrl_embodied.shared.envs import RANDOMIZATION_KWARGS, make_env

__all__ = ["EnvOptions", "build_env", "build_policy", "load_factory"]


@dataclass(frozen=True)
class EnvOptions:
    """The env flags of a run, as given: ``--env-id``, ``--env-kwargs`` and ``--eval-env-kwargs`` (JSON objects) and
    ``--env-vectorization``. The training envs are built with ``--env-kwargs``; the eval envs inherit them except the
    keys that randomize or disturb the env (``RANDOMIZATION_KWARGS``: evaluation measures the nominal task), then
    ``--eval-env-kwargs`` overrides or adds keys (a randomization key named there applies)."""

    env_id: str
    env_kwargs: str = "{}"
    eval_env_kwargs: str = "{}"
    vectorization: str = "sync"

    def kwargs(self, eval_envs: bool) -> dict:
        """The keyword arguments the training envs (``eval_envs`` False) or the eval envs are built with."""
        own = json.loads(self.env_kwargs)
        if not eval_envs:
            return own
        inherited = {k: v for k, v in own.items() if k not in RANDOMIZATION_KWARGS}
        return {**inherited, **json.loads(self.eval_env_kwargs)}


def build_env(options: EnvOptions, num_envs: int, seed: int, device: torch.device, eval_envs: bool, like=None):
    """``make_env(options.env_id, ...)`` with the training or the eval envs' kwargs (:meth:`EnvOptions.kwargs`); a bad
    keyword argument becomes one line naming the flag(s) that carried it, an id the trainers cannot serve one line
    naming ``--env-id``. ``like``: envs (the eval envs) whose observation and action spaces these must have, since
    one policy acts in both."""
    kwargs = options.kwargs(eval_envs)
    flags = "--eval-env-kwargs" if eval_envs else "--env-kwargs"
    if eval_envs and set(kwargs) - set(json.loads(options.eval_env_kwargs)):
        flags = "--env-kwargs (inherited by the eval envs) / --eval-env-kwargs"
    try:
        envs = make_env(
            options.env_id, num_envs=num_envs, device=device, seed=seed, vectorization=options.vectorization, **kwargs
        )
    except (TypeError, ValueError) as e:  # the kwargs are named only where there are some to blame
        fail(f"{flags} / --env-id {options.env_id}: {e}" if kwargs else f"--env-id {options.env_id}: {e}")
    for name in ("single_observation_space", "single_action_space") if like is not None else ():
        if getattr(envs, name) != getattr(like, name):
            fail(
                f"--env-kwargs and --eval-env-kwargs give envs of different {name.split('_')[1]} spaces "
                f"({getattr(envs, name)} vs {getattr(like, name)}): one policy acts in both, and the eval envs "
                f"inherit --env-kwargs, so leave options that change them (e.g. obs_mode, image_size, action_mode) "
                f"out of --eval-env-kwargs"
            )
    return envs


def load_factory(spec: str, flag_name: str) -> Callable:
    """``module:attribute`` -> the attribute (after importing the module), or one line naming the flag."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        fail(f"{flag(flag_name)} must be module:factory (e.g. my_lab.policies:make_agent), got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        fail(f"{flag(flag_name)} {spec}: cannot import {module_name!r} ({e}); is it installed or on PYTHONPATH?")
    factory = getattr(module, attr, None)
    if not callable(factory):
        fail(f"{flag(flag_name)} {spec}: {module_name} has no callable {attr!r}")
    return factory


def build_policy(
    spec: str, policy_kwargs: str, obs_space, act_space, args: Any, needs: Iterable[str]
) -> torch.nn.Module:
    """The module ``--policy module:factory`` builds: ``factory(obs_space, act_space, args, **policy_kwargs)``
    (``policy_kwargs``: the JSON object of ``--policy-kwargs``; ``args``, the trainer's Args, is what the policy
    contract hands a factory); one line if it is not an ``nn.Module`` or lacks one of ``needs`` (the methods and
    attributes the trainer uses)."""
    factory = load_factory(spec, "policy")
    module = factory(obs_space, act_space, args, **json.loads(policy_kwargs))
    if not isinstance(module, torch.nn.Module):
        fail(f"--policy {spec}: the factory must return a torch.nn.Module, got {type(module).__name__}")
    # every nn.Module has a `forward` attribute (one that raises): only a class's own counts as provided
    missing = [
        name
        for name in needs
        if not hasattr(module, name) or (name == "forward" and type(module).forward is torch.nn.Module.forward)
    ]
    if missing:
        fail(f"--policy {spec}: the module lacks {', '.join(missing)} (docs/policies.md: what a policy provides)")
    return module
