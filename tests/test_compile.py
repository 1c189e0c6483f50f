"""The compiled update: the same pure functions as eager, the same results up to float rounding, when `--compile auto`
compiles, the fallback where compiling does not work, and bit-identical resume of a compiled run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from datetime import date
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from toy_policies import ToyVLA

from cleanrl_embodied import (
    grpo,
    grpo_vla,
    ppo_continuous,
    ppo_ddp,
    ppo_recurrent,
    ppo_vla,
    ppo_vla_async,
    ppo_vla_ddp,
)
from cleanrl_embodied.shared import compilation
from cleanrl_embodied.shared.compilation import Compiler, compile_choice
from tests.trainer_args import FOUR_ENVS, is_vla, tiny_args

REPO = Path(__file__).resolve().parents[1]
PPO = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp, "ppo_vla_async": ppo_vla_async}


def _minibatch(n: int, obs_dim: int, act_dim: int, generator: torch.Generator) -> TensorDict:
    randn = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    return TensorDict(
        obs=randn(n, obs_dim), action=randn(n, act_dim), logprob=randn(n) - 3.0, value=randn(n),
        advantages=randn(n), returns=randn(n), mask=torch.rand(n, generator=generator) > 0.2,
        ref_logprob=randn(n) - 3.0, batch_size=[n],
    )  # fmt: skip


def _classic_backward(loss_fn):
    """The classic PPO trainers' update (no micro-batches): the loss over the whole minibatch, then its backward."""

    def backward(agent, mb: TensorDict, args, weight: float) -> tuple[torch.Tensor, TensorDict]:
        loss, stats = loss_fn(agent, mb, args)
        loss.backward()
        return loss.detach(), stats

    return backward


def _update(module, agent, mb: TensorDict, args, compile_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """One minibatch update with the trainer's own functions (with micro-batches in two pieces, so accumulation is
    compiled too): backward_piece (the classic PPO trainers: ppo_loss, then backward), clip_gradients and the
    optimizer step, each through ``compile_fn``."""
    params = [p for p in agent.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=torch.tensor(3e-3), eps=1e-5)
    classic = module in (ppo_continuous, ppo_ddp, grpo)  # grpo.py: grpo_loss, then backward
    loss_fn = module.grpo_loss if module is grpo else getattr(module, "ppo_loss", None)
    backward_fn = _classic_backward(compile_fn(loss_fn)) if classic else compile_fn(module.backward_piece)
    clip_fn, step_fn = compile_fn(module.clip_gradients), compile_fn(optimizer.step)
    for _ in range(3):  # three steps, so the optimizer's moments matter
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for piece in (mb,) if classic else mb.split(mb.shape[0] // 2):
            if module is grpo_vla:  # its pieces' shares: of the minibatch's alive samples (or its size, Dr. GRPO)
                losses.append(backward_fn(agent, piece, args, mb["mask"].sum(), len(mb))[0])
            else:
                losses.append(backward_fn(agent, piece, args, len(piece) / len(mb))[0])
        norm = clip_fn(params, args.max_grad_norm)
        step_fn()
    return sum(losses), norm


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo", "grpo_vla"])
def test_compiled_and_eager_updates_agree_on_the_same_minibatch(name):
    module = {**PPO, "grpo": grpo, "grpo_vla": grpo_vla}[name]
    obs_space = gym.spaces.Box(-np.inf, np.inf, (11,), np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    vla = is_vla(module)  # a VLA trainer: the policy is toy_policies' ToyVLA
    args = module.Args(max_grad_norm=0.5) if vla else module.Args(hidden_sizes=(32, 32), max_grad_norm=0.5)
    torch.manual_seed(0)
    make = partial(ToyVLA, hidden=32) if vla else module.Agent if hasattr(module, "Agent") else module.Actor
    eager_agent = make(obs_space, act_space, args)
    compiled_agent = copy.deepcopy(eager_agent)
    initial = copy.deepcopy(eager_agent.state_dict())
    mb = _minibatch(64, 11, 3, torch.Generator().manual_seed(1))
    eager = _update(module, eager_agent, mb.clone(), args, lambda fn: fn)
    compiled = _update(module, compiled_agent, mb.clone(), args, torch.compile)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)
    for key, value in eager_agent.state_dict().items():
        torch.testing.assert_close(compiled_agent.state_dict()[key], value, rtol=1e-5, atol=1e-6)
    assert any((value - initial[key]).abs().max() > 1e-4 for key, value in eager_agent.state_dict().items())


class _Clock:
    """time.perf_counter for compilation.py: a clock the test moves."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def _compiler(setting: str = "auto", flags: dict | None = None, sha: str = "abc", **kw) -> tuple[Compiler, list]:
    said: list[str] = []
    trainer = {"script": "my_ppo", "sha256": sha}
    return Compiler(setting, torch.device("cpu"), said.append, trainer, flags or {"num_envs": 8}, **kw), said


def _iterations(monkeypatch, compiler: Compiler, lengths, lefts, between: float = 0.0) -> None:
    """The trainer's loop as the compiler sees it: each iteration a wrapped call at its start (the rollout's first
    policy step), ``lengths[i]`` seconds, then ``after_iteration(lefts[i])``; then ``between`` seconds of evaluation
    and checkpoints, which call no wrapped function."""
    clock = _Clock()
    monkeypatch.setattr(compilation, "time", clock)
    fn = compiler(lambda: None)
    for length, left in zip(lengths, lefts, strict=True):
        fn()
        clock.now += length
        compiler.after_iteration(left)
        clock.now += between


def test_auto_decides_after_the_second_iteration_from_its_length_and_what_compiling_costs(monkeypatch):
    """Without measurements of this machine: compiled iterations take CPU_COMPILED_RATIO of an eager one, and
    compiling costs CPU_COMPILE_S; the run compiles when the iterations left would save more than that."""
    assert (compilation.CPU_COMPILED_RATIO, compilation.CPU_COMPILE_S) == (0.73, 12.0)
    saving_per_iteration = 1.0 * (1 - 0.73)  # an eager iteration of 1 s
    for left, on in [(45, True), (44, False)]:  # 45 x 0.27 = 12.15 s > 12 s > 44 x 0.27 = 11.88 s
        compiler, said = _compiler()
        _iterations(monkeypatch, compiler, (9.0, 1.0), [left + 1, left], between=30.0)  # (the 1st, 9 s, warms up)
        assert compiler.on is on and compiler.mode == ("compiled" if on else "eager")
        assert said == [
            f"compile: {'on' if on else 'off'} (auto: an eager iteration took 1.000 s; compiled ones take 0.73x that"
            f" and compiling 12.0 s (our measurement; none on this machine yet): {left} iterations left would save "
            f"{left * saving_per_iteration:.1f} s)"
        ]


def test_auto_decides_from_this_machines_measurements_of_the_same_configuration(compile_times, monkeypatch):
    compiler, _ = _compiler()
    key = compiler.key
    compile_times.write_text(json.dumps({key: {"eager_s": 4.0, "compiled_ratio": 0.5, "compile_s": 2.0}}))
    for left, on in [(5, True), (4, False)]:  # half of each 1 s iteration saved: 2.5 s > 2 s; 2 s is not > 2 s
        compiler, said = _compiler()
        _iterations(monkeypatch, compiler, (1.0, 1.0), [left + 1, left])
        assert compiler.on is on, said
        assert said[0].endswith(f"0.50x that and compiling 2.0 s (measured here): {left} iterations left would save "
                                f"{left * 0.5:.1f} s)")  # fmt: skip
    other, said = _compiler(flags={"num_envs": 16})  # another configuration: nothing measured for it
    _iterations(monkeypatch, other, (1.0, 1.0), [5, 4])
    assert other.on is False and "none on this machine yet" in said[0]


def test_runs_that_differ_in_seed_length_or_keeping_share_measurements_and_others_do_not():
    key = lambda **kw: _compiler(**kw)[0].key  # noqa: E731
    base = {"num_envs": 8, "seed": 1, "total_timesteps": 10**6, "output_dir": "a", "compile": "auto"}
    assert key(flags=base) == key(flags={**base, "seed": 2, "total_timesteps": 5, "output_dir": "b", "compile": "on"})
    assert key(flags=base) != key(flags={**base, "num_envs": 16})
    assert key(flags=base) != key(flags=base, sha="a changed file")
    assert key(flags=base).startswith("my_ppo ") and f"with torch {torch.__version__}" in key(flags=base)


def test_each_run_records_what_it_measured_for_the_next(compile_times, monkeypatch):
    monkeypatch.setattr(compilation, "torch", _FakeCompile(torch))
    window = compilation.WINDOW
    eager, _ = _compiler("off")
    _iterations(monkeypatch, eager, (9.0, *[0.5] * window), range(window + 1, 0, -1), 3.0)  # (the 1st: untimed)
    compiled, _ = _compiler("on")
    _iterations(monkeypatch, compiled, (5.0, 1.5, *[1.0] * (window - 2)), range(window, 0, -1), 3.0)  # (the 1st timed)
    (entry,) = json.loads(compile_times.read_text()).values()
    assert entry == {
        "eager_s": 0.5,
        "compiled_s": 1.0,
        "compile_s": 4.5,
        "compiled_ratio": 2.0,  # (over the eager run's iteration: this compiled run timed none of its own)
        "runs": {
            "eager": [{"eager_s": 0.5}],
            "compiled": [{"compiled_s": 1.0, "compile_s": 4.5, "eager_s_paired": None}],
        },
        "date": date.today().isoformat(),
    }  # (the 3 s between iterations in none of them)
    # an auto run that compiled: the eager iteration it timed, with the compiled ones
    compile_times.write_text("{}")
    auto, _ = _compiler("auto")
    monkeypatch.setattr(compilation, "CPU_COMPILE_S", 0.0)
    _iterations(monkeypatch, auto, (9.0, 2.0, 3.0, *[1.0] * (window - 1)), range(window + 2, 0, -1))
    (entry,) = json.loads(compile_times.read_text()).values()
    assert entry["runs"]["compiled"] == [{"compiled_s": 1.0, "compile_s": 2.0, "eager_s_paired": 2.0}]
    assert (entry["compiled_ratio"], entry["compiled_s"], entry["compile_s"]) == (0.5, 1.0, 2.0)


def test_the_decision_uses_the_medians_of_the_last_runs_so_one_run_beside_another_job_does_not_flip_it():
    """Each mode keeps its last HISTORY runs; the ratio pairs a compiled run with the eager iteration it timed
    itself (an auto run) and otherwise with the eager runs' median."""
    assert compilation.HISTORY == 5
    eager = [{"eager_s": s} for s in (1.0, 1.0, 9.0)]  # (the 9 s run: beside another job)
    compiled = [{"compiled_s": 0.5, "compile_s": c, "eager_s_paired": None} for c in (60.0, 8.0, 9.0, 10.0)]
    compiled.append({"compiled_s": 4.0, "compile_s": 9.0, "eager_s_paired": 8.0})  # a loaded auto run: 0.5x too
    summary = compilation._summary({"eager": eager, "compiled": compiled})
    assert summary == {"eager_s": 1.0, "compiled_s": 0.5, "compile_s": 9.0, "compiled_ratio": 0.5}
    assert compilation._summary({"eager": [], "compiled": []}) == {}  # nothing measured: the defaults decide
    assert compilation._summary({"eager": [], "compiled": compiled[:1]}) == {"compiled_s": 0.5, "compile_s": 60.0}


def test_a_configuration_keeps_the_last_runs_of_each_mode(compile_times, monkeypatch):
    monkeypatch.setattr(compilation, "torch", _FakeCompile(torch))
    window = compilation.WINDOW
    for run in range(compilation.HISTORY + 2):
        compiler, _ = _compiler("off")
        _iterations(monkeypatch, compiler, (9.0, *[1.0 + run] * window), range(window + 1, 0, -1))
    (entry,) = json.loads(compile_times.read_text()).values()
    assert [r["eager_s"] for r in entry["runs"]["eager"]] == [3.0, 4.0, 5.0, 6.0, 7.0]  # (the first two dropped)
    assert entry["eager_s"] == 5.0 and entry["runs"]["compiled"] == []


class _FakeCompile:
    """``torch`` for compilation.py with torch.compile recording what it compiles (and ``when()``, if given, in
    ``at``) and returning it as it is, or a function that raises ``fail``."""

    def __init__(self, real, fail: BaseException | None = None, when=None):
        self.real, self.fail, self.when, self.compiled, self.at = real, fail, when, [], []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def compile(self, fn, **kwargs):
        self.compiled.append((fn, kwargs))
        if self.when is not None:
            self.at.append(self.when())
        if self.fail is None:
            return fn

        def failing(*args, **kw):
            raise self.fail

        return failing


def test_compiled_functions_draw_eager_random_numbers_and_compile_at_their_first_call(monkeypatch):
    fake = _FakeCompile(torch)
    monkeypatch.setattr(compilation, "torch", fake)
    fn = lambda x: x + 1  # noqa: E731
    off = _compiler("off")[0](fn)
    assert off(1) == 2 and fake.compiled == []  # (wrapped only to time the iterations)
    compiled, said = _compiler("on")
    wrapped = compiled(fn)
    assert fake.compiled == [] and wrapped(1) == 2 and wrapped(2) == 3
    assert fake.compiled == [(fn, {"options": {"fallback_random": True}})] and said == []


def test_a_compile_that_fails_says_so_once_and_the_run_goes_eager(monkeypatch):
    class NoCompiler(torch._dynamo.exc.BackendCompilerFailed):
        def __init__(self):
            RuntimeError.__init__(self, "InvalidCxxCompiler: No working C++ compiler found\nmore")

    monkeypatch.setattr(compilation, "torch", _FakeCompile(torch, fail=NoCompiler()))
    compiler, said = _compiler("on")
    f, g = compiler(lambda x: x + 1), compiler(lambda x: x * 2)
    assert (f(1), g(3), f(2)) == (2, 6, 3) and compiler.on is False and compiler.mode is None
    assert said == ["warning: --compile: torch.compile does not work here (NoCompiler: InvalidCxxCompiler: No working "
                    "C++ compiler found); the run goes eager"]  # fmt: skip
    monkeypatch.setattr(compilation, "torch", _FakeCompile(torch, fail=RuntimeError("shapes do not match")))
    compiler, said = _compiler("on")
    with pytest.raises(RuntimeError, match="shapes do not match"):  # the function's own error is not hidden
        compiler(lambda x: x)(1)


def test_auto_decides_by_measurement_on_the_cpu_and_on_cuda_only_with_cuda_graphs():
    """CPU: measured (None until decided). CUDA (H200, ppo_continuous, 4096 envs, steady env steps/s): eager
    221,697, compiled 187,905, compiled with CUDA graphs 277,303; so only a run with CUDA graphs compiles. Other
    devices: eager."""
    assert compile_choice("on", "cuda") and compile_choice("on", "cpu")
    assert compile_choice("off", "cpu") is False and compile_choice("off", "cuda", cudagraphs=True) is False
    assert compile_choice("auto", "cpu") is None and compile_choice("auto", "cpu", cudagraphs=True) is None
    assert compile_choice("auto", "cuda") is False  # never the slower path
    assert compile_choice("auto", "cuda", cudagraphs=True) is True
    assert compile_choice("auto", "mps") is False


# 3 iterations of 2 epochs x 2 minibatches (toy_policies' ToyVLA for a VLA trainer)
THREE_ITERATIONS = dict(
    FOUR_ENVS, num_steps=4, update_epochs=2, total_timesteps=3 * 16, eval_freq=0, save_freq=0, hidden_sizes=(8,)
)
TRAINERS = {**PPO, "grpo": grpo, "grpo_vla": grpo_vla, "ppo_vla": ppo_vla, "ppo_vla_ddp": ppo_vla_ddp,
            "ppo_recurrent": ppo_recurrent}  # fmt: skip
PAYS = {"compiled_ratio": 0.5, "compile_s": 0.0}  # measurements under which compiling always pays
NEVER_PAYS = {"compiled_ratio": 0.5, "compile_s": 1e9}


class _Everywhere(dict):
    """A record of compile measurements that holds ``entry`` for every configuration."""

    def __init__(self, entry: dict):
        super().__init__()
        self.entry = entry

    def get(self, key, default=None):
        return self.entry


def _watch(monkeypatch, known: dict) -> tuple[_FakeCompile, list]:
    """torch.compile recorded (and run eager), ``known`` the measurements of every configuration, and the
    iterations left that each call of ``after_iteration`` was given."""
    lefts = []
    fake = _FakeCompile(torch, when=lambda: len(lefts))  # (at: how many iterations had ended)
    monkeypatch.setattr(compilation, "torch", fake)
    monkeypatch.setattr(compilation, "_read_times", lambda: _Everywhere(known))
    real = Compiler.after_iteration
    monkeypatch.setattr(Compiler, "after_iteration", lambda self, left: lefts.append(left) or real(self, left))
    return fake, lefts


def _summary(out: dict) -> dict:
    return json.loads((Path(out["run_dir"]) / "summary.json").read_text())


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_every_trainer_times_its_iterations_and_compiles_after_the_second_when_it_pays(tmp_path, monkeypatch, name):
    """Each trainer wraps its functions in shared.Compiler and calls after_iteration once per iteration with the
    iterations left: under auto, measurements that say compiling pays compile from the third iteration on, and the
    choice is in the checkpoint and summary.json."""
    module = TRAINERS[name]
    fake, lefts = _watch(monkeypatch, PAYS)
    out = module.main(tiny_args(module, tmp_path, THREE_ITERATIONS, compile="auto"))
    assert lefts == [2, 1, 0]
    assert fake.compiled and set(fake.at) == {2}, fake.at  # (each wrapped function, at its first call)
    assert _summary(out)["compiled"] is True
    last = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert last["compiled"] is True


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_vla_async", "grpo"])
@pytest.mark.parametrize("setting, known, compiles", [("auto", NEVER_PAYS, False), ("on", NEVER_PAYS, True),
                                                      ("off", PAYS, False)])  # fmt: skip
def test_on_compiles_from_the_first_call_off_never_and_auto_not_where_it_does_not_pay(
    tmp_path, monkeypatch, name, setting, known, compiles
):
    module = TRAINERS[name]
    fake, lefts = _watch(monkeypatch, known)
    out = module.main(tiny_args(module, tmp_path, THREE_ITERATIONS, compile=setting))
    assert lefts == [2, 1, 0] and _summary(out)["compiled"] is compiles
    assert set(fake.at) == ({0} if compiles else set()), fake.at


def test_a_function_kept_eager_on_the_cpu_compiles_on_other_devices(monkeypatch):
    fake = _FakeCompile(torch)
    monkeypatch.setattr(compilation, "torch", fake)
    step, value = lambda x: x + 1, lambda x: x * 2  # noqa: E731
    cpu, _ = _compiler("on")
    assert cpu(step, on_cpu=False)(1) == 2 and cpu(value)(2) == 4
    assert [fn for fn, _ in fake.compiled] == [value]
    elsewhere = Compiler("on", torch.device("meta"), print, {"script": "my_ppo", "sha256": "abc"}, {})
    assert elsewhere(step, on_cpu=False)(1) == 2 and [fn for fn, _ in fake.compiled] == [value, step]


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp", "ppo_recurrent", "grpo"])
def test_the_classic_trainers_compile_their_update_but_not_their_rollout_on_the_cpu(tmp_path, monkeypatch, name):
    """--compile on, on the CPU: the loss, the clipping and Adam's step compiled; the policy step and V eager."""
    module = TRAINERS[name]
    fake, _ = _watch(monkeypatch, PAYS)
    module.main(tiny_args(module, tmp_path, THREE_ITERATIONS, compile="on"))
    names = {getattr(getattr(fn, "func", fn), "__name__", "") for fn, _ in fake.compiled}
    assert {"clip_gradients", "step"} <= names and ("grpo_loss" if name == "grpo" else "ppo_loss") in names, names
    assert not names & {"policy_step", "get_value"}, names


def test_a_resumed_auto_run_keeps_the_choice_its_checkpoint_recorded(tmp_path, monkeypatch, capsys):
    """The choice made at the second iteration is in that iteration's checkpoint; resumed from it, the run compiles
    from its first call whatever it would decide now, and ends where the straight run ends."""
    common = dict(THREE_ITERATIONS, total_timesteps=4 * 16, save_freq=2, compile="auto")
    fake, _ = _watch(monkeypatch, PAYS)
    straight = ppo_continuous.main(tiny_args(ppo_continuous, tmp_path / "a", common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    assert torch.load(half, weights_only=True)["compiled"] is True
    fake, lefts = _watch(monkeypatch, NEVER_PAYS)
    resumed = ppo_continuous.main(tiny_args(ppo_continuous, tmp_path / "b", common, resume=str(half)))
    assert lefts == [1, 0] and set(fake.at) == {0}
    assert "compile: on (auto: as the run this one resumes decided)" in capsys.readouterr().out
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    assert all(torch.equal(value, b["model"][key]) for key, value in a["model"].items())


def test_where_compiling_does_not_work_the_run_says_so_and_trains_eager(tmp_path):
    """No C++ compiler for inductor's CPU code (CXX names none): one warning line, then the eager update."""
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "OMP_NUM_THREADS": "1"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor-cache")  # nothing compiled before to reuse
    cmd = [
        sys.executable, str(REPO / "cleanrl_embodied" / "ppo_continuous.py"), "--compile", "on", "--num-envs", "8",
        "--num-steps", "4", "--num-minibatches", "2", "--total-timesteps", "64", "--eval-freq", "0",
        "--num-eval-envs", "2", "--num-eval-episodes", "2", "--output-dir", str(tmp_path / "runs"), "--no-cuda",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "torch.compile does not work here" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: --compile: torch.compile does not work here ("), warnings
    assert warnings[0].endswith("); the run goes eager"), warnings
    assert "done: global_step=64" in proc.stdout


def test_a_compiled_run_resumes_bit_identically(tmp_path):
    common = dict(
        env_id="PushCubeRL", num_envs=16, num_steps=4, num_minibatches=2, update_epochs=2, total_timesteps=16 * 4 * 4,
        eval_freq=0, save_freq=2, num_eval_envs=2, num_eval_episodes=2, hidden_sizes=(32,), compile="on", cuda=False,
    )  # fmt: skip
    straight = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "a"), **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "b"), resume=str(half), **common))
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for state_a, state_b in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
