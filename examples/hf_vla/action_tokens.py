"""The action-token map: which vocabulary ids the ``bins`` head reads, in which order, what each decodes to.

A token-bin VLA turns action entry ``x`` (normalised to [-1, 1] with the dataset statistics, ``statistics.py``) into
one of N bins, and bin ``k`` into the logit of one vocabulary id, the LM head's row ``ids[k]``. Which ids those are
is a convention of the model family, and getting it wrong fails silently (the policy still trains, on rows the base
model never learned to emit). :class:`ActionTokenMap` states it explicitly, is written into the saved VLA's
``vla_config.json`` (a reload reads the same rows whatever its tokenizer says), and :meth:`ActionTokenMap.check`
refuses a map that reads a row the LM head does not have, a padding row past the tokenizer, or a special token.

Conventions (``build_action_token_map``):

- ``"bin_tokens"``: this module's own tokenizer (``tokenizer.build_tokenizer``) appends ``<bin_0>`` ... ``<bin_{N-1}>``;
  bin k is ``<bin_k>``. N equal cells over [-1, 1], decoded at their centres.
- ``"paligemma"``: the top of Gemma's 256,000-token text vocabulary, counting down from the id below ``<loc0000>``:
  bin k is id ``id(<loc0000>) - 1 - k`` (255,999 - k in PaliGemma). It skips, above the bins, PaliGemma's 1024
  ``<loc>`` tokens (image coordinates the detection tasks emit), its 128 ``<seg>`` tokens, ``<image>`` and the LM
  head's padding rows that no token has. This is OpenVLA's choice (the least used tokens of the base text
  vocabulary) made on Gemma's vocabulary. N equal cells, decoded at their centres.
- ``"openpi"``: openpi's (pi0-FAST, and its RT-2/OpenVLA-style binning baseline) on the PaliGemma tokenizer: token t
  is ``sp.vocab_size() - 1 - 128 - t`` with the 257,152-piece PaliGemma SentencePiece model, i.e. bin k is id
  ``id(<seg000>) - 1 - k`` = 257,023 - k: it counts down from ``<loc1023>`` through the ``<loc>`` block, skipping
  only the ``<seg>`` block, ``<image>`` and padding. N equal cells, bin t decoded at its lower end ``t / N * 2 - 1``
  (``BinningTokenizer.extract_actions``), and a value falls in the cell that holds it, the lower end included (how
  openpi discretises its state: ``np.digitize(x, np.linspace(-1, 1, N + 1)[:-1]) - 1``).
- ``"smolvlm"``: the top of SmolLM2's 49,152-token text vocabulary, counting down from the id below ``<global-img>``
  (the first of the 128 tokens SmolVLM appends): bin k is id ``id(<global-img>) - 1 - k`` (49,151 - k in SmolVLM and
  SmolVLM2, whose tokenizer and LM head have 49,280). It skips, above the bins, ``<global-img>``, the 36
  ``<row_r_col_c>`` tile markers, ``<fake_token_around_image>``, ``<image>``, 88 reserved special tokens and
  ``<end_of_utterance>``: OpenVLA's choice (the least used tokens of the base text vocabulary) made on SmolLM2's, the
  same ids as ``openvla``'s ``tokenizer.vocab_size - 1 - k`` there. N equal cells, decoded at their centres.
- ``"openvla"``: OpenVLA's ``ActionTokenizer``: bin k is id ``tokenizer.vocab_size - 1 - k`` (the base vocabulary's
  size without added tokens: 31,999 - k on Llama-2, whose LM head has 32,064 rows: 32,000 is ``<PAD>``, the other
  63 are padding). Its binning too: an action x in [-1, 1] is ``np.digitize(x, np.linspace(-1, 1, N)) - 1``, and
  bins decode to the N - 1 centres of those N edges (the last bin, reached only at x = 1, decodes like the one
  below it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CONVENTIONS", "ActionTokenMap", "build_action_token_map"]

CONVENTIONS = ("bin_tokens", "paligemma", "openpi", "smolvlm", "openvla")


def uniform_cells(num_bins: int) -> tuple[list[float], list[float]]:
    """N equal cells over [-1, 1]: their centres and the N - 1 inner edges."""
    values = [-1.0 + (2 * k + 1) / num_bins for k in range(num_bins)]
    edges = [-1.0 + 2 * k / num_bins for k in range(1, num_bins)]
    return values, edges


def openpi_cells(num_bins: int) -> tuple[list[float], list[float]]:
    """openpi's: N equal cells over [-1, 1], bin t decoded at its lower end t / N * 2 - 1 (computed so, to match the
    reference bit for bit); the N - 1 inner edges are the same numbers, so each value is counted in its own bin."""
    values = [t / num_bins * 2 - 1 for t in range(num_bins)]
    return values, values[1:]


def openvla_cells(num_bins: int) -> tuple[list[float], list[float]]:
    """OpenVLA's: N edges ``linspace(-1, 1, N)``, N - 1 centres between them; bin k (``digitize - 1``) decodes to
    centre min(k, N - 2). The edges a value is counted against are the N - 1 after the first (x >= -1 always)."""
    bins = np.linspace(-1.0, 1.0, num_bins)
    centres = (bins[:-1] + bins[1:]) / 2.0
    values = [float(centres[min(k, num_bins - 2)]) for k in range(num_bins)]
    return values, [float(b) for b in bins[1:]]


@dataclass(frozen=True)
class ActionTokenMap:
    """Bin k of every action entry is the logit of vocabulary id ``ids[k]`` and decodes to the normalised action
    ``values[k]`` (in [-1, 1]); a normalised action x falls in bin ``#{edges <= x}`` (``edges``: N - 1
    non-decreasing thresholds). ``skipped``: the vocabulary rows above the bins that the convention leaves alone,
    as ``[first, last, what]`` (for the record; what decides is ``ids``)."""

    convention: str
    ids: tuple[int, ...]
    values: tuple[float, ...]
    edges: tuple[float, ...]
    skipped: tuple[tuple[int, int, str], ...] = field(default=())

    @property
    def num_bins(self) -> int:
        return len(self.ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "convention": self.convention,
            "ids": list(self.ids),
            "values": list(self.values),
            "edges": list(self.edges),
            "skipped": [list(s) for s in self.skipped],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActionTokenMap:
        try:
            return cls(
                convention=str(data["convention"]),
                ids=tuple(int(i) for i in data["ids"]),
                values=tuple(float(v) for v in data["values"]),
                edges=tuple(float(e) for e in data["edges"]),
                skipped=tuple((int(a), int(b), str(w)) for a, b, w in data.get("skipped", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"action_tokens is not an action-token map ({type(e).__name__}: {e})") from None

    def check(self, tokenizer, lm_rows: int) -> None:
        """One-line ValueError unless every bin reads its own row of the LM head (``lm_rows`` rows), a token the
        tokenizer has (not a padding row past it), none of the tokenizer's special tokens (``bin_tokens`` excepted:
        its bins are added as special tokens), with consistent values and edges."""
        n, ids = self.num_bins, self.ids
        what = f"action tokens ({self.convention}, {n} bins)"
        if n < 2:
            raise ValueError(f"{what}: --action-bins must be >= 2")
        if len(set(ids)) != n:
            raise ValueError(f"{what}: two bins read the same vocabulary id")
        if min(ids) < 0 or max(ids) >= lm_rows:
            raise ValueError(f"{what}: ids {min(ids)}..{max(ids)} fall outside the LM head's {lm_rows} rows")
        if max(ids) >= len(tokenizer):
            raise ValueError(
                f"{what}: id {max(ids)} is an LM-head padding row (the tokenizer has {len(tokenizer)} tokens, the "
                f"head {lm_rows} rows): no token, never trained"
            )
        special = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id}
        image = tokenizer.convert_tokens_to_ids("<image>")
        if isinstance(image, int) and image != tokenizer.unk_token_id:
            special.add(image)
        if self.convention != "bin_tokens":
            special |= set(tokenizer.all_special_ids)
        hit = sorted(special.intersection(ids) - {None})
        if hit:
            names = tokenizer.convert_ids_to_tokens(hit[:3])
            raise ValueError(f"{what}: the bins would read special tokens {names} (ids {hit[:3]})")
        if self.convention in ("paligemma", "openvla"):  # text-vocabulary conventions: never PaliGemma's <loc>/<seg>
            names = tokenizer.convert_ids_to_tokens(list(ids))
            located = [name for name in names if re.fullmatch(r"<(loc|seg)\d+>", name or "")]
            if located:
                raise ValueError(f"{what}: the bins would read PaliGemma's {located[0]} ... ({len(located)} of them)")
        if len(self.values) != n or len(self.edges) != n - 1:
            raise ValueError(f"{what}: {len(self.values)} values and {len(self.edges)} edges for {n} bins")
        if any(b < a for a, b in zip(self.edges, self.edges[1:])) or any(abs(v) > 1 for v in self.values):
            raise ValueError(f"{what}: edges must not decrease and values must lie in [-1, 1]")


BLOCKS = (
    (r"<loc\d+>", "<loc>"),  # PaliGemma's
    (r"<seg\d+>", "<seg>"),
    (r"<row_\d+_col_\d+>", "<row_r_col_c>"),  # SmolVLM's
    (r"<\|reserved_special_token_\d+\|>", "<|reserved_special_token_k|>"),
)
"""Numbered tokens that ``skipped`` records as one run each: (pattern, the run's name)."""


def _skipped(tokenizer, top: int, lm_rows: int) -> tuple[tuple[int, int, str], ...]:
    """The rows above ``top`` grouped into runs: blocks of numbered tokens (``BLOCKS``), single tokens, then LM-head
    padding."""
    runs: list[list] = []
    size = len(tokenizer)
    names = tokenizer.convert_ids_to_tokens(list(range(top + 1, size))) if top + 1 < size else []
    for i, name in zip(range(top + 1, size), names):
        block = next((kind for pattern, kind in BLOCKS if re.fullmatch(pattern, name or "")), None)
        kind = block or str(name)
        if runs and block and runs[-1][2] == kind and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i, kind])
    if size < lm_rows:
        runs.append([size, lm_rows - 1, "LM-head padding (no token)"])
    return tuple(tuple(r) for r in runs)


def build_action_token_map(convention: str, tokenizer, lm_rows: int, num_bins: int) -> ActionTokenMap:
    """The map of ``convention`` (``CONVENTIONS``, module docstring) for this tokenizer and an LM head of ``lm_rows``
    rows, checked (:meth:`ActionTokenMap.check`); a one-line ValueError when the vocabulary does not have the
    layout the convention is for."""
    unk = tokenizer.unk_token_id

    def token_id(name: str) -> int | None:
        i = tokenizer.convert_tokens_to_ids(name)
        return i if isinstance(i, int) and i != unk else None

    values, edges = uniform_cells(num_bins)
    if convention == "bin_tokens":
        ids = [token_id(f"<bin_{k}>") for k in range(num_bins)]
        if None in ids:
            raise ValueError(
                f"action tokens bin_tokens: the tokenizer has no <bin_{ids.index(None)}> (only this module's "
                "build_tokenizer adds <bin_k> tokens); choose the family's convention (action_tokens: "
                f"{', '.join(c for c in CONVENTIONS if c != 'bin_tokens')})"
            )
    elif convention in ("paligemma", "openpi"):
        anchor = "<loc0000>" if convention == "paligemma" else "<seg000>"
        first = token_id(anchor)
        if first is None:
            raise ValueError(
                f"action tokens {convention}: the tokenizer has no {anchor}, so it is not PaliGemma's vocabulary "
                f"(Gemma's text tokens, <loc0000>..<loc1023>, <seg000>..<seg127>, <image>); choose another "
                f"action_tokens ({', '.join(CONVENTIONS)})"
            )
        ids = [first - 1 - k for k in range(num_bins)]
        if convention == "openpi":
            values, edges = openpi_cells(num_bins)
    elif convention == "smolvlm":
        first = token_id("<global-img>")
        if first is None:
            raise ValueError(
                "action tokens smolvlm: the tokenizer has no <global-img>, so it is not SmolVLM's vocabulary "
                "(SmolLM2's text tokens, then <global-img>, <row_r_col_c>, <fake_token_around_image>, <image>, ...); "
                f"choose another action_tokens ({', '.join(CONVENTIONS)})"
            )
        ids = [first - 1 - k for k in range(num_bins)]
    elif convention == "openvla":
        ids = [tokenizer.vocab_size - 1 - k for k in range(num_bins)]
        values, edges = openvla_cells(num_bins)
    else:
        raise ValueError(f"action_tokens must be one of {', '.join(CONVENTIONS)}, got {convention!r}")
    token_map = ActionTokenMap(convention, tuple(ids), tuple(values), tuple(edges))
    token_map.check(tokenizer, lm_rows)
    return ActionTokenMap(convention, tuple(ids), tuple(values), tuple(edges), _skipped(tokenizer, max(ids), lm_rows))
