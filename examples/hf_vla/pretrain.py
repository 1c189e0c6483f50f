"""Pretraining of the tiny VLA: every weight of the config-built backbone and of the heads trained on a broad corpus
of scripted-expert episodes, saved as directories that ``--policy-kwargs '{"model_path": ...}'`` loads as it loads
a released VLA (docs/VLA.md).

    uv run python examples/hf_vla/pretrain.py --out runs/hf_vla_pretrained
    uv run python examples/hf_vla/fewshot.py --base runs/hf_vla_pretrained/proprio_rgb --demos runs/demos.pt --k 1

1. Corpus: the scripted expert (``demos.record``, DART noise ``--demo-noise``: the env runs the expert's action plus
   noise, the label stays the clean action) on ``--episodes`` episodes of PushCubeLangRL's ``--tasks`` from many
   starts, recorded in ``state+rgb`` (the ``proprio+rgb`` state is its first 17 entries), plus ``--wrist-episodes``
   recorded with both cameras (``obs_cameras`` top and wrist). Every step is a sample. The top camera sees the table
   through the window of ``--view-tasks`` (PushCubeLangRL's), whatever the tasks.
2. Words: each sample's instruction is drawn anew at every step from many phrasings of its task (``phrasings``:
   verbs, nouns and direction words; the training instruction is one of them). Held out: PushCubeLangRL's held-out
   paraphrases (``HELDOUT_INSTRUCTIONS``, every task's) are never shown, and the ``--heldout-tasks`` (the diagonal
   pushes forward-right and back-left by default) are not in the corpus at all. The fresh tokenizer learns its words
   from the phrasings and paraphrases (as a pretrained tokenizer knows words a fine-tuning run never shows).
3. Model: one backbone (``make_policy``'s fresh tiny PaliGemma, ``--policy-kwargs`` for its size) shared by one
   policy per observation layout (``LAYOUTS``: ``proprio_rgb``, ``state_rgb``, ``proprio_rgb_wrist``), which share
   the action head's slot queries and token delta too; each state size has its own state projection and its own
   dataset statistics (of the corpus). Every backbone and head parameter trains (the LoRA adapters stay at zero).
4. Training: ``--steps`` AdamW steps, each on a minibatch of one layout (``--schedule``, cycled), of the bins
   head's cross-entropy (the bin of the expert's normalised action) plus ``--loc-weight`` times a localisation loss:
   a linear probe on the action slots' mean hidden state regresses where the cube is and where it lies from the TCP
   (xy, standardised), as VLM pretraining teaches localisation (PaliGemma's detection prefixes), so that the vision
   tower learns to see the cube (without it, behaviour cloning from pixels stays at 0). The probe is not saved.
5. ``--out``: per layout ``<out>/<layout>/`` (``save_pretrained``: config.json, model.safetensors, tokenizer,
   heads, vla_config.json, dataset_statistics.json, and ``pretrained.json``, what marks a pretraining output for
   fewshot.py), and ``<out>/pretrain.json``: success of each saved layout on the pretraining tasks (training
   instruction and held-out paraphrases) and on the held-out tasks, the loss curve, CPU minutes.

Resume: ``<out>/checkpoint.pt`` is written every ``--save-every`` steps and when a stop is requested (Ctrl-C,
SIGTERM: the step finishes, the checkpoint is written, the exit status is 128 + the signal's number); ``--resume
<out>/checkpoint.pt`` records the same corpus again and continues bit for bit where the straight run would be.
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
import torch.nn as nn
import tyro
from tensordict import TensorDict

from cleanrl_embodied.shared.atomic_files import atomic_save
from cleanrl_embodied.shared.cli import check_args, fail
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.push_cube import HELDOUT_INSTRUCTIONS, LANG_TASKS, PROPRIO_DIM, TASKS
from cleanrl_embodied.shared.language import encode_instructions
from cleanrl_embodied.shared.model_state import model_state
from cleanrl_embodied.shared.stop_signals import StopFlag
from examples.hf_vla.bc import evaluate_policy
from examples.hf_vla.demos import record
from examples.hf_vla.factory import make_policy
from examples.hf_vla.model import HFVLAPolicy
from examples.hf_vla.statistics import DatasetStatistics

PRETRAIN_TASKS = ("forward", "left", "back", "right", "forward_left", "back_right")
HELDOUT_TASKS = ("forward_right", "back_left")
LAYOUTS = {"proprio_rgb": ("proprio+rgb", ("top",)), "state_rgb": ("state+rgb", ("top",)),
           "proprio_rgb_wrist": ("proprio+rgb", ("top", "wrist"))}  # fmt: skip
"""layout (the output's subdirectory) -> (obs_mode, obs_cameras)"""
MARKER = "pretrained.json"
INSTRUCTION_LENGTH = 32  # PushCubeLangRL's instruction bytes
VERBS = ("push", "move", "shove", "slide", "nudge")
NOUNS = ("cube", "block", "box")
SIDES = {"forward": ("forward", "ahead", "to the front"), "back": ("back", "backward", "to the back"),
         "left": ("to the left", "left", "leftward"), "right": ("to the right", "right", "rightward")}  # fmt: skip


def phrasings(task: str) -> list[str]:
    """The instructions of ``task`` the corpus shows: every "<verb> the <noun> <direction>" of ``VERBS``, ``NOUNS``
    and the task's direction words (a diagonal: "<forward or back> and <side>") that fits PushCubeLangRL's 32 bytes,
    except every held-out paraphrase (``HELDOUT_INSTRUCTIONS``). The training instruction is among them."""
    parts = task.split("_")
    if len(parts) == 1:
        directions = SIDES[task]
    else:
        directions = tuple(f"{a} and {b}" for a in SIDES[parts[0]][:2] for b in SIDES[parts[1]])
    held = {text for phrases in HELDOUT_INSTRUCTIONS.values() for text in phrases}
    texts = [f"{verb} the {noun} {direction}" for verb in VERBS for noun in NOUNS for direction in directions]
    texts = [t for t in texts if len(t.encode()) <= INSTRUCTION_LENGTH and t not in held]
    assert TASKS[task][1] in texts, task
    return texts


@dataclass
class Args:
    out: str = "runs/hf_vla_pretrained"
    """directory of the outputs: one model directory per layout, pretrain.json, checkpoint.pt"""
    seed: int = 0
    """seed of the corpus, the minibatches and the phrasings drawn"""
    tasks: tuple[str, ...] = PRETRAIN_TASKS
    """the pretraining tasks (names of PushCubeLangRL's TASKS)"""
    heldout_tasks: tuple[str, ...] = HELDOUT_TASKS
    """tasks kept out of the corpus, evaluated zero-shot (the few-shot target of docs/VLA.md)"""
    view_tasks: tuple[str, ...] = LANG_TASKS
    """the tasks whose goal regions the top camera's window covers (the same window for every task set)"""
    layouts: tuple[str, ...] = tuple(LAYOUTS)
    """observation layouts to pretrain and save (keys of LAYOUTS)"""
    schedule: tuple[str, ...] = ("proprio_rgb", "proprio_rgb", "state_rgb", "proprio_rgb_wrist")
    """the layout of each step's minibatch, cycled (layouts not in --layouts are skipped)"""
    episodes: int = 3000
    """corpus episodes recorded with the top camera (every step a sample)"""
    wrist_episodes: int = 750
    """corpus episodes recorded with both cameras (for the proprio_rgb_wrist layout)"""
    demo_noise: float = 0.3
    """DART noise of the corpus (std of the noise on the executed action; the label stays clean)"""
    num_envs: int = 64
    """parallel envs recording the corpus"""
    image_size: int = 64
    """image size of the corpus (and of every env the saved models serve)"""
    action_bins: int = 16
    """bins per action entry of the bins head (the trainers' --action-bins)"""
    policy_kwargs: str = "{}"
    """JSON keyword arguments of the fresh model (make_policy: hidden_size, num_layers, ...; no model_path)"""
    steps: int = 20000
    """AdamW steps"""
    batch_size: int = 64
    """samples per step"""
    learning_rate: float = 1e-3
    """peak learning rate (linear warm-up over --warmup-steps, then linear decay to 0)"""
    warmup_steps: int = 200
    """steps of the learning rate's warm-up"""
    max_grad_norm: float = 1.0
    """gradient clipping"""
    loc_weight: float = 1.0
    """weight of the localisation loss (0: behaviour cloning alone)"""
    eval_every: int = 0
    """evaluate the first layout on the pretraining tasks every this many steps (the curve; 0: only at the end)"""
    eval_episodes: int = 128
    """episodes of each evaluation"""
    num_eval_envs: int = 64
    """parallel evaluation envs"""
    save_every: int = 1000
    """write <out>/checkpoint.pt every this many steps (and on a stop)"""
    resume: str | None = None
    """continue from this checkpoint.pt (the same arguments but --steps, which may grow)"""


def env_options(args: Args, layout: str) -> dict:
    """The env options a saved layout serves (besides tasks): what the corpus was recorded with."""
    obs_mode, cameras = LAYOUTS[layout]
    return {"obs_mode": obs_mode, "image_size": args.image_size, "action_mode": "ee_delta_pos",
            "obs_cameras": list(cameras), "view_tasks": list(args.view_tasks)}  # fmt: skip


def check(args: Args) -> None:
    check_args(args, positive=("episodes", "num_envs", "image_size", "action_bins", "steps", "batch_size",
                               "learning_rate", "max_grad_norm", "eval_episodes", "num_eval_envs", "save_every"),
               non_negative=("seed", "wrist_episodes", "demo_noise", "warmup_steps", "loc_weight", "eval_every"),
               sizes=(), json_objects=("policy_kwargs",), files=("resume",), env_id=False)  # fmt: skip
    for flag, names, allowed in (("--tasks", args.tasks, TASKS), ("--heldout-tasks", args.heldout_tasks, TASKS),
                                 ("--view-tasks", args.view_tasks, TASKS), ("--layouts", args.layouts, LAYOUTS),
                                 ("--schedule", args.schedule, LAYOUTS)):  # fmt: skip
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            fail(f"{flag} {' '.join(unknown) or '(none)'}: must name some of {', '.join(allowed)}")
    if set(args.tasks) & set(args.heldout_tasks):
        fail(f"--heldout-tasks {' '.join(sorted(set(args.tasks) & set(args.heldout_tasks)))}: also in --tasks")
    if not set(args.schedule) & set(args.layouts):
        fail(f"--schedule {' '.join(args.schedule)}: names none of --layouts {' '.join(args.layouts)}")
    if "proprio_rgb_wrist" in args.layouts and not args.wrist_episodes:
        fail("--wrist-episodes 0: the proprio_rgb_wrist layout needs them (or leave it out of --layouts)")
    if "model_path" in json.loads(args.policy_kwargs):
        fail("--policy-kwargs: pretraining builds a fresh model; drop model_path")


def record_corpus(args: Args, cameras: tuple[str, ...], episodes: int, seed: int) -> dict:
    """The corpus of one camera set: ``demos.record`` in state+rgb, with each sample's localisation target (cube xy
    and TCP-to-cube xy, raw) taken from its state."""
    options = {**env_options(args, "state_rgb"), "obs_cameras": list(cameras), "tasks": list(args.tasks)}
    env = make_env("PushCubeLangRL", num_envs=args.num_envs, seed=seed, **options)
    samples = record(env, seed, episodes=episodes, noise=args.demo_noise)
    offsets, start = {}, 0
    for _, name, size in env.unwrapped.obs_layout:
        offsets[name], start = start, start + size
    state = samples["obs"]["state"]
    cube, to_cube = offsets["cube_pos"], offsets["tcp_to_cube"]
    samples["loc"] = torch.cat([state[:, cube : cube + 2], state[:, to_cube : to_cube + 2]], -1)
    env.close()
    return samples


def layout_obs(obs: TensorDict, layout: str) -> TensorDict:
    """A corpus batch as the layout's env gives it (proprio: the state's first 17 entries; only its cameras)."""
    obs_mode, cameras = LAYOUTS[layout]
    keep = {"rgb": obs["rgb"], "instruction": obs["instruction"],
            "state": obs["state"][:, :PROPRIO_DIM] if obs_mode == "proprio+rgb" else obs["state"]}  # fmt: skip
    if "wrist" in cameras:
        keep["wrist"] = obs["wrist"]
    return TensorDict(keep, batch_size=obs.batch_size)


def build_policies(args: Args, corpus: dict, wrist: dict | None, texts: list[str]) -> dict[str, HFVLAPolicy]:
    """One fresh policy per layout on one shared backbone and shared action queries and token delta (a state
    projection per state size), each with the corpus's statistics; every base weight and head trains, not the
    (zero) LoRA adapters, nor the heads' frozen reference copy, nor the value head (RL's)."""
    head = SimpleNamespace(action_head="bins", action_bins=args.action_bins, action_chunk=1)
    kwargs = {**json.loads(args.policy_kwargs), "tokenizer_corpus": texts}
    policies, first = {}, None
    for layout in args.layouts:
        env = make_env("PushCubeLangRL", num_envs=1, seed=0, tasks=list(args.tasks), **env_options(args, layout))
        policy = make_policy(env.single_observation_space, env.single_action_space, head, **kwargs)
        env.close()
        source = (wrist if "wrist" in LAYOUTS[layout][1] else corpus)["obs"]
        states = layout_obs(source[:1], layout)["state"].shape[-1]
        stats_states = corpus["obs"]["state"][:, :states]
        policy.set_statistics(DatasetStatistics.of_samples(
            "PushCubeLangRL", corpus["actions"], stats_states, "bounds_q99", "normal",
            num_transitions=len(corpus["actions"]), demo_episodes=args.episodes,
            source=f"examples/hf_vla/pretrain.py: expert corpus (--seed {args.seed}, --demo-noise {args.demo_noise})",
        ))  # fmt: skip
        if first is None:
            first = policy
        else:  # share the backbone (and its adapters), the slot queries and the token delta
            policy.vlm = first.vlm
            policy.action_head.queries = first.action_head.queries
            policy.action_head.token_delta = first.action_head.token_delta
            same = next((p for p in policies.values() if p.config.state_dim == policy.config.state_dim), None)
            if same is not None:
                policy.action_head.state_proj = same.action_head.state_proj
        for name, parameter in policy.named_parameters():
            parameter.requires_grad_(not ("lora_" in name or name.startswith(("reference_head.", "value_head."))))
        policies[layout] = policy
    return policies


def pretrain_loss(policy: HFVLAPolicy, probe: nn.Module, obs: TensorDict, actions: torch.Tensor,
                  loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(cross-entropy of the bins of the expert's actions, mean squared error of the localisation probe)."""
    slots, _ = policy.features(obs, policy.action_head)
    dist = policy._dist(slots, policy.action_head)
    nll = -dist.log_prob(policy.action_bins(actions.view(dist.batch_shape))).mean()
    return nll, ((probe(slots.float().mean(1)) - loc) ** 2).mean()


def evaluate_layouts(args: Args, policies: dict[str, HFVLAPolicy], which: list[str] | None = None) -> dict:
    """Success of each layout's policy (deterministic) on the pretraining tasks with the training instruction and
    with the held-out paraphrases, and on the held-out tasks (zero-shot), the same episodes for every layout."""
    cases = {"pretraining_tasks": (args.tasks, "train"), "pretraining_tasks_heldout_phrasings": (args.tasks, "heldout"),
             "heldout_tasks": (args.heldout_tasks, "train")}  # fmt: skip
    seed, results = args.seed + 10_000, {}
    for layout in which or list(policies):
        policy, results[layout] = policies[layout].eval(), {}
        for case, (tasks, words) in cases.items():
            env = make_env("PushCubeLangRL", num_envs=args.num_eval_envs, seed=seed, tasks=list(tasks),
                           instructions=words, **env_options(args, layout))  # fmt: skip
            with torch.no_grad():
                results[layout][case] = evaluate_policy(policy, env, args.eval_episodes, seed)
            env.close()
        policy.train()
    return results


def recorded_args(args) -> dict:
    """The arguments a checkpoint records, in JSON's types (tuples as lists), so that a resumed run compares like."""
    return json.loads(json.dumps(dataclasses.asdict(args)))


def load_resume(args, script: str) -> dict:
    """``--resume``'s checkpoint (pretrain.py's or fewshot.py's): refused in one line when it is not readable or was
    written with other arguments than ``--steps``, ``--resume`` and ``--out``."""
    try:
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        same = {k: v for k, v in ckpt["args"].items() if k not in ("steps", "resume", "out")}
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused the same way
        fail(f"--resume {args.resume}: not a {script} checkpoint ({type(e).__name__})")
    mine = {k: v for k, v in recorded_args(args).items() if k in same}
    if mine != same:
        differ = sorted(k for k in same if mine.get(k) != same[k])
        fail(f"--resume {args.resume}: written with other arguments ({', '.join(differ)}); pass the same")
    return ckpt


def main(args: Args) -> dict:
    check(args)
    cpu_start, wall_start = time.process_time(), time.time()
    torch.manual_seed(args.seed)
    out = Path(args.out)
    ckpt = load_resume(args, "pretrain.py") if args.resume else None
    if ckpt is not None:
        if ckpt["step"] > args.steps:
            fail(f"--steps {args.steps}: {args.resume} is already at step {ckpt['step']}")
    corpus = record_corpus(args, ("top",), args.episodes, args.seed)
    needs_wrist = "proprio_rgb_wrist" in args.layouts
    wrist = record_corpus(args, ("top", "wrist"), args.wrist_episodes, args.seed + 1) if needs_wrist else None
    loc_mean, loc_std = corpus["loc"].mean(0), corpus["loc"].std(0)
    phrases = {task: phrasings(task) for task in args.tasks}
    held = [t for phrases_ in HELDOUT_INSTRUCTIONS.values() for t in phrases_]
    texts = sorted({t for task in TASKS for t in phrasings(task)} | {text for _, text in TASKS.values()} | set(held))
    policies = build_policies(args, corpus, wrist, texts)
    probe = nn.Linear(policies[args.layouts[0]].backbone.config.get_text_config().hidden_size, 4)
    params = list({id(p): p for policy in policies.values() for p in policy.parameters() if p.requires_grad}.values())
    params += list(probe.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    # the phrasings as instruction tokens [tasks, most phrasings, length], drawn per sample
    width = max(len(p) for p in phrases.values())
    table = torch.zeros((len(args.tasks), width, INSTRUCTION_LENGTH), dtype=torch.long)
    counts = torch.tensor([len(phrases[t]) for t in args.tasks])
    for i, task in enumerate(args.tasks):
        table[i, : counts[i]] = encode_instructions(phrases[task], INSTRUCTION_LENGTH)["input_ids"]
    schedule = [layout for layout in args.schedule if layout in args.layouts]
    step, curve, spent = 0, [], 0.0
    if ckpt is not None:
        for layout, policy in policies.items():
            policy.load_state_dict(ckpt["policies"][layout], strict=False)
        probe.load_state_dict(ckpt["probe"])
        optimizer.load_state_dict(ckpt["optimizer"])
        generator.set_state(ckpt["generator"])
        step, curve, spent = ckpt["step"], ckpt["curve"], ckpt["cpu_s"]
    print(f"corpus: {len(corpus['actions'])} samples (+{len(wrist['actions']) if wrist else 0} with the wrist "
          f"camera), {sum(counts.tolist())} phrasings of {len(args.tasks)} tasks; "
          f"{sum(p.numel() for p in params)} parameters train", flush=True)  # fmt: skip

    def save_checkpoint() -> None:
        atomic_save({"step": step, "policies": {k: model_state(p) for k, p in policies.items()},
                     "probe": probe.state_dict(), "optimizer": optimizer.state_dict(),
                     "generator": generator.get_state(), "curve": curve,
                     "cpu_s": spent + time.process_time() - cpu_start,
                     "args": recorded_args(args)}, out / "checkpoint.pt")  # fmt: skip

    out.mkdir(parents=True, exist_ok=True)
    with StopFlag(print) as stop:
        while step < args.steps:
            step += 1
            layout = schedule[(step - 1) % len(schedule)]
            data = wrist if "wrist" in LAYOUTS[layout][1] else corpus
            index = torch.randint(len(data["actions"]), (args.batch_size,), generator=generator)
            task = data["task"][index]
            phrase = (torch.rand(args.batch_size, generator=generator) * counts[task]).long()
            ids = table[task, phrase]
            obs = layout_obs(data["obs"][index], layout)
            obs["instruction"] = TensorDict(input_ids=ids, attention_mask=(ids > 0).long(), batch_size=[len(ids)])
            warm = min(1.0, step / args.warmup_steps) if args.warmup_steps else 1.0
            optimizer.param_groups[0]["lr"] = args.learning_rate * warm * (1.0 - (step - 1) / args.steps)
            nll, loc = pretrain_loss(policies[layout], probe, obs, data["actions"][index],
                                     (data["loc"][index] - loc_mean) / loc_std)  # fmt: skip
            loss = nll + args.loc_weight * loc
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            evaluate_now = args.eval_every and step % args.eval_every == 0
            if step % 100 == 0 or step == args.steps or evaluate_now:
                entry = {"step": step, "layout": layout, "nll": nll.item(), "loc": loc.item(),
                         "cpu_s": spent + time.process_time() - cpu_start}  # fmt: skip
                if evaluate_now:
                    first = args.layouts[0]
                    result = evaluate_layouts(args, policies, [first])[first]["pretraining_tasks"]
                    entry["success_rate"] = result["success_rate"]
                curve.append(entry)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}),
                      flush=True)  # fmt: skip
            if stop.requested or step % args.save_every == 0:
                save_checkpoint()
            if stop.requested:
                print(f"stopped at step {step}: resume with --resume {out / 'checkpoint.pt'}")
                sys.exit(stop.exit_status)
    save_checkpoint()
    for layout, policy in policies.items():
        policy.save_pretrained(out / layout)
        marker = {"layout": layout, "env_kwargs": env_options(args, layout), "tasks": list(args.tasks),
                  "heldout_tasks": list(args.heldout_tasks), "phrasings": phrases, "heldout_phrasings": held,
                  "source": "examples/hf_vla/pretrain.py"}  # fmt: skip
        (out / layout / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    # the saved directories, loaded as a fine-tuning run loads them, are what the report scores
    loaded = {}
    for layout in args.layouts:
        env = make_env("PushCubeLangRL", num_envs=1, seed=0, tasks=list(args.tasks), **env_options(args, layout))
        head = SimpleNamespace(action_head="bins", action_bins=args.action_bins, action_chunk=1)
        loaded[layout] = make_policy(env.single_observation_space, env.single_action_space, head,
                                     model_path=str(out / layout))  # fmt: skip
        env.close()
    evals = evaluate_layouts(args, loaded)
    cpu_s = spent + time.process_time() - cpu_start
    report = {"eval": evals, "curve": curve, "samples": len(corpus["actions"]),
              "wrist_samples": len(wrist["actions"]) if wrist else 0, "phrasings": sum(counts.tolist()),
              "parameters": sum(p.numel() for p in params) - sum(p.numel() for p in probe.parameters()),
              "cpu_s": cpu_s, "wall_s_this_process": time.time() - wall_start,
              "args": dataclasses.asdict(args)}  # fmt: skip
    (out / "pretrain.json").write_text(json.dumps(report, indent=1) + "\n")
    for layout, cases in evals.items():
        print(f"{layout}: " + ", ".join(f"{case} {r['success_rate']:.3f}" for case, r in cases.items()))
    print(f"saved {out}: {cpu_s / 60:.1f} CPU min")
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
