"""Sync vs async PPO on PushCubeRL with a slow policy: wall-clock to a fixed env-step budget and final eval success.

    uv run python -m benchmarks.speed.async_speed                          # ~20 min on a 2-core CPU
    uv run python -m benchmarks.speed.async_speed --latencies 0 100 --seeds 1 --total-timesteps 100000
    uv run python -m benchmarks.speed.async_speed --hidden-sizes 512 512 512   # a heavier update

For every seed and every latency L in `--latencies`, one after the other in this invocation (threads pinned),
both VLA trainers act through the policy hook with `benchmarks/speed/slow_policy.py` (an MLP policy plus L ms of
sleep in every rollout inference call: `--policy benchmarks.speed.slow_policy:make_agent --policy-kwargs '{"latency_ms":
L}'`):

- sync:  `cleanrl_embodied/ppo_vla.py`: collect a rollout, then update on it;
- async: `cleanrl_embodied/ppo_vla_async.py --max-staleness 1`: the collector steps rollout j+1 while the learner
  updates on rollout j.

Both run the same hyperparameters (the scripts' defaults, `--eval-freq 0 --save-freq 0 --compile off`, `--extra`
added to both) for `--total-timesteps`, then evaluate the final policy. Both eager: under `--compile auto` a run whose
configuration this machine has not measured compiles to measure it (the sync side once at 100 ms in the first run of
2026-12-02: 46 s of compiling in one run of 24), which is no part of what overlapping collection and update saves.
Wall time is the trainer's own loop time from summary.json (start-up excluded, the final evaluation included, which
has no added latency). The speed-up is the ratio sync/async of each seed's pair, which ran back to back.

What to expect: with collection time C and update time U per iteration, one collector overlapping one learner can
at best turn C + U into max(C, U), a speed-up of at most 2 (reached when C = U). With latency L ms per step and
T steps a rollout, C grows by T * L; once C >> U the speed-up falls back towards 1.

Writes `async.png`, `async.md`, `async.json` to `--out` (default docs/results/async-<cpu|cuda>/) and
replaces the `async-<cpu|cuda>` section of docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tyro

from benchmarks.common import (
    REPO,
    RESULTS_DIR,
    RESULTS_MD,
    SCRIPTS_DIR,
    describe_machine,
    git_info,
    invocation,
    machine_info,
    md_table,
    package_versions,
    shell_command,
    write_section,
)
from benchmarks.suite import provenance, rlstats

MODES = {"sync": ("ppo_vla", []), "async": ("ppo_vla_async", ["--max-staleness", "1"])}


@dataclass
class Args:
    latencies: tuple[float, ...] = (0.0, 5.0, 20.0, 100.0)
    """latencies (ms added to every inference call of the rollout, by benchmarks/speed/slow_policy.py)"""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """hidden layer sizes of slow_policy's actor and critic MLPs"""
    seeds: int = 3
    """seeds 1..N of each (mode, latency)"""
    total_timesteps: int = 200_000
    """env-step budget of every run"""
    extra: str = ""
    """flags added to both scripts, with "=" and in quotes, e.g. --extra="--num-envs 512" """
    cuda: bool = False
    """run the trainers with --cuda (default: CPU, the machine CI has)"""
    threads: int = 1
    """OMP_NUM_THREADS of every run"""
    out: str | None = None
    """output folder (default docs/results/async-<cpu|cuda>)"""
    results_md: str = str(RESULTS_MD)
    """markdown file whose 'async-<device>' section is replaced ('' leaves it alone)"""


def run_one(mode: str, latency: float, seed: int, args: Args, root: Path) -> dict:
    script, mode_flags = MODES[mode]
    flags = [
        "--env-id",
        "PushCubeRL",
        "--total-timesteps",
        str(args.total_timesteps),
        "--eval-freq",
        "0",
        "--save-freq",
        "0",
        "--compile",
        "off",
        "--policy",
        "benchmarks.speed.slow_policy:make_agent",
        "--policy-kwargs",
        json.dumps({"latency_ms": latency, "hidden_sizes": list(args.hidden_sizes)}),
        "--seed",
        str(seed),
        "--cuda" if args.cuda else "--no-cuda",
        *mode_flags,
        *shlex.split(args.extra),
        "--output-dir",
        str(root / f"{mode}_{latency:g}_{seed}"),
    ]
    env = {"OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, str(SCRIPTS_DIR / f"{script}.py"), *flags]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True)
    record = {"mode": mode, "latency_ms": latency, "seed": seed, "command": shell_command(cmd[:-2], env)}
    summaries = list((root / f"{mode}_{latency:g}_{seed}").glob("*/summary.json"))
    if proc.returncode or len(summaries) != 1:
        raise SystemExit(f"error: {record['command']} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    s = json.loads(summaries[0].read_text())
    return {
        **record,
        "wall_time_s": s["wall_time_s"],
        "sps": s["sps"],
        "global_step": s["global_step"],
        "success_rate": s["eval"]["success_rate"],
        "episodic_return": s["eval"]["episodic_return"],
        "dropped_rollouts": s.get("dropped_rollouts"),
    }


def fmt(values: list[float], digits: int, unit: str = "") -> str:
    mean, std = rlstats.mean_std(values)
    return f"{mean:.{digits}f}{unit} ± {std:.{digits}f}{unit}"


def report(data: dict, image: str) -> str:
    runs, rows = data["runs"], []
    for latency in data["latencies"]:
        pick = lambda mode, latency=latency: sorted(
            (r for r in runs if r["mode"] == mode and r["latency_ms"] == latency), key=lambda r: r["seed"]
        )
        sync, asyn = pick("sync"), pick("async")
        ratios = [s["wall_time_s"] / a["wall_time_s"] for s, a in zip(sync, asyn)]
        rows.append(
            [
                f"{latency:g}",
                fmt([r["wall_time_s"] for r in sync], 1, " s"),
                fmt([r["wall_time_s"] for r in asyn], 1, " s"),
                f"**{fmt(ratios, 2, 'x')}**",
                fmt([r["success_rate"] for r in sync], 2),
                fmt([r["success_rate"] for r in asyn], 2),
                fmt([r["sps"] for r in sync], 0),
                fmt([r["sps"] for r in asyn], 0),
            ]
        )
    header = [
        "policy latency (ms/step)",
        "sync wall time",
        "async wall time",
        "speed-up (sync/async, paired)",
        "sync eval success",
        "async eval success",
        "sync SPS",
        "async SPS",
    ]
    lines = [
        f"PushCubeRL, {data['total_timesteps']:,} env steps per run, {data['seeds']} seed(s), the scripts' "
        f"defaults{' plus `' + data['extra'] + '`' if data['extra'] else ''}, a policy MLP of "
        f"{data.get('hidden_sizes', [128, 128])}; "
        f"{data['total_wall_s'] / 60:.1f} min in all, finished {data['finished']}.",
        "",
        f"- command: `{data['invocation']}`",
        f"- machine: {describe_machine(data['machine'])}; load average (1/5/15 min) at start "
        f"{data['machine']['load_avg_1_5_15']}, at end {data['load_avg_end']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in data['versions'].items())}; git {data['git']['git_sha']}",
        "- sync = `ppo_vla.py`, async = `ppo_vla_async.py --max-staleness 1`, same flags otherwise; mean ± std "
        "over seeds; wall time is the training loop's (start-up excluded, final eval included).",
        "",
        f"![sync vs async]({image})",
        "",
        md_table(header, rows),
        "",
        "<details><summary>Commands (each with --output-dir)</summary>",
        "",
        "```",
    ]
    return "\n".join(lines + [r["command"] for r in runs] + ["```", "", "</details>"])


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = data["latencies"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.arange(len(lat))
    for offset, mode, color in ((-0.2, "sync", "tab:blue"), (0.2, "async", "tab:orange")):
        walls = [[r["wall_time_s"] for r in data["runs"] if r["mode"] == mode and r["latency_ms"] == v] for v in lat]
        succ = [[r["success_rate"] for r in data["runs"] if r["mode"] == mode and r["latency_ms"] == v] for v in lat]
        ax1.bar(
            x + offset,
            [np.mean(w) for w in walls],
            0.4,
            yerr=[np.std(w) for w in walls],
            color=color,
            label=mode,
            capsize=3,
        )
        ax2.bar(
            x + offset,
            [np.mean(s) for s in succ],
            0.4,
            yerr=[np.std(s) for s in succ],
            color=color,
            label=mode,
            capsize=3,
        )
    for ax, ylabel in ((ax1, "wall time to the budget (s)"), (ax2, "final eval success")):
        ax.set_xticks(x, [f"{v:g} ms" for v in lat])
        ax.set_xlabel("policy latency per inference call")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    ax1.legend()
    fig.suptitle(
        f"PushCubeRL, {data['total_timesteps']:,} steps: ppo_vla (sync) vs ppo_vla_async, {data['seeds']} seeds",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(args: Args) -> None:
    if args.seeds < 1 or args.total_timesteps < 1 or args.threads < 1 or not args.latencies or min(args.latencies) < 0:
        raise SystemExit("error: --seeds, --total-timesteps and --threads must be positive, --latencies >= 0")
    device = "cuda" if args.cuda else "cpu"
    out = Path(args.out) if args.out else RESULTS_DIR / f"async-{device}"
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "invocation": invocation(__file__, sys.argv[1:]),
        "latencies": list(args.latencies),
        "seeds": args.seeds,
        "total_timesteps": args.total_timesteps,
        "extra": args.extra,
        "hidden_sizes": list(args.hidden_sizes),
        "machine": machine_info(),
        "versions": package_versions(),
        "git": git_info(),
        "runs": [],
    }
    start = time.time()
    with tempfile.TemporaryDirectory() as root:
        for seed in range(1, args.seeds + 1):
            for latency in args.latencies:
                for mode in MODES:  # the pair runs back to back
                    r = run_one(mode, latency, seed, args, Path(root))
                    data["runs"].append(r)
                    print(
                        f"{mode:5s} latency {latency:g} ms seed {seed}: {r['wall_time_s']:.1f} s, "
                        f"success {r['success_rate']:.2f}",
                        flush=True,
                    )
    data.update(
        total_wall_s=round(time.time() - start, 1),
        finished=time.strftime("%Y-%m-%d %H:%M"),
        load_avg_end=machine_info()["load_avg_1_5_15"],
    )
    (out / "async.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, out / "async.png")
    (out / "async.md").write_text(f"# sync vs async ({device})\n\n{report(data, 'async.png')}\n")
    if args.results_md:
        md = Path(args.results_md)
        prefix = os.path.relpath(out, md.resolve().parent).replace(os.sep, "/") + "/"
        write_section(md, f"async-{device}", report(data, prefix + "async.png"))
    provenance.record(out, data["invocation"], [r["command"] for r in data["runs"]], data["machine"], data["git"])
    print(f"wrote {out / 'async.md'}")


if __name__ == "__main__":
    main(tyro.cli(Args))
