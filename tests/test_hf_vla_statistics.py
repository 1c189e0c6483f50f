"""examples/hf_vla/statistics.py: dimensions whose statistics have no spread (q01 = q99, min = max, std = 0).

Such a dimension decodes to its statistic (OpenVLA's q01 + (n + 1)(q99 - q01) / 2 is q01 for every n; openpi's and
LeRobot's decoders give q01 / the mean up to their epsilon), whatever the policy samples, with either head, in
training, evaluation and the exported (saved and reloaded) policy. It normalises as OpenVLA's data pipeline does:
under the bounds normalisations to -1 at or below the statistic and +1 above it, and to 0 where min = max; under
``normal`` to 0 at the mean and to -1 / +1 below / above it. For every layout a statistics file can use, for the
actions and for the state."""

from __future__ import annotations

import os

import pytest
import torch

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

from cleanrl_embodied.shared.envs import make_env
from examples.hf_vla import make_policy
from examples.hf_vla.statistics import DatasetStatistics, Normalizer
from tests.hf_vla_policies import policy_flags

ENV_KWARGS = {"obs_mode": "state+rgb", "image_size": 32, "action_mode": "ee_delta_pos"}
C = 0.25  # the flat dimension's statistic
LAYOUTS = {  # normalization -> the statistics of 3 dimensions: [-1, 3] spread, the flat one (C), [0, 1] spread
    "bounds_q99": {
        "q01": [-1.0, C, 0.0],
        "q99": [3.0, C, 1.0],
        "min": [-2.0, C - 1, -1.0],
        "max": [4.0, C + 1, 2.0],
    },  # q01 = q99 in the flat dimension, min < max
    "bounds": {"min": [-1.0, C, 0.0], "max": [3.0, C, 1.0]},
    "normal": {"mean": [1.0, C, 0.5], "std": [2.0, 0.0, 0.5]},
}


pytestmark = pytest.mark.usefixtures("offline_hub")  # tests/conftest.py


def normaliser(normalization: str, dim: int = 3) -> Normalizer:
    """LAYOUTS[normalization] over ``dim`` dimensions: the three above, repeated."""
    stats = {k: [v[i % 3] for i in range(dim)] for k, v in LAYOUTS[normalization].items()}
    return Normalizer(normalization, stats, [True] * dim)


def build(head: str, statistics: DatasetStatistics | None = None, **kwargs):
    env = make_env("PushCubeLangRL", num_envs=2, seed=0, **ENV_KWARGS)
    args = policy_flags(head, bins=8)
    policy = make_policy(env.single_observation_space, env.single_action_space, args, **kwargs)
    if statistics is not None:
        policy.set_statistics(statistics)
    obs, _ = env.reset(seed=0)
    return policy, env, obs


def statistics(action_norm: str, state_norm: str, state_dim: int) -> DatasetStatistics:
    return DatasetStatistics("demos", normaliser(action_norm), normaliser(state_norm, state_dim))


@pytest.mark.parametrize("normalization", list(LAYOUTS))
def test_a_flat_dimension_decodes_to_its_statistic_and_normalises_as_openvla(normalization):
    """The maps alone: decoding n in [-1, 1] gives C in the flat dimension (before: C + n); normalising gives
    OpenVLA's values there and the usual affine map elsewhere."""
    tensors = normaliser(normalization).tensors()
    n = torch.linspace(-1, 1, 9)[:, None].expand(9, 3)
    decoded = tensors["offset"] + tensors["scale"] * n
    assert torch.equal(decoded[:, 1], torch.full((9,), C))
    assert decoded[:, 0].unique().numel() == 9  # the spread dimensions still decode over their range
    x = torch.tensor([[0.0, C - 0.5, 0.5], [0.0, C, 0.5], [0.0, C + 1e-3, 0.5]])
    flat = Normalizer.normalise(x, tensors, clip=normalization != "normal")[:, 1]
    expected = {"bounds_q99": [-1.0, -1.0, 1.0], "bounds": [0.0, 0.0, 0.0], "normal": [-1.0, 0.0, 1.0]}
    assert flat.tolist() == expected[normalization]
    assert torch.isfinite(Normalizer.normalise(x, tensors, clip=False)).all()
    spread = Normalizer.normalise(x, tensors, clip=False)[:, [0, 2]]
    assert torch.allclose(spread, (x[:, [0, 2]] - tensors["offset"][[0, 2]]) / tensors["scale"][[0, 2]])


def test_openvla_zeroes_a_dimension_whose_min_equals_its_max_under_bounds_q99():
    """OpenVLA's pipeline maps a dimension with min = max to 0 after the q01/q99 normalisation (its "unused action
    dimensions"); one whose q01 = q99 but min < max is -1 at q01 and +1 above it."""
    stats = {"q01": [C, C], "q99": [C, C], "min": [C, C - 1], "max": [C, C + 1]}
    tensors = Normalizer("bounds_q99", stats, [True, True]).tensors()
    x = torch.tensor([[C, C], [C + 1, C + 1], [C - 1, C - 1]])
    assert Normalizer.normalise(x, tensors, clip=True).tolist() == [[0.0, -1.0], [0.0, 1.0], [0.0, -1.0]]


@pytest.mark.parametrize("normalization", list(LAYOUTS))
def test_the_bins_policy_decodes_every_bin_of_a_flat_dimension_to_its_statistic(normalization, tmp_path):
    """Every bin, sampled or the mode, decodes to C in the flat dimension; the state's flat dimensions normalise as
    OpenVLA's; the bins of an expert action at C decode back to C; the saved policy (what export.py writes for a
    VLA) and its reload decode the same."""
    policy, env, obs = build("bins")
    state_dim = obs["state"].shape[-1]
    policy.set_statistics(statistics(normalization, normalization, state_dim))
    every_bin = policy.env_action(torch.arange(8.0).view(8, 1).expand(8, 3))
    assert torch.equal(every_bin[:, 1], torch.full((8,), C))
    assert every_bin[:, 0].unique().numel() == 8
    with torch.no_grad():
        dist = policy.dist(obs)
    assert torch.equal(policy.env_action(dist.sample())[:, 1], torch.full((2,), C))
    expert = torch.tensor([[0.5, C, 0.5]])
    assert policy.env_action(policy.action_bins(expert))[0, 1] == C
    state = obs["state"].clone()
    state[0, 1::3], state[1, 1::3] = C, C + 0.5  # the state's flat dimensions: at C, above C
    normalised = policy.normalize_state(state)[:, 1::3]
    at, above = {"bounds_q99": (-1.0, 1.0), "bounds": (0.0, 0.0), "normal": (0.0, 1.0)}[normalization]
    assert (normalised[0] == at).all() and (normalised[1] == above).all()
    assert torch.isfinite(policy.normalize_state(state)).all()
    policy.save_pretrained(tmp_path / "vla")
    loaded, _, _ = build("bins", model_path=str(tmp_path / "vla"))
    assert torch.equal(loaded.env_action(torch.arange(8.0).view(8, 1).expand(8, 3)), every_bin)
    assert torch.equal(loaded.normalize_state(state), policy.normalize_state(state))


@pytest.mark.parametrize("normalization", list(LAYOUTS))
def test_the_gaussian_policy_acts_its_statistic_in_a_flat_dimension_with_finite_log_probs(normalization, tmp_path):
    """The Gaussian's samples and mode go to the env as C in the flat dimension; its distribution stays a proper one
    (finite log-probs and entropy: PPO's ratio and GRPO's KL need them)."""
    policy, env, obs = build("gaussian")
    policy.set_statistics(statistics(normalization, normalization, obs["state"].shape[-1]))
    with torch.no_grad():
        dist = policy.dist(obs)
    sample = dist.sample()
    assert torch.equal(policy.env_action(sample)[:, 1], torch.full((2,), C))
    assert torch.equal(policy.env_action(dist.mean)[:, 1], torch.full((2,), C))
    assert torch.equal(policy.env_action(sample)[:, [0, 2]], sample[:, [0, 2]])  # the others as sampled
    assert torch.isfinite(dist.log_prob(sample)).all() and torch.isfinite(dist.entropy()).all()
    policy.save_pretrained(tmp_path / "vla")
    loaded, _, _ = build("gaussian", model_path=str(tmp_path / "vla"))
    assert torch.equal(loaded.env_action(sample), policy.env_action(sample))
