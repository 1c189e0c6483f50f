"""Tests for cleanrl_embodied.shared.run_logger: run dir, TensorBoard, summary.json, atomic_save, video, W&B."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied.shared.atomic_files import atomic_save
from cleanrl_embodied.shared.run_logger import RunLogger, versions


@dataclasses.dataclass
class Args:
    """A small stand-in for a trainer's tyro Args."""

    env_id: str = "PushCubeRL"
    seed: int = 3
    exp_name: str = "test_exp"
    learning_rate: float = 3e-4
    max_grad_norm: float = math.inf
    output_dir: Path = Path("runs")
    hidden_sizes: tuple[int, ...] = (64, 64)
    track: bool = False
    wandb_entity: str | None = None


@pytest.fixture(autouse=True)
def _wandb_offline(tmp_path, monkeypatch):
    """Nothing in these tests may reach the network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def make_logger(tmp_path, track: bool = False, **kwargs) -> RunLogger:
    kwargs.setdefault("console", False)
    args = Args(env_id="PushCubeRL", seed=3, exp_name="test_exp", output_dir=tmp_path / "runs", track=track)
    return RunLogger("ppo_continuous", args, **kwargs)


def scalars_of(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_run_dir_naming_and_subfolders(tmp_path, monkeypatch):
    with make_logger(tmp_path) as first:
        assert re.fullmatch(r"PushCubeRL__test_exp__3__\d{10}", first.run_name)
    monkeypatch.setattr(time, "time", lambda: 1700000000.5)
    with make_logger(tmp_path) as a, make_logger(tmp_path) as b:
        assert a.run_name == "PushCubeRL__test_exp__3__1700000000"
        assert b.run_name == "PushCubeRL__test_exp__3__1700000000-1"  # same second -> suffixed, never shared
        assert a.run_dir == tmp_path / "runs" / a.run_name and b.run_dir.is_dir()
        assert a.checkpoint_dir == a.run_dir / "checkpoints" and a.checkpoint_dir.is_dir()
        assert a.video_dir == a.run_dir / "videos" and not a.video_dir.exists()  # created lazily
        assert any(p.name.startswith("events.out.tfevents") for p in a.run_dir.iterdir())
        # args are stored JSON-safe: paths/tuples converted, inf kept readable
        assert a.args["output_dir"] == str(tmp_path / "runs") and a.args["hidden_sizes"] == [64, 64]
        assert a.args["max_grad_norm"] == "inf" and a.args["wandb_entity"] is None


def test_log_writes_tensorboard_scalars(tmp_path):
    logger = make_logger(tmp_path)
    for it in range(3):
        step = (it + 1) * 1000
        logger.log(
            {
                "losses/value_loss": torch.tensor(0.5 * it),  # 0-d float tensor
                "losses/approx_kl": torch.tensor([0.01 * it], dtype=torch.float64),  # 1-element tensor
                "charts/episodic_length": torch.tensor(10 + it),  # int tensor
                "charts/SPS": 1234.0 + it,  # python float
                "charts/learning_rate": np.float32(3e-4),  # numpy scalar
            },
            step,
        )
    logger.close()
    logger.close()  # idempotent

    acc = scalars_of(logger.run_dir)
    vl = acc.Scalars("losses/value_loss")
    assert [e.step for e in vl] == [1000, 2000, 3000]
    assert [e.value for e in vl] == pytest.approx([0.0, 0.5, 1.0])
    assert [e.value for e in acc.Scalars("losses/approx_kl")] == pytest.approx([0.0, 0.01, 0.02])
    assert [e.value for e in acc.Scalars("charts/episodic_length")] == [10, 11, 12]
    assert [e.value for e in acc.Scalars("charts/SPS")] == [1234.0, 1235.0, 1236.0]
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]
    # latest values are plain floats, used as summary["train"]
    assert logger.latest["losses/value_loss"] == 1.0 and isinstance(logger.latest["losses/value_loss"], float)
    with pytest.raises(RuntimeError, match="closed"):
        logger.log({"x": 1.0}, 0)


def test_log_uses_one_host_transfer_and_rejects_non_scalars(tmp_path, monkeypatch):
    logger = make_logger(tmp_path)
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(self.shape) or original(self))
    logger.log({f"losses/l{i}": torch.tensor(float(i)) for i in range(5)}, 1)
    assert calls == [torch.Size([5])]
    with pytest.raises(ValueError, match="losses/bad"):
        logger.log({"losses/bad": torch.zeros(3)}, 2)
    logger.close()


def test_write_summary_schema(tmp_path):
    logger = make_logger(tmp_path)
    logger.log({"losses/value_loss": torch.tensor(float("nan")), "charts/SPS": 100.0}, 10)
    ckpt = logger.checkpoint_dir / "last.pt"
    path = logger.write_summary(
        global_step=4096,
        wall_time_s=12.5,
        sps=float("inf"),
        eval={"success_rate": torch.tensor(0.75), "episodic_return": np.float64(1.5), "episodic_length": 50.0},
        checkpoint=ckpt,
        interrupted=True,
    )
    logger.close()
    assert path == logger.run_dir / "summary.json"
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    s = json.loads(text)
    assert list(s)[:11] == [
        "script", "env_id", "seed", "global_step", "wall_time_s", "sps",
        "eval", "train", "checkpoint", "args", "versions",
    ]  # fmt: skip
    assert s["script"] == "ppo_continuous" and s["env_id"] == "PushCubeRL" and s["seed"] == 3
    assert s["global_step"] == 4096 and isinstance(s["global_step"], int)
    assert s["wall_time_s"] == 12.5 and s["sps"] is None  # inf -> null
    assert s["eval"] == {"success_rate": 0.75, "episodic_return": 1.5, "episodic_length": 50.0, "global_step": None}
    assert s["train"] == {"losses/value_loss": None, "charts/SPS": 100.0}  # NaN -> null
    assert s["checkpoint"] == str(ckpt)
    assert s["args"]["learning_rate"] == 3e-4 and s["args"]["env_id"] == "PushCubeRL"
    assert s["interrupted"] is True
    for key in ("python", "torch", "gymnasium", "tensordict", "numpy", "git_sha"):
        assert key in s["versions"]
    assert s["versions"]["torch"] == torch.__version__
    assert not [p for p in logger.run_dir.iterdir() if p.name.endswith(".tmp")]

    # no evaluation yet -> eval entries are all null; extra keys may not clobber the schema
    with make_logger(tmp_path) as other:
        s2 = json.loads(other.write_summary(0, 0.0, 0.0).read_text())
        assert s2["eval"] == dict.fromkeys(["success_rate", "episodic_return", "episodic_length", "global_step"])
        assert s2["train"] == {} and s2["checkpoint"] is None
        with pytest.raises(ValueError, match="versions"):
            other.write_summary(0, 0.0, 0.0, versions={})


def test_versions_never_raises():
    v = versions()
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    assert v["numpy"] == np.__version__
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    except OSError:
        head = ""
    if head:
        assert v["git_sha"] == head and isinstance(v["git_dirty"], bool)
    else:
        assert v["git_sha"] is None
    v["python"] = "changed"  # callers get a copy
    assert versions()["python"] != "changed"


@pytest.mark.parametrize(
    "status, dirty",
    [
        ("", False),
        ("?? docs/results/new-report/report.md", False),  # an output being written is not a change of the code
        ("?? cleanrl_embodied/my_ppo.py", True),  # a new trainer is
        (" M README.md", True),
        ("?? docs/x.md\n M cleanrl_embodied/ppo_continuous.py", True),
        (" M docs/results/pixels-cpu/report.md\n D docs/results/old/runs.json", False),  # a report measured again
        (" M docs/results/x/report.md\n M docs/benchmarks.md", True),  # the pages are tracked text like the rest
        ('R  docs/results/a.json -> "docs/results/b c.json"', False),
        ("R  docs/results/a.py -> benchmarks/a.py", True),
    ],
)
def test_git_dirty_counts_changed_files_and_untracked_code(monkeypatch, status, dirty):
    from cleanrl_embodied.shared import run_logger

    answers = {"rev-parse": "0" * 40, "status": status}
    monkeypatch.setattr(run_logger, "_git", lambda *args: answers[args[0]])
    run_logger._versions_cached.cache_clear()
    try:
        assert run_logger.versions()["git_dirty"] is dirty
    finally:
        run_logger._versions_cached.cache_clear()


def test_atomic_save_round_trip(tmp_path):
    state = {"model": {"w": torch.randn(3, 4)}, "global_step": 123, "obs_rms": [torch.zeros(2)]}
    path = atomic_save(state, tmp_path / "ckpt" / "last.pt")
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["global_step"] == 123
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_atomic_save_crash_keeps_old_file(tmp_path, monkeypatch, error):
    path = tmp_path / "last.pt"
    atomic_save({"version": torch.tensor(1)}, path)
    before = path.read_bytes()

    def crashing_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04partial-checkpoint")  # some bytes reach the file, then the "crash"
        raise error

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(type(error)):
        atomic_save({"version": torch.tensor(2)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert torch.load(path, weights_only=True)["version"].item() == 1
    assert os.listdir(tmp_path) == ["last.pt"]  # no temp file left behind


def test_write_video(tmp_path):
    logger = make_logger(tmp_path)
    t = torch.arange(12, dtype=torch.uint8).view(12, 1, 1, 1) * 20
    frames = (t + torch.zeros(12, 64, 48, 3, dtype=torch.uint8)).contiguous()  # torch input, 64x48
    path = logger.write_video(frames, "eval/step_100", step=100, fps=10)
    odd = np.random.default_rng(0).integers(0, 255, (5, 33, 31, 3), dtype=np.uint8)  # odd sizes get padded
    path_odd = logger.write_video(list(odd), "odd", step=200)
    with pytest.raises(ValueError, match="uint8"):
        logger.write_video(np.zeros((4, 8, 8, 3), np.float32), "bad", step=0)
    logger.close()

    import imageio.v2 as imageio

    assert path == logger.video_dir / "eval_step_100.mp4" and path.stat().st_size > 0
    with imageio.get_reader(path, format="FFMPEG") as reader:
        read = [f for f in reader]
    assert len(read) == 12 and read[0].shape == (64, 48, 3)
    means = [f.mean() for f in read]
    assert means == sorted(means) and abs(means[-1] - 220) < 8  # brightness ramp survives encoding
    with imageio.get_reader(path_odd, format="FFMPEG") as reader:
        assert sum(1 for _ in reader) == 5
    tags = scalars_of(logger.run_dir).Tags()
    assert "videos/eval/step_100" in tags["images"] + tags["tensors"]


def test_progress_and_write(tmp_path, capsys):
    logger = make_logger(tmp_path, console=True, total_iterations=3)
    for i in range(3):
        logger.progress((i + 1) * 1_200_000, SPS=12345, ret=0.5312, succ=None, kl=torch.tensor(0.00123))
    logger.write("checkpoint saved")
    assert logger._bar.n == 3
    logger.close()
    out = capsys.readouterr()
    assert "checkpoint saved" in out.out
    assert "SPS=12345 ret=0.531 kl=0.00123 step=3.6M" in out.err and "succ" not in out.err

    quiet = make_logger(tmp_path, console=False)
    quiet.progress(1, SPS=1.0)
    quiet.write("hidden")
    quiet.close()
    out = capsys.readouterr()
    assert "hidden" not in out.out and "SPS" not in out.err


def test_track_wandb_offline(tmp_path, monkeypatch):
    """track=True with WANDB_MODE=offline: an offline W&B run that syncs the TB scalars; no network."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # keep wandb's stdout wrapping away from pytest's capture
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with make_logger(tmp_path, track=True) as logger:
        assert wandb.run is not None and wandb.run.offline
        assert wandb.run.name == logger.run_name and wandb.run.config["learning_rate"] == 3e-4
        logger.log({"charts/SPS": torch.tensor(5.0)}, 1)
        logger.write_video(np.zeros((3, 16, 16, 3), np.uint8), "eval", step=1)
        logger.write_summary(1, 0.1, 5.0)
    assert wandb.run is None and not wandb.patched["tensorboard"]  # finished and unpatched
    wandb.teardown()  # stop the W&B service so that it has written everything out

    runs = tmp_path / "runs"
    assert not (logger.run_dir / "wandb").exists()  # W&B files live beside the run dirs, not inside one
    offline_runs = list((runs / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 1
    records = next(offline_runs[0].glob("*.wandb")).read_bytes()
    assert b"charts/SPS" in records  # the TensorBoard scalar was synced into the W&B run
    assert list(offline_runs[0].glob("files/media/videos/**/*.mp4"))


def _console_lines(text: str) -> list[str]:
    """What a log viewer shows: carriage returns and newlines both end a line; blank lines dropped."""
    return [line.strip() for line in re.split(r"[\r\n]", text) if line.strip()]


@pytest.mark.parametrize("iterations_run", [3, 2])  # 2 of 3: a Ctrl-C, or a resumed run whose bar never fills
def test_console_ends_with_the_bars_last_line_once_then_done(tmp_path, monkeypatch, iterations_run):
    console = io.StringIO()  # stdout and stderr in one stream, as in `python ppo_continuous.py > log 2>&1`
    monkeypatch.setattr(sys, "stdout", console)
    monkeypatch.setattr(sys, "stderr", console)
    monkeypatch.delenv("UV", raising=False)
    monkeypatch.chdir(tmp_path)
    logger = RunLogger("ppo_continuous", Args(output_dir="runs"), total_iterations=3)
    logger.write("device=cpu envs=8")
    for i in range(iterations_run):
        logger.progress((i + 1) * 80, SPS=100.0)
        if i == 0:
            logger.write("warning: a mid-run message")
    logger.write_summary(global_step=iterations_run * 80, wall_time_s=1.0, sps=80.0)
    logger.write(f"done: global_step={iterations_run * 80}")
    logger.close()
    logger.close()

    lines = _console_lines(console.getvalue())
    final = f"{iterations_run}/3"
    assert lines[0] == "device=cpu envs=8"
    assert lines[1] == "curves: tensorboard --logdir runs  (then open http://localhost:6006)"
    assert "warning: a mid-run message" in lines
    assert lines[-1] == f"done: global_step={iterations_run * 80}"
    assert lines[-2].startswith("PushCubeRL:") and final in lines[-2] and f"step={iterations_run * 80}" in lines[-2]
    assert sum(final in line for line in lines) == 1  # the bar's last state, once


def test_module_env_id_run_dir_and_bar_use_the_id_without_its_module(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UV", "/usr/bin/uv")  # started by `uv run`: the hint says so
    args = Args(env_id="tests.envs_for_tests:PointReach-v0", output_dir=tmp_path / "runs")
    logger = RunLogger("ppo_continuous", args, total_iterations=1)
    assert re.fullmatch(r"PointReach-v0__test_exp__3__\d{10}", logger.run_name)
    logger.progress(10, SPS=1.0)
    logger.write_summary(global_step=10, wall_time_s=1.0, sps=10.0)
    logger.close()
    summary = json.loads((logger.run_dir / "summary.json").read_text())
    assert summary["env_id"] == "tests.envs_for_tests:PointReach-v0"  # the full id, as --env-id takes it
    out = capsys.readouterr()
    assert f"uv run tensorboard --logdir {tmp_path / 'runs'}" in out.out
    assert "PointReach-v0: 100%" in out.err and "tests.envs_for_tests" not in out.err
