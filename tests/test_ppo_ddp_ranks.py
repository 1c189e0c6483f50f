"""ppo_ddp.py with two real ranks, each a process of its own (forked from this one, so no import costs seconds):
a rank that dies or hangs stops the other with one error line within --dist-timeout-s; the ranks take the same
decisions (target-KL stop, skipped non-finite steps, Ctrl-C on one rank); and two ranks on half the envs each
make the same update as one rank on all of them (gradients averaged, not summed).

The ranks join through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) as under torchrun. Misbehaviour comes
from `toy_policies:on_rank` on one rank only; everything a rank says goes to its log file."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
import toy_policies
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied import ppo_ddp as ddp
from tests.trainer_args import FOUR_ENVS

TINY = dict(FOUR_ENVS, num_steps=6, update_epochs=2, hidden_sizes=(16,), eval_freq=0, save_freq=0, backend="gloo")
ITERATION = 2 * 4 * 6  # env steps of one iteration of both ranks


def _rank(rank: int, world: int, port: int, out_dir: Path, args: dict) -> None:
    """One rank, in a forked child: run ppo_ddp.main, then write what happened to out_dir/rank<r>.json."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    log = open(out_dir / f"rank{rank}.log", "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    torch.set_num_threads(1)
    toy_policies.TRAIN_CALLS[0] = 0
    result: dict = {"exit": 0, "message": None}
    try:
        out = ddp.main(ddp.Args(output_dir=str(out_dir / "runs"), **args))
        if out.get("model") is not None:
            torch.save(out["model"], out_dir / f"model{rank}.pt")
    except SystemExit as e:  # what the interpreter does with it: a message to stderr and status 1, or the status
        result["exit"] = 1 if isinstance(e.code, str) else (e.code or 0)
        result["message"] = e.code if isinstance(e.code, str) else None
        if result["message"]:
            print(result["message"], file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - anything else is a test failure, reported through the file
        result["exit"], result["message"] = 99, f"{type(e).__name__}: {e}"
    result["train_calls"] = toy_policies.TRAIN_CALLS[0]
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


def launch(
    out_dir: Path, args: dict, world: int = 2, wait_s: float = 120.0, after_rank0_s: float | None = None
) -> list:
    """Start `world` ranks; return each one's result (None for a rank that wrote none: it died, or it was still
    running after `wait_s` seconds, or `after_rank0_s` after rank 0 ended, and was killed), with the time it
    ended (``ended``, as time.time())."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("fork")
    start = time.time()
    procs = [context.Process(target=_rank, args=(r, world, port, out_dir, args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    ended = [None] * world
    while time.time() - start < wait_s and any(e is None for e in ended):
        if after_rank0_s is not None and ended[0] is not None and time.time() - ended[0] > after_rank0_s:
            break
        for r, p in enumerate(procs):
            if ended[r] is None and not p.is_alive():
                ended[r] = time.time()
        time.sleep(0.05)
    results = []
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()  # a rank this test started and left hanging
        p.join()
        path = out_dir / f"rank{r}.json"
        results.append(dict(json.loads(path.read_text()), ended=ended[r]) if path.exists() else None)
    return results


def log(out_dir: Path, rank: int) -> str:
    return (out_dir / f"rank{rank}.log").read_text()


def fault_on_rank_1(fault: str, at_call: int | None = None, iterations: int = 3, dist_timeout_s: float = 20, **kw):
    """TINY (``kw`` on top) for ``iterations`` iterations in which rank 1 alone has ``fault`` (toy_policies:on_rank;
    from its ``at_call``-th training forward, for the faults that take one)."""
    fault_kwargs = {"rank": 1, "fault": fault, **({} if at_call is None else {"at_call": at_call})}
    return dict(TINY, total_timesteps=iterations * ITERATION, dist_timeout_s=dist_timeout_s,
                policy="toy_policies:on_rank", policy_kwargs=json.dumps(fault_kwargs), **kw)  # fmt: skip


@pytest.mark.parametrize("fault", ["exit", "hang"])
def test_a_dead_or_hung_rank_stops_the_other_with_one_line_within_the_timeout(tmp_path, fault):
    timeout = 5
    args = fault_on_rank_1(fault, at_call=3, iterations=20, dist_timeout_s=timeout)
    rank0, rank1 = launch(tmp_path, args, wait_s=60, after_rank0_s=1)
    assert rank0 is not None, log(tmp_path, 0)[-2000:]
    message = rank0["message"]
    assert rank0["exit"] == 1 and message.startswith("error: rank 0: lost another rank (") and "\n" not in message
    assert f"larger --dist-timeout-s (now {timeout})" in message
    assert "Traceback" not in log(tmp_path, 0)
    if fault == "hang":
        assert rank1 is None  # still asleep: the test killed it
        hung_at = float(log(tmp_path, 1).split("hanging from ")[1].split()[0])
        assert rank0["ended"] - hung_at < timeout + 5  # it gave up within the timeout (and a little to exit)


def test_ranks_agree_to_stop_the_epochs_when_one_rank_alone_sees_a_large_kl(tmp_path):
    """Rank 1's training forwards see action means shifted by 3 (an approximate KL of several nats there), rank
    0's do not: the KL averaged over ranks exceeds --target-kl 0.5, so both stop after the first epoch of every
    update (rank 0 alone would go on; a rank that did would leave the other waiting in a collective)."""
    args = fault_on_rank_1("kl", update_epochs=4, target_kl=0.5)
    results = launch(tmp_path, args)
    assert all(r is not None and r["exit"] == 0 for r in results), [log(tmp_path, r)[-1500:] for r in range(2)]
    assert [r["train_calls"] for r in results] == [3 * TINY["num_minibatches"]] * 2


def test_ranks_skip_the_same_non_finite_step(tmp_path):
    """Rank 1's 2nd training forward gives a NaN loss: both ranks skip that optimizer step (one skip, logged by
    rank 0), go on together and end with the same weights (checked by ppo_ddp itself at the end)."""
    args = fault_on_rank_1("nan", at_call=2, target_kl=None)
    results = launch(tmp_path, args)
    assert all(r is not None and r["exit"] == 0 for r in results), [log(tmp_path, r)[-1500:] for r in range(2)]
    per_run = 3 * TINY["update_epochs"] * TINY["num_minibatches"]
    assert [r["train_calls"] for r in results] == [per_run] * 2
    run_dir = next((tmp_path / "runs").iterdir())
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.value for e in acc.Scalars("charts/skipped_updates")] == [1.0, 1.0, 1.0]
    m0, m1 = (torch.load(tmp_path / f"model{r}.pt", weights_only=True) for r in range(2))
    assert all(torch.equal(m0[k], m1[k]) and torch.isfinite(m0[k]).all() for k in m0)


def test_ctrl_c_on_one_rank_stops_both_after_the_same_iteration(tmp_path):
    """Ctrl-C reaches rank 1 alone, in its 3rd training forward (iteration 1 of 3): both ranks finish iteration
    1, rank 0 writes last.pt of iteration 1 and summary.json, and both exit with status 130."""
    args = fault_on_rank_1("sigint", at_call=3, target_kl=None)
    results = launch(tmp_path, args)
    assert all(r is not None for r in results), [log(tmp_path, r)[-1500:] for r in range(2)]
    assert [r["exit"] for r in results] == [130, 130]
    per_iteration = TINY["update_epochs"] * TINY["num_minibatches"]
    assert [r["train_calls"] for r in results] == [per_iteration] * 2
    run_dir = next((tmp_path / "runs").iterdir())
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 1 and ckpt["global_step"] == ITERATION
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == ITERATION


def test_two_ranks_on_half_the_envs_update_as_one_rank_on_all(tmp_path):
    """Every env runs the same episodes (a fixed target, a policy that always acts 0.5), so two ranks with 4 envs
    each hold, together, the batch one rank with 8 envs holds, and averaged gradients give the same weights.
    The value loss is scaled down (--vf-coef 1e-5) so that Adam's eps makes an update depend on the gradient's
    size: summed gradients (twice as large) give other weights, as a one-rank run with twice the coefficient shows."""
    common = dict(
        TINY,
        env_id="tests.envs_for_tests:PointReach-v0",
        env_kwargs='{"fixed_target": [0.3, -0.2], "success_radius": 0, "max_episode_steps": 5}',
        eval_env_kwargs='{"max_episode_steps": 5}',
        policy="toy_policies:still",
        policy_kwargs='{"action": 0.5}',
        num_minibatches=1,
        norm_adv=False,
        target_kl=None,
        max_grad_norm=1e6,
        total_timesteps=3 * ITERATION,
    )
    results = launch(tmp_path / "two", dict(common, vf_coef=1e-5, dist_timeout_s=20))
    assert all(r is not None and r["exit"] == 0 for r in results), [log(tmp_path / "two", r)[-1500:] for r in range(2)]
    two = torch.load(tmp_path / "two" / "model0.pt", weights_only=True)
    one, doubled = (
        ddp.main(ddp.Args(output_dir=str(tmp_path / f"one{c}"), **dict(common, num_envs=8, vf_coef=c)))["model"]
        for c in (1e-5, 2e-5)
    )
    critic = [k for k in one if k.startswith("critic")]
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-6)
    assert max((doubled[k] - one[k]).abs().max().item() for k in critic) > 1e-4  # a doubled gradient would show
