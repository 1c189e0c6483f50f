"""DAgger from a behaviour-cloned VLA for a fixed budget of CPU time: more imitation of the scripted expert, the
control that says what RL fine-tuning adds beyond spending the same compute on imitation (docs/VLA.md).

    uv run python examples/hf_vla/bc.py --out runs/vla_bc --demo-noise 0.3
    uv run python examples/hf_vla/dagger.py --model-path runs/vla_bc --out runs/vla_dagger --cpu-minutes 6

DAgger (Ross, Gordon and Bagnell 2011): the learner drives, the expert labels the states the learner reaches, and
the learner is trained on everything labelled so far. Here:

1. The start: ``--model-path`` (a ``bc.py`` or a ``fewshot.py`` output), loaded as the RL trainers load it (fresh
   zero-effect LoRA adapters on the merged backbone, its heads, its dataset statistics, which stay as they are, as
   in RL).
2. The aggregate dataset begins with the start's own demonstrations: a ``bc.py`` start's recorded again from the
   arguments in its ``bc_eval.json`` (same seed, noise and episodes: the same samples), which stands in for reading
   them from disk and is not charged to the budget; a ``fewshot.py`` start's K per task read from its
   demonstrations file. The rollouts run in the start's env (a few-shot start's: its demonstrations' env).
3. Rounds, until this process has used ``--cpu-minutes`` of CPU time (``time.process_time``, one thread with
   ``OMP_NUM_THREADS=1``; from the end of step 2 to the last update): the policy acts for ``--round-steps`` steps
   in ``--num-envs`` envs (``--rollout-actions``: its deterministic action, the one evaluation scores, or a sample),
   the expert's action in every state it reaches is the label, the samples join the dataset; then
   ``--updates-per-round`` Adam steps of ``bc.py``'s loss on random minibatches of the whole dataset, the learning
   rate annealed linearly to 0 over the budget.
4. ``--out``: ``save_pretrained`` (as bc.py's) and ``dagger.json`` (rounds, samples, CPU and wall minutes, the
   final policy's success on ``--eval-episodes`` fresh episodes, and per round the samples, the updates so far and
   the last update's loss: null for a round whose rollout used up the budget).

Action chunks are not supported (the expert labels one action per state the learner reaches).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Literal

import torch
import tyro

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.push_cube import expert_action
from examples.hf_vla.bc import bc_loss, collect_demos, evaluate_policy
from examples.hf_vla.demos import load_demos
from examples.hf_vla.factory import make_policy


@dataclass
class Args:
    model_path: str
    """the start: a bc.py --out directory (with its bc_eval.json) or a fewshot.py one (with its fewshot.json)"""
    out: str = "runs/hf_vla_dagger"
    """directory the final policy is saved to (save_pretrained), with dagger.json"""
    cpu_minutes: float = 5.0
    """the budget: CPU minutes of this process for the rounds (set it to an RL run's to compare at equal compute)"""
    seed: int = 1
    """seed of the rollouts' env starts, the minibatches and the sampled actions"""
    num_envs: int = 64
    """envs the learner acts in per round"""
    round_steps: int = 50
    """steps per round in each env (50: one PushCube episode)"""
    updates_per_round: int = 200
    """Adam steps after each round"""
    batch_size: int = 64
    """samples per Adam step (bc.py's default)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the adapters and heads, annealed linearly to 0 over the budget"""
    rollout_actions: Literal["mode", "sample"] = "mode"
    """how the learner acts in the rounds: its deterministic action (what evaluation scores) or a sample"""
    eval_episodes: int = 256
    """episodes of the final evaluation (fresh starts, bc.py's evaluation seeds)"""
    num_eval_envs: int = 64
    """parallel evaluation envs"""


def label_rollout(policy, env, obs, steps: int, rollout_actions: str):
    """Let ``policy`` act for ``steps`` steps from ``obs``; return the observations it met [steps * N], the expert's
    action in each [steps * N, 1, D] (a chunk of one, as bc.py's targets) and the observation to go on from."""
    observations, labels = [], []
    for _ in range(steps):
        with torch.no_grad():
            dist = policy.dist(obs)  # (a sample draws from torch's global stream, seeded in main)
            action = dist.mode if rollout_actions == "mode" else dist.sample()
        observations.append(obs)
        labels.append(expert_action(env))  # reads the env's state: what the expert would do here
        obs, *_ = env.step(policy.env_action(action))
    labels = torch.stack(labels)
    return torch.stack(observations).reshape(-1), labels.reshape(-1, 1, labels.shape[-1]), obs


def start_data(model_path: str):
    """``(env id, env options, the head's flags, the start's seed, (its demonstrations' observations [S], their
    targets [S, 1, D]))`` of a bc.py or fewshot.py output; one line when it is neither."""
    fewshot, bc = Path(model_path, "fewshot.json"), Path(model_path, "bc_eval.json")
    if fewshot.is_file():
        report = json.loads(fewshot.read_text())
        recipe = report["recipe"]
        samples, _ = load_demos(recipe["demos"], recipe["k"], flag=f"--model-path {model_path}: its demonstrations")
        bins = json.loads(Path(model_path, "vla_config.json").read_text())["action_bins"]
        head = SimpleNamespace(action_head="bins", action_bins=bins, action_chunk=1)
        data = (samples["obs"], samples["actions"].unsqueeze(1))
        return report["env_id"], report["env_kwargs"], head, report["args"]["seed"], data
    if not bc.is_file():
        fail(f"--model-path {model_path}: no bc_eval.json or fewshot.json (a bc.py or fewshot.py --out directory "
             "is expected)")  # fmt: skip
    bc_args = json.loads(bc.read_text())["args"]
    if bc_args["action_chunk"] != 1:
        fail(f"--model-path {model_path}: action_chunk {bc_args['action_chunk']}; DAgger here labels one action")
    env_kwargs = json.loads(bc_args["env_kwargs"])
    head = SimpleNamespace(action_head=bc_args["action_head"], action_bins=bc_args["action_bins"], action_chunk=1)
    demo_env = make_env(bc_args["env_id"], num_envs=bc_args["num_envs"], seed=bc_args["seed"], **env_kwargs)
    obs, targets, _ = collect_demos(demo_env, bc_args["demo_episodes"], bc_args["seed"], 1, bc_args["demo_noise"])
    demo_env.close()
    return bc_args["env_id"], env_kwargs, head, bc_args["seed"], (obs, targets)


def main(args: Args) -> dict:
    for name in ("cpu_minutes", "num_envs", "round_steps", "updates_per_round", "batch_size", "learning_rate",
                 "eval_episodes", "num_eval_envs"):  # fmt: skip
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    torch.manual_seed(args.seed)
    wall_start = time.time()
    env_id, env_kwargs, head, start_seed, (obs, targets) = start_data(args.model_path)
    env = make_env(env_id, num_envs=args.num_envs, seed=args.seed + 20_000, **env_kwargs)
    eval_seed = start_seed + 10_000  # bc.py's and fewshot.py's evaluation episodes: the start's score is comparable
    eval_env = make_env(env_id, num_envs=args.num_eval_envs, seed=eval_seed, **env_kwargs)
    policy = make_policy(env.single_observation_space, env.single_action_space, head, model_path=args.model_path)
    all_obs, all_targets = obs, targets  # the aggregate dataset
    demo_samples = len(targets)

    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=args.learning_rate)
    generator = torch.Generator().manual_seed(args.seed)
    budget_s, cpu_start = 60.0 * args.cpu_minutes, time.process_time()
    next_obs, _ = env.reset(seed=args.seed + 20_000)
    rounds, updates, curve = 0, 0, []
    while time.process_time() - cpu_start < budget_s:
        policy.eval()
        new_obs, new_targets, next_obs = label_rollout(policy, env, next_obs, args.round_steps, args.rollout_actions)
        all_obs, all_targets = torch.cat([all_obs, new_obs]), torch.cat([all_targets, new_targets])
        valid = torch.ones(all_targets.shape[:2], dtype=torch.bool)  # (a chunk of one: every label is valid)
        policy.train()
        loss = None  # (a round whose rollout used up the budget makes no update, and records no loss)
        for _ in range(args.updates_per_round):
            spent = (time.process_time() - cpu_start) / budget_s
            if spent >= 1.0:
                break
            optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - spent)
            index = torch.randint(len(all_targets), (args.batch_size,), generator=generator)
            loss = bc_loss(policy, all_obs[index], all_targets[index], valid[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            updates += 1
        rounds += 1
        loss = None if loss is None else loss.item()
        curve.append({"round": rounds, "samples": len(all_targets), "updates": updates, "loss": loss})
        print(f"round {rounds}: {len(all_targets)} samples, {updates} updates, loss "
              f"{'- (no update)' if loss is None else f'{loss:.4f}'}, "
              f"{(time.process_time() - cpu_start) / 60:.1f} of {args.cpu_minutes} CPU min")  # fmt: skip
    cpu_s, wall_s = time.process_time() - cpu_start, time.time() - wall_start

    out = Path(args.out)
    policy.save_pretrained(out)
    saved = make_policy(env.single_observation_space, env.single_action_space, head, model_path=str(out))
    with torch.no_grad():
        result = evaluate_policy(saved.eval(), eval_env, args.eval_episodes, eval_seed)
    report = {
        "eval": result,
        "rounds": rounds,
        "updates": updates,
        "demo_samples": demo_samples,
        "samples": len(all_targets),
        "env_steps": rounds * args.round_steps * args.num_envs,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "curve": curve,
        "args": dataclasses.asdict(args),
    }
    (out / "dagger.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {out}: eval success {result['success_rate']:.3f}, {rounds} rounds, {cpu_s / 60:.1f} CPU min")
    env.close()
    eval_env.close()
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
