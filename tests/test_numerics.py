"""Numeric fingerprints of every trainer and built-in env against their golden files (tests/numerics.py).

A failure is one line: which fingerprint, which scalar (or parameter, or env quantity), at which iteration or step,
the golden and the new value, and the command that writes the golden files anew. Regenerated golden files go in a
commit of their own that says why the numbers moved; the reports measured with the old numbers go stale
(tests/test_reports.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests import numerics
from tests.extras import needs
from tests.numerics import FINGERPRINTS, REGENERATE, first_difference, run_env, run_trainer, run_two_ranks, write_golden

pytestmark = pytest.mark.numerics


def _needs(fp) -> str | None:
    if fp.needs == "vla" and not (importlib.util.find_spec("transformers") and importlib.util.find_spec("peft")):
        return "needs the vla extra: uv sync --extra vla"
    if fp.needs == "compile" and (reason := _compile_fails()):  # (the trainer would go eager: not what is pinned)
        return f"torch.compile does not work here ({reason})"
    return None


def _compile_fails() -> str | None:
    """Why torch.compile cannot compile a small function on the CPU here (no C++ compiler, say), or None."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
    except Exception as e:  # noqa: BLE001 (whatever inductor raises: the fingerprint skips with it)
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _run(fp, **overrides) -> dict:
    """`fp`'s record. A compiled fingerprint compiles afresh, under the inductor settings in force: dynamo's cache
    of this process (empty before and after) would otherwise hand it code another test compiled from the same
    functions under other settings; and it must have compiled something."""
    if fp.config.get("compile") != "on":
        return run_trainer(fp, **overrides)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    try:
        graphs = counters["stats"]["unique_graphs"]
        record = run_trainer(fp, **overrides)
        assert counters["stats"]["unique_graphs"] > graphs, f"{fp.name}: the run compiled nothing"
    finally:
        torch._dynamo.reset()
    return record


def check(name: str, record: dict, update: bool) -> None:
    fp = FINGERPRINTS[name]
    if update:
        write_golden(fp, record)
        return
    if not fp.golden.is_file():
        pytest.fail(f"numerics {name}: no golden file {fp.golden.name}; write it with: {REGENERATE}", pytrace=False)
    import json

    found = first_difference(json.loads(fp.golden.read_text())["record"], record)
    if found:
        pytest.fail(f"numerics {name}: {found}; if the change is meant, regenerate: {REGENERATE}", pytrace=False)


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.mark.parametrize("name", [n for n, f in FINGERPRINTS.items() if f.kind == "trainer"])
def test_trainer_fingerprint(name, update_golden, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    fp = FINGERPRINTS[name]
    if reason := _needs(fp):
        pytest.skip(reason)
    check(name, _run(fp), update_golden)


def test_compiled_ppo_continuous_computes_what_eager_does(monkeypatch):
    """The compiled path (--compile on, or auto once it pays) has a golden file of its own, pinned bit for bit. The
    trainers compile with `fallback_random` (compiled random ops call eager's, so a run that starts eager and then
    compiles keeps one random stream): the compiled run draws what eager draws, and its record matches the eager
    golden file within the tolerance. Without it, inductor drew the samples from a stream of its own and the first
    iteration's approx_kl already differed by 70%."""
    import json

    monkeypatch.setenv("WANDB_MODE", "disabled")
    fp = FINGERPRINTS["ppo_continuous-compiled"]
    if reason := _needs(fp):
        pytest.skip(reason)
    assert {k: v for k, v in fp.config.items() if k != "compile"} == FINGERPRINTS["ppo_continuous"].config
    record = _run(fp)
    golden = json.loads(FINGERPRINTS["ppo_continuous"].golden.read_text())["record"]
    assert first_difference(golden, record) is None, first_difference(golden, record)


def test_two_rank_fingerprints(update_golden):
    """ppo_ddp and ppo_vla_ddp on two ranks (gradients all-reduced), in one torchrun launch."""
    names = [n for n, f in FINGERPRINTS.items() if f.kind == "trainer-2ranks"]
    for name, record in run_two_ranks(names).items():
        check(name, record, update_golden)


@pytest.mark.parametrize("name", [n for n, f in FINGERPRINTS.items() if f.kind == "env"])
def test_env_fingerprint(name, update_golden):
    check(name, run_env(FINGERPRINTS[name]), update_golden)


# ---- the tolerance is tight enough: a 10% change of what a run computes fails ------------------------------------
def _fails(name: str, record: dict) -> str:
    import json

    found = first_difference(json.loads(FINGERPRINTS[name].golden.read_text())["record"], record)
    assert found, f"a 10% change left the {name} fingerprint within its tolerance"
    return found


def test_a_loss_coefficient_10_percent_off_fails():
    """clip_coef 0.2 -> 0.22 moves ppo_continuous's record; vf_coef 0.5 -> 0.55 moves the pixel agent's, whose actor
    and critic share the image encoder. (With separate actor and critic networks, as on Pendulum, Adam undoes a
    constant scale of the critic's loss almost exactly: only the shared gradient clipping and Adam's epsilon see it.)"""
    _fails("ppo_continuous", run_trainer(FINGERPRINTS["ppo_continuous"], clip_coef=0.22))
    _fails("ppo_continuous-pixels", run_trainer(FINGERPRINTS["ppo_continuous-pixels"], vf_coef=0.55))


def test_a_recurrent_update_that_carries_memory_across_episode_starts_fails(monkeypatch):
    """The recurrent trainer's replay without the resets of the memory where episodes start (Pendulum's episodes end
    inside its rollouts) moves ppo_recurrent's record."""
    from cleanrl_embodied import ppo_recurrent

    unroll = ppo_recurrent.Agent.unroll
    monkeypatch.setattr(ppo_recurrent.Agent, "unroll", lambda self, obs, starts, state: unroll(
        self, obs, torch.zeros_like(starts), state))  # fmt: skip
    _fails("ppo_recurrent", run_trainer(FINGERPRINTS["ppo_recurrent"]))


def test_a_reward_weight_10_percent_off_fails():
    """PushCubeRL's reach weight times 1.1 moves the env's record, at its rewards."""
    from cleanrl_embodied.shared.envs.push_cube import DEFAULT_REWARD_WEIGHTS

    weights = {"reach": DEFAULT_REWARD_WEIGHTS["reach"] * 1.1}
    found = _fails("env-PushCubeRL", run_env(FINGERPRINTS["env-PushCubeRL"], reward_weights=weights))
    assert found.startswith("variant0 reward[0] at step 1:"), found  # the first step's reward already moves


def test_the_few_shot_targets_direction_moved_fails(monkeypatch):
    """forward_right, the few-shot VLA experiment's target, pushed 10% of its angle off (-45 -> -49.5 degrees) moves
    env-PushCubeLangRL-fewshot's record at its first step; env-PushCubeLangRL's (the four default tasks, which never
    draw it) stays as it is, which is why the diagonals have a fingerprint of their own."""
    import math

    from cleanrl_embodied.shared.envs.push_cube import options

    angle, words = options.TASKS["forward_right"]
    monkeypatch.setitem(options.TASKS, "forward_right", (angle * 1.1, words))
    assert angle == -0.25 * math.pi
    found = _fails("env-PushCubeLangRL-fewshot", run_env(FINGERPRINTS["env-PushCubeLangRL-fewshot"]))
    assert found.startswith("variant0 obs[6] at step 1:"), found  # the arm's state: the expert heads elsewhere
    check("env-PushCubeLangRL", run_env(FINGERPRINTS["env-PushCubeLangRL"]), update=False)


@needs("vla")
def test_the_few_shot_fingerprint_steps_the_experiments_envs():
    """Its variants are the env of demos.py's target (the RL runs add the 0/1 reward, the evaluation the held-out
    paraphrases) and of pretrain.py's corpus, as they are today."""
    from examples.hf_vla import demos, pretrain

    target, heldout, corpus = FINGERPRINTS["env-PushCubeLangRL-fewshot"].config["variants"]
    assert numerics.FEWSHOT_TARGET == demos.TARGET_ENV
    assert corpus["tasks"] == list(pretrain.PRETRAIN_TASKS) and corpus["view_tasks"] == list(pretrain.LANG_TASKS)
    assert corpus["obs_cameras"] == list(pretrain.LAYOUTS["proprio_rgb_wrist"][1])
    assert heldout["obs_mode"] == "state+rgb" and target["reward_weights"]["success"] == 1


def test_the_group_advantage_scale_10_percent_off_fails(monkeypatch):
    """GRPO's group advantages times 1.1 moves grpo's record."""
    from cleanrl_embodied import grpo

    original = grpo.group_advantages

    def scaled(*args, **kwargs):
        advantages, stats = original(*args, **kwargs)
        return advantages * 1.1, stats

    monkeypatch.setattr(grpo, "group_advantages", scaled)
    _fails("grpo", run_trainer(FINGERPRINTS["grpo"]))


def test_the_tolerance_passes_what_rounding_changes():
    """A record whose every value is off by a few float32 roundings still matches; one 10x the tolerance does not."""
    fp = FINGERPRINTS["ppo_continuous"]
    import json

    golden = json.loads(fp.golden.read_text())["record"]
    nudged = json.loads(json.dumps(golden))
    for _, scalars in nudged["iterations"]:
        for tag in scalars:
            scalars[tag] *= 1 + 3e-7
    assert first_difference(golden, nudged) is None
    step, scalars = nudged["iterations"][1]
    scalars["losses/value_loss"] *= 1 + 10 * numerics.RTOL
    found = first_difference(golden, nudged)
    assert found is not None and found.startswith(f"losses/value_loss at step {step}: golden "), found


def test_a_failure_is_one_line_that_names_the_command():
    fp = FINGERPRINTS["env-PushCubeLangRL"]
    record = run_env(fp, steps=2)
    with pytest.raises(pytest.fail.Exception) as failed:
        check(fp.name, record, update=False)
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"numerics {fp.name}: ") and REGENERATE in message
