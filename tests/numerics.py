"""Numeric fingerprints: what each trainer and each built-in env computes, pinned by golden files.

A fingerprint is a short, deterministic CPU run: a few iterations of a trainer at tiny sizes (its per-iteration
scalars: losses, approx_kl, clip fraction, episode returns and successes, the final evaluation; and per-tensor sums of
its final parameters), or a built-in env stepped under a fixed sequence of random actions (per-step sums of every
observation entry, rewards, episode ends and successes). tests/test_numerics.py (`uv run pytest -m numerics`) compares
each with its golden file in tests/golden/ and names the first value that moved; docs/benchmarks.md says how reports
depend on fingerprints and when they go stale.

    uv run pytest -m numerics                      # compare (part of `uv run pytest`)
    uv run pytest -m numerics --update-golden      # write the golden files anew (a commit of its own, saying why)

Tolerance (`RTOL`, `ATOL`): on one machine the runs are bit-identical; on another x86 CPU the kernels torch picks
(AVX-512, AVX2) round differently. Measured on this project's AMD EPYC against golden files written with AVX-512:
with `ATEN_CPU_CAPABILITY=avx2` the largest relative difference was 1.4e-4 (hf_vla; the others were identical), with
`ATEN_CPU_CAPABILITY=default` (no vector kernels at all) 6.6e-4 (ppo_continuous-pixels). A 10% change of a loss
coefficient, a reward weight or GRPO's advantage scale moved some pinned value by 10% or more in every case tried,
so RTOL = 2e-3 sits 3x above the first and 50x below the second (tests/test_numerics.py checks both sides).

The DDP fingerprints run on two ranks under torchrun: `python -m torch.distributed.run --nproc_per_node 2
tests/numerics.py OUT_DIR` runs ppo_ddp and ppo_vla_ddp in one process group and writes their records to OUT_DIR.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
REGENERATE = "uv run pytest -m numerics --update-golden"
RTOL, ATOL = 2e-3, 1e-6
"""A value matches its golden one when |new - golden| <= ATOL + RTOL * |golden|."""
UNPINNED = ("charts/SPS", "charts/learner_wait_s", "charts/policy_staleness", "charts/dropped_rollouts")
"""Scalars that measure time (or what a thread's timing decides), not what the run computes."""

if str(REPO) not in sys.path:  # (as a torchrun worker, this file runs as a script)
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # `--policy toy_policies:ToyVLA`


@dataclass(frozen=True)
class Fingerprint:
    name: str
    kind: str  # "trainer", "trainer-2ranks" or "env"
    target: str  # the script (cleanrl_embodied.<target>) or env id
    config: dict = field(default_factory=dict)
    needs: str | None = None  # an extra the fingerprint needs ("vla"), or "compile" (torch.compile): skipped without

    @property
    def golden(self) -> Path:
        return GOLDEN_DIR / f"{self.name}.json"


EVAL = dict(eval_freq=0, save_freq=0, num_eval_envs=4, num_eval_episodes=4, cuda=False, compile="off", seed=1)
LANG = dict(env_id="PushCubeLangRL", policy="toy_policies:ToyVLA", num_envs=8, num_steps=8, num_minibatches=2,
            update_epochs=4, learning_rate=3e-3, anneal_lr=False, total_timesteps=8 * 8 * 3)  # fmt: skip
# Sizes and learning rates are chosen so that PPO's clipping is active in the pinned iterations: a clip coefficient
# that changes nothing in the run cannot be pinned by it.
PIXELS = json.dumps({"obs_mode": "proprio+rgb", "image_size": 32, "obs_cameras": ["top", "wrist"]})
PRIVILEGED_PIXELS = json.dumps({"obs_mode": "proprio+rgb", "image_size": 32, "privileged_state": True,
                                "max_episode_steps": 10})  # fmt: skip
FEWSHOT_TARGET = {"obs_mode": "proprio+rgb", "image_size": 64, "action_mode": "ee_delta_pos",
                  "tasks": ["forward_right", "back_left"],
                  "view_tasks": ["forward", "left", "back", "right"]}  # fmt: skip
TINY_VLA = json.dumps({"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "patch_size": 8,
                       "action_stats": "env_bounds"})  # fmt: skip
PENDULUM = dict(env_id="Pendulum-v1", num_envs=4, num_steps=100, total_timesteps=4 * 100 * 3, num_minibatches=4,
                update_epochs=4, hidden_sizes=(32, 32), norm_obs=True, norm_reward=True, clip_vloss=True,
                learning_rate=1e-2, gamma=0.99, gae_lambda=0.95, target_kl=None)  # fmt: skip

FINGERPRINTS = {
    f.name: f
    for f in [
        # the classic trainers: Pendulum-v1 goes through the Gymnasium adapter that MuJoCo ids use too
        Fingerprint("ppo_continuous", "trainer", "ppo_continuous", PENDULUM),
        # ... and compiled (--compile on: torch.compile of the policy step, the loss, the clipping and Adam's step):
        # its random draws are eager's (fallback_random), its rounding is not; it matches the eager golden file within
        # the tolerance (tests/test_numerics.py) and its own bit for bit
        Fingerprint("ppo_continuous-compiled", "trainer", "ppo_continuous", dict(PENDULUM, compile="on"),
                    needs="compile"),
        Fingerprint("ppo_continuous-pixels", "trainer", "ppo_continuous", dict(
            env_id="PushCubeRL", env_kwargs=PIXELS, eval_env_kwargs=PIXELS, num_envs=4, num_steps=16,
            total_timesteps=4 * 16 * 2, num_minibatches=2, update_epochs=2, num_eval_envs=2, num_eval_episodes=2)),
        # the recurrent trainer: the POMDP Pendulum without its velocity (the Gymnasium adapter, obs_indices), an
        # LSTM and both normalizers; and a GRU on pixels whose critic reads the privileged state without memory
        Fingerprint("ppo_recurrent", "trainer", "ppo_recurrent", dict(
            env_id="Pendulum-v1", env_kwargs=json.dumps({"obs_indices": [0, 1], "max_episode_steps": 30}), num_envs=4,
            num_steps=50,
            total_timesteps=4 * 50 * 3, num_minibatches=2, update_epochs=4, hidden_sizes=(32,), rnn_hidden_size=16,
            norm_obs=True, norm_reward=True, clip_vloss=True, learning_rate=1e-2, gamma=0.99, gae_lambda=0.95,
            target_kl=None)),
        Fingerprint("ppo_recurrent-gru-pixels", "trainer", "ppo_recurrent", dict(
            env_id="PushCubeRL", env_kwargs=PRIVILEGED_PIXELS, eval_env_kwargs=PRIVILEGED_PIXELS, num_envs=4,
            num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2, update_epochs=2, num_eval_envs=2,
            num_eval_episodes=2, rnn_type="gru", rnn_hidden_size=32, privileged_critic=True, norm_obs=True)),
        Fingerprint("grpo", "trainer", "grpo", dict(
            env_id="PushCubeRL", num_envs=16, group_size=4, num_steps=16, total_timesteps=16 * 16 * 3,
            num_minibatches=2, update_epochs=4, learning_rate=1e-2, hidden_sizes=(32, 32))),
        Fingerprint("ppo_ddp", "trainer-2ranks", "ppo_ddp", dict(
            env_id="PushCubeRL", num_envs=8, num_steps=16, total_timesteps=2 * 8 * 16 * 3, num_minibatches=2,
            update_epochs=4, learning_rate=1e-2, hidden_sizes=(32, 32), norm_obs=True)),
        # the VLA trainers, with a small stand-in for a VLA (tests/toy_policies.py) ...
        Fingerprint("ppo_vla", "trainer", "ppo_vla", dict(LANG, action_head="bins", action_chunk=2,
                                                           micro_batch_size=16, total_timesteps=8 * 8 * 2 * 3)),
        Fingerprint("grpo_vla", "trainer", "grpo_vla", dict(LANG, group_size=4)),
        Fingerprint("ppo_vla_async", "trainer", "ppo_vla_async", dict(LANG)),
        Fingerprint("ppo_vla_ddp", "trainer-2ranks", "ppo_vla_ddp", dict(LANG, action_head="bins",
                                                                          total_timesteps=2 * 8 * 8 * 3)),
        # ... and with the tiny transformers VLA of examples/hf_vla (LoRA, bins over the action tokens, images)
        Fingerprint("hf_vla", "trainer", "ppo_vla", dict(
            LANG, policy="examples.hf_vla:make_policy", policy_kwargs=TINY_VLA, action_head="bins",
            env_kwargs=json.dumps({"obs_mode": "state+rgb", "image_size": 16, "action_mode": "ee_delta_pos"}),
            num_envs=4, num_steps=4, total_timesteps=4 * 4 * 2, num_eval_envs=2, num_eval_episodes=2), needs="vla"),
        # the built-in envs under a fixed action sequence (episodes end and reset within it)
        Fingerprint("env-PushCubeRL", "env", "PushCubeRL", dict(variants=[
            {}, {"action_mode": "ee_delta_pos"}, {"obs_mode": "proprio+rgb", "image_size": 32,
                                                  "obs_cameras": ["top", "wrist"], "privileged_state": True}])),
        Fingerprint("env-PushCubeLangRL", "env", "PushCubeLangRL", dict(variants=[
            {}, {"instructions": "heldout", "obs_mode": "state+rgb", "image_size": 16}])),
        Fingerprint("env-PushCubeRL-dropout", "env", "PushCubeRL", dict(variants=[
            {"dropout_sensor": "cube", "dropout_rate": 0.2},
            {"obs_mode": "proprio+rgb", "image_size": 16, "dropout_sensor": "camera", "dropout_rate": 0.2}])),
        # PushCubeLangRL as the published VLA runs use it (docs/results/vla-fewshot-cpu): the few-shot target (the
        # diagonal tasks forward_right and back_left through the four tasks' camera window, view_tasks) with a 0/1
        # success reward on proprio+rgb and with the held-out paraphrases on state+rgb, and the pretraining's
        # corpus env (the other diagonals, both cameras); 64x64 images, the TCP's motion as the action; driven by the
        # scripted expert (with noise), as demos.py and pretrain.py drive it, so that episodes reach their goals
        Fingerprint("env-PushCubeLangRL-fewshot", "env", "PushCubeLangRL", dict(actions="expert", variants=[
            {**FEWSHOT_TARGET, "reward_weights": {"reach": 0, "place": 0, "time": 0, "success": 1}},
            {**FEWSHOT_TARGET, "obs_mode": "state+rgb", "instructions": "heldout"},
            {**FEWSHOT_TARGET, "tasks": ["forward", "left", "back", "right", "forward_left", "back_right"],
             "obs_cameras": ["top", "wrist"]}])),
    ]
}  # fmt: skip


# ---- records --------------------------------------------------------------------------------------------------------
def tensor_sums(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per floating tensor: [sum, sum of squares] in float64 (names sorted)."""
    out = {}
    for key in sorted(state):
        t = state[key]
        if torch.is_tensor(t) and t.is_floating_point():
            t = t.detach().double()
            out[key] = [float(t.sum()), float((t * t).sum())]
    return out


def trainer_record(run_dir: Path) -> dict:
    """A finished run's pinned scalars per iteration ([[env step, {tag: value}], ...]) and final parameter sums."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    by_step: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        if tag not in UNPINNED and not tag.endswith("_s"):
            for event in acc.Scalars(tag):
                by_step.setdefault(event.step, {})[tag] = event.value
    model = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    return {"iterations": [[step, dict(sorted(by_step[step].items()))] for step in sorted(by_step)],
            "params": tensor_sums(model)}  # fmt: skip


def trainer_args(fp: Fingerprint, out: Path):
    import importlib

    module = importlib.import_module(f"cleanrl_embodied.{fp.target}")
    return module, module.Args(**{**EVAL, **fp.config, "output_dir": str(out)})


def run_trainer(fp: Fingerprint, **overrides) -> dict:
    """Run `fp` in this process (one thread) and return its record; `overrides` replace Args fields (tests use them
    to show that a changed coefficient moves the record)."""
    with tempfile.TemporaryDirectory() as tmp:
        module, args = trainer_args(fp, Path(tmp))
        for key, value in overrides.items():
            setattr(args, key, value)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            module.main(args)
        finally:
            torch.set_num_threads(threads)
        (run_dir,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        return trainer_record(run_dir)


EXPERT_NOISE = 0.3
"""Half-width of the uniform noise on the expert's actions (actions="expert"): episodes still succeed, by other
paths."""


def run_env(fp: Fingerprint, steps: int = 60, num_envs: int = 6, **env_overrides) -> dict:
    """Step each variant of the env with uniform random actions in [-1, 1] from a fixed generator (seed 0), or, with
    `actions="expert"` in the fingerprint's config, with the scripted expert's actions plus EXPERT_NOISE times those
    (episodes that push the cube to its goal: what a task's direction decides shows in the cube's path and in the
    successes). Per step: the sum and sum of squares of every observation entry and of the final observations, the
    reward's, each reward term's, and the counts of terminations, truncations and successes; per finished episode
    its return and success."""
    from cleanrl_embodied import shared
    from cleanrl_embodied.shared.envs.push_cube import expert_action

    record = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, variant in enumerate(fp.config["variants"]):
            env = shared.make_env(fp.target, num_envs=num_envs, device="cpu", seed=3, **{**variant, **env_overrides})
            gen = torch.Generator().manual_seed(0)
            obs, _ = env.reset(seed=3)
            rows = [{"obs": _obs_sums(obs)}]
            shape = env.single_action_space.shape
            for _ in range(steps):
                action = torch.rand((num_envs, *shape), generator=gen) * 2 - 1
                if fp.config.get("actions") == "expert":
                    action = (expert_action(env) + EXPERT_NOISE * action).clamp(-1, 1)
                obs, reward, terminated, truncated, info = env.step(action)
                success = info.get("success", terminated)
                row = {"obs": _obs_sums(obs), "reward": _sums(reward),
                       "ends": [int(terminated.sum()), int(truncated.sum()), int(success.sum())]}  # fmt: skip
                for term, value in sorted(info.get("rewards", {}).items()):
                    row[f"rewards/{term}"] = [float(value.double().sum())]
                if bool(info.get("_final_obs", torch.zeros(1, dtype=torch.bool)).any()):
                    row["final_obs"] = _obs_sums(info["final_obs"], info["_final_obs"])
                    done = info["_episode"]
                    episode = info["episode"]
                    row["episodes"] = [*_sums(episode["r"][done]), *_sums(episode["success"][done])]
                rows.append(row)
            env.close()
            record[f"variant{i}"] = {"kwargs": variant, "steps": [[t, row] for t, row in enumerate(rows)]}
    finally:
        torch.set_num_threads(threads)
    return record


def _obs_sums(obs, rows: torch.Tensor | None = None) -> list[float]:
    """Sum and sum of squares of each entry (flattened in sorted-key order), over `rows` when given."""
    from tensordict import TensorDict

    if isinstance(obs, TensorDict):
        items = sorted(obs.items(include_nested=True, leaves_only=True), key=lambda kv: str(kv[0]))
    else:
        items = [("", obs)]
    return [s for _, value in items for s in _sums(value[rows] if rows is not None else value)]


def _sums(value: torch.Tensor) -> list[float]:
    value = value.double()
    return [float(value.sum()), float(value.square().sum())]


def run_two_ranks(names: list[str]) -> dict[str, dict]:
    """The DDP fingerprints, run on two ranks in one torchrun launch."""
    from tests.torchrun import two_ranks

    with tempfile.TemporaryDirectory() as tmp:
        two_ranks(__file__, tmp, *names, pythonpath=(str(REPO),))
        return {name: json.loads((Path(tmp) / f"{name}.json").read_text()) for name in names}


def _two_rank_worker(out: Path, names: list[str]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # kept by the trainers (a caller's group), so both run in one launch
    for name in names:
        fp = FINGERPRINTS[name]
        run_out = out / f"run-{name}"  # rank 0 alone writes the run directory
        module, args = trainer_args(fp, run_out)
        module.main(args)
        dist.barrier()
        if dist.get_rank() == 0:
            (run_dir,) = [p for p in run_out.iterdir() if p.is_dir()]
            (out / f"{name}.json").write_text(json.dumps(trainer_record(run_dir)))
    dist.destroy_process_group()


# ---- golden files and the comparison ------------------------------------------------------------------------------
def write_golden(fp: Fingerprint, record: dict) -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in fp.config.items()}
    body = {"fingerprint": fp.name, "kind": fp.kind, "target": fp.target, "config": config, "record": record}
    fp.golden.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def first_difference(golden, new, path: tuple = ()) -> str | None:
    """The first value of `new`, in step order, that differs from `golden` beyond the tolerance, said as
    'losses/value_loss at step 1536: golden X, now Y' (env records: 'variant2 reward at step 14: ...'); None when
    every value matches."""
    if isinstance(golden, dict) and isinstance(new, dict):
        if set(golden) != set(new):
            gone, added = sorted(set(golden) - set(new)), sorted(set(new) - set(golden))
            return f"{_where(path) or 'record'}: entries removed {gone[:3]}, added {added[:3]}"
        for key in golden:
            if found := first_difference(golden[key], new[key], (*path, key)):
                return found
        return None
    if isinstance(golden, list) and isinstance(new, list):
        if len(golden) != len(new):
            return f"{_where(path)}: {len(golden)} entries in the golden file, {len(new)} now"
        stepped = all(isinstance(g, list) and len(g) == 2 and isinstance(g[1], dict) for g in golden)
        for i, (g, n) in enumerate(zip(golden, new)):
            if stepped and g[0] != n[0]:
                return f"{_where(path)}: step {g[0]} in the golden file, {n[0]} now"
            found = first_difference(g[1], n[1], (*path, ("step", g[0]))) if stepped else (
                first_difference(g, n, (*path, i)))  # fmt: skip
            if found:
                return found
        return None
    if isinstance(golden, (int, float)) and isinstance(new, (int, float)):
        return None if _close(golden, new) else f"{_where(path)}: golden {golden!r}, now {new!r}"
    return None if golden == new else f"{_where(path)}: golden {golden!r}, now {new!r}"


def _where(path: tuple) -> str:
    """('iterations', ('step', 1536), 'losses/value_loss') -> 'losses/value_loss at step 1536'."""
    names = [str(p) if not isinstance(p, int) else f"[{p}]" for p in path if not isinstance(p, tuple)]
    names = [n for n in names if n not in ("iterations", "steps")]
    steps = [f" at step {p[1]}" for p in path if isinstance(p, tuple)]
    return " ".join(names).replace(" [", "[") + "".join(steps)


def _close(golden: float, new: float) -> bool:
    if math.isnan(golden) or math.isnan(new):
        return math.isnan(golden) and math.isnan(new)
    return abs(new - golden) <= ATOL + RTOL * abs(golden)


if __name__ == "__main__":  # a torchrun worker: OUT_DIR NAME...
    _two_rank_worker(Path(sys.argv[1]), sys.argv[2:])
