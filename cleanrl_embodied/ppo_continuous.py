"""PPO for continuous-action embodied tasks, in one file.

    uv run python cleanrl_embodied/ppo_continuous.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_continuous.py --env-id Pendulum-v1 --num-envs 16 --num-steps 128 \
        --gamma 0.99 --gae-lambda 0.95 --num-minibatches 32 --update-epochs 10 --learning-rate 3e-4 \
        --norm-obs --norm-reward --total-timesteps 500000

Read top to bottom: `Args`; the `Agent` (with its observation normalizer); three pure functions
(`policy_step`, `compute_gae`, `ppo_loss`) that torch.compile can wrap unchanged; evaluation and
checkpoints; then `main` with the training loop. Environments come from `cleanrl_embodied.shared`:
torch tensors on the device, Gymnasium's SAME_STEP autoreset with `info["final_obs"]`, on-device
episode statistics. Copy this file and edit it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict, from_module

from cleanrl_embodied.shared import RunLogger, atomic_save, check_env_id, make_env, rollout_storage
from cleanrl_embodied.shared.envs import env_state_dict, load_env_state_dict


@dataclass
class Args:
    exp_name: str = "ppo_continuous"
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
    """record the first eval env's episode as mp4 at every evaluation (run_dir/videos/)"""
    output_dir: str = "runs"
    """root folder of run directories"""

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
    """number of parallel training environments"""
    num_eval_envs: int = 64
    """number of parallel evaluation environments"""
    num_eval_episodes: int = 64
    """episodes per evaluation (each eval env contributes its first completed episodes)"""
    eval_freq: int = 25
    """evaluate every this many iterations (0: only the final evaluation)"""
    eval_deterministic: bool = True
    """evaluate with the mean action (``--no-eval-deterministic`` samples)"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint (with video if --capture-video) and exit without training"""
    save_freq: int = 25
    """write checkpoints/last.pt (and a numbered copy) every this many iterations; always at the end"""
    resume: str | None = None
    """continue training from this checkpoint (counters, optimizer, schedule, RNG and env state)"""

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
    norm_obs: bool = False
    """normalize observations with running mean/std (updated from rollouts only, frozen at eval)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip, clip]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip, clip]"""
    max_consecutive_skips: int = 10
    """stop after this many optimizer steps in a row skipped for a non-finite loss or gradient"""
    compile: bool = False
    """torch.compile the policy step, GAE and the loss"""
    cudagraphs: bool = False
    """capture the policy step in a CUDA graph (CUDA only)"""
    policy_latency_ms: float = 0.0
    """add this delay to every rollout inference call, to stand in for a large model (the sync baseline of
    benchmarks/async_speed.py; ppo_async.py overlaps it with the update)"""


def fail(msg: str) -> None:
    raise SystemExit(f"error: {msg}")


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    for name in ("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs",
                 "num_eval_envs", "num_eval_episodes", "max_consecutive_skips"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    for name in ("eval_freq", "save_freq"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be >= 0 (0 disables), got {getattr(args, name)}")
    batch_size = args.num_envs * args.num_steps
    if args.num_minibatches > batch_size or batch_size % args.num_minibatches:
        fail(f"--num-minibatches must divide the batch size num_envs*num_steps={batch_size} "
             f"(minibatch no larger than the batch), got {args.num_minibatches}")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma must be in (0, 1], got {args.gamma}")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    if args.learning_rate <= 0 or args.clip_obs <= 0 or args.clip_reward <= 0:
        fail("--learning-rate, --clip-obs and --clip-reward must be > 0")
    if args.policy_latency_ms < 0:
        fail(f"--policy-latency-ms must be >= 0, got {args.policy_latency_ms}")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        fail(f"--hidden-sizes must be positive integers, got {args.hidden_sizes}")
    for name in ("env_kwargs", "eval_env_kwargs"):
        try:
            assert isinstance(json.loads(getattr(args, name)), dict)
        except (json.JSONDecodeError, AssertionError):
            fail(f"--{name.replace('_', '-')} must be a JSON object like '{{\"key\": 1.0}}', "
                 f"got {getattr(args, name)!r}")
    for name in ("resume", "eval_checkpoint"):
        if getattr(args, name) and not Path(getattr(args, name)).is_file():
            fail(f"--{name.replace('_', '-')}: no such checkpoint file {getattr(args, name)!r}")
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs CUDA (a GPU and --cuda); on CPU use --compile or neither")
    try:
        check_env_id(args.env_id)
    except ValueError as e:
        fail(str(e))


class RunningMeanStd(nn.Module):
    """Running mean/variance in float64, merged batch by batch with the parallel-variance formula."""

    def __init__(self, shape: tuple[int, ...] = ()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
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
    """Generalized advantage estimation over a [T, N] rollout.

    next_values[t] is V of the state reached by action t in the *same* episode: V(obs[t+1]) while the
    episode goes on, V(final_obs) where it ended at t. Terminated steps do not bootstrap (a true end
    has no future); truncated ones do, from V(final_obs). `dones` = terminated | truncated cuts the
    advantage recursion at episode ends. Returns (advantages, returns).
    """
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


def scale_rewards(rewards: torch.Tensor, dones: torch.Tensor, trace: torch.Tensor, rms: RunningMeanStd,
                  gamma: float, clip: float) -> torch.Tensor:
    """Divide rewards by the running std of the discounted return (no mean shift); `trace` holds each
    env's discounted return so far and is updated in place (it restarts after episode ends)."""
    traces = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        trace.mul_(gamma).add_(rewards[t])
        traces[t] = trace
        trace.mul_((~dones[t]).double())
    rms.update(traces)
    return (rewards / (rms.var + 1e-8).sqrt()).clamp(-clip, clip).float()


def check_finite(name: str, bad_step: torch.Tensor, global_step: int, num_envs: int) -> None:
    """bad_step[n] is the first rollout step at which env n produced a non-finite value, or -1."""
    if bool((bad_step >= 0).any()):
        envs = torch.nonzero(bad_step >= 0).flatten()
        first = int(bad_step[envs].min())
        fail(f"non-finite {name} from env(s) {envs[:8].tolist()} at global step {global_step + (first + 1) * num_envs}")


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
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]]}


def set_rng_state(state: dict) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    keys, *rest = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))


def load_checkpoint(path: str, args: Args) -> dict:
    """Load with weights_only=True and refuse, in one line, a checkpoint that can't serve this run
    (a resume must also keep the env layout, whose state the checkpoint carries)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt_args = ckpt["args"]
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user mistake
        fail(f"{path} is not a readable ppo_continuous checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})")
    keys = ("env_id", "hidden_sizes", "norm_obs") + (("num_envs", "num_steps") if args.resume else ())
    for key in keys:
        theirs, ours = ckpt_args.get(key), getattr(args, key)
        if (list(theirs) if isinstance(theirs, (list, tuple)) else theirs) != (
                list(ours) if isinstance(ours, tuple) else ours):
            fail(f"{path} was trained with --{key.replace('_', '-')} {theirs}, this run has {ours}; "
                 "pass the same value")
    return ckpt


def build_env(args: Args, device: torch.device, num_envs: int, seed: int, kwargs_flag: str):
    """make_env, with a bad keyword argument reported as one line naming the flag that carried it."""
    try:
        return make_env(args.env_id, num_envs=num_envs, device=device, seed=seed,
                        vectorization=args.env_vectorization, **json.loads(getattr(args, kwargs_flag)))
    except (TypeError, ValueError) as e:
        fail(f"--{kwargs_flag.replace('_', '-')} / --env-id {args.env_id}: {e}")


def main(args: Args) -> dict:
    validate(args)
    ckpt = load_checkpoint(args.resume or args.eval_checkpoint, args) if (args.resume or args.eval_checkpoint) else None
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // batch_size)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    eval_envs = build_env(args, device, args.num_eval_envs, args.seed + 10_000, "eval_env_kwargs")
    obs_dim = eval_envs.single_observation_space.shape[0]
    act_dim = eval_envs.single_action_space.shape[0]
    if ckpt is not None and (ckpt["obs_dim"], ckpt["act_dim"]) != (obs_dim, act_dim):
        fail(f"checkpoint has obs/action dims {ckpt['obs_dim']}/{ckpt['act_dim']}, env {args.env_id} has "
             f"{obs_dim}/{act_dim}")
    agent = Agent(obs_dim, act_dim, args).to(device)
    if ckpt is not None:
        agent.load_state_dict(ckpt["model"])
    logger = RunLogger("ppo_continuous", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
                       output_dir=args.output_dir, track=args.track, wandb_project_name=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, total_iterations=num_iterations)
    render_warned = False

    def run_eval(global_step: int) -> dict:
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

    if args.eval_checkpoint:  # evaluate a saved policy and exit
        result = run_eval(ckpt["global_step"])
        logger.write(f"eval of {args.eval_checkpoint}: {result}")
        logger.write_summary(global_step=ckpt["global_step"], wall_time_s=0.0, sps=0.0, eval=result,
                             checkpoint=args.eval_checkpoint)
        logger.close()
        return {"run_dir": str(logger.run_dir), "eval": result, "global_step": ckpt["global_step"]}

    envs = build_env(args, device, args.num_envs, args.seed, "env_kwargs")
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    reward_rms, reward_trace = RunningMeanStd().to(device), torch.zeros(args.num_envs, dtype=torch.float64,
                                                                        device=device)
    # The rollout acts through an inference copy that shares the agent's parameters (LeanRL-style):
    # compiled or graph-captured code then never sees the autograd-tracking module.
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

    global_step, start_iteration, best_key = 0, 1, (-1.0, -float("inf"))
    next_obs, _ = envs.reset(seed=args.seed)
    if ckpt is not None:  # resume: every piece of state the next iteration depends on
        optimizer.load_state_dict(ckpt["optimizer"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        reward_trace.copy_(ckpt["reward_trace"])
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        best_key = tuple(ckpt["best_key"])
        if ckpt.get("env_state") is not None:
            load_env_state_dict(envs, ckpt["env_state"])
            next_obs = ckpt["next_obs"].to(device)
        set_rng_state(ckpt["rng"])
    logger.write(f"device={device} envs={args.num_envs} batch={batch_size} minibatch={minibatch_size} "
                 f"iterations={num_iterations} start={start_iteration} run_dir={logger.run_dir}")

    def save_checkpoint(name: str, iteration: int) -> str:
        env_state = env_state_dict(envs)
        state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                 "reward_rms": reward_rms.state_dict(), "reward_trace": reward_trace, "iteration": iteration,
                 "global_step": global_step, "num_iterations": num_iterations, "best_key": list(best_key),
                 "env_id": args.env_id, "obs_dim": obs_dim, "act_dim": act_dim, "args": dataclasses.asdict(args),
                 "rng": rng_state(), "env_state": env_state, "next_obs": next_obs}
        return str(atomic_save(state, logger.checkpoint_dir / name))

    storage = rollout_storage(
        args.num_steps, args.num_envs, device,
        obs=((obs_dim,), torch.float32), action=((act_dim,), torch.float32), logprob=((), torch.float32),
        value=((), torch.float32), final_value=((), torch.float32), reward=((), torch.float32),
        terminated=((), torch.bool), done=((), torch.bool),
    )
    # Ctrl-C asks the loop to stop after the current iteration (a second Ctrl-C stops at once).
    stop = {"requested": False}

    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        logger.write("Ctrl-C: finishing this iteration, then writing last.pt and summary.json")

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    iteration, eval_result, checkpoint, skipped, consecutive_skips = start_iteration - 1, None, None, 0, 0
    next_eval, next_save = iteration + args.eval_freq, iteration + args.save_freq
    start_time, start_step = time.time(), global_step
    for iteration in range(start_iteration, num_iterations + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1) / num_iterations)

        # ---- rollout: no host sync inside this loop ----
        ep_sums = torch.zeros(4, device=device)  # episodes, return, length, success
        bad_obs = torch.full((args.num_envs,), -1, device=device)
        bad_reward = bad_obs.clone()
        with torch.no_grad():
            for step in range(args.num_steps):
                out = policy(next_obs)
                if args.policy_latency_ms:
                    time.sleep(args.policy_latency_ms / 1000)
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
            check_finite("observation", bad_obs, global_step, args.num_envs)
            check_finite("reward", bad_reward, global_step, args.num_envs)
            global_step += batch_size

            # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
            next_values = torch.cat([storage["value"][1:], value_fn(next_obs)[None]])
            next_values = torch.where(storage["done"], storage["final_value"], next_values)
            rewards = storage["reward"]
            if args.norm_reward:
                rewards = scale_rewards(rewards, storage["done"], reward_trace, reward_rms, args.gamma,
                                        args.clip_reward)
            advantages, returns = gae(rewards, storage["value"], next_values, storage["terminated"],
                                      storage["done"], args.gamma, args.gae_lambda)

        # ---- PPO update ----
        batch = storage.select("obs", "action", "logprob", "value").reshape(-1)
        batch["advantages"], batch["returns"] = advantages.reshape(-1), returns.reshape(-1)
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            epoch_kl = []
            for start in range(0, batch_size, minibatch_size):
                loss, stats = loss_fn(agent, batch[perm[start:start + minibatch_size]], args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                if not bool(torch.isfinite(grad_norm) & torch.isfinite(loss)):  # skip, count, maybe stop
                    skipped, consecutive_skips = skipped + 1, consecutive_skips + 1
                    if consecutive_skips >= args.max_consecutive_skips:
                        fail(f"{consecutive_skips} optimizer steps in a row had a non-finite loss or gradient "
                             f"(last at global step {global_step}); lower --learning-rate or check the env")
                    continue
                consecutive_skips = 0
                optimizer.step()
                epoch_kl.append(stats["approx_kl"])
            if args.target_kl is not None and epoch_kl and float(torch.stack(epoch_kl).mean()) > args.target_kl:
                break
        if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
            agent.obs_rms.update(storage["obs"])

        # ---- logging: one host sync per iteration ----
        explained_var = 1 - (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
        sps = (global_step - start_step) / (time.time() - start_time)
        scalars = {f"losses/{k}": v for k, v in stats.items()}
        scalars.update({"losses/explained_variance": explained_var, "charts/SPS": sps,
                        "charts/learning_rate": optimizer.param_groups[0]["lr"], "charts/skipped_updates": skipped})
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
            eval_result = run_eval(global_step)
            key = (eval_result["success_rate"] or 0.0, eval_result["episodic_return"])
            if key > best_key:
                best_key = key
                save_checkpoint("best.pt", iteration)
        if args.save_freq and iteration >= next_save:
            next_save = iteration + args.save_freq
            checkpoint = save_checkpoint("last.pt", iteration)
            save_checkpoint(f"iter_{iteration:06d}.pt", iteration)
        if stop["requested"]:
            break

    checkpoint = save_checkpoint("last.pt", iteration)
    if not stop["requested"]:
        eval_result = run_eval(global_step)
        if (eval_result["success_rate"] or 0.0, eval_result["episodic_return"]) > best_key:
            save_checkpoint("best.pt", iteration)
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
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step}


if __name__ == "__main__":
    main(tyro.cli(Args))
