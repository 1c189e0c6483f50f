"""A tiny vision-language-action (VLA) policy, wrapped the way you would wrap a real pretrained VLA.

    uv run python examples/tiny_vla.py --out tiny_vla.pt --image-size 48     # a "pretrained" file, from scratch
    uv run python cleanrl_embodied/ppo_vla_async.py --policy examples.tiny_vla:make_policy \\
        --policy-kwargs '{"model_path": "tiny_vla.pt"}' \\
        --env-kwargs '{"obs_mode": "rgb", "image_size": 48}' --eval-env-kwargs '{"obs_mode": "rgb", "image_size": 48}'

`TinyVLA` reads the camera image (uint8 [N, 3, H, W], scaled to [0, 1]) with a small CNN, conditions it on a
fixed instruction embedding (FiLM), and puts a Gaussian action head (learned log-std) and a value head (for PPO)
on top. The pretrained file holds `model_class` ("module:Class"), `model_config` (plain types) and the weights,
like a `vla_config: {model_path, model_class, model_config}` entry; `load_pretrained` rebuilds the model from it.

For a real VLA (e.g. a Hugging Face model) you change `make_policy`, not the trainers:
- load the backbone inside the factory (`AutoModel.from_pretrained(model_path)`), freeze it
  (`requires_grad_(False)`: the trainers' optimizers then skip it, it gets no gradient) and put a small action
  head (Gaussian mean, log-std) and value head on its pooled features;
- turn the observation TensorDict into the model's inputs on the device, as one batch for all envs (its image
  processor, the tokenized instruction computed once), and return `torch.distributions.Normal`-like outputs;
- mind the latency: at 100 ms a call and more, train with `ppo_vla_async.py`, which steps the envs with an inference
  copy while the learner updates (`charts/policy_staleness`, `charts/learner_wait_s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time
import zlib
from dataclasses import dataclass

import gymnasium as gym
import torch
import torch.nn as nn


@dataclass
class TinyVLAConfig:
    """Everything that fixes the architecture; saved as plain types next to the weights."""

    image_size: tuple[int, int] = (64, 64)  # H, W of the RGB camera image (the env's "rgb" entry)
    state_dim: int = 0  # proprioception entries read from the env's "state" entry (obs_mode "state+rgb"); 0: none
    action_dim: int = 7
    instruction: str = "push the cube to the goal"
    text_dim: int = 32  # size of the instruction embedding
    channels: tuple[int, ...] = (16, 32, 32)  # CNN widths (stride 2 each)
    width: int = 128  # fused feature and head width
    init_logstd: float = -0.5

    def __post_init__(self):  # JSON and torch.load give lists: keep tuples
        self.image_size, self.channels = tuple(map(int, self.image_size)), tuple(map(int, self.channels))


def embed_instruction(text: str, dim: int) -> torch.Tensor:
    """A deterministic stand-in for a frozen language model: each word gets a fixed random vector seeded by its
    CRC32 (no vocabulary, no download); the sentence embedding is their mean, scaled to unit length."""
    words = text.lower().split() or [""]
    vectors = [torch.randn(dim, generator=torch.Generator().manual_seed(zlib.crc32(w.encode()))) for w in words]
    mean = torch.stack(vectors).mean(0)
    return mean / mean.norm().clamp_min(1e-8)


def head(in_dim: int, width: int, out_dim: int, out_gain: float) -> nn.Sequential:
    last = nn.Linear(width, out_dim)
    nn.init.orthogonal_(last.weight, out_gain)
    nn.init.zeros_(last.bias)
    return nn.Sequential(nn.Linear(in_dim, width), nn.Tanh(), last)


class TinyVLA(nn.Module):
    """Image encoder + fixed instruction + FiLM fusion + Gaussian action head + value head: the trainers'
    policy contract (`forward`, `dist`, `get_value`) on TensorDict observations {"rgb"[, "state"]}."""

    config_class = TinyVLAConfig

    def __init__(self, config: TinyVLAConfig):
        super().__init__()
        self.config = config
        layers, last = [], 3
        for c in config.channels:
            layers += [nn.Conv2d(last, c, 3, stride=2, padding=1), nn.ReLU()]
            last = c
        convs = nn.Sequential(*layers, nn.Flatten())
        flat = convs(torch.zeros(1, 3, *config.image_size)).shape[1]
        self.encoder = nn.Sequential(convs, nn.Linear(flat, config.width), nn.ReLU())  # the "vision backbone"
        # the instruction never changes: a buffer (saved, never trained), like a frozen text encoder's output
        self.register_buffer("instruction", embed_instruction(config.instruction, config.text_dim))
        self.film = nn.Linear(config.text_dim, 2 * config.width)  # language -> per-feature scale and shift
        fused = config.width + config.state_dim
        self.action_mean = head(fused, config.width, config.action_dim, out_gain=0.01)
        self.action_logstd = nn.Parameter(torch.full((config.action_dim,), config.init_logstd))
        self.value = head(fused, config.width, 1, out_gain=1.0)

    def features(self, obs) -> torch.Tensor:
        image = self.encoder(obs["rgb"].float() / 255.0)
        scale, shift = self.film(self.instruction).chunk(2)
        fused = image * (1 + scale) + shift
        return torch.cat([fused, obs["state"].float()], -1) if self.config.state_dim else fused

    def _dist(self, features: torch.Tensor) -> torch.distributions.Normal:
        mean = self.action_mean(features)
        return torch.distributions.Normal(mean, self.action_logstd.expand_as(mean).exp(), validate_args=False)

    def forward(self, obs) -> tuple[torch.distributions.Normal, torch.Tensor]:
        """One pass of the image through the encoder for both the action distribution and V(obs) [N]."""
        features = self.features(obs)
        return self._dist(features), self.value(features).squeeze(-1)

    def dist(self, obs) -> torch.distributions.Normal:
        return self._dist(self.features(obs))

    def get_value(self, obs) -> torch.Tensor:
        return self.value(self.features(obs)).squeeze(-1)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """What the env gets for a sampled action: the Gaussian sample as it is (the env clips)."""
        return action


def save_pretrained(model: nn.Module, path: str) -> None:
    """One file: the class as "module:Class", its config as plain types, the weights (weights_only-loadable)."""
    cls = type(model)
    torch.save(
        {
            "model_class": f"{cls.__module__}:{cls.__qualname__}",
            "model_config": dataclasses.asdict(model.config),
            "state_dict": model.state_dict(),
        },
        path,
    )


def load_pretrained(model_path: str) -> nn.Module:
    """Rebuild the model `save_pretrained` wrote: import `model_class`, build it from `model_config`, load weights."""
    try:
        blob = torch.load(model_path, map_location="cpu", weights_only=True)
        module_name, _, class_name = blob["model_class"].partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
    except (OSError, KeyError, TypeError, ImportError, AttributeError, RuntimeError) as e:
        raise SystemExit(
            f"error: model_path {model_path!r}: not a loadable pretrained file "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
        ) from None
    model = cls(cls.config_class(**blob["model_config"]))
    model.load_state_dict(blob["state_dict"])
    return model


def check_spaces(config: TinyVLAConfig, obs_space: gym.Space, act_space: gym.Space, source: str) -> None:
    """The env must give what the model reads: {"rgb": [3, H, W]} (+ "state" [state_dim]), actions [action_dim]."""
    want = {"rgb": (3, *config.image_size)} | ({"state": (config.state_dim,)} if config.state_dim else {})
    have = {k: tuple(s.shape) for k, s in obs_space.spaces.items()} if isinstance(obs_space, gym.spaces.Dict) else {}
    if have != want or act_space.shape != (config.action_dim,):
        raise SystemExit(
            f"error: {source} expects observations {want} and actions ({config.action_dim},), the env "
            f"gives {have or obs_space} and {act_space.shape} (e.g. --env-kwargs "
            f'\'{{"obs_mode": "rgb", "image_size": {config.image_size[0]}}}\')'
        )


def make_policy(
    obs_space: gym.Space,
    act_space: gym.Space,
    args,
    model_path: str | None = None,
    freeze_encoder: bool = False,
    **config,
) -> TinyVLA:
    """`--policy examples.tiny_vla:make_policy`: the pretrained model at `model_path` (its config comes from the
    file), else a fresh one from the env's spaces and `config` (TinyVLAConfig fields). `freeze_encoder`: the
    image encoder gets requires_grad=False, so it gets no gradient and the optimizer leaves it unchanged."""
    if getattr(args, "norm_obs", False):  # images are scaled inside the model; there is no obs_rms to update
        raise SystemExit("error: --policy examples.tiny_vla:make_policy has no observation normalizer; drop --norm-obs")
    if model_path is not None:
        if config:
            raise SystemExit(
                f"error: model_path {model_path!r} fixes the config; drop {sorted(config)} from --policy-kwargs"
            )
        model = load_pretrained(model_path)
        check_spaces(model.config, obs_space, act_space, f"model_path {model_path!r}")
    else:
        spaces = obs_space.spaces if isinstance(obs_space, gym.spaces.Dict) else {}
        image = spaces["rgb"].shape[1:] if "rgb" in spaces else (64, 64)  # check_spaces names what is missing
        state = spaces["state"].shape[0] if "state" in spaces else 0
        defaults = {"image_size": image, "state_dim": state, "action_dim": act_space.shape[0]}
        try:
            model_config = TinyVLAConfig(**{**defaults, **config})
        except TypeError as e:
            raise SystemExit(f"error: --policy-kwargs: {e}") from None
        check_spaces(model_config, obs_space, act_space, "TinyVLA")  # before building: the CNN needs the image
        model = TinyVLA(model_config)
    if freeze_encoder:
        model.encoder.requires_grad_(False)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description="Write a TinyVLA 'pretrained' file from scratch and time one inference.")
    p.add_argument("--out", required=True, help="path of the file to write")
    p.add_argument("--image-size", type=int, default=64, help="square camera image size (the env's image_size)")
    p.add_argument("--state-dim", type=int, default=0, help="31 for obs_mode 'state+rgb', 0 for 'rgb'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8, help="observations per timed inference call (num_envs)")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    save_pretrained(TinyVLA(TinyVLAConfig(image_size=(a.image_size, a.image_size), state_dim=a.state_dim)), a.out)
    model = load_pretrained(a.out)
    obs = {
        "rgb": torch.randint(0, 256, (a.batch, 3, a.image_size, a.image_size), dtype=torch.uint8),
        "state": torch.zeros(a.batch, a.state_dim),
    }
    with torch.no_grad():
        model.dist(obs)  # warm-up
        times = []
        for _ in range(50):
            start = time.perf_counter()
            model.dist(obs).sample()
            times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {a.out}: {params} parameters; inference {1e3 * sorted(times)[25]:.2f} ms per call "
        f"(median, batch {a.batch}, {a.image_size}x{a.image_size}, {torch.get_num_threads()} CPU threads)"
    )


if __name__ == "__main__":
    # re-import under the package name, so the file records "examples.tiny_vla:TinyVLA" and not "__main__:TinyVLA"
    importlib.import_module("examples.tiny_vla").main()
