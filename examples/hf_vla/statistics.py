"""Dataset statistics: how the VLA's normalised actions map to the env's, and how the state is normalised.

Every released VLA decodes its actions with the statistics of the data it was trained on (OpenVLA: the 1st and 99th
percentiles per dimension under an ``unnorm_key``, the gripper left out of it and post-processed; LeRobot: mean and
std in its processor files). The policy works in normalised units: the ``bins`` head's bins decode to values in
[-1, 1] (``action_tokens.py``), which :class:`DatasetStatistics` maps to the env's units, and the state token reads
the normalised state.

The file, ``dataset_statistics.json`` beside the model, has OpenVLA's layout (one entry per dataset, its key the
``unnorm_key``; OpenVLA's own files load as they are), with two keys of this module's in each part:

    {"PushCubeLangRL": {
        "action":  {"q01": [...], "q99": [...], "mean": [...], "std": [...], "min": [...], "max": [...],
                    "mask": [true, ...], "normalization": "bounds_q99",
                    "gripper": {"dims": [], "from_unit": false, "binarize": false, "invert": false}},
        "proprio": {... the same statistics of the state ..., "normalization": "normal"},
        "num_transitions": 7424, "num_trajectories": 512, "source": "examples/hf_vla/bc.py ..."}}

``normalization`` (per part): ``bounds_q99`` maps [q01, q99] to [-1, 1] (OpenVLA's default, and the default when the
key is absent), ``bounds`` maps [min, max], ``normal`` is ``(x - mean) / std`` (LeRobot's), ``none`` leaves the values
as they are. ``mask`` false leaves a dimension as it is (OpenVLA's gripper). A dimension with no spread (q99 = q01,
min = max, std = 0) decodes to that statistic, and normalises as OpenVLA's data pipeline does: -1 / +1 at or below /
above it, 0 where min = max (``normal``: 0 at the mean, -1 / +1 off it; ``Normalizer.tensors``). ``gripper``
(actions only), after un-normalising, for each of ``dims``: ``from_unit`` maps [0, 1] to [-1, 1] (2g - 1),
``binarize`` takes the sign, ``invert`` flips it (OpenVLA's LIBERO evaluation: ``normalize_gripper_action(binarize=
True)`` then ``invert_gripper_action``). The state: normalised with its ``normalization``, clipped to [-1, 1] under
the bounds ones (as OpenVLA-OFT does its proprio).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["NORMALIZATIONS", "STATS_FILE", "DatasetStatistics", "Gripper", "Normalizer"]

STATS_FILE = "dataset_statistics.json"
NORMALIZATIONS = ("bounds_q99", "bounds", "normal", "none")
STAT_KEYS = ("q01", "q99", "mean", "std", "min", "max")
NEEDS = {"bounds_q99": ("q01", "q99"), "bounds": ("min", "max"), "normal": ("mean", "std"), "none": ()}
FLAT = 1e-8  # a spread below this is no spread: the dimension decodes to its statistic (Normalizer.tensors)


@dataclass
class Normalizer:
    """Per-dimension statistics of one quantity (actions or state) and the normalisation chosen from them."""

    normalization: str = "bounds_q99"
    stats: dict[str, list[float]] = field(default_factory=dict)  # q01, q99, mean, std, min, max (those known)
    mask: list[bool] | None = None  # None: every dimension

    @property
    def dim(self) -> int:
        return len(next(iter(self.stats.values()))) if self.stats else len(self.mask or [])

    def check(self, dim: int, what: str) -> None:
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"{what}: normalization must be one of {', '.join(NORMALIZATIONS)}, "
                             f"got {self.normalization!r}")  # fmt: skip
        missing = [k for k in NEEDS[self.normalization] if k not in self.stats]
        if missing:
            raise ValueError(f"{what}: normalization {self.normalization} needs {missing}, the file has "
                             f"{sorted(self.stats)}")  # fmt: skip
        sizes = {k: len(v) for k, v in self.stats.items()}
        if self.mask is not None:
            sizes["mask"] = len(self.mask)
        wrong = {k: n for k, n in sizes.items() if n != dim}
        if wrong:
            raise ValueError(f"{what}: statistics of size {wrong}, the env's is {dim}")
        used = [x for k in NEEDS[self.normalization] for x in self.stats[k]]
        if not all(math.isfinite(x) for x in used):
            raise ValueError(f"{what}: {NEEDS[self.normalization]} hold a non-finite value")

    def tensors(self) -> dict[str, torch.Tensor]:
        """The maps between the env's units x and normalised units n, per dimension [dim]: decoding is
        ``x = offset + scale * n``, normalising is ``(x - offset) / scale`` (:meth:`normalise`). A masked-out
        dimension and ``none`` give (0, 1).

        A dimension with no spread (q99 - q01, max - min or std below ``FLAT``) gets ``scale`` 0: it decodes to its
        statistic whatever n is. OpenVLA's decoder, ``q01 + (n + 1)(q99 - q01) / 2``, gives exactly q01 there;
        openpi's adds 1e-6 to the spread and LeRobot 1e-8 to the std, which gives q01 or the mean within that.
        Normalising such a dimension follows OpenVLA's data pipeline (``normalize_action_and_proprio``): under the
        bounds normalisations it divides ``2 (x - low)`` by ``high - low + 1e-8`` and clips, which is -1 at or below
        the statistic and +1 above it (``tie``, the value at the statistic, is -1), and it then sets every dimension
        whose min equals its max to 0 (``zero``, where the file has min and max; OpenVLA zeroes masked-out dimensions
        too, here ``mask`` false always leaves a dimension as it is: the env's bounds mark unbounded ones so). Under
        ``normal`` its ``(x - mean) / (std + 1e-8)`` is 0 at the mean and some 1e8 times the distance elsewhere; we
        keep the 0 (``tie``) and its sign, -1 or +1, so that a state token never reads 1e8."""
        dim = self.dim
        offset, scale = torch.zeros(dim, dtype=torch.float64), torch.ones(dim, dtype=torch.float64)
        tie, zero = torch.zeros(dim), torch.zeros(dim, dtype=torch.bool)
        mask = torch.tensor(self.mask if self.mask is not None else [True] * dim)
        if self.normalization != "none":
            a, b = (torch.tensor(self.stats[k], dtype=torch.float64) for k in NEEDS[self.normalization])
            offset, scale = (a, b) if self.normalization == "normal" else ((a + b) / 2, (b - a) / 2)
            scale = torch.where(scale.abs() < FLAT, 0.0, scale)
            offset, scale = torch.where(mask, offset, 0.0), torch.where(mask, scale, 1.0)
        if self.clips:
            tie = torch.full((dim,), -1.0)
            if "min" in self.stats and "max" in self.stats:
                zero = mask & (torch.tensor(self.stats["min"]) == torch.tensor(self.stats["max"]))
        return {"offset": offset.float(), "scale": scale.float(), "tie": tie, "zero": zero}

    @staticmethod
    def normalise(x: torch.Tensor, tensors: dict[str, torch.Tensor], clip: bool) -> torch.Tensor:
        """``x`` [..., dim] in the env's units -> normalised with :meth:`tensors` (on ``x``'s device), clipped to
        [-1, 1] if ``clip``; a dimension with no spread (scale 0) -> -1 / ``tie`` / +1 below / at / above its
        statistic, and 0 where ``zero``."""
        offset, scale = tensors["offset"], tensors["scale"]
        flat = scale == 0
        distance = x - offset
        n = distance / torch.where(flat, 1.0, scale)
        if clip:
            n = n.clamp(-1.0, 1.0)
        sign = torch.where(distance > 0, 1.0, torch.where(distance < 0, -1.0, tensors["tie"]))
        return torch.where(tensors["zero"], 0.0, torch.where(flat, sign, n))

    @property
    def clips(self) -> bool:
        """Whether normalised values are clipped to [-1, 1] (the bounds normalisations)."""
        return self.normalization in ("bounds_q99", "bounds")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.stats)
        out["mask"] = self.mask if self.mask is not None else [True] * self.dim
        out["normalization"] = self.normalization
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], default: str) -> Normalizer:
        stats = {k: [float(x) for x in data[k]] for k in STAT_KEYS if data.get(k) is not None}
        mask = [bool(m) for m in data["mask"]] if data.get("mask") is not None else None
        return cls(str(data.get("normalization", default)), stats, mask)

    @classmethod
    def of_samples(cls, samples: torch.Tensor, normalization: str) -> Normalizer:
        """Statistics of ``samples`` [S, dim] (float64 quantiles, as numpy's linear interpolation)."""
        x = samples.reshape(-1, samples.shape[-1]).double()
        q = torch.quantile(x, torch.tensor([0.01, 0.99], dtype=torch.float64), dim=0)
        stats = {"q01": q[0], "q99": q[1], "mean": x.mean(0), "std": x.std(0, unbiased=False),
                 "min": x.min(0).values, "max": x.max(0).values}  # fmt: skip
        return cls(normalization, {k: [float(v) for v in t] for k, t in stats.items()}, [True] * x.shape[1])


@dataclass
class Gripper:
    """Post-processing of gripper dimensions after un-normalising (module docstring)."""

    dims: list[int] = field(default_factory=list)
    from_unit: bool = False
    binarize: bool = False
    invert: bool = False

    def check(self, dim: int, what: str) -> None:
        if any(not 0 <= d < dim for d in self.dims):
            raise ValueError(f"{what}: gripper dims {self.dims} outside the action's {dim} dimensions")

    def apply(self, action: torch.Tensor) -> torch.Tensor:
        if not self.dims:
            return action
        g = action[..., self.dims]
        if self.from_unit:
            g = 2 * g - 1
        if self.binarize:
            g = torch.sign(g)
        if self.invert:
            g = -g
        out = action.clone()
        out[..., self.dims] = g
        return out


@dataclass
class DatasetStatistics:
    """The statistics the policy decodes its actions and normalises its state with (module docstring)."""

    key: str
    action: Normalizer
    state: Normalizer | None = None  # None: the policy reads no state
    gripper: Gripper = field(default_factory=Gripper)
    extra: dict[str, Any] = field(default_factory=dict)  # num_transitions, num_trajectories, source, ...

    @classmethod
    def env_bounds(cls, low: list[float], high: list[float], state_dim: int) -> DatasetStatistics:
        """No data: actions map [-1, 1] to the env's bounds (dimensions without finite bounds stay as they are),
        the state goes in unnormalised."""
        finite = [math.isfinite(a) and math.isfinite(b) for a, b in zip(low, high)]
        lo = [a if f else 0.0 for a, f in zip(low, finite)]
        hi = [b if f else 0.0 for b, f in zip(high, finite)]
        action = Normalizer("bounds", {"min": lo, "max": hi}, finite)
        state = Normalizer("none", {}, [False] * state_dim) if state_dim else None
        return cls("env_bounds", action, state, extra={"source": "the env's action bounds (no data)"})

    @classmethod
    def of_samples(cls, key: str, actions: torch.Tensor, states: torch.Tensor | None, action_norm: str,
                   state_norm: str, **extra) -> DatasetStatistics:  # fmt: skip
        state = Normalizer.of_samples(states, state_norm) if states is not None else None
        return cls(key, Normalizer.of_samples(actions, action_norm), state, extra=dict(extra))

    def check(self, action_dim: int, state_dim: int, where: str) -> None:
        """One-line ValueError unless the statistics fit an action of ``action_dim`` and a state of ``state_dim``."""
        self.action.check(action_dim, f"{where}: action statistics")
        self.gripper.check(action_dim, f"{where}: action statistics")
        if state_dim:
            if self.state is None:
                raise ValueError(f"{where}: no 'proprio' statistics for the env's state ({state_dim} entries)")
            self.state.check(state_dim, f"{where}: proprio statistics")

    def to_json(self) -> dict[str, Any]:
        action = self.action.to_dict()
        action["gripper"] = {"dims": self.gripper.dims, "from_unit": self.gripper.from_unit,
                             "binarize": self.gripper.binarize, "invert": self.gripper.invert}  # fmt: skip
        entry: dict[str, Any] = {"action": action}
        if self.state is not None:
            entry["proprio"] = self.state.to_dict()
        entry.update(self.extra)
        return {self.key: entry}

    def save(self, directory: str | Path) -> None:
        (Path(directory) / STATS_FILE).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path, unnorm_key: str | None = None) -> DatasetStatistics:
        """Read a statistics file (this module's or OpenVLA's); ``unnorm_key`` picks the entry when there are
        several. A one-line ValueError when it cannot."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable statistics file ({type(e).__name__})") from None
        if not isinstance(data, dict) or not data:
            raise ValueError(f"{path}: not a statistics file (a JSON object of datasets)")
        if unnorm_key is None:
            if len(data) != 1:
                raise ValueError(f"{path} holds statistics of {sorted(data)}: choose one with --policy-kwargs "
                                 "unnorm_key")  # fmt: skip
            unnorm_key = next(iter(data))
        if unnorm_key not in data:
            raise ValueError(f"{path}: unnorm_key {unnorm_key!r} is not one of {sorted(data)}")
        entry = data[unnorm_key]
        if not isinstance(entry, dict) or not isinstance(entry.get("action"), dict):
            raise ValueError(f"{path}: entry {unnorm_key!r} has no 'action' statistics")
        try:
            action = Normalizer.from_dict(entry["action"], "bounds_q99")
            grip = entry["action"].get("gripper") or {}
            gripper = Gripper([int(d) for d in grip.get("dims", [])], bool(grip.get("from_unit", False)),
                              bool(grip.get("binarize", False)), bool(grip.get("invert", False)))  # fmt: skip
            proprio = entry.get("proprio")
            state = Normalizer.from_dict(proprio, "bounds_q99") if isinstance(proprio, dict) else None
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: entry {unnorm_key!r} is malformed ({type(e).__name__}: {e})") from None
        extra = {k: v for k, v in entry.items() if k not in ("action", "proprio")}
        return cls(unnorm_key, action, state, gripper, extra)
