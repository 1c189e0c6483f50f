"""Run directory, TensorBoard, Weights & Biases, console progress bar, videos and summary.json.

A trainer creates one :class:`RunLogger` at start-up and calls

* ``log({...}, step)`` with CleanRL-named scalars (tensors are fetched with a single host transfer),
* ``progress(global_step, SPS=..., ret=...)`` once per iteration for the console bar (the first call also
  prints the ``tensorboard --logdir ...`` command that shows the run's curves),
* ``write(message)`` for console lines (``write("done: ...")``, the run's last line, ends the bar first),
* ``write_video(frames, name, step)`` for evaluation videos,
* ``write_summary(...)`` at the end (also on Ctrl-C), and ``close()``.

``versions`` records the library versions and the git commit that produced a run (summary.json's ``versions``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm.auto import tqdm

from cleanrl_embodied.shared.atomic_files import atomic_write

__all__ = ["RunLogger", "versions"]

EVAL_KEYS = ("success_rate", "episodic_return", "episodic_length", "global_step")
"""Keys of the ``"eval"`` entry of summary.json, in order (docs/runs.md)."""


# ---------------------------------------------------------------------------------------------
# Versions
# ---------------------------------------------------------------------------------------------
def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def _git(*args: str) -> str | None:
    """Output of ``git <args>`` run in this package's directory, or None on any failure."""
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip()
    except Exception:
        return None


def _code_changed(status: str) -> bool:
    """Whether `git status --porcelain` lines say the code differs from its commit: a changed tracked file, or an
    untracked Python file (a new trainer or policy). Not untracked outputs, and not the measured records under
    docs/results/ (a benchmark rewriting the report it measures), which no run reads."""
    for line in filter(None, status.splitlines()):
        path = line[3:].split(" -> ")[-1].strip('"')
        if path.startswith("docs/results/"):
            continue
        if not line.startswith("??") or path.endswith(".py"):
            return True
    return False


@functools.lru_cache(maxsize=1)
def _versions_cached() -> tuple[tuple[str, Any], ...]:
    sha = _git("rev-parse", "HEAD")
    dirty = None
    if sha:
        status = _git("status", "--porcelain", "--untracked-files=all")
        dirty = None if status is None else _code_changed(status)
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": _package_version("gymnasium"),
        "tensordict": _package_version("tensordict"),
        "numpy": np.__version__,
        "git_sha": sha or None,
        "git_dirty": dirty,
    }
    return tuple(info.items())


def versions() -> dict[str, Any]:
    """Versions of python, torch, gymnasium, tensordict, numpy, plus the git commit of this code.

    ``git_sha`` is ``git rev-parse HEAD`` of the repository holding this package (None when the
    package is not in a git checkout or git is missing); ``git_dirty`` says whether the code differs
    from that commit: changed files, or untracked Python files that .gitignore does not name (None
    when unknown; untracked outputs, such as a report being written, and the records under docs/results/ do
    not count). The trainer
    file's own state is in summary.json's ``trainer`` (shared.trainer_file). Never raises; computed
    once per process.
    """
    try:
        return dict(_versions_cached())
    except Exception:  # pragma: no cover - defensive: a summary must never fail because of this
        return {"python": platform.python_version(), "torch": torch.__version__, "git_sha": None}


# ---------------------------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------------------------
def _jsonable(x: Any, nonfinite: Callable[[float], Any] = lambda v: None) -> Any:
    """Turn ``x`` into plain JSON data: tensors/numpy to Python numbers or lists, paths and unknown
    objects to str, and non-finite floats to ``nonfinite(v)`` (None by default)."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else nonfinite(x)
    if isinstance(x, (np.generic, np.ndarray, torch.Tensor)):
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
        value = x.item() if x.ndim == 0 else x.tolist()
        return _jsonable(value, nonfinite)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x), nonfinite)
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v, nonfinite) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v, nonfinite) for v in x]
    return str(x)


def _args_dict(args: Any) -> dict[str, Any]:
    """The Args dataclass (or dict / argparse Namespace / None) as a JSON-safe dict.

    Values JSON can't hold become str (``inf`` stays readable as ``"inf"``)."""
    if args is None:
        raw: Mapping = {}
    elif dataclasses.is_dataclass(args) and not isinstance(args, type):
        raw = dataclasses.asdict(args)
    elif isinstance(args, Mapping):
        raw = args
    else:
        raw = vars(args)
    return _jsonable(dict(raw), nonfinite=str)


def _path_env_id(env_id: str) -> str:
    """The env id as it appears in run-directory names and on the progress bar: ``module:EnvId`` -> ``EnvId``
    (the module only says where the id is registered; summary.json and checkpoints keep the full id, and a ':'
    in a path is illegal on Windows and is TensorBoard's ``--logdir_spec`` separator)."""
    return env_id.rpartition(":")[2] or env_id


def _human(n: float) -> str:
    """Compact count: 950, 12.3k, 1.2M, 3.4B."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


def _fmt(value: Any) -> str:
    """Short console form of one progress field: ints as they are, floats with ~3 significant digits."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return str(value)
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# RunLogger
# ---------------------------------------------------------------------------------------------
class RunLogger:
    """Everything a trainer writes about a run: run directory, TensorBoard, W&B, console, videos.

    Creates ``{output_dir}/{env_id}__{exp_name}__{seed}__{unix_time}/`` (with ``-1``, ``-2``, ...
    appended if that name is taken) holding the TensorBoard event files, ``checkpoints/``,
    ``videos/`` (created on the first video) and ``summary.json``. With ``track=True`` the W&B
    run syncs the TensorBoard scalars; W&B keeps its local files in ``{output_dir}/wandb/``.

    Args:
        trainer: the trainer file's record (``shared.describe_trainer(__file__)``: its ``script`` name goes into
            summary.json's ``script``, the whole record into its ``trainer``), or just a name.
        args: the tyro ``Args`` dataclass (or a dict); stored as a JSON-safe dict (``self.args``). Its
            fields env_id, seed, exp_name, output_dir (default "runs"), track (default False),
            wandb_project_name and wandb_entity name and place the run.
        total_iterations: length of the console progress bar (None: no total).
        console: show the progress bar and ``write()`` messages; False keeps the console quiet.
    """

    def __init__(self, trainer: dict | str, args: Any, total_iterations: int | None = None, console: bool = True):
        self.args = _args_dict(args)
        self.trainer = trainer if isinstance(trainer, dict) else None
        script = trainer["script"] if isinstance(trainer, dict) else trainer
        env_id, seed, exp_name = self.args["env_id"], self.args["seed"], self.args["exp_name"]
        output_dir = self.args.get("output_dir") or "runs"
        track = bool(self.args.get("track", False))
        self.script = script
        self.env_id = env_id
        self.seed = seed
        self.exp_name = exp_name
        self.track = track
        self.console = console
        self.total_iterations = total_iterations

        # Run directory: mkdir (no exist_ok) claims the name even if two runs start at the same second.
        base = f"{_path_env_id(env_id)}__{exp_name}__{seed}__{int(time.time())}".replace(os.sep, "_")
        root = Path(output_dir)
        root.mkdir(parents=True, exist_ok=True)
        suffix = 0
        while True:
            name = base if suffix == 0 else f"{base}-{suffix}"
            try:
                (root / name).mkdir()
                break
            except FileExistsError:
                suffix += 1
        self.run_name = name
        self.run_dir = root / name
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.checkpoint_dir.mkdir()
        self.video_dir = self.run_dir / "videos"  # created by the first write_video

        self._wandb = None
        if track:
            import wandb  # imported only when tracking: it is slow to import

            # Tell W&B where the event files live. Without root_logdir it guesses the root from
            # the working directory: finish() then stalls ~10 s and runs whose output_dir lies
            # outside the working directory are not synced at all.
            wandb.tensorboard.unpatch()
            wandb.tensorboard.patch(root_logdir=str(self.run_dir))
            wandb.init(
                project=self.args.get("wandb_project_name") or "cleanrl_embodied",
                entity=self.args.get("wandb_entity"),
                sync_tensorboard=True,  # must run before SummaryWriter is created
                config=self.args,
                name=self.run_name,
                # W&B's own folder goes beside the run dir ({output_dir}/wandb/): inside it, the
                # TensorBoard sync would pick up W&B's copies of the event files in a loop.
                dir=str(root),
                save_code=True,
            )
            self._wandb = wandb

        self.writer = SummaryWriter(str(self.run_dir))
        table = "\n".join(f"|{key}|{value}|" for key, value in self.args.items())
        self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

        self.latest: dict[str, float] = {}  # last value logged per scalar name -> summary["train"]
        self._bar: tqdm | None = None
        self._closed = False
        self.started = time.time()
        self.global_step, self.last_eval = 0, None  # what summary.json says if the run ends in an error

    # -- scalars --------------------------------------------------------------------------------
    def log(self, scalars: Mapping[str, float | int | torch.Tensor], step: int) -> None:
        """Write scalars to TensorBoard (and through it W&B) at ``step`` (the global env step).

        Tensor values must hold one element; all of them are fetched with one host transfer per
        device (``torch.stack(...).tolist()``), so call this once per iteration, not per value.
        """
        self._check_open()
        tensor_keys: dict[torch.device, list[str]] = {}
        for key, value in scalars.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"log(): '{key}' must be a scalar, got a tensor of shape {tuple(value.shape)}")
                tensor_keys.setdefault(value.device, []).append(key)
        fetched: dict[str, float] = {}
        for keys in tensor_keys.values():
            stacked = torch.stack([scalars[k].detach().reshape(()).to(torch.float32) for k in keys])
            fetched.update(zip(keys, stacked.tolist()))
        for key, value in scalars.items():
            value = fetched[key] if key in fetched else float(value)
            self.writer.add_scalar(key, value, step)
            self.latest[key] = value
        self.global_step = max(self.global_step, step)

    # -- console --------------------------------------------------------------------------------
    def log_iteration(self, global_step: int, sps: float, scalars: Mapping[str, float | int | torch.Tensor]) -> None:
        """An iteration's scalars with charts/SPS (one host sync), and the progress bar's line."""
        self.log({**scalars, "charts/SPS": sps}, global_step)
        ret, succ = self.latest.get("charts/episodic_return"), self.latest.get("charts/success_rate")
        self.progress(global_step, SPS=sps, ret=ret, succ=succ)

    def progress(self, global_step: int, **fields: Any) -> None:
        """Advance the console bar by one iteration and show ``fields`` plus ``step=`` compactly.

        Example: ``progress(global_step, SPS=sps, ret=mean_return, succ=None)`` shows
        ``SPS=12345 ret=0.53 step=1.2M``; None fields are left out. Pass Python numbers: tensors
        work but cost a device sync each.
        """
        if self._bar is None:
            self.write(f"curves: {self._tensorboard_command()}  (then open http://localhost:6006)")
            tty = sys.stderr.isatty()
            self._bar = tqdm(
                total=self.total_iterations,
                desc=_path_env_id(self.env_id),
                unit="it",
                file=sys.stderr,
                disable=not self.console,
                dynamic_ncols=tty,
                ncols=None if tty else 120,
                # Redraws are throttled; much more in log files where every redraw stays.
                mininterval=0.5 if tty else 30.0,
                smoothing=0.1,
            )
        elif self._bar.disable:
            return  # console off, or the bar was ended (progress after the run's last line): nothing to draw
        parts = [f"{k}={_fmt(v)}" for k, v in fields.items() if v is not None]
        parts.append(f"step={_human(global_step)}")
        self._bar.set_postfix_str(" ".join(parts), refresh=False)
        self._bar.update(1)

    def _tensorboard_command(self) -> str:
        """The command that shows this run's curves: ``tensorboard --logdir <output_dir>``, through ``uv run``
        when this process was started by it (then tensorboard lives in the project's environment)."""
        logdir = self.run_dir.parent
        try:
            logdir = logdir.relative_to(Path.cwd()) if logdir.is_absolute() else logdir
        except ValueError:
            pass
        prefix = "uv run " if os.environ.get("UV") else ""
        return f"{prefix}tensorboard --logdir {shlex.quote(str(logdir))}"

    def _end_bar(self) -> None:
        """Print the bar's final state once, on its own line, and stop drawing it (idempotent: tqdm's close()
        redraws the bar one last time, ends the line and sets ``disable``; a second close() does nothing)."""
        if self._bar is not None:
            self._bar.close()

    def write(self, message: str) -> None:
        """Print a line on the console without breaking the progress bar (silent if console=False).

        Once the bar is full (every iteration counted), or for the run's last line (a message starting with
        ``done:``, e.g. after a Ctrl-C or a resumed run whose bar never fills), the bar is ended first: its
        final line is printed once, then the message below it, and :meth:`close` prints no bar again.
        Messages go to stdout (flushed, so a log of stdout and stderr together keeps this order), the bar to
        stderr.
        """
        if not self.console:
            return
        message = str(message)
        bar = self._bar
        if bar is not None and (message.startswith("done:") or (bar.total is not None and bar.n >= bar.total)):
            self._end_bar()
        sys.stderr.flush()
        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()

    # -- videos ---------------------------------------------------------------------------------
    def write_video(self, frames: Any, name: str, step: int, fps: int = 20) -> Path:
        """Write ``frames`` (uint8 [T, H, W, 3], numpy or torch, or a list of [H, W, 3]) to
        ``videos/{name}.mp4`` (H.264) and log it.

        W&B gets the mp4 when tracking. TensorBoard gets the video itself if ``moviepy`` is
        installed, otherwise an image of the first, middle and last frames side by side.
        Odd heights/widths are padded by one edge pixel (H.264 needs even sizes).
        Returns the mp4 path.
        """
        self._check_open()
        import imageio.v2 as imageio  # imported lazily: only runs with videos need it

        frames = self._frames_to_numpy(frames)
        t, h, w, _ = frames.shape
        if h % 2 or w % 2:
            frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
            h, w = h + h % 2, w + w % 2
        self.video_dir.mkdir(exist_ok=True)
        path = self.video_dir / f"{name.replace('/', '_').replace(os.sep, '_')}.mp4"
        block = 16 if h % 16 == 0 and w % 16 == 0 else 2  # sizes divide it -> no resize warning
        with imageio.get_writer(
            path,
            format="FFMPEG",
            mode="I",
            fps=fps,
            codec="libx264",
            pixelformat="yuv420p",
            macro_block_size=block,
            ffmpeg_log_level="error",
        ) as writer:
            for frame in frames:
                writer.append_data(frame)

        tag = f"videos/{name}"
        if importlib.util.find_spec("moviepy") is not None:
            video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).unsqueeze(0)
            self.writer.add_video(tag, video, step, fps=fps)
        else:
            grid = np.concatenate([frames[0], frames[t // 2], frames[-1]], axis=1)
            self.writer.add_image(tag, grid, step, dataformats="HWC")
        if self._wandb is not None:
            self._wandb.log({tag: self._wandb.Video(str(path), format="mp4"), "global_step": step})
        return path

    @staticmethod
    def _frames_to_numpy(frames: Any) -> np.ndarray:
        if isinstance(frames, (list, tuple)):
            frames = [f.detach().cpu().numpy() if isinstance(f, torch.Tensor) else np.asarray(f) for f in frames]
            frames = np.stack(frames) if frames else np.zeros((0,), np.uint8)
        elif isinstance(frames, torch.Tensor):
            frames = frames.detach().cpu().numpy()
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
            raise ValueError(
                f"write_video: frames must be uint8 [T, H, W, 3] with T >= 1, "
                f"got dtype {frames.dtype} and shape {tuple(frames.shape)}"
            )
        return frames

    # -- summary --------------------------------------------------------------------------------
    def write_summary(
        self,
        global_step: int,
        wall_time_s: float,
        sps: float,
        eval: Mapping[str, Any] | None = None,
        checkpoint: str | os.PathLike | None = None,
        **extra: Any,
    ) -> Path:
        """Write ``summary.json`` atomically in the schema of docs/runs.md and return its path.

        ``eval`` holds success_rate / episodic_return / episodic_length / global_step of the last
        evaluation (missing ones are null; None means no evaluation yet); further keys are kept.
        ``train`` is the last value of every scalar passed to :meth:`log`. ``extra`` keys are
        added at the top level. NaN and inf become null, so the file is strict JSON.
        """
        eval_entry = {key: None for key in EVAL_KEYS}
        if eval is not None:
            eval_entry.update(eval)
        summary = {
            "script": self.script,
            "env_id": self.env_id,
            "seed": self.seed,
            "global_step": global_step,
            "wall_time_s": wall_time_s,
            "sps": sps,
            "eval": eval_entry,
            "train": dict(self.latest),
            "checkpoint": None if checkpoint is None else str(checkpoint),
            "args": self.args,
            "versions": versions(),
        }
        if self.trainer is not None:
            summary["trainer"] = self.trainer
        clash = sorted(set(extra) & set(summary))
        if clash:
            raise ValueError(f"write_summary: extra keys {clash} would overwrite summary.json fields")
        summary.update(extra)
        text = json.dumps(_jsonable(summary), indent=2, allow_nan=False) + "\n"
        return atomic_write(self.run_dir / "summary.json", lambda f: f.write(text.encode()))

    # -- shutdown -------------------------------------------------------------------------------
    def finish(
        self,
        global_step: int,
        wall_time_s: float,
        sps: float,
        eval: Mapping[str, Any] | None,
        checkpoint: str | os.PathLike | None,
        exit_code: int = 0,
        **extra: Any,
    ) -> Path:
        """The end of a run (also after Ctrl-C or an error): write summary.json, print the ``done:`` line,
        close. Returns the summary path."""
        path = self.write_summary(
            global_step=global_step, wall_time_s=wall_time_s, sps=sps, eval=eval, checkpoint=checkpoint, **extra
        )
        more = "".join(f" {k}={v}" for k, v in extra.items())
        self.write(f"done: global_step={global_step} wall_time={wall_time_s:.1f}s{more} eval={eval}")
        self.close(exit_code=exit_code)
        return path

    def close(self, exit_code: int = 0) -> None:
        """Close the progress bar, flush and close TensorBoard, finish W&B. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._end_bar()
        self.writer.flush()
        self.writer.close()
        if self._wandb is not None:
            self._wandb.finish(exit_code=exit_code)
            self._wandb.tensorboard.unpatch()  # later SummaryWriters in this process stay plain

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"RunLogger for {self.run_name} is already closed")

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """A trainer's ``with ..., logger:`` around its loop and ``finish``: where the run ends in an error (an env
        that raised, a non-finite observation, an interrupt), summary.json is written with what is known (the last
        logged step and evaluation, ``last.pt`` if one was written, and the error) and the logger closed; the error
        goes on. Without an error it only closes (``finish`` has usually done so)."""
        if exc_type is None or self._closed:
            self.close()
            return
        message = f"{exc_type.__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        if exc_type is SystemExit and exc is not None and exc.code in (0, None):
            message = None
        last = self.checkpoint_dir / "last.pt"
        wall = time.time() - self.started
        self.write_summary(
            self.global_step, wall, self.global_step / max(wall, 1e-9), self.last_eval,
            last if last.is_file() else None, error=message,
        )  # fmt: skip
        # Ctrl-C is a clean end of a run (docs/runs.md); other exceptions mark the W&B run failed.
        self.close(exit_code=0 if issubclass(exc_type, KeyboardInterrupt) or message is None else 1)
