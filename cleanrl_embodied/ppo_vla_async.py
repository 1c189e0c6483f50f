"""Asynchronous PPO: a collector thread steps the envs while the learner updates, in one file.

    uv run python cleanrl_embodied/ppo_async.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_async.py --policy my_lab.vla:make_agent --policy-kwargs '{"path": "v.pt"}'

For policies whose inference is slow (vision-language-action models at 100 ms a step and more), stepping
the envs and updating the network one after the other leaves each side idle half the time. Here a
`Collector` thread keeps collecting rollout j+1 while the learner (the main thread) trains on rollout j.
What keeps it correct:

- The collector acts with an *inference copy* of the agent (and of its observation normalizer). It gets the
  whole agent once, then is refreshed by `load_state_dict` from a snapshot the learner published, only between
  rollouts, so it never changes during a rollout and the learner never writes to a module the collector reads.
  A snapshot holds only what can change (trainable parameters and buffers such as the normalizer's statistics):
  a frozen pretrained backbone is copied once, not into each of the K + 1 snapshots kept.
- Rollout j is collected with exactly the snapshot the learner published after consuming j - K rollouts
  (K = --max-staleness); the collector waits rather than run further ahead. Every transition carries the
  policy version that produced it; the learner drops (and counts) a rollout older than K versions, and its
  PPO ratio is taken against the behaviour log-prob stored with the data, so K-version-old data stays a
  correct importance-sampled PPO step. Values are recomputed by the learner's current critic.
- All counters (global_step, episodes, versions) change in the learner only, after the update they count;
  logging, evaluation and checkpoints happen there, with the collector paused at a rollout boundary, so a
  checkpoint always holds both sides at one consistent point. Ctrl-C or SIGTERM stops both threads and writes last.pt
  and summary.json; an exception on either side stops both and writes summary.json, but never overwrites
  the last consistent last.pt with a state that could not be resumed exactly.
- Each side has its own random stream (the collector a torch.Generator, the learner the global one), so a
  run is reproducible: on CPU the same command gives the same result bit for bit, and --max-staleness 0
  is synchronous PPO with a collector thread.

On CUDA both threads enqueue work on the device's default stream, so kernels run in issue order and tensors
pass between the threads without events; what overlaps is host work (env stepping, Python, inference latency).
Read top to bottom: `Args`, the `Agent`, the pure functions, the `Collector`, then `main` with the learner.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared import RolloutStats, RunLogger, atomic_save, check_dims, rollout_storage
from cleanrl_embodied.shared.actions import Bins, bin_bounds, decode_bins, sample
from cleanrl_embodied.shared.checkpoints import (
    env_record,
    frozen_fingerprint,
    load_model_state,
    load_optimizer,
    load_start,
    model_state,
    note_schedule_change,
    rng_state,
    set_rng_state,
)
from cleanrl_embodied.shared.cli import RunArgs, build_env, build_policy, check_args
from cleanrl_embodied.shared.encoders import PixelEncoder, needs_encoder
from cleanrl_embodied.shared.envs import env_state_dict, load_env_state_dict
from cleanrl_embodied.shared.evaluation import Evaluator
from cleanrl_embodied.shared.runtime import (
    NonFiniteWatch,
    SkipGuard,
    StopFlag,
    autocast,
    compiler,
    pick_device,
    seed_everything,
    stream_seed,
)
from cleanrl_embodied.shared.tensordict_helpers import from_saved, micro_batches, saveable, state_dim, state_vector


@dataclass
class Args(RunArgs):  # RunArgs (shared/cli.py): run dir, tracking, envs, evaluation, checkpoints, --policy
    exp_name: str = "ppo_async"
    """the name of this experiment (part of the run directory name)"""
    num_envs: int = 256
    """number of parallel training environments"""

    # Algorithm
    total_timesteps: int = 2_000_000
    """total environment steps (summed over envs)"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int = 20
    """rollout length per env per iteration"""
    gamma: float = 0.8
    """discount factor"""
    gae_lambda: float = 0.9
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 8
    """minibatches per epoch"""
    update_epochs: int = 4
    """optimization epochs per rollout"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """PPO surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss around the old values"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clipping"""
    target_kl: float | None = 0.1
    """stop the epoch loop early when the epoch's mean approximate KL exceeds this (None disables)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the actor and the critic MLPs"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""
    action_head: Literal["gaussian", "bins"] = "gaussian"
    """the actor's distribution: a Gaussian per action entry, or a categorical over --action-bins bins per entry
    (OpenVLA's action tokens), decoded to the bin's centre within the action bounds"""
    action_bins: int = 256
    """bins per action entry (--action-head bins)"""
    action_chunk: int = 1
    """actions per decision: the policy emits this many at once and the env runs them one by one (a chunk)"""
    micro_batch_size: int | None = None
    """split each minibatch into pieces of this many samples whose gradients add up (None: no split)"""
    autocast: Literal["none", "bf16"] = "none"
    """run the network's forward passes under bf16 autocast (weights, optimizer and log-probs stay float32)"""
    norm_obs: bool = False
    """normalize observations with running mean/std (updated from rollouts only, frozen at eval)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip, clip]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip, clip]"""
    max_staleness: int = 1
    """K: rollout j is collected with the policy published after rollout j - K was consumed (0: synchronous)"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps",
                  "total_timesteps", "num_minibatches", "update_epochs", "learning_rate", "clip_obs",
                  "clip_reward", "gamma", "clip_coef", "vf_coef", "max_grad_norm", "target_kl"),
        non_negative=("gae_lambda", "ent_coef", "max_staleness"),
        at_most_one=("gamma", "gae_lambda"),
        finite=("init_logstd",),
        may_be_inf=("max_grad_norm", "clip_obs", "clip_reward"),  # no clipping
        minibatches_of=args.num_envs * args.num_steps,
    )  # fmt: skip


class RunningMeanStd(nn.Module):
    """Running mean/variance in float64, merged batch by batch with the parallel-variance formula."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if self.mean.numel() == 0:  # observations without float entries: nothing to track
            return
        x = x.reshape(-1, *self.mean.shape).double()
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    layers, last = [], in_dim
    for h in hidden_sizes:
        layers += [layer_init(nn.Linear(last, h)), nn.Tanh()]
        last = h
    return nn.Sequential(*layers, layer_init(nn.Linear(last, out_dim), std=out_std))


class Agent(nn.Module):
    """An actor and a separate critic (MLPs) on the normalized observation (TensorDict observations: their float
    entries; images and instructions first go through the shared `PixelEncoder`). The actor is a Gaussian with a
    state-independent log-std, or a categorical over bins per action entry; over one action [D] or a chunk [K, D]."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, args: Args):
        super().__init__()
        self.norm_obs, self.clip_obs = args.norm_obs, args.clip_obs
        self.obs_rms = RunningMeanStd((state_dim(obs_space),))
        self.encoder = PixelEncoder(obs_space, state_dim(obs_space)) if needs_encoder(obs_space) else None
        features = self.encoder.out_dim if self.encoder else state_dim(obs_space)
        self.action_shape, self.bins = act_space.shape, args.action_bins if args.action_head == "bins" else 0
        act_dim = math.prod(self.action_shape)
        self.critic = mlp(features, args.hidden_sizes, 1, out_std=1.0)
        if self.bins:  # one categorical per action entry; the raw action is the bin index
            self.actor_logits = mlp(features, args.hidden_sizes, act_dim * self.bins, out_std=0.01)
            low, high = bin_bounds(act_space, self.bins)
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)
        else:
            self.actor_mean = mlp(features, args.hidden_sizes, act_dim, out_std=0.01)
            self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.init_logstd))

    def features(self, obs: torch.Tensor | TensorDict) -> torch.Tensor:
        state = state_vector(obs)  # a plain observation tensor as it is
        if self.norm_obs:
            state = (
                ((state - self.obs_rms.mean) / (self.obs_rms.var + 1e-8).sqrt())
                .clamp(-self.clip_obs, self.clip_obs)
                .float()
            )
        return state if self.encoder is None else self.encoder(obs, state)

    def _dist(self, features: torch.Tensor) -> torch.distributions.Distribution:
        if self.bins:
            return Bins(self.actor_logits(features).view(-1, *self.action_shape, self.bins))
        mean = self.actor_mean(features).float()  # (float32 also under bf16 autocast)
        std = self.actor_logstd.expand_as(mean).exp()
        # validate_args=False: the argument check would cost a host sync on every call
        shape = (-1, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)

    def forward(self, obs: torch.Tensor | TensorDict) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        """The action distribution and V(obs), from one pass of the observation through normalizer/encoder."""
        features = self.features(obs)
        return self._dist(features), self.critic(features).squeeze(-1).float()

    def dist(self, obs: torch.Tensor | TensorDict) -> torch.distributions.Distribution:
        return self._dist(self.features(obs))

    def get_value(self, obs: torch.Tensor | TensorDict) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1).float()

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """What the env gets for a raw action: a Gaussian sample as it is (the env clips), a bin index's centre."""
        return decode_bins(action, self.action_low, self.action_high, self.bins) if self.bins else action


ACTION_ARGS = ("action_head", "action_bins", "action_chunk")  # what the actor's output means


def make_agent(envs, args: Args) -> nn.Module:
    """The built-in `Agent`, or the module that `--policy module:factory` builds from the spaces and args."""
    if args.policy is None:
        return Agent(envs.single_observation_space, envs.single_action_space, args)
    return build_policy(args, envs, needs=("forward", "dist", "get_value") + (("obs_rms",) if args.norm_obs else ()))


def policy_step(agent: Agent, obs: torch.Tensor, generator: torch.Generator) -> TensorDict:
    """Sample a raw action (unclipped Gaussian, or bin indices) from `generator`; return it with its behaviour
    log-prob (summed over the action's entries, a chunk's too) and the action the env gets. No value here: the
    learner recomputes values with its current critic."""
    dist = agent.dist(obs)
    action = sample(dist, generator)
    return TensorDict(
        action=action,
        logprob=dist.log_prob(action).flatten(1).sum(-1),
        env_action=agent.env_action(action),
        batch_size=obs.shape[:1],
    )


def eval_action(agent: Agent, obs: torch.Tensor, generator: torch.Generator, deterministic: bool) -> torch.Tensor:
    """The evaluation policy: the distribution's mode (the Gaussian's mean, the most likely bin), or a sample drawn
    from the evaluator's own generator."""
    dist = agent.dist(obs)
    return agent.env_action(dist.mode if deterministic else sample(dist, generator))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float | torch.Tensor,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a [T, N] rollout of decisions.

    next_values[t] is V of the state reached by decision t in the *same* episode: V(obs[t+1]) while the
    episode goes on, V(final_obs) where it ended at t. Terminated steps do not bootstrap (a true end
    has no future); truncated ones do, from V(final_obs). `dones` = terminated | truncated cuts the
    advantage recursion at episode ends. `gamma` is the discount of one decision: a float, or [T, N] where a
    decision ran k env steps (an action chunk: gamma^k, and its reward is the discounted sum of those steps).
    Masks select with `torch.where`, so a non-finite value past an episode's end never reaches its advantages
    (NaN * 0 would be NaN). Returns (advantages, returns).
    """
    discounts = torch.as_tensor(gamma, dtype=rewards.dtype, device=rewards.device).expand_as(rewards)
    deltas = rewards + discounts * torch.where(terminated, 0.0, next_values) - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + discounts[t] * gae_lambda * torch.where(dones[t], 0.0, last)
        advantages[t] = last
    return advantages, advantages + values


def normalize_advantages(mb: TensorDict) -> TensorDict:
    """The minibatch with its advantages normalized to zero mean and unit std (over the whole minibatch, before
    any split into micro-batches)."""
    adv = mb["advantages"]
    return mb.set("advantages", (adv - adv.mean()) / (adv.std() + 1e-8))


def ppo_loss(agent: Agent, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """Clipped-surrogate PPO loss on one minibatch (or a piece of one), means over its samples; returns (loss,
    detached statistics). The advantages come normalized (`normalize_advantages`) when --norm-adv."""
    dist, newvalue = agent(mb["obs"])
    newlogprob = dist.log_prob(mb["action"]).flatten(1).sum(-1)
    entropy = dist.entropy().flatten(1).sum(-1).mean()
    logratio = newlogprob - mb["logprob"]
    ratio = logratio.exp()

    adv = mb["advantages"]
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["value"] + (newvalue - mb["value"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    with torch.no_grad():
        stats = TensorDict(
            policy_loss=pg_loss,
            value_loss=v_loss,
            entropy=entropy,
            old_approx_kl=(-logratio).mean(),
            approx_kl=((ratio - 1) - logratio).mean(),
            clipfrac=((ratio - 1.0).abs() > args.clip_coef).float().mean(),
        ).detach()
    return loss, stats


def backward_piece(agent: Agent, piece: TensorDict, args: Args, weight: float) -> tuple[torch.Tensor, TensorDict]:
    """PPO's loss on a piece of a minibatch times `weight` (the piece's share of the minibatch, so that the pieces'
    gradients add up to the minibatch's), backpropagated into the parameters' `.grad`; returns the weighted loss and
    statistics, detached (summed over the pieces they are the minibatch's)."""
    loss, stats = ppo_loss(agent, piece, args)
    if weight != 1.0:  # a piece of a split minibatch
        loss, stats = loss * weight, stats * weight
    loss.backward()
    return loss.detach(), stats


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global norm of at most `max_norm`; returns the norm before clipping."""
    return nn.utils.clip_grad_norm_(params, max_norm)


def scale_rewards(
    rewards: torch.Tensor,
    dones: torch.Tensor,
    trace: torch.Tensor,
    rms: RunningMeanStd,
    discounts: torch.Tensor,
    clip: float,
) -> torch.Tensor:
    """Divide rewards by the running std of the discounted return (no mean shift); `trace` holds each
    env's discounted return so far and is updated in place (it restarts after episode ends); `discounts` [T, N]
    are the decisions' (gamma, or gamma^k for chunks of k steps)."""
    traces = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        trace.mul_(discounts[t]).add_(rewards[t])
        traces[t] = trace
        trace.masked_fill_(dones[t], 0.0)
    rms.update(traces)
    return (rewards / (rms.var + 1e-8).sqrt()).clamp(-clip, clip).float()


class Collector:
    """Steps the training envs in a background thread with an inference copy of the agent.

    Rollout j (counted over the whole run) waits until the learner has consumed j - K rollouts and is then
    collected, start to end, with the snapshot published at exactly that point: the learner's `publish` after
    each rollout it consumes is the only way the inference copy changes. Rollouts go to the learner through a
    queue the wait keeps to K + 1 entries; the rest (envs, next_obs, generator) is read only while paused.
    """

    def __init__(self, envs, agent: Agent, args: Args, total_rollouts: int, device: torch.device):
        self.envs, self.agent, self.args, self.total_rollouts = envs, agent, args, total_rollouts
        self.next_obs, self.next_index = envs.reset(seed=stream_seed(args.seed, "train_envs"))[0], 0  # or load_state()
        self.generator = torch.Generator(device=device).manual_seed(stream_seed(args.seed, "collector"))  # its own
        self.amp = autocast(args.autocast, device)
        self.task_names = envs.metadata.get("task_names")  # success is also logged per task
        self.rollouts: queue.Queue = queue.Queue(maxsize=args.max_staleness + 1)
        self.cond = threading.Condition()
        self.snapshots: dict[int, tuple[int, dict]] = {}  # rollouts consumed -> (policy version, changing entries)
        self.changing: set[str] = set()  # the agent's state entries that snapshots copy (see publish)
        self.seen: dict[str, tuple[int, int]] | None = None  # frozen parameter -> (data_ptr, version) at the copy
        self.consumed = 0
        self.pause_requested = self.paused = self.stop_requested = self.finished = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ppo-async-collector", daemon=True)

    # ---- learner side ----
    def publish(self, consumed: int, version: int, agent: Agent) -> None:
        """Hand the learner's agent after `consumed` rollouts to the collector: the first call (before the thread
        starts) copies the whole agent into the collector's copy; every call keeps a detached copy of what can
        change: trainable parameters, buffers, and a frozen parameter (``requires_grad`` off) once it has changed
        in place or been replaced since the first call (its version counter says so; from then on in every
        snapshot). A resume applies its snapshots to the resumed weights, which is exact unless a frozen parameter
        began changing within the K + 1 rollouts before the checkpoint."""
        state = agent.state_dict(keep_vars=True)
        if self.seen is None:
            self.agent.load_state_dict(state)
            self.seen = {k: (v.data_ptr(), v._version) for k, v in state.items() if isinstance(v, nn.Parameter)}
        for key, value in state.items():
            if key not in self.seen or value.requires_grad or self.seen[key] != (value.data_ptr(), value._version):
                self.changing.add(key)
        snapshot = (version, {k: state[k].detach().clone() for k in self.changing})
        with self.cond:
            self.snapshots[consumed], self.consumed = snapshot, consumed
            for old in [c for c in self.snapshots if c < consumed - self.args.max_staleness]:
                del self.snapshots[old]  # rollouts still to be collected start at >= consumed - K
            self.cond.notify_all()

    def raise_error(self) -> None:
        """Raise the collector thread's exception, if it had one, in the calling (learner) thread."""
        if self.error is not None:
            error, self.error = self.error, None
            error.add_note("(raised in the ppo_async collector thread)")
            raise error

    def get(self) -> dict:
        """The next rollout, in order. Rollouts completed before the collector failed are still handed out;
        then its exception is raised here."""
        while True:
            try:
                return self.rollouts.get(timeout=0.05)
            except queue.Empty:
                self.raise_error()
                if self.finished and self.rollouts.empty():
                    raise RuntimeError("the collector ended without producing the next rollout") from None

    def pause(self) -> None:
        """Return once the collector waits at a rollout boundary (or has ended)."""
        with self.cond:
            self.pause_requested = True
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.paused or self.finished)
        self.raise_error()  # a collector that ended in an error has no consistent state to save

    def resume(self) -> None:  # after pause()
        with self.cond:
            self.pause_requested = False
            self.cond.notify_all()

    def stop(self) -> None:
        """End the thread (abandoning a rollout in progress) and wait for it."""
        with self.cond:
            self.stop_requested = True
            self.cond.notify_all()
        self.thread.join(timeout=60)  # the thread is started before the learner loop, so join is valid
        if self.thread.is_alive():
            raise RuntimeError("the ppo_async collector thread did not stop within 60 s")

    def state(self) -> dict:
        """What a resume needs from this side, rollouts collected but not yet learned from included; call only
        while paused."""
        return {
            "next_index": self.next_index,
            "next_obs": saveable(self.next_obs),
            "generator": self.generator.get_state(),
            "env_state": env_state_dict(self.envs),
            "snapshots": dict(self.snapshots),
            "pending": [
                {**item, "data": item["data"].to_dict(), "next_obs": saveable(item["next_obs"])}
                for item in list(self.rollouts.queue)
            ],
        }

    def load_state(self, state: dict) -> None:
        """Continue from the rollout boundary `state()` was taken at (before the thread starts)."""
        device, pending = self.next_obs.device, state["pending"]
        if state["env_state"] is not None:  # else the envs start fresh episodes
            load_env_state_dict(self.envs, state["env_state"])
            self.next_obs = from_saved(state["next_obs"], device)
        self.generator.set_state(state["generator"])
        self.next_index, self.snapshots = state["next_index"], {int(c): vs for c, vs in state["snapshots"].items()}
        self.changing.update(key for _, snapshot in self.snapshots.values() for key in snapshot)  # (older: whole)
        self.rollouts = queue.Queue(maxsize=max(self.args.max_staleness + 1, len(pending)))  # a resume may lower K
        for item in pending:
            item = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in item.items()}
            data = TensorDict(item["data"], batch_size=[self.args.num_steps, self.args.num_envs], device=device)
            if "discount" not in data.keys():  # collected before chunks existed: one env step per decision
                data["discount"] = torch.full_like(data["reward"], self.args.gamma)
            self.rollouts.put_nowait({**item, "next_obs": from_saved(item["next_obs"], device), "data": data})

    # ---- collector thread ----
    def _run(self) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                while self.next_index < self.total_rollouts:
                    need = max(self.next_index - self.args.max_staleness, 0)
                    with self.cond:
                        while not self.stop_requested and (self.pause_requested or self.consumed < need):
                            self.paused = self.pause_requested
                            self.cond.notify_all()
                            self.cond.wait()
                        self.paused = False
                        if self.stop_requested:
                            return
                        version, state = self.snapshots[max(need, min(self.snapshots))]
                    self.agent.load_state_dict(state, strict=False)  # what changed; the rest it holds already
                    item = self._collect(version)
                    if item is None:  # stopped mid-rollout
                        return
                    self.rollouts.put_nowait(item)  # never full: the wait above bounds it
                    self.next_index += 1
        except BaseException as e:  # noqa: BLE001 - handed to the learner, which raises it
            self.error = e
        finally:
            with self.cond:
                self.finished = True
                self.cond.notify_all()

    def _collect(self, version: int) -> dict | None:
        args, device = self.args, self.next_obs.device
        obs_space = self.envs.single_observation_space
        data = rollout_storage(  # TensorDict observations are stored as they come, uint8 images as uint8
            args.num_steps,
            args.num_envs,
            device,
            obs=obs_space,
            action=(self.envs.single_action_space.shape, torch.float32),
            logprob=((), torch.float32),
            final_obs=obs_space,
            reward=((), torch.float32),
            discount=((), torch.float32),
            terminated=((), torch.bool),
            done=((), torch.bool),
            version=((), torch.long),
        )
        stats, watch, start = RolloutStats(device, self.task_names), NonFiniteWatch(args.num_envs, device), time.time()
        for step in range(args.num_steps):
            if self.stop_requested:
                return None
            with self.amp():
                out = policy_step(self.agent, self.next_obs, self.generator)
            data["obs"][step] = self.next_obs
            data["action"][step], data["logprob"][step] = out["action"], out["logprob"]
            self.next_obs, reward, terminated, truncated, info = self.envs.step(out["env_action"])
            done = terminated | truncated
            data["reward"][step], data["terminated"][step], data["done"][step] = reward, terminated, done
            data["discount"][step] = info.get("discount", args.gamma)  # gamma^k for a chunk of k steps
            stats.add_reward_terms(info)
            if device.type != "cpu" or done.any():  # what only finished episodes need (on the CPU, asking is free)
                data["final_obs"][step] = info["final_obs"]  # read only where done
                watch.update_final(step, info["final_obs"], done)
                stats.add_episodes(info)
        watch.update_rollout(data["obs"], self.next_obs, data["reward"])
        data["version"].fill_(version)  # every transition carries the policy version that produced it
        return {
            "index": self.next_index,
            "version": version,
            "data": data,
            "next_obs": self.next_obs,
            "stats": stats,
            "watch": watch,
            "start": start,
            "end": time.time(),
        }


def main(args: Args) -> dict:
    validate(args)
    ckpt, ckpt_flag = load_start(  # it must match the network and what it sees; on --resume also the env
        args,
        ["ppo_async"],  # layout, the reward trace's meaning and the LR schedule's base
        same=("env_id", "hidden_sizes", "norm_obs", "clip_obs", "policy", "policy_kwargs", *ACTION_ARGS),
        resume_same=("num_envs", "num_steps", "gamma", "norm_reward", "clip_reward", "learning_rate", "anneal_lr"),
    )
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    rollout_steps = batch_size * args.action_chunk  # env steps of a rollout
    num_iterations = max(1, args.total_timesteps // rollout_steps)
    seed_everything(args.seed, args.torch_deterministic)
    device = pick_device(args.cuda)

    eval_envs = build_env(args, "eval_env_kwargs", args.num_eval_envs, stream_seed(args.seed, "eval_envs"), device)
    obs_dim, act_dim = check_dims(eval_envs, (ckpt, ckpt_flag))
    agent = make_agent(eval_envs, args).to(device)
    if ckpt is not None:
        load_model_state(agent, ckpt, ckpt_flag, getattr(args, ckpt_flag))
    frozen = frozen_fingerprint(agent)  # what checkpoints record of the weights they leave out
    logger = RunLogger("ppo_async", args, total_iterations=num_iterations)
    evaluator = Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    act = partial(eval_action, agent, deterministic=args.eval_deterministic)
    if args.eval_checkpoint:  # evaluate a saved policy and exit
        return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)

    envs = build_env(args, "env_kwargs", args.num_envs, stream_seed(args.seed, "train_envs"), device, like=eval_envs)
    params = [p for p in agent.parameters() if p.requires_grad]
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    reward_rms = RunningMeanStd().to(device)
    reward_trace = torch.zeros(args.num_envs, dtype=torch.float64, device=device)
    updates = num_iterations * args.update_epochs * args.num_minibatches  # minibatch updates planned
    compiled = compiler(args.compile, device, updates, logger.write)  # torch.compile (learner side), or eager
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)
    amp = autocast(args.autocast, device)
    micro_batch_size = min(args.micro_batch_size or minibatch_size, minibatch_size)
    inference_agent = make_agent(eval_envs, args).to(device)  # the collector's copy (before a resume's RNG)

    # Learner counters, changed here only, after the update they count: rollouts consumed (= iterations),
    # policy version (= updates made), env steps, rollouts dropped for staleness.
    consumed, version, global_step, dropped = 0, 0, 0, 0
    collector = Collector(envs, inference_agent, args, num_iterations, device)  # resets the envs
    if ckpt is not None:  # resume: every piece of state the next iteration depends on
        load_optimizer(optimizer, ckpt["optimizer"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        consumed, version, dropped = ckpt["iteration"], ckpt["version"], ckpt["dropped"]
        global_step, evaluator.best_key = ckpt["global_step"], tuple(ckpt["best_key"])
        note_schedule_change(ckpt, num_iterations, args.learning_rate, logger.write)
        set_rng_state(ckpt["rng"])
        collector.load_state(ckpt["collector"])  # it stopped at a rollout boundary: continue from exactly there
        if ckpt["collector"]["env_state"] is not None:  # else fresh episodes, and fresh reward traces
            reward_trace.copy_(ckpt["reward_trace"])
    collector.publish(consumed, version, agent)
    logger.write(
        f"device={device} envs={args.num_envs} batch={batch_size} minibatch={minibatch_size} iterations="
        f"{num_iterations} start={consumed + 1} max_staleness={args.max_staleness} run_dir={logger.run_dir}"
    )

    def save_checkpoint(name: str) -> str:  # only while the collector is paused: both sides at one point
        state = {
            "script": "ppo_async",
            "args": dataclasses.asdict(args),
            "model": model_state(agent),  # trainable parameters and buffers
            "frozen": frozen,
            "optimizer": optimizer.state_dict(),
            "reward_rms": reward_rms.state_dict(),
            "reward_trace": reward_trace,
            "iteration": consumed,
            "version": version,
            "global_step": global_step,
            "dropped": dropped,
            "num_iterations": num_iterations,
            "best_key": list(evaluator.best_key),
            "obs_dim": obs_dim,
            "act_dim": act_dim,
            "env": env_record(args, eval_envs),  # id, options, observation layout: a resume must match them
            "rng": rng_state(),
            "collector": collector.state(),
        }
        return str(atomic_save(state, logger.checkpoint_dir / name))

    eval_result, checkpoint, timeline = None, None, []
    guard = SkipGuard(args.max_consecutive_skips)  # non-finite optimizer steps are skipped and counted
    next_eval, next_save = consumed + args.eval_freq, consumed + args.save_freq
    start_time, start_step = time.time(), global_step
    collector.thread.start()
    try:
        with StopFlag(logger.write) as stop:  # Ctrl-C / SIGTERM: finish this iteration, save, write the summary
            while consumed < num_iterations:
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - consumed / num_iterations))
                wait_start = time.time()
                item = collector.get()
                wait_s, update_start = time.time() - wait_start, time.time()
                assert item["index"] == consumed, (item["index"], consumed)  # in order, none lost
                data, used_version, staleness = item["data"], version, version - item["version"]
                item["watch"].check(global_step, args.num_envs * args.action_chunk)  # one line: envs and step, if any
                with torch.no_grad():  # the reward scale follows every rollout in order, dropped ones too
                    rewards, discounts = data["reward"], data["discount"]
                    if args.norm_reward:
                        rewards = scale_rewards(
                            rewards, data["done"], reward_trace, reward_rms, discounts, args.clip_reward
                        )
                update_stats, batch = [], None  # this iteration's; none for a dropped rollout (nothing logged)
                if staleness > args.max_staleness:  # only after a resume with a smaller --max-staleness
                    dropped += 1
                else:
                    # ---- advantages with the current critic: V(next obs) in an episode, V(final_obs) at its end
                    with torch.no_grad(), amp():
                        value_of = lambda obs: agent.get_value(obs.flatten(0, 1)).view(obs.shape[:2])
                        values = value_of(data["obs"])
                        next_values = torch.cat([values[1:], agent.get_value(item["next_obs"])[None]])
                        next_values = torch.where(data["done"], value_of(data["final_obs"]), next_values)
                    advantages, returns = compute_gae(
                        rewards, values, next_values, data["terminated"], data["done"], discounts, args.gae_lambda
                    )

                    # ---- PPO update; the ratio is taken against the behaviour log-prob stored with the data
                    batch = data.select("obs", "action", "logprob").reshape(-1)
                    batch["value"], batch["advantages"], batch["returns"] = (
                        values.reshape(-1),
                        advantages.reshape(-1),
                        returns.reshape(-1),
                    )
                    for _epoch in range(args.update_epochs):
                        perm = torch.randperm(batch_size, device=device)
                        epoch_kl = []
                        for start in range(0, batch_size, minibatch_size):
                            mb = batch[perm[start : start + minibatch_size]]
                            mb = normalize_advantages(mb) if args.norm_adv else mb
                            optimizer.zero_grad(set_to_none=True)
                            loss = mb_stats = None  # the minibatch's, summed over its pieces (gradients add up)
                            for piece in micro_batches(mb, micro_batch_size):
                                with amp():
                                    out = backward_fn(agent, piece, args, len(piece) / minibatch_size)
                                loss, mb_stats = out if loss is None else (loss + out[0], mb_stats + out[1])
                            grad_norm = clip_fn(params, args.max_grad_norm)
                            if not guard.ok(loss, grad_norm, global_step + rollout_steps):  # the step it logs at
                                continue
                            step_fn()
                            epoch_kl.append(mb_stats["approx_kl"])
                            update_stats.append(mb_stats)
                        if (
                            args.target_kl is not None
                            and epoch_kl
                            and float(torch.stack(epoch_kl).mean()) > args.target_kl
                        ):
                            break
                    if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
                        agent.obs_rms.update(state_vector(data["obs"], batch_dims=2))  # float entries only
                    version += 1
                consumed, global_step = consumed + 1, global_step + rollout_steps  # the rollout is learned from
                update_end = time.time()  # before publishing, so a waiting collector starts after it
                collector.publish(consumed, version, agent)
                timeline.append(
                    {
                        "index": item["index"],
                        "behaviour_version": item["version"],
                        "learner_version": used_version,
                        "dropped": staleness > args.max_staleness,
                        "collect": (item["start"], item["end"]),
                        "update": (update_start, update_end),
                    }
                )

                # ---- logging: one host sync per iteration ----
                sps = (global_step - start_step) / (time.time() - start_time)
                scalars = {
                    "charts/SPS": sps,
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    "charts/skipped_updates": guard.skipped,
                    "charts/policy_staleness": staleness,
                    "charts/dropped_rollouts": dropped,
                    "charts/learner_wait_s": wait_s,
                    **item["stats"].scalars(),
                }
                if update_stats:  # means of this iteration's applied optimizer steps (skipped ones left out)
                    scalars.update({f"losses/{k}": v for k, v in torch.stack(update_stats).mean(0).items()})
                if batch is not None:  # the rollout was learned from
                    scalars["losses/explained_variance"] = 1 - (batch["returns"] - batch["value"]).var() / (
                        batch["returns"].var().clamp_min(1e-8)
                    )
                logger.log(scalars, global_step)
                logger.progress(
                    global_step,
                    SPS=sps,
                    ret=logger.latest.get("charts/episodic_return"),
                    succ=logger.latest.get("charts/success_rate"),
                )

                # evaluation and checkpoints see a paused collector (thresholds on the iteration counter)
                do_eval = args.eval_freq and consumed >= next_eval and consumed < num_iterations
                do_save = args.save_freq and consumed >= next_save
                if do_eval or do_save:
                    collector.pause()
                    if do_eval:
                        next_eval = consumed + args.eval_freq
                        eval_result, is_best = evaluator.run(act, global_step)
                        if is_best:
                            save_checkpoint("best.pt")
                    if do_save:
                        next_save = consumed + args.save_freq
                        checkpoint = save_checkpoint("last.pt")
                        save_checkpoint(f"iter_{consumed:06d}.pt")
                    collector.resume()
                if stop.requested:
                    break
            collector.pause()  # at a rollout boundary: last.pt can hold the collector's state
            checkpoint = save_checkpoint("last.pt")
            if not stop.requested:
                eval_result, is_best = evaluator.run(act, global_step)
                if is_best:
                    save_checkpoint("best.pt")
                    checkpoint = save_checkpoint("last.pt")  # again, with the best key a resume compares against
    finally:  # after an error on either side too: stop both, write summary.json; last.pt stays the last
        failed = sys.exc_info()[0] is not None  # consistent one (a crash never overwrites it)
        collector.stop()
        wall = time.time() - start_time
        logger.finish(
            global_step,
            wall,
            (global_step - start_step) / max(wall, 1e-9),
            eval_result,
            checkpoint,
            exit_code=int(failed),
            dropped_rollouts=dropped,
        )
        envs.close()
        eval_envs.close()
    if stop.requested:
        sys.exit(stop.exit_status)  # 130 after Ctrl-C, 143 after SIGTERM
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step, "timeline": timeline}


if __name__ == "__main__":
    main(tyro.cli(Args))
