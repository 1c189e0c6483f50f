"""PPO on many CPUs, GPUs and nodes through torch.distributed, in one file.

    uv run torchrun --standalone --nproc_per_node 2 cleanrl_embodied/ppo_ddp.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_ddp.py --env-id PushCubeRL        # without torchrun: a world of one

This is ppo_continuous.py made data-parallel; it has the same flags plus `--backend`, `--dist-timeout-s` and
`--fsdp`.
Every rank steps its own `--num-envs` envs, collects its own rollout and cuts it into its own minibatches, each
rank with its own random streams derived from (seed, rank) (`stream_seed`; rank 0's are ppo_continuous.py's);
`--total-timesteps` counts the env steps of all ranks together. Process-group set-up and teardown live in
`cleanrl_embodied.shared.distributed`. What keeps the ranks one run:

- identical initial weights (rank 0's broadcast to all at start, checked bit for bit at the end);
- `sync_gradients`: before every optimizer step, one all-reduce of one flat buffer holding every gradient
  and the loss, so all ranks step with the same averaged gradient and skip the same non-finite steps;
- observation and reward normalizers merged over all ranks (all-gather of count, mean, variance);
- every decision that changes control flow (target-KL stop, non-finite data, Ctrl-C/SIGTERM) is all-reduced;
- rank 0 alone logs, evaluates and writes checkpoints and summary.json; episode statistics are summed
  over ranks. A rank that dies or stalls makes the others stop with one error line (`--dist-timeout-s`).

With `--fsdp` (FSDP2's `fully_shard`, on CPU with gloo too) every rank holds a shard of the parameters, gradients
and optimizer state instead of all of them: FSDP averages the gradients in the backward pass (in place of
`sync_gradients`), the rollout and the evaluations act with a whole copy of the weights gathered after every
update, and checkpoints hold whole tensors, gathered from the shards (a resume keeps `--fsdp`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from tensordict import TensorDict, from_module
from torch.distributed.fsdp import fully_shard

from cleanrl_embodied.shared import RolloutStats, RunLogger, atomic_save, check_dims, rollout_storage
from cleanrl_embodied.shared.actions import Bins, bin_bounds, decode_bins, sample
from cleanrl_embodied.shared.checkpoints import (
    env_record,
    frozen_fingerprint,
    load_model_state,
    load_optimizer,
    load_start,
    note_schedule_change,
    rng_state,
    set_rng_state,
)
from cleanrl_embodied.shared.cli import RunArgs, build_env, build_policy, check_args, fail
from cleanrl_embodied.shared.distributed import (
    broadcast_model,
    check_in_sync,
    full,
    gather_into,
    process_group,
    whole_state,
)
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
    exp_name: str = "ppo_ddp"
    """the name of this experiment (part of the run directory name)"""
    num_envs: int = 256
    """number of parallel training environments per rank"""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: auto = nccl on CUDA, gloo on CPU"""
    fsdp: bool = False
    """shard parameters, gradients and optimizer state over the ranks (FSDP2's fully_shard), for a policy too large
    to train whole on every rank; the rollout acts with a full copy of the weights refreshed every iteration"""
    dist_timeout_s: int = 300
    """seconds any rank waits in a collective for a missing rank before all stop with an error; must exceed
    rank 0's longest pause (an evaluation plus a checkpoint)"""

    # Algorithm
    total_timesteps: int = 2_000_000
    """total environment steps (summed over the envs of all ranks)"""
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
    cudagraphs: bool = False
    """capture the policy step in a CUDA graph (CUDA only)"""


def validate(args: Args, show: bool) -> None:
    """Reject bad input with one line naming the flag (printed by rank 0), before any process group exists."""
    check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps",
                  "total_timesteps", "num_minibatches", "update_epochs", "learning_rate", "clip_obs",
                  "clip_reward", "gamma", "clip_coef", "vf_coef", "max_grad_norm", "target_kl",
                  "dist_timeout_s"),
        non_negative=("gae_lambda", "ent_coef"),
        at_most_one=("gamma", "gae_lambda"),
        finite=("init_logstd",),
        may_be_inf=("max_grad_norm", "clip_obs", "clip_reward"),  # no clipping
        minibatches_of=args.num_envs * args.num_steps,
        show=show,
    )  # fmt: skip  # each rank's rollout
    cuda = pick_device(args.cuda).type == "cuda"
    if args.backend == "nccl" and not cuda:
        fail("--backend nccl needs CUDA (GPUs and --cuda); on CPU use --backend gloo or auto", show)
    if args.cudagraphs and not cuda:
        fail("--cudagraphs needs CUDA (a GPU and --cuda); on the CPU leave it off (--compile still applies)", show)


class RunningMeanStd(nn.Module):
    """Running mean/variance in float64, merged with each rollout of every rank by the parallel-variance formula."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, world_size: int) -> None:
        """Merge the batches x of all ranks (a collective: every rank calls it and ends with the same bits)."""
        if self.mean.numel() == 0:  # observations without float entries: nothing to track
            return
        x = x.reshape(-1, *self.mean.shape).double()
        local = torch.cat([x.new_tensor([x.shape[0]]), x.mean(0).reshape(-1), x.var(0, unbiased=False).reshape(-1)])
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local)
        for part in parts:  # in rank order, the same on every rank
            n, batch_mean, batch_var = part[0], *part[1:].view(2, *self.mean.shape).unbind(0)
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


def policy_step(agent: Agent, obs: torch.Tensor | TensorDict) -> TensorDict:
    """Sample a raw action (unclipped Gaussian, or bin indices); return it with its log-prob (summed over the
    action's entries, a chunk's too), V(obs) and the action the env gets."""
    dist, value = agent(obs)
    action = dist.sample()
    return TensorDict(
        action=action,
        logprob=dist.log_prob(action).flatten(1).sum(-1),
        value=value,
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


def sync_gradients(params: list[torch.Tensor], world_size: int, loss: torch.Tensor) -> torch.Tensor:
    """Average the gradients of `params` over all ranks in place, with ONE all-reduce of one flat buffer that also
    carries the loss; returns the rank-averaged loss, non-finite if any rank's loss was. After this call every
    rank holds the same gradient bits, so clipping and the skip-on-non-finite decision agree without more talk."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(grads[0].dtype)])
    dist.all_reduce(flat)  # SUM: ReduceOp.AVG exists on NCCL only
    flat /= world_size
    for p, g in zip(params, flat[:-1].split([p.numel() for p in params])):
        p.grad = g.view_as(p)
    return flat[-1]


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
    world_size: int,
) -> torch.Tensor:
    """Divide rewards by the running std of the discounted return, merged over all ranks (no mean shift);
    `trace` holds each of this rank's envs' discounted return so far and is updated in place; `discounts` [T, N]
    are the decisions' (gamma, or gamma^k for chunks of k steps)."""
    traces = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        trace.mul_(discounts[t]).add_(rewards[t])
        traces[t] = trace
        trace.masked_fill_(dones[t], 0.0)
    rms.update(traces, world_size)
    return (rewards / (rms.var + 1e-8).sqrt()).clamp(-clip, clip).float()


def rank_state(envs, next_obs: torch.Tensor | TensorDict, reward_trace: torch.Tensor) -> dict:
    """What only this rank knows (on the CPU): its envs' state, current obs, return traces and RNG streams."""
    return {
        "env_state": env_state_dict(envs),
        "next_obs": saveable(next_obs.cpu()),
        "reward_trace": reward_trace.cpu(),
        "rng": rng_state(),
    }


def main(args: Args) -> dict:
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the process group does not exist yet
    validate(args, show=rank == 0)
    ckpt, ckpt_flag = load_start(  # it must match the network and what it sees; on --resume also the env
        args,
        ["ppo_continuous", "ppo_ddp"],  # layout, the reward trace's meaning and the LR schedule's base
        same=("env_id", "hidden_sizes", "norm_obs", "clip_obs", "policy", "policy_kwargs", *ACTION_ARGS),
        resume_same=(
            "num_envs",
            "num_steps",
            "gamma",
            "norm_reward",
            "clip_reward",
            "learning_rate",
            "anneal_lr",
            "fsdp",
        ),  # fmt: skip
        read=rank == 0,
    )  # the others get the content from rank 0
    with process_group(args.backend, args.cuda, args.dist_timeout_s) as (device, backend):
        return train(args, ckpt, ckpt_flag, dist.get_rank(), dist.get_world_size(), device, backend)


def train(
    args: Args, ckpt: dict | None, ckpt_flag: str, rank: int, world_size: int, device: torch.device, backend: str
) -> dict:
    batch_size = args.num_envs * args.num_steps  # per rank
    minibatch_size = batch_size // args.num_minibatches  # per rank
    num_iterations = max(1, args.total_timesteps // (batch_size * args.action_chunk * world_size))
    if args.resume or args.eval_checkpoint:  # rank 0 read the file; every rank gets its content
        box = [ckpt]
        dist.broadcast_object_list(box, src=0)
        ckpt = box[0]
    seed_everything(args.seed, args.torch_deterministic, rank)  # this rank's streams (rank 0: ppo_continuous.py's)

    # Rank r's envs get their own stream, hashed from (seed, r) (+ i for sub-env i of a Gymnasium id): no two envs
    # of the world or of runs with other seeds share one. Rank 0 alone evaluates (fresh starts per evaluation).
    eval_envs = (
        build_env(args, "eval_env_kwargs", args.num_eval_envs, stream_seed(args.seed, "eval_envs"), device)
        if rank == 0
        else None
    )
    env_seed = stream_seed(args.seed, "train_envs", rank)
    envs = build_env(args, "env_kwargs", args.num_envs, env_seed, device, like=eval_envs)
    obs_dim, act_dim = check_dims(envs, (ckpt, ckpt_flag), show=rank == 0)
    agent = make_agent(envs, args).to(device)
    broadcast_model(agent)  # every rank starts from rank 0's weights, whatever its RNG did
    if ckpt is not None:  # (after the broadcast: every rank checks the same frozen weights, so all agree)
        load_model_state(agent, ckpt, ckpt_flag, getattr(args, ckpt_flag), show=rank == 0)
    frozen = frozen_fingerprint(agent)  # what checkpoints record of the weights they leave out
    logger = RunLogger("ppo_ddp", args, total_iterations=num_iterations) if rank == 0 else None
    evaluator = (
        Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video) if rank == 0 else None
    )
    # The rollout and the evaluations act through an inference copy (LeanRL-style): it shares the agent's
    # parameters, or with --fsdp holds a full copy of them, refreshed every iteration (the agent holds shards).
    agent_inference = make_agent(envs, args).to(device)
    from_module(agent).data.to_module(agent_inference)
    act = partial(eval_action, agent_inference, deterministic=args.eval_deterministic)
    if args.eval_checkpoint:  # evaluate a saved policy on rank 0 and exit
        envs.close()
        if rank == 0:
            return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)
        return {"run_dir": None, "eval": None, "global_step": ckpt["global_step"]}
    if args.fsdp:  # shard the agent over the ranks: a policy's own units (e.g. a VLA's layers), then the rest
        for unit in getattr(agent, "fsdp_units", list)():
            fully_shard(unit)
        fully_shard(agent)  # (the inference copy keeps the whole weights it was built with, rank 0's)

    params = [p for p in agent.parameters() if p.requires_grad]
    if args.fsdp and rank == 0:
        mine = sum(p.to_local().numel() for p in params)
        logger.write(f"fsdp: this rank holds {mine} of the {sum(p.numel() for p in params)} trainable values")
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    reward_rms = RunningMeanStd().to(device)
    reward_trace = torch.zeros(args.num_envs, dtype=torch.float64, device=device)
    updates = num_iterations * args.update_epochs * args.num_minibatches  # minibatch updates planned
    say = logger.write if rank == 0 else lambda _: None
    compiled = compiler("off" if args.fsdp else args.compile, device, updates, say)  # (FSDP's hooks: eager)
    policy, value_fn = compiled(partial(policy_step, agent_inference)), compiled(agent_inference.get_value)
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)
    if args.cudagraphs:
        from tensordict.nn import CudaGraphModule

        policy, value_fn = CudaGraphModule(policy), CudaGraphModule(value_fn)

    global_step, start_iteration, resume_note = 0, 1, ""
    next_obs, _ = envs.reset(seed=env_seed)
    if ckpt is not None:  # model, optimizer, normalizers and counters from rank 0; env state per rank
        load_optimizer(optimizer, ckpt["optimizer"], agent if args.fsdp else None)
        reward_rms.load_state_dict(ckpt["reward_rms"])
        global_step = ckpt["global_step"]  # iterations are counted in this run's global batches:
        start_iteration = global_step // (batch_size * world_size) + 1  # another world size keeps the schedule
        if rank == 0:
            evaluator.best_key = tuple(ckpt["best_key"])
        if rank == 0:
            note_schedule_change(ckpt, num_iterations, args.learning_rate, logger.write)
        pieces = [ckpt, *ckpt.get("other_ranks", [])]  # a ppo_continuous.py checkpoint is a world of one
        if len(pieces) == world_size and from_saved(pieces[rank]["next_obs"], "cpu").shape[0] == args.num_envs:
            piece = pieces[rank]
            if piece["env_state"] is not None:  # else the envs start fresh episodes, and so do the traces
                load_env_state_dict(envs, piece["env_state"])
                next_obs = from_saved(piece["next_obs"], device)
                reward_trace.copy_(piece["reward_trace"])
            set_rng_state(piece["rng"])
        else:
            rows = from_saved(pieces[0]["next_obs"], "cpu").shape[0]
            resume_note = f" (checkpoint of {len(pieces)} rank(s) x {rows} envs: envs reset freshly)"
    if rank == 0:
        logger.write(
            f"device={device} backend={backend} world={world_size} envs/rank={args.num_envs} "
            f"batch/rank={batch_size} minibatch/rank={minibatch_size} global_batch={batch_size * world_size} "
            f"iterations={num_iterations} start={start_iteration}{resume_note} run_dir={logger.run_dir}"
        )

    def save_checkpoint(name: str, pieces: list[dict]) -> str:  # rank 0 only; rank 0's env/RNG state at the top
        state = {
            "script": "ppo_ddp",
            "args": dataclasses.asdict(args),
            "model": pieces[0]["model"],  # trainable parameters and buffers, whole (gathered with --fsdp)
            "frozen": frozen,
            "optimizer": pieces[0]["optimizer"],
            "reward_rms": reward_rms.state_dict(),
            "iteration": iteration,
            "global_step": global_step,
            "num_iterations": num_iterations,
            "best_key": list(evaluator.best_key),
            "obs_dim": obs_dim,
            "act_dim": act_dim,
            "env": env_record(args, envs),  # id, options, observation layout: a resume must match them
            "world_size": world_size,
            **{k: v for k, v in pieces[0].items() if k not in ("model", "optimizer")},
            "other_ranks": pieces[1:],
        }
        return str(atomic_save(state, logger.checkpoint_dir / name))

    def gather_rank_states() -> list[dict] | None:  # a collective: every rank calls it at the same iterations
        model, optim = whole_state(agent, optimizer, args.fsdp)  # (with --fsdp a collective too)
        pieces = [None] * world_size if rank == 0 else None
        dist.gather_object(rank_state(envs, next_obs, reward_trace), pieces, dst=0)
        if rank == 0:
            pieces[0].update(model=model, optimizer=optim)
        return pieces

    storage = rollout_storage(
        args.num_steps,
        args.num_envs,
        device,
        obs=envs.single_observation_space,
        action=(envs.single_action_space.shape, torch.float32),
        logprob=((), torch.float32),
        value=((), torch.float32),
        final_value=((), torch.float32),
        reward=((), torch.float32),
        discount=((), torch.float32),
        terminated=((), torch.bool),
        done=((), torch.bool),
    )  # TensorDict observations are stored as they come, uint8 images as uint8
    cpu = device.type == "cpu"  # there, asking whether any episode ended costs nothing (no device to wait for)
    amp = autocast(args.autocast, device)
    micro_batch_size = min(args.micro_batch_size or minibatch_size, minibatch_size)
    task_names = envs.metadata.get("task_names")  # success is also logged per task
    iteration, eval_result, checkpoint = start_iteration - 1, None, None
    guard = SkipGuard(args.max_consecutive_skips, show=rank == 0)  # non-finite steps: skipped, counted
    next_eval, next_save, stopped = iteration + args.eval_freq, iteration + args.save_freq, 0
    start_time, start_step = time.time(), global_step
    # Ctrl-C or SIGTERM on any rank asks all ranks to stop after the current iteration (agreed through the
    # iteration's all-reduce; rank 0 alone writes). Repeats are absorbed: torchrun re-sends the signal to its
    # workers; its grace period (30 s, then SIGKILL) is the hard stop.
    say = logger.write if rank == 0 else lambda _: None
    with StopFlag(say, absorb_repeats=True) as stop:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - (iteration - 1) / num_iterations))

            # ---- rollout on this rank: no collective (and on a GPU no host sync) inside this loop ----
            rollout_stats = RolloutStats(device, task_names)
            watch = NonFiniteWatch(args.num_envs, device)
            with torch.no_grad():
                for step in range(args.num_steps):
                    with amp():
                        out = policy(next_obs)
                    storage["obs"][step] = next_obs
                    for key in ("action", "logprob", "value"):
                        storage[key][step] = out[key]
                    next_obs, reward, terminated, truncated, info = envs.step(out["env_action"])
                    storage["reward"][step], storage["terminated"][step] = reward, terminated
                    storage["discount"][step] = info.get("discount", args.gamma)  # gamma^k for a chunk of k steps
                    storage["done"][step] = done = terminated | truncated
                    rollout_stats.add_reward_terms(info)
                    if not cpu or done.any():  # what only finished episodes need; on a GPU every step (no sync)
                        with amp():
                            storage["final_value"][step] = value_fn(info["final_obs"])  # read only where done
                        watch.update_final(step, info["final_obs"], done)
                        rollout_stats.add_episodes(info)
                watch.update_rollout(storage["obs"], next_obs, storage["reward"])
                # one all-reduce: episode statistics summed over ranks, and whether any rank saw non-finite data
                summed = torch.cat([rollout_stats.sums, watch.seen()])
                dist.all_reduce(summed)
                if summed[-2:].sum() > 0:  # every rank stops; the rank(s) that saw it say where
                    watch.check(global_step, args.num_envs * args.action_chunk * world_size, where=f"rank {rank} ")
                    fail("", show=False)
                rollout_stats.sums = summed[:-2]
                rollout_stats.env_steps *= world_size  # the reward terms are summed over every rank's env steps
                global_step += batch_size * args.action_chunk * world_size

                # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
                with amp():
                    next_values = torch.cat([storage["value"][1:], value_fn(next_obs)[None]])
                next_values = torch.where(storage["done"], storage["final_value"], next_values)
                rewards, discounts = storage["reward"], storage["discount"]
                if args.norm_reward:
                    rewards = scale_rewards(
                        rewards, storage["done"], reward_trace, reward_rms, discounts, args.clip_reward, world_size
                    )
                advantages, returns = compute_gae(
                    rewards,
                    storage["value"],
                    next_values,
                    storage["terminated"],
                    storage["done"],
                    discounts,
                    args.gae_lambda,
                )

            # ---- PPO update: each rank its own minibatches, gradients averaged over ranks before each step ----
            batch = storage.select("obs", "action", "logprob", "value").reshape(-1)
            batch["advantages"], batch["returns"] = advantages.reshape(-1), returns.reshape(-1)
            update_stats = []  # statistics of the applied minibatch steps, averaged for logging
            for _epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device)
                epoch_kl = []
                for start in range(0, batch_size, minibatch_size):
                    mb = batch[perm[start : start + minibatch_size]]
                    mb = normalize_advantages(mb) if args.norm_adv else mb
                    optimizer.zero_grad(set_to_none=True)
                    loss = stats = None  # the minibatch's, summed over its pieces (their gradients add up)
                    for piece in micro_batches(mb, micro_batch_size):
                        with amp():
                            out = backward_fn(agent, piece, args, len(piece) / minibatch_size)
                        loss, stats = out if loss is None else (loss + out[0], stats + out[1])
                    if args.fsdp:  # FSDP averaged the gradients over the ranks in the backward; the loss still
                        mean_loss = loss.clone()  # needs it: one verdict on every rank
                        dist.all_reduce(mean_loss)
                        mean_loss /= world_size
                    else:
                        mean_loss = sync_gradients(params, world_size, loss)
                    grad_norm = full(clip_fn(params, args.max_grad_norm))
                    if not guard.ok(mean_loss, grad_norm, global_step):  # same verdict on every rank
                        continue
                    step_fn()
                    epoch_kl.append(stats["approx_kl"])
                    update_stats.append(stats)
                if args.target_kl is not None and epoch_kl:  # skips agree, so every rank has the same count here
                    kl = torch.stack(epoch_kl).mean()
                    dist.all_reduce(kl)
                    if float(kl) / world_size > args.target_kl:
                        break
            if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
                agent.obs_rms.update(state_vector(storage["obs"], batch_dims=2), world_size)  # float entries only
            if args.fsdp:  # the inference copy (rollout, evaluation) gets the updated weights, whole (a collective)
                gather_into(agent_inference, agent)

            # ---- one all-reduce: statistics averaged over ranks, and whether any rank was asked to stop ----
            explained_var = 1 - (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
            losses = torch.stack(update_stats).mean(0) if update_stats else TensorDict()
            summed = torch.cat(
                [torch.stack([*losses.values(), explained_var]), torch.tensor(stop.votes(), device=device)]
            )
            dist.all_reduce(summed)
            stopped = stop.agree(summed[-2:])  # the same on every rank: 0, or the exit status (130 / 143)
            eval_due = args.eval_freq and iteration >= next_eval and iteration < num_iterations
            save_due = args.save_freq and iteration >= next_save
            pieces = gather_rank_states() if eval_due or save_due else None
            if eval_due:
                next_eval = iteration + args.eval_freq
            if save_due:
                next_save = iteration + args.save_freq
            if rank == 0:  # logging, evaluation, checkpoints: rank 0 alone
                sps = (global_step - start_step) / (time.time() - start_time)
                scalars = {f"losses/{k}": v / world_size for k, v in zip(losses.keys(), summed)}
                scalars.update(
                    {
                        "losses/explained_variance": summed[-3] / world_size,
                        "charts/SPS": sps,
                        "charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "charts/skipped_updates": guard.skipped,
                        **rollout_stats.scalars(),
                    }
                )
                logger.log(scalars, global_step)
                logger.progress(
                    global_step,
                    SPS=sps,
                    ret=logger.latest.get("charts/episodic_return"),
                    succ=logger.latest.get("charts/success_rate"),
                )
                if eval_due:
                    eval_result, is_best = evaluator.run(act, global_step)
                    if is_best:
                        save_checkpoint("best.pt", pieces)
                if save_due:
                    checkpoint = save_checkpoint("last.pt", pieces)
                    save_checkpoint(f"iter_{iteration:06d}.pt", pieces)
            if stopped:
                break

        pieces = gather_rank_states()
        check_in_sync(agent_inference, rank, "at the end")  # (it shares the agent's weights, or holds them whole)
    envs.close()
    if rank == 0:
        checkpoint = save_checkpoint("last.pt", pieces)
        if not stopped:
            eval_result, is_best = evaluator.run(act, global_step)
            if is_best:
                save_checkpoint("best.pt", pieces)
                checkpoint = save_checkpoint("last.pt", pieces)  # again, with the best key a resume compares against
        wall = time.time() - start_time
        logger.finish(
            global_step,
            wall,
            (global_step - start_step) / max(wall, 1e-9),
            eval_result,
            checkpoint,
            world_size=world_size,
        )
        eval_envs.close()
    if stopped:
        sys.exit(stopped)  # 130 after Ctrl-C, 143 after SIGTERM (on any rank)
    return {
        "run_dir": str(logger.run_dir) if rank == 0 else None,
        "eval": eval_result,
        "global_step": global_step,
        "model": agent_inference.state_dict(),  # (the agent's weights, whole)
    }


if __name__ == "__main__":
    main(tyro.cli(Args))
