"""Observation encoders the trainers' built-in agents share: network pieces, no training logic (the agents' heads,
distributions and losses stay in each trainer script)."""

from __future__ import annotations

import math

import gymnasium as gym
import torch
import torch.nn as nn
import torch.nn.functional as F
from tensordict import TensorDict

from cleanrl_embodied.shared.language import VOCAB_SIZE
from cleanrl_embodied.shared.tensordict_helpers import image_spaces, token_spaces


def _orthogonal(layer: nn.Module, std: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


MIN_IMAGE_SIZE = 36
"""Height and width NatureCNN's three convolutions (8x8 stride 4, 4x4 stride 2, 3x3) need at least."""


def needs_encoder(space: gym.Space) -> bool:
    """Whether observations of ``space`` hold something an MLP can't read as it is: images or instructions."""
    return bool(image_spaces(space) or token_spaces(space))


class InstructionEncoder(nn.Module):
    """Instruction tokens (``shared.language``: byte ids and attention mask [B, L]) -> a feature vector [B, features]:
    an embedding per byte, a width-3 convolution (so that it reads groups of letters, not only which letters occur),
    a max over the instruction's positions (padding left out) and a projection (Linear, LayerNorm, Tanh)."""

    def __init__(self, features: int = 64, embedding: int = 32, channels: int = 64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, embedding, padding_idx=0)
        self.conv = _orthogonal(nn.Conv1d(embedding, channels, 3, padding=1))
        self.out = nn.Sequential(_orthogonal(nn.Linear(channels, features)), nn.LayerNorm(features), nn.Tanh())

    def forward(self, tokens: TensorDict) -> torch.Tensor:
        x = torch.relu(self.conv(self.embed(tokens["input_ids"]).transpose(1, 2)))  # [B, C, L]
        keep = tokens["attention_mask"].unsqueeze(1) > 0
        return self.out(torch.where(keep, x, -torch.inf).amax(-1).clamp_min(0.0))  # (an empty one gives zeros)


class PixelEncoder(nn.Module):
    """TensorDict observations with images and/or instructions -> one feature vector per row: each uint8 image
    [C, H, W] (scaled to [0, 1]) through its own small CNN (NatureCNN's three conv layers, as in the CleanRL and
    ManiSkill pixel baselines) and a projection to ``features`` (Linear, LayerNorm, Tanh, as DrQ-v2's trunk), each
    instruction through an :class:`InstructionEncoder`, concatenated with the (already normalized) float entries
    ``state``. Orthogonal init with gain sqrt(2), zero biases. An image smaller than ``MIN_IMAGE_SIZE`` (36) in
    height or width is zero-padded (black, centred) to 36 first: the CNN needs that much, and the parameters are
    those of a 36-pixel image.

    The projection is bounded on purpose: the trainers' heads are Tanh MLPs, and unbounded ReLU features (256 of
    them around 2.5 each after a few updates) saturated their first layer, so actor and critic became constant
    over the batch and two of three seeds never learned RGB PushCubeRL."""

    def __init__(self, obs_space: gym.spaces.Dict, state_dim: int, features: int = 256):
        super().__init__()
        self.keys, self.cnns, self.paddings = list(image_spaces(obs_space)), nn.ModuleList(), []
        for channels, height, width in (box.shape for box in image_spaces(obs_space).values()):
            pad_h, pad_w = max(MIN_IMAGE_SIZE - height, 0), max(MIN_IMAGE_SIZE - width, 0)
            self.paddings.append((pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))  # F.pad's order
            height, width = height + pad_h, width + pad_w
            convs = nn.Sequential(
                _orthogonal(nn.Conv2d(channels, 32, 8, stride=4)),
                nn.ReLU(),
                _orthogonal(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                _orthogonal(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            flat = convs(torch.zeros(1, channels, height, width)).shape[1]
            self.cnns.append(
                nn.Sequential(convs, _orthogonal(nn.Linear(flat, features)), nn.LayerNorm(features), nn.Tanh())
            )
        self.text_keys = list(token_spaces(obs_space))
        self.texts = nn.ModuleList(InstructionEncoder() for _ in self.text_keys)
        self.out_dim = features * len(self.keys) + sum(t.out[0].out_features for t in self.texts) + state_dim

    def forward(self, obs: TensorDict, state: torch.Tensor) -> torch.Tensor:
        images = [
            cnn(F.pad(obs.get(key).float() / 255.0, padding) if any(padding) else obs.get(key).float() / 255.0)
            for key, cnn, padding in zip(self.keys, self.cnns, self.paddings)
        ]
        texts = [text(obs.get(key)) for key, text in zip(self.text_keys, self.texts)]
        return torch.cat([*images, *texts, state], -1)
