"""PPO for continuous-action embodied tasks, in one file.

    uv run python cleanrl_embodied/ppo_continuous.py --env-id PushCubeRL
    uv run python cleanrl_embodied/ppo_continuous.py --env-id Pendulum-v1 --num-envs 16 --num-steps 128 \
        --gamma 0.99 --gae-lambda 0.95 --total-timesteps 300000

Read top to bottom: `Args`, the `Agent`, three pure functions (`policy_step`, `compute_gae`,
`ppo_loss`) that torch.compile can wrap unchanged, evaluation, then `main` with the training loop.
Environments come from `cleanrl_embodied.shared.make_env` (torch tensors on the device, Gymnasium's
SAME_STEP autoreset with `info["final_obs"]`, on-device episode statistics). Copy this file and edit it.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared import RunLogger, atomic_save, check_env_id, make_env, rollout_storage


@dataclass
class Args:
    exp_name: str = "ppo_continuous"
    """the name of this experiment (part of the run directory name)"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and deterministic algorithms where cheap"""
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

    # Environment
    env_id: str = "PushCubeRL"
    """the environment id: PushCubeRL or any Gymnasium id with a Box action space"""
    num_envs: int = 256
    """number of parallel training environments"""
    num_eval_envs: int = 64
    """number of parallel evaluation environments"""
    num_eval_episodes: int = 64
    """episodes per evaluation (each eval env contributes its first completed episodes)"""
    eval_freq: int = 25
    """evaluate every this many iterations (0 disables periodic eval; a final eval always runs)"""
    eval_deterministic: bool = True
    """evaluate with the mean action (``--no-eval-deterministic`` samples)"""
    save_freq: int = 50
    """write checkpoints/last.pt every this many iterations (and always at the end)"""

    # Algorithm
    total_timesteps: int = 3_000_000
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
    """stop the epoch loop early when the approximate KL exceeds this (None disables)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of the actor and the critic MLPs"""
    init_logstd: float = -0.5
    """initial log standard deviation of the Gaussian policy"""


def validate(args: Args) -> None:
    """Reject bad input with one line naming the flag, before anything is built."""

    def fail(msg: str) -> None:
        raise SystemExit(f"error: {msg}")

    for name in ("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs",
                 "num_eval_envs", "num_eval_episodes"):
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
    if args.learning_rate <= 0:
        fail(f"--learning-rate must be > 0, got {args.learning_rate}")
    if not args.hidden_sizes or min(args.hidden_sizes) <= 0:
        fail(f"--hidden-sizes must be positive integers, got {args.hidden_sizes}")
    try:
        check_env_id(args.env_id)
    except ValueError as e:
        fail(str(e))


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
    """Gaussian actor with a state-independent log-std, and a separate critic."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: tuple[int, ...], init_logstd: float):
        super().__init__()
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, hidden_sizes, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.full((1, act_dim), init_logstd))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Normal:
        mean = self.actor_mean(obs)
        return torch.distributions.Normal(mean, self.actor_logstd.expand_as(mean).exp())


def policy_step(agent: Agent, obs: torch.Tensor) -> TensorDict:
    """Sample a raw (unclipped) Gaussian action; return it with its log-prob and V(obs)."""
    dist = agent.dist(obs)
    action = dist.sample()
    return TensorDict(
        action=action, logprob=dist.log_prob(action).sum(-1), value=agent.get_value(obs),
        batch_size=obs.shape[:1],
    )


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
    not_terminated = (~terminated).float()
    not_done = (~dones).float()
    deltas = rewards + gamma * next_values * not_terminated - values
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
        stats = TensorDict(
            policy_loss=pg_loss, value_loss=v_loss, entropy=entropy,
            approx_kl=((ratio - 1) - logratio).mean(),
            clipfrac=((ratio - 1.0).abs() > args.clip_coef).float().mean(),
        )
    return loss, stats


@torch.no_grad()
def evaluate(agent: Agent, env, num_episodes: int, deterministic: bool, seed: int,
             video_frames: list | None = None) -> dict[str, float | None]:
    """Run eval episodes (each eval env contributes its first completed episodes) and average them."""
    n = env.num_envs
    episodes_per_env = -(-num_episodes // n)  # ceil
    obs, _ = env.reset(seed=seed)
    done_count = torch.zeros(n, dtype=torch.long, device=obs.device)
    sums = torch.zeros(3, device=obs.device)  # return, length, success
    has_success = False
    while bool((done_count < episodes_per_env).any()):
        dist = agent.dist(obs)
        action = dist.mean if deterministic else dist.sample()
        obs, _, _, _, info = env.step(action)
        has_success = has_success or "success" in info
        if video_frames is not None and int(done_count[0]) == 0:
            video_frames.append(env.render())
        counted = info["_episode"] & (done_count < episodes_per_env)
        ep = info["episode"]
        sums += torch.stack([(ep["r"] * counted).sum(), (ep["l"].float() * counted).sum(),
                             (ep["success"] * counted).sum()])
        done_count += info["_episode"].long()
    ret, length, success = (sums / (episodes_per_env * n)).tolist()
    return {"episodic_return": ret, "episodic_length": length, "success_rate": success if has_success else None}


def main(args: Args) -> dict:
    validate(args)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = max(1, args.total_timesteps // batch_size)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    envs = make_env(args.env_id, num_envs=args.num_envs, device=device, seed=args.seed)
    eval_envs = make_env(args.env_id, num_envs=args.num_eval_envs, device=device, seed=args.seed + 10_000)
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]

    agent = Agent(obs_dim, act_dim, args.hidden_sizes, args.init_logstd).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    logger = RunLogger("ppo_continuous", args, env_id=args.env_id, seed=args.seed, exp_name=args.exp_name,
                       output_dir=args.output_dir, track=args.track, wandb_project_name=args.wandb_project_name,
                       wandb_entity=args.wandb_entity, total_iterations=num_iterations)
    logger.write(f"device={device} envs={args.num_envs} batch={batch_size} minibatch={minibatch_size} "
                 f"iterations={num_iterations} run_dir={logger.run_dir}")

    storage = rollout_storage(
        args.num_steps, args.num_envs, device,
        obs=((obs_dim,), torch.float32), action=((act_dim,), torch.float32), logprob=((), torch.float32),
        value=((), torch.float32), final_value=((), torch.float32), reward=((), torch.float32),
        terminated=((), torch.bool), done=((), torch.bool),
    )

    def save_checkpoint(iteration: int, global_step: int) -> str:
        path = logger.checkpoint_dir / "last.pt"
        atomic_save({"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration,
                     "global_step": global_step, "env_id": args.env_id, "obs_dim": obs_dim, "act_dim": act_dim,
                     "args": dataclasses.asdict(args)}, path)
        return str(path)

    def run_eval(global_step: int) -> dict:
        frames = [] if args.capture_video else None
        result = evaluate(agent, eval_envs, args.num_eval_episodes, args.eval_deterministic, args.seed + 10_000,
                          frames)
        result["global_step"] = global_step
        logger.log({f"eval/{k}": v for k, v in result.items() if k != "global_step" and v is not None},
                   global_step)
        if frames:
            logger.write_video(np.stack(frames), f"eval_{global_step}", global_step)
        return result

    global_step, iteration, eval_result, checkpoint = 0, 0, None, None
    next_eval_iteration, next_save_iteration = args.eval_freq, args.save_freq
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    interrupted = False
    try:
        for iteration in range(1, num_iterations + 1):
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1) / num_iterations)

            # ---- rollout: no host sync inside this loop ----
            ep_sums = torch.zeros(4, device=device)  # episodes, return, length, success
            with torch.no_grad():
                for step in range(args.num_steps):
                    out = policy_step(agent, next_obs)
                    storage["obs"][step] = next_obs
                    for key in ("action", "logprob", "value"):
                        storage[key][step] = out[key]
                    next_obs, reward, terminated, truncated, info = envs.step(out["action"])
                    storage["final_value"][step] = agent.get_value(info.get("final_obs", next_obs))
                    storage["reward"][step] = reward
                    storage["terminated"][step] = terminated
                    storage["done"][step] = terminated | truncated
                    ended, ep = info["_episode"].float(), info["episode"]
                    ep_sums += torch.stack([ended.sum(), (ep["r"] * ended).sum(), (ep["l"] * ended).sum(),
                                            (ep["success"] * ended).sum()])
                global_step += batch_size

                # ---- advantages: V(next obs) within an episode, V(final_obs) where it ended ----
                next_values = torch.cat([storage["value"][1:], agent.get_value(next_obs)[None]])
                next_values = torch.where(storage["done"], storage["final_value"], next_values)
                advantages, returns = compute_gae(storage["reward"], storage["value"], next_values,
                                                  storage["terminated"], storage["done"], args.gamma,
                                                  args.gae_lambda)

            # ---- PPO update ----
            batch = storage.select("obs", "action", "logprob", "value").reshape(-1)
            batch["advantages"], batch["returns"] = advantages.reshape(-1), returns.reshape(-1)
            for _epoch in range(args.update_epochs):
                perm = torch.randperm(batch_size, device=device)
                epoch_kl = []
                for start in range(0, batch_size, minibatch_size):
                    loss, stats = ppo_loss(agent, batch[perm[start:start + minibatch_size]], args)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                    epoch_kl.append(stats["approx_kl"])
                if args.target_kl is not None and float(torch.stack(epoch_kl).mean()) > args.target_kl:
                    break

            # ---- logging: one host sync per iteration ----
            y_pred, y_true = batch["value"], batch["returns"]
            explained_var = 1 - (y_true - y_pred).var() / y_true.var().clamp_min(1e-8)
            n_ep = ep_sums[0].clamp_min(1)
            sps = global_step / (time.time() - start_time)
            scalars = {f"losses/{k}": v for k, v in stats.items()}
            scalars.update({"losses/explained_variance": explained_var, "charts/SPS": sps,
                            "charts/learning_rate": optimizer.param_groups[0]["lr"]})
            if float(ep_sums[0]) > 0:
                scalars.update({"charts/episodic_return": ep_sums[1] / n_ep,
                                "charts/episodic_length": ep_sums[2] / n_ep,
                                "charts/success_rate": ep_sums[3] / n_ep})
            logger.log(scalars, global_step)
            latest = logger.latest
            logger.progress(global_step, SPS=sps, ret=latest.get("charts/episodic_return"),
                            succ=latest.get("charts/success_rate"))

            # frequencies are thresholds on the iteration counter (they survive resumes and odd sizes)
            if args.eval_freq and iteration >= next_eval_iteration and iteration < num_iterations:
                eval_result = run_eval(global_step)
                next_eval_iteration = iteration + args.eval_freq
            if args.save_freq and iteration >= next_save_iteration:
                checkpoint = save_checkpoint(iteration, global_step)
                next_save_iteration = iteration + args.save_freq
    except KeyboardInterrupt:
        interrupted = True
        logger.write("interrupted: writing the last checkpoint and summary.json")

    if not interrupted:
        eval_result = run_eval(global_step)
    checkpoint = save_checkpoint(iteration, global_step)
    wall = time.time() - start_time
    logger.write_summary(global_step=global_step, wall_time_s=wall, sps=global_step / max(wall, 1e-9),
                         eval=eval_result, checkpoint=checkpoint)
    logger.write(f"done: global_step={global_step} wall_time={wall:.1f}s eval={eval_result}")
    logger.close()
    envs.close()
    eval_envs.close()
    if interrupted:
        sys.exit(130)
    return {"run_dir": str(logger.run_dir), "eval": eval_result, "global_step": global_step}


if __name__ == "__main__":
    main(tyro.cli(Args))
