"""Asynchronous PPO for fine-tuning vision-language-action (VLA) policies: a collector thread steps the envs while
the learner updates, in one file.

    uv run python cleanrl_embodied/ppo_vla_async.py --env-id PushCubeLangRL \
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}' \
        --policy examples.hf_vla:make_policy --action-head bins --action-bins 16 --action-chunk 4 --micro-batch-size 32

The policy, its flags and checkpoints are ppo_vla.py's. For policies whose inference is slow (100 ms a step and
more), a `Collector` thread collects rollout j+1 with an *inference copy* of the policy while the learner (the main
thread) trains on rollout j. The copy shares the learner's frozen weights (one backbone in memory) and holds its own
trainable parameters and buffers: rollout j is collected with exactly those the learner published after consuming
j - K rollouts (K = --max-staleness); a snapshot holds only what can change, never a frozen backbone. Every
transition carries the policy version that produced it; the learner drops (and counts) a rollout older than K
versions, takes its PPO ratio against the behaviour log-prob stored with the data, and recomputes values with its
current critic. Evaluation and checkpoints see the collector paused at a rollout boundary, so a checkpoint holds
both sides at one point; an error on either side stops both and never overwrites the last consistent last.pt. Each
side has its own random stream: on CPU a command gives the same run bit for bit (--max-staleness 0: synchronous
PPO). Read top to bottom: `Args`, the pure functions (ppo_vla.py's, and `collector_step`), the `Collector`, then
`main`.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import sys
import threading
import time
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
    total_timesteps: int = 2_000_000
    """total environment steps (summed over envs; a chunk of K actions counts K)"""
    num_envs: int = 256
    """number of parallel training environments"""

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
    max_staleness: int = 1
    """K: rollout j is collected with the policy published after rollout j - K was consumed (0: synchronous)"""

    # The policy (passed to the --policy factory through these Args) and its memory
    policy: str = "examples.hf_vla:make_policy"
    """the `module:factory` that builds the policy (docs/policies.md, docs/VLA.md)"""
    action_head: Literal["gaussian", "bins"] = "gaussian"
    """a Gaussian per action entry, or a categorical over --action-bins bins per entry (OpenVLA's action tokens)"""
    action_bins: int = 256
    """bins per action entry (--action-head bins)"""
    action_chunk: int = 1
    """actions per decision: the policy emits this many at once and the env runs them one by one (a chunk)"""
    micro_batch_size: int | None = None
    """the most samples of any forward pass (minibatch pieces' gradients add up; None: no split)"""
    autocast: Literal["none", "bf16"] = "none"
    """run the policy's forward passes under bf16 autocast (weights, optimizer and log-probs stay float32)"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    shared.check_args(
        args,
        positive=("action_bins", "action_chunk", "micro_batch_size", "num_envs", "num_steps", "total_timesteps",
                  "num_minibatches", "update_epochs", "learning_rate", "gamma", "clip_coef",
                  "clip_coef_high", "temperature", "vf_coef", "max_grad_norm", "target_kl"),
        non_negative=("gae_lambda", "ent_coef", "critic_warmup_iterations", "max_staleness"),
        at_most_1=("gamma", "gae_lambda"),
        may_be_inf=("max_grad_norm",),  # no clipping
        sizes=(),
        minibatches_of=args.num_envs * args.num_steps,
    )  # fmt: skip


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


def collector_step(
    agent: nn.Module, obs: torch.Tensor | TensorDict, generator: torch.Generator, temperature: float, per_token: bool
) -> TensorDict:
    """Sample a raw action (a chunk's K actions at once) from `generator`; return it with its behaviour log-prob and
    the action the env gets. No value: the learner recomputes values with its current critic."""
    dist = tempered(agent.dist(obs), temperature)
    action = sample_with(dist, generator)
    logprob = aggregate(dist.log_prob(action), per_token)  # summed over the action's entries, or per entry
    return TensorDict(action=action, logprob=logprob, env_action=agent.env_action(action), batch_size=obs.shape[:1])


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


class Collector:
    """Steps the training envs in a background thread with an inference copy of the policy, changed only by the
    learner's `publish`. Rollout j waits until the learner has consumed j - K rollouts; rollouts go to the learner
    through a queue the wait keeps to K + 1 entries; the rest (envs, next_obs, generator) is read only while paused."""

    def __init__(self, envs, agent: nn.Module, args: Args, total_rollouts: int, device: torch.device):
        self.envs, self.agent, self.args, self.total_rollouts = envs, agent, args, total_rollouts
        seeds = {name: shared.stream_seed(args.seed, name) for name in ("train_envs", "collector")}
        self.next_obs, self.next_index = envs.reset(seed=seeds["train_envs"])[0], 0  # or load_state()
        self.generator = torch.Generator(device=device).manual_seed(seeds["collector"])  # its own stream
        self.step = partial(collector_step, agent, generator=self.generator, temperature=args.temperature,
                            per_token=args.loss_agg == "token")  # fmt: skip
        self.piece, self.amp = args.micro_batch_size or sys.maxsize, shared.autocast(args.autocast, device)
        self.decision_shape = (args.num_envs, args.action_chunk, *envs.single_action_space.shape)  # [N, K, D]
        self.task_names, self.consumed, self.error = envs.metadata.get("task_names"), 0, None  # (see publish, _run)
        self.rollouts, self.cond = queue.Queue(maxsize=args.max_staleness + 1), threading.Condition()
        self.snapshots: dict[int, tuple[int, dict]] = {}  # rollouts consumed -> (policy version, changing entries)
        self.changing: set[str] = set()  # the policy's state entries that snapshots copy (see publish)
        self.seen: dict[str, tuple[int, int]] | None = None  # frozen parameter -> (data_ptr, version) at the copy
        self.pause_requested = self.paused = self.stop_requested = self.finished = False
        self.thread = threading.Thread(target=self._run, name="ppo-async-collector", daemon=True)

    def publish(self, consumed: int, version: int, agent: nn.Module) -> None:
        """Hand the learner's policy after `consumed` rollouts to the collector: the first call copies what its copy
        does not share (`shared.inference_copy` shares the frozen parameters: the learner's own tensors, never
        written); each call snapshots what can change (trainable parameters, buffers, and a frozen parameter not
        shared once its version counter says it changed in place or was replaced). A resume applies its snapshots."""
        state, own = agent.state_dict(keep_vars=True), self.agent.state_dict(keep_vars=True)
        same = {k for k, v in state.items() if own[k] is v}  # the tensors the collector's copy shares
        if self.seen is None:
            self.agent.load_state_dict({k: v for k, v in state.items() if k not in same}, strict=False)
            self.seen = {k: (v.data_ptr(), v._version) for k, v in state.items() if isinstance(v, nn.Parameter)}
            for _, snapshot in self.snapshots.values():  # a resume's: never to be written into a shared tensor
                for key in same & snapshot.keys():
                    del snapshot[key]
        for key, value in state.items():
            if key not in self.seen or value.requires_grad or self.seen[key] != (value.data_ptr(), value._version):
                self.changing.add(key)
        self.changing -= same
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
            error.add_note("(raised in the ppo_vla_async collector thread)")
            raise error

    def get(self) -> dict:
        """The next rollout, in order (those completed before the collector failed, then its exception)."""
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
            raise RuntimeError("the ppo_vla_async collector thread did not stop within 60 s")

    def state(self) -> dict:
        """What a resume needs from this side, rollouts not yet learned from included (call only while paused)."""
        pending = [{**item, "data": item["data"].to_dict(), "next_obs": shared.obs_for_checkpoint(item["next_obs"])}
                   for item in list(self.rollouts.queue)]  # fmt: skip
        return {"next_index": self.next_index, "next_obs": shared.obs_for_checkpoint(self.next_obs), "pending": pending,
                "env_state": shared.env_state_dict(self.envs), "generator": self.generator.get_state(),
                "snapshots": dict(self.snapshots)}  # fmt: skip

    def load_state(self, state: dict) -> None:
        """Continue from the rollout boundary `state()` was taken at (before the thread starts)."""
        device, pending = self.next_obs.device, state["pending"]
        if state["env_state"] is not None:  # else the envs start fresh episodes
            shared.load_env_state_dict(self.envs, state["env_state"])
            self.next_obs = shared.obs_from_checkpoint(state["next_obs"], device)
        self.generator.set_state(state["generator"])
        self.next_index, self.snapshots = state["next_index"], {int(c): vs for c, vs in state["snapshots"].items()}
        self.changing.update(key for _, snapshot in self.snapshots.values() for key in snapshot)
        self.rollouts = queue.Queue(maxsize=max(self.args.max_staleness + 1, len(pending)))  # a resume may lower K
        for item in pending:
            item = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in item.items()}
            data = TensorDict(item["data"], batch_size=[self.args.num_steps, self.args.num_envs], device=device)
            next_obs = shared.obs_from_checkpoint(item["next_obs"], device)
            self.rollouts.put_nowait({**item, "next_obs": next_obs, "data": data})

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
        args, device, obs_space = self.args, self.next_obs.device, self.envs.single_observation_space
        action = action_space(self.envs, args).shape
        data = shared.rollout_storage(  # TensorDict observations are stored as they come, uint8 images as uint8
            args.num_steps, args.num_envs, device, obs=obs_space, final_obs=obs_space, action=(action, torch.float32),
            logprob=((math.prod(action),) if args.loss_agg == "token" else (), torch.float32),  # (per token: per entry)
            reward=((), torch.float32), discount=((), torch.float32), terminated=((), torch.bool),
            done=((), torch.bool), version=((), torch.long))  # fmt: skip
        stats, watch = shared.RolloutStats(device, self.task_names), shared.NonFiniteWatch(args.num_envs, device)
        start = time.time()
        for step in range(args.num_steps):
            if self.stop_requested:
                return None
            with self.amp():
                out = in_pieces(self.step, self.next_obs, self.piece)
            data["obs"][step] = self.next_obs
            data["action"][step], data["logprob"][step] = out["action"], out["logprob"]
            self.next_obs, reward, discount, steps, terminated, truncated, info = step_decision(
                self.envs, out["env_action"].reshape(self.decision_shape), args.gamma
            )
            data["reward"][step], data["discount"][step] = reward, discount  # gamma^(env steps the decision ran)
            data["terminated"][step], data["done"][step] = terminated, (done := terminated | truncated)
            stats.add_reward_terms(info, steps)  # per env step: a chunk's terms are sums over its steps
            if device.type != "cpu" or done.any():  # what only finished episodes need (on the CPU, asking is free)
                data["final_obs"][step] = info["final_obs"]  # read only where done
                watch.update_final(step, info["final_obs"], done)
                stats.add_episodes(info)
        watch.update_rollout(data["obs"], self.next_obs, data["reward"])
        data["version"].fill_(version)  # every transition carries the policy version that produced it
        return {"index": self.next_index, "version": version, "data": data, "next_obs": self.next_obs, "stats": stats,
                "watch": watch, "start": start, "end": time.time()}  # fmt: skip


def main(args: Args) -> dict:
    validate(args)
    trainer = shared.describe_trainer(__file__)  # this file: its name, path, hash, git state and network code
    env = shared.EnvOptions(args.env_id, args.env_kwargs, args.eval_env_kwargs, args.env_vectorization)
    same = {k: getattr(args, k) for k in ("policy", "policy_kwargs", *ACTION_ARGS)}  # the policy and its outputs
    kept = ("num_envs", "num_steps", "gamma", "learning_rate", "anneal_lr", "loss_agg")  # pending rollouts' log-probs
    resume_same = {k: getattr(args, k) for k in kept}
    ckpt, ckpt_flag, path = shared.load_resume_or_eval(args.resume, args.eval_checkpoint, trainer, env, same,
                                              resume_same)  # fmt: skip
    ckpt = shared.without_privileged_critic(ckpt, ckpt_flag, path)  # ppo_vla.py's: evaluate its actor alone
    batch_size = args.num_envs * args.num_steps  # decisions per rollout (each runs --action-chunk env steps)
    minibatch_size = batch_size // args.num_minibatches
    rollout_steps = batch_size * args.action_chunk  # env steps of a rollout
    num_iterations = max(1, args.total_timesteps // rollout_steps)
    shared.seed_everything(args.seed, args.torch_deterministic)
    device = shared.pick_device(args.cuda)
    piece = args.micro_batch_size or sys.maxsize  # the most samples of a forward pass

    eval_envs = shared.build_env(env, args.num_eval_envs, shared.stream_seed(args.seed, "eval_envs"), device, True)
    obs_dim, act_dim = shared.check_env_sizes(eval_envs, (ckpt, ckpt_flag))
    agent = make_agent(eval_envs, args).to(device)
    if ckpt is not None:
        shared.load_model_state(agent, ckpt, ckpt_flag, path)
    frozen = shared.frozen_fingerprint(agent)  # what checkpoints record of the weights they leave out
    logger = shared.RunLogger(trainer, args, total_iterations=num_iterations)
    evaluator = shared.Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    act = partial(eval_action, agent, deterministic=args.eval_deterministic, size=piece)
    if args.eval_checkpoint:  # evaluate a saved policy and exit
        return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)

    envs = shared.build_env(env, args.num_envs, shared.stream_seed(args.seed, "train_envs"), device, False, eval_envs)
    params = [p for p in agent.parameters() if p.requires_grad]  # the adapters and heads, never a frozen backbone
    value_ids = {id(p) for p in agent.value_parameters()} if args.critic_warmup_iterations else set()
    policy_params = [p for p in params if id(p) not in value_ids]  # what a critic warm-up holds still
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    # torch.compile or eager: --compile auto on the CPU decides after the 2nd iteration; a resume keeps the choice
    compiled = shared.Compiler(args.compile, device, logger.write, trainer, dataclasses.asdict(args),
                               decided=ckpt and ckpt.get("compiled"))  # fmt: skip
    backward_fn, clip_fn, step_fn = compiled(backward_piece), compiled(clip_gradients), compiled(optimizer.step)
    amp = shared.autocast(args.autocast, device)
    micro_batch_size = min(piece, minibatch_size)
    inference_agent = shared.inference_copy(agent)  # the collector's: the learner's frozen weights, its own trainables

    consumed, version, global_step, dropped = 0, 0, 0, 0  # the learner's: rollouts, updates, env steps, dropped
    collector = Collector(envs, inference_agent, args, num_iterations, device)  # resets the envs
    if ckpt is not None:  # resume: every piece of state the next iteration depends on
        shared.load_optimizer(optimizer, ckpt["optimizer"])
        consumed, version, dropped = ckpt["iteration"], ckpt["version"], ckpt["dropped"]
        global_step, evaluator.best_key = ckpt["global_step"], tuple(ckpt["best_key"])
        shared.note_schedule_change(ckpt, consumed + 1, num_iterations, args.learning_rate, args.anneal_lr,
                                    logger.write)  # fmt: skip
        shared.set_rng_state(ckpt["rng"])
        collector.load_state(ckpt["collector"])  # it stopped at a rollout boundary: continue from exactly there
    collector.publish(consumed, version, agent)
    sizes = f"envs={args.num_envs} batch={batch_size} minibatch={minibatch_size} max_staleness={args.max_staleness}"
    logger.write(f"device={device} {sizes} iterations={num_iterations} start={consumed + 1} run={logger.run_dir}")

    def save_checkpoint(name: str) -> str:  # only while the collector is paused: both sides at one point
        state = {
            "script": trainer["script"], "trainer": trainer, "args": dataclasses.asdict(args),
            "model": shared.model_state(agent), "frozen": frozen,  # what trains; the fingerprint of the rest
            "optimizer": optimizer.state_dict(), "iteration": consumed, "version": version, "global_step": global_step,
            "dropped": dropped, "num_iterations": num_iterations, "best_key": list(evaluator.best_key),
            "env": shared.env_record(env, eval_envs),  # id, options, observation layout: a resume must match them
            "obs_dim": obs_dim, "act_dim": act_dim, "rng": shared.rng_state(), "collector": collector.state(),
            "compiled": compiled.on,  # --compile auto's choice (None: not made yet), which a resume keeps
        }  # fmt: skip
        return str(shared.atomic_save(state, logger.checkpoint_dir / name))

    def learn(data: TensorDict, next_obs: torch.Tensor | TensorDict) -> tuple[list, TensorDict]:
        """PPO's update on a rollout; (statistics of the applied optimizer steps, the batch learned from)."""
        value_of = lambda obs: in_pieces(agent.get_value, obs.flatten(0, 1), piece).view(obs.shape[:2])  # [T, N]
        with torch.no_grad(), amp():  # advantages with the current critic: V(final_obs) where an episode ended
            values = value_of(data["obs"])
            next_values = torch.cat([values[1:], in_pieces(agent.get_value, next_obs, piece)[None]])
            next_values = torch.where(data["done"], value_of(data["final_obs"]), next_values)
        gae_inputs = (data["reward"], values, next_values, data["terminated"], data["done"], data["discount"])
        advantages, returns = compute_gae(*gae_inputs, args.gae_lambda)  # discount: gamma^(env steps it ran)
        data.update({"value": values, "advantages": advantages, "returns": returns})
        batch, update_stats = data.select("obs", "action", "logprob", "value", "advantages", "returns").reshape(-1), []
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            epoch_kl = []
            for start in range(0, batch_size, minibatch_size):
                mb = batch[perm[start : start + minibatch_size]]
                mb = normalize_advantages(mb) if args.norm_adv else mb
                optimizer.zero_grad(set_to_none=True)
                loss = stats = None  # the minibatch's, summed over its pieces (their gradients add up)
                for part in shared.micro_batches(mb, micro_batch_size):
                    with amp():
                        out = backward_fn(agent, part, args, len(part) / minibatch_size)
                    loss, stats = out if loss is None else (loss + out[0], stats + out[1])
                if consumed < args.critic_warmup_iterations:  # value only: the policy waits (Adam skips it)
                    for p in policy_params:
                        p.grad = None
                grad_norm = clip_fn(params, args.max_grad_norm)
                if not guard.ok(loss, grad_norm, global_step + rollout_steps):  # the step it logs at
                    continue
                step_fn()
                epoch_kl.append(stats["approx_kl"])
                update_stats.append(stats)
            if args.target_kl is not None and epoch_kl and float(torch.stack(epoch_kl).mean()) > args.target_kl:
                break
        return update_stats, batch

    eval_result, timeline = None, []
    guard = shared.SkipGuard(args.max_consecutive_skips)  # non-finite optimizer steps are skipped and counted
    keeper = shared.RunKeeper(evaluator, act, save_checkpoint, args.eval_freq, args.save_freq, num_iterations,
                              consumed, global_step)  # fmt: skip
    collector.thread.start()
    try:
        # Ctrl-C / SIGTERM: finish the iteration, save, write summary.json; an error also writes it (what is known)
        with shared.StopFlag(logger.write) as stop, logger:
            while consumed < num_iterations:
                if args.anneal_lr:
                    optimizer.param_groups[0]["lr"].fill_(args.learning_rate * (1.0 - consumed / num_iterations))
                wait_start, item = time.time(), collector.get()  # (in this order: the wait is timed)
                wait_s, update_start = time.time() - wait_start, time.time()
                assert item["index"] == consumed, (item["index"], consumed)  # in order, none lost
                used_version, staleness = version, version - item["version"]
                item["watch"].check(global_step, args.num_envs * args.action_chunk)  # one line: envs and step, if any
                stale = staleness > args.max_staleness  # only after a resume with a smaller --max-staleness
                update_stats, batch = ([], None) if stale else learn(item["data"], item["next_obs"])
                dropped, version = dropped + stale, version + (not stale)
                consumed, global_step = consumed + 1, global_step + rollout_steps  # the rollout is learned from
                times = {"collect": (item["start"], item["end"]), "update": (update_start, time.time())}
                collector.publish(consumed, version, agent)  # after the update's end: a waiting collector starts now
                timeline.append({"index": item["index"], "behaviour_version": item["version"],
                                 "learner_version": used_version, "dropped": stale, **times})  # fmt: skip

                # ---- logging: one host sync per iteration ----
                scalars = {"charts/learning_rate": optimizer.param_groups[0]["lr"],
                           "charts/skipped_updates": guard.skipped, "charts/policy_staleness": staleness,
                           "charts/dropped_rollouts": dropped, "charts/learner_wait_s": wait_s,
                           **item["stats"].scalars()}  # fmt: skip
                if update_stats:  # means of this iteration's applied optimizer steps (skipped ones left out)
                    scalars.update({f"losses/{k}": v for k, v in torch.stack(update_stats).mean(0).items()})
                if batch is not None:  # the rollout was learned from
                    variance = (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
                    scalars["losses/explained_variance"] = 1 - variance
                logger.log_iteration(global_step, keeper.sps(global_step), scalars)

                compiled.after_iteration(num_iterations - consumed)  # --compile auto (CPU): decided after the 2nd
                do_eval, do_save = keeper.due(consumed)
                if do_eval or do_save:  # evaluation and checkpoints see a paused collector
                    collector.pause()
                    keeper.evaluate_and_save(consumed, global_step, do_eval, do_save)
                    collector.resume()
                if stop.requested:
                    break
            collector.pause()  # at a rollout boundary: last.pt can hold the collector's state
            eval_result = keeper.finish(global_step, stop.requested, dropped_rollouts=dropped, compiled=compiled.on)
    finally:  # after an error on either side too: stop both (last.pt stays the last consistent one)
        collector.stop()
        envs.close()
        eval_envs.close()
    if stop.requested:
        sys.exit(stop.exit_status)  # 130 after Ctrl-C, 143 after SIGTERM
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step, "timeline": timeline}


if __name__ == "__main__":
    main(tyro.cli(Args))
