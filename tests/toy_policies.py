"""Policy factories for ``--policy toy_policies:<name>`` in tests: the trainers' own agents with a fault
or a delay added, built through the public policy hook instead of replacing a script's globals."""

from __future__ import annotations

import copy
import importlib
import math
import os
import signal
import threading
import time

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from cleanrl_embodied.shared.observations import float_dim, float_entries


def _agent_class(args):
    """The Agent of the trainer these args belong to (ppo_continuous.Args -> ppo_continuous.Agent; grpo.py's Actor);
    for the VLA trainers, which have no network of their own, `ToyVLA`. All are built from (obs_space, act_space,
    args)."""
    module = importlib.import_module(type(args).__module__)
    return getattr(module, "Agent", None) or getattr(module, "Actor", None) or ToyVLA


def _mlp(in_dim: int, hidden: int, out_dim: int, out_std: float) -> torch.nn.Sequential:
    last = torch.nn.Linear(hidden, out_dim)
    torch.nn.init.orthogonal_(last.weight, out_std)
    torch.nn.init.zeros_(last.bias)
    return torch.nn.Sequential(torch.nn.Linear(in_dim, hidden), torch.nn.Tanh(), last)


class ToyVLA(torch.nn.Module):
    """A stand-in for a VLA in the VLA trainers' tests (``--policy toy_policies:ToyVLA``), with no transformers in it:
    Tanh MLPs on the observation's float entries (images and instruction tokens are ignored), an actor over the
    action space the trainer gives (one action [D], or a chunk [K, D]) that is a Gaussian with a state-independent
    log-std or, with ``--action-head bins``, examples.action_bins' `Bins` over ``--action-bins`` bins per entry, and a
    separate critic. Its parts are named like the classic trainers' Agent (actor_mean, actor_logstd, actor_logits,
    critic)."""

    def __init__(self, obs_space, act_space, args, hidden: int = 16, init_logstd: float = -0.5):
        super().__init__()
        features = float_dim(obs_space)
        self.action_shape, self.bins = act_space.shape, args.action_bins if args.action_head == "bins" else 0
        entries = math.prod(self.action_shape)
        self.critic = _mlp(features, hidden, 1, 1.0)
        if self.bins:
            from examples.action_bins import bin_bounds

            self.actor_logits = _mlp(features, hidden, entries * self.bins, 0.01)
            low, high = bin_bounds(act_space, self.bins)
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)
        else:
            self.actor_mean = _mlp(features, hidden, entries, 0.01)
            self.actor_logstd = torch.nn.Parameter(torch.full((1, entries), float(init_logstd)))
        self._built = [copy.deepcopy(self).requires_grad_(False)]  # (a list: not a submodule, not in the state dict)

    def reference_dist(self, obs):
        """GRPO's KL reference: the policy as built (the same seed builds the same one again on a resume), as a LoRA
        policy's reference is its base with the adapters off."""
        built = self._built[0].to(next(self.parameters()).device)
        return built.dist(obs)

    def _dist(self, state: torch.Tensor) -> torch.distributions.Distribution:
        if self.bins:
            from examples.action_bins import Bins

            return Bins(self.actor_logits(state).view(-1, *self.action_shape, self.bins))
        mean = self.actor_mean(state).float()
        std = self.actor_logstd.expand_as(mean).exp()
        shape = (-1, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)

    def forward(self, obs):
        state = float_entries(obs)
        return self._dist(state), self.critic(state).squeeze(-1).float()

    def dist(self, obs):
        return self._dist(float_entries(obs))

    def get_value(self, obs):
        return self.critic(float_entries(obs)).squeeze(-1).float()

    def value_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.critic.parameters())

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        if not self.bins:
            return action
        from examples.action_bins import decode_bins

        return decode_bins(action, self.action_low, self.action_high, self.bins)


BATCHES: list[tuple[str, int]] = []
"""(method, rows) of every forward pass of a `batch_sizes` policy: forward, dist, get_value, reference_dist."""


def batch_sizes(obs_space, act_space, args):
    """`ToyVLA` recording the number of observations of each forward pass into `BATCHES` (what --micro-batch-size
    must bound)."""

    class Counted(ToyVLA):
        def forward(self, obs):
            BATCHES.append(("forward", obs.shape[0]))
            return super().forward(obs)

        def dist(self, obs):
            BATCHES.append(("dist", obs.shape[0]))
            return super().dist(obs)

        def get_value(self, obs):
            BATCHES.append(("get_value", obs.shape[0]))
            return super().get_value(obs)

        def reference_dist(self, obs):
            BATCHES.append(("reference_dist", obs.shape[0]))
            return super().reference_dist(obs)

    return Counted(obs_space, act_space, args)


def _with_hook(args, hook, obs_space, act_space):
    """The trainer's Agent with ``hook(agent)`` called at every action-distribution call: ``dist`` (evaluation,
    GRPO) and ``forward`` (the PPO trainers' rollout and loss; ppo_recurrent's ``step``, ``actor_step`` and
    ``unroll``); ``hook`` may replace the distribution."""
    base = _agent_class(args)

    class Hooked(base):
        def dist(self, obs):
            return hook(self, super().dist(obs))

    if base.forward is not torch.nn.Module.forward:  # the PPO agents' one-pass forward

        def forward(self, obs):
            dist, value = base.forward(self, obs)
            return hook(self, dist), value

        Hooked.forward = forward
    if hasattr(base, "unroll"):  # ppo_recurrent's Agent: its rollout step, evaluation step and the update's replay

        def step(self, obs, state, starts):
            dist, value, state = base.step(self, obs, state, starts)
            return hook(self, dist), value, state

        def actor_step(self, obs, memory):
            dist, memory = base.actor_step(self, obs, memory)
            return hook(self, dist), memory

        def unroll(self, obs, starts, state):
            dist, value = base.unroll(self, obs, starts, state)
            return hook(self, dist), value

        Hooked.step, Hooked.actor_step, Hooked.unroll = step, actor_step, unroll
    return Hooked(obs_space, act_space, args)


def nan_loss_every(obs_space, act_space, args, every: int = 3):
    """An Agent whose every ``every``-th training forward (grad enabled) gives NaN action means, so that
    minibatch's loss is NaN; rollouts and evaluations (no grad) stay finite."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] % every == 0:
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d

    return _with_hook(args, hook, obs_space, act_space)


FAILED_ONCE: set[str] = set()


def fail_in_update(obs_space, act_space, args, at_call: int = 5, once: bool = False):
    """An Agent that raises RuntimeError at its ``at_call``-th training forward (inside an update). With
    ``once``, only the first run of this process that reaches that call fails (later runs with the same
    --policy, e.g. a resume, which must name the same policy, train normally)."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == at_call and not (once and "fail_in_update" in FAILED_ONCE):
                FAILED_ONCE.add("fail_in_update")
                raise RuntimeError("injected failure inside the update")
        return d

    return _with_hook(args, hook, obs_space, act_space)


def sigint_in_update(obs_space, act_space, args, at_call: int = 5):
    """An Agent that sends Ctrl-C (SIGINT) to its own process at its ``at_call``-th training forward."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == at_call:
                os.kill(os.getpid(), signal.SIGINT)
        return d

    return _with_hook(args, hook, obs_space, act_space)


def slow(obs_space, act_space, args, rollout_ms: float = 0.0, update_ms: float = 0.0):
    """An Agent that sleeps ``rollout_ms`` per inference call (no grad) and ``update_ms`` per training
    forward: a stand-in for a large model's latency."""

    def hook(agent, d):
        time.sleep((update_ms if torch.is_grad_enabled() else rollout_ms) / 1000)
        return d

    return _with_hook(args, hook, obs_space, act_space)


RECORDS: list[tuple[str, bool, float]] = []
"""(thread name, grad enabled, parameter fingerprint) of every call of a `recording` agent."""


def fingerprint(module: torch.nn.Module) -> float:
    return float(sum(t.double().sum() for t in module.state_dict().values()))


def recording(obs_space, act_space, args, rollout_ms: float = 0.0, update_ms: float = 0.0):
    """An Agent that records, at every action-distribution call, which thread called it, whether it was a
    training forward, and a fingerprint of the weights it acted with (into RECORDS, in call order); then it sleeps
    ``rollout_ms`` (inference) or ``update_ms`` (training forward)."""

    def hook(agent, d):
        RECORDS.append((threading.current_thread().name, torch.is_grad_enabled(), fingerprint(agent)))
        time.sleep((update_ms if torch.is_grad_enabled() else rollout_ms) / 1000)
        return d

    return _with_hook(args, hook, obs_space, act_space)


def without_forward(obs_space, act_space, args):
    """A module with `dist` and `get_value` but no `forward` of its own (what the PPO trainers call per step)."""
    inner = _agent_class(args)(obs_space, act_space, args)

    class NoForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def dist(self, obs):
            return self.inner.dist(obs)

        def get_value(self, obs):
            return self.inner.get_value(obs)

    return NoForward()


def nan_loss_after(obs_space, act_space, args, after: int = 4):
    """An Agent whose training forwards (grad enabled) give NaN action means from the ``after + 1``-th on, so every
    optimizer step after the first ``after`` is skipped; rollouts and evaluations stay finite."""
    calls = [0]

    def hook(agent, d):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] > after:
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d

    return _with_hook(args, hook, obs_space, act_space)


# ---- probes: agents that act in a known way and record what the trainer feeds them --------------------------
class PointMass:
    """A distribution that always gives ``mean`` (any shape [B, A]): ``sample()`` and ``mean`` are it, its
    ``stddev`` is 0 and its log-prob and entropy are 0, tied to ``anchor`` so that a loss built from them has a
    gradient (zero). A policy acting with it is deterministic and its PPO ratio is exactly 1."""

    def __init__(self, mean: torch.Tensor, anchor: torch.Tensor):
        self.mean, self.stddev, self._tie = mean, torch.zeros_like(mean), 0.0 * anchor.sum()
        self.mode = mean  # what deterministic evaluation acts with

    def sample(self, sample_shape=(), generator: torch.Generator | None = None) -> torch.Tensor:
        return self.mean.clone()  # (a generator, as the VLA trainers' `sample_with` passes one, draws nothing)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(action) + self._tie

    def entropy(self) -> torch.Tensor:
        return torch.zeros_like(self.mean) + self._tie


PROBE: dict = {}
"""What a `still` agent saw: ``rollout`` (the observations of every no-grad action call on a batch of
``num_envs``, in call order) and, of its first training forward, ``obs``, ``value`` and ``value_grad`` (the
gradient of the loss with respect to each sample's value)."""


def still(obs_space, act_space, args, action: float = 0.0, value_scale: float | None = None, value_index: int = 0):
    """The trainer's Agent (GRPO: its Actor) acting ``action`` in every dimension, always (a point mass, see
    `PointMass`). Its V(obs) (PPO trainers) is ``value_scale * obs[:, value_index]`` (plus 0 times its critic, for
    a gradient path), or with ``value_scale`` None its own critic. It records into `PROBE` (cleared by the caller)."""
    base = _agent_class(args)

    class Still(base):
        def _point(self, obs):
            mean = torch.full((obs.shape[0], act_space.shape[0]), float(action), device=obs.device)
            if not torch.is_grad_enabled() and obs.shape[0] == args.num_envs:
                PROBE.setdefault("rollout", []).append(obs.detach().clone())
            return PointMass(mean, self.actor_logstd)

        def _value(self, obs):
            critic = super().get_value(obs)
            return critic if value_scale is None else value_scale * obs[:, value_index] + 0.0 * critic

        def dist(self, obs):
            return self._point(obs)

        def get_value(self, obs):
            return self._value(obs)

        def forward(self, obs):
            value = self._value(obs)
            if torch.is_grad_enabled() and "obs" not in PROBE:
                PROBE.update(obs=obs.detach().clone(), value=value.detach().clone())
                value.register_hook(lambda grad: PROBE.__setitem__("value_grad", grad.detach().clone()))
            return self._point(obs), value

    return Still(obs_space, act_space, args)


def still_recurrent(
    obs_space,
    act_space,
    args,
    action: float = 0.0,
    value_scale: float = 1.0,
    value_index: int = 0,
    count_scale: float = 1.0,
):
    """`still` for ppo_recurrent.py, with a memory whose content is known: the first column of the critic's memory
    counts the observations of the episode so far (zeroed where an episode starts, then one more at every step), and
    V(obs, memory) is ``value_scale * obs[:, value_index] + count_scale * count`` (count: the observations before this
    one in its episode), so a return target shows which memory the trainer valued an observation with. It records
    into `PROBE` like `still` (``obs``, ``value``, ``value_grad`` of the first training forward, in the order the
    update replays them: time-major over the minibatch's envs)."""
    base = _agent_class(args)

    class StillRecurrent(base):
        def _value(self, obs, state, starts):
            count = torch.where(starts, 0.0, state[:, self.actor_state_size])
            critic = self.critic(torch.zeros(obs.shape[0], self.critic[0].in_features, device=obs.device))
            value = value_scale * obs[:, value_index] + count_scale * count + 0.0 * critic.squeeze(-1)
            after = torch.where(starts[:, None], 0.0, state).clone()
            after[:, self.actor_state_size] = count + 1
            return value, after

        def _point(self, obs):
            mean = torch.full((obs.shape[0], act_space.shape[0]), float(action), device=obs.device)
            if not torch.is_grad_enabled() and obs.shape[0] == args.num_envs:
                PROBE.setdefault("rollout", []).append(obs.detach().clone())
            return PointMass(mean, self.actor_logstd)

        def actor_step(self, obs, memory):
            return self._point(obs), memory

        def step(self, obs, state, starts):
            value, after = self._value(obs, state, starts)
            return self._point(obs), value, after

        def get_value(self, obs, state, starts):
            return self._value(obs, state, starts)[0]

        def unroll(self, obs, starts, state):
            values = []
            for t in range(starts.shape[0]):
                value, state = self._value(obs[t], state, starts[t])
                values.append(value)
            value, flat = torch.cat(values), obs.flatten(0, 1)
            if torch.is_grad_enabled() and "obs" not in PROBE:
                PROBE.update(obs=flat.detach().clone(), value=value.detach().clone())
                value.register_hook(lambda grad: PROBE.__setitem__("value_grad", grad.detach().clone()))
            return PointMass(torch.full((flat.shape[0], act_space.shape[0]), float(action)), self.actor_logstd), value

    return StillRecurrent(obs_space, act_space, args)


OBSERVED: list[tuple[bool, torch.Tensor]] = []
"""(grad enabled, observations) of every action-distribution call of an `observing` agent."""


def observing(obs_space, act_space, args):
    """The trainer's own Agent (or GRPO Actor), recording every observation batch it is asked to act on."""
    base = _agent_class(args)

    class Observing(base):
        def dist(self, obs):
            OBSERVED.append((torch.is_grad_enabled(), obs.detach().clone()))
            return super().dist(obs)

    if base.forward is not torch.nn.Module.forward:

        def forward(self, obs):
            OBSERVED.append((torch.is_grad_enabled(), obs.detach().clone()))
            return base.forward(self, obs)

        Observing.forward = forward
    return Observing(obs_space, act_space, args)


GRAD_NORMS: list[float] = []
"""At every optimizer step over a `grad_norms` agent's parameters: the norm of the gradient that step uses (after
clipping)."""


def grad_norms(obs_space, act_space, args):
    """The trainer's own Agent (or GRPO Actor), recording into `GRAD_NORMS` the gradient norm of every optimizer step
    over its parameters (through torch.optim's global step pre-hook, which sees what the step is about to use)."""
    agent = _agent_class(args)(obs_space, act_space, args)
    mine = set(agent.parameters())

    def before_step(optimizer, *_):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if params and all(p in mine for p in params):
            grads = [p.grad.flatten() for p in params if p.grad is not None]
            GRAD_NORMS.append(float(torch.linalg.vector_norm(torch.cat(grads))))

    register_optimizer_step_pre_hook(before_step)
    return agent


def own_reference(obs_space, act_space, args):
    """grpo's Actor keeping a frozen copy of its initial self as its KL reference (``reference_dist``), as a LoRA
    policy keeps its base (adapters off): grpo then needs no copy of the policy."""
    base = _agent_class(args)

    class OwnReference(base):
        def __init__(self, *spaces_and_args):
            super().__init__(*spaces_and_args)
            self.initial = copy.deepcopy(self).requires_grad_(False)

        def reference_dist(self, obs):
            return self.initial.dist(obs)

    return OwnReference(obs_space, act_space, args)


def frozen_backbone(obs_space, act_space, args, width: int = 256):
    """The trainer's Agent plus a frozen ``width x width`` layer (``requires_grad`` off), standing in for a large
    pretrained backbone that is not trained (e.g. a VLA fine-tuned with LoRA): its weights never change."""
    agent = _agent_class(args)(obs_space, act_space, args)
    agent.backbone = torch.nn.Linear(width, width).requires_grad_(False)
    return agent


EVAL_PLAN: list[tuple[float, float]] = []
"""The mean actions of the next evaluations (one entry each, consumed in order) of a `scripted_eval` agent."""


def scripted_eval(obs_space, act_space, args):
    """The trainer's own Agent (or GRPO Actor), except that each evaluation call (no grad, a batch of
    ``num_eval_envs``, one per evaluation on ``Echo-v0``) acts with the next `EVAL_PLAN` entry for every env."""

    def hook(agent, d):
        if not torch.is_grad_enabled() and d.mean.shape[0] == args.num_eval_envs:
            mean = d.mean.new_tensor(EVAL_PLAN.pop(0)).expand_as(d.mean)
            return PointMass(mean, agent.actor_logstd)
        return d

    return _with_hook(args, hook, obs_space, act_space)


TRAIN_CALLS: list[int] = [0]
"""Training forwards (grad enabled) of the `on_rank` agents of this process."""


def on_rank(obs_space, act_space, args, rank: int, fault: str, at_call: int = 1):
    """The trainer's own Agent, counting its training forwards (`TRAIN_CALLS`); in the process of ``rank``
    (``RANK`` in the environment) it misbehaves at its ``at_call``-th training forward: ``exit`` (the process
    dies), ``hang`` (it sleeps for an hour), ``sigint`` (Ctrl-C to itself), ``nan`` (a NaN loss), or from then
    on ``kl`` (action means shifted by 3: a large approximate KL on this rank alone)."""
    here = int(os.environ.get("RANK", 0)) == rank

    def hook(agent, d):
        if not torch.is_grad_enabled():
            return d
        TRAIN_CALLS[0] += 1
        if not here or TRAIN_CALLS[0] < at_call:
            return d
        if fault == "kl":
            return torch.distributions.Normal(d.mean + 3.0, d.stddev, validate_args=False)
        if TRAIN_CALLS[0] == at_call:
            if fault == "exit":
                os._exit(3)
            if fault == "hang":
                print(f"hanging from {time.time()}", flush=True)
                time.sleep(3600)
            if fault == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
            if fault == "nan":
                return torch.distributions.Normal(d.mean * float("nan"), d.stddev, validate_args=False)
        return d

    return _with_hook(args, hook, obs_space, act_space)
