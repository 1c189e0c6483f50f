"""peers/vs_mjlab.py (ppo_continuous against mjlab's own rsl_rl train script) without a long run: the commands
and their order, the recipe mapped onto our flags, the report from made-up runs, and (with the mjlab extra) a tiny
real invocation of every kind of run."""

from __future__ import annotations

import json
import math

import pytest
import tyro

from benchmarks.peers import vs_mjlab
from tests.extras import needs


def parsed(spec):
    from cleanrl_embodied import ppo_continuous

    return tyro.cli(ppo_continuous.Args, args=spec.command[2:])


def test_each_task_runs_its_methods_seed_by_seed_in_alternating_order_then_the_smoke_runs():
    specs = vs_mjlab.plan(vs_mjlab.Args())
    cartpole = [s for s in specs if s.method != "smoke"]
    assert [s.task for s in cartpole] == ["Mjlab-Cartpole-Swingup"] * 9 + ["Mjlab-Cartpole-Balance"] * 9
    forward = list(vs_mjlab.METHODS)
    assert [s.method for s in cartpole[:9]] == forward + forward[::-1] + forward
    assert [(s.task, s.method) for s in specs[18:]] == [(t, "smoke") for t in vs_mjlab.SMOKE_TASKS]
    for spec in specs:  # one thread, mjlab on the CPU
        assert spec.env["OMP_NUM_THREADS"] == "1" and spec.env["CUDA_VISIBLE_DEVICES"] == ""
    assert all(s.env_steps == 500 * 32 * 64 for s in cartpole)
    assert not [s for s in vs_mjlab.plan(vs_mjlab.Args(seeds=1, smoke=False)) if s.method == "smoke"]
    with pytest.raises(SystemExit, match="unknown task or method nope"):
        vs_mjlab.plan(vs_mjlab.Args(methods=("nope",)))


def test_both_sides_get_the_same_envs_steps_and_the_recipe():
    specs = vs_mjlab.plan(vs_mjlab.Args(tasks=("Mjlab-Cartpole-Swingup",), seeds=1, smoke=False))
    rsl, ours, terminal = (next(s for s in specs if s.method == m) for m in vs_mjlab.METHODS)
    command = rsl.command
    assert command[1:4] == ["-m", "mjlab.scripts.train", "Mjlab-Cartpole-Swingup"]
    flag = lambda name: command[command.index(name) + 1]  # noqa: E731
    assert flag("--env.scene.num-envs") == "64" and flag("--agent.max-iterations") == "500"
    assert flag("--gpu-ids") == "None" and flag("--agent.logger") == "tensorboard" and flag("--agent.seed") == "1"
    a = parsed(ours)
    assert (a.env_id, a.num_envs, a.num_steps, a.total_timesteps) == ("mjlab:Mjlab-Cartpole-Swingup", 64, 32, 1_024_000)
    assert (a.update_epochs, a.num_minibatches, a.learning_rate, a.gamma, a.gae_lambda) == (5, 4, 1e-3, 0.99, 0.95)
    assert (a.ent_coef, a.clip_coef, a.vf_coef, a.clip_vloss, a.max_grad_norm) == (0.01, 0.2, 2.0, True, 1.0)
    assert a.hidden_sizes == (64, 64) and a.init_logstd == math.log(1.0) and a.privileged_critic and not a.norm_obs
    assert not a.cuda and a.eval_freq == 0
    assert json.loads(a.env_kwargs) == {"init_at_random_ep_len": True}
    assert json.loads(parsed(terminal).env_kwargs) == {"init_at_random_ep_len": True, "is_finite_horizon": True}
    go1 = parsed(next(s for s in vs_mjlab.plan(vs_mjlab.Args(seeds=1)) if s.task.endswith("Go1")))
    assert go1.hidden_sizes == (512, 256, 128) and go1.norm_obs and go1.num_steps == 24
    assert json.loads(go1.eval_env_kwargs) == {"episode_length_s": 2.0}
    tiny = vs_mjlab.plan(vs_mjlab.Args(tiny=True, seeds=1))
    assert all(s.env_steps <= 2 * 8 * 8 for s in tiny)
    assert "--env.episode-length-s" in tiny[0].command


def test_on_the_gpu_both_sides_run_on_cuda_with_no_cpu_pinning():
    """benchmarks/gpu_check.py's part 7 runs vs_mjlab's commands with `cuda=True`: mjlab's script on GPU 0, ours
    with --cuda, neither hidden from the GPU nor held to one thread."""
    args = vs_mjlab.Args(tasks=("Mjlab-Velocity-Flat-Unitree-Go1",), num_envs=4096, iterations=50, cuda=True)
    (rsl, env, steps), (ours, ours_env, _) = (vs_mjlab.method_command(args, args.tasks[0], m, 1)
                                              for m in ("rsl_rl", "ppo_continuous"))  # fmt: skip
    assert rsl[rsl.index("--gpu-ids") + 1] == "0" and env == {"WANDB_MODE": "disabled"} and ours_env == {}
    a = parsed(vs_mjlab.RunSpec(args.tasks[0], "ppo_continuous", 1, 0, ours, ours_env, steps))
    assert a.cuda and a.num_envs == 4096 and a.total_timesteps == steps == 50 * 24 * 4096


def made_up(task: str, method: str, seed: int, final: float) -> dict:
    curve = {"step": [2048 * i for i in range(1, 11)], "value": [final * i / 10 for i in range(1, 11)],
             "time_s": [10.0 * i for i in range(1, 11)]}  # fmt: skip
    metrics = {"env_steps": 20480, "steady_sps": 3000.0 + seed, "curve": curve, "final_return": final}
    if method != "rsl_rl":
        metrics.update(eval={"episodic_return": final + 1, "success_rate": None},
                       explained_variance={"step": curve["step"], "value": [0.9] * 10})  # fmt: skip
    return {"task": task, "method": method, "seed": seed, "position": 0, "command": f"python {method}",
            "returncode": 0, "process_s": 100.0, "metrics": metrics}  # fmt: skip


def test_the_report_from_made_up_runs(tmp_path):
    task = "Mjlab-Cartpole-Swingup"
    runs = [made_up(task, m, s, f) for s in (1, 2) for m, f in zip(vs_mjlab.METHODS, (30.0, 40.0 + s, 35.0))]
    smoke = made_up("Mjlab-Lift-Cube-Yam", "smoke", 1, 0.5)
    smoke["metrics"]["eval"] = {"episodic_return": 0.5, "success_rate": 0.0, "Metrics/lift_height/at_goal": 0.0}
    data = {"args": {"tasks": [task], "skip": 3, "tiny": False}, "runs": [*runs, smoke], "total_s": 600.0,
            "finished": 0.0, "command": "uv run python -m benchmarks.peers.vs_mjlab", "load_avg_end": [1, 1, 1],
            "machine": {"cpu": "x", "logical_cores": 2, "usable_cores": 2, "memory_gib": 8, "gpu": "none", "os": "y",
                        "load_avg_1_5_15": [1, 1, 1]}, "versions": {"mjlab": "1.6.0"},
            "git": {"git_sha": "abc", "git_dirty": False}}  # fmt: skip
    vs_mjlab.write_outputs(data, tmp_path, "")
    text = (tmp_path / "report.md").read_text()
    assert (tmp_path / f"{task}.png").is_file() and "## Mjlab-Cartpole-Swingup" in text
    assert "mjlab train.py (rsl_rl 5.4.2) | 2 | 20,480 | 30.00 ± 0.00" in text
    assert "per seed +6.00, +7.00 (mean +6.50" in text and "bootstrapped is ahead on every seed" in text
    assert "Metrics/lift_height/at_goal 0" in text and "installed with `uv sync --locked --extra mjlab`" in text
    assert vs_mjlab.last_share({"step": [1, 2, 10], "value": [0.0, 1.0, 3.0]}) == 3.0


@needs("mjlab")
def test_a_tiny_real_invocation_runs_every_kind_of_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    data = vs_mjlab.main(vs_mjlab.Args(tiny=True, seeds=1, out=str(tmp_path)))
    failed = [(r["command"], r.get("error")) for r in data["runs"] if r["returncode"]]
    assert not failed, failed
    assert [r["method"] for r in data["runs"]] == [*vs_mjlab.METHODS] * 2 + ["smoke", "smoke"]
    for r in data["runs"]:
        assert r["metrics"]["env_steps"] == r["planned_env_steps"], r["command"]
    rsl = next(r for r in data["runs"] if r["method"] == "rsl_rl")
    assert rsl["metrics"]["curve"]["value"] and rsl["metrics"]["steady_sps"] > 0
    lift = next(r for r in data["runs"] if r["task"] == "Mjlab-Lift-Cube-Yam")
    assert lift["metrics"]["eval"]["success_rate"] is not None
    assert "Metrics/lift_height/episode_success" in lift["metrics"]["eval"]
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == data["runs"]
    assert (tmp_path / "report.md").is_file() and (tmp_path / "provenance.json").is_file()


@needs("mjlab")
def test_the_gpu_checks_mjlab_part_runs_both_sides_in_its_dry_run(tmp_path, monkeypatch):
    """benchmarks/gpu_check.py --parts mjlab --dry-run: Go1 and the YAM arm, ours and mjlab's script, vs_mjlab's tiny
    sizes on the CPU, every item run to its planned env steps."""
    from benchmarks import gpu_check

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    data = gpu_check.main(gpu_check.Args(dry_run=True, parts=("mjlab",), out=str(tmp_path)))
    part = data["parts"]["mjlab"]
    assert part["status"] == "ok", [(i["name"], i.get("error")) for i in part["items"]]
    names = [i["name"] for i in part["items"]]
    assert names == [f"{t}: {vs_mjlab.LABELS[m]}" for t in gpu_check.MJLAB_TASKS for m in ("ppo_continuous", "rsl_rl")]
    for item in part["items"]:
        assert item["checks"] == {"all_env_steps": True} and item["metrics"]["steady_sps"] > 0, item
    assert "## 7. mjlab's tasks" in (tmp_path / "report.md").read_text()


def test_a_mean_of_one_seed_shows_no_spread():
    assert vs_mjlab.mean_std([49.58], 2) == "49.58" and vs_mjlab.mean_std([1.0, 3.0, None], 1) == "2.0 ± 1.4"
    assert vs_mjlab.mean_std([None], 2) == "-"


def test_keep_finished_keeps_the_finished_runs_of_the_same_settings_only(tmp_path):
    """`--keep-finished` (more seeds after a run of fewer): the runs that finished are kept, with the commit they ran
    at; a failed run is run again; runs.json of other settings (envs, iterations) is one line, not a mixed report."""
    ok = made_up("Mjlab-Cartpole-Balance", "rsl_rl", 1, 40.0)
    failed = {**made_up("Mjlab-Cartpole-Balance", "ppo_continuous", 1, 0.0), "returncode": 1}
    saved = {"args": {"num_envs": 64, "iterations": None, "skip": 3, "tiny": False}, "git": {"git_sha": "a1c8305"},
             "runs": [ok, failed]}  # fmt: skip
    (tmp_path / "runs.json").write_text(json.dumps(saved))
    kept = vs_mjlab.finished_runs(tmp_path, vs_mjlab.Args(seeds=3))
    assert list(kept) == [("Mjlab-Cartpole-Balance", "rsl_rl", 1)]
    assert kept[("Mjlab-Cartpole-Balance", "rsl_rl", 1)]["git"] == {"git_sha": "a1c8305"}
    with pytest.raises(SystemExit, match="ran with other num_envs; use another --out"):
        vs_mjlab.finished_runs(tmp_path, vs_mjlab.Args(num_envs=128))
    assert vs_mjlab.finished_runs(tmp_path / "none", vs_mjlab.Args()) == {}
