"""peers/vs_rsl_rl.py (ours against rsl_rl on PushCubeRL) and its rsl_rl side, rsl_rl_push_cube.py:
the runs it plans, the figures its report states, its one-line errors, and the VecEnv adapter against rsl_rl's
interface (where rsl_rl is importable: it is not this project's dependency; RSL_RL_PATH names a `uv pip install
--target` folder of it)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.peers import vs_rsl_rl as vs

REPO = Path(__file__).resolve().parents[1]


# ---- the plan -----------------------------------------------------------------------------------------------------
def test_dry_run_plans_every_method_per_pair_alternating_with_one_thread_and_the_seed_of_the_pair(capsys):
    specs = vs.main(vs.Args(dry_run=True, pairs=2, rsl_rl_path="/somewhere/rsl_rl"))
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(specs) == len(printed) == 10
    assert [s.method for s in specs] == [*vs.METHODS, *vs.METHODS[::-1]]
    assert [s.seed for s in specs] == [1] * 5 + [2] * 5 and all(s.pair == s.seed for s in specs)
    assert all(line.startswith("OMP_NUM_THREADS=1 ") for line in printed)
    ours = {s.method: s for s in specs if s.pair == 1 and s.method in vs.OURS}
    base = ["--env-id", "PushCubeRL", "--total-timesteps", "1000000", "--seed", "1", "--save-freq", "0", "--no-cuda"]
    assert ours["ours"].command[1].endswith("cleanrl_embodied/ppo_continuous.py")
    assert ours["ours"].command[2:] == base  # the defaults, as a user runs them: --compile auto
    assert ours["ours_off"].command[2:] == [*base, "--compile", "off"]
    assert ours["ours_on"].command[2:] == [*base, "--compile", "on"]
    assert all("PYTHONPATH" not in s.env for s in ours.values())
    theirs = {s.method: s for s in specs if s.pair == 2 and s.method in vs.RSL_RL}
    assert theirs["rsl_rl_eager"].command[1:3] == ["-m", "benchmarks.peers.rsl_rl_push_cube"]
    assert theirs["rsl_rl_eager"].command[3:] == ["--seed", "2", "--total-timesteps", "1000000", "--compile", "none"]
    assert theirs["rsl_rl_compiled"].command[-2:] == ["--compile", "default"]
    assert all(s.env == {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/somewhere/rsl_rl"} for s in theirs.values())


def test_bytecode_is_compiled_for_both_sides_before_the_pairs():
    import sysconfig

    command = vs.bytecode_command(vs.Args(rsl_rl_path="/somewhere/rsl_rl"))
    assert command[:3] == [sys.executable, "-m", "compileall"]
    assert {sysconfig.get_paths()["purelib"], "/somewhere/rsl_rl", str(REPO / "cleanrl_embodied")} <= set(command)


def test_the_methods_asked_for_are_the_ones_planned():
    specs = vs.plan(vs.Args(pairs=1, methods=("rsl_rl_compiled", "ours")))
    assert [s.method for s in specs] == ["ours", "rsl_rl_compiled"]


@pytest.mark.parametrize(
    "args, starts",
    [
        (dict(methods=("ours", "nope")), "error: --methods: unknown nope"),
        (dict(methods=("ours", "ours_on")), "error: --methods: needs one of ours"),
        (dict(pairs=0), "error: --pairs"),
        (dict(total_timesteps=20_000), "error: --total-timesteps 20000 gives 3 iterations"),
        (dict(rsl_rl_path="/nonexistent/rsl_rl", total_timesteps=30_720), "error: --rsl-rl-path /nonexistent/rsl_rl"),
    ],
)
def test_bad_input_is_one_line(args, starts, tmp_path):
    with pytest.raises(SystemExit) as e:
        vs.main(vs.Args(out=str(tmp_path / "out"), results_md="", **args))
    message = str(e.value.code)
    assert message.startswith(starts) and "\n" not in message, message


def test_report_only_without_runs_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        vs.main(vs.Args(report_only=True, out=str(tmp_path), results_md=""))
    assert str(e.value.code).startswith("error: --report-only: no ") and "\n" not in str(e.value.code)


# ---- reading runs back --------------------------------------------------------------------------------------------
def test_steady_state_is_the_iterations_after_skip():
    walls = [10.0, 11.0, 12.0, 13.0, 15.0, 17.0]  # the ends of iterations 1..6
    state = vs.steady(walls, 3)  # iterations 4, 5 and 6: from the end of iteration 3 (12.0) to 17.0
    assert state["iterations"] == 3
    assert state["mean_s"] == pytest.approx(5.0 / 3)
    assert state["median_s"] == pytest.approx(2.0)  # durations 1 (iteration 4), 2 and 2 (iterations 5, 6)
    with pytest.raises(RuntimeError):
        vs.steady(walls[:4], 3)


def test_update_flops_count_both_mlps_forward_and_backward():
    flops = vs.update_flops()
    per_sample = 2 * (31 * 128 + 128 * 128 + 128 * 7) + 2 * (31 * 128 + 128 * 128 + 128 * 1)
    assert flops["batch"] == 640 and flops["forward"] == 640 * per_sample and flops["update"] == 3 * flops["forward"]


# ---- the report ---------------------------------------------------------------------------------------------------
def made_up_run(pair: int, method: str, process_s: float, steady_s: float, success: float = 1.0) -> dict:
    ours = method in vs.OURS
    phases = {"a": process_s / 2, "b": process_s / 2}
    metrics = {"steady": {"mean_s": steady_s, "median_s": steady_s, "iterations": 192}, "loop_s": process_s - 8,
               "success": success, "phases": phases, "first_iterations_excess_s": 0.5}  # fmt: skip
    if ours:
        metrics.update(compiled=method == "ours_on", periodic_evals_s=1.0, compile_s=0.0)
    else:
        metrics["own_timers"] = {"mean_s": steady_s, "median_s": steady_s, "learn_median_s": 0.032 * 4}
    return {"pair": pair, "method": method, "seed": pair, "returncode": 0, "process_s": process_s,
            "command": f"python {method} --seed {pair}", "metrics": metrics}  # fmt: skip


def made_up_data(runs: list[dict]) -> dict:
    return {
        "args": vars(vs.Args(methods=("ours", "rsl_rl_eager", "rsl_rl_compiled"))),
        "command": "uv run --extra export python -m benchmarks.peers.vs_rsl_rl",
        "rsl_rl_version": "5.5.1",
        "machine": {
            "cpu": "a CPU",
            "logical_cores": 2,
            "usable_cores": 2,
            "memory_gib": 8,
            "gpu": "none",
            "os": "Linux",
            "load_avg_1_5_15": [0.1, 0.1, 0.1],
        },  # fmt: skip
        "versions": {"torch": "2.x"},
        "git": {"git_sha": "0" * 40, "git_dirty": False},
        "runs": runs,
        "finished": 0.0,
        "total_s": 60.0,
        "load_avg_end": [0.2, 0.2, 0.2],
    }


def test_the_report_states_the_ratios_against_rsl_rls_faster_configuration_per_measure(tmp_path):
    runs = []
    for pair, (ours_s, scale) in enumerate([(40.0, 1.0), (50.0, 1.0), (40.0, 1.1)], start=1):
        runs += [
            made_up_run(pair, "ours", ours_s, 0.2 * scale),
            made_up_run(pair, "rsl_rl_eager", ours_s * 1.25, 0.3 * scale),  # the faster rsl_rl, whole process
            made_up_run(pair, "rsl_rl_compiled", ours_s * 1.5, 0.24 * scale),  # the faster rsl_rl, steady state
        ]
    runs.append({**made_up_run(3, "ours_on", 1.0, 1.0), "returncode": 1, "error": "RuntimeError: it broke"})
    data = made_up_data(runs)
    text = vs.report(data)
    assert (
        "whole process: rsl_rl's faster configuration here is rsl_rl, eager; its time over ours at our defaults "
        "is 1.25x (median of 3 pairs; above 1: ours is faster), short of issue 55's goal of 1.5x"
    ) in text
    assert ("steady-state iteration: rsl_rl's faster configuration here is rsl_rl, "
            '`torch_compile_mode="default"`; its time over ours at our defaults is 1.20x') in text  # fmt: skip
    label = "| ours, `--compile auto` (the default) |"
    row = next(line for line in text.splitlines() if line.startswith(f"{label} rsl_rl, eager"))
    assert row.endswith("| **1.25x** (1.25x-1.25x) | **1.50x** (1.50x-1.50x) |"), row  # 0.3 / 0.2 steady against eager
    assert f"{label} 3 | 40.0, 50.0, 40.0 | 200, 200, 220 |" in text
    assert "Failed runs:" in text and "RuntimeError: it broke" in text
    md = tmp_path / "benchmarks.md"
    md.write_text("# B\n\n<!-- BEGIN vs-rsl-rl-cpu -->\nold\n<!-- END vs-rsl-rl-cpu -->\n\nafter\n")
    vs.write_outputs(data, tmp_path / "out", str(md))
    assert "old" not in md.read_text() and md.read_text().endswith("<!-- END vs-rsl-rl-cpu -->\n\nafter\n")
    assert json.loads((tmp_path / "out" / "runs.json").read_text())["runs"][0]["process_s"] == 40.0
    assert (tmp_path / "out" / "report.md").read_text().startswith("# ppo_continuous against rsl_rl")


def test_the_report_says_when_the_goal_is_met():
    runs = [made_up_run(1, "ours", 20.0, 0.1), made_up_run(1, "rsl_rl_eager", 40.0, 0.2)]
    text = vs.report({**made_up_data(runs), "args": vars(vs.Args(methods=("ours", "rsl_rl_eager")))})
    assert "ours at our defaults is 2.00x (median of 1 pair; above 1: ours is faster), meeting issue 55's goal" in text


# ---- the rsl_rl side: the VecEnv adapter ----------------------------------------------------------------------------
def import_rsl_rl():
    if os.environ.get("RSL_RL_PATH"):
        sys.path.insert(0, os.environ["RSL_RL_PATH"])
    try:
        importlib.import_module("rsl_rl")
    except ImportError:
        pytest.skip(f"rsl_rl is not installed (not a dependency): `{vs.INSTALL}`, then RSL_RL_PATH=/tmp/rsl_rl")
    return importlib.import_module("benchmarks.peers.rsl_rl_push_cube")


def test_the_adapter_is_rsl_rls_vec_env_with_time_outs_at_the_time_limit():
    runner = import_rsl_rl()
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    env = runner.PushCubeVecEnv(4, "cpu", seed=0, max_episode_steps=3)
    assert isinstance(env, VecEnv)
    assert (env.num_envs, env.num_actions, env.max_episode_length, str(env.device)) == (4, 7, 3, "cpu")
    assert isinstance(env.cfg, dict) and env.cfg["env_id"] == "PushCubeRL"
    obs = env.get_observations()
    assert isinstance(obs, TensorDict) and list(obs.keys()) == ["policy"] and obs["policy"].shape == (4, 31)
    for t in range(1, 4):  # the arm stays still: no success, every episode ends at its limit
        obs, rewards, dones, extras = env.step(torch.zeros(4, 7))
        assert obs["policy"].shape == (4, 31) and rewards.shape == (4,) and dones.dtype == torch.long
        assert extras["time_outs"].tolist() == [t == 3] * 4 and dones.tolist() == [int(t == 3)] * 4
        assert env.episode_length_buf.tolist() == [t % 3] * 4
    assert extras["log"]["Episode/success_rate"].tolist() == [0.0] * 4


def test_a_success_at_the_limit_is_a_termination_not_a_time_out():
    runner = import_rsl_rl()
    env = runner.PushCubeVecEnv(3, "cpu", seed=0)

    class Stub:  # the inner env's step: env 0 succeeds at its limit, env 1 times out, env 2 succeeds early
        def step(self, actions):
            terminated, truncated = torch.tensor([True, False, True]), torch.tensor([True, True, False])
            return torch.zeros(3, 31), torch.zeros(3), terminated, truncated, {"success": terminated}

    env.env = Stub()
    _, _, dones, extras = env.step(torch.zeros(3, 7))
    assert extras["time_outs"].tolist() == [False, True, False] and dones.tolist() == [1, 1, 1]
    assert extras["log"]["Episode/success_rate"].tolist() == [1.0, 0.0, 1.0]


def test_the_runner_gets_ours_initialization_std_and_linear_annealing():
    runner_module = import_rsl_rl()
    from rsl_rl.runners import OnPolicyRunner

    args = argparse.Namespace(num_steps=4, compile="none", learning_rate=1e-3)
    env = runner_module.PushCubeVecEnv(16, "cpu", seed=0)
    runner = OnPolicyRunner(env, runner_module.train_cfg(args), log_dir=None, device="cpu")
    runner_module.orthogonal_init(runner)
    actor, critic = runner.alg.get_policy(), runner.alg._raw_critic
    hidden = actor.mlp[2].weight  # 128 x 128, orthogonal with gain sqrt(2)
    assert torch.allclose(hidden @ hidden.T, 2 * torch.eye(128), atol=1e-4)
    assert torch.allclose(actor.mlp[4].weight @ actor.mlp[4].weight.T, 1e-4 * torch.eye(7), atol=1e-7)
    assert torch.allclose(critic.mlp[4].weight.norm(), torch.tensor(1.0), atol=1e-5)
    assert all(float(layer.bias.detach().abs().max()) == 0.0 for layer in (actor.mlp[0], actor.mlp[2], critic.mlp[0]))
    assert isinstance(actor.mlp[1], torch.nn.Tanh)
    assert torch.allclose(actor.distribution.log_std_param, torch.full((7,), -0.5))
    runner_module.anneal_learning_rate(runner, iterations=4, learning_rate=1e-3)
    runner.learn(num_learning_iterations=2)
    assert runner.alg.learning_rate == pytest.approx(1e-3 * (1 - 1 / 4))  # before the 2nd update: lr * (1 - 1/4)
    assert runner.alg.optimizer.param_groups[0]["lr"] == pytest.approx(7.5e-4)


def test_the_runner_trains_evaluates_and_records_its_phases(tmp_path):
    runner_module = import_rsl_rl()
    record = runner_module.main(["--total-timesteps", "128", "--num-envs", "16", "--num-steps", "4",
                                 "--num-eval-envs", "4", "--num-eval-episodes", "4",
                                 "--timings", str(tmp_path / "t.json")])  # fmt: skip
    assert record["iterations"] == 2 and record["global_step"] == 128
    times = json.loads((tmp_path / "t.json").read_text())["times"]
    order = ["started", "imported", "env_built", "runner_built", "learned", "evaluated"]
    assert list(times) == order and all(times[a] <= times[b] for a, b in zip(order, order[1:]))
    assert 0.0 <= record["eval"]["success_rate"] <= 1.0 and math.isfinite(record["eval"]["episodic_return"])
