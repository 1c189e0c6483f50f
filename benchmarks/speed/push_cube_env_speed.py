"""PushCubeRL env-only throughput of its variants side by side in one process, one thread.

    uv run python -m benchmarks.speed.push_cube_env_speed                  # ~1 min on a 2-core CPU
    git archive bf22c03 | tar -x -C /tmp/old && uv run python -m benchmarks.speed.push_cube_env_speed --old /tmp/old

Builds every variant (the default env and one kwarg changed at a time, state observations) with `--num-envs` envs
and seed 0, draws random actions for all steps up front, and steps each variant `--steps` times a round, the
variants interleaved round after round so that a change of machine load hits them alike. A step includes the
SAME_STEP autoreset of the finished envs. Reported: the median over `--rounds` of env-steps/s and its ratio to the
default. `--old DIR` adds the default env of another checkout (its push_cube package bound to its own franka
module) and the ratio to it. Writes speed.md, speed.json and provenance.json to `--out`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported

import importlib.util  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import tyro  # noqa: E402

from benchmarks.common import (  # noqa: E402
    RESULTS_DIR,
    git_info,
    invocation,
    machine_info,
    md_table,
    package_versions,
    record_lines,
)
from benchmarks.suite import provenance  # noqa: E402
from cleanrl_embodied.shared.envs.push_cube import PushCubeRLVecEnv  # noqa: E402

VARIANTS = {
    "default": {},
    "arm_limits=False": {"arm_limits": False},
    'action_mode="ee_delta_pos"': {"action_mode": "ee_delta_pos"},
    "events (randomize the cube size, randomize_every=10, event_cube_shift_std=0.01)": {
        "randomize": {"cube_half_size": [0.015, 0.025]}, "randomize_every": 10, "event_cube_shift_std": 0.01,
    },
    'reward_weights={"action_rate": 0.01}': {"reward_weights": {"action_rate": 0.01}},
    'cube_dynamics="sliding"': {"cube_dynamics": "sliding"},
}  # fmt: skip
"""Name in the report: the env kwargs it changes from the default."""


@dataclass
class Args:
    num_envs: int = 4096
    """parallel envs of every variant"""
    steps: int = 50
    """env steps per round and variant"""
    rounds: int = 7
    """rounds (the median is reported)"""
    old: str | None = None
    """a checkout of another commit: its default env is stepped alongside (its `cleanrl_embodied/shared/envs/`)"""
    out: str = str(RESULTS_DIR / "push-cube-env-speed-cpu")
    """folder of speed.md, speed.json and provenance.json"""


def load_old(root: str):
    """The PushCubeRLVecEnv of an older checkout whose push_cube is one module (push_cube.py), bound to that
    checkout's franka module (not this one's, which may have changed): the old code's
    `from cleanrl_embodied.shared.envs import franka` runs while the package's `franka` attribute is the old module."""
    envs = Path(root) / "cleanrl_embodied" / "shared" / "envs"
    if not (envs / "franka.py").is_file() or not (envs / "push_cube.py").is_file():
        raise SystemExit(
            f"error: --old must be a checkout with cleanrl_embodied/shared/envs/push_cube.py and franka.py, got {root}"
        )

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"old_{name}", envs / f"{name}.py")
        return spec, importlib.util.module_from_spec(spec)

    franka_spec, old_franka = load("franka")
    franka_spec.loader.exec_module(old_franka)
    push_cube_spec, old_push_cube = load("push_cube")
    package = importlib.import_module("cleanrl_embodied.shared.envs")
    package.franka = old_franka
    try:
        push_cube_spec.loader.exec_module(old_push_cube)
    finally:
        del package.franka
    return old_push_cube.PushCubeRLVecEnv


def measure(args: Args) -> dict[str, float]:
    """Median env-steps/s of every variant (and of the old default with --old)."""
    makers = {name: (lambda kw=kwargs: PushCubeRLVecEnv(num_envs=args.num_envs, seed=0, **kw))
              for name, kwargs in VARIANTS.items()}  # fmt: skip
    if args.old:
        old_env = load_old(args.old)
        makers["old default"] = lambda: old_env(num_envs=args.num_envs, seed=0)
    envs = {name: make() for name, make in makers.items()}
    generator = torch.Generator().manual_seed(0)
    actions = {name: 2 * torch.rand(args.steps, args.num_envs, env.single_action_space.shape[0], generator=generator)
               - 1 for name, env in envs.items()}  # fmt: skip
    for env in envs.values():
        env.reset(seed=0)
    rates: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(args.rounds):
        for name, env in envs.items():
            start = time.perf_counter()
            for a in actions[name]:
                env.step(a)
            rates[name].append(args.steps * args.num_envs / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def report(data: dict) -> str:
    results, base = data["results"], data["results"]["default"]
    old = results.get("old default")
    header = ["variant", "env-steps/s", "to the default", *(["to the old default"] if old else [])]
    rows = [[name, f"{rate / 1e3:.0f}k", f"{rate / base:.2f}", *([f"{rate / old:.2f}"] if old else [])]
            for name, rate in results.items()]  # fmt: skip
    return "\n".join([
        f"PushCubeRL env-only throughput, state observations, {data['num_envs']} envs, one thread, random actions "
        f"drawn up front; the median over {data['rounds']} interleaved rounds of {data['steps']} steps each. A step "
        f"includes the SAME_STEP autoreset. Finished {data['finished']} after {data['total_wall_s']:.0f} s.",
        "",
        *record_lines(data["invocation"], data["machine"], data["load_avg_end"], data["git"], data["versions"]),
        "",
        md_table(header, rows),
    ])  # fmt: skip


def main(args: Args) -> None:
    if min(args.num_envs, args.steps, args.rounds) < 1:
        raise SystemExit("error: --num-envs, --steps and --rounds must be positive")
    torch.set_num_threads(1)
    out = Path(args.out)
    data = {"invocation": invocation(__file__, sys.argv[1:]), "num_envs": args.num_envs, "steps": args.steps,
            "rounds": args.rounds, "old": args.old, "machine": machine_info(), "versions": package_versions(),
            "git": git_info()}  # fmt: skip
    start = time.time()
    data["results"] = measure(args)
    data.update(total_wall_s=round(time.time() - start, 1), finished=time.strftime("%Y-%m-%d %H:%M"),
                load_avg_end=machine_info()["load_avg_1_5_15"])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "speed.json").write_text(json.dumps(data, indent=1) + "\n")
    text = report(data)
    (out / "speed.md").write_text(f"# PushCubeRL variants: env speed\n\n{text}\n")
    provenance.record(out, data["invocation"], None, data["machine"], data["git"])
    print(text)


if __name__ == "__main__":
    main(tyro.cli(Args))
