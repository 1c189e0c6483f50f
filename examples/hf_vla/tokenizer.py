"""The VLA's tokenizer, built in code, and the cache that turns the env's instruction tokens into prompts.

:func:`build_tokenizer` trains a byte-level BPE tokenizer (GPT-2 style: every UTF-8 string encodes, no unknown
token) on a small corpus, the built-in tasks' instructions and their held-out paraphrases in the prompt, so that their
words are single tokens (as a pretrained tokenizer knows words a fine-tuning run never shows),
and appends a family's image markers if it has any (SmolVLM's ``<fake_token_around_image>``, ``<global-img>``), then
``num_bins`` action tokens ``<bin_0>`` ... ``<bin_{N-1}>`` (the last N ids here): the bins head reads
them by name (the ``bin_tokens`` convention of ``action_tokens.py``; a real model family's tokenizer has no such
tokens and uses its own convention). It is a ``PreTrainedTokenizerFast``: ``save_pretrained(path)`` writes it beside
the model and ``AutoTokenizer.from_pretrained(path)`` reads it back. Training is deterministic (the same corpus
gives the same vocabulary and merges), so two policies built from the same arguments tokenize alike.

:class:`PromptCache` holds the prompts of the instructions seen so far: the env gives byte tokens
(``shared.language``), each distinct instruction is decoded to its string and tokenized once, and a batch is
matched against the known instructions with one tensor comparison (no Python loop over the batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from tensordict import TensorDict
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from cleanrl_embodied.shared.envs.push_cube import HELDOUT_INSTRUCTIONS, LANG_TASKS, TASKS
from cleanrl_embodied.shared.language import decode_instructions

__all__ = ["SPECIAL_TOKENS", "PromptCache", "build_tokenizer", "default_corpus"]

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<image>", "<act>")
"""Ids 0..5, in PaliGemma's order for the first three (pad 0, eos 1, bos 2); ``<image>`` is the config's image token,
``<act>`` the placeholder at the action positions."""


def default_corpus(prompt_format: str) -> list[str]:
    """What the tokenizer learns its merges from: PushCubeLangRL's four tasks' instructions (``LANG_TASKS``) and their
    held-out paraphrases (``HELDOUT_INSTRUCTIONS``, which no training run shows the policy) in the prompt. (The
    diagonal tasks of ``TASKS`` are left out: a fresh model's vocabulary stays what it was before they existed;
    pretrain.py builds its tokenizer from its own corpus.)"""
    texts = [TASKS[name][1] for name in LANG_TASKS] + [t for name in LANG_TASKS for t in HELDOUT_INSTRUCTIONS[name]]
    return [prompt_format.format(instruction=text) for text in texts]


def build_tokenizer(corpus: Iterable[str], num_bins: int, extra_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer whose merges make every word of ``corpus`` one token, with ``SPECIAL_TOKENS`` first,
    ``<bos>`` prepended to every encoded text, ``extra_tokens`` (special) after the learned vocabulary, and
    ``num_bins`` action tokens as the last ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1 << 16,  # merge until no pair repeats: the corpus is small
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text encodes
        show_progress=False,
    )
    tokenizer.train_from_iterator(sorted(set(corpus)), trainer)
    bos = tokenizer.token_to_id("<bos>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if extra_tokens:
        fast.add_tokens(list(extra_tokens), special_tokens=True)
    fast.add_tokens([f"<bin_{i}>" for i in range(num_bins)], special_tokens=True)  # appended: the last N ids
    return fast


class PromptCache:
    """Prompt token ids for batches of instructions, each distinct instruction tokenized once.

    ``__call__(tokens)`` takes the observation's ``"instruction"`` TensorDict (byte tokens ``[B, L]``) and returns
    ``(input_ids, attention_mask)`` ``[B, P]``: ``prompt_format`` with the instruction, through ``tokenizer``,
    LEFT-padded to the batch's longest prompt (the policy numbers positions from the mask, so the amount of
    padding changes nothing; and P depends on the batch alone, not on what the cache has seen, so the same batch
    always runs the same shapes: a resumed run repeats the uninterrupted one bit for bit). The known instructions'
    byte rows sit on the device; a batch is matched against them in one comparison, and only rows not seen before
    are decoded and tokenized (two host syncs per call: whether any row is new, and P). Not module state: a copy
    of the policy starts with its own empty cache.
    """

    def __init__(self, tokenizer, prompt_format: str):
        self.tokenizer, self.prompt_format = tokenizer, prompt_format
        pad = tokenizer.pad_token_id
        self.pad_id = 0 if pad is None else pad
        self.rows: list[torch.Tensor] = []  # byte tokens of the known instructions (CPU)
        self.prompts: list[list[int]] = []  # their prompt token ids
        self._tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # keys, ids, mask (device)

    def texts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts for plain strings (no cache): ``(input_ids, attention_mask)`` [len(texts), P], left-padded."""
        return self._pad([self._encode(t) for t in texts], torch.device("cpu"))

    def __call__(self, tokens: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        byte_ids = tokens["input_ids"]
        keys, ids, mask = self._device_tables(byte_ids)
        match = (byte_ids[:, None, :] == keys[None]).all(-1)  # [B, M]: which known instruction each row is
        known = match.any(-1)
        if not bool(known.all()):  # new instructions: decode and tokenize each distinct one once
            new = byte_ids[~known].unique(dim=0)
            texts = decode_instructions(
                TensorDict(input_ids=new, attention_mask=(new > 0).long(), batch_size=[len(new)])
            )
            self.rows += list(new.cpu())
            self.prompts += [self._encode(t) for t in texts]
            self._tables = None
            keys, ids, mask = self._device_tables(byte_ids)
            match = (byte_ids[:, None, :] == keys[None]).all(-1)
        row = match.int().argmax(-1)
        width = int(mask[row].sum(-1).max())  # the batch's longest prompt: the table is left-padded
        return ids[row, ids.shape[1] - width :], mask[row, ids.shape[1] - width :]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(self.prompt_format.format(instruction=text))["input_ids"]

    def _pad(self, prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        width = max((len(p) for p in prompts), default=0)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
        return ids.to(device), mask.to(device)

    def _device_tables(self, byte_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length, device = byte_ids.shape[1], byte_ids.device
        if self.rows and len(self.rows[0]) != length:  # instructions of another width: start over
            self.rows, self.prompts, self._tables = [], [], None
        if self._tables is None or self._tables[0].device != device:
            keys = torch.stack(self.rows) if self.rows else torch.zeros((0, length), dtype=torch.long)
            self._tables = (keys.to(device), *self._pad(self.prompts, device))
        return self._tables
