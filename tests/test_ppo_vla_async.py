"""ppo_vla_async.py: overlap, version bookkeeping, shutdown on errors and Ctrl-C, exact resume, learning, forward
passes bounded by --micro-batch-size, no stale losses logged for a dropped rollout or an iteration whose steps were
all skipped, snapshots that hold only what changes (not frozen weights), and the refusal of checkpoints from before
the VLA trainers split (issue 37).
The policy is tests/toy_policies.py's `ToyVLA` (the trainer has no network of its own)."""

from __future__ import annotations

import ast
import inspect
import json
import threading
from pathlib import Path

import pytest
import torch
import toy_policies
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied import ppo_vla_async, shared
from cleanrl_embodied.shared import make_env
from tests.subprocesses import TESTS, ctrl_c_a_long_run, subprocess_env
from tests.trainer_args import EIGHT_ENVS, TOY_VLA, fit, without_network

SCRIPT = Path(ppo_vla_async.__file__)
TINY = fit(ppo_vla_async, dict(EIGHT_ENVS, policy_kwargs='{"hidden": 32}', eval_freq=0, save_freq=0))  # ToyVLA


def tiny_args(tmp_path, iterations: int = 6, **overrides) -> ppo_vla_async.Args:
    steps = iterations * 8 * 10 * overrides.get("action_chunk", 1)  # a decision of a chunk of K actions runs K steps
    return ppo_vla_async.Args(**{**TINY, "output_dir": str(tmp_path), "total_timesteps": steps, **overrides})


POLICY_128 = '{"hidden": 128}'


def collector_alive() -> bool:
    return any(t.name == "ppo-async-collector" and t.is_alive() for t in threading.enumerate())


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return max(a[0], b[0]) < min(a[1], b[1])


def test_smoke_run_writes_summary_events_and_checkpoints(tmp_path):
    out = ppo_vla_async.main(tiny_args(tmp_path, eval_freq=2, save_freq=2))
    run_dir = Path(out["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["script"] == "ppo_vla_async" and summary["global_step"] == 480
    assert summary["dropped_rollouts"] == 0 and summary["eval"]["success_rate"] is not None
    for name in ("losses/policy_loss", "losses/approx_kl", "charts/policy_staleness", "charts/learner_wait_s"):
        assert name in summary["train"], name
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [80, 160, 240, 320, 400, 480]
    assert {"eval/success_rate", "eval/episodic_return"} <= set(acc.Tags()["scalars"])
    names = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert {"last.pt", "best.pt", "iter_000002.pt", "iter_000006.pt"} <= names
    assert not collector_alive()


def test_collector_overlaps_the_update_and_staleness_zero_does_not(tmp_path):
    """Judged from the policy's own calls, in the order they happen (not from the trainer's timeline): with
    --max-staleness 1 the collector thread acts (steps rollout j+1) between the first and the last training
    forward of update j; with --max-staleness 0 it never does. The calls sleep (5 ms per rollout step, 10 ms per
    training forward), so an update lasts 40 ms and a rollout 50 ms: overlap or not is unambiguous."""
    per_update = TINY["update_epochs"] * TINY["num_minibatches"]
    for k in (1, 0):
        toy_policies.RECORDS.clear()
        ppo_vla_async.main(
            tiny_args(
                tmp_path / str(k),
                iterations=6,
                max_staleness=k,
                target_kl=None,
                policy="toy_policies:recording",
                policy_kwargs='{"rollout_ms": 5, "update_ms": 10}',
            )
        )
        calls = toy_policies.RECORDS
        learner = [i for i, (name, grad, _) in enumerate(calls) if grad]
        assert len(learner) == 6 * per_update and all(calls[i][0] == "MainThread" for i in learner)
        collector_during = [
            sum(
                calls[i][0] == "ppo-async-collector"
                for i in range(learner[u * per_update], learner[-1 + (u + 1) * per_update])
            )
            for u in range(6)
        ]
        if k == 1:  # every update but the last (no rollout is left to collect then)
            assert all(n > 0 for n in collector_during[:-1]), collector_during
        else:
            assert not any(collector_during), collector_during


@pytest.mark.parametrize("k", [1, 2])
def test_versions_are_bounded_and_the_inference_copy_is_fixed_during_a_rollout(tmp_path, k):
    """Every policy call of rollout j acts with the parameters the learner held after consuming j - K
    rollouts, unchanged for the whole rollout, although the learner updates meanwhile."""
    toy_policies.RECORDS.clear()
    out = ppo_vla_async.main(
        tiny_args(
            tmp_path,
            iterations=8,
            max_staleness=k,
            policy="toy_policies:recording",
            policy_kwargs='{"rollout_ms": 2}',
            target_kl=None,
        )
    )
    T, per_update = TINY["num_steps"], TINY["update_epochs"] * TINY["num_minibatches"]
    calls = [(name, fp) for name, grad, fp in toy_policies.RECORDS if not grad and name != "MainThread"]
    learner = [fp for name, grad, fp in toy_policies.RECORDS if grad]
    # the learner's weights after consuming c rollouts = those of its first training forward of update c + 1
    published = {c: learner[c * per_update] for c in range(8)}
    assert len(calls) == 8 * T and {name for name, _ in calls} == {"ppo-async-collector"}
    for j, entry in enumerate(out["timeline"]):
        assert entry["index"] == j and not entry["dropped"]
        assert 0 <= entry["learner_version"] - entry["behaviour_version"] <= k
        rollout = {fp for _, fp in calls[j * T : (j + 1) * T]}
        assert rollout == {published[max(j - k, 0)]}, j  # one set of weights, the right one
        assert entry["behaviour_version"] == max(j - k, 0)
    assert max(e["learner_version"] - e["behaviour_version"] for e in out["timeline"]) == k  # really stale
    assert len({fp for _, fp in calls}) > 1  # and the copy is refreshed between rollouts


def test_exception_in_the_collector_surfaces_with_its_message_and_stops_everything(tmp_path):
    """A simulator that crashes in its 25th step: the two rollouts completed before are learned from and
    counted, the exception surfaces in the learner with a note, and no checkpoint is written by the crash."""
    with pytest.raises(RuntimeError, match="raise_at_step=25 reached") as e:
        ppo_vla_async.main(
            tiny_args(
                tmp_path, iterations=20, env_id="tests.envs_for_tests:PointReach-v0", env_kwargs='{"raise_at_step": 25}'
            )
        )
    assert "collector thread" in "".join(getattr(e.value, "__notes__", []))
    assert not collector_alive()
    run_dir = next(tmp_path.glob("PointReach-v0__*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 2 * 80 and summary["checkpoint"] is None
    assert not (run_dir / "checkpoints" / "last.pt").exists()


def test_exception_in_the_learner_keeps_the_last_consistent_checkpoint(tmp_path):
    """A crash inside the update of iteration 3 stops the collector, writes summary.json, and leaves the
    last.pt of iteration 2 as it was (with the collector's state), from which a resume continues exactly."""
    toy_policies.FAILED_ONCE.clear()
    args = dict(
        iterations=5,
        save_freq=2,
        policy="toy_policies:fail_in_update",
        target_kl=None,
        policy_kwargs='{"at_call": 9, "once": true}',
    )  # 2 epochs x 2 minibatches: call 9 is in iteration 3
    with pytest.raises(RuntimeError, match="injected failure inside the update"):
        ppo_vla_async.main(tiny_args(tmp_path / "a", **args))
    assert not collector_alive()
    run_dir = next((tmp_path / "a").glob("PushCubeRL__*"))
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 2 and ckpt["global_step"] == 160 and ckpt["collector"] is not None
    assert json.loads((run_dir / "summary.json").read_text())["checkpoint"].endswith("last.pt")
    # the same run without the fault (it fired once already), resumed from that last.pt, ends as the straight run
    straight = ppo_vla_async.main(tiny_args(tmp_path / "b", **args))
    resumed = ppo_vla_async.main(tiny_args(tmp_path / "c", resume=str(run_dir / "checkpoints" / "last.pt"), **args))
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_resume_mid_run_is_bit_identical_to_a_straight_run(tmp_path):
    """The checkpoint holds the collector's side too (pending rollouts, snapshots, env and generator state)."""
    common = dict(save_freq=3, eval_freq=2, max_staleness=2)
    straight = ppo_vla_async.main(tiny_args(tmp_path / "a", iterations=7, **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    resumed = ppo_vla_async.main(tiny_args(tmp_path / "b", iterations=7, resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 560
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["collector"]["generator"].equal(b["collector"]["generator"])  # the collector's stream too
    assert [e["behaviour_version"] for e in straight["timeline"][3:]] == [
        e["behaviour_version"] for e in resumed["timeline"]
    ]


def test_resume_with_a_smaller_max_staleness_drops_and_counts_the_old_pending_rollouts(tmp_path):
    slow = dict(policy="toy_policies:slow", policy_kwargs='{"update_ms": 10}')  # the collector runs K ahead
    first = ppo_vla_async.main(tiny_args(tmp_path / "a", iterations=8, save_freq=3, max_staleness=2, **slow))
    ckpt_path = Path(first["run_dir"]) / "checkpoints" / "iter_000003.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    stale = [p for p in ckpt["collector"]["pending"] if ckpt["version"] - p["version"] > 0]
    assert stale, "the slow learner should have left pending rollouts in the checkpoint"
    resumed = ppo_vla_async.main(
        tiny_args(tmp_path / "b", iterations=8, max_staleness=0, resume=str(ckpt_path), **slow)
    )
    assert sum(e["dropped"] for e in resumed["timeline"]) == len(stale)
    assert all(e["learner_version"] == e["behaviour_version"] for e in resumed["timeline"] if not e["dropped"])
    summary = json.loads((Path(resumed["run_dir"]) / "summary.json").read_text())
    assert summary["dropped_rollouts"] == len(stale) and summary["global_step"] == 8 * 80


def test_same_command_gives_the_same_run(tmp_path):
    runs = [
        ppo_vla_async.main(
            tiny_args(tmp_path / name, iterations=5, policy="toy_policies:slow", policy_kwargs='{"rollout_ms": 1}')
        )
        for name in "ab"
    ]
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in runs)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


@pytest.mark.parametrize("flag, value", [("max_staleness", -1), ("policy", "toy_policies:no_such_factory")])
def test_bad_input_is_one_clear_line(tmp_path, flag, value):
    with pytest.raises(SystemExit) as e:
        ppo_vla_async.main(tiny_args(tmp_path, **{flag: value}))
    assert f"--{flag.replace('_', '-')}" in str(e.value) and "\n" not in str(e.value)


def test_ctrl_c_stops_both_sides_and_writes_last_checkpoint_and_summary(tmp_path):
    _, ckpt = ctrl_c_a_long_run(SCRIPT, tmp_path, "--policy", TOY_VLA, env=subprocess_env(TESTS))  # (toy_policies)
    assert ckpt["collector"] is not None and ckpt["collector"]["next_index"] >= ckpt["iteration"]


def test_default_ppo_vla_async_learns_to_push_the_cube(tmp_path, single_thread):
    """Default hyperparameters with one version of staleness, a small MLP policy: most eval episodes succeed after
    300k steps (seed 2), on one thread, so the test does not depend on the thread count earlier tests left.
    Measured on one thread with seeds 1-5: after 300k steps 1.0, 0.95, 1.0, 0.98, 0.97; after 200k (what this test
    ran before) 0.41, 0.67, 0.69, 0.95, 0.91, and on two threads 0.36, 0.81, 0.91, 0.89, 0.98: at 200k seed 2
    passed or failed by the thread count. Eager (`--compile auto` would compile where an iteration is slow enough
    for it to pay, and the result would then differ by rounding from the one measured)."""
    out = ppo_vla_async.main(
        ppo_vla_async.Args(
            output_dir=str(tmp_path),
            total_timesteps=300_000,
            cuda=False,
            compile="off",
            eval_freq=0,
            save_freq=0,
            seed=2,
            policy="toy_policies:ToyVLA",
            policy_kwargs=POLICY_128,
        )  # fmt: skip
    )
    assert out["eval"]["success_rate"] >= 0.8, out["eval"]
    assert max(e["learner_version"] - e["behaviour_version"] for e in out["timeline"]) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_cuda(tmp_path):
    out = ppo_vla_async.main(tiny_args(tmp_path, cuda=True))
    assert out["global_step"] == 480 and not collector_alive()


def test_compile_and_eval_checkpoint(tmp_path):
    out = ppo_vla_async.main(tiny_args(tmp_path / "a", iterations=3, compile="on"))
    last = Path(out["run_dir"]) / "checkpoints" / "last.pt"
    ckpt = torch.load(last, weights_only=True)
    assert not any("_orig_mod" in k for k in ckpt["model"]) and ckpt["global_step"] == 240
    evaluated = ppo_vla_async.main(tiny_args(tmp_path / "b", eval_checkpoint=str(last)))
    assert evaluated["global_step"] == 240 and evaluated["eval"]["episodic_length"] > 0
    assert "timeline" not in evaluated  # nothing was trained


@pytest.mark.parametrize("head", ["gaussian", "bins"])
def test_micro_batch_size_bounds_every_forward_pass(tmp_path, head):
    """Rollout (8 envs), value recomputation over a rollout's 80 observations and 80 final observations, the
    update's minibatches of 40 and evaluation (4 envs): no forward pass sees more than 3 observations, with chunks
    of 2 actions; the run is exact to the step count."""
    toy_policies.BATCHES.clear()
    flags = dict(micro_batch_size=3, action_chunk=2, action_head=head, action_bins=8, policy_kwargs="{}")
    out = ppo_vla_async.main(tiny_args(tmp_path, iterations=2, policy="toy_policies:batch_sizes", **flags))
    assert out["global_step"] == 2 * 80 * 2
    calls = toy_policies.BATCHES
    assert {name for name, _ in calls} == {"forward", "dist", "get_value"} and max(n for _, n in calls) == 3
    values = sum(n for name, n in calls if name == "get_value")
    assert values == 2 * (80 + 8 + 80)  # per rollout: its observations, the next one and its final observations


def test_resume_with_chunks_bins_and_micro_batches_is_bit_identical(tmp_path):
    common = dict(save_freq=2, max_staleness=1, action_chunk=3, action_head="bins", action_bins=8, micro_batch_size=7)
    straight = ppo_vla_async.main(tiny_args(tmp_path / "a", iterations=4, **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = ppo_vla_async.main(tiny_args(tmp_path / "b", iterations=4, resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 4 * 80 * 3
    a, b = (torch.load(Path(r["run_dir"]) / "checkpoints" / "last.pt", weights_only=True) for r in (straight, resumed))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_a_ppo_async_checkpoint_from_before_the_split_is_refused_in_one_line(tmp_path):
    """tests/fixtures/ppo_async.pt (written by the old ppo_async.py, tests/fixtures/make_checkpoints.py), and one of
    this trainer's relabelled as ppo_async's, are refused before anything is built, naming the old script."""
    out = ppo_vla_async.main(tiny_args(tmp_path / "a", iterations=1))
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    ckpt["script"] = "ppo_async"  # what ppo_async.py wrote before the VLA trainers split off (issue 37)
    del ckpt["trainer"]  # (checkpoints record their trainer file since issue 52)
    torch.save(ckpt, tmp_path / "old.pt")
    for path in (tmp_path / "old.pt", Path(__file__).parent / "fixtures" / "ppo_async.pt"):
        for flag in ("resume", "eval_checkpoint"):
            with pytest.raises(SystemExit) as e:
                ppo_vla_async.main(tiny_args(tmp_path / "b", iterations=2, **{flag: str(path)}))
            message = str(e.value.code)
            assert "\n" not in message and "ppo_async.py" in message and "before the VLA trainers split" in message, (
                message
            )
            assert not (tmp_path / "b").exists()


def test_the_ppo_functions_are_copies_of_ppo_vla_s():
    """One PPO in the VLA family: these functions of ppo_vla_async.py are ppo_vla.py's, statement for statement."""
    from cleanrl_embodied import ppo_vla

    for name in ("compute_gae", "normalize_advantages", "ppo_loss", "backward_piece", "clip_gradients", "sample_with"):
        mine, theirs = (ast.dump(ast.parse(inspect.getsource(getattr(m, name)))) for m in (ppo_vla_async, ppo_vla))
        assert mine == theirs, name


# No losses are logged for a rollout that was dropped or an iteration whose every step was skipped.
def scalar_steps(run_dir: str, tag: str) -> dict[int, float]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}


# (the policies are tests/toy_policies.py's, on its ToyVLA)
ASYNC = without_network(dict(EIGHT_ENVS, num_eval_envs=2, num_eval_episodes=2, target_kl=None, eval_freq=0))


def test_ppo_async_logs_no_losses_for_an_iteration_whose_every_step_was_skipped(tmp_path):
    # 4 training forwards per iteration (2 epochs x 2 minibatches): the first iteration's steps apply, every later
    # one is skipped (NaN loss)
    args = ppo_vla_async.Args(
        output_dir=str(tmp_path),
        total_timesteps=3 * 80,
        max_staleness=0,
        save_freq=0,
        max_consecutive_skips=100,
        policy="toy_policies:nan_loss_after",
        **ASYNC,
    )
    out = ppo_vla_async.main(args)
    assert scalar_steps(out["run_dir"], "charts/skipped_updates") == {80: 0.0, 160: 4.0, 240: 8.0}
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl"):
        assert list(scalar_steps(out["run_dir"], tag)) == [80], tag  # not the first iteration's again
    assert list(scalar_steps(out["run_dir"], "losses/explained_variance")) == [80, 160, 240]  # of each rollout


def test_ppo_async_logs_no_losses_for_a_dropped_rollout(tmp_path):
    """A resume with a smaller --max-staleness drops the pending rollouts that became too old. Rollouts 1 and 2 are
    both collected with the initial policy (the collector runs K = 2 ahead of a slow learner), so after the resume
    with K = 1 rollout 1 is learned from (version 1 -> 2) and rollout 2 is dropped: nothing of rollout 1's update
    may be logged again at rollout 2's step."""
    slow = dict(ASYNC, total_timesteps=4 * 80, policy="toy_policies:slow", policy_kwargs='{"update_ms": 150}')
    first = ppo_vla_async.main(ppo_vla_async.Args(output_dir=str(tmp_path / "a"), max_staleness=2, save_freq=1, **slow))
    path = Path(first["run_dir"]) / "checkpoints" / "iter_000001.pt"
    pending = torch.load(path, weights_only=True)["collector"]["pending"]
    assert [(p["index"], p["version"]) for p in pending][:2] == [(1, 0), (2, 0)]  # precondition (timing)
    resumed = ppo_vla_async.main(
        ppo_vla_async.Args(output_dir=str(tmp_path / "b"), max_staleness=1, save_freq=0, resume=str(path), **slow)
    )
    assert scalar_steps(resumed["run_dir"], "charts/dropped_rollouts") == {160: 0.0, 240: 1.0, 320: 1.0}
    for tag in ("losses/policy_loss", "losses/explained_variance"):
        assert list(scalar_steps(resumed["run_dir"], tag)) == [160, 320], tag


# The snapshots the learner publishes for the collector hold what changes, not the frozen weights.
def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_ppo_async_snapshots_hold_what_changes_not_frozen_weights(tmp_path):
    """A snapshot the learner publishes for the collector holds the trainable parameters and the buffers (here the
    bins head's bounds), measured here: exactly what the checkpoint's model holds, and never the
    frozen backbone (256 x 256 + 256 floats, 263 kB), which was copied into every one of the K + 1 snapshots kept
    before; the checkpoint records the backbone's fingerprint instead of its weights."""
    args = ppo_vla_async.Args(
        output_dir=str(tmp_path),
        total_timesteps=3 * 80,
        max_staleness=2,
        save_freq=1,
        action_head="bins",
        action_bins=8,
        policy="toy_policies:frozen_backbone",
        **ASYNC,
    )
    out = ppo_vla_async.main(args)
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "iter_000002.pt", weights_only=True)
    model = ckpt["model"]  # heads and their buffers: what can change
    assert not any(k.startswith("backbone.") for k in model) and len(ckpt["frozen"]) == 64
    backbone = (256 * 256 + 256) * 4
    assert nbytes(model) < backbone  # (so a snapshot with the backbone would be several times larger)
    assert len(ckpt["collector"]["snapshots"]) >= 2
    for _version, snapshot in ckpt["collector"]["snapshots"].values():
        assert set(snapshot) == set(model)
        assert nbytes(snapshot) == nbytes(model)
    # the collector's copy still acts with the learner's whole policy, frozen part included (toy_policies checks
    # the versions in test_ppo_vla_async); resuming this checkpoint continues the run
    resumed = ppo_vla_async.main(
        ppo_vla_async.Args(
            **{
                **vars(args),
                "output_dir": str(tmp_path / "b"),
                "resume": str(Path(out["run_dir"]) / "checkpoints" / "iter_000002.pt"),
            }
        )
    )
    assert resumed["global_step"] == 240


def test_ppo_async_collector_copies_the_frozen_part_once():
    """Unit level: a snapshot copies the trainable parameters and the buffers, not the frozen parameters the
    collector's copy got once; a frozen parameter changed in place (say, by the user) is noticed and copied from
    then on."""
    args = ppo_vla_async.Args(**{**ASYNC, "num_envs": 2, "action_head": "bins", "action_bins": 8})
    envs = make_env("PushCubeRL", num_envs=2, seed=0)
    learner = toy_policies.frozen_backbone(envs.single_observation_space, envs.single_action_space, args, width=64)
    inference = toy_policies.frozen_backbone(envs.single_observation_space, envs.single_action_space, args, width=64)
    collector = ppo_vla_async.Collector(envs, inference, args, total_rollouts=1, device=torch.device("cpu"))
    collector.publish(0, 0, learner)
    assert all(torch.equal(a, b) for a, b in zip(inference.state_dict().values(), learner.state_dict().values()))
    trainable = {k for k, p in learner.named_parameters() if p.requires_grad}
    trainable |= {k for k, _ in learner.named_buffers()}  # the bins head's bounds
    assert set(collector.snapshots[0][1]) == trainable and "action_low" in trainable
    with torch.no_grad():
        learner.backbone.bias.add_(1.0)
    collector.publish(1, 1, learner)
    assert set(collector.snapshots[1][1]) == trainable | {"backbone.bias"}
    envs.close()


def test_ppo_async_collectors_copy_shares_the_frozen_weights_and_gets_what_trains():
    """The collector's copy (`shared.inference_copy`, as main builds it) holds the learner's frozen tensors themselves
    (one backbone in memory) and its own trainable parameters and buffers. A snapshot holds only those; applied as the
    collector applies it before a rollout, they equal the learner's. A frozen parameter changed in place is the
    copy's at once (never snapshotted: the collector never writes into a shared tensor, a resumed snapshot of it
    included); one the learner replaced is no longer shared and is copied from then on."""
    args = ppo_vla_async.Args(**{**ASYNC, "num_envs": 2, "action_head": "bins", "action_bins": 8})
    envs = make_env("PushCubeRL", num_envs=2, seed=0)
    learner = toy_policies.frozen_backbone(envs.single_observation_space, envs.single_action_space, args, width=64)
    inference = shared.inference_copy(learner)
    for (name, mine), theirs in zip(learner.named_parameters(), inference.parameters()):
        assert (mine.data_ptr() == theirs.data_ptr()) == (not mine.requires_grad), name
    assert inference.backbone.weight is learner.backbone.weight and inference.action_low is not learner.action_low
    collector = ppo_vla_async.Collector(envs, inference, args, total_rollouts=1, device=torch.device("cpu"))
    collector.snapshots[-1] = (0, {"backbone.bias": torch.zeros(64)})  # as a resume could hand it
    collector.publish(0, 0, learner)
    assert "backbone.bias" not in collector.snapshots[-1][1]
    trainable = {k for k, p in learner.named_parameters() if p.requires_grad} | {k for k, _ in learner.named_buffers()}
    assert set(collector.snapshots[0][1]) == trainable
    with torch.no_grad():
        for p in [p for p in learner.parameters() if p.requires_grad]:
            p.add_(0.5)
        learner.backbone.bias.add_(1.0)  # in place: the copy's too
    collector.publish(1, 1, learner)
    assert set(collector.snapshots[1][1]) == trainable
    inference.load_state_dict(collector.snapshots[1][1], strict=False)  # what the collector does before a rollout
    for key, value in learner.state_dict().items():
        assert torch.equal(inference.state_dict()[key], value), key
    learner.backbone.weight = torch.nn.Parameter(learner.backbone.weight + 1.0, requires_grad=False)  # replaced
    collector.publish(2, 2, learner)
    assert set(collector.snapshots[2][1]) == trainable | {"backbone.weight"}
    inference.load_state_dict(collector.snapshots[2][1], strict=False)
    assert torch.equal(inference.backbone.weight, learner.backbone.weight)
    assert inference.backbone.bias is learner.backbone.bias
    envs.close()
