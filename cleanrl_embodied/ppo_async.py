"""Asynchronous PPO: a collector thread steps the envs while the learner updates, in one file.

    uv run python cleanrl_embodied/ppo_async.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_async.py --policy-latency-ms 100 --hidden-sizes 512 512 512

For policies whose inference is slow (vision-language-action models at 100 ms a step and more), stepping
the envs and updating the network one after the other leaves each side idle half the time. Here a
`Collector` thread keeps collecting rollout j+1 while the learner (the main thread) trains on rollout j.
What keeps it correct:

- The collector acts with an *inference copy* of the agent (and of its observation normalizer). It is
  refreshed by `load_state_dict` from a snapshot the learner published, only between rollouts, so it never
  changes during a rollout and the learner never writes to a module the collector reads.
- Rollout j is collected with exactly the snapshot the learner published after consuming j - K rollouts
  (K = --max-staleness); the collector waits rather than run further ahead. Every transition carries the
  policy version that produced it; the learner drops (and counts) a rollout older than K versions, and its
  PPO ratio is taken against the behaviour log-prob stored with the data, so K-version-old data stays a
  correct importance-sampled PPO step. Values are recomputed by the learner's current critic.
- All counters (global_step, episodes, versions) change in the learner only; logging, evaluation and
  checkpoints happen there, with the collector paused at a rollout boundary. Ctrl-C or an exception on
  either side stops both threads, writes last.pt and summary.json, and leaves no thread running.
- Each side has its own random stream (the collector a torch.Generator, the learner the global one), so a
  run is reproducible: on CPU the same command gives the same result bit for bit, and --max-staleness 0
  is synchronous PPO with a collector thread.

On CUDA both threads enqueue work on the device's default stream, so kernels run in the order they were
issued and tensors pass between the threads without events; what overlaps is host work (env stepping,
Python, inference latency). Read top to bottom: `Args`, the `Agent`, the pure functions (`policy_step`,
`compute_gae`, `ppo_loss`), evaluation and checkpoints, the `Collector`, then `main` with the learner loop.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import random
import signal
import sys
import threading
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
from cleanrl_embodied.shared.envs import env_state_dict, load_env_state_dict


@dataclass
class Args:
    exp_name: str = "ppo_async"
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
    """torch.compile GAE and the loss on the learner side (the collector's policy step stays eager)"""

    # Asynchrony
    max_staleness: int = 1
    """rollout j is collected by the policy of j - K updates ago and no update uses older data; the collector
    waits rather than run further ahead (0: synchronous PPO, 1: collect the next rollout while updating)"""
    policy_latency_ms: float = 0.0
    """add this delay to every inference call of the collector, to stand in for a large model (benchmarks,
    tests); --hidden-sizes makes a genuinely larger network"""


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
    if args.max_staleness < 0 or args.policy_latency_ms < 0:
        fail(f"--max-staleness and --policy-latency-ms must be >= 0, got {args.max_staleness} and "
             f"{args.policy_latency_ms}")
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


def policy_step(agent: Agent, obs: torch.Tensor, generator: torch.Generator) -> TensorDict:
    """Sample a raw (unclipped) Gaussian action from `generator`; return it with its behaviour log-prob.
    No value here: the learner recomputes values with its current critic."""
    dist = agent.dist(obs)
    action = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator, device=obs.device)
    return TensorDict(action=action, logprob=dist.log_prob(action).sum(-1), batch_size=obs.shape[:1])


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
        fail(f"{path} is not a readable ppo_async checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})")
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



class Collector:
    """Steps the training envs in a background thread with an inference copy of the agent.

    Rollout j (counted over the whole run) waits until the learner has consumed j - K rollouts and is then
    collected, start to end, with the snapshot published at exactly that point; the learner's `publish`
    after every rollout it consumes is the only way the inference copy changes. Whole rollouts go to the
    learner through a queue that the wait keeps to at most K + 1 entries. Everything else the collector
    owns (envs, next_obs, its generator, `next_index`) is read by the learner only while it is paused.
    """

    def __init__(self, envs, agent: Agent, args: Args, total_rollouts: int, next_obs: torch.Tensor,
                 next_index: int, generator: torch.Generator, pending: list[dict]):
        self.envs, self.agent, self.args, self.total_rollouts = envs, agent, args, total_rollouts
        self.next_obs, self.next_index, self.generator = next_obs, next_index, generator
        # pending: rollouts a resumed run had collected but not learned from (a resume may lower K)
        self.rollouts: queue.Queue = queue.Queue(maxsize=max(args.max_staleness + 1, len(pending)))
        for item in pending:
            self.rollouts.put_nowait(item)
        self.cond = threading.Condition()
        self.snapshots: dict[int, tuple[int, dict]] = {}  # rollouts consumed -> (policy version, state_dict)
        self.consumed = 0
        self.pause_requested = self.paused = self.stop_requested = self.finished = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="ppo-async-collector", daemon=True)

    # ---- learner side ----
    def publish(self, consumed: int, version: int, agent: Agent) -> None:
        """Hand the learner's agent after `consumed` rollouts to the collector (a detached copy)."""
        snapshot = (version, {k: v.detach().clone() for k, v in agent.state_dict().items()})
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

    def resume(self) -> None:
        with self.cond:
            self.pause_requested = False
            self.cond.notify_all()

    def stop(self) -> None:
        """End the thread (abandoning a rollout in progress) and wait for it."""
        with self.cond:
            self.stop_requested = True
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=60)
        if self.thread.is_alive():
            raise RuntimeError("the ppo_async collector thread did not stop within 60 s")

    def state(self) -> dict:
        """What a resume needs from this side; call only while paused."""
        return {"next_index": self.next_index, "next_obs": self.next_obs, "generator": self.generator.get_state(),
                "env_state": env_state_dict(self.envs),
                "snapshots": dict(self.snapshots), "pending": [
                    {**item, "data": item["data"].to_dict()} for item in list(self.rollouts.queue)]}

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
                    self.agent.load_state_dict(state)
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
        obs_dim, act_dim = self.next_obs.shape[-1], self.envs.single_action_space.shape[0]
        data = rollout_storage(
            args.num_steps, args.num_envs, device,
            obs=((obs_dim,), torch.float32), action=((act_dim,), torch.float32), logprob=((), torch.float32),
            final_obs=((obs_dim,), torch.float32), reward=((), torch.float32), terminated=((), torch.bool),
            done=((), torch.bool), version=((), torch.long),
        )
        ep_sums = torch.zeros(4, device=device)  # episodes, return, length, success
        bad_obs = torch.full((args.num_envs,), -1, device=device)
        bad_reward, has_success, start = bad_obs.clone(), False, time.time()
        for step in range(args.num_steps):
            if self.stop_requested:
                return None
            out = policy_step(self.agent, self.next_obs, self.generator)
            if args.policy_latency_ms:
                time.sleep(args.policy_latency_ms / 1000)
            data["obs"][step] = self.next_obs
            data["action"][step], data["logprob"][step] = out["action"], out["logprob"]
            self.next_obs, reward, terminated, truncated, info = self.envs.step(out["action"])
            data["final_obs"][step] = info["final_obs"]  # used only where the episode ended
            data["reward"][step], data["terminated"][step] = reward, terminated
            data["done"][step] = terminated | truncated
            bad_obs = torch.where((bad_obs < 0) & ~torch.isfinite(self.next_obs).all(-1), step, bad_obs)
            bad_reward = torch.where((bad_reward < 0) & ~torch.isfinite(reward), step, bad_reward)
            has_success = has_success or "success" in info
            ended, ep = info["_episode"].float(), info["episode"]
            ep_sums += torch.stack([ended.sum(), (ep["r"] * ended).sum(), (ep["l"] * ended).sum(),
                                    (ep["success"] * ended).sum()])
        data["version"].fill_(version)
        return {"index": self.next_index, "version": version, "data": data, "next_obs": self.next_obs,
                "ep_sums": ep_sums, "bad_obs": bad_obs, "bad_reward": bad_reward, "has_success": has_success,
                "start": start, "end": time.time()}


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
    logger = RunLogger("ppo_async", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
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
    gae, loss_fn = (torch.compile(compute_gae), torch.compile(ppo_loss)) if args.compile else (compute_gae, ppo_loss)
    inference_agent = Agent(obs_dim, act_dim, args).to(device)  # the collector's copy (built before the RNG
    # state of a resume is restored: building draws from the global generator)

    # Learner counters, changed in this thread only: rollouts consumed (= iterations), policy version
    # (= updates made), env steps, rollouts dropped for staleness.
    consumed, version, global_step, dropped, best_key = 0, 0, 0, 0, (-1.0, -float("inf"))
    generator = torch.Generator(device=device).manual_seed(args.seed + 1)  # the collector's random stream
    next_obs, _ = envs.reset(seed=args.seed)
    cstate = None
    if ckpt is not None:  # resume: every piece of state the next iteration depends on
        optimizer.load_state_dict(ckpt["optimizer"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        reward_trace.copy_(ckpt["reward_trace"])
        consumed, version, dropped = ckpt["iteration"], ckpt["version"], ckpt["dropped"]
        global_step = ckpt["global_step"]
        best_key = tuple(ckpt["best_key"])
        set_rng_state(ckpt["rng"])
        cstate = ckpt.get("collector")
        if cstate is not None:  # the collector stopped at a rollout boundary: continue from exactly there
            if cstate["env_state"] is not None:
                load_env_state_dict(envs, cstate["env_state"])
            next_obs = cstate["next_obs"].to(device)
            generator.set_state(cstate["generator"])
    pending = []  # rollouts a resumed run had collected but not learned from
    for item in cstate["pending"] if cstate is not None else []:
        item = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in item.items()}
        pending.append({**item, "data": TensorDict(item["data"], batch_size=[args.num_steps, args.num_envs],
                                                   device=device)})
    collector = Collector(envs, inference_agent, args, num_iterations, next_obs,
                          consumed if cstate is None else cstate["next_index"], generator, pending)
    if cstate is not None:
        collector.snapshots = {int(c): (v, s) for c, (v, s) in cstate["snapshots"].items()}
    collector.publish(consumed, version, agent)
    logger.write(f"device={device} envs={args.num_envs} batch={batch_size} minibatch={minibatch_size} "
                 f"iterations={num_iterations} start={consumed + 1} max_staleness={args.max_staleness} "
                 f"policy_latency_ms={args.policy_latency_ms} run_dir={logger.run_dir}")

    def save_checkpoint(name: str, with_collector: bool = True) -> str:
        state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(),
                 "reward_rms": reward_rms.state_dict(), "reward_trace": reward_trace,
                 "iteration": consumed, "version": version, "global_step": global_step, "dropped": dropped,
                 "num_iterations": num_iterations, "best_key": list(best_key), "env_id": args.env_id,
                 "obs_dim": obs_dim, "act_dim": act_dim, "args": dataclasses.asdict(args), "rng": rng_state(),
                 "collector": collector.state() if with_collector else None}
        return str(atomic_save(state, logger.checkpoint_dir / name))

    # Ctrl-C asks the loop to stop after the current iteration (a second Ctrl-C stops at once).
    stop = {"requested": False}

    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        logger.write("Ctrl-C: finishing this iteration, then writing last.pt and summary.json")

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    eval_result, checkpoint, skipped, consecutive_skips, stats = None, None, 0, 0, None
    next_eval, next_save = consumed + args.eval_freq, consumed + args.save_freq
    start_time, start_step, timeline = time.time(), global_step, []
    ep_sums = torch.zeros(4, device=device)
    collector.thread.start()
    try:
        while consumed < num_iterations:
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - consumed / num_iterations)
            wait_start = time.time()
            item = collector.get()
            wait_s, update_start = time.time() - wait_start, time.time()
            assert item["index"] == consumed, (item["index"], consumed)  # in order, none lost
            consumed, global_step = consumed + 1, global_step + batch_size
            data, used_version, staleness = item["data"], version, version - item["version"]
            check_finite("observation", item["bad_obs"], global_step - batch_size, args.num_envs)
            check_finite("reward", item["bad_reward"], global_step - batch_size, args.num_envs)
            ep_sums += item["ep_sums"]
            with torch.no_grad():  # the reward scale follows every rollout in order, dropped ones too
                rewards = data["reward"]
                if args.norm_reward:
                    rewards = scale_rewards(rewards, data["done"], reward_trace, reward_rms, args.gamma,
                                            args.clip_reward)
            if staleness > args.max_staleness:  # cannot happen while the collector waits as it should
                dropped += 1
            else:
                # ---- advantages with the current critic: V(next obs) in an episode, V(final_obs) at its end
                with torch.no_grad():
                    values = agent.get_value(data["obs"])
                    next_values = torch.cat([values[1:], agent.get_value(item["next_obs"])[None]])
                    next_values = torch.where(data["done"], agent.get_value(data["final_obs"]), next_values)
                    advantages, returns = gae(rewards, values, next_values, data["terminated"], data["done"],
                                              args.gamma, args.gae_lambda)

                # ---- PPO update; the ratio is taken against the behaviour log-prob stored with the data
                batch = data.select("obs", "action", "logprob").reshape(-1)
                batch["value"], batch["advantages"], batch["returns"] = (
                    values.reshape(-1), advantages.reshape(-1), returns.reshape(-1))
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
                                fail(f"{consecutive_skips} optimizer steps in a row had a non-finite loss or "
                                     f"gradient (last at global step {global_step}); lower --learning-rate")
                            continue
                        consecutive_skips = 0
                        optimizer.step()
                        epoch_kl.append(stats["approx_kl"])
                    if (args.target_kl is not None and epoch_kl
                            and float(torch.stack(epoch_kl).mean()) > args.target_kl):
                        break
                if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
                    agent.obs_rms.update(data["obs"])
                version += 1
            update_end = time.time()  # before publishing, so a waiting collector starts after it
            collector.publish(consumed, version, agent)
            timeline.append({"index": item["index"], "behaviour_version": item["version"],
                             "learner_version": used_version, "dropped": staleness > args.max_staleness,
                             "collect": (item["start"], item["end"]), "update": (update_start, update_end)})

            # ---- logging: one host sync per iteration ----
            sps = (global_step - start_step) / (time.time() - start_time)
            scalars = {"charts/SPS": sps, "charts/learning_rate": optimizer.param_groups[0]["lr"],
                       "charts/skipped_updates": skipped, "charts/policy_staleness": staleness,
                       "charts/dropped_rollouts": dropped, "charts/learner_wait_s": wait_s}
            if stats is not None:
                scalars.update({f"losses/{k}": v for k, v in stats.items()})
                scalars["losses/explained_variance"] = 1 - (batch["returns"] - batch["value"]).var() / (
                    batch["returns"].var().clamp_min(1e-8))
            if float(ep_sums[0]) > 0:
                n_ep = ep_sums[0]
                scalars.update({"charts/episodic_return": ep_sums[1] / n_ep,
                                "charts/episodic_length": ep_sums[2] / n_ep})
                if item["has_success"]:
                    scalars["charts/success_rate"] = ep_sums[3] / n_ep
                ep_sums.zero_()
            logger.log(scalars, global_step)
            logger.progress(global_step, SPS=sps, ret=logger.latest.get("charts/episodic_return"),
                            succ=logger.latest.get("charts/success_rate"))

            # evaluation and checkpoints see a paused collector (thresholds on the iteration counter)
            do_eval = args.eval_freq and consumed >= next_eval and consumed < num_iterations
            do_save = args.save_freq and consumed >= next_save
            if do_eval or do_save:
                collector.pause()
                if do_eval:
                    next_eval = consumed + args.eval_freq
                    eval_result = run_eval(global_step)
                    key = (eval_result["success_rate"] or 0.0, eval_result["episodic_return"])
                    if key > best_key:
                        best_key = key
                        save_checkpoint("best.pt")
                if do_save:
                    next_save = consumed + args.save_freq
                    checkpoint = save_checkpoint("last.pt")
                    save_checkpoint(f"iter_{consumed:06d}.pt")
                collector.resume()
            if stop["requested"]:
                break
        collector.pause()  # at a rollout boundary: last.pt can hold the collector's state
        checkpoint = save_checkpoint("last.pt")
    except BaseException:  # an error on either side, or a second Ctrl-C: stop both, keep what can be kept
        signal.signal(signal.SIGINT, previous_handler)
        collector.stop()
        wall = time.time() - start_time
        checkpoint = save_checkpoint("last.pt", with_collector=False)  # envs restart on resume
        logger.write_summary(global_step=global_step, wall_time_s=wall, eval=eval_result, checkpoint=checkpoint,
                             sps=(global_step - start_step) / max(wall, 1e-9))
        logger.close(exit_code=1)
        envs.close()
        eval_envs.close()
        raise
    collector.stop()
    signal.signal(signal.SIGINT, previous_handler)
    if not stop["requested"]:
        eval_result = run_eval(global_step)
        if (eval_result["success_rate"] or 0.0, eval_result["episodic_return"]) > best_key:
            save_checkpoint("best.pt")
    wall = time.time() - start_time
    logger.write_summary(global_step=global_step, wall_time_s=wall, sps=(global_step - start_step) / max(wall, 1e-9),
                         eval=eval_result, checkpoint=checkpoint, dropped_rollouts=dropped)
    logger.write(f"done: global_step={global_step} wall_time={wall:.1f}s dropped={dropped} eval={eval_result}")
    logger.close()
    envs.close()
    eval_envs.close()
    if stop["requested"]:
        sys.exit(130)
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step, "timeline": timeline}


if __name__ == "__main__":
    main(tyro.cli(Args))
