"""GRPO (Group Relative Policy Optimization) for continuous control, critic-free, in one file.

    uv run python cleanrl_embodied/grpo.py --env-id PushCubeRL
    uv run python cleanrl_embodied/grpo.py --env-id Pendulum-v1 --num-envs 64 --group-size 8 --gamma 0.99

Every iteration resets the envs with `reset(options={"group_size": G})`, so each group of G consecutive envs
starts from one identical state, and rolls out one horizon. Instead of a critic, the advantage of a step is
its discounted return-to-go compared with its group's members still in their first episode at that time step:
(R - their mean) / (the group's std pooled over the horizon + eps). The update is PPO's clipped surrogate, an
entropy bonus and an optional k3 KL penalty to a frozen reference policy.

Training metrics describe each env's first episode within the horizon (what is learnt from): `charts/success_rate`
is the share of *all* envs whose first episode succeeded within the horizon (one still running at the end is no
success; below the episode limit, long episodes are not left out), `grpo/finished_frac` the share whose first
episode ended, `charts/episodic_return` / `_length` the means over the first episodes that ended.

Read top to bottom: `Args`, the `Actor`, the pure functions (`policy_step`, `returns_to_go`, `group_advantages`,
`episode_advantages`, `grpo_loss`, and the update's `backward_piece` and `clip_gradients`), which torch.compile
wraps unchanged (`--compile`: by default where the run is long enough for it to pay), then `main`. Flag checks,
checkpoint loading, evaluation and Ctrl-C/SIGTERM are shared plumbing (`cleanrl_embodied.shared`); the algorithm
is all here.
"""

from __future__ import annotations

import dataclasses
import math
import sys
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
    load_checkpoint,
    load_model_state,
    load_optimizer,
    load_start,
    model_state,
    note_schedule_change,
    rng_state,
    set_rng_state,
)
from cleanrl_embodied.shared.cli import RunArgs, build_env, build_policy, check_args, fail
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
from cleanrl_embodied.shared.tensordict_helpers import flat_dim, micro_batches, state_dim, state_vector


@dataclass
class Args(RunArgs):  # RunArgs (shared/cli.py): run dir, tracking, envs, evaluation, checkpoints, --policy
    exp_name: str = "grpo"
    """the name of this experiment (part of the run directory name)"""
    num_envs: int = 256
    """number of parallel training environments (a multiple of --group-size)"""
    eval_freq: int = 10
    """evaluate every this many iterations on fresh starts (0: only the final evaluation)"""

    # Algorithm
    total_timesteps: int = 1_000_000
    """total environment steps (summed over envs, masked steps included)"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int | None = None
    """rollout horizon per env per iteration; default: the env's max episode steps (50 for PushCubeRL)"""
    group_size: int = 8
    """G: rollouts per group that start from the same state (>= 2, divides --num-envs)"""
    gamma: float = 0.9
    """discount factor of the step-wise returns-to-go"""
    truncate_at_first_done: bool = True
    """mask out each env's data after its first done (terminated | truncated)"""
    advantage: Literal["step", "episode"] = "step"
    """step: each step's discounted return-to-go against the group members still alive at that step; episode:
    each member's undiscounted first-episode return against its whole group's, given to all of its steps
    (GRPO's outcome supervision; for 0/1 success rewards, where an early success leaves the failures' later
    steps nobody alive to be compared with: docs/grpo.md, "Step or episode advantages")"""
    scale_adv: bool = True
    """divide by the group std and average the loss over alive samples (``--no-scale-adv``: Dr. GRPO, neither)"""
    adv_eps: float = 1e-4
    """added to the group std before dividing"""
    num_minibatches: int = 4
    """minibatches per epoch (must divide the batch of num_envs * horizon samples, masked ones included)"""
    update_epochs: int = 4
    """optimization epochs per rollout"""
    clip_coef: float = 0.2
    """PPO surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    kl_coef: float = 0.0
    """coefficient of the k3 KL penalty to the frozen reference policy (0: logged only)"""
    ref_checkpoint: str | None = None
    """reference policy (and initial policy) from a grpo or PPO-trainer checkpoint; default: the initial policy"""
    max_grad_norm: float = 0.5
    """global gradient-norm clipping"""
    target_kl: float | None = 0.1
    """stop the epoch loop early when the epoch's mean approximate KL exceeds this (None disables)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the actor MLP"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""
    action_head: Literal["gaussian", "bins"] = "gaussian"
    """the actor's distribution: a Gaussian per action entry, or a categorical over --action-bins bins per entry
    (OpenVLA's action tokens), decoded to the bin's centre within the action bounds"""
    action_bins: int = 256
    """bins per action entry (--action-head bins)"""
    action_chunk: int = 1
    """actions per decision: the policy emits this many at once and the env runs them one by one (a chunk)"""
    filter_groups: bool = False
    """leave out of the update the groups whose members all got the same returns (no learning signal; DAPO's
    dynamic sampling without its resampling, RIPT-VLA's filtering); `grpo/kept_group_frac` logs the share kept.
    Off by default: it did not help on PushCubeLangRL (docs/grpo.md, "Group filtering")"""
    micro_batch_size: int | None = None
    """split each minibatch into pieces of this many samples whose gradients add up (None: no split)"""
    autocast: Literal["none", "bf16"] = "none"
    """run the network's forward passes under bf16 autocast (weights, optimizer and log-probs stay float32)"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps",
                  "total_timesteps", "num_minibatches", "update_epochs", "learning_rate", "adv_eps", "gamma",
                  "clip_coef", "max_grad_norm", "target_kl"),
        non_negative=("ent_coef", "kl_coef"),
        at_most_one=("gamma",),
        finite=("init_logstd",),
        may_be_inf=("max_grad_norm",),  # no clipping
        files=("ref_checkpoint",),
    )  # fmt: skip
    if args.group_size < 2 or args.num_envs % args.group_size:
        fail(f"--group-size must be >= 2 and divide --num-envs={args.num_envs}, got {args.group_size}")
    if args.advantage == "episode" and not args.truncate_at_first_done:
        fail("--advantage episode compares first-episode returns: it needs --truncate-at-first-done")


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


class Actor(nn.Module):
    """The PPO trainers' actor without their critic and observation normalizer (parameter names match their Agent's,
    so a PPO checkpoint serves as the reference): an MLP on the float observation (images and instructions first go
    through the shared `PixelEncoder`), a Gaussian with a state-independent log-std or a categorical over bins per
    action entry, over one action [D] or a chunk [K, D]."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, args: Args):
        super().__init__()
        self.encoder = PixelEncoder(obs_space, state_dim(obs_space)) if needs_encoder(obs_space) else None
        features = self.encoder.out_dim if self.encoder else state_dim(obs_space)
        self.action_shape, self.bins = act_space.shape, args.action_bins if args.action_head == "bins" else 0
        act_dim = math.prod(self.action_shape)
        if self.bins:  # one categorical per action entry; the raw action is the bin index
            self.actor_logits = mlp(features, args.hidden_sizes, act_dim * self.bins, out_std=0.01)
            low, high = bin_bounds(act_space, self.bins)
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)
        else:
            self.actor_mean = mlp(features, args.hidden_sizes, act_dim, out_std=0.01)
            self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.init_logstd))

    def dist(self, obs: torch.Tensor | TensorDict) -> torch.distributions.Distribution:
        state = state_vector(obs)  # a plain observation tensor as it is
        features = state if self.encoder is None else self.encoder(obs, state)
        if self.bins:
            return Bins(self.actor_logits(features).view(-1, *self.action_shape, self.bins))
        mean = self.actor_mean(features).float()  # (float32 also under bf16 autocast)
        std = self.actor_logstd.expand_as(mean).exp()
        # validate_args=False: the argument check would cost a host sync on every call
        shape = (-1, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """What the env gets for a raw action: a Gaussian sample as it is (the env clips), a bin index's centre."""
        return decode_bins(action, self.action_low, self.action_high, self.bins) if self.bins else action


ACTION_ARGS = ("action_head", "action_bins", "action_chunk")  # what the actor's output means


def make_agent(envs, args: Args) -> nn.Module:
    """The built-in `Actor`, or the module that `--policy module:factory` builds from the spaces and args. Its
    `dist(obs)` is a per-entry distribution: `log_prob(action)` summed over the action's entries is the action's."""
    if args.policy is None:
        return Actor(envs.single_observation_space, envs.single_action_space, args)
    return build_policy(args, envs, needs=("dist",))


def policy_step(actor: Actor, obs: torch.Tensor | TensorDict) -> TensorDict:
    """Sample a raw action (unclipped Gaussian, or bin indices); return it with its log-prob (summed over the
    action's entries, a chunk's too) and the action the env gets."""
    dist = actor.dist(obs)
    action = dist.sample()
    return TensorDict(
        action=action,
        logprob=dist.log_prob(action).flatten(1).sum(-1),
        env_action=actor.env_action(action),
        batch_size=obs.shape[:1],
    )


def eval_action(actor: Actor, obs: torch.Tensor, generator: torch.Generator, deterministic: bool) -> torch.Tensor:
    """The evaluation policy: the distribution's mode (the Gaussian's mean, the most likely bin), or a sample drawn
    from the evaluator's own generator."""
    dist = actor.dist(obs)
    return actor.env_action(dist.mode if deterministic else sample(dist, generator))


def returns_to_go(rewards: torch.Tensor, dones: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """Discounted returns-to-go over a [T, N] rollout of decisions; they restart after every done (no bootstrap).
    `gamma`: a float, or [T, N] where a decision ran k env steps (an action chunk: gamma^k)."""
    discounts = torch.as_tensor(gamma, dtype=rewards.dtype, device=rewards.device).expand_as(rewards)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + discounts[t] * torch.where(dones[t], 0.0, running)
        returns[t] = running
    return returns


def episode_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, group_size: int, scale: bool, eps: float
) -> tuple[torch.Tensor, TensorDict]:
    """Outcome-level group advantages: each member's undiscounted return over its first episode (`mask` [T, N])
    against its whole group's, as `group_advantages` compares one cell; every step of the episode gets it."""
    returns = torch.where(mask, rewards, 0.0).sum(0, keepdim=True)  # [1, N]
    adv, stats = group_advantages(returns, torch.ones_like(mask[:1]), group_size, scale, eps)
    return torch.where(mask, adv, 0.0), stats


def first_episode_mask(dones: torch.Tensor) -> torch.Tensor:
    """[T, N] bool: True up to and including each env's first done, False after it."""
    d = dones.int()
    return (d.cumsum(0) - d) == 0


def group_advantages(
    returns: torch.Tensor, mask: torch.Tensor, group_size: int, scale: bool, eps: float
) -> tuple[torch.Tensor, TensorDict]:
    """Group-relative advantages per time step over the alive members of each group.

    returns, mask: [T, N], N = num_groups * group_size (consecutive envs form a group). A cell (time step,
    group) with two or more alive members (mask True) and unequal returns centres them on their mean; with
    `scale` it divides by (the group's pooled std + eps): squared deviations summed over those cells, over
    the sum of their (alive - 1). One scale per group keeps a gap's size: with two members left late in the
    horizon, a per-cell std would make any gap (1e-3 or 3) +-0.707. Other cells and masked entries get 0,
    never NaN. Statistics: zero_adv_group_frac (share of cells with an alive member that got 0),
    mean_group_std (mean pooled std over groups with a non-zero cell).
    """
    T, N = returns.shape
    alive = mask.reshape(T, N // group_size, group_size)
    r = torch.where(alive, returns.reshape(T, N // group_size, group_size), 0.0)
    count = alive.sum(-1, keepdim=True)
    mean = r.sum(-1, keepdim=True) / count.clamp_min(1)
    centred = torch.where(alive, r - mean, 0.0)
    spread = torch.where(alive, r, -torch.inf).amax(-1, keepdim=True) - torch.where(alive, r, torch.inf).amin(
        -1, keepdim=True
    )
    zero = (count < 2) | ~(spread > 0)  # exact ties: the mean's rounding must not become a signal
    dof = torch.where(zero, 0, count - 1).sum(0, keepdim=True)  # [1, groups, 1]
    sq = torch.where(zero, 0.0, centred * centred).sum((0, 2), keepdim=True)
    std = (sq / dof.clamp_min(1)).sqrt()
    adv = torch.where(zero, 0.0, centred / (std + eps) if scale else centred)
    live, has = count >= 1, dof > 0
    return adv.reshape(T, N), TensorDict(
        zero_adv_group_frac=(zero & live).sum() / live.sum().clamp_min(1),
        mean_group_std=torch.where(has, std, 0.0).sum() / has.sum().clamp_min(1),
    )


def grpo_loss(
    actor: Actor, mb: TensorDict, args: Args, denominator: torch.Tensor | int | None = None
) -> tuple[torch.Tensor, TensorDict]:
    """Masked PPO-clip loss + entropy bonus + k3 KL to the reference on one minibatch; (loss, statistics).

    GRPO averages over the alive samples; Dr. GRPO (``--no-scale-adv``) divides their sum by the minibatch
    size, a constant. ``denominator``: what the sum is divided by when ``mb`` is a piece of a minibatch (that of
    the whole minibatch, so the pieces' losses add up to its loss). Masks select with torch.where before anything
    can overflow: a masked sample has ratio 1 and gradient 0 (multiplying by the mask turns an overflowed ratio
    into NaN). Statistics: means over ``mb``'s alive samples.
    """
    alive = mb["mask"]
    n_alive = alive.sum().clamp_min(1)
    if denominator is None:
        denominator = n_alive if args.scale_adv else alive.numel()
    total = lambda x: torch.where(alive, x, 0.0).sum()
    dist = actor.dist(mb["obs"])
    newlogprob = dist.log_prob(mb["action"]).flatten(1).sum(-1)
    logratio = torch.where(alive, newlogprob - mb["logprob"], 0.0)
    ratio = logratio.exp()
    adv = mb["advantages"]
    pg = total(torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
    entropy = total(dist.entropy().flatten(1).sum(-1))
    # k3 = r - log r - 1 with r = pi_ref / pi: its value estimates KL(pi || pi_ref) on samples from pi; its
    # gradient with the samples held fixed, (1 - r) grad log pi, estimates grad KL(pi_ref || pi) (the forward
    # KL). Only exp() can overflow (pi far below pi_ref), so only that side is clamped: a policy far sharper
    # than the reference (log r << 0) keeps its full gradient back toward it.
    ref_logratio = torch.where(alive, mb["ref_logprob"] - newlogprob, 0.0).clamp(max=20.0)
    kl_ref = total(ref_logratio.exp() - ref_logratio - 1)
    loss = (pg - args.ent_coef * entropy + args.kl_coef * kl_ref) / denominator
    with torch.no_grad():
        stats = (
            TensorDict(
                policy_loss=pg,
                entropy=entropy,
                kl_ref=kl_ref,
                old_approx_kl=total(-logratio),
                approx_kl=total((ratio - 1) - logratio),
                clipfrac=total(((ratio - 1.0).abs() > args.clip_coef).float()),
            )
            / n_alive
        ).detach()
    return loss, stats


def backward_piece(
    actor: Actor, piece: TensorDict, args: Args, denominator: torch.Tensor | int, share: torch.Tensor
) -> tuple[torch.Tensor, TensorDict]:
    """GRPO's loss on a piece of a minibatch (its sum over the whole minibatch's `denominator`, so that the pieces'
    losses and gradients add up to the minibatch's), backpropagated into the parameters' `.grad`; returns the loss
    and the statistics times `share` (the piece's share of the minibatch's alive samples), detached."""
    loss, stats = grpo_loss(actor, piece, args, denominator)
    loss.backward()
    return loss.detach(), stats * share


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global norm of at most `max_norm`; returns the norm before clipping."""
    return nn.utils.clip_grad_norm_(params, max_norm)


def informative_groups(advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] bool: the envs of the groups where some member got a non-zero advantage somewhere in the horizon, i.e.
    whose members' returns differ (a group of equal returns, e.g. all 0/1 successes alike, teaches nothing)."""
    T, N = advantages.shape
    nonzero = (advantages != 0).reshape(T, N // group_size, group_size)
    return nonzero.any(0).any(-1).repeat_interleave(group_size)


def group_reset(envs, args: Args, iteration: int) -> tuple[torch.Tensor, dict]:
    """Group starts seeded by (seed, iteration): a resumed run sees the starts a straight run would."""
    seed = stream_seed(args.seed, "group_resets", iteration)
    try:
        return envs.reset(seed=seed, options={"group_size": args.group_size})
    except ValueError as e:
        fail(f"--group-size {args.group_size}: {args.env_id} can't give groups identical starts: {e}")


def save_checkpoints(
    paths: list,
    args: Args,
    actor: nn.Module,
    ref_actor: nn.Module | None,
    frozen: str,
    optimizer,
    envs,
    evaluator: Evaluator,
    iteration: int,
    global_step: int,
    num_iterations: int,
) -> None:
    """Everything a resume needs, as plain tensors and numbers (iteration: the completed ones)."""
    trained = model_state(actor)  # the reference's entries that may differ from the frozen weights: the same keys
    state = {
        "script": "grpo",
        "args": dataclasses.asdict(args),
        "model": trained,  # trainable parameters and buffers
        "frozen": frozen,
        "ref_model": None if ref_actor is None else {k: ref_actor.state_dict()[k] for k in trained},  # None: own
        "optimizer": optimizer.state_dict(),
        "iteration": iteration,
        "global_step": global_step,
        "num_iterations": num_iterations,
        "best_key": list(evaluator.best_key),
        "obs_dim": flat_dim(envs.single_observation_space),
        "act_dim": int(np.prod(envs.single_action_space.shape)),
        "env": env_record(args, envs),  # id, options, observation layout: a resume must match them
        "rng": rng_state(),
        "env_state": env_state_dict(envs),
    }
    for path in paths:
        atomic_save(state, path)


def main(args: Args) -> dict:
    validate(args)
    same = ("env_id", "hidden_sizes", "policy", "policy_kwargs", *ACTION_ARGS)
    ckpt, ckpt_flag = load_start(
        args, ["grpo"], same, resume_same=("num_envs", "group_size", "learning_rate", "anneal_lr")
    )
    ref_scripts = ["grpo", "ppo_continuous", "ppo_ddp", "ppo_async"]  # a PPO critic is ignored
    ref_ckpt = (
        load_checkpoint(args.ref_checkpoint, "ref_checkpoint", ref_scripts, args, same) if args.ref_checkpoint else None
    )
    if ref_ckpt is not None and ref_ckpt["args"].get("norm_obs"):
        fail(f"--ref-checkpoint {args.ref_checkpoint}: trained with --norm-obs, which grpo.py does not have")
    seed_everything(args.seed, args.torch_deterministic)
    device = pick_device(args.cuda)

    eval_envs = build_env(args, "eval_env_kwargs", args.num_eval_envs, stream_seed(args.seed, "eval_envs"), device)
    obs_dim, act_dim = check_dims(eval_envs, (ckpt, ckpt_flag), (ref_ckpt, "ref_checkpoint"))
    actor = make_agent(eval_envs, args).to(device)
    own_reference = hasattr(actor, "reference_dist")  # a policy that keeps its reference (e.g. LoRA adapters off)
    if own_reference and args.ref_checkpoint:
        fail(
            f"--ref-checkpoint: --policy {args.policy} provides its own KL reference (reference_dist); point the "
            "policy at the reference weights instead (e.g. its model_path)"
        )
    if ref_ckpt is not None:  # the policy starts from the reference too (a PPO trainer's critic is dropped)
        mine = {k: v for k, v in ref_ckpt["model"].items() if k in actor.state_dict()}
        load_model_state(actor, {**ref_ckpt, "model": mine}, "ref_checkpoint", args.ref_checkpoint)
    # reference: --ref-checkpoint, else the resumed run's reference, else the initial policy; a frozen copy, unless
    # the policy provides its own
    ref_actor = None if own_reference else make_agent(eval_envs, args).to(device)
    if ref_actor is not None:
        resumed_ref = args.resume and ref_ckpt is None and ckpt["ref_model"] is not None
        ref_actor.load_state_dict(ckpt["ref_model"] if resumed_ref else actor.state_dict(), strict=False)
        ref_actor.requires_grad_(False)
    if ckpt is not None:
        load_model_state(actor, ckpt, ckpt_flag, getattr(args, ckpt_flag))
    frozen = frozen_fingerprint(actor)  # what checkpoints record of the weights they leave out
    reference = actor.reference_dist if ref_actor is None else ref_actor.dist
    act = partial(eval_action, actor, deterministic=args.eval_deterministic)
    if args.eval_checkpoint:  # evaluate a saved policy and exit
        logger = RunLogger("grpo", args)
        return Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video).run_checkpoint(
            act, ckpt, args.eval_checkpoint
        )

    envs = build_env(args, "env_kwargs", args.num_envs, stream_seed(args.seed, "train_envs"), device, like=eval_envs)
    start_iteration = ckpt["iteration"] + 1 if ckpt is not None else 1
    if ckpt is not None and ckpt["env_state"] is not None:
        load_env_state_dict(envs, ckpt["env_state"])
    next_obs, start_info = group_reset(envs, args, start_iteration)  # first: can the env give groups one start?
    episode_steps = (envs.spec.max_episode_steps if envs.spec is not None else None) or getattr(
        envs.unwrapped, "max_episode_steps", None
    )
    horizon = args.num_steps or (episode_steps and -(-episode_steps // args.action_chunk))  # in decisions
    if not horizon:
        fail(f"--num-steps is required: {args.env_id} declares no max episode steps")
    batch_size = args.num_envs * horizon
    if batch_size % args.num_minibatches:
        fail(f"--num-minibatches must divide the batch size num_envs*horizon={batch_size}, got {args.num_minibatches}")
    num_iterations = max(1, args.total_timesteps // (batch_size * args.action_chunk))
    if start_iteration > num_iterations:
        fail(f"--total-timesteps {args.total_timesteps}: {args.resume} already completed {num_iterations} iterations")
    params = [p for p in actor.parameters() if p.requires_grad]
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    logger = RunLogger("grpo", args, total_iterations=num_iterations - start_iteration + 1)
    evaluator = Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    global_step = 0
    if ckpt is not None:  # resume: counters, optimizer, schedule and random stream continue the straight run
        load_optimizer(optimizer, ckpt["optimizer"])
        global_step, evaluator.best_key = ckpt["global_step"], tuple(ckpt["best_key"])
        note_schedule_change(ckpt, num_iterations, args.learning_rate, logger.write)
        set_rng_state(ckpt["rng"])
    logger.write(
        f"device={device} groups={args.num_envs // args.group_size}x{args.group_size} horizon={horizon} "
        f"batch={batch_size} iterations={num_iterations} start={start_iteration} run_dir={logger.run_dir}"
    )
    updates = num_iterations * args.update_epochs * args.num_minibatches  # minibatch updates planned
    compiled = compiler(args.compile, device, updates, logger.write)  # torch.compile, or eager (the identity)
    policy = compiled(policy_step)
    advantages_fn = compiled(group_advantages if args.advantage == "step" else episode_advantages)
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)

    storage = rollout_storage(
        horizon,
        args.num_envs,
        device,
        obs=envs.single_observation_space,
        action=(envs.single_action_space.shape, torch.float32),
        logprob=((), torch.float32),
        reward=((), torch.float32),
        discount=((), torch.float32),
        done=((), torch.bool),
    )  # TensorDict observations are stored as they come, uint8 images as uint8
    cpu = device.type == "cpu"  # there, asking whether any episode ended costs nothing (no device to wait for)
    amp = autocast(args.autocast, device)
    minibatch_size = batch_size // args.num_minibatches
    micro_batch_size = min(args.micro_batch_size or minibatch_size, minibatch_size)
    task_names = envs.metadata.get("task_names")  # success is also logged per task
    iteration, eval_result = start_iteration - 1, None
    guard = SkipGuard(args.max_consecutive_skips)  # non-finite optimizer steps are skipped and counted
    next_eval, next_save = iteration + args.eval_freq, iteration + args.save_freq
    start_time, start_step = time.time(), global_step
    with StopFlag(logger.write) as stop:  # Ctrl-C / SIGTERM: finish this iteration, save, write the summary
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - (iteration - 1) / num_iterations))
            if iteration > start_iteration:  # the first iteration's starts were drawn above
                next_obs, start_info = group_reset(envs, args, iteration)

            # ---- rollout of one horizon from group starts: no host sync inside this loop on a GPU ----
            rollout_stats = RolloutStats(device, task_names)  # of the first episodes that end within the horizon
            alive = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # still in the first episode
            success = torch.zeros_like(alive)  # the first episode succeeded within the horizon
            watch = NonFiniteWatch(args.num_envs, device)
            with torch.no_grad():
                for step in range(horizon):
                    with amp():
                        out = policy(actor, next_obs)
                    storage["obs"][step] = next_obs
                    storage["action"][step], storage["logprob"][step] = out["action"], out["logprob"]
                    next_obs, reward, terminated, truncated, info = envs.step(out["env_action"])
                    done = terminated | truncated
                    storage["reward"][step], storage["done"][step] = reward, done
                    storage["discount"][step] = info.get("discount", args.gamma)  # gamma^k for a chunk of k steps
                    rollout_stats.add_reward_terms(info)
                    if not cpu or done.any():  # what only finished episodes need (on the CPU, asking is free)
                        watch.update_final(step, info["final_obs"], done)
                        counted = done & alive
                        rollout_stats.add_episodes(info, counted=counted)
                        success |= counted & (info["episode"]["success"] > 0)
                        alive &= ~done
                watch.update_rollout(storage["obs"], next_obs, storage["reward"])  # obs[0]: the group starts
            watch.check(global_step, args.num_envs * args.action_chunk, where=f"{args.env_id} ")  # envs and step
            global_step += batch_size * args.action_chunk  # env steps (a decision runs --action-chunk of them)

            # ---- group-relative advantages (critic-free) ----
            with torch.no_grad():
                mask = (
                    first_episode_mask(storage["done"])
                    if args.truncate_at_first_done
                    else torch.ones_like(storage["done"])
                )
                returns = (
                    returns_to_go(storage["reward"], storage["done"], storage["discount"])
                    if args.advantage == "step"
                    else storage["reward"]  # episode_advantages sums them over each first episode
                )
                advantages, adv_stats = advantages_fn(returns, mask, args.group_size, args.scale_adv, args.adv_eps)
                kept = informative_groups(advantages, args.group_size)  # groups whose returns differ
                if args.filter_groups:  # the others leave the update (and its averages) altogether
                    mask = mask & kept
                batch = storage.select("obs", "action", "logprob").reshape(-1)
                batch["advantages"], batch["mask"] = advantages.reshape(-1), mask.reshape(-1)
                with amp():
                    ref_dist = reference(batch["obs"])
                batch["ref_logprob"] = ref_dist.log_prob(batch["action"]).flatten(1).sum(-1)

            # ---- PPO-clip update over the masked samples ----
            update_stats = []  # statistics of the applied minibatch steps, averaged for logging
            learn = not args.filter_groups or bool(kept.any())  # no group with a signal: no update at all
            for _epoch in range(args.update_epochs if learn else 0):
                epoch_kl = []
                for idx in torch.randperm(batch_size, device=device).view(args.num_minibatches, -1):
                    mb = batch[idx]
                    n_alive = mb["mask"].sum().clamp_min(1)
                    denominator = n_alive if args.scale_adv else len(mb)  # of the whole minibatch
                    optimizer.zero_grad(set_to_none=True)
                    loss = stats = None  # the minibatch's, summed over its pieces (their gradients add up)
                    for piece in micro_batches(mb, micro_batch_size):
                        with amp():
                            out = backward_fn(actor, piece, args, denominator, piece["mask"].sum() / n_alive)
                        loss, stats = out if loss is None else (loss + out[0], stats + out[1])
                    grad_norm = clip_fn(params, args.max_grad_norm)
                    if not guard.ok(loss, grad_norm, global_step):  # many in a row stop the run
                        continue
                    step_fn()
                    epoch_kl.append(stats["approx_kl"])
                    update_stats.append(stats)
                if args.target_kl is not None and epoch_kl and float(torch.stack(epoch_kl).mean()) > args.target_kl:
                    break

            # ---- logging: one host sync per iteration ----
            sps = (global_step - start_step) / (time.time() - start_time)
            means = torch.stack(update_stats).mean(0).items() if update_stats else ()
            scalars = {("grpo/" if k == "kl_ref" else "losses/") + k: v for k, v in means}
            scalars.update(
                {
                    "charts/SPS": sps,
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    "charts/skipped_updates": guard.skipped,
                    "grpo/mask_frac": mask.float().mean(),
                    "grpo/kept_group_frac": kept.float().mean(),
                    "grpo/finished_frac": (~alive).float().mean(),
                    **rollout_stats.scalars(),
                    **{f"grpo/{k}": v for k, v in adv_stats.items()},
                }
            )
            if rollout_stats.has_success:  # every env counts: its first episode succeeded within the horizon or not
                scalars["charts/success_rate"] = success.float().mean()
                for task, name in enumerate(task_names or ()):  # the envs that started on each task
                    on_task = start_info["task_id"] == task
                    if bool(on_task.any()):
                        scalars[f"charts/success_rate/{name}"] = (success & on_task).sum() / on_task.sum()
            logger.log(scalars, global_step)
            logger.progress(
                global_step,
                SPS=sps,
                ret=logger.latest.get("charts/episodic_return"),
                succ=logger.latest.get("charts/success_rate"),
            )

            # frequencies are thresholds on the iteration counter (they survive resumes and odd sizes); the last
            # iteration evaluates (unless stopped) and writes last.pt
            stopping = stop.requested
            last = stopping or iteration == num_iterations
            names = ["last.pt"] if last else []
            if (args.eval_freq and iteration >= next_eval) or (last and not stopping):
                next_eval = iteration + args.eval_freq
                eval_result, is_best = evaluator.run(act, global_step)
                names += ["best.pt"] * is_best
            if args.save_freq and iteration >= next_save:
                next_save = iteration + args.save_freq
                names += ["last.pt", f"iter_{iteration:06d}.pt"]
            if names:  # assembling a checkpoint copies the env state to the host: only when one is written
                save_checkpoints(
                    [logger.checkpoint_dir / n for n in dict.fromkeys(names)],
                    args,
                    actor,
                    ref_actor,
                    frozen,
                    optimizer,
                    envs,
                    evaluator,
                    iteration,
                    global_step,
                    num_iterations,
                )
            if stopping:
                break

    checkpoint = str(logger.checkpoint_dir / "last.pt")
    wall = time.time() - start_time
    logger.finish(global_step, wall, (global_step - start_step) / max(wall, 1e-9), eval_result, checkpoint)
    envs.close()
    eval_envs.close()
    if stop.requested:
        sys.exit(stop.exit_status)  # 130 after Ctrl-C, 143 after SIGTERM
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step, "checkpoint": checkpoint}


if __name__ == "__main__":
    main(tyro.cli(Args))
