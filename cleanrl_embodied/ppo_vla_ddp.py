"""PPO for fine-tuning VLA policies on many GPUs and nodes through torch.distributed, in one file.

    uv run torchrun --standalone --nproc_per_node 2 cleanrl_embodied/ppo_vla_ddp.py --env-id PushCubeLangRL \
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}' --fsdp
    uv run python cleanrl_embodied/ppo_vla_ddp.py --env-id PushCubeLangRL \
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}'  # a world of one

This is ppo_vla.py made data-parallel, with `--backend`, `--dist-timeout-s` and `--fsdp` besides its flags. Every
rank steps its own `--num-envs` envs, collects its own rollout and cuts it into its own minibatches, with its own
random streams derived from (seed, rank) (rank 0's are ppo_vla.py's); `--total-timesteps` counts the env steps of
all ranks. What keeps the ranks one run: identical initial weights (rank 0's broadcast, checked bit for bit at the
end); `sync_gradients`, one all-reduce of every gradient and the loss before each optimizer step, so all ranks step
alike and skip the same non-finite steps; all-reduced decisions (target-KL stop, non-finite data, Ctrl-C/SIGTERM);
rank 0 alone logs, evaluates and writes checkpoints. A rank that dies or stalls stops all with one error line.

With `--fsdp` (FSDP2's `fully_shard`; a policy's own `fsdp_units()`, e.g. a VLA's layers, one by one) every rank
holds a shard of the trainable parameters, their gradients and optimizer state: FSDP averages the gradients in the
backward pass; frozen weights are not sharded, one whole copy per rank that the agent and its inference copy share;
the rollout and the evaluations act with that copy, its trainable weights gathered whole after every update; and
checkpoints hold whole tensors (a resume keeps `--fsdp`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from tensordict import TensorDict
from torch.distributed.fsdp import fully_shard

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
    env_id: str = "PushCubeLangRL"
    """the environment id: PushCubeLangRL, PushCubeRL, any Gymnasium id with a Box action space, or a ManiSkill id"""
    total_timesteps: int = 2_000_000
    """total environment steps (summed over the envs of all ranks; a chunk of K actions counts K)"""
    num_envs: int = 256
    """number of parallel training environments per rank"""

    # Distribution
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: auto = nccl on CUDA, gloo on CPU"""
    fsdp: bool = False
    """shard parameters, gradients and optimizer state over the ranks (FSDP2's fully_shard), for a policy too large
    to train whole on every rank; the rollout acts with a full copy of the weights refreshed every iteration"""
    dist_timeout_s: int = 300
    """seconds any rank waits in a collective for a missing rank before all stop with an error; must exceed
    rank 0's longest pause (an evaluation plus a checkpoint)"""

    # Algorithm
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int = 20
    """rollout length per env per iteration, in decisions"""
    gamma: float = 0.8
    """discount factor (per env step; a chunk's steps are discounted inside it)"""
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
    clip_coef_high: float | None = None
    """upper clip of the ratio, 1 + this (DAPO's clip-higher: 0.28 with --clip-coef 0.2 leaves low-probability actions
    room to grow); None: --clip-coef"""
    critic_warmup_iterations: int = 0
    """iterations that train the value head alone before the policy moves (RLinf's critic warm-up: a fresh value head
    on a behaviour-cloned policy first learns its returns); needs the policy's `value_parameters()`"""
    loss_agg: Literal["decision", "token"] = "decision"
    """decision: one ratio per decision (its log-prob summed over the chunk's K*D action entries); token: a ratio per
    entry, clipped per entry and averaged over entries (DAPO's token-level loss, as VLA-RL recipes apply it to action
    tokens)"""
    temperature: float = 1.0
    """sampling temperature of the rollout and of the update's log-probs (bins: logits / T; Gaussian: std * sqrt(T));
    SimpleVLA-RL, RLinf and TorchRL's vla_grpo roll out at 1.6; evaluation is unchanged (deterministic: the mode)"""
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
    """the most samples of any forward pass: minibatches split into pieces whose gradients add up, the rollout's and
    evaluations' passes into pieces of as many envs (None: no split)"""
    autocast: Literal["none", "bf16"] = "none"
    """run the policy's forward passes under bf16 autocast (weights, optimizer and log-probs stay float32)"""


def validate(args: Args, show: bool) -> None:
    """Reject bad input with one line naming the flag (printed by rank 0), before any process group exists."""
    shared.check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps", "total_timesteps",
                  "num_minibatches", "update_epochs", "learning_rate", "gamma", "clip_coef",
                  "clip_coef_high", "temperature", "vf_coef", "max_grad_norm", "target_kl", "dist_timeout_s"),
        non_negative=("gae_lambda", "ent_coef", "critic_warmup_iterations"),
        at_most_1=("gamma", "gae_lambda"),
        may_be_inf=("max_grad_norm",),  # no clipping
        sizes=(),
        minibatches_of=args.num_envs * args.num_steps,  # each rank's rollout
        show=show,
    )  # fmt: skip
    if args.backend == "nccl" and shared.pick_device(args.cuda).type != "cuda":
        shared.fail("--backend nccl needs CUDA (GPUs and --cuda); on CPU use --backend gloo or auto", show)


ACTION_ARGS = ("action_head", "action_bins", "action_chunk")  # what the policy's output means


def make_agent(envs, args: Args, value_head: bool = True) -> nn.Module:
    """The module `--policy module:factory` builds for the envs' observations and one decision's action space: the
    env's, or with --action-chunk K > 1 a chunk of K of them ([K, D]); one line if the envs cannot run chunks.
    `value_head`: V(obs) is the policy's own (a critic warm-up then needs its `value_parameters`)."""
    if args.action_chunk > 1 and not shared.supports_partial_reset(envs):
        shared.fail(
            f"--action-chunk {args.action_chunk}: {type(envs.unwrapped).__name__} cannot reset a subset of its envs, "
            "which chunks need (an episode that ends inside a chunk is restarted at the chunk's end); use "
            "PushCubeRL, PushCubeLangRL or a Gymnasium id with --env-vectorization sync or async"
        )
    needs = ("forward", "dist", "get_value", "env_action") + (
        ("value_parameters",) if args.critic_warmup_iterations and value_head else ()
    )
    return shared.build_policy(args.policy, args.policy_kwargs, envs.single_observation_space,
                               action_space(envs, args), args, needs)  # fmt: skip


def action_space(envs, args: Args):
    """One decision's action space: the env's, or with --action-chunk K > 1 a chunk of K of them ([K, D])."""
    space = envs.single_action_space
    return shared.chunk_space(space, args.action_chunk) if args.action_chunk > 1 else space


def policy_step(agent: nn.Module, obs: torch.Tensor | TensorDict, temperature: float, per_token: bool) -> TensorDict:
    """Sample a raw action (a Gaussian sample, bin indices; a chunk's K actions at once); return it with its log-prob
    (summed over the action's entries), V(obs) and the action the env gets."""
    dist, value = agent(obs)
    dist = tempered(dist, temperature)
    # a Normal's rsample (loc + scale * noise) draws what sample() does, without its host sync on a GPU (scale >= 0)
    action = dist.rsample() if isinstance(dist, torch.distributions.Normal) else dist.sample()
    return TensorDict(
        action=action,
        logprob=aggregate(dist.log_prob(action), per_token),
        value=value,
        env_action=agent.env_action(action),
        batch_size=obs.shape[:1],
    )


def sample_with(dist: torch.distributions.Distribution, generator: torch.Generator) -> torch.Tensor:
    """A draw from `dist` with `generator` (the evaluator's or a collector's own stream) instead of torch's global
    one: a Gaussian as mean + stddev * noise, any other distribution by its own `sample(generator=...)` (the VLA's
    bins)."""
    if isinstance(dist, torch.distributions.Normal):
        return dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)
    return dist.sample(generator=generator)


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


def step_decision(envs, env_action: torch.Tensor, gamma: float) -> tuple:
    """Run one decision, `env_action` [N, K, D]: K actions one by one (`step_chunk`; K = 1, one step). Returns
    (next_obs, reward, discount, steps, terminated, truncated, info): the decision's reward is the discounted sum of
    the rewards of the `steps` [N] env steps it ran (an episode that ends inside the chunk stops there), its
    discount gamma^steps, what `compute_gae` multiplies V(next obs) by."""
    next_obs, rewards, executed, terminated, truncated, info = shared.step_chunk(envs, env_action)
    powers = gamma ** torch.arange(env_action.shape[1], device=rewards.device)[:, None]
    reward = torch.where(executed, powers * rewards, 0.0).sum(0)  # discounted sum inside the chunk
    steps = executed.sum(0)
    discount = gamma**steps  # multiplies V(next) in GAE
    return next_obs, reward, discount, steps, terminated, truncated, info


def compute_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda):
    """Generalized advantage estimation over [T, N] decisions; returns (advantages, returns).

    next_values[t] is V(obs[t+1]) while the episode goes on and V(final_obs) where it ended at t: a terminated step
    does not bootstrap, a truncated one does; `dones` cuts the recursion. `gamma`: a float, or [T, N] (gamma^k for a
    chunk of k env steps). Masks select with `torch.where`: a NaN past an episode's end would survive NaN * 0."""
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


def ppo_loss(agent: nn.Module, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """Clipped-surrogate PPO loss on one minibatch (or a piece of one), means over its samples; returns (loss,
    detached statistics). The advantages come normalized (`normalize_advantages`) when --norm-adv."""
    dist, newvalue = agent(mb["obs"])
    dist = tempered(dist, args.temperature)
    clip_high = args.clip_coef if args.clip_coef_high is None else args.clip_coef_high
    newlogprob = aggregate(dist.log_prob(mb["action"]), args.loss_agg == "token")  # [B], or [B, E] per token
    entropy = dist.entropy().flatten(1).sum(-1).mean()
    logratio = newlogprob - mb["logprob"]
    ratio = logratio.exp()

    adv = mb["advantages"].view(-1, *[1] * (ratio.dim() - 1))  # (per token: every entry of a decision gets its own)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + clip_high)).mean()
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
            clipfrac=((ratio < 1 - args.clip_coef) | (ratio > 1 + clip_high)).float().mean(),
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


def backward_piece(agent: nn.Module, piece: TensorDict, args: Args, weight: float) -> tuple[torch.Tensor, TensorDict]:
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


def main(args: Args) -> dict:
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the process group does not exist yet
    validate(args, show=rank == 0)
    trainer = shared.describe_trainer(__file__)  # this file: its name, path, hash, git state and network code
    env_options = shared.EnvOptions(args.env_id, args.env_kwargs, args.eval_env_kwargs, args.env_vectorization)
    flags = dataclasses.asdict(args)  # a checkpoint must match the policy and what it sees; on --resume also the
    ckpt, ckpt_flag, ckpt_path = shared.load_resume_or_eval(  # env state's layout and the LR schedule's base
        args.resume,
        args.eval_checkpoint,
        trainer,
        env_options,
        resumes=("ppo_vla",),
        same={k: flags[k] for k in ("policy", "policy_kwargs", *ACTION_ARGS)},
        resume_same={k: flags[k] for k in ("num_envs", "num_steps", "learning_rate", "anneal_lr", "fsdp")},
        read=rank == 0,  # the others get the content from rank 0
    )
    ckpt = shared.without_privileged_critic(ckpt, ckpt_flag, ckpt_path)  # ppo_vla.py's: evaluate its actor alone
    with shared.process_group(args.backend, args.cuda, args.dist_timeout_s) as (device, _backend):
        start = (trainer, ckpt, ckpt_flag, ckpt_path)
        return train(args, env_options, start, dist.get_rank(), dist.get_world_size(), device)


def train(
    args: Args, env_options: shared.EnvOptions, start: tuple, rank: int, world_size: int, device: torch.device
) -> dict:
    trainer, ckpt, ckpt_flag, ckpt_path = start  # this file's record; --resume / --eval-checkpoint's (rank 0 read it)
    batch_size = args.num_envs * args.num_steps  # decisions per rank and rollout (each runs --action-chunk steps)
    minibatch_size = batch_size // args.num_minibatches  # per rank
    steps_per_iteration = batch_size * args.action_chunk * world_size  # env steps of all ranks per iteration
    num_iterations = max(1, args.total_timesteps // steps_per_iteration)
    if args.resume or args.eval_checkpoint:  # rank 0 read the file; every rank gets its content
        box = [ckpt]
        dist.broadcast_object_list(box, src=0)
        ckpt = box[0]
    shared.seed_everything(args.seed, args.torch_deterministic, rank)  # this rank's streams (rank 0: ppo_vla.py's)

    # Rank r's envs get their own stream, hashed from (seed, r): no two envs of the world share one. Rank 0 evaluates.
    eval_seed = shared.stream_seed(args.seed, "eval_envs")
    eval_envs = shared.build_env(env_options, args.num_eval_envs, eval_seed, device, True) if rank == 0 else None
    env_seed = shared.stream_seed(args.seed, "train_envs", rank)
    envs = shared.build_env(env_options, args.num_envs, env_seed, device, eval_envs=False, like=eval_envs)
    obs_dim, act_dim = shared.check_env_sizes(envs, (ckpt, ckpt_flag), show=rank == 0)
    agent = make_agent(envs, args).to(device)
    shared.broadcast_model(agent)  # every rank starts from rank 0's weights, whatever its RNG did
    if ckpt is not None:  # (after the broadcast: every rank checks the same frozen weights, so all agree)
        shared.load_model_state(agent, ckpt, ckpt_flag, ckpt_path, show=rank == 0)
    frozen = shared.frozen_fingerprint(agent)  # what checkpoints record of the weights they leave out
    logger = shared.RunLogger(trainer, args, total_iterations=num_iterations) if rank == 0 else None
    evaluator = rank == 0 and shared.Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    agent_inference = agent  # what the rollout and evaluations act with: with --fsdp a copy sharing the frozen
    if args.fsdp:  # weights, its own trainable ones whole (the agent holds shards of them), refreshed after each update
        agent_inference = shared.inference_copy(agent)
    max_rows = args.micro_batch_size or sys.maxsize  # the most samples of a forward pass
    act = partial(eval_action, agent_inference, deterministic=args.eval_deterministic, size=max_rows)
    if args.eval_checkpoint:  # evaluate a saved policy on rank 0 and exit
        envs.close()
        if rank == 0:
            return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)
        return {"run_dir": None, "eval": None, "global_step": ckpt["global_step"]}
    if args.fsdp:  # shard what trains over the ranks: a policy's own units (e.g. a VLA's layers), then the rest
        whole = {p for p in agent.parameters() if not p.requires_grad}  # frozen: whole, shared with agent_inference
        for unit in [*getattr(agent, "fsdp_units", list)(), agent]:
            fully_shard(unit, ignored_params=whole)

    params = [p for p in agent.parameters() if p.requires_grad]  # the adapters and heads, never a frozen backbone
    value_ids = {id(p) for p in agent.value_parameters()} if args.critic_warmup_iterations else set()
    policy_params = [p for p in params if id(p) not in value_ids]  # what a critic warm-up holds still
    say = logger.write if rank == 0 else lambda _: None
    if args.fsdp:
        mine = sum(p.to_local().numel() for p in params)
        say(f"fsdp: this rank holds {mine} of the {sum(p.numel() for p in params)} trainable values")
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    # torch.compile or eager (FSDP: eager); --compile auto on the CPU decides after the 2nd; a resume keeps it
    work = {**dataclasses.asdict(args), "world_size": world_size}  # what one iteration's time depends on
    compiled = shared.Compiler("off" if args.fsdp else args.compile, device, say, trainer, work,
                               decided=ckpt and ckpt.get("compiled"))  # fmt: skip
    policy, value_fn = (
        compiled(
            partial(policy_step, agent_inference, temperature=args.temperature, per_token=args.loss_agg == "token")
        ),
        compiled(agent_inference.get_value),
    )
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)

    global_step, start_iteration, resume_note = 0, 1, ""
    next_obs, _ = envs.reset(seed=env_seed)
    if ckpt is not None:  # model, optimizer and counters from rank 0; env state per rank
        shared.load_optimizer(optimizer, ckpt["optimizer"], agent if args.fsdp else None)
        # iterations are counted in this run's env steps per iteration (chunks and ranks included): in the same
        # world this is ckpt["iteration"] + 1, in another world size the schedule goes on where its steps are
        global_step = ckpt["global_step"]
        start_iteration = global_step // steps_per_iteration + 1
        if rank == 0:
            evaluator.best_key = tuple(ckpt["best_key"])
            shared.note_schedule_change(ckpt, start_iteration, num_iterations, args.learning_rate, args.anneal_lr,
                                        logger.write)  # fmt: skip
        pieces = [ckpt, *ckpt.get("other_ranks", [])]  # a ppo_vla.py checkpoint is a world of one
        if (
            len(pieces) == world_size
            and shared.obs_from_checkpoint(pieces[rank]["next_obs"], "cpu").shape[0] == args.num_envs
        ):
            if pieces[rank]["env_state"] is not None:  # else the envs start fresh episodes
                shared.load_env_state_dict(envs, pieces[rank]["env_state"])
                next_obs = shared.obs_from_checkpoint(pieces[rank]["next_obs"], device)
            shared.set_rng_state(pieces[rank]["rng"])
        else:
            rows = shared.obs_from_checkpoint(pieces[0]["next_obs"], "cpu").shape[0]
            resume_note = f" (checkpoint of {len(pieces)} rank(s) x {rows} envs: envs reset freshly)"
    say(
        f"device={device} backend={dist.get_backend()} world={world_size} envs/rank={args.num_envs} "
        f"batch/rank={batch_size} minibatch/rank={minibatch_size} global_batch={batch_size * world_size} "
        f"iterations={num_iterations} start={start_iteration}{resume_note} run_dir={logger and logger.run_dir}"
    )

    def save_checkpoint(name: str, pieces: list[dict]) -> str:  # rank 0 only; rank 0's env/RNG state at the top
        state = {
            "script": trainer["script"], "trainer": trainer, "args": dataclasses.asdict(args),
            "model": pieces[0]["model"], "frozen": frozen,  # what trains (whole with --fsdp); the rest's fingerprint
            "optimizer": pieces[0]["optimizer"], "iteration": iteration, "global_step": global_step,
            "num_iterations": num_iterations, "best_key": list(evaluator.best_key),
            "env": shared.env_record(env_options, envs),  # id, options, observation layout: a resume must match them
            "obs_dim": obs_dim, "act_dim": act_dim, "world_size": world_size,
            "compiled": compiled.on,  # --compile auto's choice (None: not made yet), which a resume keeps
            **{k: v for k, v in pieces[0].items() if k not in ("model", "optimizer")}, "other_ranks": pieces[1:],
        }  # fmt: skip
        return str(shared.atomic_save(state, logger.checkpoint_dir / name))

    def gather_rank_states() -> list[dict] | None:  # a collective: every rank calls it at the same iterations
        model, optim = shared.unsharded_state(agent, optimizer, args.fsdp)  # (with --fsdp a collective too)
        pieces = [None] * world_size if rank == 0 else None
        own = {
            "env_state": shared.env_state_dict(envs),
            "next_obs": shared.obs_for_checkpoint(next_obs.cpu()),
            "rng": shared.rng_state(),
        }
        dist.gather_object(own, pieces, dst=0)  # what only this rank knows (on the CPU)
        if rank == 0:
            pieces[0].update(model=model, optimizer=optim)
        return pieces

    decision_shape = (args.num_envs, args.action_chunk, *envs.single_action_space.shape)  # [N, K, D]
    storage = shared.rollout_storage(
        args.num_steps,
        args.num_envs,
        device,
        obs=envs.single_observation_space,
        action=(action_space(envs, args).shape, torch.float32),
        logprob=((math.prod(action_space(envs, args).shape),) if args.loss_agg == "token" else (), torch.float32),
        **dict.fromkeys(("value", "final_value", "reward", "discount"), ((), torch.float32)),
        **dict.fromkeys(("terminated", "done"), ((), torch.bool)),
    )  # TensorDict observations are stored as they come, uint8 images as uint8
    cpu = device.type == "cpu"  # there, asking whether any episode ended costs nothing (no device to wait for)
    amp = shared.autocast(args.autocast, device)
    micro_batch_size = min(args.micro_batch_size or minibatch_size, minibatch_size)
    task_names = envs.metadata.get("task_names")  # success is also logged per task
    iteration, stopped, eval_result = start_iteration - 1, 0, None
    guard = shared.SkipGuard(args.max_consecutive_skips, show=rank == 0)  # non-finite steps: skipped, counted
    keeper = shared.RunKeeper(  # when to evaluate and save (every rank: they gather states together), the run's end
        evaluator, act, save_checkpoint, args.eval_freq, args.save_freq, num_iterations, iteration, global_step
    )
    # Ctrl-C/SIGTERM on any rank: all stop after this iteration (agreed in its all-reduce); repeats are absorbed
    # (torchrun re-sends the signal; 30 s later it kills). An error on rank 0 also writes summary.json.
    with shared.StopFlag(say, absorb_repeats=True) as stop, logger or contextlib.nullcontext():
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - (iteration - 1) / num_iterations))

            # ---- rollout on this rank: no collective (and on a GPU no host sync) inside this loop ----
            rollout_stats = shared.RolloutStats(device, task_names)
            watch = shared.NonFiniteWatch(args.num_envs, device)
            with torch.no_grad():
                for step in range(args.num_steps):
                    with amp():
                        out = in_pieces(policy, next_obs, max_rows)
                    storage["obs"][step] = next_obs
                    for key in ("action", "logprob", "value"):
                        storage[key][step] = out[key]
                    next_obs, reward, discount, steps, terminated, truncated, info = step_decision(
                        envs, out["env_action"].reshape(decision_shape), args.gamma
                    )
                    storage["reward"][step], storage["discount"][step] = reward, discount
                    storage["terminated"][step] = terminated
                    storage["done"][step] = done = terminated | truncated
                    rollout_stats.add_reward_terms(info, steps)  # (summed over a chunk's steps)
                    if not cpu or done.any():  # what only finished episodes need; on a GPU every step (no sync)
                        with amp():
                            final_values = in_pieces(value_fn, info["final_obs"], max_rows)
                        storage["final_value"][step] = final_values  # read only where done
                        watch.update_final(step, info["final_obs"], done)
                        rollout_stats.add_episodes(info)
                watch.update_rollout(storage["obs"], next_obs, storage["reward"])
                # one all-reduce: episode statistics and env steps summed over ranks, and whether any rank saw
                # non-finite data
                env_steps = torch.as_tensor(rollout_stats.env_steps, dtype=rollout_stats.sums.dtype, device=device)
                summed = torch.cat([rollout_stats.sums, env_steps.reshape(1), watch.seen()])
                dist.all_reduce(summed)
                if summed[-2:].sum() > 0:  # every rank stops; the rank(s) that saw it say where
                    watch.check(global_step, args.num_envs * args.action_chunk * world_size, where=f"rank {rank} ")
                    shared.fail("", show=False)
                rollout_stats.sums, rollout_stats.env_steps = summed[:-3], summed[-3]  # (the reward terms' steps)
                global_step += steps_per_iteration

                # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
                with amp():
                    next_values = torch.cat([storage["value"][1:], in_pieces(value_fn, next_obs, max_rows)[None]])
                next_values = torch.where(storage["done"], storage["final_value"], next_values)
                advantages, returns = compute_gae(
                    storage["reward"],
                    storage["value"],
                    next_values,
                    storage["terminated"],
                    storage["done"],
                    storage["discount"],  # gamma^(env steps the decision ran)
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
                    for piece in shared.micro_batches(mb, micro_batch_size):
                        with amp():
                            out = backward_fn(agent, piece, args, len(piece) / minibatch_size)
                        loss, stats = out if loss is None else (loss + out[0], stats + out[1])
                    if args.fsdp:  # FSDP averaged the gradients over the ranks in the backward; the loss still
                        mean_loss = loss.clone()  # needs it: one verdict on every rank
                        dist.all_reduce(mean_loss)
                        mean_loss /= world_size
                    else:
                        mean_loss = sync_gradients(params, world_size, loss)
                    if iteration <= args.critic_warmup_iterations:  # value only: the policy waits (Adam skips it)
                        for p in policy_params:
                            p.grad = None
                    grad_norm = shared.unsharded(clip_fn(params, args.max_grad_norm))
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
            if args.fsdp:  # the inference copy (rollout, evaluation) gets the updated weights, whole (a collective)
                shared.copy_unsharded_into(agent_inference, agent)

            # ---- one all-reduce: statistics averaged over ranks, and whether any rank was asked to stop ----
            explained_var = 1 - (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
            losses = torch.stack(update_stats).mean(0) if update_stats else TensorDict()
            summed = torch.cat(
                [torch.stack([*losses.values(), explained_var]), torch.tensor(stop.votes(), device=device)]
            )
            dist.all_reduce(summed)
            stopped = stop.agree(summed[-2:])  # the same on every rank: 0, or the exit status (130 / 143)
            compiled.after_iteration(num_iterations - iteration)  # --compile auto (CPU): rank 0 decides, after the 2nd
            eval_due, save_due = keeper.due(iteration)
            pieces = gather_rank_states() if eval_due or save_due else None
            if rank == 0:  # logging, evaluation, checkpoints: rank 0 alone
                scalars = {f"losses/{k}": v / world_size for k, v in zip(losses.keys(), summed)}
                scalars.update(
                    {
                        "losses/explained_variance": summed[-3] / world_size,
                        "charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "charts/skipped_updates": guard.skipped,
                        **rollout_stats.scalars(),
                    }
                )
                logger.log_iteration(global_step, keeper.sps(global_step), scalars)
                keeper.evaluate_and_save(iteration, global_step, eval_due, save_due, pieces)
            if stopped:
                break

        pieces = gather_rank_states()
        shared.check_in_sync(agent_inference, rank, "at the end")  # (it is the agent, or holds its weights whole)
        envs.close()
        if rank == 0:  # last.pt, the final evaluation, summary.json
            eval_result = keeper.finish(global_step, bool(stopped), pieces, world_size=world_size, compiled=compiled.on)
            eval_envs.close()
        if stopped:
            sys.exit(stopped)  # 130 after Ctrl-C, 143 after SIGTERM (on any rank)
    run_dir, model = str(logger.run_dir) if rank == 0 else None, agent_inference.state_dict()  # (weights, whole)
    return {"run_dir": run_dir, "eval": eval_result, "global_step": global_step, "model": model}


if __name__ == "__main__":
    main(tyro.cli(Args))
