"""The VLA policy: a transformers vision-language model (PaliGemma: SigLIP + Gemma; SmolVLM / Idefics3: SigLIP, a
pixel-shuffle connector and a Llama-style SmolLM2) with LoRA adapters (peft), action heads on its last hidden state,
and a value head; the VLA trainers' ``--policy`` contract (docs/policies.md, docs/VLA.md). This module is the model:
``HFVLAPolicy`` (its forward pass, heads, action decoding and saving) and ``VLAConfig``; the model families it runs are
``families.py``'s, and ``make_policy`` (``factory.py``) builds it from the flags.

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
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging as hf_logging

from cleanrl_embodied.shared.language import INSTRUCTION_KEY
from examples.action_bins import Bins
from examples.hf_vla.action_tokens import ActionTokenMap, build_action_token_map
from examples.hf_vla.families import FAMILIES
from examples.hf_vla.statistics import DatasetStatistics, Normalizer
from examples.hf_vla.tokenizer import PromptCache

__all__ = ["HEADS_FILE", "VLA_CONFIG", "ActionHead", "HFVLAPolicy", "VLAConfig", "quiet"]

VLA_CONFIG = "vla_config.json"
HEADS_FILE = "heads.safetensors"
UNUSED_MODULES = r".*vision_tower\.head\..*"
"""Modules no action depends on, which get no adapters: SigLIP's attention-pooling head (PaliGemma reads the patch
embeddings, not the pooled one), whose adapters would never receive a gradient."""


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
