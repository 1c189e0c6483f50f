"""The model families examples/hf_vla runs (``FAMILIES``: PaliGemma, SmolVLM, Idefics3): what each fixes besides its
transformers class (the action tokens' convention, ``action_tokens.py``; the prompt suffix, image resampling and
normalisation, image markers, and which forward ``model.HFVLAPolicy`` runs it with), how a checkpoint's
``preprocessor_config.json`` overrides the image processing, and the tiny configs a fresh model is built from with
random weights (``tiny_paligemma``, ``tiny_smolvlm``). Another family is an entry here (docs/VLA.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
)

__all__ = ["FAMILIES", "Family", "tiny_paligemma", "tiny_smolvlm"]


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
PATCH_SIZE = {"paligemma": 16, "smolvlm": 8, "idefics3": 8}  # a fresh model's default patch size
RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes in a preprocessor_config.json


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
