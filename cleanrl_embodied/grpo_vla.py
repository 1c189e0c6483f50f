"""GRPO (Group Relative Policy Optimization) for fine-tuning vision-language-action (VLA) policies, in one file.

    uv run python cleanrl_embodied/grpo_vla.py --env-id PushCubeLangRL \
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}' \
        --policy examples.hf_vla:make_policy --policy-kwargs '{"model_path": "runs/vla_bc"}' \
        --action-head bins --action-bins 16 --action-chunk 4 --micro-batch-size 32 --kl-coef 0.02

As in TorchRL's sota-implementations/vla_grpo, the trainer is this file and the model is one module, built by
`--policy module:factory` (default: examples/hf_vla, PaliGemma with LoRA adapters) from the observation space, the
action space of one decision and these Args (the factory reads --action-head and --action-bins). The module
provides `dist(obs)` over the raw action (e.g. bin indices), `env_action(raw action)` (what the env gets) and
`reference_dist(obs)`, the policy the k3 KL penalty keeps it near (examples/hf_vla: its adapters off, heads as
built), so no second copy of the model is kept. With `--action-chunk K > 1` a decision is a chunk of K actions
([K, D]) that the envs run one by one (`step_chunk`); `--micro-batch-size` bounds every forward pass (rollout,
evaluation, the reference's log-probs, and the update's, whose gradients add up over the pieces); `--autocast bf16`
runs them under bf16 autocast. Checkpoints hold what trains (adapters, heads) and a fingerprint of the frozen rest.

Every iteration resets the envs with `reset(options={"group_size": G})`, so each group of G consecutive envs
starts from one identical state, and rolls out one horizon of decisions. Instead of a critic, a decision's
advantage compares its discounted return-to-go with those of its group's members still in their first episode at
that decision (or, with `--advantage episode`, each member's undiscounted first-episode return with its group's:
the sum of the rewards of the steps its decisions ran, whatever the chunk they fell in). The update is PPO's
clipped surrogate, an entropy bonus and the k3 KL penalty. Training metrics describe each env's first episode within
the horizon: `charts/success_rate` is the share of *all* envs whose first episode succeeded within the horizon.

Read top to bottom: `Args`; the pure functions (`policy_step`, `sample_with`, `eval_action`,
`decision_returns_to_go`, `group_advantages`, `episode_advantages`, `grpo_loss`, `backward_piece`,
`clip_gradients`), which torch.compile wraps unchanged (`--compile`); then `main` with the training loop.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied import shared


@dataclass
class Args(shared.RunArgs):  # RunArgs (shared/cli.py): run dir, env options, evaluation, checkpoints, --policy-kwargs
    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run directory name); default: this file's name"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when it is available (``--no-cuda`` forces the CPU)"""
    track: bool = False
    """log to Weights & Biases (synced with TensorBoard)"""
    wandb_project_name: str = "cleanrl_embodied"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """record the first eval env's episode as mp4 at every evaluation (run_dir/videos/)"""
    env_id: str = "PushCubeRL"
    """the environment id: PushCubeRL, PushCubeLangRL, any Gymnasium id with a Box action space, or a ManiSkill id"""
    total_timesteps: int = 1_000_000
    """total environment steps (summed over envs, masked steps included; a chunk of K actions counts K)"""
    num_envs: int = 256
    """number of parallel training environments (a multiple of --group-size)"""

    # Algorithm
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int | None = None
    """rollout horizon per env per iteration, in decisions; default: the env's max episode steps (50 for
    PushCubeRL) over --action-chunk, rounded up"""
    group_size: int = 8
    """G: rollouts per group that start from the same state (>= 2, divides --num-envs)"""
    gamma: float = 0.9
    """discount factor per env step of the step-wise returns-to-go (a chunk's steps are discounted inside it)"""
    truncate_at_first_done: bool = True
    """mask out each env's data after its first done (terminated | truncated)"""
    advantage: Literal["step", "episode"] = "step"
    """step: each decision's discounted return-to-go against the group members still alive at that decision;
    episode: each member's undiscounted first-episode return against its whole group's, on all of its decisions
    (GRPO's outcome supervision, for 0/1 success rewards: docs/grpo.md, "Step or episode advantages")"""
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
    clip_coef_high: float | None = None
    """upper clip of the ratio, 1 + this (DAPO's clip-higher: 0.28 with --clip-coef 0.2 leaves low-probability actions
    room to grow); None: --clip-coef"""
    loss_agg: Literal["decision", "token"] = "decision"
    """decision: one ratio per decision (its log-prob summed over the chunk's K*D action entries); token: a ratio per
    entry, clipped per entry and averaged over entries (DAPO's token-level loss, as VLA-RL recipes apply it to action
    tokens)"""
    temperature: float = 1.0
    """sampling temperature of the rollout and of the update's log-probs (bins: logits / T; Gaussian: std * sqrt(T));
    SimpleVLA-RL, RLinf and TorchRL's vla_grpo roll out at 1.6; evaluation is unchanged (deterministic: the mode)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    kl_coef: float = 0.0
    """coefficient of the k3 KL penalty to the policy's `reference_dist` (0: logged only)"""
    max_grad_norm: float = 0.5
    """global gradient-norm clipping"""
    target_kl: float | None = 0.1
    """stop the epoch loop early when the epoch's mean approximate KL exceeds this (None disables)"""
    min_informative_groups: int = 0
    """dynamic sampling (DAPO; TorchRL's candidate groups, SimpleVLA-RL's oversampling): after a rollout, draw new
    groups from new shared starts until this many groups whose returns differ are collected or --max-draws rollouts
    were drawn, and update on exactly that many groups (any shortfall filled with masked groups, logged as
    grpo/shortfall_groups); every draw's env steps count. 0: off (one rollout, every group)"""
    max_draws: int = 4
    """the most rollouts an iteration draws for --min-informative-groups (so it ends when every group succeeds or
    every group fails)"""
    filter_groups: bool = False
    """leave out of the update the groups whose members all got the same returns (DAPO's dynamic sampling without
    its resampling); `grpo/kept_group_frac` logs the share kept (docs/grpo.md, "Group filtering")"""
    eval_freq: int = 10
    """evaluate every this many iterations on fresh starts (0: only the final evaluation)"""

    # The policy (passed to the --policy factory through these Args) and its memory
    policy: str = "examples.hf_vla:make_policy"
    """the `module:factory` that builds the policy (docs/policies.md, docs/VLA.md)"""
    action_head: Literal["gaussian", "bins"] = "gaussian"
    """the policy's action distribution: a Gaussian per action entry, or a categorical over --action-bins bins per
    entry (OpenVLA's action tokens), decoded to the bin's centre within the action bounds"""
    action_bins: int = 256
    """bins per action entry (--action-head bins)"""
    action_chunk: int = 1
    """actions per decision: the policy emits this many at once and the env runs them one by one (a chunk)"""
    micro_batch_size: int | None = None
    """the most samples of any forward pass: minibatches are split into pieces whose gradients add up, rollout,
    reference and evaluation batches into pieces (None: no split)"""
    autocast: Literal["none", "bf16"] = "none"
    """run the policy's forward passes under bf16 autocast (weights, optimizer and log-probs stay float32)"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    shared.check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps", "total_timesteps",
                  "num_minibatches", "update_epochs", "learning_rate", "adv_eps", "gamma", "clip_coef",
                  "clip_coef_high", "temperature", "max_grad_norm", "target_kl", "max_draws"),
        non_negative=("ent_coef", "kl_coef", "min_informative_groups"),
        at_most_1=("gamma",),
        may_be_inf=("max_grad_norm",),  # no clipping
        sizes=(),
    )  # fmt: skip
    if args.group_size < 2 or args.num_envs % args.group_size:
        shared.fail(f"--group-size must be >= 2 and divide --num-envs={args.num_envs}, got {args.group_size}")
    if args.advantage == "episode" and not args.truncate_at_first_done:
        shared.fail("--advantage episode compares first-episode returns: it needs --truncate-at-first-done")


ACTION_ARGS = ("action_head", "action_bins", "action_chunk")  # what the policy's output means


def make_agent(envs, args: Args) -> nn.Module:
    """The module `--policy module:factory` builds for the envs' observations and one decision's action space: the
    env's, or with --action-chunk K > 1 a chunk of K of them ([K, D]); one line if the envs cannot run chunks."""
    if args.action_chunk > 1 and not shared.supports_partial_reset(envs):
        shared.fail(
            f"--action-chunk {args.action_chunk}: {type(envs.unwrapped).__name__} cannot reset a subset of its envs, "
            "which chunks need (an episode that ends inside a chunk is restarted at the chunk's end); use "
            "PushCubeRL, PushCubeLangRL or a Gymnasium id with --env-vectorization sync or async"
        )
    needs = ("dist", "env_action", "reference_dist")
    return shared.build_policy(args.policy, args.policy_kwargs, envs.single_observation_space,
                               action_space(envs, args), args, needs)  # fmt: skip


def action_space(envs, args: Args):
    """One decision's action space: the env's, or with --action-chunk K > 1 a chunk of K of them ([K, D])."""
    space = envs.single_action_space
    return shared.chunk_space(space, args.action_chunk) if args.action_chunk > 1 else space


def aggregate(x: torch.Tensor, per_token: bool) -> torch.Tensor:
    """Per-entry log-probs (or entropies) [B, ...] of a decision's action: summed over its entries, the decision's
    [B], or kept per entry [B, E] (--loss-agg token: a ratio per action token)."""
    x = x.flatten(1)
    return x if per_token else x.sum(-1)


def tempered(dist: torch.distributions.Distribution, temperature: float) -> torch.distributions.Distribution:
    """`dist` at `temperature` (--temperature): its density to the power 1/T, renormalised: a categorical's (the bins')
    logits divided by T, a Gaussian's std times sqrt(T) (its mean, the mode, unchanged); at 1, `dist` itself. The
    rollout samples from it and the update's log-probs are taken under it."""
    if temperature == 1.0:
        return dist
    if isinstance(dist, torch.distributions.Normal):
        return torch.distributions.Normal(dist.loc, dist.scale * temperature**0.5, validate_args=False)
    return type(dist)(logits=dist.logits / temperature)


def in_pieces(fn: Callable, obs: torch.Tensor | TensorDict, size: int):
    """`fn(obs)` computed on pieces of at most `size` rows and joined (--micro-batch-size bounds every forward)."""
    if obs.shape[0] <= size:
        return fn(obs)
    return torch.cat([fn(piece) for piece in obs.split(size)])


def policy_step(actor: nn.Module, obs: torch.Tensor | TensorDict, temperature: float, per_token: bool) -> TensorDict:
    """Sample a raw action (a Gaussian sample, bin indices; a chunk's K actions at once); return it with its log-prob
    (summed over the action's entries) and the action the env gets."""
    dist = tempered(actor.dist(obs), temperature)
    # a Normal's rsample (loc + scale * noise) draws what sample() does, without its host sync on a GPU (scale >= 0)
    action = dist.rsample() if isinstance(dist, torch.distributions.Normal) else dist.sample()
    return TensorDict(
        action=action,
        logprob=aggregate(dist.log_prob(action), per_token),
        env_action=actor.env_action(action),
        batch_size=obs.shape[:1],
    )


def reference_logprob(actor: nn.Module, mb: TensorDict, temperature: float, per_token: bool) -> torch.Tensor:
    """The log-prob of each sample's action under the policy's KL reference at the rollout's temperature (summed over
    the action's entries)."""
    return aggregate(tempered(actor.reference_dist(mb["obs"]), temperature).log_prob(mb["action"]), per_token)


def sample_with(dist: torch.distributions.Distribution, generator: torch.Generator) -> torch.Tensor:
    """A draw from `dist` with `generator` (the evaluator's or a collector's own stream) instead of torch's global
    one: a Gaussian as mean + stddev * noise, any other distribution by its own `sample(generator=...)` (the VLA's
    bins)."""
    if isinstance(dist, torch.distributions.Normal):
        return dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)
    return dist.sample(generator=generator)


def eval_action(
    agent: nn.Module,
    obs: torch.Tensor | TensorDict,
    generator: torch.Generator,
    starts: torch.Tensor,
    deterministic: bool,
    size: int,
) -> torch.Tensor:
    """The evaluation policy, in pieces of at most `size` observations: the distribution's mode (the Gaussian's
    mean, the most likely bin), or a sample drawn from the evaluator's own generator; a chunk [N, K, D] with K > 1.
    `starts` (the envs whose episode begins with `obs`, as the evaluator says) is for policies with memory; the VLA
    policies here have none."""

    def act(piece):
        dist = agent.dist(piece)
        return agent.env_action(dist.mode if deterministic else sample_with(dist, generator))

    return in_pieces(act, obs, size)


def decision_returns_to_go(rewards: torch.Tensor, dones: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
    """Discounted returns-to-go over a [T, N] rollout of decisions; they restart after every done (no bootstrap).
    `discounts` [T, N]: what the return after decision t is discounted by, gamma^(env steps it ran)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + discounts[t] * torch.where(dones[t], 0.0, running)
        returns[t] = running
    return returns


def first_episode_mask(dones: torch.Tensor) -> torch.Tensor:
    """[T, N] bool: True up to and including each env's first done, False after it."""
    d = dones.int()
    return (d.cumsum(0) - d) == 0


def group_advantages(
    returns: torch.Tensor, mask: torch.Tensor, group_size: int, scale: bool, eps: float
) -> tuple[torch.Tensor, TensorDict]:
    """Group-relative advantages per time step over the alive members (`mask`) of each group of consecutive envs.

    A cell (time step, group) with two or more alive members and unequal returns centres them on their mean; with
    `scale` it divides by (the group's std pooled over its cells + eps), which keeps a gap's size (a per-cell std
    would make any gap between the last two members +-0.707). Other cells and masked entries get 0, never NaN.
    Statistics: zero_adv_group_frac (share of cells with an alive member that got 0), mean_group_std.
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


def episode_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, group_size: int, scale: bool, eps: float
) -> tuple[torch.Tensor, TensorDict]:
    """Outcome-level group advantages: each member's undiscounted return over its first episode (`mask` [T, N])
    against its whole group's, as `group_advantages` compares one cell; every step of the episode gets it."""
    returns = torch.where(mask, rewards, 0.0).sum(0, keepdim=True)  # [1, N]
    adv, stats = group_advantages(returns, torch.ones_like(mask[:1]), group_size, scale, eps)
    return torch.where(mask, adv, 0.0), stats


def informative_groups(advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] bool: the envs of the groups where some member got a non-zero advantage (whose returns differ)."""
    T, N = advantages.shape
    return (advantages != 0).reshape(T, N // group_size, group_size).any(0).any(-1).repeat_interleave(group_size)


def grpo_loss(actor: nn.Module, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """Masked PPO-clip loss + entropy bonus + k3 KL to the reference on one minibatch; (loss, statistics: means over
    the alive samples). GRPO averages over the alive samples; Dr. GRPO (``--no-scale-adv``) divides their sum by the
    minibatch size. Masks select with torch.where: a masked sample has ratio 1 and gradient 0, never NaN."""
    clip_high = args.clip_coef if args.clip_coef_high is None else args.clip_coef_high
    per_token = args.loss_agg == "token"  # then every entry of an alive decision counts as a sample
    dist = tempered(actor.dist(mb["obs"]), args.temperature)
    newlogprob = aggregate(dist.log_prob(mb["action"]), per_token)  # [B], or [B, E] per token
    alive = mb["mask"].view(-1, *[1] * (newlogprob.dim() - 1)).expand_as(newlogprob)
    n_alive = alive.sum().clamp_min(1)
    total = lambda x: torch.where(alive, x, 0.0).sum()  # noqa: E731
    logratio = torch.where(alive, newlogprob - mb["logprob"], 0.0)
    ratio = logratio.exp()
    adv = mb["advantages"].view(-1, *[1] * (ratio.dim() - 1))
    pg = total(torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + clip_high)))
    entropy = total(aggregate(dist.entropy(), per_token))
    # k3 = r - log r - 1 with r = pi_ref / pi: its value estimates KL(pi || pi_ref) on samples from pi; its
    # gradient with the samples held fixed, (1 - r) grad log pi, estimates grad KL(pi_ref || pi). Only exp() can
    # overflow (pi far below pi_ref), so only that side is clamped: a policy far sharper than the reference
    # (log r << 0) keeps its full gradient back toward it.
    ref_logratio = torch.where(alive, mb["ref_logprob"] - newlogprob, 0.0).clamp(max=20.0)
    kl_ref = total(ref_logratio.exp() - ref_logratio - 1)
    loss = (pg - args.ent_coef * entropy + args.kl_coef * kl_ref) / (n_alive if args.scale_adv else alive.numel())
    with torch.no_grad():
        stats = TensorDict(
            policy_loss=pg, entropy=entropy, kl_ref=kl_ref, old_approx_kl=total(-logratio),
            approx_kl=total((ratio - 1) - logratio),
            clipfrac=total(((ratio < 1 - args.clip_coef) | (ratio > 1 + clip_high)).float()),
        )  # fmt: skip
    return loss, (stats / n_alive).detach()


def backward_piece(
    actor: nn.Module, piece: TensorDict, args: Args, mb_alive: torch.Tensor, mb_size: int
) -> tuple[torch.Tensor, TensorDict]:
    """GRPO's loss on a piece of a minibatch, rescaled to its share of the minibatch's (its alive samples over the
    minibatch's `mb_alive`; under Dr. GRPO its size over `mb_size`), so that the pieces' losses and gradients add
    up to the minibatch's, backpropagated into the parameters' `.grad`; returns the loss and the statistics times the
    piece's share of the alive samples (summed over the pieces they are the minibatch's), detached."""
    loss, stats = grpo_loss(actor, piece, args)
    alive = piece["mask"].sum()
    share = alive.clamp_min(1) / mb_alive.clamp_min(1)  # a piece with none alive has a zero loss and statistics
    loss = loss * (share if args.scale_adv else len(piece) / mb_size)
    loss.backward()
    return loss.detach(), stats * share


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global norm of at most `max_norm`; returns the norm before clipping."""
    return nn.utils.clip_grad_norm_(params, max_norm)


def group_reset(envs, args: Args, iteration: int, draw: int = 0) -> tuple[torch.Tensor, dict]:
    """Group starts seeded by (seed, iteration, draw): a resumed run sees the starts a straight run would."""
    seed = shared.stream_seed(args.seed, "group_resets", iteration) if draw == 0 else shared.stream_seed(
        args.seed, "group_redraws", iteration * 1000 + draw
    )  # fmt: skip
    try:
        return envs.reset(seed=seed, options={"group_size": args.group_size})
    except ValueError as e:
        shared.fail(f"--group-size {args.group_size}: {args.env_id} can't give groups identical starts: {e}")


def main(args: Args) -> dict:
    validate(args)
    trainer = shared.describe_trainer(__file__)  # this file: its name, path, hash, git state and network code
    env = shared.EnvOptions(args.env_id, args.env_kwargs, args.eval_env_kwargs, args.env_vectorization)
    same = {k: getattr(args, k) for k in ("policy", "policy_kwargs", *ACTION_ARGS)}  # the policy and its outputs
    resume_same = {k: getattr(args, k) for k in ("num_envs", "group_size", "learning_rate", "anneal_lr")}  # env, LR
    ckpt, ckpt_flag, path = shared.load_resume_or_eval(
        args.resume, args.eval_checkpoint, trainer, env, same, resume_same
    )
    shared.seed_everything(args.seed, args.torch_deterministic)
    device = shared.pick_device(args.cuda)
    piece = args.micro_batch_size or sys.maxsize  # the most samples of a forward pass

    eval_envs = shared.build_env(env, args.num_eval_envs, shared.stream_seed(args.seed, "eval_envs"), device, True)
    obs_dim, act_dim = shared.check_env_sizes(eval_envs, (ckpt, ckpt_flag))
    actor = make_agent(eval_envs, args).to(device)
    if ckpt is not None:
        shared.load_model_state(actor, ckpt, ckpt_flag, path)
    frozen = shared.frozen_fingerprint(actor)  # what checkpoints record of the weights they leave out
    act = partial(eval_action, actor, deterministic=args.eval_deterministic, size=piece)
    if args.eval_checkpoint:  # evaluate a saved policy and exit
        logger = shared.RunLogger(trainer, args)
        evaluator = shared.Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
        return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)

    envs = shared.build_env(env, args.num_envs, shared.stream_seed(args.seed, "train_envs"), device, False, eval_envs)
    start_iteration = ckpt["iteration"] + 1 if ckpt is not None else 1
    if ckpt is not None and ckpt["env_state"] is not None:
        shared.load_env_state_dict(envs, ckpt["env_state"])
    next_obs, start_info = group_reset(envs, args, start_iteration)  # first: can the env give groups one start?
    episode_steps = (envs.spec.max_episode_steps if envs.spec is not None else None) or getattr(
        envs.unwrapped, "max_episode_steps", None
    )
    horizon = args.num_steps or (episode_steps and -(-episode_steps // args.action_chunk))  # in decisions
    if not horizon:
        shared.fail(f"--num-steps is required: {args.env_id} declares no max episode steps")
    batch_size = args.num_envs * horizon
    if batch_size % args.num_minibatches:
        shared.fail(
            f"--num-minibatches must divide the batch size num_envs*horizon={batch_size}, got {args.num_minibatches}"
        )
    groups = args.min_informative_groups or args.num_envs // args.group_size  # the groups an update learns from
    update_size = groups * args.group_size * horizon
    if args.min_informative_groups and (
        update_size % args.num_minibatches or groups > args.num_envs // args.group_size
    ):
        shared.fail(
            f"--min-informative-groups must be at most num_envs/group_size={args.num_envs // args.group_size} "
            f"and, times group_size*horizon, divisible by --num-minibatches; got {args.min_informative_groups}"
        )
    minibatch_size = update_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // (batch_size * args.action_chunk))
    if start_iteration > num_iterations:
        shared.fail(
            f"--total-timesteps {args.total_timesteps}: {args.resume} already completed {num_iterations} iterations"
        )
    params = [p for p in actor.parameters() if p.requires_grad]  # the adapters and heads, never a frozen backbone
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    logger = shared.RunLogger(trainer, args, total_iterations=num_iterations - start_iteration + 1)
    evaluator = shared.Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    global_step = 0
    if ckpt is not None:  # resume: counters, optimizer, schedule and random stream continue the straight run
        shared.load_optimizer(optimizer, ckpt["optimizer"])
        global_step, evaluator.best_key = ckpt["global_step"], tuple(ckpt["best_key"])
        shared.note_schedule_change(ckpt, start_iteration, num_iterations, args.learning_rate, args.anneal_lr,
                                    logger.write)  # fmt: skip
        shared.set_rng_state(ckpt["rng"])
    logger.write(
        f"device={device} groups={args.num_envs // args.group_size}x{args.group_size} horizon={horizon} "
        f"batch={batch_size} iterations={num_iterations} start={start_iteration} run_dir={logger.run_dir}"
    )
    # torch.compile or eager: --compile auto on the CPU decides after the 2nd iteration; a resume keeps the choice
    compiled = shared.Compiler(args.compile, device, logger.write, trainer, dataclasses.asdict(args),
                               decided=ckpt and ckpt.get("compiled"))  # fmt: skip
    per_token = args.loss_agg == "token"
    policy = compiled(partial(policy_step, actor, temperature=args.temperature, per_token=per_token))
    reference_fn = compiled(partial(reference_logprob, actor, temperature=args.temperature, per_token=per_token))
    advantages_fn = compiled(group_advantages if args.advantage == "step" else episode_advantages)
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)

    def save_checkpoint(name: str) -> str:  # everything a resume needs, as plain tensors and numbers
        state = {
            "script": trainer["script"], "trainer": trainer, "args": dataclasses.asdict(args),
            "model": shared.model_state(actor), "frozen": frozen,  # what trains; the fingerprint of the rest
            "optimizer": optimizer.state_dict(), "iteration": iteration, "global_step": global_step,
            "num_iterations": num_iterations, "best_key": list(evaluator.best_key),
            "env": shared.env_record(env, eval_envs),  # id, options, observation layout: a resume must match them
            "obs_dim": obs_dim, "act_dim": act_dim, "rng": shared.rng_state(), "env_state": shared.env_state_dict(envs),
            "compiled": compiled.on,  # --compile auto's choice (None: not made yet), which a resume keeps
        }  # fmt: skip
        return str(shared.atomic_save(state, logger.checkpoint_dir / name))

    decision_shape = (args.num_envs, args.action_chunk, *envs.single_action_space.shape)  # [N, K, D]
    powers = args.gamma ** torch.arange(args.action_chunk, device=device)[:, None]  # gamma^k of a chunk's k-th step
    action = action_space(envs, args).shape
    storage = shared.rollout_storage(  # TensorDict observations are stored as they come, uint8 images as uint8
        horizon, args.num_envs, device, obs=envs.single_observation_space, action=(action, torch.float32),
        logprob=((math.prod(action),) if per_token else (), torch.float32),  # (per token: per entry)
        **dict.fromkeys(("reward", "discount", "outcome"), ((), torch.float32)), done=((), torch.bool),
    )  # fmt: skip
    cpu = device.type == "cpu"  # there, asking whether any episode ended costs nothing (no device to wait for)
    amp = shared.autocast(args.autocast, device)
    micro_batch_size = min(piece, minibatch_size)
    task_names = envs.metadata.get("task_names")  # success is also logged per task
    iteration = start_iteration - 1
    guard = shared.SkipGuard(args.max_consecutive_skips)  # non-finite optimizer steps are skipped and counted
    keeper = shared.RunKeeper(
        evaluator, act, save_checkpoint, args.eval_freq, args.save_freq, num_iterations, iteration, global_step
    )  # evaluations and checkpoints when due, the end of the run
    # Ctrl-C / SIGTERM: finish the iteration, save, write summary.json; an error also writes it (with what is known)
    with shared.StopFlag(logger.write) as stop, logger:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - (iteration - 1) / num_iterations))
            parts, informative = [], 0  # dynamic sampling: the informative groups collected so far
            for draw in range(args.max_draws if args.min_informative_groups else 1):
                if iteration > start_iteration or draw:  # the first iteration's starts were drawn above
                    next_obs, draw_info = group_reset(envs, args, iteration, draw)
                    start_info = draw_info if draw == 0 else start_info

                # ---- rollout of one horizon from group starts: no host sync inside this loop on a GPU ----
                rollout_stats = shared.RolloutStats(
                    device, task_names
                )  # of the first episodes that end within the horizon
                alive = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # still in the first episode
                success = torch.zeros_like(alive)  # the first episode succeeded within the horizon
                watch = shared.NonFiniteWatch(args.num_envs, device)
                with torch.no_grad():
                    for step in range(horizon):
                        with amp():
                            out = in_pieces(policy, next_obs, piece)
                        storage["obs"][step] = next_obs
                        storage["action"][step], storage["logprob"][step] = out["action"], out["logprob"]
                        next_obs, rewards, executed, terminated, truncated, info = shared.step_chunk(
                            envs, out["env_action"].reshape(decision_shape)
                        )  # rewards, executed: [K, N], per env step of the decision (K = 1: one step)
                        storage["reward"][step] = torch.where(executed, powers * rewards, 0.0).sum(0)  # discounted sum
                        storage["discount"][step] = args.gamma ** executed.sum(0)  # discounts the return after it
                        storage["outcome"][step] = torch.where(executed, rewards, 0.0).sum(0)  # undiscounted sum
                        storage["done"][step] = done = terminated | truncated
                        rollout_stats.add_reward_terms(info, executed.sum(0))  # per env step: a chunk's terms are sums
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
                    done = storage["done"]
                    mask = first_episode_mask(done) if args.truncate_at_first_done else torch.ones_like(done)
                    returns = (
                        decision_returns_to_go(storage["reward"], done, storage["discount"])
                        if args.advantage == "step"
                        else storage["outcome"]  # episode_advantages sums them over each first episode, undiscounted
                    )
                    advantages, adv_stats = advantages_fn(returns, mask, args.group_size, args.scale_adv, args.adv_eps)
                    kept = informative_groups(advantages, args.group_size)  # groups whose returns differ
                    if args.filter_groups:  # the others leave the update (and its averages) altogether
                        mask = mask & kept
                    drawn = storage.select("obs", "action", "logprob").clone()  # [T, N]
                    drawn["advantages"], drawn["mask"] = advantages, mask
                if draw == 0:  # what the logs describe: the first draw
                    first = (rollout_stats, alive, success, kept, mask, adv_stats)
                if not args.min_informative_groups:
                    break
                parts.append(drawn[:, kept.nonzero().squeeze(-1)])  # the informative groups' envs (a host sync)
                informative += int(kept.sum()) // args.group_size
                if informative >= args.min_informative_groups:
                    break

            with torch.no_grad():
                if args.min_informative_groups:  # exactly `groups` groups: informative first, then masked filler
                    drawn = torch.cat([*parts, drawn.set("mask", torch.zeros_like(drawn["mask"]))], dim=1)
                    drawn = drawn[:, : groups * args.group_size]
                batch = drawn.reshape(-1)
                with amp():
                    batch["ref_logprob"] = in_pieces(reference_fn, batch.select("obs", "action"), piece)
            rollout_stats, alive, success, kept, mask, adv_stats = first
            shortfall = max(groups - informative, 0)

            # ---- PPO-clip update over the masked samples ----
            update_stats = []  # statistics of the applied minibatch steps, averaged for logging
            learn = informative > 0 if args.min_informative_groups else not args.filter_groups or bool(kept.any())
            for _epoch in range(args.update_epochs if learn else 0):
                epoch_kl = []
                for idx in torch.randperm(update_size, device=device).view(args.num_minibatches, -1):
                    mb = batch[idx]
                    n_alive = mb["mask"].sum()
                    optimizer.zero_grad(set_to_none=True)
                    loss = stats = None  # the minibatch's, summed over its pieces (their gradients add up)
                    for part in shared.micro_batches(mb, micro_batch_size):
                        with amp():
                            out = backward_fn(actor, part, args, n_alive, minibatch_size)
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
            means = torch.stack(update_stats).mean(0).items() if update_stats else ()
            scalars = {("grpo/" if k == "kl_ref" else "losses/") + k: v for k, v in means}
            scalars.update(
                {
                    "charts/learning_rate": optimizer.param_groups[0]["lr"],
                    "charts/skipped_updates": guard.skipped,
                    "grpo/mask_frac": mask.float().mean(),
                    "grpo/kept_group_frac": kept.float().mean(),
                    "grpo/finished_frac": (~alive).float().mean(),
                    **(
                        {"grpo/draws": draw + 1, "grpo/shortfall_groups": shortfall}
                        if args.min_informative_groups
                        else {}
                    ),
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
            logger.log_iteration(global_step, keeper.sps(global_step), scalars)

            compiled.after_iteration(num_iterations - iteration)  # --compile auto (CPU): timed; decided after the 2nd
            keeper.after_iteration(iteration, global_step)  # evaluate (a new best: best.pt), save last.pt, when due
            if stop.requested:
                break

        eval_result = keeper.finish(global_step, stop.requested, compiled=compiled.on)  # last.pt, eval, summary
        envs.close()
        eval_envs.close()
        if stop.requested:
            sys.exit(stop.exit_status)  # 130 after Ctrl-C, 143 after SIGTERM
    return {
        "run_dir": str(logger.run_dir),
        "eval": eval_result,
        "global_step": global_step,
        "checkpoint": keeper.checkpoint,
    }


if __name__ == "__main__":
    main(tyro.cli(Args))
