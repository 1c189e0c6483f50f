"""Scripted-expert demonstrations, recorded episode by episode with their task: the pretraining corpus
(``pretrain.py``) and the few demonstrations per task a few-shot run learns from (``fewshot.py``).

    uv run python examples/hf_vla/demos.py --out runs/demos_s1.pt --per-task 10 --seed 1 \\
        --env-kwargs '{"obs_mode": "proprio+rgb", "image_size": 64, "action_mode": "ee_delta_pos",
                       "tasks": ["forward_right", "back_left"], "view_tasks": ["forward", "left", "back", "right"]}'

``record`` runs the scripted expert (``push_cube.expert_action``, privileged, >= 0.99 success) in a PushCube
env and keeps whole episodes: with ``per_task`` the first that many *successful* episodes of each task (in the order
they ended), with ``episodes`` the first that many finished ones, successful or not (with ``noise`` the env executes
the expert's action plus N(0, noise^2), DART; the label stays the clean action). Every step of a kept episode is a
sample: the observation, the expert's action, the task and the episode's index among its task's kept episodes
(``demo``). A seed gives the same episodes in every observation mode, and the first K of a task's episodes do not
depend on how many were recorded: the K demonstrations of a few-shot run are the first K of the file whatever
``--per-task`` was.

The file (``torch.save``, read with ``weights_only=True``): ``obs`` (the observations' tensors, a dict of them; an
env whose observation is one tensor, PushCubeRL's default ``obs_mode="state"``, gives that tensor [S, ...], and
``load_demos`` reads it back as one), ``actions`` [S, D], ``task`` [S], ``demo`` [S], ``meta`` (env id and options,
seed, noise, per task, the task names). ``fewshot.py`` needs the images of its base's env options and refuses a file
recorded without them (naming ``obs_mode``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared.atomic_files import atomic_save
from cleanrl_embodied.shared.cli import check_args, fail
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.push_cube import expert_action

__all__ = ["Args", "load_demos", "record"]

TARGET_ENV = {"obs_mode": "proprio+rgb", "image_size": 64, "action_mode": "ee_delta_pos",
              "tasks": ["forward_right", "back_left"], "view_tasks": ["forward", "left", "back", "right"]}  # fmt: skip
"""The few-shot target of docs/VLA.md: two diagonal pushes that pretrain.py holds out, seen through PushCubeLangRL's
window"""


@dataclass
class Args:
    out: str = "runs/hf_vla_demos.pt"
    """the file the demonstrations are written to"""
    per_task: int = 10
    """successful expert episodes kept per task (a few-shot run takes the first --k of them)"""
    seed: int = 1
    """seed of the episodes' starts (and of the noise)"""
    env_id: str = "PushCubeLangRL"
    """a PushCube task with a scripted expert"""
    env_kwargs: str = json.dumps(TARGET_ENV)
    """JSON keyword arguments of the env (the few-shot target: two diagonal tasks pretrain.py holds out)"""
    noise: float = 0.0
    """std of Gaussian noise on the executed action (DART); the label stays the expert's clean action"""
    num_envs: int = 16
    """parallel envs recording"""


def record(env, seed: int, per_task: int | None = None, episodes: int | None = None, noise: float = 0.0) -> dict:
    """Run the expert in ``env`` (reset with ``seed``) until ``per_task`` successful episodes of every task (or
    ``episodes`` finished ones) have ended; return ``{"obs": TensorDict [S] (a tensor [S, ...] where the env's
    observation is one), "actions": [S, D], "task": [S], "demo": [S]}`` for the steps of the kept episodes, episode
    after episode in the order they ended (``demo``: the episode's index among its task's kept ones)."""
    if (per_task is None) == (episodes is None):
        raise ValueError("record: give per_task or episodes")
    raw = env.unwrapped
    names = raw.task_names or ("task",)
    obs, _ = env.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (env.single_action_space.low,
                                                                   env.single_action_space.high))  # fmt: skip
    n = env.num_envs
    current = torch.arange(n)  # each env's episode id
    next_id, steps, ended = n, [], []  # ended: (episode id, task, success) in the order they ended
    counts = torch.zeros(len(names), dtype=torch.long)
    while (counts < per_task).any() if per_task is not None else len(ended) < episodes:
        action = expert_action(env)
        task = raw.task.clone() if raw.task_names else torch.zeros(n, dtype=torch.long)
        steps.append((obs, action, task, current.clone()))
        if noise > 0:
            action = (action + noise * torch.randn(action.shape, generator=generator)).clamp(low, high)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated | truncated
        if done.any():
            rows = done.nonzero().flatten()
            success = info["episode"]["success"][rows] > 0
            for row, ok in zip(rows.tolist(), success.tolist()):
                ended.append((int(current[row]), int(task[row]), ok))
                if ok:
                    counts[task[row]] += 1
            current[rows] = next_id + torch.arange(len(rows))
            next_id += len(rows)
    kept, per = {}, torch.zeros(len(names), dtype=torch.long)  # episode id -> (rank, demo index within its task)
    for episode_id, task_id, ok in ended:
        if per_task is not None and (not ok or per[task_id] >= per_task):
            continue
        if episodes is not None and len(kept) >= episodes:
            break
        kept[episode_id] = (len(kept), int(per[task_id]))
        per[task_id] += 1
    obs = torch.stack([s[0] for s in steps]).flatten(0, 1)  # time-major: an episode's steps in order
    actions, task, episode = (torch.stack([s[i] for s in steps]).flatten(0, 1) for i in (1, 2, 3))
    lookup = torch.full((next_id,), -1, dtype=torch.long)
    demo = torch.full((next_id,), -1, dtype=torch.long)
    for episode_id, (rank, index) in kept.items():
        lookup[episode_id], demo[episode_id] = rank, index
    rank = lookup[episode]
    keep = torch.nonzero(rank >= 0).flatten()
    order = keep[torch.sort(rank[keep], stable=True).indices]  # episode after episode, each in time order
    return {"obs": obs[order], "actions": actions[order], "task": task[order], "demo": demo[episode[order]]}


def load_demos(path: str, k: int | None = None, flag: str = "--demos") -> tuple[dict, dict]:
    """``(samples, meta)`` of a demonstrations file, with ``k``: the first ``k`` episodes of each task; one line
    naming ``flag`` or ``--k`` when the file is not one or holds fewer."""
    file = Path(path)
    if not file.is_file():
        fail(f"{flag} {path}: no such file (record one with examples/hf_vla/demos.py)")
    try:
        data = torch.load(file, map_location="cpu", weights_only=True)
        meta, size = data["meta"], len(data["actions"])
        obs = data["obs"] if torch.is_tensor(data["obs"]) else TensorDict(data["obs"], batch_size=[size])
        samples = {"obs": obs, "actions": data["actions"], "task": data["task"], "demo": data["demo"]}
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused the same way
        fail(f"{flag} {path}: not a demonstrations file of examples/hf_vla/demos.py ({type(e).__name__})")
    if k is not None:
        if k > meta["per_task"]:
            fail(f"--k {k}: {path} holds {meta['per_task']} demonstrations per task (record more with demos.py)")
        keep = samples["demo"] < k
        samples = {name: value[keep] for name, value in samples.items()}
    return samples, meta


def main(args: Args) -> dict:
    check_args(args, positive=("per_task", "num_envs"), non_negative=("noise", "seed"), sizes=(),
               json_objects=("env_kwargs",))  # fmt: skip
    if "PushCube" not in args.env_id:
        fail(f"--env-id {args.env_id}: the scripted expert drives PushCubeRL and PushCubeLangRL only")
    env_kwargs = json.loads(args.env_kwargs)
    try:
        env = make_env(args.env_id, num_envs=args.num_envs, seed=args.seed, **env_kwargs)
    except (TypeError, ValueError) as e:
        fail(f"--env-kwargs / --env-id {args.env_id}: {e}")
    samples = record(env, args.seed, per_task=args.per_task, noise=args.noise)
    env.close()
    names = list(env.unwrapped.task_names or ("task",))
    meta = {"env_id": args.env_id, "env_kwargs": env_kwargs, "seed": args.seed, "noise": args.noise,
            "per_task": args.per_task, "task_names": names, "source": "examples/hf_vla/demos.py"}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    obs = samples["obs"] if torch.is_tensor(samples["obs"]) else samples["obs"].to_dict()  # (obs_mode "state")
    atomic_save({**{k: v for k, v in samples.items() if k != "obs"}, "obs": obs, "meta": meta}, out)
    print(f"{out}: {len(samples['actions'])} samples, {args.per_task} episodes of each of {', '.join(names)}")
    return meta


if __name__ == "__main__":
    main(tyro.cli(Args))
