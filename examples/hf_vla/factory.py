"""``make_policy``, the VLA trainers' default ``--policy examples.hf_vla:make_policy``: the configuration resolution
from the env's spaces, the trainer's flags and ``--policy-kwargs`` (every key checked in one line), a fresh tiny
model of a family (``families.py``) or one loaded from ``model_path`` (``load_backbone``: a VLA that
``HFVLAPolicy.save_pretrained`` wrote, or a transformers checkpoint), and the dataset statistics its actions are
decoded with; then the ``model.HFVLAPolicy`` on it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from transformers import AutoTokenizer

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.language import INSTRUCTION_KEY, is_instruction_space
from cleanrl_embodied.shared.observations import PRIVILEGED_KEY, is_image
from examples.hf_vla.action_tokens import CONVENTIONS, build_action_token_map
from examples.hf_vla.families import FAMILIES, PATCH_SIZE, _image_processing, tiny_paligemma, tiny_smolvlm
from examples.hf_vla.model import VLA_CONFIG, HFVLAPolicy, VLAConfig, quiet
from examples.hf_vla.statistics import STATS_FILE, DatasetStatistics
from examples.hf_vla.tokenizer import build_tokenizer, default_corpus

__all__ = ["ENV_BOUNDS", "RUN_KWARGS", "load_backbone", "make_policy"]

DEFAULT_LORA_TARGETS = "all-linear"
r"""peft's every linear layer but the LM head: the vision tower's, the projector's and the language model's (OpenVLA's
LoRA choice). A regex selects fewer, e.g. r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj)"."""
ARCHITECTURE_KWARGS = ("model_type", "hidden_size", "num_layers", "num_heads", "intermediate_size", "patch_size",
                       "scale_factor", "tokenizer_corpus")  # fmt: skip
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
    ``build_tokenizer``, or the model at ``model_path`` (a VLA this package saved, or a transformers checkpoint of a
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
