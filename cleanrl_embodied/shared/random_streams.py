"""The run's random streams: each seeded from ``--seed`` by a stream of its own (:func:`stream_seed`), the global
generators seeded at start-up (:func:`seed_everything`), and their state in a checkpoint (:func:`rng_state`,
:func:`set_rng_state`), so that a resumed run draws what the straight run would have drawn."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["STREAMS", "rng_state", "seed_everything", "set_rng_state", "stream_seed"]

STREAMS = {
    "torch": "torch's global generator: network init, action sampling in rollouts, minibatch shuffles (per rank)",
    "python": "Python's `random` module (per rank; the trainers draw nothing from it)",
    "numpy": "NumPy's global generator (per rank; the trainers draw nothing from it)",
    "train_envs": "the training envs (per rank; Gymnasium sub-env i gets this seed + i)",
    "eval_envs": "the eval envs' construction (every evaluation then resets them with an eval_resets seed)",
    "eval_resets": "the reset of the evaluation at a global step (fresh, reproducible starts)",
    "eval_actions": "sampled eval actions (--no-eval-deterministic), one stream per evaluation",
    "collector": "ppo_async's collector thread: its action sampling",
    "group_resets": "grpo's group starts of an iteration",
    "group_redraws": "grpo_vla's further group starts of an iteration (dynamic sampling: --min-informative-groups)",
}
"""The run's independent random streams and what each drives (docs/runs.md). Each is seeded by
:func:`stream_seed`, never by ``--seed`` itself."""


def stream_seed(seed: int, stream: str, index: int = 0) -> int:
    """The seed of one random stream of the run with ``--seed`` ``seed``: NumPy's ``SeedSequence(seed)`` spawned
    with the key (the stream's number in :data:`STREAMS`, ``index``), ``index`` being the rank, a global step or
    an iteration. Distinct streams, indices and run seeds give unrelated seeds (a hash, not ``seed + k``, so seed 2
    never replays a stream of seed 1); 30 bits, so that envs can add their sub-env index."""
    key = (list(STREAMS).index(stream), index)
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1)[0] >> 2)


def seed_everything(seed: int, torch_deterministic: bool, rank: int = 0) -> None:
    """Seed Python, NumPy and torch (all devices) of this process (``rank``) from the run's ``seed``, each from
    its own :func:`stream_seed`; cuDNN deterministic if asked."""
    random.seed(stream_seed(seed, "python", rank))
    np.random.seed(stream_seed(seed, "numpy", rank))
    torch.manual_seed(stream_seed(seed, "torch", rank))
    torch.backends.cudnn.deterministic = torch_deterministic


def rng_state() -> dict:
    """Python's, NumPy's and torch's (CPU and this process's CUDA device) random states, as tensors and
    plain values that ``torch.load(weights_only=True)`` can read back."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
        "numpy": [torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])
    keys, *rest = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), *rest))
