"""benchmarks/: the aggregation math on made-up data with known answers, the config files, and tiny real runs
of the reproducibility suite (run.py --suite smoke) and of the speed suite's time breakdown."""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tyro

from benchmarks import common as benchlib
from benchmarks.suite import rlstats, run
from tests.checks import exits_in_one_line
from tests.extras import needs
from tests.subprocesses import subprocess_env
from tests.trainer_args import TWO_SAVED_ITERATIONS, tiny_args

REPO = Path(__file__).resolve().parents[1]


# ---- IQM and bootstrap -----------------------------------------------------------------------------
def test_iqm_drops_a_quarter_at_each_end():
    assert rlstats.iqm(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert rlstats.iqm([10, -1000, 10, 0, 10, 1000, 10, 10]) == pytest.approx(10.0)  # outliers dropped
    assert rlstats.iqm([5.0, 1.0, 3.0]) == pytest.approx(3.0)  # fewer than 4 scores: the mean
    assert rlstats.iqm(np.array([[1.0, 2.0], [3.0, 4.0]])) == pytest.approx(2.5)  # runs x tasks pooled
    rows = rlstats.iqm(np.array([np.arange(1, 9), np.arange(11, 19)]), axis=-1)
    np.testing.assert_allclose(rows, [4.5, 14.5])


def test_stratified_bootstrap_resamples_within_each_task():
    # task A always scores 0, task B always 1: every stratified resample keeps 3 of each, so the IQM is
    # exactly 0.5 in every resample (pooled resampling would not keep the tasks balanced).
    scores = np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    assert rlstats.stratified_bootstrap_ci(scores, rlstats.iqm) == (0.5, 0.5, 0.5)
    assert rlstats.stratified_bootstrap_ci(scores, rlstats.mean) == (0.5, 0.5, 0.5)


def test_bootstrap_ci_of_a_mean_matches_normal_theory():
    x = np.random.default_rng(1).normal(3.0, 2.0, size=400)
    est, low, high = rlstats.stratified_bootstrap_ci(x, rlstats.mean, reps=4000)
    assert est == pytest.approx(x.mean())
    half_width = 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert low < est < high
    assert (high - low) / 2 == pytest.approx(half_width, rel=0.1)
    assert rlstats.stratified_bootstrap_ci(x, rlstats.mean, reps=4000) == (est, low, high)  # seeded


def test_bootstrap_ci_collapses_for_one_run_or_equal_runs():
    assert rlstats.stratified_bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert rlstats.stratified_bootstrap_ci([1.0, 1.0, 1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        rlstats.stratified_bootstrap_ci(np.zeros((0, 2)))


def test_mean_std():
    assert rlstats.mean_std([1.0, 3.0]) == pytest.approx((2.0, np.sqrt(2.0)))
    assert rlstats.mean_std([4.0]) == (4.0, 0.0)


# ---- curves ----------------------------------------------------------------------------------------
def test_align_curves_uses_shared_x_as_is():
    grid, values = rlstats.align_curves([[10, 20, 30], [10, 20, 30]], [[0.1, 0.5, 0.9], [0.3, 0.5, 0.7]])
    np.testing.assert_array_equal(grid, [10, 20, 30])
    np.testing.assert_array_equal(values, [[0.1, 0.5, 0.9], [0.3, 0.5, 0.7]])


def test_align_curves_interpolates_on_the_common_range():
    # y = x logged at 0, 10, 20 and y = 2x logged at 5, 15, 25: common range [5, 20], grid = union inside it
    grid, values = rlstats.align_curves([[0, 10, 20], [5, 15, 25]], [[0, 10, 20], [10, 30, 50]])
    np.testing.assert_array_equal(grid, [5, 10, 15, 20])
    np.testing.assert_allclose(values, [[5, 10, 15, 20], [10, 20, 30, 40]])
    grid, values = rlstats.align_curves([[0, 1], [2, 3]], [[0, 1], [0, 1]])  # no overlap
    assert grid.size == 0 and values.shape == (2, 0)
    with pytest.raises(ValueError):
        rlstats.align_curves([[2, 1]], [[0, 1]])


def test_bootstrap_band():
    same = np.tile([1.0, 2.0, 3.0], (4, 1))
    mean, low, high = rlstats.bootstrap_band(same)
    np.testing.assert_array_equal(mean, [1, 2, 3])
    np.testing.assert_array_equal(low, mean)
    np.testing.assert_array_equal(high, mean)
    # two seeds 0 and 2: a resample is (0,0), (0,2), (2,0) or (2,2) -> means 0, 1, 2 with odds 1/4, 1/2, 1/4,
    # so the 2.5% and 97.5% quantiles are exactly 0 and 2
    mean, low, high = rlstats.bootstrap_band(np.array([[0.0, 0.0], [2.0, 2.0]]))
    np.testing.assert_array_equal(mean, [1, 1])
    np.testing.assert_array_equal(low, [0, 0])
    np.testing.assert_array_equal(high, [2, 2])


def test_first_crossing():
    assert rlstats.first_crossing([10, 20, 30], [0.1, 0.95, 0.5], 0.9) == 20
    assert rlstats.first_crossing([10, 20, 30], [0.1, 0.9, 1.0], 0.9) == 20  # reaching it counts
    assert rlstats.first_crossing([10, 20, 30], [0.1, 0.5, 0.8], 0.9) is None
    assert rlstats.first_crossing([], [], 0.9) is None


# ---- Student t: exact quantiles, the intervals of every driver ------------------------------------------
def test_t_quantile_is_exact_for_any_degrees_of_freedom():
    """The two-sided 95% quantile against published values (4 decimals) and the closed forms of 1 and 2 degrees of
    freedom; symmetric; fractional degrees of freedom (Welch's) lie between their neighbours; infinity is the normal."""
    for df, t in {1: 12.7062, 2: 4.3027, 3: 3.1824, 5: 2.5706, 7: 2.3646, 8: 2.3060, 9: 2.2622, 30: 2.0423,
                  80: 1.9901, 120: 1.9799}.items():  # fmt: skip
        assert round(rlstats.t_quantile(0.975, df), 4) == t, df
    assert rlstats.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    assert rlstats.t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-12)
    assert round(rlstats.t_quantile(0.995, 10), 4) == 3.1693 and round(rlstats.t_quantile(0.95, 4), 4) == 2.1318
    assert rlstats.t_quantile(0.025, 8) == -rlstats.t_quantile(0.975, 8) and rlstats.t_quantile(0.5, 3) == 0.0
    assert rlstats.t_quantile(0.975, 21) > rlstats.t_quantile(0.975, 21.7) > rlstats.t_quantile(0.975, 22)
    assert rlstats.t_quantile(0.975, math.inf) == pytest.approx(1.959963985, rel=1e-9)
    assert rlstats.t_quantile(0.975, 1e7) == pytest.approx(1.959964, rel=1e-6)
    for bad in ((1.0, 3), (0.975, 0)):
        with pytest.raises(ValueError):
            rlstats.t_quantile(*bad)


def test_t_intervals_of_nine_seeds_use_t_with_8_degrees_of_freedom():
    """9 values: the half-width is t(0.975, 8) = 2.306 standard errors, not the normal's 1.96 (vla_rl's table stopped
    at 7 degrees of freedom)."""
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    values = [0.62, 0.55, 0.71, 0.48, 0.66, 0.59, 0.74, 0.52, 0.63]
    se = np.std(values, ddof=1) / 3
    mean, half = rlstats.t_interval(values)
    assert mean == pytest.approx(np.mean(values)) and half == pytest.approx(2.306004 * se, rel=1e-6)
    assert vla_rl.interval(values) == f"{np.mean(values):.2f} ± {2.306004 * se:.2f}" != f"0.61 ± {1.96 * se:.2f}"
    assert vla_rl.signed(values) == f"+{np.mean(values):.2f} ± {2.306004 * se:.2f}"
    assert rlstats.t_interval([0.4]) == (0.4, 0.0)


def test_welch_interval_of_large_groups_uses_their_degrees_of_freedom():
    """Two groups of 41 with equal variance: 80 degrees of freedom, t = 1.9901 (curves_at's table stopped at 30)."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    a = [0.1 + 0.01 * i for i in range(41)]
    b = [x + 0.2 for x in reversed(a)]
    diff, half = curves_at.welch(a, b)
    se = math.sqrt(2 * np.var(a, ddof=1) / 41)
    assert diff == pytest.approx(0.2) and half == pytest.approx(1.990063 * se, rel=1e-6)


# ---- tables from made-up runs ----------------------------------------------------------------------
def fake_run(script: str, seed: int, success: list[float], final_return: float) -> dict:
    steps = [100_000 * (i + 1) for i in range(len(success))]
    return {
        "script": script,
        "task": "PushCubeRL",
        "seed": seed,
        "returncode": 0,
        "command": "python x.py",
        "summary": {
            "global_step": steps[-1],
            "wall_time_s": 10.0 * seed,
            "sps": 1000.0 * seed,
            "eval": {"success_rate": success[-1], "episodic_return": final_return},
        },
        "curves": {
            "eval/success_rate": {"step": steps, "value": success, "time_s": [s / 10_000 for s in steps]},
            # 15 training points: 5 early ones at -100, then 10 at final_return - 1 and + 1 alternating
            "charts/episodic_return": {
                "step": list(range(15)),
                "time_s": list(range(15)),
                "value": [-100.0] * 5 + [final_return + (-1) ** i for i in range(10)],
            },
        },
    }


def test_task_table_on_made_up_runs():
    runs = [
        fake_run("ppo_continuous", 1, [0.0, 0.95, 1.0], -5.0),
        fake_run("ppo_continuous", 2, [0.5, 0.8, 0.9], -7.0),
        fake_run("ppo_continuous", 3, [0.1, 0.2, 0.3], -9.0),
    ]
    steps, times = run.threshold_hits(runs, "success_rate", 0.9)
    assert steps == [200_000, 300_000, None] and times == [20.0, 30.0, None]
    table = run.task_table("PushCubeRL", runs)
    row = table.splitlines()[2].split(" | ")
    assert row[0] == "| ppo_continuous" and row[1] == "3" and row[2] == "300,000"
    assert row[3] == "0.73 ± 0.38"  # success 1.0, 0.9, 0.3
    assert row[4].startswith("0.73 [")  # IQM of 3 seeds = their mean
    assert row[5] == "-7.0 ± 2.0"
    assert row[7] == "-7.0 ± 2.0"  # training return: the last 10 points only
    assert row[8] == "250k ± 71k (2/3)" and row[9] == "25.0 s ± 7.1 s (2/3)"
    assert row[10] == "20.0 ± 10.0" and row[11] == "2000 ± 1000 |"


def test_compare_scalars_ignores_the_clock_only():
    a = {"charts/SPS": ([1, 2], [10.0, 11.0]), "losses/value_loss": ([1, 2], [0.5, 0.25])}
    b = {"charts/SPS": ([1, 2], [12.0, 13.0]), "losses/value_loss": ([1, 2], [0.5, 0.25])}
    assert run.compare_scalars(a, b) == {"compared": 1, "points": 2, "differing": []}
    b["losses/value_loss"] = ([1, 2], [0.5, 0.2500001])
    b["eval/success_rate"] = ([2], [1.0])
    assert run.compare_scalars(a, b)["differing"] == ["eval/success_rate", "losses/value_loss"]


# ---- flags, configs, markdown ----------------------------------------------------------------------
def test_read_and_merge_flags(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text(
        "# comment\n--num-envs 16   # trailing\n--hidden-sizes 64 64\n--norm-obs\n--env-kwargs '{\"a\": 1}'\n"
    )
    flags = benchlib.read_flags(path)
    assert flags == ["--num-envs", "16", "--hidden-sizes", "64", "64", "--norm-obs", "--env-kwargs", '{"a": 1}']
    merged = benchlib.merge_flags(flags, ["--no-norm-obs", "--num-envs", "8", "--seed", "3"])
    assert merged == [
        "--num-envs",
        "8",
        "--hidden-sizes",
        "64",
        "64",
        "--no-norm-obs",
        "--env-kwargs",
        '{"a": 1}',
        "--seed",
        "3",
    ]
    assert benchlib.get_flag(merged, "--hidden-sizes") == ["64", "64"] and benchlib.get_flag(merged, "--x") is None
    with pytest.raises(ValueError):
        benchlib.merge_flags(["16", "--num-envs"])


@pytest.mark.parametrize("script,task", run.config_pairs())
def test_every_config_file_parses_with_its_script(script, task):
    """Flag names and values of every config are accepted by the script's own Args (nothing is run)."""
    module = importlib.import_module(f"cleanrl_embodied.{script}")
    flags = benchlib.merge_flags(benchlib.read_flags(run.config_path(script, task)), ["--env-id", run.env_id(task)])
    args = tyro.cli(module.Args, args=flags)
    assert args.env_id == task.partition("@")[0] and args.total_timesteps > 0


def test_suite_plans():
    quick = run.plan(run.Args(suite="quick", seeds=2), "cpu")
    assert {(s.script, s.task) for s in quick} == set(run.QUICK) and len(quick) == 2 * len(run.QUICK)
    ppo = next(s for s in quick if (s.script, s.task) == ("ppo_continuous", "Pendulum-v1"))
    assert benchlib.get_flag(ppo.flags, "--total-timesteps") == ["150000"]  # the suite's budget replaces the config's
    assert benchlib.get_flag(ppo.flags, "--num-envs") == ["16"] and "--no-cuda" in ppo.flags
    # on the CPU eager unless asked otherwise: --compile auto's choice depends on the machine's past runs
    assert all(benchlib.get_flag(s.flags, "--compile") == ["off"] for s in quick)
    asked = run.plan(run.Args(suite="quick", scripts=("grpo",), tasks=("PushCubeRL",), extra="--compile on"), "cpu")
    assert benchlib.get_flag(asked[0].flags, "--compile") == ["on"]
    scaled = run.plan(run.Args(suite="quick", scripts=("grpo",), tasks=("PushCubeRL",), budget_scale=0.5), "cpu")
    assert len(scaled) == 5 and benchlib.get_flag(scaled[0].flags, "--total-timesteps") == ["192000"]
    full = run.plan(run.Args(suite="full", seeds=1), "cuda")
    assert {(s.script, s.task) for s in full} == set(run.config_pairs())
    assert all(benchlib.get_flag(s.flags, "--compile") is None for s in full)  # (CUDA: the trainers' own rule)
    # a variant: the env id and its config's options
    pixels = next(s for s in full if s.task == "PushCubeRL@proprio+rgb")
    assert benchlib.get_flag(pixels.flags, "--env-id") == ["PushCubeRL"]
    assert "rgb" in benchlib.get_flag(pixels.flags, "--env-kwargs")[0]
    assert run.task_metric("PushCubeRL@rgb") == run.task_metric("PushCubeRL") == ("success_rate", 0.9)
    with pytest.raises(SystemExit, match="Nope-v0 is not in suite 'quick'"):
        run.plan(run.Args(suite="quick", tasks=("Nope-v0", "PushCubeRL")), "cpu")
    with pytest.raises(SystemExit, match="that combination"):
        run.plan(run.Args(suite="full", scripts=("ppo_ddp",), tasks=("Pendulum-v1",)), "cpu")


def test_write_section(tmp_path):
    md = tmp_path / "R.md"
    md.write_text("# Results\n\nintro\n")
    benchlib.write_section(md, "quick-cpu", "first")
    benchlib.write_section(md, "speed-cpu", "speed")
    benchlib.write_section(md, "quick-cpu", "second")
    text = md.read_text()
    assert text.startswith("# Results\n\nintro\n")
    assert "second" in text and "first" not in text and text.count("<!-- BEGIN quick-cpu -->") == 1
    assert text.index("quick-cpu") < text.index("speed-cpu")


def test_results_land_in_the_documentation_site(monkeypatch):
    """The benchmarks write their plots and reports under docs/ (the folder the documentation site serves) and their
    sections into its benchmarks page: the default output folders, read back through --report-only (nothing is
    rewritten), and every section and image the page shows."""
    docs = benchlib.REPO / "docs"
    assert benchlib.RESULTS_DIR == docs / "results" and benchlib.RESULTS_MD == docs / "benchmarks.md"
    assert "docs_dir: docs" in (benchlib.REPO / "mkdocs.yml").read_text()
    written = {}
    monkeypatch.setattr(run, "write_outputs", lambda data, out, results_md, name: written.update(run=(out, results_md)))
    run.main(run.Args(suite="quick", device="cpu", report_only=True))
    assert written["run"] == (docs / "results" / "quick-cpu", str(docs / "benchmarks.md"))
    speed = importlib.import_module("benchmarks.speed.speed")
    monkeypatch.setattr(speed, "write_outputs", lambda data, out, kind, results_md: written.update(speed=out))
    speed.main(speed.Args(cuda=False, report_only=True))
    assert written["speed"] == docs / "results" / "speed-cpu"
    assert importlib.import_module("benchmarks.speed.async_speed").Args().results_md == str(docs / "benchmarks.md")
    vs_cleanrl = importlib.import_module("benchmarks.peers.vs_cleanrl").Args()
    assert (Path(vs_cleanrl.out), Path(vs_cleanrl.results_md)) == (
        docs / "results" / "vs-cleanrl-cpu",
        docs / "benchmarks.md",
    )
    assert Path(importlib.import_module("benchmarks.speed.push_cube_rgb_speed").Args().out).parent == docs / "results"
    variants = importlib.import_module("benchmarks.experiments.push_cube_variants")
    assert Path(variants.Args().out).parent == docs / "results"
    assert (benchlib.REPO / importlib.import_module("benchmarks.suite.recheck").Args().results / "runs.json").is_file()

    text = benchlib.RESULTS_MD.read_text() + benchlib.ARCHIVE_MD.read_text()  # (the stale ones in the archive)
    begins = re.findall(r"<!-- BEGIN (\S+) -->", text)
    assert {"quick-cpu", "full-cpu", "speed-cpu", "async-cpu", "vs-cleanrl-cpu"} <= set(begins)
    assert sorted(begins) == sorted(re.findall(r"<!-- END (\S+) -->", text)) and len(set(begins)) == len(begins)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert len(images) >= 10 and all((docs / image).is_file() for image in images), images
    assert benchlib.ARCHIVE_MD.parent == docs and "benchmarks-archive.md" in (benchlib.REPO / "mkdocs.yml").read_text()


def test_a_section_in_the_archive_is_rewritten_there(tmp_path, monkeypatch):
    """A report measured again whose section was moved to the archive page gets its new text there (one copy, not a
    second one appended to the benchmarks page); other sections go to the page named."""
    main, archive = tmp_path / "benchmarks.md", tmp_path / "benchmarks-archive.md"
    main.write_text("# B\n\n<!-- BEGIN a -->\nold a\n<!-- END a -->\n")
    archive.write_text("# Archive\n\n<!-- BEGIN b -->\nold b\n<!-- END b -->\n")
    monkeypatch.setattr(benchlib, "RESULTS_MD", main)
    monkeypatch.setattr(benchlib, "ARCHIVE_MD", archive)
    benchlib.write_section(main, "b", "new b")
    benchlib.write_section(main, "a", "new a")
    assert main.read_text() == "# B\n\n<!-- BEGIN a -->\nnew a\n<!-- END a -->\n"
    assert archive.read_text() == "# Archive\n\n<!-- BEGIN b -->\nnew b\n<!-- END b -->\n"


# ---- tiny real runs --------------------------------------------------------------------------------
def run_benchmark(module: str, *args: str, out: Path, md: Path) -> None:
    """The benchmark `module` (`benchmarks.suite.run`) with ``args``, run from the repository root, writing its results
    under ``out`` and its tables into ``md`` (not the repository's RESULTS.md); it must succeed."""
    command = [sys.executable, "-m", module, *args, "--out", str(out), "--results-md", str(md)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=subprocess_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_smoke_suite_end_to_end(tmp_path):
    """2 seeds x PPO x PushCubeRL for 4 iterations, two at a time, then seed 1 again for the determinism check:
    PNG, tables, runs.json."""
    out, md = tmp_path / "smoke", tmp_path / "RESULTS.md"
    run_benchmark("benchmarks.suite.run", "--suite", "smoke", "--seeds", "2", "--jobs", "2", out=out, md=md)
    png = out / "PushCubeRL.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = json.loads((out / "runs.json").read_text())
    assert [r["seed"] for r in data["runs"]] == [1, 2]  # the plan's order, whichever finished first
    for record in data["runs"]:
        assert record["returncode"] == 0 and record["summary"]["global_step"] == 2048
        curve = record["curves"]["eval/success_rate"]
        assert curve["step"] == [512, 1024, 1536, 2048] and all(t > 0 for t in curve["time_s"])
    assert data["determinism"]["identical"] and data["determinism"]["compared"] > 5
    assert data["machine"]["logical_cores"] >= 1 and data["versions"]["torch"]
    report = (out / "report.md").read_text()
    assert "| ppo_continuous | 2 | 2,048 |" in report and "![PushCubeRL](PushCubeRL.png)" in report
    assert "--env-id PushCubeRL --seed 2" in report and "2 runs at a time" in report
    assert "<!-- BEGIN smoke-cpu -->" in md.read_text() and "(smoke/PushCubeRL.png)" in md.read_text()
    png.unlink()  # --report-only redraws everything from runs.json
    run.main(run.Args(suite="smoke", out=str(out), results_md="", report_only=True))
    assert png.is_file() and (out / "report.md").read_text() == report
    run.main(run.Args(suite="smoke", out=str(out), results_md=str(md), name="smoke-part", report_only=True))
    text = md.read_text()  # a named set of runs gets its own section and leaves the suite's alone
    assert "<!-- BEGIN smoke-part -->" in text and "<!-- BEGIN smoke-cpu -->" in text
    data["runs"][1]["task"] = "PushCubeRL@other"  # two variants of one env id: also one figure with both
    both = tmp_path / "variants"
    both.mkdir()
    (both / "runs.json").write_text(json.dumps(data))
    run.main(run.Args(suite="smoke", out=str(both), results_md="", report_only=True))
    assert (both / "PushCubeRL-variants.png").stat().st_size > 10_000 and (both / "PushCubeRL@other.png").is_file()
    assert "### PushCubeRL: the variants side by side" in (both / "report.md").read_text()
    assert not (out / "PushCubeRL-variants.png").exists()  # one task: no such figure


@pytest.mark.parametrize("script", ["ppo_continuous", "grpo"])
def test_speed_breakdown_times_the_real_loop(script):
    speed = importlib.import_module("benchmarks.speed.speed")
    from cleanrl_embodied.shared import builders, run_logger

    module = importlib.import_module(f"cleanrl_embodied.{script}")
    before = {"module": dict(vars(module)), "make_env": builders.make_env, "log": run_logger.RunLogger.log}
    result = speed.breakdown(
        script,
        16,
        iterations=5,
        skip=2,
        device="cpu",
        extra="--num-minibatches 2 --update-epochs 1 --hidden-sizes 16 16",
    )
    assert result["iterations"] == 3  # iterations 3, 4, 5
    assert all(result[k] > 0 for k in ("env", "policy", "update", "total"))
    assert result["env"] + result["policy"] + result["update"] + result["rest"] == pytest.approx(result["total"])
    assert vars(module) == before["module"]  # nothing of the trainer was replaced
    assert (builders.make_env, run_logger.RunLogger.log) == (
        before["make_env"],
        before["log"],
    )  # the seams are restored


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs the mujoco extra")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_speed_gym_part_measures_contract_rollout_and_iteration(tmp_path):
    """`speed.py --parts gym` at tiny sizes: per setting the raw env, make_env, the rollouts (and EnvPool when
    installed), a breakdown of the real HalfCheetah loop, and its own RESULTS.md section with both tables."""
    speed = importlib.import_module("benchmarks.speed.speed")
    from cleanrl_embodied import ppo_continuous as ppo
    from cleanrl_embodied.shared import builders, run_logger

    before = {"module": dict(vars(ppo)), "make_env": builders.make_env, "log": run_logger.RunLogger.log}
    md = tmp_path / "RESULTS.md"
    speed.main(
        speed.Args(
            parts=("gym",),
            gym_settings=(("HalfCheetah-v5", 2, 8), ("Pendulum-v1", 3, 6)),
            repeats=1,
            iterations=3,
            skip=1,
            out=str(tmp_path / "gym"),
            results_md=str(md),
            gym_pairs=2,
            extra="--num-minibatches 2 --update-epochs 1 --hidden-sizes 8 8",
        )
    )
    data = json.loads((tmp_path / "gym" / "speed.json").read_text())
    rows = data["gym"]["rows"]
    assert [(r["env_id"], r["num_envs"], r["steps"]) for r in rows] == [("HalfCheetah-v5", 2, 8), ("Pendulum-v1", 3, 6)]
    has_envpool = importlib.util.find_spec("envpool") is not None
    for r in rows:
        assert all(
            r[k] > 0
            for k in ("env_raw", "env_contract", "rollout_floor", "rollout_trainer", "contract_ratio", "rollout_ratio")
        )
        assert ("env_envpool" in r) == has_envpool
    breakdowns = data["gym"]["breakdown"]  # HalfCheetah only: the sync vector env, then envpool's when installed
    assert [bd["vectorization"] for bd in breakdowns] == ["sync"] + (["envpool"] if has_envpool else [])
    for bd in breakdowns:
        assert bd["env_id"] == "HalfCheetah-v5" and bd["iterations"] == 2 and bd["env"] > 0 and bd["update"] > 0
        assert bd["env"] + bd["policy"] + bd["update"] + bd["rest"] == pytest.approx(bd["total"])
        assert bd["turns"] == 2 and bd["sps_vs_sync"] > 0
    assert breakdowns[0]["sps_vs_sync"] == 1.0  # sync against itself, turn by turn
    text = md.read_text()
    assert "<!-- BEGIN speed-gym-cpu -->" in text and "contract overhead" in text and "rest <= 10%" in text
    assert "| HalfCheetah-v5 | 2 | 8 | sync |" in text and "training SPS vs sync" in text
    assert ("| HalfCheetah-v5 | 2 | 8 | envpool |" in text) == has_envpool
    assert "| Pendulum-v1 | 3 |" in text and "![speed]" not in text  # tables only, no plot
    record = json.loads((tmp_path / "gym" / "provenance.json").read_text())
    assert record["command"] == data["invocation"] and record["commit"] == data["git"]["git_sha"]
    assert vars(ppo) == before["module"]  # nothing of the trainer was replaced
    assert (builders.make_env, run_logger.RunLogger.log) == (before["make_env"], before["log"])


def test_async_benchmark_end_to_end(tmp_path):
    """benchmarks/speed/async_speed.py on a tiny budget: one sync and one async run, their table, plot and json."""
    out, md = tmp_path / "async", tmp_path / "RESULTS.md"
    extra = "--num-envs 64 --num-steps 8 --num-minibatches 2 --update-epochs 1 --num-eval-envs 8 --num-eval-episodes 8"
    flags = ["--latencies", "2", "--seeds", "1", "--total-timesteps", "2048", "--hidden-sizes", "16", "16"]
    run_benchmark("benchmarks.speed.async_speed", *flags, f"--extra={extra}", out=out, md=md)
    data = json.loads((out / "async.json").read_text())
    assert [(r["mode"], r["latency_ms"]) for r in data["runs"]] == [("sync", 2.0), ("async", 2.0)]
    assert all(r["global_step"] == 2048 and r["wall_time_s"] > 4 * 8 * 0.002 for r in data["runs"])
    assert data["runs"][1]["dropped_rollouts"] == 0
    assert all("--compile off" in r["command"] for r in data["runs"])  # no first-run compile in the overlap timings
    record = json.loads((out / "provenance.json").read_text())  # what staleness is judged by
    assert record["runs"] == [r["command"] for r in data["runs"]] and record["commit"] == data["git"]["git_sha"]
    assert (out / "async.png").read_bytes()[:4] == b"\x89PNG"
    table_row = next(line for line in (out / "async.md").read_text().splitlines() if line.startswith("| 2 |"))
    assert "x ±" in table_row
    assert "<!-- BEGIN async-cpu -->" in md.read_text()


# ---- recheck: the code at hand against published runs --------------------------------------------------
def test_recheck_reproduces_a_published_run_and_names_the_point_that_differs(tmp_path, capsys):
    """A run published by its command and curves is re-run exactly (same training returns, same evaluations);
    a published point that the code does not reproduce is named, and the exit status says so."""
    recheck = importlib.import_module("benchmarks.suite.recheck")
    command = (
        "OMP_NUM_THREADS=1 python cleanrl_embodied/ppo_continuous.py --save-freq 0 --no-cuda "
        "--env-id PushCubeRL --num-envs 8 --num-steps 25 --total-timesteps 1000 --hidden-sizes 8 8 "
        "--num-minibatches 2 --update-epochs 1 --eval-freq 2 --num-eval-envs 4 --num-eval-episodes 4 --seed 1 "
        "--output-dir OUT"
    )
    argv, env = recheck.command_of({"command": command}, str(tmp_path / "published"))
    assert argv[0] == sys.executable and env["OMP_NUM_THREADS"] == "1" and str(tmp_path / "published") in argv
    subprocess.run(argv, cwd=benchlib.REPO, env=env, check=True, capture_output=True, timeout=300)
    run_dir = next((tmp_path / "published").rglob("summary.json")).parent
    curves = run.read_curves(run_dir)
    assert curves["charts/episodic_return"]["value"] and curves["eval/success_rate"]["value"]
    changed = json.loads(
        json.dumps(
            {
                "command": command,
                "script": "ppo_continuous",
                "seed": 1,
                "summary": {"global_step": 1000},
                "curves": curves,
            }
        )
    )
    step = changed["curves"]["charts/episodic_return"]["step"][-1]
    changed["curves"]["charts/episodic_return"]["value"][-1] += 1.0
    results = tmp_path / "results"
    results.mkdir()
    (results / "runs.json").write_text(
        json.dumps(
            {"git": {"git_sha": "0" * 40}, "versions": {"torch": "x"}, "runs": [{**changed, "task": "PushCubeRL"}]}
        )
    )

    status = recheck.main(recheck.Args(results=str(results), until_step=1000, poll_s=0.2))
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| ppo_continuous |"))
    assert status == 1  # a training point differs
    n_train, n_eval = len(curves["charts/episodic_return"]["step"]), len(curves["eval/success_rate"]["step"])
    assert f"eval/success_rate: {n_eval}/{n_eval} identical;" in row  # everything else reproduced exactly
    assert f"eval/episodic_return: {n_eval}/{n_eval} identical;" in row
    assert f"charts/episodic_return: {n_train - 1}/{n_train} identical (first difference at step {step})" in row
    with pytest.raises(SystemExit, match="--tasks/--seeds"):
        recheck.main(recheck.Args(results=str(results), tasks=("nope",)))


def test_recheck_refuses_to_compare_a_run_that_compiled_by_auto_s_choice():
    """--compile auto decides from the machine's record of earlier runs, and compiled code agrees with eager to float
    rounding only: such a run's points cannot be re-run exactly, and saying "differs" would blame the code."""
    recheck = importlib.import_module("benchmarks.suite.recheck")
    base = "python cleanrl_embodied/ppo_continuous.py --seed 1 --output-dir OUT"
    record = lambda flags, compiled: {
        "command": f"{base} {flags}",
        "summary": {"global_step": 10, "compiled": compiled},
    }
    assert recheck.compiled_by_auto(record("", True)) and recheck.compiled_by_auto(record("--compile auto", True))
    assert not recheck.compiled_by_auto(record("", False))  # auto chose eager: reproducible
    assert not recheck.compiled_by_auto(record("--compile on", True))  # asked for: the compiled fingerprint's path
    assert not recheck.compiled_by_auto(record("--compile=on", True))
    assert not recheck.compiled_by_auto({"command": base, "summary": {"global_step": 10}})  # (older records)
    assert "not comparable" in recheck.recheck(record("", True), 10, 0.1)["error"]


def test_a_suite_run_records_which_path_it_took(tmp_path):
    """run.py's record keeps summary.json's `compiled`, which recheck reads; the CPU plan's --compile off holds."""
    flags = ["--save-freq", "0", "--no-cuda", "--compile", "off", "--env-id", "PushCubeRL", "--num-envs", "8",
             "--num-steps", "25", "--total-timesteps", "400", "--hidden-sizes", "8", "8", "--num-minibatches", "2",
             "--update-epochs", "1", "--eval-freq", "0"]  # fmt: skip
    record = run.launch(run.RunSpec("ppo_continuous", "PushCubeRL", 1, flags), tmp_path / "run", run.Args())
    assert record["returncode"] == 0, record.get("error")
    assert record["summary"]["compiled"] is False and "--compile off" in record["command"]


# ---- vs_cleanrl: ours against CleanRL's script, side by side -------------------------------------------
def test_vs_cleanrl_steady_speed_is_steps_over_event_time_after_skip(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    vs = importlib.import_module("benchmarks.peers.vs_cleanrl")
    writer = SummaryWriter(str(tmp_path / "run"))
    # iterations of 2048 steps; the first two slow (start-up), then 4 s each
    for i, t in enumerate([100.0, 130.0, 140.0, 144.0, 148.0, 152.0]):
        writer.add_scalar("charts/learning_rate", 1e-3, (i + 1) * 2048, walltime=t)
    writer.close()
    sps, iterations = vs.steady_sps(tmp_path, skip=2)
    assert iterations == 3 and sps == pytest.approx(3 * 2048 / 12.0)
    with pytest.raises(RuntimeError, match="--skip 5"):
        vs.steady_sps(tmp_path, skip=5)


def test_vs_cleanrl_runs_both_scripts_with_cleanrl_settings_and_names_a_missing_peer(tmp_path):
    vs = importlib.import_module("benchmarks.peers.vs_cleanrl")
    args = vs.Args(cleanrl_script="/peer/cleanrl/ppo_continuous_action.py", total_timesteps=4096)
    theirs = vs.commands(args, tmp_path, "cleanrl", "/tmp/edited/ppo_continuous_action.py")
    assert theirs[:2] == [sys.executable, "/tmp/edited/ppo_continuous_action.py"]  # this project's environment
    assert " ".join(theirs[2:]) == "--env-id HalfCheetah-v4 --total-timesteps 4096 --seed 1 --cuda False"
    ours = vs.commands(args, tmp_path, "ours")
    flags = " ".join(ours[2:])
    for expected in (
        "--env-id HalfCheetah-v4",
        "--num-envs 1 ",
        "--num-steps 2048",
        "--num-minibatches 32",
        "--update-epochs 10",
        "--hidden-sizes 64 64",
        "--norm-obs",
        "--norm-reward",
        "--clip-vloss",
        "--total-timesteps 4096",
        "--eval-freq 0",
        f"--output-dir {tmp_path}",
    ):
        assert expected in flags, expected
    assert flags.count("--env-id") == 1 and flags.count("--total-timesteps") == 1  # overrides replace the config's
    with pytest.raises(SystemExit, match="--cleanrl-script must be CleanRL's ppo_continuous_action.py"):
        vs.main(vs.Args(cleanrl_script=str(tmp_path / "missing")))


def test_vs_cleanrl_makes_the_two_gymnasium_1_edits_once_each_and_refuses_another_script():
    """The edits turn CleanRL's 0.29 lines into 1.x ones, each found exactly once."""
    vs = importlib.import_module("benchmarks.peers.vs_cleanrl")
    (obs_before, obs_after), (log_before, log_after) = vs.GYMNASIUM_1_EDITS
    script = f"def make_env():\n    env = {obs_before}\n\nfor step in range(3):\n{log_before}" + (
        "f\"{info['episode']['r']}\")\n"
    )
    edited = vs.gymnasium_1_edits(script)
    assert obs_after in edited and log_after in edited and obs_before not in edited and "final_info" not in edited
    with pytest.raises(SystemExit, match="--cleanrl-script: expected one"):
        vs.gymnasium_1_edits(script.replace(obs_before, "env = something_else(env)"))


@needs("vla")
def test_vla_rl_commands_parse_with_the_scripts_and_point_at_their_seeds_start():
    """experiments/vla_rl.py: its behaviour-cloning, RL and control commands are accepted by bc.py's, the trainers'
    and dagger.py's Args (nothing is run); every run starts from its own seed's behaviour-cloned model; each row
    passes its knob and nothing else differs between the rows of one trainer."""
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    bc = importlib.import_module("examples.hf_vla.bc")
    dagger = importlib.import_module("examples.hf_vla.dagger")
    args = vla_rl.Args(runs_dir="/tmp/vla", seeds=(2,), obs_mode="proprio+rgb")
    bc_args = tyro.cli(bc.Args, args=vla_rl.bc_command(args, 2)[2:])
    assert bc_args.out == "/tmp/vla/bc_s2" and bc_args.seed == 2 and bc_args.demo_noise == 0.3
    assert json.loads(bc_args.env_kwargs)["obs_mode"] == "proprio+rgb"
    parsed = {}
    for row, (_, script, extra) in vla_rl.ROWS.items():
        if script is None:
            continue
        cmd = vla_rl.row_command(args, row, 2)
        assert cmd[1].endswith(f"cleanrl_embodied/{script}.py") and cmd[-len(extra) :] == extra if extra else True
        parsed[row] = tyro.cli(importlib.import_module(f"cleanrl_embodied.{script}").Args, args=cmd[2:])
        assert json.loads(parsed[row].policy_kwargs) == {"model_path": "/tmp/vla/bc_s2"} and parsed[row].seed == 2
        env_kwargs = json.loads(parsed[row].env_kwargs)
        assert env_kwargs["reward_weights"]["success"] == 1 and env_kwargs["obs_mode"] == "proprio+rgb"
        assert parsed[row].output_dir == f"/tmp/vla/{row}_s2" and parsed[row].total_timesteps == args.timesteps
        assert parsed[row].compile == "off"  # (auto decides by timing an iteration: the load would pick)
    assert parsed["grpo"].advantage == "episode" and not parsed["grpo"].filter_groups
    assert parsed["grpo_dyn"].min_informative_groups == 16 and parsed["grpo"].min_informative_groups == 0
    assert parsed["ppo_warm"].critic_warmup_iterations == 2 and parsed["ppo"].critic_warmup_iterations == 0
    assert parsed["grpo_temp"].temperature == 1.6 and parsed["grpo"].temperature == 1.0
    assert parsed["grpo_filter"].filter_groups
    control = tyro.cli(dagger.Args, args=vla_rl.row_command(args, "dagger", 2, 6.5)[2:])
    assert control.model_path == "/tmp/vla/bc_s2" and control.cpu_minutes == 6.5 and control.seed == 2
    with pytest.raises(SystemExit, match="--rows nope: not a row"):
        vla_rl.main(vla_rl.Args(rows=("grpo", "nope")))


def test_vla_rl_intervals_are_t_intervals_over_seeds():
    """The report's mean ± 95% interval: Student's t with n-1 degrees of freedom times the standard error."""
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    assert vla_rl.interval([0.5, 0.7]) == f"0.60 ± {12.706 * np.std([0.5, 0.7], ddof=1) / np.sqrt(2):.2f}"
    values = [0.1, 0.3, 0.2, 0.6]
    assert vla_rl.signed(values) == f"+0.30 ± {3.182 * np.std(values, ddof=1) / 2:.2f}"
    assert vla_rl.interval([0.4]) == "0.40" and vla_rl.signed([-0.1, -0.1]) == "-0.10 ± 0.00"


def test_vla_rl_report_pairs_every_row_with_its_own_seeds_start_and_control():
    """The report's gain and difference to the control are differences within a seed, averaged over seeds."""
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")

    def result(train, heldout):
        return {"train": {"success_rate": train}, "heldout": {"success_rate": heldout}}

    seeds = {
        "1": {"final_eval": {"bc": result(0.2, 0.1), "grpo": result(0.5, 0.2), "dagger": result(0.3, 0.1)}},
        "2": {"final_eval": {"bc": result(0.6, 0.3), "grpo": result(0.7, 0.3), "dagger": result(0.9, 0.4)}},
    }
    for entry in seeds.values():
        entry.update(times={}, curves={})
    data = {"seeds": seeds, "final_eval_episodes": 8, "rows": ["grpo", "dagger"], "obs_mode": "state+rgb",
            "timesteps": 1000, "commands": {}}  # fmt: skip
    table = vla_rl.report(data).split("\n")
    grpo = next(line for line in table if line.startswith("| GRPO |"))
    assert f"| {vla_rl.signed([0.3, 0.1])} | {vla_rl.signed([0.5 - 0.3, 0.7 - 0.9])} |" in grpo  # gain, - control
    assert vla_rl.signed([0.5 - 0.3, 0.7 - 0.9]).startswith("+0.00 ± ")
    assert f"| {vla_rl.signed([0.2 - 0.1, 0.3 - 0.4])} |" in grpo  # held out, minus the control's held out
    assert "0.20 (in the band)" in vla_rl.report(data) and "0.60 (in the band)" in vla_rl.report(data)


def test_vla_rl_paired_env_gives_every_evaluation_the_same_starts():
    """The premise of experiments/vla_rl.py's paired evaluation: evaluations that reset its envs with its seed see
    the same first observations (image, state, instruction of every env) whatever was played before, another
    seed's envs see other ones, and the held-out instructions come with the same starts and tasks in other words."""
    import torch

    from cleanrl_embodied.shared.envs.push_cube import HELDOUT_INSTRUCTIONS, TASKS
    from cleanrl_embodied.shared.evaluation import evaluate
    from cleanrl_embodied.shared.language import decode_instructions

    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    args = vla_rl.Args(final_eval_episodes=6)

    def first_obs(env, reset_seed, action):
        seen = []

        def act(obs, generator, starts):
            seen.append(obs.clone())
            return torch.full((env.num_envs, 3), action)

        evaluate(act, env, env.num_envs, reset_seed)
        return seen[0]

    env, reset_seed = vla_rl.paired_env(args, 1, "train")
    a, b = first_obs(env, reset_seed, 1.0), first_obs(env, reset_seed, -1.0)
    assert all(torch.equal(a[k], b[k]) for k in a.keys(True, True))
    other_env, other_seed = vla_rl.paired_env(args, 2, "train")
    c = first_obs(other_env, other_seed, 1.0)
    assert not torch.equal(a["state"], c["state"])
    heldout_env, heldout_seed = vla_rl.paired_env(args, 1, "heldout")
    h = first_obs(heldout_env, heldout_seed, 1.0)
    assert torch.equal(h["state"], a["state"]) and torch.equal(h["rgb"], a["rgb"])
    tasks = {text: name for name, (_, text) in TASKS.items()}
    for trained, heldout in zip(decode_instructions(a["instruction"]), decode_instructions(h["instruction"])):
        assert heldout in HELDOUT_INSTRUCTIONS[tasks[trained]]


@needs("vla")
def test_vla_rl_final_eval_loads_each_checkpoint_on_its_start_and_keeps_results(tmp_path, monkeypatch):
    """experiments/vla_rl.py's paired final evaluation: a checkpoint holding the start's own weights scores exactly
    what the start scores, a checkpoint of another base is refused, and results are kept until a checkpoint
    is written again."""
    import torch

    from cleanrl_embodied.shared.envs import make_env
    from cleanrl_embodied.shared.model_state import frozen_fingerprint, model_state
    from examples.hf_vla import make_policy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    args = vla_rl.Args(runs_dir=str(tmp_path), seeds=(1,), final_eval_episodes=6)
    env = make_env("PushCubeLangRL", num_envs=1, **vla_rl.env_options(args))
    flags = SimpleNamespace(action_head="bins", action_bins=16, action_chunk=1)
    spaces = (env.single_observation_space, env.single_action_space)
    make_policy(*spaces, flags).save_pretrained(tmp_path / "bc_s1")
    policy = make_policy(*spaces, flags, model_path=str(tmp_path / "bc_s1"))

    def save_run(algo: str, frozen: str) -> Path:
        run = tmp_path / f"{algo}_s1" / "run"
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        torch.save({"model": model_state(policy), "frozen": frozen}, run / "checkpoints/last.pt")
        (run / "summary.json").write_text("{}")
        return run

    grpo_run = save_run("grpo", frozen_fingerprint(policy))
    results = vla_rl.final_eval(args, 1)
    assert set(results) == {"bc", "grpo"} and results["grpo"] == results["bc"]
    assert set(results["bc"]) == {"train", "heldout"}
    cached = json.loads((tmp_path / "final_eval_s1.json").read_text())
    assert cached["results"] == results and cached["key"]["episodes"] == 6
    assert vla_rl.final_eval(args, 1) == results
    save_run("grpo", "another base")  # the checkpoint written again (new mtime): evaluated again, and refused
    os.utime(grpo_run / "checkpoints/last.pt", ns=(1, 1))
    with pytest.raises(SystemExit, match="frozen weights"):
        vla_rl.final_eval(args, 1)


class _RunsCode:
    """A pickle that runs a shell command when it is loaded without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@needs("vla")
def test_vla_rl_final_eval_refuses_a_checkpoint_that_would_run_code(tmp_path, monkeypatch):
    """A planted last.pt whose unpickling calls os.system is refused in one line and runs nothing."""
    import torch

    from cleanrl_embodied.shared.envs import make_env
    from examples.hf_vla import make_policy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vla_rl = importlib.import_module("benchmarks.experiments.vla_rl")
    args = vla_rl.Args(runs_dir=str(tmp_path), seeds=(1,), final_eval_episodes=2)
    env = make_env("PushCubeLangRL", num_envs=1, **vla_rl.env_options(args))
    flags = SimpleNamespace(action_head="bins", action_bins=16, action_chunk=1)
    make_policy(env.single_observation_space, env.single_action_space, flags).save_pretrained(tmp_path / "bc_s1")
    run = tmp_path / "ppo_s1" / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    marker = tmp_path / "code_ran"
    torch.save({"model": _RunsCode(marker)}, run / "checkpoints/last.pt")
    with pytest.raises(SystemExit) as e:
        vla_rl.final_eval(args, 1)
    assert str(e.value.code).startswith("error: ") and "not a readable checkpoint" in str(e.value.code)
    assert "\n" not in str(e.value.code) and not marker.exists()


def test_bisect_numbers_finds_every_change_asking_few_commits():
    bisect = importlib.import_module("benchmarks.archaeology.bisect_numbers")
    prints = list("aaaaabbbbbbbbbbcccccccccccccccccccdd")
    asked = []

    def at(i):
        asked.append(i)
        return prints[i]

    assert bisect.change_points(at, len(prints)) == [5, 15, 34]
    assert len(set(asked)) < len(prints) // 2
    assert bisect.change_points(lambda i: "same", 40) == []


def test_curves_at_welch_interval_is_students_for_equal_groups():
    """Two groups of 5 with equal variance: Welch's degrees of freedom are 8, the half-width t(0.975, 8) x SE."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    a, b = [0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.4, 0.5, 0.6, 0.7]
    diff, half = curves_at.welch(a, b)
    assert diff == pytest.approx(0.2) and half == pytest.approx(2.306004 * (2 * 0.025 / 5) ** 0.5)


def test_curves_at_reports_the_proxy_per_commit_from_finished_runs_without_running_them(tmp_path, capsys):
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    results = tmp_path / "published"
    results.mkdir()
    runs = [
        {"task": "T", "seed": s, "command": f"python cleanrl_embodied/ppo_continuous.py --seed {s}"} for s in (1, 2)
    ]
    (results / "runs.json").write_text(json.dumps({"runs": runs}))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    curve = {"charts/success_rate": [[100, 200, 300], [0.0, 0.5, 1.0]]}  # the proxy to step 200: 0.25
    done = [{**curves_at.run_key(head, r["seed"], "T", curves_at.folder_name(str(results)), r["command"], 200),
             "curves": curve, "wall_s": 1.0} for r in runs]  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    (out / "curves.json").write_text(json.dumps({"form": 2, "runs": done}))
    args = curves_at.Args(results=str(results), task="T", commits=("HEAD",), seeds=(1, 2), until_step=200, out=str(out))
    curves_at.main(args)
    report = (out / "report.md").read_text()
    assert "| 0.250 | 0.250 | **0.250** ± 0.000 (n=2) |" in report
    assert json.loads((out / "provenance.json").read_text())["commit"]
    # a seed curves.json lacks, not run: shown as such, the mean over the seeds there are
    no_runs = curves_at.Args(**{**vars(args), "seeds": (1, 2, 3), "run_missing": False})
    curves_at.main(no_runs)
    assert "| 0.250 | 0.250 | – | **0.250** ± 0.000 (n=2) |" in (out / "report.md").read_text()
    # commits pooled as one learner: a group of one commit against itself differs by 0 (an interval of 0 width)
    curves_at.main(curves_at.Args(**{**vars(args), "pool": ("a=HEAD", "b=HEAD")}))
    assert "| b | HEAD | 2 | 0.250 ± 0.000 | +0.000 ± 0.000 |" in (out / "report.md").read_text()
    with pytest.raises(SystemExit, match="--pool a=HEAD: fewer than 2"):
        curves_at.main(curves_at.Args(**{**vars(args), "seeds": (1,), "pool": ("a=HEAD",)}))
    with pytest.raises(SystemExit, match="--task: .* has no run of 'U'"):
        curves_at.main(curves_at.Args(results=str(results), task="U", out=str(out)))


def _published(folder: Path, tasks=("T",), seeds=(1, 2), flags: str = "") -> Path:
    """A results folder whose runs.json has a run of each task and seed (1,000-step schedules)."""
    folder.mkdir(parents=True, exist_ok=True)
    trainer = "python cleanrl_embodied/ppo_continuous.py --total-timesteps 1000"
    runs = [{"task": t, "seed": s, "command": f"{trainer}{flags} --seed {s} --output-dir runs/{t}_{s}"}
            for t in tasks for s in seeds]  # fmt: skip
    (folder / "runs.json").write_text(json.dumps({"runs": runs}))
    return folder


def _fake_runs(curves_at, monkeypatch) -> list:
    """curves_at.run_at replaced: it records (task, seed, until_step) and returns a flat curve of 0.9 (task T) or
    0.1 (task U)."""
    ran = []

    def run_at(commit, run, until_step):
        ran.append((run["task"], run["seed"], until_step))
        value = {"T": 0.9, "U": 0.1}[run["task"]]
        return {"curves": {"charts/success_rate": [[100, 200, 300], [value] * 3]}, "wall_s": 1.0}

    monkeypatch.setattr(curves_at, "run_at", run_at)
    return ran


def test_curves_at_runs_again_for_another_task_results_folder_budget_or_command(tmp_path, monkeypatch):
    """A run in curves.json is reused only by the same commit, seed, task, results folder, command and --until-step;
    the report names the schedules that were run."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    ran = _fake_runs(curves_at, monkeypatch)
    results, out = _published(tmp_path / "published", tasks=("T", "U")), tmp_path / "out"
    args = curves_at.Args(results=str(results), task="T", seeds=(1, 2), until_step=200, jobs=1, out=str(out))
    curves_at.main(args)
    assert ran == [("T", 1, 200), ("T", 2, 200)]
    report = (out / "report.md").read_text()
    prose = "\n".join(line for line in report.splitlines() if not line.startswith("|"))  # the table quotes subjects
    assert "**0.900**" in report and "(1,000-step schedules, stopped at 200)" in prose and "512k" not in prose
    curves_at.main(args)  # the same runs: read, not run again
    assert len(ran) == 2
    curves_at.main(replace(args, task="U"))  # another task of the same folder
    assert ran[2:] == [("U", 1, 200), ("U", 2, 200)] and "**0.100**" in (out / "report.md").read_text()
    curves_at.main(replace(args, until_step=300))  # another step budget
    assert ran[4:] == [("T", 1, 300), ("T", 2, 300)]
    other = _published(tmp_path / "other")  # another results folder
    curves_at.main(replace(args, results=str(other)))
    assert ran[6:] == [("T", 1, 200), ("T", 2, 200)]
    _published(results, tasks=("T", "U"), flags=" --learning-rate 1e-3")  # the folder's commands changed
    curves_at.main(args)
    assert ran[8:] == [("T", 1, 200), ("T", 2, 200)]
    # every run is kept: with --no-run-missing the first ones are still read (the commands as they were)
    _published(results, tasks=("T", "U"))
    curves_at.main(replace(args, task="U", run_missing=False))
    assert len(ran) == 10 and "| 0.100 | 0.100 | **0.100**" in (out / "report.md").read_text()
    assert len(json.loads((out / "curves.json").read_text())["runs"]) == 10


def test_curves_at_saves_curves_json_whole_or_not_at_all(tmp_path, monkeypatch):
    """curves.json is written to a temp file and renamed over the old one after each run: a save that fails (here
    the rename) leaves the previous file as it was, and no temp file."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    _fake_runs(curves_at, monkeypatch)
    out = tmp_path / "out"
    args = curves_at.Args(results=str(_published(tmp_path / "p")), task="T", seeds=(1,), until_step=200, jobs=1,
                          out=str(out))  # fmt: skip
    curves_at.main(args)
    before = (out / "curves.json").read_text()

    def full_disk(*_):
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="no space left"):
        curves_at.main(replace(args, seeds=(1, 2)))
    assert (out / "curves.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["curves.json", "provenance.json", "report.md"]


def test_curves_at_reads_an_old_curves_json_as_the_runs_its_provenance_names(tmp_path, monkeypatch):
    """A curves.json of the old form (keys `commit:seed`) is read as the runs of the task, results folder, commands
    and --until-step its folder's provenance.json records, and of nothing else."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    ran = _fake_runs(curves_at, monkeypatch)
    results, out = _published(tmp_path / "published", tasks=("T", "U")), tmp_path / "out"
    out.mkdir()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    curve = {"charts/success_rate": [[100, 200, 300], [0.0, 0.5, 1.0]]}  # the proxy to step 200: 0.25
    (out / "curves.json").write_text(json.dumps({f"{head}:{s}": {"curves": curve, "wall_s": 1.0} for s in (1, 2)}))
    published = json.loads((results / "runs.json").read_text())["runs"]
    command = (f"uv run python -m benchmarks.archaeology.curves_at --results {results} --task T --seeds 1 2 "
               "--until-step 200")  # fmt: skip
    (out / "provenance.json").write_text(json.dumps({"command": command, "runs": [r["command"] for r in published
                                                                                  if r["task"] == "T"]}))  # fmt: skip
    args = curves_at.Args(results=str(results), task="T", seeds=(1, 2), until_step=200, jobs=1, out=str(out))
    curves_at.main(args)
    assert ran == [] and "| 0.250 | 0.250 | **0.250** ± 0.000 (n=2) |" in (out / "report.md").read_text()
    curves_at.main(replace(args, task="U"))
    assert ran == [("U", 1, 200), ("U", 2, 200)]
    curves_at.main(replace(args, until_step=300))
    assert ran[2:] == [("T", 1, 300), ("T", 2, 300)]
    # without a provenance.json nothing says what the runs were: refused in one line
    (out / "curves.json").write_text(json.dumps({f"{head}:1": {"curves": curve, "wall_s": 1.0}}))
    (out / "provenance.json").unlink()
    message = exits_in_one_line(lambda: curves_at.main(args))
    assert message.startswith(f"error: --out {out}: its curves.json has runs keyed by commit and seed only"), message


def test_curves_at_redraws_the_published_pixel_bisect_table_from_its_curves_json(tmp_path):
    """docs/results/pixel-bisect-cpu: its curves.json, read with the command its provenance records, gives the
    report's table again without running anything."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    published = REPO / "docs/results/pixel-bisect-cpu"
    command = shlex.split(json.loads((published / "provenance.json").read_text())["command"])
    args = tyro.cli(curves_at.Args, args=command[command.index("benchmarks.archaeology.curves_at") + 1 :])
    (tmp_path / "curves.json").write_bytes((published / "curves.json").read_bytes())
    cwd = os.getcwd()
    try:
        os.chdir(REPO)  # --results is relative to the repository
        curves_at.main(replace(args, out=str(tmp_path), run_missing=False))
    finally:
        os.chdir(cwd)

    def table_rows(text):
        return [line for line in text.splitlines() if line.startswith("| `") or line.startswith("| before")]

    assert table_rows((tmp_path / "report.md").read_text()) == table_rows((published / "report.md").read_text())
    assert len(table_rows((published / "report.md").read_text())) == 5


def test_curves_at_names_a_mistyped_commit_or_a_command_without_seed_in_one_line(tmp_path, monkeypatch):
    """Bad input stops before any run with `error: ...` naming the flag, not a traceback."""
    curves_at = importlib.import_module("benchmarks.archaeology.curves_at")
    ran = _fake_runs(curves_at, monkeypatch)
    results = _published(tmp_path / "p", seeds=(1,))
    args = curves_at.Args(results=str(results), task="T", seeds=(1,), until_step=200, out=str(tmp_path / "out"))
    message = exits_in_one_line(lambda: curves_at.main(replace(args, commits=("HEAD", "nope123"))))
    assert message.startswith("error: --commits nope123: not a commit"), message
    message = exits_in_one_line(lambda: curves_at.main(replace(args, pool=("a=HEAD,nope123",))))
    assert message.startswith("error: --pool a=HEAD,nope123: nope123 is not a commit"), message
    message = exits_in_one_line(lambda: curves_at.main(replace(args, pool=("HEAD",))))
    assert message.startswith("error: --pool HEAD: not NAME=COMMIT,COMMIT"), message
    runs = [{"task": "T", "seed": 1, "command": "python cleanrl_embodied/ppo_continuous.py --output-dir x"}]
    (results / "runs.json").write_text(json.dumps({"runs": runs}))
    message = exits_in_one_line(lambda: curves_at.main(replace(args, seeds=(1, 2))))
    assert message.startswith("error: --seeds 2: ") and "has no --seed" in message, message
    assert ran == []


def test_bisect_numbers_names_a_mistyped_commit_in_one_line(tmp_path):
    bisect = importlib.import_module("benchmarks.archaeology.bisect_numbers")
    command = "python cleanrl_embodied/ppo_continuous.py --seed 1"
    for flag, args in (("--good", bisect.Args(good="nope123", command=command)),
                       ("--bad", bisect.Args(good="HEAD", bad="nope123", command=command))):  # fmt: skip
        message = exits_in_one_line(lambda args=args: bisect.main(args))
        assert message.startswith(f"error: {flag} nope123: not a commit"), message
    message = exits_in_one_line(lambda: bisect.main(bisect.Args(good="HEAD", command="python x.py --seed '1")))
    assert message.startswith("error: --command: "), message
    bisect_numbers = [sys.executable, "-m", "benchmarks.archaeology.bisect_numbers"]
    proc = subprocess.run([*bisect_numbers, "--good", "nope123", "--command", command],
                          capture_output=True, text=True, env=subprocess_env())  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.startswith("error: --good nope123: not a commit") and proc.stderr.count("\n") == 1, proc.stderr


def test_bisect_numbers_reads_a_trainer_checkpoint_and_refuses_a_pickle_that_would_run_code(tmp_path):
    """Parameters are read with torch.load(weights_only=True): a trainer's last.pt is read; a last.pt whose
    unpickling would call os.system makes that commit's fingerprint `failed: ...` and runs nothing."""
    import torch

    from cleanrl_embodied import ppo_continuous

    bisect = importlib.import_module("benchmarks.archaeology.bisect_numbers")
    out = ppo_continuous.main(tiny_args("ppo_continuous", tmp_path / "run", TWO_SAVED_ITERATIONS))
    sums = bisect.parameter_sums(Path(out["run_dir"]) / "checkpoints" / "last.pt")
    assert len(sums) >= 4 and all(len(s) == 2 for s in sums) and any(s[1] > 0 for s in sums)
    marker = tmp_path / "code_ran"
    torch.save({"model": {"w": torch.ones(2)}, "extra": _RunsCode(marker)}, tmp_path / "last.pt")
    with pytest.raises(pickle.UnpicklingError):
        bisect.parameter_sums(tmp_path / "last.pt")
    assert not marker.exists()
    # the same through a whole fingerprint: a command that logs a scalar and plants such a last.pt (at HEAD)
    code = f"""import os, sys, torch
from torch.utils.tensorboard import SummaryWriter
out = sys.argv[sys.argv.index("--output-dir") + 1]
writer = SummaryWriter(out)
writer.add_scalar("losses/x", 1.0, 0)
writer.close()
os.makedirs(out + "/checkpoints")
class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
torch.save({{"model": {{"w": torch.ones(2)}}, "extra": RunsCode()}}, out + "/checkpoints/last.pt")
"""
    printed = bisect.fingerprint("HEAD", f"python -c {shlex.quote(code)}")
    assert printed.startswith("failed: ") and "weights_only" in printed and "\n" not in printed, printed
    assert not marker.exists()


@needs("vla")
def test_vla_fewshot_commands_parse_with_the_scripts_and_start_from_the_pretraining_and_the_seeds_start():
    """experiments/vla_fewshot.py: its pretraining, demonstrations, few-shot, RL, control and oracle commands are
    accepted by the scripts' Args (nothing is run); the start reads the pretraining output of its observation mode
    and its seed's demonstrations, every row starts from the seed's start, and the RL rows run on the target (the
    held-out diagonal tasks through the pretraining's window) with a 0/1 reward."""
    fs = importlib.import_module("benchmarks.experiments.vla_fewshot")
    pretrain, demos, fewshot = (importlib.import_module(f"examples.hf_vla.{m}") for m in ("pretrain", "demos",
                                                                                            "fewshot"))  # fmt: skip
    dagger = importlib.import_module("examples.hf_vla.dagger")
    args = fs.Args(runs_dir="/tmp/vf", seeds=(2,))
    assert tyro.cli(pretrain.Args, args=fs.pretrain_command(args)[2:]).out == "/tmp/vf/pretrain"
    recorded = tyro.cli(demos.Args, args=fs.demos_command(args, "proprio+rgb", 2)[2:])
    target = json.loads(recorded.env_kwargs)
    assert recorded.seed == 2 and recorded.per_task == 10 and recorded.out == "/tmp/vf/proprio_rgb/demos_s2.pt"
    assert target["tasks"] == list(pretrain.HELDOUT_TASKS) and target["obs_mode"] == "proprio+rgb"
    assert target["view_tasks"] == list(pretrain.Args().view_tasks)
    start = tyro.cli(fewshot.Args, args=fs.start_command(args, "state+rgb", 1, 2)[2:])
    assert start.base == "/tmp/vf/pretrain/state_rgb" and start.demos == "/tmp/vf/state_rgb/demos_s2.pt"
    assert start.k == 1 and start.seed == 2 and start.out == "/tmp/vf/state_rgb/k1/start_s2"
    for row in ("grpo", "ppo"):
        cmd = fs.row_command(args, "proprio+rgb", 10, row, 2)
        parsed = tyro.cli(importlib.import_module(f"cleanrl_embodied.{fs.ROWS[row][1]}").Args, args=cmd[2:])
        assert json.loads(parsed.policy_kwargs) == {"model_path": "/tmp/vf/proprio_rgb/k10/start_s2"}
        env_kwargs = json.loads(parsed.env_kwargs)
        assert env_kwargs["reward_weights"]["success"] == 1 and env_kwargs["tasks"] == target["tasks"]
        assert parsed.seed == 2 and parsed.total_timesteps == args.timesteps and parsed.compile == "off"
    control = tyro.cli(fewshot.Args, args=fs.row_command(args, "proprio+rgb", 10, "sft", 2, 6.5)[2:])
    assert control.start == "/tmp/vf/proprio_rgb/k10/start_s2" and control.cpu_minutes == 6.5 and control.base is None
    oracle = tyro.cli(dagger.Args, args=fs.row_command(args, "proprio+rgb", 10, "dagger", 2, 6.5)[2:])
    assert oracle.model_path == control.start and oracle.cpu_minutes == 6.5 and oracle.seed == 2
    with pytest.raises(SystemExit, match="--rows / --obs-modes nope"):
        fs.main(fs.Args(rows=("grpo", "nope")))
    with pytest.raises(SystemExit, match="--ks 11: each K must be 1..--per-task"):
        fs.main(fs.Args(ks=(11,)))


@needs("vla")
def test_vla_fewshot_report_pairs_rows_with_the_seeds_control_and_states_the_goal():
    """The report's differences to the control are within a seed; the goal line says whether RL beats the control
    by >= 0.15 at K = 1 on proprio+rgb with the interval above 0, and whether the start is above 0.2."""
    fs = importlib.import_module("benchmarks.experiments.vla_fewshot")

    def result(train, heldout):
        return {"train": {"success_rate": train}, "heldout": {"success_rate": heldout}}

    values = {"1": (0.3, 0.8, 0.4), "2": (0.25, 0.7, 0.3), "3": (0.2, 0.9, 0.5)}  # start, grpo, sft
    seeds = {s: {"final_eval": {"start": result(a, 0.1), "grpo": result(b, 0.2), "sft": result(c, 0.1)},
                 "times": {}, "curves": {}} for s, (a, b, c) in values.items()}  # fmt: skip
    data = {"cells": {"proprio+rgb K=1": {"mode": "proprio+rgb", "k": 1, "seeds": seeds}}, "pretrain": None,
            "pretrain_time": None, "missing": [("state+rgb", 1, 1, "start")], "commands": ["x"],
            "rows": ["grpo", "sft"], "timesteps": 1000, "final_eval_episodes": 8, "fewshot_steps": 10}  # fmt: skip
    text = fs.report(data)
    grpo = next(line for line in text.split("\n") if line.startswith("| GRPO |"))
    diff = [0.8 - 0.4, 0.7 - 0.3, 0.9 - 0.5]
    assert f"| {fs.vla_runs.signed(diff)} |" in grpo
    assert "start 0.25 (above 0.2)" in text and "GRPO - control +0.40 ± 0.00 (met)" in text
    assert "Not run: state+rgb K=1 seed 1 start" in text


@needs("vla")
def test_vla_fewshot_goal_uses_the_exact_t_interval_of_nine_seeds():
    """Nine seeds whose RL - control difference is +0.20: with t(8) = 2.306 the interval reaches below 0 (not met);
    the old table's 1.96 for 8 degrees of freedom would have called it met."""
    fs = importlib.import_module("benchmarks.experiments.vla_fewshot")

    def result(train):
        return {"train": {"success_rate": train}, "heldout": {"success_rate": 0.0}}

    diffs = [0.2 + d for d in (-0.43, 0.43, -0.2, 0.2, 0.0, -0.1, 0.1, -0.3, 0.3)]
    seeds = {str(i): {"final_eval": {"start": result(0.3), "grpo": result(0.3 + d), "sft": result(0.3)}, "times": {},
                      "curves": {}} for i, d in enumerate(diffs)}  # fmt: skip
    data = {"cells": {"proprio+rgb K=1": {"mode": "proprio+rgb", "k": 1, "seeds": seeds}}, "rows": ["grpo", "sft"]}
    se = np.std(diffs, ddof=1) / 3
    assert 1.96 * se < 0.2 < 2.306 * se
    assert f"GRPO - control +0.20 ± {2.306004 * se:.2f} (not met)" in fs.goal_line(data)


def test_fingerprints_at_runs_todays_fingerprint_on_a_commits_code_and_says_where_it_differs(monkeypatch, capsys):
    """HEAD's code gives today's golden file within the fingerprints' tolerance (the fingerprint runs in a worktree of
    that commit, removed after; bit for bit only on a CPU that rounds as the one that wrote the golden file did: on
    2026-12-02 an AMD EPYC here gave values that differ from it in the 8th digit); a record that moved beyond the
    tolerance is reported as differing (exit status 1), one that failed to run as failed; a mistyped commit or
    fingerprint name is one line."""
    fingerprints_at = importlib.import_module("benchmarks.archaeology.fingerprints_at")
    from tests.numerics import FINGERPRINTS, first_difference

    name = "env-PushCubeRL-dropout"
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    result = fingerprints_at.run_at("HEAD", [name])
    assert "error" not in result[name], result
    golden = json.loads(FINGERPRINTS[name].golden.read_text())["record"]
    assert first_difference(golden, json.loads(json.dumps(result[name]["record"]))) is None
    assert subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout == worktrees

    def scaled(x):  # every float 10% off, as a changed reward weight would move them
        if isinstance(x, dict):
            return {k: scaled(v) for k, v in x.items()}
        if isinstance(x, list):
            return [scaled(v) for v in x]
        return x * 1.1 if isinstance(x, float) else x

    moved = scaled(golden)
    runs = {"abc1234": {name: {"record": moved}}, "def5678": {name: {"error": "ImportError: gone"}}}
    monkeypatch.setattr(fingerprints_at, "run_at", lambda commit, names: runs[commit])
    assert fingerprints_at.main(fingerprints_at.Args(commits=("abc1234", "def5678"), names=(name,))) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"abc1234 {name}: differs: ") and out[1] == f"def5678 {name}: failed: ImportError: gone"
    runs["abc1234"] = {name: {"record": golden}}
    assert fingerprints_at.main(fingerprints_at.Args(commits=("abc1234",), names=(name,))) == 0
    assert capsys.readouterr().out == f"abc1234 {name}: today's golden file (bit for bit)\n"

    monkeypatch.undo()
    message = exits_in_one_line(lambda: fingerprints_at.run_at("nope123", [name]))
    assert message == "error: --commits nope123: not a commit of this repository", message
    message = exits_in_one_line(lambda: fingerprints_at.main(fingerprints_at.Args(commits=("HEAD",), names=("x",))))
    assert message.startswith("error: --names x: one or more of ") and name in message, message


def test_compile_cost_plans_three_runs_a_round_and_reports_the_ratio_and_the_cost(tmp_path):
    """Each round: eager, compiled with Inductor's caches emptied, compiled again on the caches that left (one
    cache folder a round, each run its own compile_times.json); the report's ratio and cost are the medians of what
    the runs recorded; bad sizes are one line."""
    compile_cost = importlib.import_module("benchmarks.speed.compile_cost")
    specs = compile_cost.main(compile_cost.Args(rounds=2, iterations=12, dry_run=True, out=str(tmp_path / "o")))
    assert [(s["round"], s["mode"], s["cold"]) for s in specs] == [
        (r, m, c) for r in (1, 2) for m, c in (("eager", False), ("compiled, caches empty", True),
                                               ("compiled, caches warm", False))]  # fmt: skip
    assert [s["command"][s["command"].index("--compile") + 1] for s in specs[:3]] == ["off", "on", "on"]
    assert specs[1]["env"]["TORCHINDUCTOR_CACHE_DIR"] == specs[2]["env"]["TORCHINDUCTOR_CACHE_DIR"]
    assert specs[1]["env"]["TORCHINDUCTOR_CACHE_DIR"] != specs[4]["env"]["TORCHINDUCTOR_CACHE_DIR"]
    assert len({s["env"]["CLEANRL_EMBODIED_COMPILE_TIMES"] for s in specs}) == 6
    steps = int(specs[0]["command"][specs[0]["command"].index("--total-timesteps") + 1])
    assert steps == 12 * 256 * 20  # ppo_continuous's defaults: 256 envs x 20 steps an iteration

    runs = [
        {"round": r, "mode": "eager", "eager_s": e, "whole_s": 20.0, "command": "c"} for r, e in ((1, 0.2), (2, 0.4))
    ]
    runs += [{"round": r, "mode": "compiled, caches empty", "compiled_s": 0.15, "compile_s": c, "whole_s": 30.0,
              "command": "c"} for r, c in ((1, 10.0), (2, 14.0))]  # fmt: skip
    data = {"args": {"script": "ppo_continuous", "flags": "--env-id PushCubeRL", "iterations": 12, "rounds": 2},
            "command": "uv run python -m benchmarks.speed.compile_cost", "machine": benchlib.machine_info(),
            "versions": {"torch": "2"}, "git": {"git_sha": "abc", "git_dirty": False}, "runs": runs}  # fmt: skip
    text = compile_cost.report(data)
    assert "| eager | 2 | 0.300 | 1.00x |  | 20.0 |" in text, text
    assert "| compiled, caches empty | 2 | 0.150 | 0.50x | 12.0 (10.0-14.0) | 30.0 |" in text, text
    for flag, value in (("iterations", 9), ("rounds", 0)):
        message = exits_in_one_line(lambda f=flag, v=value: compile_cost.main(compile_cost.Args(**{f: v})))
        assert message.startswith(f"error: --{flag} {value}: "), message


@pytest.mark.parametrize(
    ("layout", "runs_as_module"), [("benchmarks/speed/speed.py", True), ("benchmarks/speed.py", False)]
)
def test_update_vs_finds_speed_py_in_either_layout(tmp_path, layout, runs_as_module):
    # update_vs measures this checkout against an older commit, whose benchmarks/ may still be flat.
    from benchmarks.speed import update_vs

    assert update_vs.speed_script(tmp_path) is None
    script = tmp_path / layout
    script.parent.mkdir(parents=True)
    script.write_text("")
    assert update_vs.speed_script(tmp_path) == script
    command = update_vs.speed_command(tmp_path)
    assert command[0] == str(tmp_path / ".venv" / "bin" / "python")
    assert command[1:] == (["-m", "benchmarks.speed.speed"] if runs_as_module else [str(script)])


def test_push_cube_env_speed_reports_every_variant_with_its_provenance(tmp_path):
    """The env-speed probe of push-cube.md's table, at a tiny size: every variant stepped, the default as the
    ratios' base, and provenance.json written beside the report (before 2026-12-02 it only printed)."""
    from benchmarks.speed import push_cube_env_speed as probe

    probe.main(probe.Args(num_envs=4, steps=2, rounds=1, out=str(tmp_path)))
    data = json.loads((tmp_path / "speed.json").read_text())
    assert set(data["results"]) == set(probe.VARIANTS) and all(r > 0 for r in data["results"].values())
    rows = [line for line in (tmp_path / "speed.md").read_text().splitlines() if line.startswith("| ")][1:]
    assert len(rows) == len(probe.VARIANTS) and rows[0].startswith("| default |") and rows[0].endswith("| 1.00 |")
    assert json.loads((tmp_path / "provenance.json").read_text())["command"] == data["invocation"]
    assert "--old must be a checkout" in exits_in_one_line(lambda: probe.load_old(str(tmp_path)))


def test_push_cube_variants_writes_its_report_and_each_runs_commit(tmp_path):
    """One variant, one seed, one iteration: runs.json, report.md and provenance.json in --out, the run's commit
    taken from its own summary.json (the figures of push-cube.md had none of this until 2026-12-02)."""
    from benchmarks.experiments import push_cube_variants as experiment

    args = experiment.Args(variants=("sliding",), seeds=(2,), total_timesteps=5120, eval_freq=1,
                           out=str(tmp_path / "out"), runs_dir=str(tmp_path / "runs"))  # fmt: skip
    experiment.main(args)
    data = json.loads((tmp_path / "out" / "runs.json").read_text())
    (run_record,) = data["runs"]
    assert (run_record["variant"], run_record["seed"], run_record["global_step"]) == ("sliding", 2, 5120)
    assert run_record["env_kwargs"] == experiment.VARIANTS["sliding"] and "--env-kwargs" in run_record["command"]
    assert "--compile off" in run_record["command"]  # (auto decides from this machine's past runs)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| sliding |" in report and run_record["command"] in report
    prov = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert prov["runs"] == [run_record["command"]]
    assert [group["commit"] for group in prov["runs_at"]] == [run_record["versions"]["git_sha"]]
    assert "--variants takes default, legacy, sliding" in exits_in_one_line(
        lambda: experiment.main(replace(args, variants=("slidnig",)))
    )


def test_record_lines_name_the_command_machine_load_versions_and_commit():
    machine = {**benchlib.machine_info(), "load_avg_1_5_15": [0.5, 0.6, 0.7]}
    lines = benchlib.record_lines("uv run x", machine, [1.0, 1.0, 1.0], {"git_sha": "abc", "git_dirty": True},
                                  {"torch": "2.15"})  # fmt: skip
    assert lines[0] == "- command: `uv run x`" and lines[2] == "- versions: torch 2.15"
    assert lines[1].endswith("at start [0.5, 0.6, 0.7], at end [1.0, 1.0, 1.0]")
    assert lines[3] == "- git: abc (uncommitted changes)"
    assert len(benchlib.record_lines("c", machine, None, {"git_sha": "abc", "git_dirty": False})) == 3


def test_speed_report_depends_on_every_trainer_it_timed(tmp_path):
    """speed.py times grpo and ppo_ddp (eager and compiled) beside ppo_continuous; its provenance lists the trainer
    commands it ran, so the report depends on each one's fingerprints. Until 2026-12-03 it recorded its own
    invocation alone, from which only ppo_continuous and the env could be read, and a change to grpo or ppo_ddp
    left the report fresh."""
    from benchmarks.speed import speed

    data = json.loads((benchlib.REPO / "docs" / "results" / "speed-cpu" / "speed.json").read_text())
    speed.write_outputs(data, tmp_path, "cpu", "")
    prov = json.loads((tmp_path / "provenance.json").read_text())
    timed = [row[mode]["command"] for row in data["train"] for mode in ("eager", "compile") if mode in row]
    assert len(timed) == 18 and prov["runs"] == [data["invocation"], *timed]
    trainers = {"grpo", "ppo_ddp", "ppo_continuous", "ppo_continuous-compiled", "env-PushCubeRL"}
    assert trainers <= set(prov["fingerprints"])
