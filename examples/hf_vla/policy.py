"""The VLA policy: a transformers vision-language model (PaliGemma: SigLIP + Gemma) with LoRA adapters (peft), action
heads on its last hidden state, and a value head; the VLA trainers' ``--policy`` contract (docs/POLICIES.md,
docs/VLA.md).

One forward pass reads the sequence

    [image tokens (SigLIP patches, projected)] [state token, if the env gives "state"] [prompt] [K*D action slots]

with bidirectional attention over all of it (PaliGemma's prefix attention; OpenVLA-OFT's parallel decoding): the
action slots are ``<act>`` placeholder tokens plus a learned query per slot, and each slot's last hidden state gives
one action entry, independent of the others given the context. Heads (``--action-head``):

- ``bins``: the slot's logits over the LAST N vocabulary ids (the action tokens) through the base's own LM head:
  ``h @ (W[-N:] + delta).T``. ``delta`` [N, H] (zero at build, so the start is the base's head) trains the action
  tokens' rows, as a fine-tuned OpenVLA does (``train_action_tokens``; false keeps the LM head frozen as it is).
- ``gaussian``: a small MLP on the slot's hidden state gives the entry's mean, with a learned log-std per entry.
- value: an MLP on the mean of the last hidden states over the sequence (a critic sharing the backbone).

Only the LoRA adapters and the heads train (``requires_grad``); ``reference_dist`` is the policy with the adapters
disabled and the heads as built (a frozen copy of the small heads only, never of the backbone). ``save_pretrained``
writes the backbone with the adapters merged in, the tokenizer, the heads and ``vla_config.json``; a policy loaded
from there starts with fresh (zero-effect) adapters on that merged base.
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
from transformers import AutoTokenizer, PaliGemmaConfig, PaliGemmaForConditionalGeneration
from transformers.utils import logging as hf_logging

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, is_instruction_space
from examples.hf_vla.tokenizer import PromptCache, build_tokenizer, default_corpus

__all__ = ["Bins", "HFVLAPolicy", "VLAConfig", "load_backbone", "make_policy", "tiny_paligemma"]


class Bins(torch.distributions.Distribution):
    """Independent categoricals over the last dimension of ``logits`` ``[..., N]``: one per action entry.

    ``sample()`` and ``mode`` give bin indices ``[...]`` as float32 (what the trainers store); ``log_prob`` and
    ``entropy`` are per entry (the trainers sum them over the action). The log-probabilities are computed in
    float32 whatever the logits' dtype (bf16 under autocast)."""

    arg_constraints: dict = {}
    has_enumerate_support = False

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits.float(), -1)
        super().__init__(batch_shape=self.logits.shape[:-1], validate_args=False)

    @property
    def num_bins(self) -> int:
        return self.logits.shape[-1]

    def sample(self, sample_shape: tuple[int, ...] = (), generator: torch.Generator | None = None):
        """Bin indices drawn with the Gumbel-max trick (from ``generator`` if given, else torch's global stream)."""
        shape = torch.Size(sample_shape) + self.logits.shape
        uniform = torch.rand(shape, generator=generator, device=self.logits.device, dtype=self.logits.dtype)
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
        return (self.logits + gumbel).argmax(-1).float()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, value.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        return -(self.logits.exp() * self.logits).sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1).float()


def bin_bounds(space: gym.spaces.Box, num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounds ``(low, high)`` [*space.shape] that :func:`decode_bins` spreads ``num_bins`` bins over; a
    one-line ValueError when the action space is unbounded (bins need a finite range)."""
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ValueError(
            f"--action-head bins needs a bounded action space, this env's is {space} (use --action-head gaussian)"
        )
    if num_bins < 2:
        raise ValueError(f"--action-bins must be >= 2, got {num_bins}")
    return torch.as_tensor(space.low, dtype=torch.float32), torch.as_tensor(space.high, dtype=torch.float32)


def decode_bins(index: torch.Tensor, low: torch.Tensor, high: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Bin indices [..., *shape] -> the bins' centres: ``low + (index + 1/2) (high - low) / num_bins``, strictly
    inside [low, high] (the N bins split the range into N equal cells)."""
    return low + (index + 0.5) * ((high - low) / num_bins)


MODEL_CLASSES = {"paligemma": PaliGemmaForConditionalGeneration}
"""``model_type`` (config.json) -> the class that loads it; the policy's forward is written for these."""
VLA_CONFIG = "vla_config.json"
HEADS_FILE = "heads.safetensors"
DEFAULT_LORA_TARGETS = "all-linear"
r"""peft's every linear layer but the LM head: the vision tower's, the projector's and the language model's (OpenVLA's
LoRA choice). A regex selects fewer, e.g. r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"."""
SIGLIP_MEAN, SIGLIP_STD = 0.5, 0.5  # SigLIP's image normalization: [0, 1] -> [-1, 1]


@dataclass
class VLAConfig:
    """What the policy adds to its backbone; saved as ``vla_config.json`` beside the model."""

    model_type: str = "paligemma"  # the backbone's class (MODEL_CLASSES)
    action_head: str = "bins"  # "bins" or "gaussian"
    action_bins: int = 256  # N: action tokens, the last N ids of the vocabulary
    action_chunk: int = 1  # K actions per decision (the action is [K, D] when K > 1)
    action_dim: int = 7  # D
    action_low: list[float] = field(default_factory=list)  # per-step bounds [D] (bins decode inside them)
    action_high: list[float] = field(default_factory=list)
    image_size: tuple[int, int] = (64, 64)  # H, W of the env's "rgb" image
    state_dim: int = 0  # entries of the env's "state" (0: none; else one state token after the image)
    prompt_format: str = "{instruction}"  # e.g. "In: What action should the robot take to {instruction}?\nOut:"
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

    ``obs``: a TensorDict with ``"rgb"`` (uint8 [B, 3, H, W]), ``"instruction"`` (byte tokens, ``shared.language``)
    unless ``config.instruction`` fixes it, and ``"state"`` (float [B, S]) when ``config.state_dim``.
    """

    def __init__(self, backbone: nn.Module, tokenizer, config: VLAConfig, lora: dict[str, Any]):
        super().__init__()
        self.config, self.tokenizer = config, tokenizer
        self.model_type = config.model_type
        lora_config = LoraConfig(
            r=lora["rank"], lora_alpha=lora["alpha"], target_modules=lora["targets"], lora_dropout=0.0, bias="none"
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
        step_low = torch.tensor(config.action_low, dtype=torch.float32)
        step_high = torch.tensor(config.action_high, dtype=torch.float32)
        self.register_buffer("action_low", step_low.expand(self.action_shape).clone(), persistent=False)
        self.register_buffer("action_high", step_high.expand(self.action_shape).clone(), persistent=False)
        act = tokenizer.convert_tokens_to_ids("<act>")
        self.act_id = act if isinstance(act, int) and act != tokenizer.unk_token_id else self._pad_id()
        self.prompts = PromptCache(tokenizer, config.prompt_format)
        self._fixed_prompt = self.prompts.texts([config.instruction]) if config.instruction is not None else None
        vision = self.backbone.config.vision_config
        self.vision_size = (vision.image_size, vision.image_size)

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
        ids, mask = (t.to(obs["rgb"].device) for t in self._fixed_prompt)
        n = obs.shape[0]
        return ids.expand(n, -1), mask.expand(n, -1)

    def features(self, obs: TensorDict, head: ActionHead) -> tuple[torch.Tensor, torch.Tensor]:
        """The last hidden states at the action slots [B, K*D, H] and their mean over the sequence [B, H]."""
        model = self.backbone.model  # PaliGemmaModel: vision tower, projector, language model
        embed = model.get_input_embeddings()
        dtype = embed.weight.dtype
        pixels = (obs["rgb"].to(dtype) / 255.0 - SIGLIP_MEAN) / SIGLIP_STD
        if tuple(pixels.shape[-2:]) != self.vision_size:  # a real checkpoint's resolution (e.g. 224)
            pixels = F.interpolate(pixels, size=self.vision_size, mode="bilinear", align_corners=False)
        image = model.get_image_features(pixel_values=pixels).pooler_output.to(dtype)  # [B, n, H]
        ids, mask = self._prompt(obs)
        batch = ids.shape[0]
        parts, masks = [image], [torch.ones(image.shape[:2], dtype=mask.dtype, device=mask.device)]
        if head.state_proj is not None:
            parts.append(head.state_proj(obs["state"].float()).to(dtype)[:, None])
            masks.append(torch.ones((batch, 1), dtype=mask.dtype, device=mask.device))
        slots = embed(torch.full((batch, self.num_slots), self.act_id, device=ids.device)) + head.queries.to(dtype)
        parts += [embed(ids), slots]
        masks += [mask, torch.ones((batch, self.num_slots), dtype=mask.dtype, device=mask.device)]
        attention_mask = torch.cat(masks, 1)
        out = model(
            inputs_embeds=torch.cat(parts, 1),
            attention_mask=attention_mask,
            position_ids=attention_mask.cumsum(-1),  # 1-based like PaliGemma's, unchanged by the left padding
            token_type_ids=torch.zeros_like(attention_mask),  # all prefix: bidirectional attention
            use_cache=False,
        )
        hidden = out.last_hidden_state
        valid = attention_mask.bool()[..., None]
        pooled = torch.where(valid, hidden, 0.0).sum(1) / valid.sum(1)
        # contiguous: a strided input lets CPU matmuls round differently for equal weights at other addresses
        return hidden[:, -self.num_slots :].contiguous(), pooled

    def _dist(self, slots: torch.Tensor, head: ActionHead) -> torch.distributions.Distribution:
        batch = slots.shape[0]
        if self.bins:  # logits over the action tokens, the last N ids, through the LM head
            rows = self.backbone.get_output_embeddings().weight[-self.bins :]
            if head.token_delta is not None:
                rows = rows + head.token_delta.to(rows.dtype)
            logits = F.linear(slots, rows.to(slots.dtype))
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            return Bins(logits.view(batch, *self.action_shape, self.bins))  # float32 log-probs
        mean = head.mean(slots.float()).squeeze(-1).float()  # (float32 also under bf16 autocast)
        std = head.log_std.exp().expand_as(mean)
        shape = (batch, *self.action_shape)
        return torch.distributions.Normal(mean.view(shape), std.reshape(shape), validate_args=False)

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
        """A bin index -> its bin's centre within the action bounds; a Gaussian sample as it is (the env clips)."""
        return decode_bins(action, self.action_low, self.action_high, self.bins) if self.bins else action

    # ---- what trains, and saving ------------------------------------------------------------------------------
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
            merged[-self.bins :] = (head[-self.bins :].float() + delta.detach().float()).to(head.dtype)
            for key, value in list(state.items()):
                if value is head or (value.data_ptr() == head.data_ptr() and value.shape == head.shape):
                    state[key] = merged  # the LM head and the input embedding it is tied to
        return state

    @torch.no_grad()
    def save_pretrained(self, path: str | Path) -> None:
        """Write a directory that ``make_policy(..., model_path=path)`` loads: the backbone with the adapters merged
        (transformers' ``save_pretrained``), the tokenizer, the heads (``heads.safetensors``) and ``vla_config.json``.
        The heads file has no token delta (merged into the LM head) and no reference copy (a loaded policy's
        reference is the loaded policy)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with quiet():
            self.backbone.save_pretrained(path, state_dict=self.merged_backbone_state_dict())
        self.tokenizer.save_pretrained(path)
        heads = {f"action_head.{k}": v for k, v in self.action_head.state_dict().items() if k != "token_delta"}
        heads.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        save_file({k: v.detach().contiguous().cpu() for k, v in heads.items()}, str(path / HEADS_FILE))
        (path / VLA_CONFIG).write_text(json.dumps(asdict(self.config), indent=2) + "\n")

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
ARCHITECTURE_KWARGS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "patch_size")
HEAD_KWARGS = ("prompt_format", "instruction", "head_hidden", "init_logstd", "train_action_tokens")
RUN_KWARGS = ("model_path", "lora_rank", "lora_alpha", "lora_targets", "dtype", "init_seed", "start_logstd")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _check_kwargs(kwargs: dict[str, Any]) -> None:
    known = ARCHITECTURE_KWARGS + HEAD_KWARGS + RUN_KWARGS
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        fail(f"--policy-kwargs: unknown key(s) {unknown} for examples.hf_vla (allowed: {', '.join(known)})")
    ints = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "patch_size", "head_hidden", "lora_rank")
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
    for name in ("model_path", "instruction"):
        if kwargs.get(name) is not None and not isinstance(kwargs[name], str):
            fail(f"--policy-kwargs: {name} must be a string, got {kwargs[name]!r}")
    targets = kwargs.get("lora_targets", DEFAULT_LORA_TARGETS)
    if not (
        isinstance(targets, str) or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        fail(
            "--policy-kwargs: lora_targets must be a regex string, 'all-linear' or a list of module names, "
            f"got {targets!r}"
        )
    if not isinstance(kwargs.get("train_action_tokens", True), bool):
        fail(f"--policy-kwargs: train_action_tokens must be true or false, got {kwargs['train_action_tokens']!r}")


def _env_config(obs_space: gym.Space, act_space: gym.Space, args, instruction: str | None) -> dict[str, Any]:
    """What the env and the trainer's flags fix: action head, bins, chunk, dim, bounds, image size, state size."""
    spaces = obs_space.spaces if isinstance(obs_space, gym.spaces.Dict) else {}
    rgb = spaces.get("rgb")
    if rgb is None or rgb.dtype != np.uint8 or len(rgb.shape) != 3 or rgb.shape[0] != 3:
        fail(
            f'examples.hf_vla needs observations with an "rgb" uint8 [3, H, W] image, the env gives {obs_space} '
            '(e.g. --env-id PushCubeLangRL --env-kwargs \'{"obs_mode": "rgb"}\')'
        )
    if INSTRUCTION_KEY in spaces and not is_instruction_space(spaces[INSTRUCTION_KEY]):
        fail(
            f"examples.hf_vla: the observation's {INSTRUCTION_KEY!r} entry is not instruction tokens (shared.language)"
        )
    if INSTRUCTION_KEY not in spaces and instruction is None:
        fail(
            "examples.hf_vla: the env's observations hold no instruction; name one with --policy-kwargs "
            '\'{"instruction": "push the cube to the goal"}\' (or use a language task such as PushCubeLangRL)'
        )
    extra = sorted(set(spaces) - {"rgb", "state", INSTRUCTION_KEY})
    if extra:
        fail(f"examples.hf_vla reads the observation entries rgb, state and instruction; the env also gives {extra}")
    state = spaces.get("state")
    if state is not None and len(state.shape) != 1:
        fail(f'examples.hf_vla: the "state" entry must be a vector, got shape {state.shape}')
    if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) not in (1, 2):
        fail(f"examples.hf_vla needs a Box action space [D] or [K, D] (--action-chunk), got {act_space}")
    head = getattr(args, "action_head", "gaussian")
    bins = int(getattr(args, "action_bins", 256))
    chunk = act_space.shape[0] if len(act_space.shape) == 2 else 1
    low, high = act_space.low.reshape(-1, act_space.shape[-1]), act_space.high.reshape(-1, act_space.shape[-1])
    if head == "bins":
        try:
            bin_bounds(act_space, bins)
        except ValueError as e:
            fail(str(e))
    return {
        "action_head": head,
        "action_bins": bins,
        "action_chunk": chunk,
        "action_dim": act_space.shape[-1],
        "action_low": [float(x) for x in low[0]],
        "action_high": [float(x) for x in high[0]],
        "image_size": tuple(int(s) for s in rgb.shape[1:]),
        "state_dim": int(state.shape[0]) if state is not None else 0,
    }


def load_backbone(model_path: str, dtype: torch.dtype) -> tuple[nn.Module, Any, dict[str, Any] | None]:
    """``(model, tokenizer, vla_config or None)`` from a local directory: a ``save_pretrained`` VLA (with
    ``vla_config.json``) or a transformers checkpoint of a supported ``model_type`` with its tokenizer."""
    path = Path(model_path)
    if not (path / "config.json").is_file():
        fail(
            f"--policy-kwargs model_path {model_path!r}: not a directory holding config.json (a VLA written by "
            "save_pretrained, or a local transformers checkpoint such as PaliGemma's)"
        )
    vla = json.loads((path / VLA_CONFIG).read_text()) if (path / VLA_CONFIG).is_file() else None
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in MODEL_CLASSES:
        fail(
            f"--policy-kwargs model_path {model_path!r}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(MODEL_CLASSES)})"
        )
    try:
        with quiet():
            model = MODEL_CLASSES[model_type].from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(f"--policy-kwargs model_path {model_path!r}: cannot load it ({first})")
    return model, tokenizer, vla


def make_policy(obs_space: gym.Space, act_space: gym.Space, args, **kwargs) -> HFVLAPolicy:
    """``--policy examples.hf_vla:make_policy``: a fresh tiny PaliGemma (random weights from ``tiny_paligemma``
    and a tokenizer from ``build_tokenizer``), or the model at ``model_path`` (a VLA this module saved, or a
    transformers checkpoint), with LoRA adapters and heads for this env's spaces and the trainer's
    ``--action-head/--action-bins/--action-chunk``. ``--policy-kwargs`` keys (docs/VLA.md): architecture
    (``hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``, ``patch_size``: fresh builds only),
    heads (``prompt_format``, ``instruction``, ``head_hidden``, ``init_logstd``, ``train_action_tokens``: fixed
    by a saved VLA), and ``model_path``, ``lora_rank`` (16), ``lora_alpha`` (32), ``lora_targets`` ("all-linear",
    a regex or a list of module names), ``dtype`` of the frozen weights (float32, bfloat16), ``init_seed`` (0: what
    is random at build, so every call builds the same policy), ``start_logstd`` (gaussian head: the log-std the
    policy and its reference start from, replacing the built or loaded one)."""
    _check_kwargs(kwargs)
    if getattr(args, "norm_obs", False):
        fail("--policy examples.hf_vla:make_policy scales its images itself and has no obs_rms; drop --norm-obs")
    model_path = kwargs.get("model_path")
    dtype = DTYPES[kwargs.get("dtype", "float32")]
    lora = {
        "rank": kwargs.get("lora_rank", 16),
        "alpha": kwargs.get("lora_alpha", 32),
        "targets": kwargs.get("lora_targets", DEFAULT_LORA_TARGETS),
    }
    env = _env_config(obs_space, act_space, args, kwargs.get("instruction"))
    head_kwargs = {k: kwargs[k] for k in HEAD_KWARGS if k in kwargs}
    with torch.random.fork_rng(devices=[]):  # the build's random draws leave the trainer's streams alone
        torch.manual_seed(kwargs.get("init_seed", 0))
        saved = None
        if model_path is None:
            config = VLAConfig(**env, **head_kwargs)
            tokenizer = build_tokenizer(default_corpus(config.prompt_format), config.action_bins)
            special = {n: tokenizer.convert_tokens_to_ids(f"<{n}>") for n in ("pad", "bos", "eos", "image")}
            arch = {k: kwargs[k] for k in ARCHITECTURE_KWARGS if k in kwargs}
            size = config.image_size
            patch = arch.get("patch_size", 16)
            if size[0] != size[1] or size[0] % patch:
                fail(
                    f"examples.hf_vla: a fresh model needs square images whose side divides into {patch}-pixel "
                    f"patches, the env gives {size[0]}x{size[1]} (--env-kwargs image_size, or --policy-kwargs "
                    "patch_size)"
                )
            if arch.get("hidden_size", 64) % arch.get("num_heads", 4):
                fail("--policy-kwargs: hidden_size must be a multiple of num_heads")
            backbone = PaliGemmaForConditionalGeneration(tiny_paligemma(len(tokenizer), size, special, **arch))
            backbone = backbone.to(dtype)
        else:
            given = sorted(k for k in ARCHITECTURE_KWARGS if k in kwargs)
            if given:
                fail(f"--policy-kwargs: model_path {model_path!r} fixes the architecture; drop {given}")
            backbone, tokenizer, saved = load_backbone(model_path, dtype)
            if saved is not None:
                config = _saved_config(saved, env, head_kwargs, model_path)
            else:  # a base VLM: new heads; the action tokens are the last N ids of its vocabulary
                config = VLAConfig(model_type=backbone.config.model_type, **env, **head_kwargs)
                if env["action_head"] == "bins" and len(tokenizer) < env["action_bins"]:
                    fail(f"model_path {model_path!r}: its vocabulary ({len(tokenizer)}) is smaller than --action-bins")
        backbone.eval()  # no dropout (the configs have none; a checkpoint's might)
        policy = HFVLAPolicy(backbone, tokenizer, config, lora)
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
    checks += [("image_size", "the env's image size"), ("state_dim", "the env's state size")]
    for key, what in checks:
        have, want = getattr(config, key), env[key]
        if (tuple(have) if isinstance(have, (list, tuple)) else have) != want:
            fail(f"model_path {model_path!r} was saved with {key} {have!r}, but {what} gives {want!r}")
    if config.action_low != env["action_low"] or config.action_high != env["action_high"]:
        fail(f"model_path {model_path!r} was saved for action bounds {config.action_low}..{config.action_high}, "
             f"the env's are {env['action_low']}..{env['action_high']}")  # fmt: skip
    return config
