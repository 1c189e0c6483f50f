"""Few-shot supervised fine-tuning of a pretrained VLA: LoRA on K scripted demonstrations per task of a task the
pretraining held out (the start RL fine-tunes), and the same training continued (the control RL is compared with).

    uv run python examples/hf_vla/pretrain.py --out runs/pretrained
    uv run python examples/hf_vla/demos.py --out runs/demos_s1.pt --per-task 10 --seed 1
    uv run python examples/hf_vla/fewshot.py --base runs/pretrained/proprio_rgb --demos runs/demos_s1.pt --k 1 \\
        --out runs/fewshot_k1_s1
    uv run python examples/hf_vla/fewshot.py --start runs/fewshot_k1_s1 --cpu-minutes 3 --out runs/sft_more_k1_s1

1. The model: ``--base`` (a ``pretrain.py`` layout directory, marked by its ``pretrained.json``) or ``--start`` (a
   ``fewshot.py`` output), loaded as the RL trainers load a model (``make_policy(model_path=...)``: the merged
   backbone, fresh zero-effect LoRA adapters, its heads and its dataset statistics, which stay as they are: the
   bins keep the meaning pretraining gave them). Only the adapters and heads train.
2. The data: the first ``--k`` episodes of each task of ``--demos`` (``demos.py``; its env options must be the
   base's, the top camera's window included). With ``--start``: the start's demonstrations, K and augmentation.
3. Training: Adam on ``bc.py``'s loss (cross-entropy over the bins of the expert's actions) on minibatches drawn
   with replacement, each sample augmented afresh (``--state-noise``: Gaussian noise on the state, in units of the
   statistics' scale; ``--image-shift``: the images moved by up to that many pixels, edges repeated), the learning
   rate annealed linearly to 0 over ``--steps``, or over ``--cpu-minutes`` of this process's CPU time (a budget:
   the control gets the CPU time of the RL runs it is compared with); ``--eval-every`` adds a success curve.
4. ``--out``: ``save_pretrained`` and ``fewshot.json`` (what the start was made of, its deterministic success on
   ``--eval-episodes`` fresh episodes of the demonstrations' env, the loss curve, CPU minutes). DAgger
   (``dagger.py --model-path``) and the RL trainers start from it.

Resume: ``<out>/checkpoint.pt`` every ``--save-every`` steps and on a stop (Ctrl-C, SIGTERM; exit status 128 + the
signal's number); ``--resume`` it with the same arguments: a ``--steps`` run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared.atomic_files import atomic_save
from cleanrl_embodied.shared.checkpoints import load_model_state
from cleanrl_embodied.shared.cli import check_args, fail
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.model_state import frozen_fingerprint, model_state
from cleanrl_embodied.shared.stop_signals import StopFlag
from examples.hf_vla.bc import bc_loss, evaluate_policy
from examples.hf_vla.demos import load_demos
from examples.hf_vla.factory import RUN_KWARGS, make_policy
from examples.hf_vla.model import HFVLAPolicy
from examples.hf_vla.pretrain import MARKER, load_resume, recorded_args

REPORT = "fewshot.json"
SAME_ENV = ("obs_mode", "image_size", "action_mode", "obs_cameras", "view_tasks")  # what the base was trained to see
ENV_DEFAULTS = {"obs_mode": "state", "obs_cameras": ["top"], "view_tasks": None}  # the PushCube envs' defaults


@dataclass
class Args:
    base: str | None = None
    """the pretrained model: a pretrain.py layout directory (e.g. runs/pretrained/proprio_rgb)"""
    start: str | None = None
    """instead of --base: a fewshot.py output to train further on its own demonstrations (the control)"""
    demos: str | None = None
    """the demonstrations file (demos.py) of the target task (with --base)"""
    k: int = 1
    """demonstrations per task: the first K episodes of each task in --demos (with --base)"""
    out: str = "runs/hf_vla_fewshot"
    """directory the fine-tuned model is saved to (save_pretrained), with fewshot.json and checkpoint.pt"""
    seed: int = 1
    """seed of the minibatches, the augmentation and the evaluation episodes"""
    steps: int = 400
    """Adam steps (ignored with --cpu-minutes)"""
    cpu_minutes: float | None = None
    """train until this process has used this many CPU minutes instead of --steps (the control's budget)"""
    batch_size: int = 32
    """samples per step (drawn with replacement)"""
    learning_rate: float = 3e-4
    """Adam learning rate of the adapters and heads, annealed linearly to 0"""
    state_noise: float = 0.1
    """augmentation: std of Gaussian noise added to the state, in units of the statistics' scale (with --base)"""
    image_shift: int = 2
    """augmentation: images moved by up to this many pixels each way, edges repeated (with --base)"""
    policy_kwargs: str = "{}"
    """JSON run options of make_policy (lora_rank, lora_alpha, lora_targets, init_seed)"""
    eval_episodes: int = 128
    """episodes of the final evaluation"""
    eval_every: int = 0
    """also evaluate every this many steps on --curve-episodes (the success curve; its CPU time is not charged to
    --cpu-minutes; 0: only at the end)"""
    curve_episodes: int = 64
    """episodes of each evaluation of the curve"""
    num_eval_envs: int = 64
    """parallel evaluation envs"""
    save_every: int = 100
    """write <out>/checkpoint.pt every this many steps (and on a stop)"""
    resume: str | None = None
    """continue from this checkpoint.pt (the same arguments but --steps)"""


def augment(policy: HFVLAPolicy, obs: TensorDict, state_noise: float, shift: int, generator) -> TensorDict:
    """``obs`` with noise on the state (``state_noise`` times the statistics' scale) and every image moved by a
    whole number of pixels in [-shift, shift] per axis (one draw per sample, the same for all its cameras)."""
    obs = obs.clone()
    if state_noise > 0 and "state" in obs.keys():
        noise = torch.randn(obs["state"].shape, generator=generator)
        obs["state"] = obs["state"] + state_noise * policy.state_scale * noise
    if shift > 0:
        moves = torch.randint(-shift, shift + 1, (obs.shape[0], 2), generator=generator)
        for camera in policy.config.cameras:
            image = F.pad(obs[camera].float(), (shift,) * 4, mode="replicate")
            size = obs[camera].shape[-2:]
            rows = (torch.arange(size[0]) + shift - moves[:, :1]).view(-1, 1, size[0], 1)
            cols = (torch.arange(size[1]) + shift - moves[:, 1:]).view(-1, 1, 1, size[1])
            batch = torch.arange(obs.shape[0]).view(-1, 1, 1, 1)
            channel = torch.arange(image.shape[1]).view(1, -1, 1, 1)
            obs[camera] = image[batch, channel, rows, cols].to(obs[camera].dtype)
    return obs


def setup(args: Args) -> tuple[dict, str, dict, dict]:
    """Check the arguments; ``(the recipe: base, demos, k, augmentation; the model directory to load; the demos
    samples; their meta)``, each refusal one line."""
    check_args(args, positive=("k", "steps", "batch_size", "learning_rate", "eval_episodes", "num_eval_envs",
                               "save_every", "cpu_minutes", "curve_episodes"),
               non_negative=("seed", "state_noise", "image_shift", "eval_every"), sizes=(),
               json_objects=("policy_kwargs",), files=("resume",), env_id=False)  # fmt: skip
    if (args.base is None) == (args.start is None):
        fail("give one of --base (a pretrain.py output) and --start (a fewshot.py output)")
    unknown = sorted(set(json.loads(args.policy_kwargs)) - set(RUN_KWARGS) - {"model_path"})
    if unknown or "model_path" in json.loads(args.policy_kwargs):
        fail(f"--policy-kwargs: only run options ({', '.join(k for k in RUN_KWARGS if k != 'model_path')}) here, "
             f"got {sorted(json.loads(args.policy_kwargs))}")  # fmt: skip
    if args.start is not None:
        file = Path(args.start, REPORT)
        if not file.is_file():
            fail(f"--start {args.start}: no {REPORT} (a fewshot.py --out directory is expected)")
        recipe = {**json.loads(file.read_text())["recipe"], "start": args.start}
        model_dir = args.start
    else:
        marker = Path(args.base, MARKER)
        if not marker.is_file():
            fail(f"--base {args.base}: not a pretraining output (no {MARKER}; pretrain.py writes one per layout "
                 "directory, e.g. <out>/proprio_rgb)")  # fmt: skip
        if args.demos is None:
            fail("--demos: the demonstrations file (demos.py) is needed with --base")
        recipe = {"base": args.base, "demos": args.demos, "k": args.k, "state_noise": args.state_noise,
                  "image_shift": args.image_shift, "pretrained": json.loads(marker.read_text())}  # fmt: skip
        model_dir = args.base
    samples, meta = load_demos(recipe["demos"], recipe["k"])
    base_env = recipe["pretrained"]["env_kwargs"]
    for key in SAME_ENV:
        theirs, ours = meta["env_kwargs"].get(key, ENV_DEFAULTS.get(key)), base_env.get(key, ENV_DEFAULTS.get(key))
        if theirs != ours:
            fail(f"--demos {recipe['demos']}: recorded with {key} {theirs!r}, the base {recipe['base']} was "
                 f"pretrained with {ours!r} (record them with the base's env options)")  # fmt: skip
    return recipe, model_dir, samples, meta


def main(args: Args) -> dict:
    recipe, model_dir, samples, meta = setup(args)
    cpu_start, wall_start = time.process_time(), time.time()
    out = Path(args.out)
    ckpt = load_resume(args, "fewshot.py") if args.resume else None
    torch.manual_seed(args.seed)
    env_kwargs = {k: v for k, v in meta["env_kwargs"].items()}
    eval_seed = args.seed + 10_000
    try:
        eval_env = make_env(meta["env_id"], num_envs=args.num_eval_envs, seed=eval_seed, **env_kwargs)
    except (TypeError, ValueError) as e:
        fail(f"--demos {recipe['demos']}: its env options do not build an env here ({e})")
    bins = json.loads(Path(model_dir, "vla_config.json").read_text())["action_bins"]
    head = SimpleNamespace(action_head="bins", action_bins=bins, action_chunk=1)
    run_kwargs = json.loads(args.policy_kwargs)
    policy = make_policy(eval_env.single_observation_space, eval_env.single_action_space, head,
                         model_path=model_dir, **run_kwargs)  # fmt: skip
    obs, actions = samples["obs"], samples["actions"].unsqueeze(1)  # a chunk of one
    valid = torch.ones(actions.shape[:2], dtype=torch.bool)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=args.learning_rate)
    generator = torch.Generator().manual_seed(args.seed)
    step, curve, spent = 0, [], 0.0
    if ckpt is not None:
        load_model_state(policy, ckpt, "resume", args.resume)
        optimizer.load_state_dict(ckpt["optimizer"])
        generator.set_state(ckpt["generator"])
        step, curve, spent = ckpt["step"], ckpt["curve"], ckpt["cpu_s"]
    budget_s = 60.0 * args.cpu_minutes if args.cpu_minutes is not None else None
    train_start = time.process_time() - spent  # this process's clock, shifted by what earlier processes spent
    print(f"{len(actions)} samples ({recipe['k']} per task of {', '.join(meta['task_names'])}) from "
          f"{recipe['demos']}; {sum(p.numel() for p in trainable)} parameters train", flush=True)  # fmt: skip

    def save_checkpoint() -> None:
        atomic_save({"step": step, "model": model_state(policy), "frozen": frozen_fingerprint(policy),
                     "optimizer": optimizer.state_dict(), "generator": generator.get_state(), "curve": curve,
                     "cpu_s": time.process_time() - train_start, "args": recorded_args(args)},
                    out / "checkpoint.pt")  # fmt: skip

    def progress() -> float:
        if budget_s is None:
            return step / args.steps
        return (time.process_time() - train_start) / budget_s

    out.mkdir(parents=True, exist_ok=True)
    with StopFlag(print) as stop:
        while progress() < 1.0:
            optimizer.param_groups[0]["lr"] = args.learning_rate * max(0.0, 1.0 - progress())
            step += 1
            index = torch.randint(len(actions), (args.batch_size,), generator=generator)
            batch = augment(policy, obs[index], recipe["state_noise"], recipe["image_shift"], generator)
            loss = bc_loss(policy, batch, actions[index], valid[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 25 == 0:
                curve.append({"step": step, "loss": loss.item(), "cpu_s": time.process_time() - train_start})
            if args.eval_every and step % args.eval_every == 0:
                evaluation_start = time.process_time()
                with torch.no_grad():
                    result = evaluate_policy(policy.eval(), eval_env, args.curve_episodes, eval_seed)
                policy.train()
                train_start += time.process_time() - evaluation_start  # (not charged to the budget)
                curve.append({"step": step, "success_rate": result["success_rate"],
                              "cpu_s": time.process_time() - train_start})  # fmt: skip
            if stop.requested or step % args.save_every == 0:
                save_checkpoint()
            if stop.requested:
                print(f"stopped at step {step}: resume with --resume {out / 'checkpoint.pt'}")
                sys.exit(stop.exit_status)
    train_cpu_s = time.process_time() - train_start
    save_checkpoint()
    policy.save_pretrained(out)
    saved = make_policy(eval_env.single_observation_space, eval_env.single_action_space, head, model_path=str(out),
                        **run_kwargs)  # fmt: skip
    with torch.no_grad():
        result = evaluate_policy(saved.eval(), eval_env, args.eval_episodes, eval_seed)
    eval_env.close()
    report = {"eval": result, "recipe": recipe, "env_id": meta["env_id"], "env_kwargs": env_kwargs,
              "samples": len(actions), "steps": step, "train_cpu_s": train_cpu_s,
              "cpu_s_this_process": time.process_time() - cpu_start, "wall_s_this_process": time.time() - wall_start,
              "curve": curve, "args": dataclasses.asdict(args)}  # fmt: skip
    (out / REPORT).write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {out}: eval success {result['success_rate']:.3f}, {step} steps, {train_cpu_s / 60:.2f} CPU min")
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
