"""PPO on many CPUs, GPUs and nodes through torch.distributed, in one file.

    uv run torchrun --standalone --nproc_per_node 2 cleanrl_embodied/ppo_ddp.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_ddp.py --env-id PushCubeRL        # without torchrun: a world of one

This is ppo_continuous.py made data-parallel; it has the same flags plus `--backend` and `--dist-timeout-s`.
Every rank steps its own `--num-envs` envs (seeded seed + rank * num_envs), collects its own rollout and
cuts it into its own minibatches; `--total-timesteps` counts the env steps of all ranks together.
What keeps the ranks one run:

- identical initial weights (same seed, checked bit for bit against rank 0 at start and at the end);
- `sync_gradients`: before every optimizer step, one all-reduce of one flat buffer holding every gradient
  and the loss, so all ranks step with the same averaged gradient and skip the same non-finite steps;
- observation and reward normalizers merged over all ranks (all-gather of count, mean, variance);
- every decision that changes control flow (target-KL stop, non-finite data, Ctrl-C/SIGTERM) is all-reduced;
- rank 0 alone logs, evaluates and writes checkpoints and summary.json; episode statistics are summed
  over ranks. A rank that dies or stalls makes the others stop with one error line (`--dist-timeout-s`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from tensordict import TensorDict, from_module

from cleanrl_embodied.shared import RunLogger, atomic_save, check_env_id, make_env, rollout_storage
from cleanrl_embodied.shared.envs import env_state_dict, load_env_state_dict


@dataclass
class Args:
    exp_name: str = "ppo_ddp"
    """the name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment; initial weights use it on every rank, envs seed + rank * num_envs"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """use CUDA when it is available, one GPU per rank (LOCAL_RANK); ``--no-cuda`` forces the CPU"""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend: auto = nccl on CUDA, gloo on CPU"""
    dist_timeout_s: int = 300
    """seconds any rank waits in a collective for a missing rank before all stop with an error; must exceed
    rank 0's longest pause (an evaluation plus a checkpoint)"""
    track: bool = False
    """log to Weights & Biases (synced with TensorBoard)"""
    wandb_project_name: str = "cleanrl_embodied"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team)"""
    capture_video: bool = False
    """record the first eval env's episode as mp4 at every evaluation (run_dir/videos/)"""
    output_dir: str = "runs"
    """root folder of run directories (written by rank 0 only)"""

    # Environment
    env_id: str = "PushCubeRL"
    """the environment id: PushCubeRL or any Gymnasium id with a Box action space"""
    env_kwargs: str = "{}"
    """JSON keyword arguments of the training envs, e.g. '{"push_friction_range": [0.5, 1.5]}'"""
    eval_env_kwargs: str = "{}"
    """JSON keyword arguments of the eval envs (no randomization unless given here)"""
    env_vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium (numpy) ids: step sub-envs in this process (sync) or one worker process each (async)"""
    num_envs: int = 256
    """number of parallel training environments PER RANK"""
    num_eval_envs: int = 64
    """number of parallel evaluation environments (rank 0 evaluates alone)"""
    num_eval_episodes: int = 64
    """episodes per evaluation (each eval env contributes its first completed episodes)"""
    eval_freq: int = 25
    """evaluate every this many iterations (0: only the final evaluation)"""
    eval_deterministic: bool = True
    """evaluate with the mean action (``--no-eval-deterministic`` samples)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint on rank 0 (with video if --capture-video) and exit without training"""
    save_freq: int = 25
    """write checkpoints/last.pt (and a numbered copy) every this many iterations; always at the end"""
    resume: str | None = None
    """continue from this checkpoint (read by rank 0 and sent to all ranks; any world size)"""

    # Algorithm
    total_timesteps: int = 2_000_000
    """total environment steps, summed over all envs of ALL ranks"""
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
    """minibatches per epoch; each rank splits its own batch (num_envs*num_steps) into this many"""
    update_epochs: int = 4
    """optimization epochs per rollout"""
    norm_adv: bool = True
    """normalize advantages per minibatch (with each rank's own minibatch statistics)"""
    clip_coef: float = 0.2
    """PPO surrogate clipping coefficient"""
    clip_vloss: bool = False
    """clip the value loss around the old values"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clipping (of the rank-averaged gradient)"""
    target_kl: float | None = 0.1
    """stop the epoch loop early when the epoch's mean approximate KL (over ranks) exceeds this (None disables)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the actor and the critic MLPs"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""
    norm_obs: bool = False
    """normalize observations with running mean/std merged over all ranks (updated from rollouts, frozen at eval)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return (statistics merged over all ranks)"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip, clip]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip, clip]"""
    max_consecutive_skips: int = 10
    """stop after this many optimizer steps in a row skipped for a non-finite loss or gradient (on any rank)"""
    compile: bool = False
    """torch.compile the policy step, GAE and the loss"""
    cudagraphs: bool = False
    """capture the policy step in a CUDA graph (CUDA only)"""


def fail(msg: str, show: bool = True) -> None:
    """Exit with one line; show=False exits quietly (rank 0 or the rank concerned prints the line)."""
    raise SystemExit(f"error: {msg}" if show else 1)


def validate(args: Args) -> None:
    """Raise ValueError with one line naming the flag, before any process group or env is built."""
    for name in ("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs",
                 "num_eval_envs", "num_eval_episodes", "max_consecutive_skips", "dist_timeout_s"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    for name in ("eval_freq", "save_freq"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (0 disables), got {getattr(args, name)}")
    batch_size = args.num_envs * args.num_steps
    if args.num_minibatches > batch_size or batch_size % args.num_minibatches:
        raise ValueError(f"--num-minibatches must divide the per-rank batch size num_envs*num_steps={batch_size} "
                         f"(minibatch no larger than the batch), got {args.num_minibatches}")
    if not 0.0 < args.gamma <= 1.0:
        raise ValueError(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0.0 <= args.gae_lambda <= 1.0:
        raise ValueError(f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    if args.learning_rate <= 0 or args.clip_obs <= 0 or args.clip_reward <= 0:
        raise ValueError("--learning-rate, --clip-obs and --clip-reward must be > 0")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        raise ValueError(f"--hidden-sizes must be positive integers, got {args.hidden_sizes}")
    for name in ("env_kwargs", "eval_env_kwargs"):
        try:
            assert isinstance(json.loads(getattr(args, name)), dict)
        except (json.JSONDecodeError, AssertionError):
            raise ValueError(f"--{name.replace('_', '-')} must be a JSON object like '{{\"key\": 1.0}}', "
                             f"got {getattr(args, name)!r}") from None
    cuda = args.cuda and torch.cuda.is_available()
    if args.backend == "nccl" and not cuda:
        raise ValueError("--backend nccl needs CUDA (GPUs and --cuda); on CPU use --backend gloo or auto")
    if args.cudagraphs and not cuda:
        raise ValueError("--cudagraphs needs CUDA (a GPU and --cuda); on CPU use --compile or neither")
    check_env_id(args.env_id)


def init_distributed(args: Args, create: bool) -> tuple[torch.device, str]:
    """Pick this rank's device; with create=True join torchrun's process group (env:// rendezvous) or, without
    torchrun, make a world of one. Returns (device, backend)."""
    cuda = args.cuda and torch.cuda.is_available()
    backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
    device, local_rank = torch.device("cpu"), int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        if local_rank >= torch.cuda.device_count():
            fail(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) here: one GPU per rank, "
                 "so lower torchrun's --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed/timed-out NCCL op aborts the rank
    if not create:
        return device, dist.get_backend()
    timeout = timedelta(seconds=args.dist_timeout_s)
    device_id = device if backend == "nccl" else None
    if "MASTER_ADDR" in os.environ:  # launched by torchrun (or another launcher that sets the env:// variables)
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                device_id=device_id)
    if backend == "gloo" and dist.get_world_size() > 1:
        dist.monitored_barrier(timeout=timeout)  # names the rank that never arrived
    return device, backend


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
    """Gaussian actor with a state-independent log-std, a separate critic, and the obs normalizer."""

    def __init__(self, obs_dim: int, act_dim: int, args: Args):
        super().__init__()
        self.norm_obs, self.clip_obs = args.norm_obs, args.clip_obs
        self.obs_rms = RunningMeanStd((obs_dim,))
        self.critic = mlp(obs_dim, args.hidden_sizes, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, args.hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.init_logstd))

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.norm_obs:
            return obs
        obs = (obs - self.obs_rms.mean) / (self.obs_rms.var + 1e-8).sqrt()
        return obs.clamp(-self.clip_obs, self.clip_obs).float()

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.normalize(obs)).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        mean = self.actor_mean(self.normalize(obs))
        # validate_args=False: the argument check would cost a host sync on every call
        return torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp(), validate_args=False)


def policy_step(agent: Agent, obs: torch.Tensor) -> TensorDict:
    """Sample a raw (unclipped) Gaussian action; return it with its log-prob and V(obs)."""
    dist = agent.dist(obs)
    action = dist.sample()
    return TensorDict(action=action, logprob=dist.log_prob(action).sum(-1), value=agent.get_value(obs),
                      batch_size=obs.shape[:1])


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
    terminated: torch.Tensor, dones: torch.Tensor, gamma: float, gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a [T, N] rollout (see ppo_continuous.py): terminated steps do not
    bootstrap, truncated ones bootstrap from V(final_obs) (in next_values); `dones` cuts the recursion."""
    not_done = (~dones).float()
    deltas = rewards + gamma * next_values * (~terminated).float() - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values


def ppo_loss(agent: Agent, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """Clipped-surrogate PPO loss on one minibatch; returns (loss, detached statistics)."""
    dist = agent.dist(mb["obs"])
    newlogprob = dist.log_prob(mb["action"]).sum(-1)
    entropy = dist.entropy().sum(-1).mean()
    newvalue = agent.get_value(mb["obs"])
    logratio = newlogprob - mb["logprob"]
    ratio = logratio.exp()

    adv = mb["advantages"]
    if args.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
    if args.clip_vloss:
        v_clipped = mb["value"] + (newvalue - mb["value"]).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    with torch.no_grad():
        stats = TensorDict(policy_loss=pg_loss, value_loss=v_loss, entropy=entropy,
                           approx_kl=((ratio - 1) - logratio).mean(),
                           clipfrac=((ratio - 1.0).abs() > args.clip_coef).float().mean())
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


def scale_rewards(rewards: torch.Tensor, dones: torch.Tensor, trace: torch.Tensor, rms: RunningMeanStd,
                  gamma: float, clip: float, world_size: int) -> torch.Tensor:
    """Divide rewards by the running std of the discounted return, merged over all ranks (no mean shift);
    `trace` holds each of this rank's envs' discounted return so far and is updated in place."""
    traces = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        trace.mul_(gamma).add_(rewards[t])
        traces[t] = trace
        trace.mul_((~dones[t]).double())
    rms.update(traces, world_size)
    return (rewards / (rms.var + 1e-8).sqrt()).clamp(-clip, clip).float()


def check_finite(name: str, bad_step: torch.Tensor, global_step: int, steps_per_env_step: int, rank: int) -> None:
    """bad_step[n] is the first rollout step at which this rank's env n produced a non-finite value, or -1."""
    if bool((bad_step >= 0).any()):
        envs = torch.nonzero(bad_step >= 0).flatten()
        step = global_step + (int(bad_step[envs].min()) + 1) * steps_per_env_step
        fail(f"non-finite {name} from rank {rank} env(s) {envs[:8].tolist()} at global step {step}")


def check_in_sync(module: nn.Module, rank: int, when: str) -> None:
    """Fail on every rank unless all ranks hold rank 0's parameters and buffers bit for bit."""
    flat = torch.cat([t.detach().double().reshape(-1) for t in module.state_dict().values()])  # float32 -> 64 exact
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([float(not torch.equal(flat, reference))], device=flat.device)
    dist.all_reduce(differs)
    if differs.item() > 0:
        fail(f"{int(differs.item())} rank(s) hold other weights than rank 0 {when}", show=rank == 0)


@torch.no_grad()
def evaluate(agent: Agent, env, num_episodes: int, deterministic: bool, seed: int,
             video_frames: list | None = None) -> dict[str, float | None]:
    """Run eval episodes (each eval env contributes its first completed episodes) and average them.
    Sampling uses its own generator, so evaluating never changes the training run's random stream."""
    gen = torch.Generator(device=agent.actor_logstd.device).manual_seed(seed)
    n = env.num_envs
    per_env = -(-num_episodes // n)  # ceil
    obs, _ = env.reset(seed=seed)
    done_count = torch.zeros(n, dtype=torch.long, device=obs.device)
    sums, metric_sums, has_success = torch.zeros(3, device=obs.device), {}, False
    while bool((done_count < per_env).any()):
        dist = agent.dist(obs)
        action = dist.mean if deterministic else dist.mean + dist.stddev * torch.randn(
            dist.mean.shape, generator=gen, device=obs.device)
        obs, _, _, _, info = env.step(action)
        has_success = has_success or "success" in info
        if video_frames is not None and int(done_count[0]) == 0:
            video_frames.append(env.render())
        counted = (info["_episode"] & (done_count < per_env)).float()
        ep = info["episode"]
        sums += torch.stack([(ep["r"] * counted).sum(), (ep["l"] * counted).sum(), (ep["success"] * counted).sum()])
        for k, v in info.get("metrics", {}).items():
            metric_sums[k] = metric_sums.get(k, 0.0) + (v * counted).sum()
        done_count += info["_episode"].long()
    ret, length, success = (sums / (per_env * n)).tolist()
    result = {"episodic_return": ret, "episodic_length": length, "success_rate": success if has_success else None}
    result.update({k: float(v) / (per_env * n) for k, v in metric_sums.items()})
    return result


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],  # this rank's GPU
            "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}


def set_rng_state(state: dict) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])
    keys, *rest = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))


def rank_state(envs, next_obs: torch.Tensor, reward_trace: torch.Tensor) -> dict:
    """What only this rank knows (on the CPU): its envs' state, current obs, return traces and RNG streams."""
    env_state = env_state_dict(envs)  # tensors on the CPU
    return {"env_state": env_state, "next_obs": next_obs.cpu(), "reward_trace": reward_trace.cpu(), "rng": rng_state()}


def load_checkpoint(path: str, args: Args) -> dict:
    """Load with weights_only=True and refuse, in one line, a checkpoint that can't continue this run."""
    if not Path(path).is_file():
        fail(f"--{'resume' if args.resume else 'eval-checkpoint'}: no such checkpoint file {path!r}")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    def plain(v):
        return list(v) if isinstance(v, (list, tuple)) else v

    for key in ("env_id", "hidden_sizes", "norm_obs"):
        if plain(ckpt["args"].get(key)) != plain(getattr(args, key)):
            fail(f"{path} was trained with --{key.replace('_', '-')} {ckpt['args'][key]}, this run has "
                 f"{getattr(args, key)}; pass the same value")
    return ckpt


def build_env(args: Args, device: torch.device, num_envs: int, seed: int, kwargs_flag: str):
    """make_env, with a bad keyword argument reported as one line naming the flag that carried it."""
    try:
        return make_env(args.env_id, num_envs=num_envs, device=device, seed=seed,
                        vectorization=args.env_vectorization, **json.loads(getattr(args, kwargs_flag)))
    except (TypeError, ValueError) as e:
        fail(f"--{kwargs_flag.replace('_', '-')} / --env-id {args.env_id}: {e}")


def main(args: Args) -> dict:
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the process group does not exist yet
    try:
        validate(args)
    except ValueError as e:
        fail(str(e), show=rank == 0)
    checkpoint_path = args.resume or args.eval_checkpoint
    ckpt = load_checkpoint(checkpoint_path, args) if checkpoint_path and rank == 0 else None
    own_group = not dist.is_initialized()  # a caller that set up a process group itself also ends it
    try:
        device, backend = init_distributed(args, create=own_group)
        return train(args, ckpt, dist.get_rank(), dist.get_world_size(), device, backend)
    except RuntimeError as e:  # from a collective: a peer died, stalled past --dist-timeout-s, or the network failed
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        if not isinstance(e, dist.DistError) and f"torch{os.sep}distributed" not in tb.tb_frame.f_code.co_filename:
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(f"rank {rank}: lost another rank ({reason}); see that rank's output. A slow but live rank "
             f"needs a larger --dist-timeout-s (now {args.dist_timeout_s})")
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()


def train(args: Args, ckpt: dict | None, rank: int, world_size: int, device: torch.device, backend: str) -> dict:
    batch_size = args.num_envs * args.num_steps  # per rank
    minibatch_size = batch_size // args.num_minibatches  # per rank
    num_iterations = max(1, args.total_timesteps // (batch_size * world_size))
    if args.resume or args.eval_checkpoint:  # rank 0 read the file; every rank gets its content
        box = [ckpt]
        dist.broadcast_object_list(box, src=0)
        ckpt = box[0]

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # Rank r's envs get seeds seed + r*num_envs (+ i for sub-env i of a Gymnasium id): no two envs of the
    # world share a seed. Rank 0 builds the eval envs, as ppo_continuous.py does (seed + 10_000).
    eval_envs = build_env(args, device, args.num_eval_envs, args.seed + 10_000, "eval_env_kwargs") if rank == 0 \
        else None
    envs = build_env(args, device, args.num_envs, args.seed + rank * args.num_envs, "env_kwargs")
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    if ckpt is not None and (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
        fail(f"checkpoint has obs/action dims {ckpt['obs_dim']}/{ckpt['act_dim']}, env {args.env_id} has "
             f"{obs_dim}/{act_dim}", show=rank == 0)
    agent = Agent(obs_dim, act_dim, args).to(device)  # same seed on every rank: the same initial weights
    if ckpt is not None:
        agent.load_state_dict(ckpt["model"])
    check_in_sync(agent, rank, "at start")
    if rank > 0:  # rank 0's stream continues exactly as in ppo_continuous.py; the others sample their own
        random.seed(args.seed + rank)
        np.random.seed(args.seed + rank)
        torch.manual_seed(args.seed + rank)
    logger = RunLogger("ppo_ddp", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
                       output_dir=args.output_dir, track=args.track, wandb_project_name=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, total_iterations=num_iterations) if rank == 0 else None
    render_warned = False

    def run_eval(global_step: int) -> dict:  # rank 0 only
        nonlocal render_warned
        frames = [] if args.capture_video and not render_warned else None
        result = evaluate(agent, eval_envs, args.num_eval_episodes, args.eval_deterministic, args.seed + 10_000,
                          frames)
        result["global_step"] = global_step
        logger.log({f"eval/{k}": v for k, v in result.items() if k != "global_step" and v is not None}, global_step)
        if frames is not None and (not frames or frames[0] is None):
            logger.write(f"warning: {args.env_id} cannot render here; no video, training goes on")
            render_warned = True
        elif frames:
            logger.write_video(np.stack([np.asarray(f) for f in frames]), f"eval_{global_step}", global_step)
        return result

    if args.eval_checkpoint:  # evaluate a saved policy on rank 0 and exit
        if rank == 0:
            result = run_eval(ckpt["global_step"])
            logger.write(f"eval of {args.eval_checkpoint}: {result}")
            logger.write_summary(global_step=ckpt["global_step"], wall_time_s=0.0, sps=0.0, eval=result,
                                 checkpoint=args.eval_checkpoint)
            logger.close()
            return {"run_dir": str(logger.run_dir), "eval": result, "global_step": ckpt["global_step"]}
        return {"run_dir": None, "eval": None, "global_step": ckpt["global_step"]}

    params = list(agent.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5)
    reward_rms, reward_trace = RunningMeanStd().to(device), torch.zeros(args.num_envs, dtype=torch.float64,
                                                                        device=device)
    # The rollout acts through an inference copy that shares the agent's parameters (LeanRL-style).
    agent_inference = Agent(obs_dim, act_dim, args).to(device)
    from_module(agent).data.to_module(agent_inference)
    policy, value_fn = partial(policy_step, agent_inference), agent_inference.get_value
    gae, loss_fn = compute_gae, ppo_loss
    if args.compile:
        policy, value_fn = torch.compile(policy), torch.compile(value_fn)
        gae, loss_fn = torch.compile(compute_gae), torch.compile(ppo_loss)
    if args.cudagraphs:
        from tensordict.nn import CudaGraphModule
        policy, value_fn = CudaGraphModule(policy), CudaGraphModule(value_fn)

    global_step, start_iteration, best_key, resume_note = 0, 1, (-1.0, -float("inf")), ""
    next_obs, _ = envs.reset(seed=args.seed + rank * args.num_envs)
    if ckpt is not None:  # model, optimizer, normalizers and counters from rank 0; env state per rank
        optimizer.load_state_dict(ckpt["optimizer"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        global_step = ckpt["global_step"]  # iterations are counted in this run's global batches:
        start_iteration = global_step // (batch_size * world_size) + 1  # another world size keeps the schedule
        best_key = tuple(ckpt["best_key"])
        pieces = [ckpt, *ckpt.get("other_ranks", [])]  # a ppo_continuous.py checkpoint is a world of one
        if len(pieces) == world_size and pieces[rank]["next_obs"].shape[0] == args.num_envs:
            piece = pieces[rank]
            reward_trace.copy_(piece["reward_trace"])
            if piece.get("env_state") is not None:
                load_env_state_dict(envs, piece["env_state"])
                next_obs = piece["next_obs"].to(device)
            set_rng_state(piece["rng"])
        else:
            resume_note = (f" (checkpoint of {len(pieces)} rank(s) x {pieces[0]['next_obs'].shape[0]} envs: "
                           "envs reset freshly)")
    if rank == 0:
        logger.write(f"device={device} backend={backend} world={world_size} envs/rank={args.num_envs} "
                     f"batch/rank={batch_size} minibatch/rank={minibatch_size} global_batch={batch_size * world_size} "
                     f"iterations={num_iterations} start={start_iteration}{resume_note} run_dir={logger.run_dir}")

    def save_checkpoint(name: str, iteration: int, pieces: list[dict]) -> str:  # rank 0 only
        state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                 "reward_rms": reward_rms.state_dict(), "iteration": iteration, "global_step": global_step,
                 "num_iterations": num_iterations, "best_key": list(best_key), "env_id": args.env_id,
                 "obs_dim": obs_dim, "act_dim": act_dim, "args": dataclasses.asdict(args), "world_size": world_size,
                 **pieces[0], "other_ranks": pieces[1:]}  # rank 0's env/RNG state at the top, as ppo_continuous.py
        return str(atomic_save(state, logger.checkpoint_dir / name))

    def gather_rank_states() -> list[dict] | None:  # a collective: every rank calls it at the same iterations
        pieces = [None] * world_size if rank == 0 else None
        dist.gather_object(rank_state(envs, next_obs, reward_trace), pieces, dst=0)
        return pieces

    storage = rollout_storage(
        args.num_steps, args.num_envs, device,
        obs=((obs_dim,), torch.float32), action=((act_dim,), torch.float32), logprob=((), torch.float32),
        value=((), torch.float32), final_value=((), torch.float32), reward=((), torch.float32),
        terminated=((), torch.bool), done=((), torch.bool),
    )
    # Ctrl-C or SIGTERM on any rank asks all ranks to stop after the current iteration. Repeats are absorbed:
    # torchrun re-sends the signal to its workers; its grace period (30 s, then SIGKILL) is the hard stop.
    stop = {"requested": False}

    def on_signal(signum, frame):
        if not stop["requested"] and rank == 0:
            logger.write("stop requested: finishing this iteration, then writing last.pt and summary.json")
        stop["requested"] = True

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    iteration, eval_result, checkpoint, skipped, consecutive_skips = start_iteration - 1, None, None, 0, 0
    next_eval, next_save, stopped = iteration + args.eval_freq, iteration + args.save_freq, False
    start_time, start_step = time.time(), global_step
    for iteration in range(start_iteration, num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1) / num_iterations)

        # ---- rollout on this rank: no host sync and no collective inside this loop ----
        ep_sums = torch.zeros(4, device=device)  # episodes, return, length, success
        bad_obs = torch.full((args.num_envs,), -1, device=device)
        bad_reward = bad_obs.clone()
        with torch.no_grad():
            for step in range(args.num_steps):
                out = policy(next_obs)
                storage["obs"][step] = next_obs
                for key in ("action", "logprob", "value"):
                    storage[key][step] = out[key]
                next_obs, reward, terminated, truncated, info = envs.step(out["action"])
                storage["final_value"][step] = value_fn(info["final_obs"])  # used only where the episode ended
                storage["reward"][step], storage["terminated"][step] = reward, terminated
                storage["done"][step] = terminated | truncated
                bad_obs = torch.where((bad_obs < 0) & ~torch.isfinite(next_obs).all(-1), step, bad_obs)
                bad_reward = torch.where((bad_reward < 0) & ~torch.isfinite(reward), step, bad_reward)
                has_success = "success" in info  # a Python bool: no host sync
                ended, ep = info["_episode"].float(), info["episode"]
                ep_sums += torch.stack([ended.sum(), (ep["r"] * ended).sum(), (ep["l"] * ended).sum(),
                                        (ep["success"] * ended).sum()])
            # one all-reduce: episode statistics summed over ranks, and whether any rank saw non-finite data
            rollout_flags = torch.cat([ep_sums, torch.stack([(bad_obs >= 0).any(), (bad_reward >= 0).any()]).float()])
            dist.all_reduce(rollout_flags)
            if rollout_flags[4:].sum() > 0:  # every rank stops; the rank(s) that saw it say where
                check_finite("observation", bad_obs, global_step, args.num_envs * world_size, rank)
                check_finite("reward", bad_reward, global_step, args.num_envs * world_size, rank)
                fail("", show=False)
            ep_sums = rollout_flags[:4]
            global_step += batch_size * world_size

            # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
            next_values = torch.cat([storage["value"][1:], value_fn(next_obs)[None]])
            next_values = torch.where(storage["done"], storage["final_value"], next_values)
            rewards = storage["reward"]
            if args.norm_reward:
                rewards = scale_rewards(rewards, storage["done"], reward_trace, reward_rms, args.gamma,
                                        args.clip_reward, world_size)
            advantages, returns = gae(rewards, storage["value"], next_values, storage["terminated"],
                                      storage["done"], args.gamma, args.gae_lambda)

        # ---- PPO update: each rank its own minibatches, gradients averaged over ranks before each step ----
        batch = storage.select("obs", "action", "logprob", "value").reshape(-1)
        batch["advantages"], batch["returns"] = advantages.reshape(-1), returns.reshape(-1)
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            epoch_kl = []
            for start in range(0, batch_size, minibatch_size):
                loss, stats = loss_fn(agent, batch[perm[start:start + minibatch_size]], args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                mean_loss = sync_gradients(params, world_size, loss)
                grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                if not bool(torch.isfinite(grad_norm) & torch.isfinite(mean_loss)):  # same verdict on all ranks
                    skipped, consecutive_skips = skipped + 1, consecutive_skips + 1
                    if consecutive_skips >= args.max_consecutive_skips:
                        fail(f"{consecutive_skips} optimizer steps in a row had a non-finite loss or gradient "
                             f"(last at global step {global_step}); lower --learning-rate or check the env",
                             show=rank == 0)
                    continue
                consecutive_skips = 0
                optimizer.step()
                epoch_kl.append(stats["approx_kl"])
            if args.target_kl is not None and epoch_kl:  # skips agree, so every rank has the same count here
                kl = torch.stack(epoch_kl).mean()
                dist.all_reduce(kl)
                if float(kl) / world_size > args.target_kl:
                    break
        if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
            agent.obs_rms.update(storage["obs"], world_size)

        # ---- one all-reduce: statistics averaged over ranks, and whether any rank was asked to stop ----
        explained_var = 1 - (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
        summed = torch.stack([*stats.values(), explained_var, torch.tensor(float(stop["requested"]), device=device)])
        dist.all_reduce(summed)
        stopped = bool(summed[-1] > 0)
        eval_due = args.eval_freq and iteration >= next_eval and iteration < num_iterations
        save_due = args.save_freq and iteration >= next_save
        pieces = gather_rank_states() if eval_due or save_due else None
        if eval_due:
            next_eval = iteration + args.eval_freq
        if save_due:
            next_save = iteration + args.save_freq
        if rank == 0:  # logging, evaluation, checkpoints: rank 0 alone
            sps = (global_step - start_step) / (time.time() - start_time)
            scalars = {f"losses/{k}": v / world_size for k, v in zip(stats.keys(), summed)}
            scalars.update({"losses/explained_variance": summed[-2] / world_size, "charts/SPS": sps,
                            "charts/learning_rate": optimizer.param_groups[0]["lr"],
                            "charts/skipped_updates": skipped})
            if float(ep_sums[0]) > 0:
                n_ep = ep_sums[0]
                scalars.update({"charts/episodic_return": ep_sums[1] / n_ep,
                                "charts/episodic_length": ep_sums[2] / n_ep})
                if has_success:  # envs without a success signal (e.g. MuJoCo locomotion) log none
                    scalars["charts/success_rate"] = ep_sums[3] / n_ep
            logger.log(scalars, global_step)
            logger.progress(global_step, SPS=sps, ret=logger.latest.get("charts/episodic_return"),
                            succ=logger.latest.get("charts/success_rate"))
            if eval_due:
                eval_result = run_eval(global_step)
                key = (eval_result["success_rate"] or 0.0, eval_result["episodic_return"])
                if key > best_key:
                    best_key = key
                    save_checkpoint("best.pt", iteration, pieces)
            if save_due:
                checkpoint = save_checkpoint("last.pt", iteration, pieces)
                save_checkpoint(f"iter_{iteration:06d}.pt", iteration, pieces)
        if stopped:
            break

    pieces = gather_rank_states()
    check_in_sync(agent, rank, "at the end")
    for s, handler in handlers.items():
        signal.signal(s, handler)
    envs.close()
    if rank == 0:
        checkpoint = save_checkpoint("last.pt", iteration, pieces)
        if not stopped:
            eval_result = run_eval(global_step)
            if (eval_result["success_rate"] or 0.0, eval_result["episodic_return"]) > best_key:
                save_checkpoint("best.pt", iteration, pieces)
        wall = time.time() - start_time
        logger.write_summary(global_step=global_step, wall_time_s=wall, world_size=world_size,
                             sps=(global_step - start_step) / max(wall, 1e-9), eval=eval_result, checkpoint=checkpoint)
        logger.write(f"done: global_step={global_step} wall_time={wall:.1f}s eval={eval_result}")
        logger.close()
        eval_envs.close()
    if stopped:
        sys.exit(130)
    return {"run_dir": str(logger.run_dir) if rank == 0 else None, "eval": eval_result, "global_step": global_step,
            "model": agent.state_dict()}


if __name__ == "__main__":
    main(tyro.cli(Args))
