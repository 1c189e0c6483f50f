"""experiments/pomdp.py (memory on partially observed tasks) and its sb3 runner, without sb3 and without a long run:
the commands each experiment builds and their order, the metrics read back, the report from made-up runs, and a tiny
real `--experiment full` of our two trainers."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tyro

from benchmarks import common as benchlib
from benchmarks.experiments import pomdp
from benchmarks.suite import provenance

REPO = Path(__file__).resolve().parents[1]

OURS_PENDULUM = (
    '--env-id Pendulum-v1 --env-kwargs {"obs_indices": [0, 1]} --num-envs 8 --num-steps 128 --num-minibatches 2 '
    "--update-epochs 10 --gamma 0.95 --gae-lambda 0.95 --learning-rate 3e-3 --norm-obs --norm-reward "
    "--rnn-hidden-size 64 --hidden-sizes 64 --total-timesteps 100000 --eval-freq 0 --num-eval-envs 10 "
    "--num-eval-episodes 10 --compile off --no-cuda"
)  # the flags of benchmarks/suite/configs/pomdp/ppo_recurrent__PendulumNoVel.txt (chosen on seeds 11-13)


def parse(spec):
    """The trainer's Args of one of our runs (what the script would run with)."""
    module = importlib.import_module(f"cleanrl_embodied.{Path(spec.command[1]).stem}")
    return tyro.cli(module.Args, args=spec.command[2:])


# ---- the commands ------------------------------------------------------------------------------------------------
def test_each_experiment_runs_its_methods_seed_by_seed_in_alternating_order():
    specs = pomdp.plan(pomdp.Args(seeds=3))
    assert [s.experiment for s in specs] == ["pendulum"] * 12 + ["dropout"] * 9 + ["full"] * 6
    pendulum = [(s.seed, s.method) for s in specs if s.experiment == "pendulum"]
    forward = ["sb3", "ppo_recurrent", "ppo_continuous", "ppo_continuous_stacked"]
    assert [m for _, m in pendulum] == forward + forward[::-1] + forward  # seed 1, 2 (reversed), 3
    assert [seed for seed, _ in pendulum] == [1] * 4 + [2] * 4 + [3] * 4
    full = ["ppo_recurrent", "ppo_continuous"]
    assert [s.method for s in specs if s.experiment == "full"] == full + full[::-1] + full
    assert [s.position for s in specs if s.experiment == "dropout" and s.seed == 2] == [0, 1, 2]
    for spec in specs:  # every run one thread; the seed on its command line
        assert spec.env["OMP_NUM_THREADS"] == "1" and spec.command[spec.command.index("--seed") + 1] == str(spec.seed)
    only = pomdp.plan(pomdp.Args(experiment="dropout", seeds=2, methods=("ppo_recurrent", "ppo_continuous_stacked")))
    assert [(s.seed, s.method) for s in only] == [
        (1, "ppo_recurrent"),
        (1, "ppo_continuous_stacked"),
        (2, "ppo_continuous_stacked"),
        (2, "ppo_recurrent"),
    ]
    with pytest.raises(SystemExit, match="--methods: unknown nope"):
        pomdp.plan(pomdp.Args(methods=("nope",)))
    with pytest.raises(SystemExit, match="none of them is in --experiment full"):
        pomdp.plan(pomdp.Args(experiment="full", methods=("sb3",)))


def test_pendulum_commands_are_the_specified_ones_and_the_controls_share_them():
    specs = {s.method: s for s in pomdp.plan(pomdp.Args(experiment="pendulum", seeds=1))}
    ours = specs["ppo_recurrent"]
    assert ours.command[:2] == [sys.executable, str(benchlib.SCRIPTS_DIR / "ppo_recurrent.py")]
    assert " ".join(ours.command[2:]) == OURS_PENDULUM + " --save-freq 0 --seed 1"
    a = parse(ours)
    assert json.loads(a.env_kwargs) == {"obs_indices": [0, 1]} and a.hidden_sizes == (64,) and a.rnn_hidden_size == 64
    mlp, stacked = parse(specs["ppo_continuous"]), parse(specs["ppo_continuous_stacked"])
    assert mlp.hidden_sizes == stacked.hidden_sizes == (64, 64)
    assert json.loads(mlp.env_kwargs) == {"obs_indices": [0, 1]}
    assert json.loads(stacked.env_kwargs) == {"obs_indices": [0, 1], "frame_stack": 4}
    same = ("num_envs", "num_steps", "num_minibatches", "update_epochs", "gamma", "gae_lambda", "learning_rate",
            "norm_obs", "norm_reward", "total_timesteps", "eval_freq", "num_eval_envs", "num_eval_episodes",
            "compile", "cuda", "target_kl", "anneal_lr", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm",
            "init_logstd")  # fmt: skip
    for name in same:  # the controls: ours' budget and PPO settings
        assert getattr(mlp, name) == getattr(stacked, name) == getattr(a, name), name
    sb3 = specs["sb3"]
    assert sb3.command == [sys.executable, "-m", "benchmarks.peers.sb3_recurrent_ppo", "--seed", "1",
                           "--total-timesteps", "100000", "--eval-episodes", "10"]  # fmt: skip
    assert sb3.env == {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/tmp/sb3"}
    tiny = {s.method: s for s in pomdp.plan(pomdp.Args(experiment="pendulum", seeds=1, tiny=True))}
    assert parse(tiny["ppo_recurrent"]).total_timesteps == 2048 and "2048" in tiny["sb3"].command


def test_push_cube_commands_run_the_trainers_defaults_with_the_budget_and_the_dropout():
    args = pomdp.Args(experiment="all", seeds=1, total_timesteps=300_000, eval_freq=7)
    specs = {(s.experiment, s.method): s for s in pomdp.plan(args)}
    for (experiment, method), spec in specs.items():
        if experiment == "pendulum":
            continue
        a = parse(spec)
        assert a.env_id == "PushCubeRL" and a.total_timesteps == 300_000 and a.eval_freq == 7 and a.seed == 1
        assert not a.cuda and a.save_freq == 0
        kwargs = json.loads(a.env_kwargs)
        expected = {"dropout_sensor": "cube"} if experiment == "dropout" else {}
        assert kwargs == ({**expected, "frame_stack": 4} if method == "ppo_continuous_stacked" else expected)
        defaults = type(a)()  # everything else at the script's defaults
        for name in ("num_envs", "num_steps", "learning_rate", "gamma", "hidden_sizes", "num_eval_episodes", "compile"):
            assert getattr(a, name) == getattr(defaults, name), (experiment, method, name)
        depends = provenance.depends_on(benchlib.shell_command(spec.command, spec.env))
        assert ("env-PushCubeRL-dropout" in depends) == (experiment == "dropout") and "env-PushCubeRL" in depends
    assert "--env-kwargs" not in specs[("full", "ppo_recurrent")].command  # the env's own default
    assert pomdp.planned_updates(specs[("full", "ppo_recurrent")]) == 300_000 // (256 * 20) * 4 * 8


def test_the_driver_and_its_runs_depend_on_the_fingerprints_they_use():
    assert provenance.depends_on("uv run python -m benchmarks.experiments.pomdp --experiment all") == [
        "env-PushCubeRL",
        "env-PushCubeRL-dropout",
        "ppo_continuous",
        "ppo_recurrent",
    ]
    assert provenance.depends_on("python cleanrl_embodied/ppo_recurrent.py") == ["env-PushCubeRL", "ppo_recurrent"]
    sb3 = next(s for s in pomdp.plan(pomdp.Args(experiment="pendulum", seeds=1)) if s.method == "sb3")
    assert provenance.depends_on(benchlib.shell_command(sb3.command, sb3.env)) == []


def test_a_missing_sb3_install_is_one_line_naming_the_install_command(tmp_path):
    with pytest.raises(SystemExit, match="holds no sb3_contrib: install it with `uv pip install --target /tmp/sb3"):
        pomdp.main(pomdp.Args(experiment="pendulum", sb3_path=str(tmp_path), out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


# ---- reading runs back ---------------------------------------------------------------------------------------------
def test_steps_to_success_is_the_first_evaluation_at_or_above_the_threshold(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name, values in {"hit": [0.1, 0.85, 0.9, 0.5, 1.0], "never": [0.2, 0.89, 0.5]}.items():
        writer = SummaryWriter(str(tmp_path / name))
        for i, value in enumerate(values):
            writer.add_scalar("eval/success_rate", value, (i + 1) * 5120)
        writer.close()
    assert pomdp.steps_to_success(tmp_path / "hit") == 3 * 5120  # reaching 0.9 counts
    assert pomdp.steps_to_success(tmp_path / "hit", threshold=0.95) == 5 * 5120
    assert pomdp.steps_to_success(tmp_path / "never") is None
    (tmp_path / "empty").mkdir()
    assert pomdp.steps_to_success(tmp_path / "empty") is None
    assert pomdp.fmt_steps(None) == "not reached" and pomdp.fmt_steps(15360) == "15k"


def test_an_sb3_run_is_read_from_its_json_line_and_a_failed_run_is_kept_with_its_error(tmp_path):
    line = {"env_steps": 4096, "train_s": 16.0, "eval_return_mean": -250.0, "eval_return_std": 30.0, "process_s": 25.0}
    script = f"import json; print('some sb3 output'); print(json.dumps({line!r}))"
    spec = pomdp.RunSpec("pendulum", "sb3", 1, 0, [sys.executable, "-c", script], {"OMP_NUM_THREADS": "1"})
    record = pomdp.run_one(spec, tmp_path / "sb3")
    assert record["returncode"] == 0 and record["process_s"] > 0
    assert record["metrics"] == {"env_steps": 4096, "train_s": 16.0, "sps": 256.0, "eval_return": -250.0,
                                 "eval_return_std_episodes": 30.0, "runner_process_s": 25.0}  # fmt: skip
    broken = pomdp.RunSpec("full", "sb3", 1, 0, [sys.executable, "-c", "raise SystemExit('error: no')"], {})
    record = pomdp.run_one(broken, tmp_path / "broken")
    assert record["returncode"] == 1 and record["error"] == "error: no"


# ---- the report ----------------------------------------------------------------------------------------------------
def fake(experiment, method, seed, position, train_s, ret=None, success=None, hit=None, sps=None, missing=None):
    metrics = {"env_steps": 102_400 if method == "sb3" else 99_328, "train_s": train_s, "sps": sps or 1e5 / train_s,
               "eval_return": ret if ret is not None else -40.0}  # fmt: skip
    record = {"experiment": experiment, "method": method, "seed": seed, "position": position, "returncode": 0,
              "command": f"python {method}.py --seed {seed}", "process_s": train_s + 8.0}  # fmt: skip
    if method == "sb3":
        recipe = {"n_envs": 4, "n_steps": 1024, "gamma": 0.9}
        versions = {k: "2.9.2" for k in ("sb3-contrib", "stable-baselines3")}
        versions.update(torch="2.15.0", gymnasium="1.4.0", numpy="2.4.6")
        sb3 = {"versions": versions, "recipe": recipe, "recipe_source": "RL Zoo", "batch_size": 128,
               "env_steps": 102_400}  # fmt: skip
        return {**record, "metrics": metrics, "sb3": sb3}
    if experiment != "pendulum":
        missing_at_evals = [missing] * 2 if missing is not None else []
        metrics.update(success_rate=success, steps_to_success=hit, sensor_missing_fraction=missing,
                       sensor_missing_fractions=missing_at_evals, planned_updates=6248)  # fmt: skip
        steps = [51_200, 102_400]
        curves = {"eval/success_rate": {"step": steps, "value": [0.0, success], "time_s": [1.0, 2.0]}}
        return {**record, "metrics": metrics, "curves": curves}
    return {**record, "metrics": metrics, "curves": {}}


def fake_data(runs):
    machine = {"cpu": "CPU", "logical_cores": 2, "usable_cores": 2, "memory_gib": 8, "gpu": "none", "os": "Linux",
               "load_avg_1_5_15": [1.0, 1.0, 1.0]}  # fmt: skip
    return {"args": {**vars(pomdp.Args()), "methods": []}, "command": "uv run python -m benchmarks.experiments.pomdp",
            "machine": machine, "versions": {"torch": "2.15.0"}, "git": {"git_sha": "abc", "git_dirty": False},
            "runs": runs, "total_s": 600.0, "finished": 0.0, "load_avg_end": [1.0, 1.0, 1.0]}  # fmt: skip


def test_report_states_every_figure_the_goal_and_the_failures(tmp_path):
    runs = [
        fake("pendulum", "sb3", 1, 0, 400.0, ret=-250.0),
        fake("pendulum", "ppo_recurrent", 1, 1, 40.0, ret=-200.0),
        fake("pendulum", "ppo_continuous", 1, 2, 20.0, ret=-900.0),
        fake("pendulum", "ppo_recurrent", 2, 0, 60.0, ret=-180.0),
        fake("pendulum", "sb3", 2, 1, 400.0, ret=-230.0),
        fake("pendulum", "ppo_continuous", 2, 2, 22.0, ret=-1000.0),
        fake("dropout", "ppo_recurrent", 1, 0, 300.0, success=0.95, hit=204_800, missing=0.3),
        fake("dropout", "ppo_continuous", 1, 1, 100.0, success=0.4, hit=None, missing=0.4),
        fake("full", "ppo_recurrent", 1, 0, 200.0, success=1.0, hit=153_600, sps=2000.0),
        fake("full", "ppo_continuous", 1, 1, 100.0, success=1.0, hit=102_400, sps=5000.0),
        {
            "experiment": "full",
            "method": "ppo_continuous_stacked",
            "seed": 1,
            "position": 2,
            "returncode": 1,
            "command": "python broken.py",
            "process_s": 1.0,
            "error": "error: bad",
        },  # fmt: skip
    ]
    text = pomdp.report(fake_data(runs), tmp_path)
    pendulum = text.split("## PendulumNoVel")[1].split("\n## ")[0]
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in pendulum.splitlines() if line.startswith("| ")
    }
    ours = rows["ppo_recurrent (LSTM, ours)"]
    assert ours[3] == "-190.0 ± 14.1" and ours[4] == "-200.0, -180.0" and ours[5] == "50.0 ± 14.1"
    assert ours[6] == "58.0 ± 14.1" and ours[7] == "0.125 ± 0.035x |"  # per seed: 40/400, 60/400
    assert rows["sb3-contrib RecurrentPPO (RL Zoo recipe)"][7] == "- |"
    assert "Return: -190.0 against -240.0, met; training time: 0.125x sb3's" in pendulum and "**Goal met.**" in pendulum
    assert "seed 1: sb3, ppo_recurrent, ppo_continuous; seed 2: ppo_recurrent, sb3, ppo_continuous" in pendulum
    assert "batch_size 128 (not in the recipe" in pendulum and "102,400 env steps" in pendulum
    dropout = text.split("## PushCubeRL with the cube's sensor")[1].split("\n## ")[0]
    assert "The cube was unseen 0.350 ± 0.058 of the steps" in dropout  # 0.3, 0.3, 0.4, 0.4 over the evaluations
    assert "| ppo_recurrent (LSTM, ours) | 1 | 99,328 | 0.95 ± 0.00 | 0.95 | 205k ± 0k (1/1) | 205k |" in dropout
    assert "| 0.40 | not reached (0/1) | not reached |" in dropout and "plan 6,248, so all ran eager" in dropout
    full = text.split("## Fully observed")[1]
    assert "ppo_continuous ran 2.50 ± 0.00x the SPS of ppo_recurrent (per seed, side by side: 2.50)" in full
    assert "- `python broken.py` (exit 1): error: bad" in text and "1 failed" in text
    assert (tmp_path / "dropout.png").is_file() and (tmp_path / "full.png").is_file()
    runs[1]["metrics"]["eval_return"] = runs[3]["metrics"]["eval_return"] = -300.0  # worse than sb3: the goal fails
    assert "Return: -300.0 against -240.0, not met" in pomdp.report(fake_data(runs), tmp_path)


# ---- the sb3 runner, without sb3 ------------------------------------------------------------------------------------
def test_sb3_runner_masks_the_velocity_as_rl_zoo_does_and_keeps_its_recipe():
    import gymnasium as gym
    import numpy as np

    runner = importlib.import_module("benchmarks.peers.sb3_recurrent_ppo")
    env = runner.make_pendulum_novel()
    obs, _ = env.reset(seed=0)
    inner = env.unwrapped.state  # [θ, θ̇]
    assert obs.shape == (3,) and obs[2] == 0.0
    np.testing.assert_allclose(obs[:2], [np.cos(inner[0]), np.sin(inner[0])], rtol=1e-6)
    obs, *_ = env.step(np.array([1.0], dtype=np.float32))
    assert obs[2] == 0.0 and env.unwrapped.state[1] != 0.0 and isinstance(env, gym.ObservationWrapper)
    r = runner.RECIPE  # RL Zoo hyperparams/ppo_lstm.yml, PendulumNoVel-v1
    assert (r["normalize"], r["n_envs"], r["n_timesteps"], r["n_steps"], r["gamma"], r["gae_lambda"]) == (
        True, 4, 100_000, 1024, 0.9, 0.95)  # fmt: skip
    assert (r["n_epochs"], r["learning_rate"], r["clip_range"], r["ent_coef"], r["use_sde"], r["sde_sample_freq"]) == (
        10, 1e-3, 0.2, 0.0, True, 4)  # fmt: skip
    assert "lstm_hidden_size=64" in r["policy_kwargs"] and "net_arch=dict(pi=[64], vf=[64])" in r["policy_kwargs"]
    if importlib.util.find_spec("sb3_contrib") is None:
        with pytest.raises(SystemExit, match="sb3-contrib is not importable"):
            runner.main(runner.Args())


# ---- a tiny real run -----------------------------------------------------------------------------------------------
def test_tiny_full_experiment_end_to_end(tmp_path):
    """`--experiment full --tiny`, 2 seeds of our two trainers: runs.json, report.md, provenance.json, the plot;
    --report-only draws the same report again."""
    out = tmp_path / "pomdp"
    command = [
        sys.executable,
        "-m",
        "benchmarks.experiments.pomdp",
        "--experiment",
        "full",
        "--tiny",
        "--seeds",
        "2",
        "--out",
        str(out),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "runs.json").read_text())
    assert [(r["seed"], r["method"]) for r in data["runs"]] == [
        (1, "ppo_recurrent"),
        (1, "ppo_continuous"),
        (2, "ppo_continuous"),
        (2, "ppo_recurrent"),
    ]
    for record in data["runs"]:
        m = record["metrics"]
        assert record["returncode"] == 0 and m["env_steps"] == 2048 and m["train_s"] > 0 and m["sps"] > 0
        assert record["process_s"] > m["train_s"] and 0.0 <= m["success_rate"] <= 1.0
        curve = record["curves"]["eval/success_rate"]
        assert curve["step"] == [512, 1024, 1536, 2048]
        assert m["steps_to_success"] == next((s for s, v in zip(curve["step"], curve["value"]) if v >= 0.9), None)
        assert "OMP_NUM_THREADS=1 python cleanrl_embodied/" in record["command"] and "--output-dir" in record["command"]
        assert m["sensor_missing_fraction"] is None  # fully observed
    report = (out / "report.md").read_text()
    assert "Tiny mode" in report and "| ppo_recurrent (LSTM, ours) | 2 | 2,048 |" in report
    assert "seed 1: ppo_recurrent, ppo_continuous; seed 2: ppo_continuous, ppo_recurrent" in report
    assert "![full](full.png)" in report and (out / "full.png").stat().st_size > 10_000
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"].startswith("uv run python -m benchmarks.experiments.pomdp --experiment full")
    assert len(prov["runs"]) == 4
    assert set(prov["fingerprints"]) == {"env-PushCubeRL", "env-PushCubeRL-dropout", "ppo_continuous", "ppo_recurrent"}
    pomdp.main(pomdp.Args(out=str(out), report_only=True))
    assert (out / "report.md").read_text() == report
