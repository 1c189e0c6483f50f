"""GRPO (Group Relative Policy Optimization) for continuous control, critic-free, in one file.

    uv run python cleanrl_embodied/grpo.py --env-id PushCubeRL
    uv run python cleanrl_embodied/grpo.py --env-id Pendulum-v1 --num-envs 64 --group-size 8 --gamma 0.99

Every iteration resets the envs with `reset(options={"group_size": G})`, so each group of G consecutive envs starts
from one identical state, and rolls out one horizon. Instead of a critic, a step's advantage compares its discounted
return-to-go with those of its group's members still in their first episode (`--advantage episode`: each member's
first-episode return with its group's). The update is PPO's clipped surrogate, an entropy bonus and a k3 KL penalty
to a frozen reference policy. Training metrics describe each env's first episode within the horizon. Token-bin heads,
action chunks, micro-batches and autocast are grpo_vla.py's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from tensordict import TensorDict

from cleanrl_embodied import shared


@dataclass
class Args(shared.RunArgs):  # RunArgs (shared/cli.py): run dir, env options, evaluation, checkpoints, --policy
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
    """the environment id: PushCubeRL, any Gymnasium id with a Box action space, or a ManiSkill id"""
    total_timesteps: int = 1_000_000
    """total environment steps (summed over envs, masked steps included)"""
    num_envs: int = 256
    """number of parallel training environments (a multiple of --group-size)"""
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
    """step: each step's return-to-go vs its group's alive members'; episode: undiscounted first-episode returns"""
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
    filter_groups: bool = False
    """leave the groups whose members' returns all tie out of the update (`grpo/kept_group_frac`: the share kept)"""
    eval_freq: int = 10
    """evaluate every this many iterations on fresh starts (0: only the final evaluation)"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    shared.check_args(
        args,
        positive=("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs", "learning_rate",
                  "adv_eps", "gamma", "clip_coef", "max_grad_norm", "target_kl"),
        non_negative=("ent_coef", "kl_coef"),
        at_most_1=("gamma",),
        finite=("init_logstd",),
        may_be_inf=("max_grad_norm",),  # no clipping
        files=("ref_checkpoint",),
    )  # fmt: skip
    if args.group_size < 2 or args.num_envs % args.group_size:
        shared.fail(f"--group-size must be >= 2 and divide --num-envs={args.num_envs}, got {args.group_size}")
    if args.advantage == "episode" and not args.truncate_at_first_done:
        shared.fail("--advantage episode compares first-episode returns: it needs --truncate-at-first-done")


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


class InstructionEncoder(nn.Module):
    """Instruction tokens (byte ids and attention mask [B, L], shared/language.py) -> features [B, 64]: byte
    embeddings, a width-3 convolution (it reads groups of letters), a max over the positions that are not padding."""

    def __init__(self, features: int = 64, embedding: int = 32, channels: int = 64):
        super().__init__()
        self.embed = nn.Embedding(shared.VOCAB_SIZE, embedding, padding_idx=0)
        self.conv = layer_init(nn.Conv1d(embedding, channels, 3, padding=1))
        self.out = nn.Sequential(layer_init(nn.Linear(channels, features)), nn.LayerNorm(features), nn.Tanh())

    def forward(self, tokens: TensorDict) -> torch.Tensor:
        x = torch.relu(self.conv(self.embed(tokens["input_ids"]).transpose(1, 2)))  # [B, C, L]
        keep = tokens["attention_mask"].unsqueeze(1) > 0
        return self.out(torch.where(keep, x, -torch.inf).amax(-1).clamp_min(0.0))  # (an empty one gives zeros)


class PixelEncoder(nn.Module):
    """TensorDict observations -> one feature vector per row: each uint8 image [C, H, W] through NatureCNN's three
    convolutions (zero-padded to 36 pixels if smaller) and a bounded projection (Linear, LayerNorm, Tanh: unbounded
    ReLU features saturated the Tanh heads on RGB PushCubeRL), each instruction through an `InstructionEncoder`,
    concatenated with the normalized float entries `state`."""

    def __init__(self, obs_space: gym.spaces.Dict, num_floats: int, features: int = 256):
        super().__init__()
        self.keys, self.cnns, self.paddings = list(shared.image_spaces(obs_space)), nn.ModuleList(), []
        for channels, height, width in (box.shape for box in shared.image_spaces(obs_space).values()):
            pad_h, pad_w = max(36 - height, 0), max(36 - width, 0)
            self.paddings.append((pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))  # F.pad's order
            convs = [nn.Conv2d(channels, 32, 8, stride=4), nn.Conv2d(32, 64, 4, stride=2), nn.Conv2d(64, 64, 3)]
            cnn = nn.Sequential(*(m for conv in convs for m in (layer_init(conv), nn.ReLU())), nn.Flatten())
            flat = cnn(torch.zeros(1, channels, height + pad_h, width + pad_w)).shape[1]
            self.cnns.append(
                nn.Sequential(cnn, layer_init(nn.Linear(flat, features)), nn.LayerNorm(features), nn.Tanh())
            )
        self.text_keys = list(shared.token_spaces(obs_space))
        self.texts = nn.ModuleList(InstructionEncoder() for _ in self.text_keys)
        self.out_dim = features * len(self.keys) + sum(t.out[0].out_features for t in self.texts) + num_floats

    def forward(self, obs: TensorDict, state: torch.Tensor) -> torch.Tensor:
        images = []
        for key, cnn, pad in zip(self.keys, self.cnns, self.paddings):
            x = obs.get(key).float() / 255.0
            images.append(cnn(F.pad(x, pad) if any(pad) else x))
        texts = [text(obs.get(key)) for key, text in zip(self.text_keys, self.texts)]
        return torch.cat([*images, *texts, state], -1)


class Actor(nn.Module):
    """The PPO Agent's Gaussian actor (its parameter names, so a PPO checkpoint serves as the reference), without its
    critic and observation normalizer: images and instructions go through a `PixelEncoder` first."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, args: Args):
        super().__init__()
        num_floats = shared.float_dim(obs_space)  # images and instructions go through the encoder
        pixels_or_text = shared.image_spaces(obs_space) or shared.token_spaces(obs_space)
        self.encoder = PixelEncoder(obs_space, num_floats) if pixels_or_text else None
        features = self.encoder.out_dim if self.encoder else num_floats
        self.action_shape, act_dim = act_space.shape, math.prod(act_space.shape)
        self.actor_mean = mlp(features, args.hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.init_logstd))

    def dist(self, obs: torch.Tensor | TensorDict) -> torch.distributions.Normal:
        state = shared.float_entries(obs)  # a plain observation tensor as it is
        mean = self.actor_mean(state if self.encoder is None else self.encoder(obs, state))
        std = self.actor_logstd.expand_as(mean).exp()
        # validate_args=False: the argument check would cost a host sync on every call
        shape = (-1, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)


def make_agent(envs, args: Args) -> nn.Module:
    """The built-in `Actor`, or the module that `--policy module:factory` builds: its `dist(obs)` is a Gaussian per
    action entry, and it may keep its own KL reference (`reference_dist`)."""
    spaces = (envs.single_observation_space, envs.single_action_space)
    if args.policy is None:
        return Actor(*spaces, args)
    return shared.build_policy(args.policy, args.policy_kwargs, *spaces, args, needs=("dist",))


def policy_step(actor: Actor, obs: torch.Tensor | TensorDict) -> TensorDict:
    """Sample an action (unclipped: the env clips) and its log-prob."""
    dist = actor.dist(obs)
    # a Normal's rsample (loc + scale * noise) draws what sample() does, without its host sync on a GPU (scale >= 0)
    action = dist.rsample() if isinstance(dist, torch.distributions.Normal) else dist.sample()
    return TensorDict(action=action, logprob=dist.log_prob(action).flatten(1).sum(-1), batch_size=obs.shape[:1])


def eval_action(actor: Actor, obs, generator: torch.Generator, starts, deterministic: bool) -> torch.Tensor:
    """The evaluation policy: the Gaussian's mean, or a sample drawn from the evaluator's own generator. `starts`
    (the envs whose episode begins with `obs`, as the evaluator says) is for policies with memory: this one has none."""
    dist = actor.dist(obs)
    if deterministic:
        return dist.mean
    return dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)


def returns_to_go(rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns-to-go over a [T, N] rollout; they restart after every done (no bootstrap)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * torch.where(dones[t], 0.0, running)
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
    alive = mb["mask"]
    n_alive = alive.sum().clamp_min(1)
    total = lambda x: torch.where(alive, x, 0.0).sum()  # noqa: E731
    dist = actor.dist(mb["obs"])
    newlogprob = dist.log_prob(mb["action"]).flatten(1).sum(-1)
    logratio = torch.where(alive, newlogprob - mb["logprob"], 0.0)
    ratio = logratio.exp()
    adv = mb["advantages"]
    pg = total(torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
    entropy = total(dist.entropy().flatten(1).sum(-1))
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
            approx_kl=total((ratio - 1) - logratio), clipfrac=total(((ratio - 1.0).abs() > args.clip_coef).float()),
        )  # fmt: skip
    return loss, (stats / n_alive).detach()


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global norm of at most `max_norm`; returns the norm before clipping."""
    return nn.utils.clip_grad_norm_(params, max_norm)


def group_reset(envs, args: Args, iteration: int) -> tuple[torch.Tensor, dict]:
    """Group starts seeded by (seed, iteration): a resumed run sees the starts a straight run would."""
    try:
        return envs.reset(
            seed=shared.stream_seed(args.seed, "group_resets", iteration), options={"group_size": args.group_size}
        )
    except ValueError as e:
        shared.fail(f"--group-size {args.group_size}: {args.env_id} can't give groups identical starts: {e}")


def main(args: Args) -> dict:
    validate(args)
    trainer = shared.describe_trainer(__file__)  # this file: its name, path, hash, git state and network code
    env_options = shared.EnvOptions(args.env_id, args.env_kwargs, args.eval_env_kwargs, args.env_vectorization)
    flags = dataclasses.asdict(args)
    same = {k: flags[k] for k in ("hidden_sizes", "policy", "policy_kwargs")}  # the network and what it sees
    resume_same = {k: flags[k] for k in ("num_envs", "group_size", "learning_rate", "anneal_lr")}
    ckpt, ckpt_flag, ckpt_path = shared.load_resume_or_eval(args.resume, args.eval_checkpoint, trainer, env_options,
                                                            same, resume_same)  # fmt: skip
    ref_scripts = ["grpo", "ppo_continuous", "ppo_ddp", "ppo_async"]  # a PPO critic is ignored
    ref_ckpt = args.ref_checkpoint and shared.load_checkpoint(
        args.ref_checkpoint, "ref_checkpoint", ref_scripts, same, env_options
    )
    if ref_ckpt and ref_ckpt["args"].get("norm_obs"):
        shared.fail(f"--ref-checkpoint {args.ref_checkpoint}: trained with --norm-obs, which grpo.py does not have")
    shared.seed_everything(args.seed, args.torch_deterministic)
    device = shared.pick_device(args.cuda)

    eval_seed = shared.stream_seed(args.seed, "eval_envs")  # each random stream has its own seed (random_streams.py)
    eval_envs = shared.build_env(env_options, args.num_eval_envs, eval_seed, device, eval_envs=True)
    obs_dim, act_dim = shared.check_env_sizes(eval_envs, (ckpt, ckpt_flag), (ref_ckpt, "ref_checkpoint"))
    actor = make_agent(eval_envs, args).to(device)
    if hasattr(actor, "reference_dist") and args.ref_checkpoint:
        shared.fail(f"--ref-checkpoint: --policy {args.policy} provides its own KL reference (reference_dist); point "
                    "the policy at the reference weights instead (e.g. its model_path)")  # fmt: skip
    if ref_ckpt:  # the policy starts from the reference too (a PPO trainer's critic is dropped)
        mine = {k: v for k, v in ref_ckpt["model"].items() if k in actor.state_dict()}
        shared.load_model_state(actor, {**ref_ckpt, "model": mine}, "ref_checkpoint", args.ref_checkpoint)
    # the KL reference: a frozen copy of the initial policy (or --ref-checkpoint's, or the resumed run's)
    ref_actor = None if hasattr(actor, "reference_dist") else copy.deepcopy(actor).requires_grad_(False)
    if ref_actor is not None and args.resume and not ref_ckpt:
        ref_actor.load_state_dict(ckpt["ref_model"], strict=False)  # (older checkpoints: trained entries only)
    if ckpt is not None:
        shared.load_model_state(actor, ckpt, ckpt_flag, ckpt_path)
    reference = actor.reference_dist if ref_actor is None else ref_actor.dist
    act = partial(eval_action, actor, deterministic=args.eval_deterministic)
    if args.eval_checkpoint:  # evaluate a saved policy and exit
        evaluator = shared.Evaluator(
            eval_envs, shared.RunLogger(trainer, args), args.seed, args.num_eval_episodes, args.capture_video
        )
        return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)

    env_seed = shared.stream_seed(args.seed, "train_envs")
    envs = shared.build_env(env_options, args.num_envs, env_seed, device, eval_envs=False, like=eval_envs)
    start_iteration = ckpt["iteration"] + 1 if ckpt is not None else 1
    if ckpt is not None and ckpt["env_state"] is not None:
        shared.load_env_state_dict(envs, ckpt["env_state"])
    next_obs, start_info = group_reset(envs, args, start_iteration)  # first: can the env give groups one start?
    episode_steps = envs.spec.max_episode_steps if envs.spec is not None else None
    horizon = args.num_steps or episode_steps or getattr(envs.unwrapped, "max_episode_steps", None)
    if not horizon:
        shared.fail(f"--num-steps is required: {args.env_id} declares no max episode steps")
    batch_size = args.num_envs * horizon
    if batch_size % args.num_minibatches:
        shared.fail(
            f"--num-minibatches must divide the batch size num_envs*horizon={batch_size}, got {args.num_minibatches}"
        )
    num_iterations = max(1, args.total_timesteps // batch_size)
    if start_iteration > num_iterations:
        shared.fail(
            f"--total-timesteps {args.total_timesteps}: {args.resume} already completed {num_iterations} iterations"
        )
    params = [p for p in actor.parameters() if p.requires_grad]
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
    compiled = shared.Compiler(args.compile, device, logger.write, trainer, flags,
                               decided=ckpt and ckpt.get("compiled"))  # fmt: skip
    policy = compiled(policy_step, on_cpu=False)  # the rollout's policy step compiles on CUDA only (not paying on CPU)
    advantages_fn = compiled(group_advantages if args.advantage == "step" else episode_advantages)
    loss_fn, clip_fn, step_fn = compiled(grpo_loss), compiled(clip_gradients), compiled(optimizer.step)

    def save_checkpoint(name: str) -> str:  # everything a resume needs, as plain tensors and numbers
        state = dict(
            script=trainer["script"], trainer=trainer, args=dataclasses.asdict(args), model=actor.state_dict(),
            ref_model=None if ref_actor is None else ref_actor.state_dict(),  # None: the policy's own reference
            optimizer=optimizer.state_dict(), iteration=iteration, global_step=global_step,
            num_iterations=num_iterations, best_key=list(evaluator.best_key), obs_dim=obs_dim, act_dim=act_dim,
            env=shared.env_record(env_options, eval_envs),  # id, options, observation layout: a resume must match them
            rng=shared.rng_state(), env_state=shared.env_state_dict(envs),
            compiled=compiled.on,  # --compile auto's choice (None: not made yet), which a resume keeps
        )  # fmt: skip
        return str(shared.atomic_save(state, logger.checkpoint_dir / name))

    storage = shared.rollout_storage(
        horizon, args.num_envs, device,
        obs=envs.single_observation_space,  # TensorDict observations as they come, uint8 images as uint8
        action=(envs.single_action_space.shape, torch.float32), logprob=((), torch.float32),
        reward=((), torch.float32), done=((), torch.bool),
    )  # fmt: skip
    cpu = device.type == "cpu"  # there, asking whether any episode ended costs nothing (no device to wait for)
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
            if iteration > start_iteration:  # the first iteration's starts were drawn above
                next_obs, start_info = group_reset(envs, args, iteration)

            # ---- rollout of one horizon from group starts: no host sync inside this loop on a GPU ----
            rollout_stats = shared.RolloutStats(device, task_names)  # of the first episodes that end within the horizon
            alive = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # still in the first episode
            success = torch.zeros_like(alive)  # the first episode succeeded within the horizon
            watch = shared.NonFiniteWatch(args.num_envs, device)
            with torch.no_grad():
                for step in range(horizon):
                    out = policy(actor, next_obs)
                    storage["obs"][step] = next_obs
                    storage["action"][step], storage["logprob"][step] = out["action"], out["logprob"]
                    next_obs, reward, terminated, truncated, info = envs.step(out["action"])
                    storage["reward"][step] = reward
                    storage["done"][step] = done = terminated | truncated
                    rollout_stats.add_reward_terms(info)
                    if not cpu or done.any():  # what only finished episodes need (on the CPU, asking is free)
                        watch.update_final(step, info["final_obs"], done)
                        counted = done & alive
                        rollout_stats.add_episodes(info, counted=counted)
                        success |= counted & (info["episode"]["success"] > 0)
                        alive &= ~done
                watch.update_rollout(storage["obs"], next_obs, storage["reward"])  # obs[0]: the group starts
            watch.check(global_step, args.num_envs, where=f"{args.env_id} ")  # one line naming envs and step
            global_step += batch_size

            # ---- group-relative advantages (critic-free) ----
            with torch.no_grad():
                rewards, dones = storage["reward"], storage["done"]
                mask = first_episode_mask(dones) if args.truncate_at_first_done else torch.ones_like(dones)
                # --advantage episode: episode_advantages sums the rewards over each first episode
                returns = returns_to_go(rewards, dones, args.gamma) if args.advantage == "step" else rewards
                advantages, adv_stats = advantages_fn(returns, mask, args.group_size, args.scale_adv, args.adv_eps)
                kept = informative_groups(advantages, args.group_size)  # groups whose returns differ
                if args.filter_groups:  # the others leave the update (and its averages) altogether
                    mask = mask & kept
                batch = storage.select("obs", "action", "logprob").reshape(-1)
                batch["advantages"], batch["mask"] = advantages.reshape(-1), mask.reshape(-1)
                batch["ref_logprob"] = reference(batch["obs"]).log_prob(batch["action"]).flatten(1).sum(-1)

            # ---- PPO-clip update over the masked samples ----
            update_stats = []  # statistics of the applied minibatch steps, averaged for logging
            learn = not args.filter_groups or bool(kept.any())  # no group with a signal: no update at all
            for _epoch in range(args.update_epochs if learn else 0):
                epoch_kl = []
                for idx in torch.randperm(batch_size, device=device).view(args.num_minibatches, -1):
                    loss, stats = loss_fn(actor, batch[idx], args)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = clip_fn(params, args.max_grad_norm)
                    if not guard.ok(loss.detach(), grad_norm, global_step):  # many in a row stop the run
                        continue
                    step_fn()
                    epoch_kl.append(stats["approx_kl"])
                    update_stats.append(stats)
                if args.target_kl is not None and epoch_kl and float(torch.stack(epoch_kl).mean()) > args.target_kl:
                    break

            # ---- logging: one host sync per iteration ----
            means = torch.stack(update_stats).mean(0).items() if update_stats else ()
            scalars = {("grpo/" if k == "kl_ref" else "losses/") + k: v for k, v in means}
            lr = optimizer.param_groups[0]["lr"]
            scalars.update({"charts/learning_rate": lr, "charts/skipped_updates": guard.skipped})
            scalars.update({"grpo/mask_frac": mask.float().mean(), "grpo/kept_group_frac": kept.float().mean()})
            scalars.update({"grpo/finished_frac": (~alive).float().mean(), **rollout_stats.scalars()})
            scalars.update({f"grpo/{k}": v for k, v in adv_stats.items()})
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
