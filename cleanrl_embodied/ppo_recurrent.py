"""PPO with memory (an LSTM or a GRU) for tasks that one observation cannot solve, in one file.

    uv run python cleanrl_embodied/ppo_recurrent.py --env-id PushCubeRL --env-kwargs '{"dropout_sensor": "cube"}'
    uv run python cleanrl_embodied/ppo_recurrent.py --env-id Pendulum-v1 --env-kwargs '{"obs_indices": [0, 1]}' \
        --num-envs 16 --num-steps 64 --num-minibatches 4 --update-epochs 10 --gamma 0.9 --gae-lambda 0.95 \
        --norm-obs --total-timesteps 100000

ppo_continuous.py with a recurrent core between the observation encoder and the heads, as in CleanRL's
ppo_atari_lstm.py and rsl_rl's recurrent actor-critic. Each env's hidden state is carried through the rollout and
reset where an episode starts (SAME_STEP autoreset: the step after a `done`); V(final obs) of a truncated episode is
computed from the state the policy had at that step. The update replays whole env sequences from the state stored at
the rollout's start (truncated backpropagation through time over the rollout), in minibatches of envs. What it shares
with ppo_continuous.py (GAE, the clipped objective, reward scaling, the encoders) is the same code
(tests/test_copies_identical.py). docs/ppo_recurrent.md: the algorithm, flags and measurements.
"""

from __future__ import annotations

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
from tensordict import TensorDict, from_module

from cleanrl_embodied import shared


@dataclass
class Args(shared.RunArgs):  # RunArgs (shared/cli.py): run directory, env options, evaluation, checkpoints, --policy
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
    total_timesteps: int = 2_000_000
    """total environment steps (summed over envs)"""
    num_envs: int = 256
    """number of parallel training environments"""

    # Algorithm
    learning_rate: float = 1e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over training"""
    num_steps: int = 20
    """rollout length per env per iteration: also how far back the update's gradients reach (truncated BPTT)"""
    gamma: float = 0.8
    """discount factor"""
    gae_lambda: float = 0.9
    """lambda of generalized advantage estimation"""
    num_minibatches: int = 8
    """minibatches per epoch, each the whole rollouts of num_envs / num_minibatches envs"""
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
    rnn_type: Literal["lstm", "gru"] = "lstm"
    """the recurrent core of the actor and of the critic"""
    rnn_hidden_size: int = 128
    """hidden units of each recurrent core"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the MLP heads on the cores' outputs"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""
    norm_obs: bool = False
    """normalize observations with running mean/std (updated from rollouts only, frozen at eval)"""
    privileged_critic: bool = False
    """the critic reads the observation's privileged entry alone through an MLP, without memory (simulator state is
    all it needs; docs/env-contract.md); off: the critic has its own recurrent core on the actor's input"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalized observations to [-clip, clip]"""
    clip_reward: float = 10.0
    """clip scaled rewards to [-clip, clip]"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""
    shared.check_args(
        args,
        positive=("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs", "learning_rate",
                  "clip_obs", "clip_reward", "gamma", "clip_coef", "vf_coef", "max_grad_norm", "target_kl",
                  "rnn_hidden_size"),
        non_negative=("gae_lambda", "ent_coef"),
        at_most_1=("gamma", "gae_lambda"),
        finite=("init_logstd",),
        may_be_inf=("max_grad_norm", "clip_obs", "clip_reward"),  # no clipping
    )  # fmt: skip
    if args.num_envs % args.num_minibatches or args.num_envs * args.num_steps < 2 * args.num_minibatches:
        shared.fail(f"--num-minibatches must divide --num-envs {args.num_envs} (a minibatch holds whole env "
                    f"sequences), got {args.num_minibatches}")  # fmt: skip


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


def rnn(kind: str, in_dim: int, hidden: int) -> nn.RNNBase:
    """A one-layer LSTM or GRU with orthogonal weights and zero biases (CleanRL's ppo_atari_lstm.py)."""
    core = (nn.LSTM if kind == "lstm" else nn.GRU)(in_dim, hidden)
    for name, param in core.named_parameters():
        nn.init.orthogonal_(param, 1.0) if "weight" in name else nn.init.constant_(param, 0.0)
    return core


def remember(core: nn.RNNBase, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A recurrent core over sequences x [T, S, F] from `memory` [S, M]: (its outputs [T, S, H], its memory after the
    last step). A memory is one tensor per row: [h, c] side by side for an LSTM (M = 2H), h for a GRU (M = H)."""
    if isinstance(core, nn.LSTM):
        h, c = memory[None].chunk(2, -1)
        out, (h, c) = core(x, (h.contiguous(), c.contiguous()))
        return out, torch.cat([h[0], c[0]], -1)
    out, h = core(x, memory[None].contiguous())
    return out, h[0]


@torch.compiler.disable  # (how many pieces there are is data: --compile compiles around it, the core runs as it is)
def replay(core: nn.RNNBase, x: torch.Tensor, starts: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """A core's outputs [T, B, H] over env sequences x [T, B, F] from `memory` [B, M] at their first step, the memory
    zeroed where `starts` [T, B]: each episode's piece of a sequence becomes a sequence of its own (from zeros, the
    first from `memory`), padded to T, so the core runs over all of them in one call (rsl_rl pads episodes alike)."""
    steps, envs = starts.shape
    new = torch.cat([torch.ones_like(starts[:1]), starts[1:]])  # where a piece begins
    pieces = new.sum(0)
    first = pieces.cumsum(0) - pieces  # each env's first piece
    piece = first + new.long().cumsum(0) - 1  # [T, B]: the piece each step belongs to
    t = torch.arange(steps, device=starts.device)[:, None].expand(steps, envs)
    at = t - torch.where(new, t, 0).cummax(0).values  # [T, B]: its position in that piece
    padded = x.new_zeros(steps, int(pieces.sum()), x.shape[-1]).index_put((at, piece), x)
    initial = memory.new_zeros(padded.shape[1], memory.shape[1]).index_put(
        (first,), torch.where(starts[0, :, None], 0.0, memory)
    )
    return remember(core, padded, initial)[0][at, piece]


class Agent(nn.Module):
    """ppo_continuous.py's Agent with a recurrent core before each head: observation -> normalizer/encoder features
    -> the actor's core -> Gaussian actor MLP, and -> the critic's own core -> critic MLP (with --privileged-critic:
    an MLP on the privileged entry alone, no memory). `state` [B, state_size] holds the actor's memory, then the
    critic's (`actor_state_size` first columns: all the exported actor needs)."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, args: Args):
        super().__init__()
        self.norm_obs, self.clip_obs = args.norm_obs, args.clip_obs
        num_floats = shared.float_dim(obs_space)  # images and instructions go through the encoder
        pixels_or_text = shared.image_spaces(obs_space) or shared.token_spaces(obs_space)
        self.obs_rms = shared.RunningMeanStd((num_floats,))
        self.encoder = PixelEncoder(obs_space, num_floats) if pixels_or_text else None
        features = self.encoder.out_dim if self.encoder else num_floats
        self.action_shape, act_dim = act_space.shape, math.prod(act_space.shape)
        width = args.rnn_hidden_size * (2 if args.rnn_type == "lstm" else 1)  # one core's memory
        self.actor_rnn = rnn(args.rnn_type, features, args.rnn_hidden_size)
        self.privileged_keys = (shared.PRIVILEGED_KEY,) if args.privileged_critic else ()  # the critic's alone
        if args.privileged_critic:
            self.critic_rms = shared.RunningMeanStd((shared.privileged_dim(obs_space),))
            self.critic = mlp(shared.privileged_dim(obs_space), args.hidden_sizes, 1, out_std=1.0)
        else:
            self.critic_rnn = rnn(args.rnn_type, features, args.rnn_hidden_size)
            self.critic = mlp(args.rnn_hidden_size, args.hidden_sizes, 1, out_std=1.0)
        self.actor_state_size, self.state_size = width, width * (1 if args.privileged_critic else 2)
        self.actor_mean = mlp(args.rnn_hidden_size, args.hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), args.init_logstd))

    def normalized(self, x: torch.Tensor, rms: shared.RunningMeanStd) -> torch.Tensor:
        if not self.norm_obs:
            return x
        return ((x - rms.mean) / (rms.var + 1e-8).sqrt()).clamp(-self.clip_obs, self.clip_obs).float()

    def features(self, obs: torch.Tensor | TensorDict) -> torch.Tensor:
        state = self.normalized(shared.float_entries(obs), self.obs_rms)  # a plain observation tensor as it is
        return state if self.encoder is None else self.encoder(obs, state)

    def _dist(self, out: torch.Tensor) -> torch.distributions.Normal:
        mean, shape = self.actor_mean(out), (-1, *self.action_shape)
        std = self.actor_logstd.expand_as(mean).exp()  # validate_args=False: a check would cost a host sync per call
        return torch.distributions.Normal(mean.view(shape), std.view(shape), validate_args=False)

    def _privileged_value(self, obs: torch.Tensor | TensorDict) -> torch.Tensor:
        return self.critic(self.normalized(shared.privileged_entries(obs), self.critic_rms)).squeeze(-1)

    def actor_step(self, obs, memory: torch.Tensor) -> tuple[torch.distributions.Normal, torch.Tensor]:
        """The action distribution at `obs` and the actor's memory after it (`memory`: [B, actor_state_size])."""
        out, memory = remember(self.actor_rnn, self.features(obs)[None], memory)
        return self._dist(out[0]), memory

    def step(self, obs, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.distributions.Normal, ...]:
        """One time step of a batch: the memory is zeroed where an episode starts (`starts` [B]), then the action
        distribution, V(obs) and the state after the step."""
        state, features = torch.where(starts[:, None], 0.0, state), self.features(obs)[None]
        out, actor_memory = remember(self.actor_rnn, features, state[:, : self.actor_state_size])
        if self.privileged_keys:
            return self._dist(out[0]), self._privileged_value(obs), actor_memory
        value_out, critic_memory = remember(self.critic_rnn, features, state[:, self.actor_state_size :])
        return self._dist(out[0]), self.critic(value_out[0]).squeeze(-1), torch.cat([actor_memory, critic_memory], -1)

    def get_value(self, obs, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """V(obs) from `state` (zeroed where `starts`): the value of the step `step` would take."""
        if self.privileged_keys:
            return self._privileged_value(obs)
        state = torch.where(starts[:, None], 0.0, state[:, self.actor_state_size :])
        return self.critic(remember(self.critic_rnn, self.features(obs)[None], state)[0][0]).squeeze(-1)

    def unroll(self, obs, starts: torch.Tensor, state: torch.Tensor) -> tuple[torch.distributions.Normal, ...]:
        """`step` over whole sequences, obs [T, B, ...] and starts [T, B] from `state` [B, state_size] at the first
        step: the action distributions and values of the T * B steps (time-major, flattened). The encoder and the
        heads run on all steps at once, each core over all sequences at once (`replay`)."""
        flat = obs.flatten(0, 1)
        features = self.features(flat).unflatten(0, starts.shape)
        actor = replay(self.actor_rnn, features, starts, state[:, : self.actor_state_size]).flatten(0, 1)
        if self.privileged_keys:
            return self._dist(actor), self._privileged_value(flat)
        critic = replay(self.critic_rnn, features, starts, state[:, self.actor_state_size :]).flatten(0, 1)
        return self._dist(actor), self.critic(critic).squeeze(-1)


def make_agent(envs, args: Args) -> nn.Module:
    """The built-in `Agent`, or the module that `--policy module:factory` builds (docs/ppo_recurrent.md)."""
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if args.policy is None:
        return Agent(obs_space, act_space, args)
    needs = ("step", "unroll", "get_value", "actor_step", "state_size", "actor_state_size")
    needs += ("obs_rms",) if args.norm_obs else ()
    needs += ("critic_rms",) if args.norm_obs and args.privileged_critic else ()
    return shared.build_policy(args.policy, args.policy_kwargs, obs_space, act_space, args, needs)


def policy_step(agent: Agent, obs: torch.Tensor | TensorDict, state: torch.Tensor, starts: torch.Tensor) -> TensorDict:
    """Sample an action (unclipped: the env clips it) from `state` (zeroed where `starts`); return it with its log-prob
    (summed over entries), V(obs) and the state after the step."""
    dist, value, state = agent.step(obs, state, starts)
    # a Normal's rsample (loc + scale * noise) draws what sample() does, without its host sync on a GPU (scale >= 0)
    action = dist.rsample() if isinstance(dist, torch.distributions.Normal) else dist.sample()
    logprob = dist.log_prob(action).flatten(1).sum(-1)
    return TensorDict(action=action, logprob=logprob, value=value, state=state, batch_size=obs.shape[:1])


def eval_action(
    agent: Agent, obs, generator: torch.Generator, starts: torch.Tensor, deterministic: bool, memory: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The evaluation policy, one step: the actor's `memory` is zeroed where an episode starts, then the Gaussian's
    mean, or a sample drawn from the evaluator's own generator. Returns the action and the actor's memory after it."""
    dist, memory = agent.actor_step(obs, torch.where(starts[:, None], 0.0, memory))
    if deterministic:
        return dist.mean, memory
    noise = torch.randn(dist.mean.shape, generator=generator, device=dist.mean.device)
    return dist.mean + dist.stddev * noise, memory


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


def ppo_loss(agent: Agent, mb: TensorDict, state: torch.Tensor, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """PPO's loss on a minibatch of whole env sequences `mb` [T, B], replayed from the `state` [B, state_size] the
    rollout had at its first step; means over the T * B samples. Returns (loss, detached statistics)."""
    dist, newvalue = agent.unroll(mb["obs"], mb["starts"], state)
    return clipped_loss(dist, newvalue, mb.flatten(0, 1), args)


def clipped_loss(dist, newvalue: torch.Tensor, mb: TensorDict, args: Args) -> tuple[torch.Tensor, TensorDict]:
    """PPO's objective given the policy's new distribution and values on the minibatch `mb`'s samples: the clipped
    surrogate, the (optionally clipped) value loss and the entropy bonus; returns (loss, detached statistics)."""
    newlogprob = dist.log_prob(mb["action"]).flatten(1).sum(-1)
    entropy = dist.entropy().flatten(1).sum(-1).mean()
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
        stats = TensorDict(policy_loss=pg_loss, value_loss=v_loss, entropy=entropy, old_approx_kl=(-logratio).mean(),
                           approx_kl=((ratio - 1) - logratio).mean(),
                           clipfrac=((ratio - 1.0).abs() > args.clip_coef).float().mean())  # fmt: skip
    return loss, stats.detach()


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global norm of at most `max_norm`; returns the norm before clipping."""
    return nn.utils.clip_grad_norm_(params, max_norm)


def scale_rewards(rewards, dones, trace, rms, gamma: float, clip: float) -> torch.Tensor:
    """Divide rewards by the running std of the discounted return (no mean shift); `trace` holds each env's
    discounted return so far and is updated in place (it restarts after episode ends)."""
    traces = torch.empty_like(rewards, dtype=torch.float64)
    for t in range(rewards.shape[0]):
        trace.mul_(gamma).add_(rewards[t])
        traces[t] = trace
        trace.masked_fill_(dones[t], 0.0)
    rms.update(traces)
    return (rewards / (rms.var + 1e-8).sqrt()).clamp(-clip, clip).float()


def main(args: Args) -> dict:
    validate(args)
    trainer = shared.describe_trainer(__file__)  # this file: its name, path, hash, git state and network code
    env_options = shared.EnvOptions(args.env_id, args.env_kwargs, args.eval_env_kwargs, args.env_vectorization)
    flags = dataclasses.asdict(args)  # a checkpoint must match the network and what it sees; on --resume also
    ckpt, ckpt_flag, ckpt_path = shared.load_resume_or_eval(  # the layout, the reward trace and the LR schedule
        args.resume, args.eval_checkpoint, trainer, env_options,
        same={k: flags[k] for k in ("rnn_type", "rnn_hidden_size", "hidden_sizes", "norm_obs", "clip_obs",
                                    "privileged_critic", "policy", "policy_kwargs")},
        resume_same={k: flags[k] for k in ("num_envs", "num_steps", "gamma", "norm_reward", "clip_reward",
                                           "learning_rate", "anneal_lr")},
    )  # fmt: skip
    batch_size = args.num_envs * args.num_steps
    envs_per_minibatch = args.num_envs // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // batch_size)
    shared.seed_everything(args.seed, args.torch_deterministic)
    device = shared.pick_device(args.cuda)

    eval_seed = shared.stream_seed(args.seed, "eval_envs")  # each random stream has its own seed (random_streams.py)
    eval_envs = shared.build_env(env_options, args.num_eval_envs, eval_seed, device, eval_envs=True)
    obs_dim, act_dim = shared.check_env_sizes(eval_envs, (ckpt, ckpt_flag))
    if args.privileged_critic and not shared.privileged_dim(eval_envs.single_observation_space):
        example = """--env-kwargs '{"obs_mode": "proprio+rgb", "privileged_state": true}'"""
        shared.fail(
            f"--privileged-critic: {args.env_id} observes no '{shared.PRIVILEGED_KEY}' entry (PushCubeRL: {example})"
        )
    agent = make_agent(eval_envs, args).to(device)
    if ckpt is not None:
        shared.load_model_state(agent, ckpt, ckpt_flag, ckpt_path)
    logger = shared.RunLogger(trainer, args, total_iterations=num_iterations)
    evaluator = shared.Evaluator(eval_envs, logger, args.seed, args.num_eval_episodes, args.capture_video)
    eval_memory = [torch.zeros(args.num_eval_envs, agent.actor_state_size, device=device)]  # between act's calls

    def act(obs, generator, starts):  # the evaluator's policy: the eval envs' memory lives on between its calls
        action, eval_memory[0] = eval_action(agent, obs, generator, starts, args.eval_deterministic, eval_memory[0])
        return action

    if args.eval_checkpoint:  # evaluate a saved policy and exit
        return evaluator.run_checkpoint(act, ckpt, args.eval_checkpoint)

    env_seed = shared.stream_seed(args.seed, "train_envs")
    envs = shared.build_env(env_options, args.num_envs, env_seed, device, eval_envs=False, like=eval_envs)
    params = [p for p in agent.parameters() if p.requires_grad]
    # the learning rate is a tensor: the schedule changes it in place, so a compiled step never recompiles for it
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.learning_rate, device=device), eps=1e-5)
    reward_rms = shared.RunningMeanStd().to(device)
    reward_trace = torch.zeros(args.num_envs, dtype=torch.float64, device=device)
    # The rollout acts through an inference copy that shares the agent's parameters (LeanRL-style):
    # compiled code then never sees the autograd-tracking module.
    agent_inference = make_agent(eval_envs, args).to(device)
    from_module(agent).data.to_module(agent_inference)
    # torch.compile or eager: --compile auto on the CPU decides after the 2nd iteration; a resume keeps the choice
    compiled = shared.Compiler(args.compile, device, logger.write, trainer, flags,
                               decided=ckpt and ckpt.get("compiled"))  # fmt: skip
    # the rollout's policy step and V compile on CUDA only: on the CPU, compiling them did not pay
    policy = compiled(partial(policy_step, agent_inference), on_cpu=False)
    value_fn = compiled(agent_inference.get_value, on_cpu=False)
    loss_fn, clip_fn, step_fn = compiled(ppo_loss), compiled(clip_gradients), compiled(optimizer.step)

    global_step, start_iteration = 0, 1
    next_obs, _ = envs.reset(seed=env_seed)
    next_state = torch.zeros(args.num_envs, agent.state_size, device=device)  # each env's memory after its last step
    next_starts = torch.ones(args.num_envs, dtype=torch.bool, device=device)  # next_obs begins an episode
    if ckpt is not None:  # resume: every piece of state the next iteration depends on
        shared.load_optimizer(optimizer, ckpt["optimizer"])
        reward_rms.load_state_dict(ckpt["reward_rms"])
        global_step = ckpt["global_step"]
        start_iteration = global_step // batch_size + 1  # (the LR schedule goes on from the same point)
        evaluator.best_key = tuple(ckpt["best_key"])
        shared.note_schedule_change(ckpt, start_iteration, num_iterations, args.learning_rate, args.anneal_lr,
                                    logger.write)  # fmt: skip
        if ckpt["env_state"] is not None:  # else the envs start fresh episodes, and so do memories and reward traces
            shared.load_env_state_dict(envs, ckpt["env_state"])
            next_obs = shared.obs_from_checkpoint(ckpt["next_obs"], device)
            reward_trace.copy_(ckpt["reward_trace"])
            next_state, next_starts = ckpt["next_state"].to(device), ckpt["next_starts"].to(device)
        shared.set_rng_state(ckpt["rng"])
    logger.write(
        f"device={device} envs={args.num_envs} batch={batch_size} minibatch={envs_per_minibatch}x{args.num_steps} "
        f"iterations={num_iterations} start={start_iteration} run_dir={logger.run_dir}"
    )

    def save_checkpoint(name: str) -> str:  # everything a resume needs, as plain tensors and numbers
        state = dict(
            script=trainer["script"], trainer=trainer, args=dataclasses.asdict(args), model=agent.state_dict(),
            optimizer=optimizer.state_dict(), reward_rms=reward_rms.state_dict(), reward_trace=reward_trace,
            iteration=iteration, global_step=global_step, num_iterations=num_iterations,
            best_key=list(evaluator.best_key), obs_dim=obs_dim, act_dim=act_dim,
            env=shared.env_record(env_options, eval_envs),  # id, options, observation layout: a resume must match them
            rng=shared.rng_state(), env_state=shared.env_state_dict(envs), next_obs=shared.obs_for_checkpoint(next_obs),
            compiled=compiled.on,  # --compile auto's choice (None: not made yet), which a resume keeps
            next_state=next_state, next_starts=next_starts,  # every env's memory and whether its episode begins
        )  # fmt: skip
        return str(shared.atomic_save(state, logger.checkpoint_dir / name))

    storage = shared.rollout_storage(
        args.num_steps, args.num_envs, device,
        obs=envs.single_observation_space,  # TensorDict observations as they come, uint8 images as uint8
        action=(envs.single_action_space.shape, torch.float32), logprob=((), torch.float32), value=((), torch.float32),
        final_value=((), torch.float32), reward=((), torch.float32), terminated=((), torch.bool), done=((), torch.bool),
        starts=((), torch.bool),  # obs[t] begins an episode: the memory is zeroed before it
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

            # ---- rollout: no host sync inside this loop on a GPU ----
            rollout_stats = shared.RolloutStats(device, task_names)
            watch = shared.NonFiniteWatch(args.num_envs, device)
            first_state = next_state  # the memory the update replays the rollout from
            with torch.no_grad():
                for step in range(args.num_steps):
                    out = policy(next_obs, next_state, next_starts)
                    storage["obs"][step], storage["starts"][step] = next_obs, next_starts
                    for key in ("action", "logprob", "value"):
                        storage[key][step] = out[key]
                    next_obs, reward, terminated, truncated, info = envs.step(out["action"])
                    storage["reward"][step], storage["terminated"][step] = reward, terminated
                    storage["done"][step] = done = terminated | truncated
                    rollout_stats.add_reward_terms(info)
                    if not cpu or done.any():  # what only finished episodes need; on a GPU every step (no sync)
                        # V(final obs) from the memory the policy had at this step (no reset: the same episode)
                        storage["final_value"][step] = value_fn(info["final_obs"], out["state"], torch.zeros_like(done))
                        watch.update_final(step, info["final_obs"], done)
                        rollout_stats.add_episodes(info)
                    next_state, next_starts = out["state"], done  # an episode that ended starts from zeros
                watch.update_rollout(storage["obs"], next_obs, storage["reward"])
                watch.check(global_step, args.num_envs)  # one line naming the envs and the step, if any
                global_step += batch_size

                # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
                next_values = torch.cat([storage["value"][1:], value_fn(next_obs, next_state, next_starts)[None]])
                next_values = torch.where(storage["done"], storage["final_value"], next_values)
                rewards, dones = storage["reward"], storage["done"]
                if args.norm_reward:
                    rewards = scale_rewards(rewards, dones, reward_trace, reward_rms, args.gamma, args.clip_reward)
                advantages, returns = compute_gae(
                    rewards, storage["value"], next_values, storage["terminated"], dones, args.gamma, args.gae_lambda
                )

            # ---- PPO update: minibatches of whole env sequences [T, envs_per_minibatch] ----
            batch = storage.select("obs", "action", "logprob", "value", "starts")
            batch["advantages"], batch["returns"] = advantages, returns
            update_stats = []  # statistics of the applied minibatch steps, averaged for logging
            for _epoch in range(args.update_epochs):
                perm = torch.randperm(args.num_envs, device=device)
                epoch_kl = []
                for start in range(0, args.num_envs, envs_per_minibatch):
                    envs_mb = perm[start : start + envs_per_minibatch]
                    loss, stats = loss_fn(agent, batch[:, envs_mb], first_state[envs_mb], args)
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
            if args.norm_obs:  # after the update, so the update saw the statistics the rollout used
                agent.obs_rms.update(shared.float_entries(storage["obs"], batch_dims=2))  # float entries only
                if args.privileged_critic:  # the critic's own statistics
                    agent.critic_rms.update(shared.privileged_entries(storage["obs"], batch_dims=2))

            # ---- logging: one host sync per iteration ----
            explained_var = 1 - (batch["returns"] - batch["value"]).var() / batch["returns"].var().clamp_min(1e-8)
            scalars = {f"losses/{k}": v for k, v in torch.stack(update_stats).mean(0).items()} if update_stats else {}
            scalars.update({"losses/explained_variance": explained_var, "charts/skipped_updates": guard.skipped})
            scalars.update({"charts/learning_rate": optimizer.param_groups[0]["lr"], **rollout_stats.scalars()})
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
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step}


if __name__ == "__main__":
    main(tyro.cli(Args))
