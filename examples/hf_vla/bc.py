"""Behaviour cloning of the VLA on scripted-expert demonstrations: the warm start that RL fine-tuning raises.

    uv run python examples/hf_vla/bc.py --out runs/vla_bc --action-head bins --action-bins 16 --steps 2000
    uv run python cleanrl_embodied/grpo_vla.py --env-id PushCubeLangRL --policy examples.hf_vla:make_policy \\
        --policy-kwargs '{"model_path": "runs/vla_bc"}' --action-head bins --action-bins 16 \\
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}'

docs/VLA.md has the success this gives against --steps (and minutes on a 2-core CPU), and why these env settings.

1. Demonstrations: ``--num-envs`` envs of ``--env-id`` run the scripted expert (``push_cube.expert_action``,
   privileged state, >= 0.99 success) until ``--demo-episodes`` episodes have ended; every step gives a sample
   (the observation: image + instruction; the target: the expert's next ``--action-chunk`` actions of the same
   episode, entries past the episode's end masked out of the loss).
2. Statistics: per action dimension and state entry, the 1st and 99th percentiles, mean, std, min and max of the
   demonstrations; the policy decodes its actions (``--action-normalization``, default OpenVLA's ``bounds_q99``) and
   normalises its state (``--state-normalization``, default ``normal``: mean and std) with them from here on
   (``statistics.py``).
3. Training: ``--steps`` Adam steps on random minibatches, LoRA adapters and heads only (the policy's
   ``requires_grad``): cross-entropy over the bins of each action entry (the bin of the expert action, normalised
   with the statistics) for the bins head, Gaussian negative log-likelihood for the gaussian head.
4. Evaluation: deterministic (``dist.mode``) success per task on ``--eval-episodes`` fresh episodes
   (``shared.evaluation.evaluate``, seeds the demonstrations never used): every ``--eval-every`` steps (the
   success-vs-steps curve) and at the end on the policy reloaded from ``--out`` (the number RL starts from).
5. ``--out``: ``save_pretrained`` (merged backbone, tokenizer, heads, vla_config.json with the action-token map,
   dataset_statistics.json) and ``bc_eval.json`` (final success, the success-vs-steps curve, sizes and minutes).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared.cli import check_args, fail
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.chunks import chunk_space
from cleanrl_embodied.shared.envs.push_cube import expert_action
from cleanrl_embodied.shared.evaluation import evaluate
from examples.hf_vla.factory import ENV_BOUNDS, RUN_KWARGS, make_policy
from examples.hf_vla.model import HFVLAPolicy
from examples.hf_vla.statistics import DatasetStatistics


@dataclass
class Args:
    out: str = "runs/hf_vla_bc"
    """directory the behaviour-cloned VLA is saved to (save_pretrained), with bc_eval.json"""
    seed: int = 1
    """seed of the demonstrations, the minibatches and the evaluation episodes"""
    env_id: str = "PushCubeLangRL"
    """a PushCube task with a scripted expert (PushCubeLangRL: four tasks named only by the instruction)"""
    env_kwargs: str = '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}'
    """JSON keyword arguments of the envs (demonstrations and evaluation); RL must use the same"""
    action_head: Literal["gaussian", "bins"] = "bins"
    """the policy's head, as the trainers' --action-head"""
    action_bins: int = 16
    """bins per action entry (--action-head bins), as the trainers' --action-bins"""
    action_chunk: int = 1
    """actions per decision, as the trainers' --action-chunk"""
    policy_kwargs: str = "{}"
    """JSON keyword arguments of examples.hf_vla:make_policy (e.g. '{"lora_rank": 16}' or a model_path to start from)"""
    action_normalization: Literal["bounds_q99", "bounds", "normal"] = "bounds_q99"
    """how actions are normalised with the demonstrations' statistics: [q01, q99] or [min, max] to [-1, 1], or
    (x - mean) / std (the bins span [-1, 1] of it)"""
    state_normalization: Literal["normal", "bounds_q99", "bounds", "none"] = "normal"
    """how the state is normalised with the demonstrations' statistics (none: as the env gives it)"""
    demo_episodes: int = 512
    """expert episodes to record (every step of them is a sample)"""
    demo_noise: float = 0.0
    """std of Gaussian noise added to the action the env executes while recording (DART, Laskey et al. 2017); the
    label stays the expert's clean action, so the demonstrations show how the expert recovers from small errors"""
    num_envs: int = 64
    """parallel envs recording demonstrations"""
    steps: int = 2000
    """Adam steps (bins 16, state+rgb, DART 0.3: success 0.77-0.90 at 2000, 0.04 at 1000; docs/VLA.md)"""
    batch_size: int = 64
    """samples per step"""
    learning_rate: float = 1e-3
    """Adam learning rate of the adapters and heads"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the steps (the last steps settle, so the final policy is stable)"""
    autocast: Literal["none", "bf16"] = "none"
    """run forward passes under bf16 autocast (weights and optimizer stay float32)"""
    eval_episodes: int = 128
    """episodes per evaluation"""
    num_eval_envs: int = 64
    """parallel evaluation envs"""
    eval_every: int = 0
    """also evaluate every this many steps (the success-vs-steps curve; 0: only at the end)"""


def collect_demos(
    env, num_episodes: int, seed: int, chunk: int, noise: float = 0.0
) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """Run the expert until ``num_episodes`` episodes ended; return the observations [S], the targets [S, chunk, D]
    (the expert's next ``chunk`` actions) and which of them belong to the sample's episode [S, chunk]. With
    ``noise`` the env executes the expert's action plus N(0, noise^2) per entry (clipped to the bounds), the target
    stays the clean action."""
    obs, _ = env.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    low, high = (
        torch.as_tensor(b, dtype=torch.float32) for b in (env.single_action_space.low, env.single_action_space.high)
    )
    observations, actions, dones, ended = [], [], [], 0
    while ended < num_episodes:
        action = expert_action(env)
        observations.append(obs)
        actions.append(action)
        if noise > 0:
            action = (action + noise * torch.randn(action.shape, generator=generator)).clamp(low, high)
        obs, _, terminated, truncated, _ = env.step(action)
        dones.append(terminated | truncated)
        ended += int(dones[-1].sum())
    obs, actions, done = torch.stack(observations), torch.stack(actions), torch.stack(dones)  # [T, N, ...]
    steps = actions.shape[0]
    targets = torch.zeros((steps, env.num_envs, chunk, actions.shape[-1]))
    valid = torch.zeros((steps, env.num_envs, chunk), dtype=torch.bool)
    over = torch.zeros_like(done)  # the sample's episode ended before its step t + j
    for j in range(chunk):
        if j:
            over[: steps - j] |= done[j - 1 : steps - 1]
        targets[: steps - j, :, j] = actions[j:]
        valid[: steps - j, :, j] = ~over[: steps - j]
    return obs.reshape(-1), targets.reshape(-1, chunk, actions.shape[-1]), valid.reshape(-1, chunk)


def demo_statistics(args: Args, obs: TensorDict, targets: torch.Tensor, episodes: int) -> DatasetStatistics:
    """The demonstrations' statistics: of every recorded step's own expert action (a chunk's first entry) and of
    its state."""
    states = obs["state"] if "state" in obs.keys() else None
    source = f"examples/hf_vla/bc.py: expert demonstrations (--seed {args.seed}, --demo-noise {args.demo_noise})"
    return DatasetStatistics.of_samples(
        args.env_id, targets[:, 0], states, args.action_normalization, args.state_normalization,
        num_transitions=len(targets), demo_episodes=episodes, source=source,
    )  # fmt: skip


def bc_loss(policy: HFVLAPolicy, obs: TensorDict, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the expert's actions over the valid entries: cross-entropy over the bins of
    each entry (the bin the expert's action falls in, normalised with the policy's statistics), or the Gaussian's
    NLL."""
    dist = policy.dist(obs)
    shape = dist.batch_shape  # [B, D] or [B, K, D]
    target = policy.action_bins(targets.view(shape)) if policy.bins else targets.view(shape)
    mask = valid.view(shape[0], -1, 1).expand(-1, -1, shape[-1]).reshape(shape)
    return -torch.where(mask, dist.log_prob(target), 0.0).sum() / mask.sum()


def evaluate_policy(policy: HFVLAPolicy, env, episodes: int, seed: int) -> dict:
    def act(obs, generator, starts):  # (no memory: episode starts change nothing)
        return policy.env_action(policy.dist(obs).mode)

    return evaluate(act, env, episodes, seed)


def main(args: Args) -> dict:
    check_args(args, positive=("action_bins", "action_chunk", "demo_episodes", "num_envs", "steps", "batch_size",
                               "learning_rate", "eval_episodes", "num_eval_envs"),
               non_negative=("eval_every", "demo_noise"),
               sizes=(), json_objects=("env_kwargs", "policy_kwargs"))  # fmt: skip
    if "PushCube" not in args.env_id:
        fail(f"--env-id {args.env_id}: the scripted expert drives PushCubeRL and PushCubeLangRL only")
    torch.manual_seed(args.seed)
    env_kwargs = json.loads(args.env_kwargs)
    start = time.time()
    try:
        demo_env = make_env(args.env_id, num_envs=args.num_envs, seed=args.seed, **env_kwargs)
        eval_env = make_env(args.env_id, num_envs=args.num_eval_envs, seed=args.seed + 10_000, **env_kwargs)
    except (TypeError, ValueError) as e:
        fail(f"--env-kwargs / --env-id {args.env_id}: {e}")
    obs_space, act_space = eval_env.single_observation_space, eval_env.single_action_space
    if args.action_chunk > 1:  # the policy emits chunks of K actions; evaluation runs them one by one
        act_space = chunk_space(act_space, args.action_chunk)
    policy_kwargs = json.loads(args.policy_kwargs)
    # the demonstrations' statistics replace whatever the start had (a base checkpoint has none to refuse over)
    policy = make_policy(obs_space, act_space, args, **{"action_stats": ENV_BOUNDS, **policy_kwargs})
    obs, targets, valid = collect_demos(demo_env, args.demo_episodes, args.seed, args.action_chunk, args.demo_noise)
    policy.set_statistics(demo_statistics(args, obs, targets, args.demo_episodes))
    collect_s = time.time() - start
    trainable = [p for p in policy.parameters() if p.requires_grad]
    counts = {"total": sum(p.numel() for p in policy.parameters()), "trainable": sum(p.numel() for p in trainable)}
    print(
        f"{len(targets)} samples from {args.demo_episodes}+ expert episodes in {collect_s:.0f} s; parameters {counts}"
    )

    optimizer = torch.optim.Adam(trainable, lr=args.learning_rate)
    generator = torch.Generator().manual_seed(args.seed)
    amp = torch.autocast("cpu", torch.bfloat16, enabled=args.autocast == "bf16")
    curve, train_start = [], time.time()
    for step in range(1, args.steps + 1):
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (step - 1) / args.steps)
        index = torch.randint(len(targets), (args.batch_size,), generator=generator)
        with amp:
            loss = bc_loss(policy, obs[index], targets[index], valid[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step} loss {loss.item():.4f} ({time.time() - train_start:.0f} s)")
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad(), amp:
                result = evaluate_policy(policy, eval_env, args.eval_episodes, args.seed + 10_000)
            curve.append({"step": step, "success_rate": result["success_rate"], "train_s": time.time() - train_start})
            print(f"step {step}: eval success {result['success_rate']:.3f}")
    train_s = time.time() - train_start

    out = Path(args.out)
    policy.save_pretrained(out)
    run_kwargs = {k: v for k, v in policy_kwargs.items() if k in RUN_KWARGS}
    saved = make_policy(obs_space, act_space, args, **{**run_kwargs, "model_path": str(out)})
    with torch.no_grad(), amp:
        result = evaluate_policy(saved, eval_env, args.eval_episodes, args.seed + 10_000)
    report = {
        "eval": result,
        "curve": curve,  # the live policy during training (the saved one differs by the merge's float rounding)
        "samples": len(targets),
        "parameters": counts,
        "collect_s": collect_s,
        "train_s": train_s,
        "wall_s": time.time() - start,
        "args": dataclasses.asdict(args),
    }
    (out / "bc_eval.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"saved {out}: eval success {result['success_rate']:.3f} ({json.dumps(result)}), "
        f"{report['wall_s'] / 60:.1f} min"
    )
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
