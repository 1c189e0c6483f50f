"""Language instructions in observations: how an env puts each env's instruction into a batched observation, and
how a policy reads it back.

An instruction travels as the observation entry ``"instruction"``, a TensorDict with two int64 ``[N, L]`` leaves
named as Hugging Face tokenizers name them:

- ``input_ids``: the instruction's UTF-8 bytes, each byte ``b`` as token ``b + 1``, then padding ``0``;
- ``attention_mask``: 1 on the instruction's tokens, 0 on the padding.

The byte-level tokenizer needs no vocabulary, so nothing has to travel with the env for the text to be readable:
a policy gets the raw strings back with :func:`decode_instructions` (to feed its own tokenizer, e.g. a VLA's), and
a small built-in agent embeds the ids directly (the classic trainers' ``InstructionEncoder``). Everything here works on
the whole batch with tensor ops, except the two conversions to and from Python strings.
"""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "INSTRUCTION_KEY",
    "VOCAB_SIZE",
    "decode_instructions",
    "encode_instructions",
    "instruction_space",
    "is_instruction_space",
    "text_to_instruction_space",
]

INSTRUCTION_KEY = "instruction"
"""The observation entry that holds the instruction tokens."""
VOCAB_SIZE = 257
"""Token ids: 0 is padding, 1..256 are the bytes 0..255 (byte b is id b + 1)."""


def instruction_space(length: int) -> gym.spaces.Dict:
    """The observation space of one env's instruction of at most ``length`` bytes."""
    return gym.spaces.Dict(
        {
            "input_ids": gym.spaces.Box(0, VOCAB_SIZE - 1, (length,), np.int64),
            "attention_mask": gym.spaces.Box(0, 1, (length,), np.int64),
        }
    )


def is_instruction_space(space: gym.Space) -> bool:
    """Whether ``space`` is an :func:`instruction_space`."""
    return (
        isinstance(space, gym.spaces.Dict)
        and set(space.spaces) == {"input_ids", "attention_mask"}
        and all(isinstance(box, gym.spaces.Box) and box.dtype == np.int64 for box in space.spaces.values())
    )


def text_to_instruction_space(space: gym.spaces.Text) -> gym.spaces.Dict:
    """The instruction space a Gymnasium ``Text`` space becomes: room for ``max_length`` characters of its
    character set in UTF-8 (up to 4 bytes each)."""
    widest = max((len(c.encode("utf-8")) for c in space.character_set), default=1)
    return instruction_space(space.max_length * widest)


def encode_instructions(texts: Sequence[str], length: int, device: torch.device | str = "cpu") -> TensorDict:
    """``texts`` -> TensorDict(input_ids, attention_mask) of batch size ``[len(texts)]``; a text whose UTF-8 form
    is longer than ``length`` bytes raises ValueError (an instruction is never cut silently)."""
    ids = np.zeros((len(texts), length), dtype=np.int64)
    for row, text in enumerate(texts):
        data = text.encode("utf-8")
        if len(data) > length:
            raise ValueError(f"instruction {text!r} is {len(data)} bytes long, the observation holds {length}")
        ids[row, : len(data)] = np.frombuffer(data, dtype=np.uint8).astype(np.int64) + 1
    input_ids = torch.from_numpy(ids).to(device)
    return TensorDict(
        {"input_ids": input_ids, "attention_mask": (input_ids > 0).long()}, batch_size=[len(texts)], device=device
    )


def decode_instructions(tokens: TensorDict) -> list[str]:
    """The strings behind a batch of instruction tokens (``obs["instruction"]``, batch size ``[B]``)."""
    ids = tokens["input_ids"].cpu().numpy()
    mask = tokens["attention_mask"].cpu().numpy().astype(bool)
    return [bytes((row[keep] - 1).astype(np.uint8).tolist()).decode("utf-8", "replace") for row, keep in zip(ids, mask)]
