"""GRPO (Group Relative Policy Optimization) for continuous control, critic-free, in one file.

    uv run python cleanrl_embodied/grpo.py --env-id PushCubeRL
    uv run python cleanrl_embodied/grpo.py --env-id Pendulum-v1 --num-envs 64 --group-size 8 --gamma 0.99

Every iteration resets the envs with `reset(options={"group_size": G})`, so each group of G consecutive
envs starts from one identical state, and rolls out one episode horizon. Instead of a critic, the
advantage of a step is its discounted return-to-go compared with the other members of its group at the
same time step: (R - group mean) / (group std + eps), over the members still in their first episode.
The policy is then updated with the PPO-clip surrogate, an entropy bonus and an optional k3 KL penalty
to a frozen reference policy.

Read top to bottom: `Args`, the `Actor`, four pure functions (`policy_step`, `returns_to_go`,
`group_advantages`, `grpo_loss`) that torch.compile can wrap unchanged, evaluation, then `main`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared import RunLogger, atomic_save, check_env_id, make_env, rollout_storage


@dataclass
class Args:
    exp_name: str = "grpo"
    """the name of this experiment (part of the run directory name)"""
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
    """record an mp4 of the first eval env at every evaluation (under `videos/` in the run directory)"""
    output_dir: str = "runs"
    """root folder of run directories"""
    resume: str | None = None
    """continue training from this checkpoint (counters, optimizer, schedule, random stream, reference policy)"""

    # Environment
    env_id: str = "PushCubeRL"
    """the environment id: PushCubeRL or any Gymnasium id with a Box action space and seeded resets"""
    env_kwargs: str = "{}"
    """JSON keyword arguments of the training envs, e.g. '{"push_friction_range": [0.5, 1.5]}'"""
    eval_env_kwargs: str = "{}"
    """JSON keyword arguments of the eval envs (no randomization unless given here)"""
    env_vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium (numpy) ids: step sub-envs in this process (sync) or one worker process each (async)"""
    num_envs: int = 256
    """number of parallel training environments (a multiple of --group-size)"""
    num_eval_envs: int = 64
    """number of parallel evaluation environments"""
    num_eval_episodes: int = 64
    """episodes per evaluation (each eval env contributes its first completed episodes)"""
    eval_freq: int = 10
    """evaluate every this many iterations (0 disables periodic eval; a final eval always runs)"""
    eval_deterministic: bool = True
    """evaluate with the mean action (``--no-eval-deterministic`` samples)"""
    eval_checkpoint: str | None = None
    """evaluate this grpo checkpoint (with video if --capture-video) and exit without training"""
    save_freq: int = 25
    """write checkpoints/last.pt every this many iterations (and always at the end)"""

    # Algorithm
    total_timesteps: int = 1_000_000
    """total environment steps (summed over envs, masked steps included)"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int | None = None
    """rollout length per env per iteration; default: the env's max episode steps (50 for PushCubeRL)"""
    group_size: int = 8
    """G: rollouts per group that start from the same state (>= 2, divides --num-envs)"""
    gamma: float = 0.9
    """discount factor of the step-wise returns-to-go"""
    truncate_at_first_done: bool = True
    """mask out each env's data after its first done (terminated | truncated)"""
    scale_adv: bool = True
    """divide group-centred returns by the group std (``--no-scale-adv``: Dr. GRPO, centring only)"""
    adv_eps: float = 1e-4
    """added to the group std before dividing"""
    num_minibatches: int = 4
    """minibatches per epoch (the batch is num_envs * num_steps samples, masked ones included)"""
    update_epochs: int = 4
    """optimization epochs per rollout"""
    clip_coef: float = 0.2
    """PPO surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    kl_coef: float = 0.0
    """coefficient of the k3 KL penalty to the frozen reference policy (0: logged only)"""
    ref_checkpoint: str | None = None
    """reference policy (and initial policy) from a grpo or ppo_continuous checkpoint; default: the initial policy"""
    max_grad_norm: float = 0.5
    """global gradient-norm clipping"""
    max_consecutive_skips: int = 10
    """stop after this many optimizer steps in a row skipped for a non-finite loss or gradient"""
    target_kl: float | None = 0.1
    """stop the epoch loop early when the approximate KL exceeds this (None disables)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the actor MLP"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""
    compile: bool = False
    """torch.compile the policy step, the group advantages and the loss"""


def fail(msg: str) -> None:
    raise SystemExit(f"error: {msg}")


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    for name in ("num_envs", "total_timesteps", "num_minibatches", "update_epochs", "num_eval_envs",
                 "num_eval_episodes", "max_consecutive_skips"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.num_steps is not None and args.num_steps <= 0:
        fail(f"--num-steps must be a positive integer, got {args.num_steps}")
    for name in ("eval_freq", "save_freq"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0 (0 disables), got {getattr(args, name)}")
    if args.group_size < 2 or args.num_envs % args.group_size:
        fail(f"--group-size must be >= 2 and divide --num-envs={args.num_envs}, got {args.group_size}")
    if args.num_minibatches > args.num_envs * (args.num_steps or 1):
        fail(f"--num-minibatches must be at most the batch size num_envs*num_steps, got {args.num_minibatches}")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    for name in ("learning_rate", "adv_eps"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("clip_coef", "ent_coef", "kl_coef", "max_grad_norm"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        fail(f"--hidden-sizes must be positive integers, got {args.hidden_sizes}")
    for name in ("env_kwargs", "eval_env_kwargs"):
        try:
            assert isinstance(json.loads(getattr(args, name)), dict)
        except (json.JSONDecodeError, AssertionError):
            fail(f"--{name.replace('_', '-')} must be a JSON object like '{{\"key\": 1.0}}', "
                 f"got {getattr(args, name)!r}")
    try:
        check_env_id(args.env_id)
    except ValueError as e:
        fail(str(e))


def load_checkpoint(path: str, flag: str, env_id: str, grpo_only: bool) -> dict:
    """torch.load(weights_only=True) a grpo (or, unless `grpo_only`, ppo_continuous) checkpoint for `env_id`."""
    if not Path(path).is_file():
        fail(f"{flag} {path}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user mistake
        reason = (str(e).splitlines() or [""])[0]
        fail(f"{flag} {path}: not a readable checkpoint ({type(e).__name__}: {reason})")
    if (not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict)
            or (grpo_only and ckpt.get("script") != "grpo") or "actor_logstd" not in ckpt["model"]):
        fail(f"{flag} {path}: not a checkpoint of grpo.py{'' if grpo_only else ' or ppo_continuous.py'}")
    if ckpt.get("env_id") != env_id:
        fail(f"{flag} {path}: checkpoint is for env {ckpt.get('env_id')!r}, not --env-id {env_id!r}")
    if (ckpt.get("args") or {}).get("norm_obs"):
        fail(f"{flag} {path}: trained with --norm-obs (observation normalization), which grpo.py does not have")
    return ckpt


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
    """Gaussian actor with a state-independent log-std (the PPO actor; parameter names match its Agent)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: tuple[int, ...], init_logstd: float):
        super().__init__()
        self.actor_mean = mlp(obs_dim, hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), init_logstd))

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        mean = self.actor_mean(obs)
        # validate_args=False: the argument check would cost a host sync on every call
        return torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False)


def policy_step(actor: Actor, obs: torch.Tensor) -> TensorDict:
    """Sample a raw (unclipped) Gaussian action and its log-prob."""
    dist = actor.dist(obs)
    action = dist.sample()
    return TensorDict(action=action, logprob=dist.log_prob(action).sum(-1), batch_size=obs.shape[:1])


def returns_to_go(rewards: torch.Tensor, dones: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns-to-go over a [T, N] rollout; they restart after every done (no bootstrap)."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    not_done = (~dones).to(rewards.dtype)
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * not_done[t] * running
        returns[t] = running
    return returns


def first_episode_mask(dones: torch.Tensor) -> torch.Tensor:
    """[T, N] bool: True up to and including each env's first done, False after it."""
    d = dones.int()
    return (d.cumsum(0) - d) == 0


def group_advantages(
    returns: torch.Tensor, mask: torch.Tensor, group_size: int, scale: bool, eps: float
) -> tuple[torch.Tensor, TensorDict]:
    """Group-relative advantages per time step over the alive members of each group.

    returns, mask: [T, N] with N = num_groups * group_size (consecutive envs form a group). At each time
    step, a group's alive members (mask True) get (R - mean) / (std + eps) (std with Bessel's correction),
    or R - mean when not `scale`. A cell with fewer than two alive members or with all alive returns
    equal gets 0, as do masked entries; never NaN. Returns (advantages [T, N], statistics): zero_adv_group_frac
    = share of (time step, group) cells with an alive member that got zero advantage, mean_group_std = mean
    std over cells with two or more alive members.
    """
    T, N = returns.shape
    r = returns.reshape(T, N // group_size, group_size)
    alive = mask.reshape(T, N // group_size, group_size)
    m = alive.to(returns.dtype)
    count = m.sum(-1, keepdim=True)
    mean = (r * m).sum(-1, keepdim=True) / count.clamp_min(1)
    centred = (r - mean) * m
    std = ((centred * centred).sum(-1, keepdim=True) / (count - 1).clamp_min(1)).sqrt()
    spread = (torch.where(alive, r, -torch.inf).amax(-1, keepdim=True)
              - torch.where(alive, r, torch.inf).amin(-1, keepdim=True))
    zero = (count < 2) | ~(spread > 0)  # exact ties: the mean's rounding must not become a signal
    adv = centred / (std + eps) if scale else centred
    adv = torch.where(zero, torch.zeros_like(adv), adv)
    live, multi = count >= 1, count >= 2
    stats = TensorDict(
        zero_adv_group_frac=(zero & live).sum() / live.sum().clamp_min(1),
        mean_group_std=(std * multi).sum() / multi.sum().clamp_min(1),
    )
    return adv.reshape(T, N), stats


def grpo_loss(actor: Actor, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """Masked PPO-clip loss + entropy bonus + k3 KL to the reference on one minibatch; (loss, statistics)."""
    dist = actor.dist(mb["obs"])
    newlogprob = dist.log_prob(mb["action"]).sum(-1)
    logratio = newlogprob - mb["logprob"]
    ratio = logratio.exp()
    mask = mb["mask"].to(ratio.dtype)
    denom = mask.sum().clamp_min(1)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum() / denom

    adv = mb["advantages"]
    pg_loss = masked_mean(torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
    entropy = masked_mean(dist.entropy().sum(-1))
    ref_logratio = (mb["ref_logprob"] - newlogprob).clamp(-20, 20)  # clamp: exp() can't overflow
    kl_ref = masked_mean(ref_logratio.exp() - ref_logratio - 1)  # k3 estimate of KL(pi || pi_ref)
    loss = pg_loss - args.ent_coef * entropy + args.kl_coef * kl_ref
    with torch.no_grad():
        stats = TensorDict(
            policy_loss=pg_loss, entropy=entropy, kl_ref=kl_ref,
            approx_kl=masked_mean((ratio - 1) - logratio),
            clipfrac=masked_mean(((ratio - 1.0).abs() > args.clip_coef).to(ratio.dtype)),
        )
    return loss, stats


@torch.no_grad()
def evaluate(actor: Actor, env, num_episodes: int, deterministic: bool, seed: int,
             video_frames: list | None = None) -> dict[str, float | None]:
    """Run eval episodes (each eval env contributes its first completed episodes) and average them.
    Sampling uses its own generator, so evaluating never changes the training run's random stream."""
    gen = torch.Generator(device=actor.actor_logstd.device).manual_seed(seed)
    n = env.num_envs
    per_env = -(-num_episodes // n)  # ceil
    obs, _ = env.reset(seed=seed)
    done_count = torch.zeros(n, dtype=torch.long, device=obs.device)
    sums, has_success = torch.zeros(3, device=obs.device), False
    while bool((done_count < per_env).any()):
        dist = actor.dist(obs)
        action = dist.mean if deterministic else dist.mean + dist.stddev * torch.randn(
            dist.mean.shape, generator=gen, device=obs.device)
        obs, _, _, _, info = env.step(action)
        has_success = has_success or "success" in info
        if video_frames is not None and int(done_count[0]) == 0:
            frame = env.render()
            video_frames.append(frame[0] if isinstance(frame, (list, tuple)) else frame)
        counted = (info["_episode"] & (done_count < per_env)).float()
        ep = info["episode"]
        sums += torch.stack([(ep["r"] * counted).sum(), (ep["l"] * counted).sum(), (ep["success"] * counted).sum()])
        done_count += info["_episode"].long()
    ret, length, success = (sums / (per_env * n)).tolist()
    return {"episodic_return": ret, "episodic_length": length, "success_rate": success if has_success else None}


def build_env(args: Args, device: torch.device, num_envs: int, seed: int, kwargs_flag: str):
    """make_env, with a bad keyword argument reported as one line naming the flag that carried it."""
    try:
        return make_env(args.env_id, num_envs=num_envs, device=device, seed=seed,
                        vectorization=args.env_vectorization, **json.loads(getattr(args, kwargs_flag)))
    except (TypeError, ValueError) as e:
        fail(f"--{kwargs_flag.replace('_', '-')} / --env-id {args.env_id}: {e}")


def main(args: Args) -> dict:
    validate(args)
    if args.eval_checkpoint:
        return evaluate_checkpoint(args)
    resumed = load_checkpoint(args.resume, "--resume", args.env_id, True) if args.resume else None
    ref_ckpt = load_checkpoint(args.ref_checkpoint, "--ref-checkpoint", args.env_id, False) if args.ref_checkpoint \
        else None
    start_iteration = resumed["iteration"] if resumed else 0

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = build_env(args, device, args.num_envs, args.seed, "env_kwargs")

    def group_reset(iteration: int) -> torch.Tensor:
        """Group starts seeded by (seed, iteration): a resumed run sees the starts a straight run would."""
        seed = int(np.random.SeedSequence([args.seed, iteration]).generate_state(1)[0] % 2**31)
        try:
            return envs.reset(seed=seed, options={"group_size": args.group_size})[0]
        except ValueError as e:
            envs.close()
            fail(f"--group-size {args.group_size}: {args.env_id} can't give groups identical starts: {e}")

    next_obs = group_reset(start_iteration + 1)  # first of all, check that the env can do group resets
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    horizon = args.num_steps
    if horizon is None:
        horizon = (envs.spec.max_episode_steps if envs.spec is not None else None) or getattr(
            envs.unwrapped, "max_episode_steps", None)
    problem = None if horizon else f"--num-steps is required: {args.env_id} declares no max episode steps"
    for ckpt, flag in ((resumed, "--resume"), (ref_ckpt, "--ref-checkpoint")):
        if ckpt is not None and (ckpt.get("obs_dim"), ckpt.get("act_dim")) != (obs_dim, act_dim):
            problem = (f"{flag}: the checkpoint has obs/act dims {ckpt.get('obs_dim')}/{ckpt.get('act_dim')}, "
                       f"{args.env_id} has {obs_dim}/{act_dim}")
    actor = Actor(obs_dim, act_dim, args.hidden_sizes, args.init_logstd).to(device)
    ref_actor = Actor(obs_dim, act_dim, args.hidden_sizes, args.init_logstd).to(device)
    try:  # reference: --ref-checkpoint, else the resumed run's reference, else the initial policy
        if ref_ckpt is not None:  # the policy starts from the reference too (a ppo_continuous critic is dropped)
            actor.load_state_dict({k: v for k, v in ref_ckpt["model"].items() if k.startswith("actor_")})
        ref_actor.load_state_dict(resumed["ref_model"] if resumed is not None and ref_ckpt is None
                                  else actor.state_dict())
        if resumed is not None:
            actor.load_state_dict(resumed["model"])
    except (RuntimeError, KeyError) as e:
        problem = problem or (f"--resume/--ref-checkpoint: the network does not match --hidden-sizes "
                              f"{args.hidden_sizes} ({str(e).splitlines()[0]})")
    if problem:
        envs.close()
        fail(problem)
    ref_actor.requires_grad_(False)
    optimizer = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, eps=1e-5)
    if resumed is not None:  # counters, optimizer and random stream: a resume continues the straight run
        optimizer.load_state_dict(resumed["optimizer"])
        torch.set_rng_state(resumed["rng"])
        if resumed["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(resumed["cuda_rng"])
    batch_size = args.num_envs * horizon
    num_iterations = max(1, args.total_timesteps // batch_size)
    eval_envs = build_env(args, device, args.num_eval_envs, args.seed + 10_000, "eval_env_kwargs")

    logger = RunLogger("grpo", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
                       output_dir=args.output_dir, track=args.track, wandb_project_name=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, total_iterations=num_iterations - start_iteration)
    logger.write(f"device={device} envs={args.num_envs} groups={args.num_envs // args.group_size}x{args.group_size} "
                 f"horizon={horizon} batch={batch_size} iterations={num_iterations} start={start_iteration + 1} "
                 f"run_dir={logger.run_dir}")
    policy, advantages_fn, loss_fn = policy_step, group_advantages, grpo_loss
    if args.compile:
        policy, advantages_fn, loss_fn = torch.compile(policy), torch.compile(advantages_fn), torch.compile(loss_fn)

    storage = rollout_storage(
        horizon, args.num_envs, device,
        obs=((obs_dim,), torch.float32), action=((act_dim,), torch.float32), logprob=((), torch.float32),
        reward=((), torch.float32), done=((), torch.bool),
    )
    global_step = resumed["global_step"] if resumed else 0
    eval_result = resumed["eval"] if resumed else None
    best_key = (-1.0, -float("inf"))  # (success rate, return) of best.pt in this run directory

    def save_checkpoint(name: str, iteration: int) -> str:
        state = {"script": "grpo", "model": actor.state_dict(), "ref_model": ref_actor.state_dict(),
                 "optimizer": optimizer.state_dict(), "iteration": iteration, "global_step": global_step,
                 "env_id": args.env_id, "obs_dim": obs_dim, "act_dim": act_dim, "eval": eval_result,
                 "rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                 "args": dataclasses.asdict(args)}
        return str(atomic_save(state, logger.checkpoint_dir / name))

    render_warned = False

    def run_eval(iteration: int) -> None:
        nonlocal eval_result, best_key, render_warned
        frames = [] if args.capture_video and not render_warned else None
        eval_result = evaluate(actor, eval_envs, args.num_eval_episodes, args.eval_deterministic,
                               args.seed + 10_000, frames)
        eval_result["global_step"] = global_step
        logger.log({f"eval/{k}": v for k, v in eval_result.items() if k != "global_step" and v is not None},
                   global_step)
        if frames is not None and (not frames or frames[0] is None):
            logger.write(f"warning: {args.env_id} cannot render here; no video, training goes on")
            render_warned = True
        elif frames:
            logger.write_video(np.stack([np.asarray(f) for f in frames]), f"eval_{global_step}", global_step)
        key = (eval_result["success_rate"] or 0.0, eval_result["episodic_return"])
        if key > best_key:
            best_key = key
            save_checkpoint("best.pt", iteration)

    # Ctrl-C asks the loop to stop after the current iteration (a second Ctrl-C stops at once).
    stop = {"requested": False}

    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        logger.write("Ctrl-C: finishing this iteration, then writing last.pt and summary.json")

    previous_handler = signal.signal(signal.SIGINT, on_sigint)

    def abort(msg: str) -> None:
        signal.signal(signal.SIGINT, previous_handler)
        logger.close(exit_code=1)
        envs.close()
        eval_envs.close()
        fail(msg)

    iteration, skipped, consecutive_skips = start_iteration, 0, 0
    next_eval, next_save = start_iteration + args.eval_freq, start_iteration + args.save_freq
    start_time, start_step = time.time(), global_step
    never = horizon + 1  # "no non-finite value seen" in first_bad
    for iteration in range(start_iteration + 1, num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1) / num_iterations)
        if iteration > start_iteration + 1:
            next_obs = group_reset(iteration)

        # ---- rollout of one horizon from group starts: no host sync inside this loop ----
        ep_sums = torch.zeros(4, device=device)  # first episodes: count, return, length, success
        alive = torch.ones(args.num_envs, dtype=torch.bool, device=device)
        # first non-finite observation and reward, as an index: 0 = the reset obs, t + 1 = after step t
        first_bad = torch.full((2,), never, dtype=torch.long, device=device)
        first_bad[0] = torch.where(torch.isfinite(next_obs).all(), never, 0)
        with torch.no_grad():
            for step in range(horizon):
                out = policy(actor, next_obs)
                storage["obs"][step] = next_obs
                storage["action"][step], storage["logprob"][step] = out["action"], out["logprob"]
                next_obs, reward, terminated, truncated, info = envs.step(out["action"])
                done = terminated | truncated
                storage["reward"][step], storage["done"][step] = reward, done
                obs_ok = torch.isfinite(next_obs).all() & torch.isfinite(info.get("final_obs", next_obs)).all()
                bad = torch.stack([~obs_ok, ~torch.isfinite(reward).all()])
                first_bad = torch.minimum(first_bad, torch.where(bad, step + 1, never))
                has_success = "success" in info  # a Python bool: no host sync
                counted, ep = (info["_episode"] & alive).float(), info["episode"]
                ep_sums += torch.stack([counted.sum(), (ep["r"] * counted).sum(), (ep["l"] * counted).sum(),
                                        (ep["success"] * counted).sum()])
                alive &= ~done
        for name, index in zip(("observation", "reward"), first_bad.tolist()):
            if index < never:
                abort(f"non-finite {name} from {args.env_id} at global step {global_step + index * args.num_envs}")
        global_step += batch_size

        # ---- group-relative advantages (critic-free) ----
        with torch.no_grad():
            mask = first_episode_mask(storage["done"]) if args.truncate_at_first_done \
                else torch.ones_like(storage["done"])
            returns = returns_to_go(storage["reward"], storage["done"], args.gamma)
            advantages, adv_stats = advantages_fn(returns, mask, args.group_size, args.scale_adv, args.adv_eps)
            batch = storage.select("obs", "action", "logprob").reshape(-1)
            batch["advantages"], batch["mask"] = advantages.reshape(-1), mask.reshape(-1)
            batch["ref_logprob"] = ref_actor.dist(batch["obs"]).log_prob(batch["action"]).sum(-1)

        # ---- PPO-clip update over the masked samples ----
        for _epoch in range(args.update_epochs):
            epoch_stats = []
            for idx in torch.randperm(batch_size, device=device).tensor_split(args.num_minibatches):
                loss, stats = loss_fn(actor, batch[idx], args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(actor.parameters(), args.max_grad_norm)
                epoch_stats.append(stats)
                if not bool(torch.isfinite(loss) & torch.isfinite(grad_norm)):  # skip, count, maybe stop
                    skipped, consecutive_skips = skipped + 1, consecutive_skips + 1
                    if consecutive_skips >= args.max_consecutive_skips:
                        abort(f"{consecutive_skips} optimizer steps in a row had a non-finite loss or gradient "
                              f"(last at global step {global_step}); lower --learning-rate or check the env")
                    continue
                consecutive_skips = 0
                optimizer.step()
            stats = torch.stack(epoch_stats).mean(dim=0)
            if args.target_kl is not None and float(stats["approx_kl"]) > args.target_kl:
                break

        # ---- logging: one host sync per iteration ----
        sps = (global_step - start_step) / (time.time() - start_time)
        scalars = {f"losses/{k}": v for k, v in stats.items() if k != "kl_ref"}
        scalars.update({"charts/SPS": sps, "charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "charts/skipped_updates": skipped,
                        "grpo/kl_ref": stats["kl_ref"], "grpo/mask_frac": mask.float().mean(),
                        **{f"grpo/{k}": v for k, v in adv_stats.items()}})
        if float(ep_sums[0]) > 0:
            n_ep = ep_sums[0]
            scalars.update({"charts/episodic_return": ep_sums[1] / n_ep, "charts/episodic_length": ep_sums[2] / n_ep})
            if has_success:  # envs without a success signal (e.g. MuJoCo locomotion) log none
                scalars["charts/success_rate"] = ep_sums[3] / n_ep
        logger.log(scalars, global_step)
        logger.progress(global_step, SPS=sps, ret=logger.latest.get("charts/episodic_return"),
                        succ=logger.latest.get("charts/success_rate"))

        # frequencies are thresholds on the iteration counter (they survive resumes and odd sizes)
        if args.eval_freq and iteration >= next_eval and iteration < num_iterations:
            next_eval = iteration + args.eval_freq
            run_eval(iteration)
        if args.save_freq and iteration >= next_save:
            next_save = iteration + args.save_freq
            save_checkpoint("last.pt", iteration)
            save_checkpoint(f"iter_{iteration:06d}.pt", iteration)
        if stop["requested"]:
            break

    checkpoint = save_checkpoint("last.pt", iteration)
    if not stop["requested"]:
        run_eval(iteration)
    signal.signal(signal.SIGINT, previous_handler)
    wall = time.time() - start_time
    logger.write_summary(global_step=global_step, wall_time_s=wall, sps=(global_step - start_step) / max(wall, 1e-9),
                         eval=eval_result, checkpoint=checkpoint)
    logger.write(f"done: global_step={global_step} wall_time={wall:.1f}s eval={eval_result}")
    logger.close()
    envs.close()
    eval_envs.close()
    if stop["requested"]:
        sys.exit(130)
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step, "checkpoint": checkpoint}


def evaluate_checkpoint(args: Args) -> dict:
    """--eval-checkpoint: evaluate a saved grpo policy on the eval envs (video if asked), write summary.json."""
    ckpt = load_checkpoint(args.eval_checkpoint, "--eval-checkpoint", args.env_id, True)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    eval_envs = build_env(args, device, args.num_eval_envs, args.seed + 10_000, "eval_env_kwargs")
    obs_dim, act_dim = eval_envs.single_observation_space.shape[0], eval_envs.single_action_space.shape[0]
    if (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
        fail(f"--eval-checkpoint: the checkpoint has obs/act dims {ckpt['obs_dim']}/{ckpt['act_dim']}, "
             f"{args.env_id} has {obs_dim}/{act_dim}")
    actor = Actor(obs_dim, act_dim, tuple(ckpt["args"]["hidden_sizes"]), args.init_logstd).to(device)
    actor.load_state_dict(ckpt["model"])
    logger = RunLogger("grpo", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
                       output_dir=args.output_dir, track=args.track, wandb_project_name=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, total_iterations=None)
    frames = [] if args.capture_video else None
    result = evaluate(actor, eval_envs, args.num_eval_episodes, args.eval_deterministic, args.seed + 10_000, frames)
    result["global_step"] = ckpt["global_step"]
    logger.log({f"eval/{k}": v for k, v in result.items() if k != "global_step" and v is not None},
               ckpt["global_step"])
    if frames and frames[0] is not None:
        logger.write_video(np.stack([np.asarray(f) for f in frames]), f"eval_{ckpt['global_step']}",
                           ckpt["global_step"])
    elif frames is not None:
        logger.write(f"warning: {args.env_id} cannot render here; no video")
    logger.write(f"eval of {args.eval_checkpoint}: {result}")
    logger.write_summary(global_step=ckpt["global_step"], wall_time_s=0.0, sps=0.0, eval=result,
                         checkpoint=args.eval_checkpoint)
    logger.close()
    eval_envs.close()
    return {"run_dir": str(logger.run_dir), "eval": result, "global_step": ckpt["global_step"], "checkpoint": None}


if __name__ == "__main__":
    main(tyro.cli(Args))
