"""The VLA policy: a transformers vision-language model (PaliGemma: SigLIP + Gemma; SmolVLM / Idefics3: SigLIP, a
pixel-shuffle connector and a Llama-style SmolLM2) with LoRA adapters (peft), action heads on its last hidden state,
and a value head; the VLA trainers' ``--policy`` contract (docs/POLICIES.md, docs/VLA.md).

One forward pass reads the sequence

    [image tokens (SigLIP patches, projected), camera after camera] [state token, if the env gives "state"] [prompt]
    [K*D action slots]

(SmolVLM's image tokens sit between its processor's markers: ``<fake_token_around_image> <global-img>`` ...
``<fake_token_around_image>``, one global image per camera, no tiles) with bidirectional attention over all of it
(PaliGemma's prefix attention; OpenVLA-OFT's parallel decoding; SmolVLA's prefix over image and language): every
image entry of the observation (the cameras, in ``VLAConfig.cameras``' order) resized and normalised as the family's
processor does (PaliGemma: bicubic, mean and std 0.5) and through the vision tower, their tokens one camera's after
the other as PaliGemma lays out several images of a sample, the state
normalised with the dataset statistics, the prompt with the family's suffix (PaliGemma's processor ends the prefix
with a newline), and the action slots ``<act>`` placeholder tokens plus a learned query per slot (Gemma's vocabulary
has no ``<act>``, so a real checkpoint's slots embed ``<pad>``: harmless, the queries and positions tell the slots
apart). Each slot's last hidden state gives one action entry, independent of the others given the context. Heads
(``--action-head``):

- ``bins``: the slot's logits over the action tokens through the base's own LM head: ``h @ (W[ids] + delta).T``,
  ``ids`` the vocabulary ids of the N bins, an explicit per-family map (``action_tokens.py``, written into
  ``vla_config.json``). ``delta`` [N, H] (zero at build, so the start is the base's head) trains the action
  tokens' rows, as a fine-tuned OpenVLA does (``train_action_tokens``; false keeps the LM head frozen as it is).
  The logits and their log-softmax are float32 whatever the backbone's dtype or autocast. A bin decodes to a
  normalised action in [-1, 1], which the dataset statistics (``statistics.py``, ``dataset_statistics.json``
  beside the model) map to the env's units.
- ``gaussian``: a small MLP on the slot's hidden state gives the entry's normalised mean, with a learned log-std per
  entry; the distribution is over the env's units (the statistics' affine map applied to it).
- value: an MLP on the mean of the last hidden states over the sequence (a critic sharing the backbone).

Only the LoRA adapters and the heads train (``requires_grad``); ``reference_dist`` is the policy with the adapters
disabled and the heads as built (a frozen copy of the small heads only, never of the backbone). ``save_pretrained``
writes the backbone with the adapters merged in (in its own dtype), the tokenizer, the heads, ``vla_config.json`` and
``dataset_statistics.json``; a policy loaded from there starts with fresh (zero-effect) adapters on that merged base.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from transformers import (
    AutoTokenizer,
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
)
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging as hf_logging

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, is_instruction_space
from cleanrl_embodied.shared.tensordict_helpers import PRIVILEGED_KEY, is_image
from examples.action_bins import Bins
from examples.hf_vla.action_tokens import CONVENTIONS, ActionTokenMap, build_action_token_map
from examples.hf_vla.statistics import STATS_FILE, DatasetStatistics, Normalizer
from examples.hf_vla.tokenizer import PromptCache, build_tokenizer, default_corpus

__all__ = [
    "FAMILIES",
    "Bins",
    "Family",
    "HFVLAPolicy",
    "VLAConfig",
    "load_backbone",
    "make_policy",
    "tiny_paligemma",
    "tiny_smolvlm",
]


@dataclass(frozen=True)
class Family:
    """What a model family fixes besides its class: the action tokens' convention for a checkpoint of it
    (``action_tokens.py``), and what its processor does to the inputs: the text after the prompt, the image's
    resampling and normalisation (a checkpoint's ``preprocessor_config.json`` overrides the last two); which forward
    the policy runs it with (``forward``: ``"paligemma"`` or ``"idefics3"``, ``HFVLAPolicy.image_tokens`` and
    ``HFVLAPolicy.language_model``), and the tokens its processor puts before and after an image's tokens."""

    model_class: type
    action_tokens: str
    prompt_suffix: str
    image_resample: str
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    forward: str = "paligemma"
    image_start: tuple[str, ...] = ()
    image_end: tuple[str, ...] = ()

    @property
    def markers(self) -> tuple[str, ...]:
        """The image markers, each once (what a fresh tokenizer adds)."""
        return tuple(dict.fromkeys(self.image_start + self.image_end))


SMOLVLM_IMAGE = {
    "image_start": ("<fake_token_around_image>", "<global-img>"),
    "image_end": ("<fake_token_around_image>",),
}
"""SmolVLM's processor around one global image (no tiles): ``<fake_token_around_image><global-img>``, the
``<image>`` tokens, ``<fake_token_around_image>``."""


FAMILIES = {
    # PaliGemmaProcessor: "<image>"*n + "<bos>" + prompt + "\n"; SiglipImageProcessor: bicubic resize of the 8-bit
    # image, then (x / 255 - 0.5) / 0.5
    "paligemma": Family(PaliGemmaForConditionalGeneration, "paligemma", "\n", "bicubic", (0.5,) * 3, (0.5,) * 3),
    # SmolVLM2 (SmolVLA's backbone, SmolVLM2-500M-Video-Instruct) and SmolVLM (Idefics3's classes): SigLIP, the
    # pixel-shuffle connector, SmolLM2. Images as SmolVLA prepares them: bilinear resize (its processor's LANCZOS
    # has no torch equivalent), then (x / 255 - 0.5) / 0.5; prompts end with a newline as SmolVLA's tasks do.
    "smolvlm": Family(SmolVLMForConditionalGeneration, "smolvlm", "\n", "bilinear", (0.5,) * 3, (0.5,) * 3,
                      "idefics3", **SMOLVLM_IMAGE),
    "idefics3": Family(Idefics3ForConditionalGeneration, "smolvlm", "\n", "bilinear", (0.5,) * 3, (0.5,) * 3,
                       "idefics3", **SMOLVLM_IMAGE),
}  # fmt: skip
"""``model_type`` (config.json) -> its family; the policy's forward is written for these."""
MODEL_CLASSES = {name: family.model_class for name, family in FAMILIES.items()}
VLA_CONFIG = "vla_config.json"
HEADS_FILE = "heads.safetensors"
DEFAULT_LORA_TARGETS = "all-linear"
UNUSED_MODULES = r".*vision_tower\.head\..*"
"""Modules no action depends on, which get no adapters: SigLIP's attention-pooling head (PaliGemma reads the patch
embeddings, not the pooled one), whose adapters would never receive a gradient."""
r"""peft's every linear layer but the LM head: the vision tower's, the projector's and the language model's (OpenVLA's
LoRA choice). A regex selects fewer, e.g. r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"."""
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes in a preprocessor_config.json


@dataclass
class VLAConfig:
    """What the policy adds to its backbone; saved as ``vla_config.json`` beside the model."""

    model_type: str = "paligemma"  # the backbone's family (FAMILIES)
    action_head: str = "bins"  # "bins" or "gaussian"
    action_bins: int = 256  # N bins per action entry
    action_tokens: dict[str, Any] | None = None  # bins: the ActionTokenMap (ids, values, edges); None: not yet built
    action_chunk: int = 1  # K actions per decision (the action is [K, D] when K > 1)
    action_dim: int = 7  # D
    action_low: list[float] = field(default_factory=list)  # the env's per-step bounds [D] (checked on loading)
    action_high: list[float] = field(default_factory=list)
    image_size: tuple[int, int] = (64, 64)  # H, W of the env's images (every camera's)
    cameras: list[str] = field(default_factory=lambda: ["rgb"])  # the image entries, in the image tokens' order
    image_resample: str = "bicubic"  # how an image of another size is resized to the vision tower's
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])  # (x / 255 - mean) / std per channel
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    state_dim: int = 0  # entries of the env's "state" (0: none; else one state token after the image)
    prompt_format: str = "{instruction}"  # e.g. "In: What action should the robot take to {instruction}?\nOut:"
    prompt_suffix: str = "\n"  # appended to every prompt (the family's processor's; PaliGemma: a newline)
    instruction: str | None = None  # the prompt's instruction for envs whose observations hold none
    head_hidden: int = 64  # width of the Gaussian mean MLP and of the value MLP
    init_logstd: float = -0.5  # initial log-std of the Gaussian head
    train_action_tokens: bool = True  # bins: train the action tokens' LM-head rows (a delta on them)

    def __post_init__(self):
        self.image_size = tuple(int(s) for s in self.image_size)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return (self.action_chunk, self.action_dim) if self.action_chunk > 1 else (self.action_dim,)


@contextlib.contextmanager
def quiet():
    """No progress bars while transformers loads or saves, and no FutureWarning from peft's use of its API."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*is_gradient_checkpointing.*")
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def tiny_paligemma(
    vocab_size: int,
    image_size: tuple[int, int],
    special_ids: dict[str, int],
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 128,
    patch_size: int = 16,
) -> PaliGemmaConfig:
    """A PaliGemma config small enough for a CPU: SigLIP and Gemma of ``num_layers`` layers of width ``hidden_size``
    (Gemma with one key/value head, like PaliGemma's), square images of the env's size in ``patch_size`` patches."""
    head_dim = hidden_size // num_heads
    return PaliGemmaConfig(
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            image_size=image_size[0],
            patch_size=patch_size,
            projection_dim=hidden_size,
        ),
        text_config=dict(
            model_type="gemma",
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=1,
            head_dim=head_dim,
            vocab_size=vocab_size,
            pad_token_id=special_ids["pad"],
            bos_token_id=special_ids["bos"],
            eos_token_id=special_ids["eos"],
        ),
        image_token_index=special_ids["image"],
        vocab_size=vocab_size,
        projection_dim=hidden_size,
        hidden_size=hidden_size,
    )


def tiny_smolvlm(
    vocab_size: int,
    image_size: tuple[int, int],
    special_ids: dict[str, int],
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 128,
    patch_size: int = 8,
    scale_factor: int = 2,
    model_type: str = "smolvlm",
) -> SmolVLMConfig | Idefics3Config:
    """A SmolVLM (``model_type`` "smolvlm", SmolVLM2's classes) or Idefics3 ("idefics3", SmolVLM's) config small enough
    for a CPU: a SigLIP vision tower and a Llama-style text model (SmolLM2's architecture; one key/value head) of
    ``num_layers`` layers of width ``hidden_size``, square images of the env's size in ``patch_size`` patches, and the
    connector's pixel shuffle by ``scale_factor`` (``(side / patch_size / scale_factor) ** 2`` image tokens). The LM
    head is not tied to the embedding (SmolVLM2-500M's is not)."""
    config_class = SmolVLMConfig if model_type == "smolvlm" else Idefics3Config
    return config_class(
        vision_config=dict(
            model_type=f"{model_type}_vision",
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            image_size=image_size[0],
            patch_size=patch_size,
        ),
        text_config=dict(
            model_type="llama",
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=1,
            head_dim=hidden_size // num_heads,
            vocab_size=vocab_size,
            pad_token_id=special_ids["pad"],
            bos_token_id=special_ids["bos"],
            eos_token_id=special_ids["eos"],
            tie_word_embeddings=False,
        ),
        image_token_id=special_ids["image"],
        scale_factor=scale_factor,
        tie_word_embeddings=False,
    )


def mlp(in_dim: int, hidden: int, out_dim: int, out_std: float) -> nn.Sequential:
    last = nn.Linear(hidden, out_dim)
    nn.init.orthogonal_(last.weight, out_std)
    nn.init.zeros_(last.bias)
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), last)


class ActionHead(nn.Module):
    """The trainable pieces that shape the action distribution besides the adapters: a query per action slot (added
    to the ``<act>`` placeholder's embedding; zero at build), the state token's projection, and the bins head's
    delta on the action tokens' LM-head rows or the Gaussian head's mean MLP and log-std."""

    def __init__(self, config: VLAConfig, hidden: int):
        super().__init__()
        slots = config.action_chunk * config.action_dim
        self.queries = nn.Parameter(torch.zeros(slots, hidden))
        self.state_proj = nn.Linear(config.state_dim, hidden) if config.state_dim else None
        self.token_delta = self.mean = self.log_std = None
        if config.action_head == "bins":
            if config.train_action_tokens:
                self.token_delta = nn.Parameter(torch.zeros(config.action_bins, hidden))
        else:
            self.mean = mlp(hidden, config.head_hidden, 1, out_std=0.01)
            self.log_std = nn.Parameter(torch.full((slots,), float(config.init_logstd)))


class HFVLAPolicy(nn.Module):
    """A vision-language model with LoRA adapters and action/value heads; the trainers' policy contract:
    ``forward(obs) -> (dist, value)``, ``dist(obs)``, ``get_value(obs) -> [B]``, ``env_action(raw)``, plus
    ``reference_dist(obs)`` (adapters off, heads as built) and ``save_pretrained(path)``.

    ``obs``: a TensorDict with every camera of ``config.cameras`` (uint8 [B, 3, H, W] each; ``"rgb"`` by default),
    ``"instruction"`` (byte tokens, ``shared.language``) unless ``config.instruction`` fixes it, and ``"state"``
    (float [B, S]) when ``config.state_dim``.
    """

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        config: VLAConfig,
        lora: dict[str, Any],
        statistics: DatasetStatistics | None = None,
        gradient_checkpointing: bool = False,
    ):
        """``config.action_tokens`` None builds the ``bin_tokens`` map (this module's tokenizer) into it; ``statistics``
        None decodes over the env's bounds (``DatasetStatistics.env_bounds``); ``gradient_checkpointing``: see
        `enable_gradient_checkpointing`. A one-line ValueError when the action-token map does not fit this tokenizer
        and LM head, or the statistics this env."""
        super().__init__()
        self.config, self.tokenizer = config, tokenizer
        self.model_type = config.model_type
        model_type = backbone.config.model_type
        family = FAMILIES.get(model_type)
        if family is None:
            raise ValueError(f"the backbone's model_type {model_type!r} is none of {', '.join(FAMILIES)}")
        self.family = family
        if family.forward == "idefics3":
            attention = backbone.model.text_model.config._attn_implementation or ""
            if "flash" in attention:
                raise ValueError(
                    f"attention implementation {attention!r} takes no 4D mask, which {model_type}'s bidirectional "
                    "attention here needs (sdpa or eager)"
                )
        lora_config = LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            target_modules=lora["targets"],
            lora_dropout=0.0,
            bias="none",
            exclude_modules=UNUSED_MODULES,
        )
        with quiet():
            self.vlm = get_peft_model(backbone, lora_config)  # freezes every base parameter
        text = self.backbone.config.get_text_config()
        hidden = text.hidden_size
        self.vocab_size, self.num_slots = text.vocab_size, config.action_chunk * config.action_dim
        self.softcap = getattr(text, "final_logit_softcapping", None)
        self.action_head = ActionHead(config, hidden)
        self.reference_head = copy.deepcopy(self.action_head).requires_grad_(False)  # the heads as built
        self.value_head = mlp(hidden, config.head_hidden, 1, out_std=1.0)
        self.action_shape = config.action_shape
        self.bins = config.action_bins if config.action_head == "bins" else 0
        self.token_map: ActionTokenMap | None = None
        if self.bins:
            lm_rows = self.backbone.get_output_embeddings().weight.shape[0]
            if config.action_tokens is None:
                self.token_map = build_action_token_map("bin_tokens", tokenizer, lm_rows, self.bins)
                config.action_tokens = self.token_map.to_dict()
            else:
                self.token_map = ActionTokenMap.from_dict(config.action_tokens)
                if self.token_map.num_bins != self.bins:
                    raise ValueError(f"action tokens: {self.token_map.num_bins} ids for {self.bins} bins")
                self.token_map.check(tokenizer, lm_rows)
            self.register_buffer("action_token_ids", torch.tensor(self.token_map.ids), persistent=False)
            self.register_buffer("bin_values", torch.tensor(self.token_map.values), persistent=False)
            self.register_buffer("bin_edges", torch.tensor(self.token_map.edges), persistent=False)
        if statistics is None:
            statistics = DatasetStatistics.env_bounds(config.action_low, config.action_high, config.state_dim)
        self.set_statistics(statistics)
        act = tokenizer.convert_tokens_to_ids("<act>")
        self.act_id = act if isinstance(act, int) and act != tokenizer.unk_token_id else self._pad_id()
        for name, markers in (("image_start_ids", family.image_start), ("image_end_ids", family.image_end)):
            ids = tokenizer.convert_tokens_to_ids(list(markers))
            missing = [m for m, i in zip(markers, ids) if not isinstance(i, int) or i == tokenizer.unk_token_id]
            if missing:
                raise ValueError(f"the tokenizer has no {missing[0]}, which {model_type} puts around images")
            self.register_buffer(name, torch.tensor(ids, dtype=torch.long), persistent=False)
        self.prompts = PromptCache(tokenizer, config.prompt_format + config.prompt_suffix)
        self._fixed_prompt = self.prompts.texts([config.instruction]) if config.instruction is not None else None
        vision = self.backbone.config.vision_config
        self.vision_size = (vision.image_size, vision.image_size)
        if gradient_checkpointing:
            self.enable_gradient_checkpointing()

    def layers(self) -> list[nn.Module]:
        """The backbone's transformer layers, the vision tower's and the language model's (transformers'
        ``GradientCheckpointingLayer`` blocks: SigLIP's encoder layers, Gemma's or SmolLM2's decoder layers)."""
        return [m for m in self.backbone.modules() if isinstance(m, GradientCheckpointingLayer)]

    def fsdp_units(self) -> list[nn.Module]:
        """What ppo_vla_ddp --fsdp shards one by one before the rest: each transformer layer (`layers`), so a
        training forward gathers one layer's adapters at a time."""
        return self.layers()

    def enable_gradient_checkpointing(self) -> None:
        """transformers' non-reentrant gradient checkpointing of every layer (`layers`): a training forward keeps
        each layer's input only and the backward recomputes the rest, for less memory and the same loss and
        gradients. transformers checkpoints a layer in training mode only, so the layers alone are put in it: their
        submodules (attention dropout, if a checkpoint has any) stay in eval mode, and a forward without gradients
        (the rollout) runs as before."""
        backbone, options = self.backbone, {"use_reentrant": False}
        with quiet():  # (transformers 5.x: activation_*, before: gradient_checkpointing_*)
            if hasattr(backbone, "activation_checkpointing_enable"):
                backbone.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
            else:
                backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        if getattr(backbone, "_require_grads_hook", None) is not None:  # (the embeddings' hook that transformers
            backbone.disable_input_require_grads()  # adds with it: reentrant checkpointing needs it, this does not)
        for layer in self.layers():
            layer.training = True

    def set_statistics(self, statistics: DatasetStatistics) -> None:
        """Decode actions and normalise the state with ``statistics`` from now on (what ``save_pretrained`` writes to
        ``dataset_statistics.json``); a one-line ValueError when they do not fit the action and state sizes."""
        config = self.config
        statistics.check(config.action_dim, config.state_dim, "dataset statistics")
        self.statistics = statistics
        device = self.value_head[0].weight.device
        for name, value in statistics.action.tensors().items():  # offset, scale (0: no spread), tie, zero
            self.register_buffer(f"action_{name}", value.expand(self.action_shape).clone().to(device), persistent=False)
        self._state_identity = config.state_dim == 0 or statistics.state.normalization == "none"
        if config.state_dim:
            for name, value in statistics.state.tensors().items():
                self.register_buffer(f"state_{name}", value.to(device), persistent=False)
        self._state_clip = config.state_dim > 0 and statistics.state.clips

    def _norm(self, part: str) -> dict[str, torch.Tensor]:
        return {k: getattr(self, f"{part}_{k}") for k in ("offset", "scale", "tie", "zero")}

    @property
    def backbone(self) -> nn.Module:
        """The transformers model inside the peft wrapper (its LoRA layers active unless disabled)."""
        return self.vlm.get_base_model()

    def _pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    # ---- the forward pass -----------------------------------------------------------------------------------
    def _prompt(self, obs: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fixed_prompt is None or INSTRUCTION_KEY in obs.keys():
            return self.prompts(obs[INSTRUCTION_KEY])
        ids, mask = (t.to(obs[self.config.cameras[0]].device) for t in self._fixed_prompt)
        n = obs.shape[0]
        return ids.expand(n, -1), mask.expand(n, -1)

    def features(self, obs: TensorDict, head: ActionHead) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden states at the action slots [B, K*D, H] and their mean over the sequence [B, H]."""
        model = self.backbone.model  # the family's base model: vision tower, projector or connector, language model
        embed = model.get_input_embeddings()
        dtype = embed.weight.dtype
        image = self.image_tokens(obs, dtype)
        ids, mask = self._prompt(obs)
        batch = ids.shape[0]
        parts, masks = [image], [torch.ones(image.shape[:2], dtype=mask.dtype, device=mask.device)]
        if head.state_proj is not None:
            parts.append(head.state_proj(self.normalize_state(obs["state"])).to(dtype)[:, None])
            masks.append(torch.ones((batch, 1), dtype=mask.dtype, device=mask.device))
        slots = embed(torch.full((batch, self.num_slots), self.act_id, device=ids.device)) + head.queries.to(dtype)
        parts += [embed(ids), slots]
        masks += [mask, torch.ones((batch, self.num_slots), dtype=mask.dtype, device=mask.device)]
        attention_mask = torch.cat(masks, 1)
        hidden = self.language_model(torch.cat(parts, 1), attention_mask)
        valid = attention_mask.bool()[..., None]
        pooled = torch.where(valid, hidden, 0.0).sum(1) / valid.sum(1)
        # contiguous: a strided input lets CPU matmuls round differently for equal weights at other addresses
        return hidden[:, -self.num_slots :].contiguous(), pooled

    def image_tokens(self, obs: TensorDict, dtype: torch.dtype) -> torch.Tensor:
        """The image tokens [B, C*T, H] of the C cameras (``config.cameras``, T tokens each), camera after camera.

        PaliGemma, as it lays out C images of a sample: the vision tower reads ``pixel_values`` [B*C, 3, h, w] (a
        sample's images one after the other) and its ``C * T`` ``<image>`` tokens take their features in that order.
        Idefics3 / SmolVLM: one global image per camera, no tiles (what SmolVLA feeds it): SigLIP's last hidden state
        through the connector (pixel shuffle by ``scale_factor``, a linear map; the model's own ``image_seq_len``
        tokens), between the embeddings of the processor's markers (``<fake_token_around_image> <global-img>`` ...
        ``<fake_token_around_image>``): what the model's forward computes for ``input_ids`` with those markers around
        ``image_seq_len`` ``<image>`` tokens (tested), without its host sync over which images are padding."""
        cameras = self.config.cameras
        images = obs[cameras[0]] if len(cameras) == 1 else torch.stack([obs[key] for key in cameras], 1).flatten(0, 1)
        pixels, model = self.pixels(images, dtype), self.backbone.model
        if self.family.forward == "paligemma":
            tokens = model.get_image_features(pixel_values=pixels).pooler_output
        else:
            tokens = model.connector(model.vision_model(pixel_values=pixels).last_hidden_state)
            embed = model.get_input_embeddings()
            start, end = (embed(ids).to(tokens.dtype)[None].expand(tokens.shape[0], -1, -1)
                          for ids in (self.image_start_ids, self.image_end_ids))  # fmt: skip
            tokens = torch.cat([start, tokens, end], 1)
        tokens = tokens.to(dtype)
        return tokens.reshape(-1, len(cameras) * tokens.shape[1], tokens.shape[2])

    def language_model(self, embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The language model's last hidden states [B, L, H] over ``embeds`` [B, L, H], with bidirectional attention
        among the tokens ``attention_mask`` [B, L] keeps, positions numbered from it (so left padding changes
        nothing)."""
        model = self.backbone.model
        if self.family.forward == "paligemma":
            return model(
                inputs_embeds=embeds,
                attention_mask=attention_mask,
                position_ids=attention_mask.cumsum(-1),  # 1-based like PaliGemma's, unchanged by the left padding
                token_type_ids=torch.zeros_like(attention_mask),  # all prefix: bidirectional attention
                use_cache=False,
            ).last_hidden_state
        # Idefics3 / SmolVLM: SmolLM2 is causal; a 4D mask that lets every token see every kept token, in the form
        # the model's attention implementation takes (transformers passes a 4D mask through as it is)
        text = model.text_model
        mask = create_bidirectional_mask(text.config, embeds, attention_mask, allow_is_bidirectional_skip=False)
        if len(getattr(mask, "shape", ())) != 4:
            raise RuntimeError(
                f"examples.hf_vla: attention implementation {text.config._attn_implementation!r} takes no 4D mask, "
                "which the bidirectional attention needs (use sdpa or eager)"
            )
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # 0-based like Llama's
        out = text(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False)
        return out.last_hidden_state

    def pixels(self, rgb: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """uint8 images [B, 3, H, W] -> the vision tower's input: resized to its size as the family's processor does
        (transformers' SigLIP processor: antialiased bicubic on the 8-bit image, rounded back to 8 bits), then
        ``(x / 255 - mean) / std`` per channel."""
        config = self.config
        if tuple(rgb.shape[-2:]) != self.vision_size:  # a real checkpoint's resolution (e.g. 224)
            mode = config.image_resample
            smooth = mode in ("bilinear", "bicubic")
            rgb = F.interpolate(rgb.float(), size=self.vision_size, mode=mode, antialias=smooth,
                                **({"align_corners": False} if smooth else {}))  # fmt: skip
            rgb = rgb.clamp(0, 255).round()
        x = rgb.to(dtype) / 255.0
        mean, std = config.image_mean, config.image_std
        if len(set(mean)) == 1 and len(set(std)) == 1:  # one number for every channel (SigLIP's 0.5, 0.5)
            return (x - mean[0]) / std[0]
        shape = (1, len(mean), 1, 1)
        return (x - torch.tensor(mean, dtype=dtype, device=x.device).view(shape)) / torch.tensor(
            std, dtype=dtype, device=x.device
        ).view(shape)

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        """The env's state -> the state token's input (float32): normalised with the dataset statistics."""
        state = state.float()
        if self._state_identity:
            return state
        return Normalizer.normalise(state, self._norm("state"), self._state_clip)

    def _dist(self, slots: torch.Tensor, head: ActionHead) -> torch.distributions.Distribution:
        batch = slots.shape[0]
        if self.bins:  # logits over the action tokens (the map's ids) through the LM head, in float32
            rows = self.backbone.get_output_embeddings().weight.index_select(0, self.action_token_ids).float()
            if head.token_delta is not None:
                rows = rows + head.token_delta.float()
            with torch.autocast(slots.device.type, enabled=False):
                logits = F.linear(slots.float(), rows)
                if self.softcap:
                    logits = torch.tanh(logits / self.softcap) * self.softcap
            return Bins(logits.view(batch, *self.action_shape, self.bins))
        mean = head.mean(slots.float()).squeeze(-1).float()  # (float32 also under bf16 autocast)
        std = head.log_std.exp().expand_as(mean)
        shape = (batch, *self.action_shape)
        # the head's normalised Gaussian in the env's units (an affine map of a Normal is a Normal); a dimension with
        # no spread keeps scale 1 here (a Normal needs std > 0) and is set to its statistic in env_action
        scale = torch.where(self.action_scale == 0, 1.0, self.action_scale)
        mean = self.action_offset + scale * mean.view(shape)
        std = scale * std.reshape(shape)
        return torch.distributions.Normal(mean, std, validate_args=False)

    def forward(self, obs: TensorDict) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        """The action distribution and V(obs) [B] from one pass through the backbone."""
        slots, pooled = self.features(obs, self.action_head)
        return self._dist(slots, self.action_head), self.value_head(pooled.float()).squeeze(-1).float()

    def dist(self, obs: TensorDict) -> torch.distributions.Distribution:
        return self._dist(self.features(obs, self.action_head)[0], self.action_head)

    def get_value(self, obs: TensorDict) -> torch.Tensor:
        return self.value_head(self.features(obs, self.action_head)[1].float()).squeeze(-1).float()

    def reference_dist(self, obs: TensorDict) -> torch.distributions.Distribution:
        """The policy as built: adapters disabled, the heads' frozen copy (GRPO's KL reference)."""
        with self.vlm.disable_adapter():
            return self._dist(self.features(obs, self.reference_head)[0], self.reference_head)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """A bin index -> its normalised value (the map's ``values``) in the env's units (the statistics); a Gaussian
        sample as it is (the env clips); a dimension whose statistics have no spread -> that statistic, whatever was
        sampled (``Normalizer.tensors``); then the gripper post-processing the statistics name, if any."""
        if self.bins:
            action = self.action_offset + self.action_scale * self.bin_values[action.long()]
        else:
            action = torch.where(self.action_scale == 0, self.action_offset, action)
        return self.statistics.gripper.apply(action)

    def action_bins(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions [..., *action_shape] -> their bins (float indices, as ``Bins`` samples): normalised with the
        statistics, clipped to [-1, 1], and counted against the map's edges (behaviour cloning's targets)."""
        normalised = Normalizer.normalise(action, self._norm("action"), clip=True)
        return torch.bucketize(normalised.contiguous(), self.bin_edges, right=True).float()

    # ---- what trains, and saving ------------------------------------------------------------------------------
    def value_parameters(self) -> list[nn.Parameter]:
        """The value head's parameters (what a PPO trainer's --critic-warmup-iterations trains alone)."""
        return list(self.value_head.parameters())

    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        """The parameters that train (adapters and heads), by their ``named_parameters`` name."""
        return {name: p for name, p in self.named_parameters() if p.requires_grad}

    def merged_backbone_state_dict(self) -> dict[str, torch.Tensor]:
        """The backbone's state dict with the adapters (and the bins head's token delta) merged into its weights,
        under the plain model's names; only the merged matrices are new tensors, the others are the live ones."""
        backbone = self.backbone
        state = {k.replace(".base_layer", ""): v for k, v in backbone.state_dict().items() if "lora_" not in k}
        for name, module in backbone.named_modules():
            if isinstance(module, LoraLayer) and module.active_adapters:
                weight = module.get_base_layer().weight
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                state[f"{name}.weight"] = (weight.float() + delta.float()).to(weight.dtype)
        delta = self.action_head.token_delta
        if self.bins and delta is not None:
            head = backbone.get_output_embeddings().weight
            merged = head.detach().clone()
            ids = self.action_token_ids
            merged[ids] = (head[ids].float() + delta.detach().float()).to(head.dtype)
            for key, value in list(state.items()):
                if value is head or (value.data_ptr() == head.data_ptr() and value.shape == head.shape):
                    state[key] = merged  # the LM head and the input embedding it is tied to
        return state

    @torch.no_grad()
    def save_pretrained(self, path: str | Path) -> None:
        """Write a directory that ``make_policy(..., model_path=path)`` loads: the backbone with the adapters merged
        (transformers' ``save_pretrained``, in the backbone's dtype), the tokenizer, the heads (``heads.safetensors``),
        ``vla_config.json`` (with the action-token map) and ``dataset_statistics.json``. The heads file has no token
        delta (merged into the LM head) and no reference copy (a loaded policy's reference is the loaded policy)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with quiet():
            self.backbone.save_pretrained(path, state_dict=self.merged_backbone_state_dict())
        self.tokenizer.save_pretrained(path)
        heads = {f"action_head.{k}": v for k, v in self.action_head.state_dict().items() if k != "token_delta"}
        heads.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        save_file({k: v.detach().contiguous().cpu() for k, v in heads.items()}, str(path / HEADS_FILE))
        (path / VLA_CONFIG).write_text(json.dumps(asdict(self.config), indent=2) + "\n")
        self.statistics.save(path)

    def load_heads(self, path: str | Path) -> None:
        """The heads ``save_pretrained`` wrote (and the reference copy set to them)."""
        heads = load_file(str(Path(path) / HEADS_FILE))
        action = {k.removeprefix("action_head."): v for k, v in heads.items() if k.startswith("action_head.")}
        if self.action_head.token_delta is not None:
            action["token_delta"] = torch.zeros_like(self.action_head.token_delta)
        self.action_head.load_state_dict(action)
        self.reference_head.load_state_dict(action)
        self.value_head.load_state_dict(
            {k.removeprefix("value_head."): v for k, v in heads.items() if k.startswith("value_head.")}
        )


# ---- the factory ------------------------------------------------------------------------------------------------
ARCHITECTURE_KWARGS = ("model_type", "hidden_size", "num_layers", "num_heads", "intermediate_size", "patch_size",
                       "scale_factor", "tokenizer_corpus")  # fmt: skip
PATCH_SIZE = {"paligemma": 16, "smolvlm": 8, "idefics3": 8}  # a fresh model's default patch size
HEAD_KWARGS = ("prompt_format", "instruction", "head_hidden", "init_logstd", "train_action_tokens", "action_tokens",
               "cameras")  # fmt: skip
RUN_KWARGS = ("model_path", "lora_rank", "lora_alpha", "lora_targets", "dtype", "init_seed", "start_logstd",
              "gradient_checkpointing")  # fmt: skip
STATS_KWARGS = ("action_stats", "unnorm_key")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ENV_BOUNDS = "env_bounds"
"""``action_stats`` value: decode actions over the env's bounds and feed the state unnormalised (no data)"""


def _check_kwargs(kwargs: dict[str, Any]) -> None:
    known = ARCHITECTURE_KWARGS + HEAD_KWARGS + RUN_KWARGS + STATS_KWARGS
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        fail(f"--policy-kwargs: unknown key(s) {unknown} for examples.hf_vla (allowed: {', '.join(known)})")
    model_type = kwargs.get("model_type", "paligemma")
    if model_type not in FAMILIES:
        fail(f"--policy-kwargs: model_type must be one of {', '.join(FAMILIES)}, got {model_type!r}")
    if "scale_factor" in kwargs and FAMILIES[model_type].forward != "idefics3":
        fail(f"--policy-kwargs: scale_factor is the smolvlm connector's pixel shuffle; model_type is {model_type}")
    ints = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "patch_size", "scale_factor", "head_hidden",
            "lora_rank")  # fmt: skip
    for name in ints:
        value = kwargs.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(f"--policy-kwargs: {name} must be a positive integer, got {value!r}")
    seed = kwargs.get("init_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        fail(f"--policy-kwargs: init_seed must be an integer >= 0, got {seed!r}")
    for name in ("lora_alpha", "init_logstd", "start_logstd"):
        value = kwargs.get(name, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(f"--policy-kwargs: {name} must be a number, got {value!r}")
    if kwargs.get("dtype", "float32") not in DTYPES:
        fail(f"--policy-kwargs: dtype must be one of {', '.join(DTYPES)}, got {kwargs['dtype']!r}")
    fmt = kwargs.get("prompt_format", "{instruction}")
    if not isinstance(fmt, str) or "{instruction}" not in fmt:
        fail(f"--policy-kwargs: prompt_format must be a string holding '{{instruction}}', got {fmt!r}")
    for name in ("model_path", "instruction", "action_stats", "unnorm_key"):
        if kwargs.get(name) is not None and not isinstance(kwargs[name], str):
            fail(f"--policy-kwargs: {name} must be a string, got {kwargs[name]!r}")
    if kwargs.get("action_tokens", CONVENTIONS[0]) not in CONVENTIONS:
        fail(f"--policy-kwargs: action_tokens must be one of {', '.join(CONVENTIONS)}, got {kwargs['action_tokens']!r}")
    targets = kwargs.get("lora_targets", DEFAULT_LORA_TARGETS)
    if not (
        isinstance(targets, str) or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        fail(
            "--policy-kwargs: lora_targets must be a regex string, 'all-linear' or a list of module names, "
            f"got {targets!r}"
        )
    corpus = kwargs.get("tokenizer_corpus", [""])
    if not (isinstance(corpus, list) and corpus and all(isinstance(t, str) for t in corpus)):
        fail(f"--policy-kwargs: tokenizer_corpus must be a non-empty list of instructions, got {corpus!r}")
    for name in ("train_action_tokens", "gradient_checkpointing"):
        if not isinstance(kwargs.get(name, True), bool):
            fail(f"--policy-kwargs: {name} must be true or false, got {kwargs[name]!r}")


def _env_config(
    obs_space: gym.Space, act_space: gym.Space, args, instruction: str | None, cameras: list[str] | None = None
) -> dict[str, Any]:
    """What the env and the trainer's flags fix: action head, bins, chunk, dim, bounds, image size, the cameras (the
    image entries: ``cameras`` in its order, by default all of them in sorted order), state size."""
    spaces = obs_space.spaces if isinstance(obs_space, gym.spaces.Dict) else {}
    images = sorted(key for key, space in spaces.items() if is_image(space))
    if not images or any(spaces[key].shape[0] != 3 for key in images):
        fail(
            'examples.hf_vla needs observations with uint8 [3, H, W] images (e.g. "rgb"), the env gives '
            f'{obs_space} (e.g. --env-id PushCubeLangRL --env-kwargs \'{{"obs_mode": "rgb"}}\')'
        )
    named = isinstance(cameras, list) and all(isinstance(c, str) for c in cameras)
    if cameras is not None and not (named and sorted(cameras) == images):
        fail(
            f"--policy-kwargs: cameras must list the env's image entries {images} each once, in the order of their "
            f"image tokens; got {cameras!r}"
        )
    sizes = sorted({tuple(spaces[key].shape[1:]) for key in images})
    if len(sizes) > 1:
        fail(f"examples.hf_vla needs its cameras' images of one size, the env's {images} are {sizes} (H, W)")
    if INSTRUCTION_KEY in spaces and not is_instruction_space(spaces[INSTRUCTION_KEY]):
        fail(
            f"examples.hf_vla: the observation's {INSTRUCTION_KEY!r} entry is not instruction tokens (shared.language)"
        )
    if INSTRUCTION_KEY not in spaces and instruction is None:
        fail(
            "examples.hf_vla: the env's observations hold no instruction; name one with --policy-kwargs "
            '\'{"instruction": "push the cube to the goal"}\' (or use a language task such as PushCubeLangRL)'
        )
    extra = sorted(set(spaces) - {*images, "state", INSTRUCTION_KEY, PRIVILEGED_KEY})  # (privileged: a critic's)
    if extra:
        fail(f"examples.hf_vla reads the observation's images, state and instruction; the env also gives {extra}")
    state = spaces.get("state")
    if state is not None and len(state.shape) != 1:
        fail(f'examples.hf_vla: the "state" entry must be a vector, got shape {state.shape}')
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) not in (1, 2):
        fail(f"examples.hf_vla needs a Box action space [D] or [K, D] (--action-chunk), got {act_space}")
    head = getattr(args, "action_head", "gaussian")
    bins = int(getattr(args, "action_bins", 256))
    if head == "bins" and bins < 2:
        fail(f"--action-bins must be >= 2, got {bins}")
    chunk = act_space.shape[0] if len(act_space.shape) == 2 else 1
    low, high = act_space.low.reshape(-1, act_space.shape[-1]), act_space.high.reshape(-1, act_space.shape[-1])
    return {
        "action_head": head,
        "action_bins": bins,
        "action_chunk": chunk,
        "action_dim": act_space.shape[-1],
        "action_low": [float(x) for x in low[0]],
        "action_high": [float(x) for x in high[0]],
        "image_size": sizes[0],
        "cameras": list(cameras) if cameras is not None else images,
        "state_dim": int(state.shape[0]) if state is not None else 0,
    }


def _describe(config: dict[str, Any]) -> str:
    """What a config.json says its model is, in a few words."""
    if config.get("model_type") is not None:
        return f"model_type {config['model_type']!r}"
    if "type" in config:  # LeRobot's policy configs: {"type": "smolvla", ...}
        return f"a LeRobot policy of type {config['type']!r} (no transformers model_type)"
    if config.get("architectures"):
        return f"architectures {config['architectures']} but no model_type"
    return "no model_type"


def load_backbone(
    model_path: str, dtype: torch.dtype | str | None = None
) -> tuple[nn.Module, Any, dict[str, Any] | None]:
    """``(model, tokenizer, vla_config or None)`` from a local directory: a ``save_pretrained`` VLA (with
    ``vla_config.json``) or a transformers checkpoint of a supported family (``FAMILIES``) with its tokenizer. The
    weights keep the checkpoint's dtype unless ``dtype`` names one."""
    path = Path(model_path)
    if not (path / "config.json").is_file():
        fail(
            f"--policy-kwargs model_path {model_path!r}: not a directory holding config.json (a VLA written by "
            "save_pretrained, or a local transformers checkpoint such as PaliGemma's or SmolVLM's)"
        )
    vla = json.loads((path / VLA_CONFIG).read_text()) if (path / VLA_CONFIG).is_file() else None
    try:
        described = json.loads((path / "config.json").read_text())
    except ValueError:
        fail(f"--policy-kwargs model_path {model_path!r}: its config.json is not JSON")
    model_type = described.get("model_type") if isinstance(described, dict) else None
    if model_type not in FAMILIES:
        supported = ", ".join(f"{name} ({family.model_class.__name__})" for name, family in FAMILIES.items())
        fail(
            f"--policy-kwargs model_path {model_path!r}: its config.json says "
            f"{_describe(described if isinstance(described, dict) else {})}; examples.hf_vla loads the transformers "
            f"families {supported} and the VLAs it saved"
        )
    try:
        with quiet():
            model = FAMILIES[model_type].model_class.from_pretrained(path, dtype=dtype if dtype is not None else "auto")
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(f"--policy-kwargs model_path {model_path!r}: cannot load it ({first})")
    return model, tokenizer, vla


def _image_processing(path: Path, family: Family) -> dict[str, Any]:
    """The image's resampling and normalisation: the checkpoint's ``preprocessor_config.json`` where it says, else
    the family's."""
    out = {"image_resample": family.image_resample, "image_mean": list(family.image_mean),
           "image_std": list(family.image_std)}  # fmt: skip
    file = path / "preprocessor_config.json"
    if file.is_file():
        pre = json.loads(file.read_text())
        if pre.get("resample") in RESAMPLE:
            out["image_resample"] = RESAMPLE[pre["resample"]]
        for key in ("image_mean", "image_std"):
            value = pre.get(key)
            if isinstance(value, (int, float)):
                value = [value] * 3
            if isinstance(value, list) and len(value) == 3:
                out[key] = [float(v) for v in value]
    return out


def _statistics(kwargs: dict[str, Any], env: dict[str, Any], config: VLAConfig) -> DatasetStatistics:
    """The dataset statistics: ``action_stats`` "env_bounds" (or a fresh build without it): the env's bounds; a
    path: that file; else the model directory's ``dataset_statistics.json``, refused in one line when absent."""
    choice, model_path = kwargs.get("action_stats"), kwargs.get("model_path")
    if choice == ENV_BOUNDS or (choice is None and model_path is None):
        if config.action_head == "bins":
            low, high = np.array(env["action_low"]), np.array(env["action_high"])
            if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
                fail(
                    "--action-head bins needs a bounded action space or dataset statistics (--policy-kwargs "
                    f"action_stats), this env's bounds are {env['action_low']}..{env['action_high']} (or use "
                    "--action-head gaussian)"
                )
        return DatasetStatistics.env_bounds(env["action_low"], env["action_high"], env["state_dim"])
    path = Path(choice) if choice is not None else Path(model_path) / STATS_FILE
    if not path.is_file():
        if choice is not None:
            fail(f"--policy-kwargs action_stats {choice!r}: no such file (or {ENV_BOUNDS!r})")
        fail(
            f"--policy-kwargs model_path {model_path!r} has no {STATS_FILE} (the statistics its actions are decoded "
            "and its state normalised with; bc.py writes it); name a file with action_stats, or decode over the "
            f'env\'s action bounds with --policy-kwargs \'{{"action_stats": "{ENV_BOUNDS}"}}\''
        )
    try:
        statistics = DatasetStatistics.load(path, kwargs.get("unnorm_key"))
        statistics.check(env["action_dim"], env["state_dim"], str(path))
    except ValueError as e:
        fail(f"--policy-kwargs: {e}")
    return statistics


def make_policy(obs_space: gym.Space, act_space: gym.Space, args, **kwargs) -> HFVLAPolicy:
    """``--policy examples.hf_vla:make_policy``: a fresh tiny model of family ``model_type`` (``"paligemma"``, random
    weights from ``tiny_paligemma``; ``"smolvlm"`` or ``"idefics3"``, from ``tiny_smolvlm``) with a tokenizer from
    ``build_tokenizer``, or the model at ``model_path`` (a VLA this module saved, or a transformers checkpoint of a
    family in ``FAMILIES``), with LoRA adapters and heads for this env's spaces and the trainer's
    ``--action-head/--action-bins/--action-chunk``. ``--policy-kwargs`` keys (docs/VLA.md): architecture
    (``model_type``, ``hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``, ``patch_size``,
    ``scale_factor``; ``tokenizer_corpus``: the instructions the fresh tokenizer learns its words from, default
    ``default_corpus``; fresh builds only),
    heads (``prompt_format``, ``instruction``, ``head_hidden``, ``init_logstd``, ``train_action_tokens``,
    ``action_tokens``: the action-token convention, ``action_tokens.CONVENTIONS``; ``cameras``: the image entries in
    the order of their image tokens, default all of them sorted; all fixed by a saved VLA),
    statistics (``action_stats``: "env_bounds" or a statistics file, default the model directory's
    ``dataset_statistics.json``, refused when absent; ``unnorm_key``: its entry), and ``model_path``,
    ``lora_rank`` (16), ``lora_alpha`` (32), ``lora_targets`` ("all-linear", a regex or a list of module names),
    ``dtype`` of the frozen weights (float32, bfloat16; default float32 fresh, a checkpoint's own when loaded),
    ``init_seed`` (0: what is random at build, so every call builds the same policy), ``start_logstd`` (gaussian
    head: the log-std the policy and its reference start from, replacing the built or loaded one),
    ``gradient_checkpointing`` (false; true: `HFVLAPolicy.enable_gradient_checkpointing`, a run option that a saved
    VLA does not record)."""
    _check_kwargs(kwargs)
    if getattr(args, "norm_obs", False):
        fail("--policy examples.hf_vla:make_policy scales its images itself and has no obs_rms; drop --norm-obs")
    model_path = kwargs.get("model_path")
    lora = {
        "rank": kwargs.get("lora_rank", 16),
        "alpha": kwargs.get("lora_alpha", 32),
        "targets": kwargs.get("lora_targets", DEFAULT_LORA_TARGETS),
    }
    env = _env_config(obs_space, act_space, args, kwargs.get("instruction"), kwargs.get("cameras"))
    head_kwargs = {k: kwargs[k] for k in HEAD_KWARGS if k in kwargs}
    config_kwargs = {k: v for k, v in head_kwargs.items() if k not in ("action_tokens", "cameras")}  # (env has them)
    where = f"--policy-kwargs model_path {model_path!r}" if model_path else "examples.hf_vla"
    with torch.random.fork_rng(devices=[]):  # the build's random draws leave the trainer's streams alone
        torch.manual_seed(kwargs.get("init_seed", 0))
        saved = None
        if model_path is None:
            arch = {k: kwargs[k] for k in ARCHITECTURE_KWARGS if k in kwargs}
            model_type = arch.pop("model_type", "paligemma")
            texts = arch.pop("tokenizer_corpus", None)
            family = FAMILIES[model_type]
            config = VLAConfig(model_type=model_type, prompt_suffix=family.prompt_suffix,
                               image_resample=family.image_resample, image_mean=list(family.image_mean),
                               image_std=list(family.image_std), **env, **config_kwargs)  # fmt: skip
            corpus = default_corpus(config.prompt_format) if texts is None else [
                config.prompt_format.format(instruction=text) for text in texts]  # fmt: skip
            tokenizer = build_tokenizer(corpus, config.action_bins, family.markers)
            special = {n: tokenizer.convert_tokens_to_ids(f"<{n}>") for n in ("pad", "bos", "eos", "image")}
            size = config.image_size
            patch = arch.setdefault("patch_size", PATCH_SIZE[model_type])
            if size[0] != size[1] or size[0] % patch:
                fail(
                    f"examples.hf_vla: a fresh model needs square images whose side divides into {patch}-pixel "
                    f"patches, the env gives {size[0]}x{size[1]} (--env-kwargs image_size, or --policy-kwargs "
                    "patch_size)"
                )
            if arch.get("hidden_size", 64) % arch.get("num_heads", 4):
                fail("--policy-kwargs: hidden_size must be a multiple of num_heads")
            if family.forward == "paligemma":
                backbone = family.model_class(tiny_paligemma(len(tokenizer), size, special, **arch))
            else:
                scale = arch.get("scale_factor", 2)
                if (size[0] // patch) % scale:
                    fail(
                        f"examples.hf_vla: {model_type}'s connector shuffles {scale}x{scale} patches into one token, "
                        f"and {size[0]}x{size[0]} images make {size[0] // patch}x{size[0] // patch} patches of "
                        f"{patch} pixels (--policy-kwargs patch_size or scale_factor)"
                    )
                tiny = tiny_smolvlm(len(tokenizer), size, special, model_type=model_type, **arch)
                backbone = family.model_class(tiny)
            backbone = backbone.to(DTYPES[kwargs.get("dtype", "float32")])
            convention = kwargs.get("action_tokens", "bin_tokens")
        else:
            given = sorted(k for k in ARCHITECTURE_KWARGS if k in kwargs)
            if given:
                fail(f"--policy-kwargs: model_path {model_path!r} fixes the architecture; drop {given}")
            backbone, tokenizer, saved = load_backbone(model_path, DTYPES.get(kwargs.get("dtype")))
            family = FAMILIES[backbone.config.model_type]
            if saved is not None:
                config = _saved_config(saved, env, head_kwargs, model_path)
                convention = "bin_tokens"  # (a VLA saved before the map was written read its <bin_k> tokens)
            else:  # a base VLM: new heads, the family's action tokens, image processing and prompt suffix
                config = VLAConfig(
                    model_type=backbone.config.model_type,
                    prompt_suffix=family.prompt_suffix,
                    **_image_processing(Path(model_path), family),
                    **env,
                    **config_kwargs,
                )
                convention = kwargs.get("action_tokens", family.action_tokens)
        if config.action_head == "bins" and config.action_tokens is None:
            lm_rows = backbone.get_output_embeddings().weight.shape[0]
            try:
                token_map = build_action_token_map(convention, tokenizer, lm_rows, config.action_bins)
                config.action_tokens = token_map.to_dict()
            except ValueError as e:
                fail(f"{where}: {e}")
        statistics = _statistics(kwargs, env, config)
        backbone.eval()  # no dropout (the configs have none; a checkpoint's might)
        try:
            checkpointing = kwargs.get("gradient_checkpointing", False)
            policy = HFVLAPolicy(backbone, tokenizer, config, lora, statistics, gradient_checkpointing=checkpointing)
        except ValueError as e:
            fail(f"{where}: {e}")
        if saved is not None:
            policy.load_heads(model_path)
    if "start_logstd" in kwargs:  # the exploration noise RL starts from, in the policy and its reference alike
        if config.action_head != "gaussian":
            fail(
                f"--policy-kwargs: start_logstd sets the gaussian head's log-std; --action-head is {config.action_head}"
            )
        for head in (policy.action_head, policy.reference_head):
            head.log_std.data.fill_(float(kwargs["start_logstd"]))
    return policy


def _saved_config(saved: dict[str, Any], env: dict[str, Any], head_kwargs: dict, model_path: str) -> VLAConfig:
    """The saved VLA's config, checked against what this env and these flags need."""
    if head_kwargs:
        fail(f"--policy-kwargs: model_path {model_path!r} fixes the heads and prompt; drop {sorted(head_kwargs)}")
    saved = {"prompt_suffix": "", **saved}  # a VLA saved before the suffix was written prompted without one
    try:
        config = VLAConfig(**saved)
    except TypeError as e:
        fail(f"model_path {model_path!r}: {VLA_CONFIG} is not this module's ({e})")
    checks = [
        ("action_head", "--action-head"),
        ("action_chunk", "--action-chunk"),
        ("action_dim", "the env's action size"),
    ]
    if config.action_head == "bins":
        checks.append(("action_bins", "--action-bins"))
    if sorted(config.cameras) != sorted(env["cameras"]):
        fail(f"model_path {model_path!r} was saved for the cameras {config.cameras}, but the env's observation gives "
             f"the image entries {sorted(env['cameras'])}")  # fmt: skip
    checks += [("image_size", "the env's image size"), ("state_dim", "the env's state size")]
    for key, what in checks:
        have, want = getattr(config, key), env[key]
        if (tuple(have) if isinstance(have, (list, tuple)) else have) != want:
            fail(f"model_path {model_path!r} was saved with {key} {have!r}, but {what} gives {want!r}")
    if config.action_low != env["action_low"] or config.action_high != env["action_high"]:
        fail(f"model_path {model_path!r} was saved for action bounds {config.action_low}..{config.action_high}, "
             f"the env's are {env['action_low']}..{env['action_high']}")  # fmt: skip
    return config
