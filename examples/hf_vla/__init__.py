"""A Hugging Face vision-language-action policy: PaliGemma (SigLIP + Gemma) or SmolVLM (SigLIP + SmolLM2, SmolVLA's
backbone) with LoRA adapters, token-bin or
Gaussian action heads (with action chunks) and a value head: the default ``--policy`` of the VLA trainers
(ppo_vla.py, ppo_vla_ddp.py, ppo_vla_async.py, grpo_vla.py).

    uv sync --extra vla
    uv run python examples/hf_vla/bc.py --out runs/vla_bc            # behaviour cloning from the scripted expert
    uv run python cleanrl_embodied/ppo_vla.py --env-id PushCubeLangRL --policy examples.hf_vla:make_policy \\
        --policy-kwargs '{"model_path": "runs/vla_bc"}' --action-head bins --action-bins 16 \\
        --env-kwargs '{"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}'

``make_policy`` builds a tiny PaliGemma (or SmolVLM: ``--policy-kwargs '{"model_type": "smolvlm"}'``) with random
weights (no download) or loads one from a local directory (``model_path``: a VLA written by
``HFVLAPolicy.save_pretrained``, or a transformers PaliGemma, SmolVLM or Idefics3 checkpoint).
The modules: ``model.py`` (``HFVLAPolicy``: backbone with LoRA, heads, value head, action decoding, saving),
``families.py`` (the model families and their tiny random-weight configs), ``factory.py`` (``make_policy``: the
``--policy-kwargs``, loading ``model_path``, the dataset statistics); ``action_tokens.py`` says which vocabulary
ids the bins are, per model family; ``statistics.py`` holds the dataset statistics actions are decoded and the state
normalised with (``dataset_statistics.json`` beside the model); ``tokenizer.py`` the tokenizer and the prompt cache.
docs/VLA.md describes the model, the tokenizer, the heads, LoRA, memory and checkpoints.
"""

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:  # the trainers' --policy loader prints this as one line
    raise ImportError(f"examples.hf_vla needs the vla extra (uv sync --extra vla): {e}") from None

from examples.action_bins import Bins
from examples.hf_vla.action_tokens import ActionTokenMap, build_action_token_map
from examples.hf_vla.factory import load_backbone, make_policy
from examples.hf_vla.families import tiny_paligemma, tiny_smolvlm
from examples.hf_vla.model import HFVLAPolicy, VLAConfig
from examples.hf_vla.statistics import DatasetStatistics
from examples.hf_vla.tokenizer import PromptCache, build_tokenizer, default_corpus

__all__ = [
    "ActionTokenMap",
    "Bins",
    "DatasetStatistics",
    "HFVLAPolicy",
    "PromptCache",
    "VLAConfig",
    "build_action_token_map",
    "build_tokenizer",
    "default_corpus",
    "load_backbone",
    "make_policy",
    "tiny_paligemma",
    "tiny_smolvlm",
]
