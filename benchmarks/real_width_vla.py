"""examples/hf_vla's policy on a PaliGemma of real widths with random weights: the `--policy` factory of
gpu_check.py's vla part and of experiments/vla_memory.py, and what it built last (read in the same process)."""

from __future__ import annotations

from typing import Any

PALIGEMMA_3B = dict(
    text_hidden=2048, text_intermediate=16384, text_heads=8, text_kv_heads=1, head_dim=256, vocab_size=257216,
    vision_hidden=1152, vision_intermediate=4304, vision_heads=16, patch_size=14, vision_image_size=224,
)  # fmt: skip
"""PaliGemma-3B's widths (google/paligemma-3b-pt-224's config: Gemma 2B and SigLIP so400m/14 at 224 pixels)"""
LAST_BUILD: dict[str, Any] = {}
"""what real_width_vla built last (parameter counts), read by the vla part in the same process"""


def real_width_vla(obs_space, act_space, args, **kw):
    """`--policy benchmarks.real_width_vla:real_width_vla`: examples/hf_vla's policy (LoRA adapters, token-bin heads,
    value head) on a PaliGemma of the given widths with random weights, built on the run's device in bf16; optionally
    with the policy's gradient checkpointing (``gradient_checkpointing``, as make_policy's keyword: transformers'
    non-reentrant checkpointing of every layer)."""
    import torch
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    from cleanrl_embodied import shared
    from examples.hf_vla.factory import _env_config
    from examples.hf_vla.model import HFVLAPolicy, VLAConfig, quiet
    from examples.hf_vla.tokenizer import build_tokenizer, default_corpus

    config = VLAConfig(**_env_config(obs_space, act_space, args, None))
    tokenizer = build_tokenizer(default_corpus(config.prompt_format), config.action_bins)
    special = {n: tokenizer.convert_tokens_to_ids(f"<{n}>") for n in ("pad", "bos", "eos", "image")}
    text = dict(model_type="gemma", hidden_size=kw["text_hidden"], intermediate_size=kw["text_intermediate"],
                num_hidden_layers=kw["text_layers"], num_attention_heads=kw["text_heads"],
                num_key_value_heads=kw["text_kv_heads"], head_dim=kw["head_dim"], vocab_size=kw["vocab_size"],
                pad_token_id=special["pad"], bos_token_id=special["bos"], eos_token_id=special["eos"])  # fmt: skip
    vision = dict(model_type="siglip_vision_model", hidden_size=kw["vision_hidden"],
                  intermediate_size=kw["vision_intermediate"], num_hidden_layers=kw["vision_layers"],
                  num_attention_heads=kw["vision_heads"], image_size=kw["vision_image_size"],
                  patch_size=kw["patch_size"], projection_dim=kw["text_hidden"])  # fmt: skip
    pg = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_index=special["image"],
                         vocab_size=kw["vocab_size"], projection_dim=kw["text_hidden"],
                         hidden_size=kw["text_hidden"])  # fmt: skip
    device, dtype = shared.pick_device(args.cuda), torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # random weights made in bf16 on the device, never a float32 copy
    try:
        cuda_devices = [device.index or 0] if device.type == "cuda" else []
        with torch.device(device), torch.random.fork_rng(devices=cuda_devices), quiet():
            torch.manual_seed(0)
            backbone = PaliGemmaForConditionalGeneration(pg)
    finally:
        torch.set_default_dtype(dtype)
    backbone.eval()
    lora = {"rank": kw["lora_rank"], "alpha": 2 * kw["lora_rank"], "targets": "all-linear"}
    checkpointing = kw.get("gradient_checkpointing", False)
    policy = HFVLAPolicy(backbone, tokenizer, config, lora, gradient_checkpointing=checkpointing)
    LAST_BUILD.clear()
    checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in backbone.modules())  # as it reports
    LAST_BUILD.update(params=sum(p.numel() for p in policy.parameters()), checkpointing=checkpointing,
                      trainable=sum(p.numel() for p in policy.parameters() if p.requires_grad))  # fmt: skip
    return policy
