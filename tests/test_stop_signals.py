"""SIGTERM (what a cluster scheduler, `kill` or `docker stop` send) does what Ctrl-C does, in every trainer: the
iteration finishes, `last.pt` and `summary.json` are written, the exit status is 143 (130 for Ctrl-C), and a run
resumed from that `last.pt` ends bit-identical to a run that was never stopped.

Each trainer runs as a subprocess that gets a real SIGTERM from this process once its first iteration is saved.
Its policy sleeps a little at every rollout step (`--policy toy_policies:slow`, GRPO's `slow_actor`), so a run of a
few hundred steps lasts seconds: long enough to be stopped in the middle, short enough to run again in-process.
ppo_ddp runs under torchrun with 2 ranks, and the SIGTERM goes to torchrun, which forwards it to both ranks; this
file is also the script its second launch runs on each rank (the straight run and the resumed one, see `worker`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cleanrl_embodied import grpo, ppo_continuous, ppo_ddp, ppo_recurrent, ppo_vla_async
from cleanrl_embodied.shared.stop_signals import StopFlag
from tests.subprocesses import REPO, TESTS, signal_when, subprocess_env
from tests.trainer_args import EIGHT_ENVS, cli_flags, fit

ITERATIONS = 12
PPO = dict(
    EIGHT_ENVS,
    eval_freq=0,
    save_freq=1,
    total_timesteps=ITERATIONS * 8 * 10,
    policy="toy_policies:slow",
    policy_kwargs='{"rollout_ms": 20}',
)
GRPO = dict(PPO, group_size=4, policy="grpo_test_helpers:slow_actor")
ASYNC = fit(ppo_vla_async, PPO)  # (a VLA trainer: toy_policies' slow ToyVLA, its own sizes)
CONFIGS = {ppo_continuous: PPO, ppo_vla_async: ASYNC, grpo: GRPO, ppo_recurrent: dict(PPO, rnn_hidden_size=16)}


def child_env() -> dict[str, str]:
    """A trainer's environment here: toy_policies and grpo_test_helpers importable (tests/), and the repository."""
    return subprocess_env(TESTS, REPO, WANDB_MODE="disabled")


def sigterm_after_first_save(command: list[str], out_dir: Path, timeout: float = 300) -> tuple[int, str]:
    """Start ``command``, send it SIGTERM as soon as a run under ``out_dir`` has saved iteration 1, and return
    its exit status and output."""
    return signal_when(
        command,
        lambda: any(out_dir.glob("*/checkpoints/iter_000001.pt")),
        signal.SIGTERM,
        timeout=timeout,
        poll=0.02,
        cwd=REPO,
        env=child_env(),
    )


def last_checkpoint(out_dir: Path) -> tuple[Path, dict]:
    (run_dir,) = out_dir.iterdir()  # one run directory
    return run_dir, torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def assert_same_state(a: dict, b: dict) -> None:
    assert a["global_step"] == b["global_step"] and a["iteration"] == b["iteration"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def assert_stopped_cleanly(run_dir: Path, ckpt: dict, output: str) -> None:
    """last.pt and summary.json describe the same moment, in the middle of the run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["checkpoint"].endswith("last.pt")
    assert summary["global_step"] == ckpt["global_step"] == ckpt["iteration"] * 80 * ckpt.get("world_size", 1)
    assert 1 <= ckpt["iteration"] < ITERATIONS, ckpt["iteration"]  # stopped in the middle, not at the end
    assert output.count("stop requested (SIGTERM)") == 1, output[-3000:]


@pytest.mark.parametrize("module", list(CONFIGS), ids=lambda m: m.__name__.split(".")[-1])
def test_sigterm_saves_like_ctrl_c_and_the_run_resumes_bit_identically(tmp_path, module):
    config = CONFIGS[module]
    status, output = sigterm_after_first_save(
        [sys.executable, module.__file__, "--output-dir", str(tmp_path / "stopped"), *cli_flags(config)],
        tmp_path / "stopped",
    )
    assert status == 143, output[-3000:]
    run_dir, stopped = last_checkpoint(tmp_path / "stopped")
    assert_stopped_cleanly(run_dir, stopped, output)
    assert "Traceback" not in output, output[-3000:]

    straight = module.main(module.Args(output_dir=str(tmp_path / "straight"), **config))
    resumed = module.main(
        module.Args(output_dir=str(tmp_path / "resumed"), resume=str(run_dir / "checkpoints" / "last.pt"), **config)
    )
    # the stopped run's last.pt is the straight run's state after the same iteration ...
    straight_dir = Path(straight["run_dir"]) / "checkpoints"
    same_point = torch.load(straight_dir / f"iter_{stopped['iteration']:06d}.pt", weights_only=True)
    assert_same_state(stopped, same_point)
    # ... and training on from it ends where the straight run ends, bit for bit
    assert resumed["global_step"] == straight["global_step"] == ITERATIONS * 80
    assert_same_state(
        torch.load(straight_dir / "last.pt", weights_only=True),
        torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True),
    )


def test_stop_flag_exit_status_and_the_ranks_agreement():
    """130 after Ctrl-C, 143 after SIGTERM; a second signal is the hard stop; in DDP every rank takes the same
    decision from the summed votes, SIGTERM's status if any rank got one."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    said = []
    for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        with StopFlag(said.append) as stop:
            assert not stop.requested and stop.votes() == [0.0, 0.0]
            os.kill(os.getpid(), signum)
            assert stop.requested and stop.exit_status == status
            with pytest.raises(KeyboardInterrupt):  # a second signal: stop now
                os.kill(os.getpid(), signal.SIGINT)
        assert {s: signal.getsignal(s) for s in previous} == previous  # the handlers are given back
    assert said == [
        "stop requested (Ctrl-C): finishing this iteration, then writing last.pt and summary.json",
        "stop requested (SIGTERM): finishing this iteration, then writing last.pt and summary.json",
    ]
    with StopFlag(said.append, absorb_repeats=True) as stop:  # DDP: torchrun sends the signal again
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.votes() == [0.0, 1.0]
        assert stop.agree(torch.tensor([0.0, 0.0])) == 0  # no rank asked: go on
        assert stop.agree(torch.tensor([1.0, 0.0])) == 130  # another rank got Ctrl-C
        assert stop.agree(torch.tensor([1.0, 1.0])) == 143  # SIGTERM anywhere: the scheduler's stop
    assert len(said) == 3


# ---------------------------------------------------------------------------------------------------
# ppo_ddp under torchrun, 2 ranks
# ---------------------------------------------------------------------------------------------------
DDP = dict(PPO, total_timesteps=ITERATIONS * 2 * 80)  # 80 steps per rank and iteration


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]


def worker(out_dir: Path, stopped_last: Path) -> None:
    """On each rank of the second launch: the straight run, then (in a fresh process group) the stopped run
    resumed from its last.pt."""
    rank = int(os.environ["RANK"])
    ppo_ddp.main(ppo_ddp.Args(output_dir=str(out_dir / "straight"), **DDP))  # makes and ends torchrun's group
    (out_dir / f"left_{rank}").write_text(repr(time.time()))  # when this rank got out of its run
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2)
    ppo_ddp.main(ppo_ddp.Args(output_dir=str(out_dir / "resumed"), resume=str(stopped_last), **DDP))
    dist.barrier()  # leave together (rank 0 may still be writing; see tests/torchrun.py)
    dist.destroy_process_group()


def test_ppo_ddp_sigterm_through_torchrun_stops_both_ranks_once_and_resumes_bit_identically(tmp_path):
    status, output = sigterm_after_first_save(
        torchrun(str(REPO / "cleanrl_embodied" / "ppo_ddp.py"), "--output-dir", str(tmp_path / "stopped"))
        + cli_flags(DDP),
        tmp_path / "stopped",
    )
    # torchrun forwards the signal to both ranks, waits for them, then ends itself with its own report (status 1)
    assert output.count("closing signal SIGTERM") == 2, output[-3000:]
    assert status == 1 and "SignalException: Process" in output and "got signal: 15" in output, output[-3000:]
    assert "Unable to shutdown process" not in output, output[-3000:]  # both ranks exited in the grace period
    run_dir, stopped = last_checkpoint(tmp_path / "stopped")  # rank 0 alone wrote: one run directory
    assert_stopped_cleanly(run_dir, stopped, output)  # rank 0 alone said it, once
    assert output.count("done: global_step=") == 1, output[-3000:]
    assert stopped["world_size"] == 2 and len(stopped["other_ranks"]) == 1  # rank 1's state is in rank 0's file

    proc = subprocess.run(
        torchrun(__file__, str(tmp_path), str(run_dir / "checkpoints" / "last.pt")),
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    straight = torch.load(next((tmp_path / "straight").iterdir()) / "checkpoints" / "last.pt", weights_only=True)
    resumed = torch.load(next((tmp_path / "resumed").iterdir()) / "checkpoints" / "last.pt", weights_only=True)
    assert straight["global_step"] == ITERATIONS * 160
    # rank 1 left its process group only once rank 0 had written its last files (summary.json last): a rank that
    # tears its end down early can abort in gloo's teardown, and torchrun then kills rank 0 mid-write
    summary = next((tmp_path / "straight").iterdir()) / "summary.json"
    assert float((tmp_path / "left_1").read_text()) >= summary.stat().st_mtime
    assert_same_state(straight, resumed)
    assert torch.equal(straight["other_ranks"][0]["next_obs"], resumed["other_ranks"][0]["next_obs"])
    same_point = next((tmp_path / "straight").iterdir()) / "checkpoints" / f"iter_{stopped['iteration']:06d}.pt"
    assert_same_state(stopped, torch.load(same_point, weights_only=True))


if __name__ == "__main__":  # under torchrun: python tests/test_stop_signals.py OUT_DIR STOPPED_LAST_PT
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
