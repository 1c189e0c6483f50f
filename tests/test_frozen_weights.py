"""Policies with a frozen part (a pretrained backbone fine-tuned through adapters): checkpoints hold only what trains
plus a fingerprint of the rest, a checkpoint never serves another backbone, resume stays bit-identical, the optimizer
holds only trainable parameters, and GRPO uses a policy's own KL reference instead of copying the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cleanrl_embodied import grpo, grpo_vla, ppo_vla, ppo_vla_async, ppo_vla_ddp
from cleanrl_embodied.shared.model_state import frozen_fingerprint, model_state
from tests.trainer_args import FOUR_ENVS, tiny_args

SCRIPTS = {"ppo_vla": ppo_vla, "ppo_vla_ddp": ppo_vla_ddp, "ppo_vla_async": ppo_vla_async, "grpo_vla": grpo_vla,
           "grpo": grpo}  # fmt: skip
WIDTH = 128  # the toy frozen backbone: WIDTH x WIDTH weights and WIDTH biases, never trained


# 4 iterations, a checkpoint after the 2nd and 4th; toy_policies' frozen_backbone (its hidden_sizes: grpo's built-in
# actor's size, which the VLA trainers do not have)
FOUR_ITERATIONS = dict(
    FOUR_ENVS, env_id="PushCubeRL", seed=1, num_steps=4, update_epochs=1, total_timesteps=4 * 4 * 4, eval_freq=0,
    save_freq=2, hidden_sizes=(16,), policy="toy_policies:frozen_backbone", policy_kwargs=json.dumps({"width": WIDTH}),
)  # fmt: skip


def tiny(name: str, out: Path, **kw):
    return tiny_args(name, out, FOUR_ITERATIONS, **kw)


def run(name: str, out: Path, **kw) -> dict:
    SCRIPTS[name].main(tiny(name, out, **kw))
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return {"run_dir": run_dir, "last": torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)}


@pytest.mark.parametrize("name", ["ppo_vla", "ppo_vla_ddp", "ppo_vla_async", "grpo_vla"])
def test_checkpoints_hold_what_trains_and_resume_bit_identically(name, tmp_path):
    straight = run(name, tmp_path / "a")
    ckpt = straight["last"]
    assert not any(key.startswith("backbone.") for key in ckpt["model"])  # the frozen part is not written
    assert any(key.startswith("actor") for key in ckpt["model"]) and len(ckpt["frozen"]) == 64  # sha256 hex
    assert all(len(state) > 0 for state in ckpt["optimizer"]["state"].values())
    n_frozen = WIDTH * WIDTH + WIDTH
    trained = sum(v.numel() for v in ckpt["model"].values())
    assert sum(len(g["params"]) for g in ckpt["optimizer"]["param_groups"]) == len(
        [k for k in ckpt["model"] if "obs_rms" not in k and k not in ("action_low", "action_high")]
    )  # the optimizer holds the trainable parameters only (never the frozen ones)
    assert trained < n_frozen  # (the toy's frozen layer outweighs what trains: the saving is real)
    half = straight["run_dir"] / "checkpoints" / "iter_000002.pt"
    resumed = run(name, tmp_path / "b", resume=str(half))
    for key, value in ckpt["model"].items():
        assert torch.equal(value, resumed["last"]["model"][key]), key


@pytest.mark.parametrize("name", ["ppo_vla", "grpo_vla"])
def test_a_checkpoint_never_serves_another_frozen_backbone(name, tmp_path):
    """The toy backbone is drawn from the run's torch stream: another --seed builds another one, which a
    checkpoint of seed 1 must refuse in one line (its trained part was learnt on top of seed 1's backbone)."""
    straight = run(name, tmp_path / "a")
    with pytest.raises(SystemExit) as e:
        SCRIPTS[name].main(tiny(name, tmp_path / "b", seed=2, eval_checkpoint=str(straight["run_dir"] / "checkpoints"
                                                                                  / "last.pt")))  # fmt: skip
    message = str(e.value.code)
    assert "frozen weights" in message and "--eval-checkpoint" in message and "\n" not in message


def test_fingerprint_covers_exactly_the_frozen_parameters():
    layer = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    assert frozen_fingerprint(layer) == "" and set(model_state(layer)) == set(layer.state_dict())
    layer[0].requires_grad_(False)
    before = frozen_fingerprint(layer)
    assert set(model_state(layer)) == {"1.weight", "1.bias"}
    with torch.no_grad():
        layer[1].weight.add_(1.0)  # what trains may change freely
    assert frozen_fingerprint(layer) == before
    with torch.no_grad():
        layer[0].bias[0] += 1e-6  # a frozen bit changes: another fingerprint
    assert frozen_fingerprint(layer) != before


def test_grpo_uses_the_policys_own_reference_and_keeps_no_copy(tmp_path):
    """A policy with `reference_dist` (toy_policies.own_reference: the initial actor kept inside the policy) is its
    own KL reference: grpo makes no frozen copy (ref_model None), the KL to it is logged, and --ref-checkpoint,
    which would give another reference, is refused in one line."""
    kw = dict(policy="toy_policies:own_reference", policy_kwargs="{}", kl_coef=0.1)
    out = run("grpo", tmp_path / "a", **kw)
    assert out["last"]["ref_model"] is None
    summary = json.loads((out["run_dir"] / "summary.json").read_text())
    assert summary["train"]["grpo/kl_ref"] > 0.0  # the policy moved away from its reference
    with pytest.raises(SystemExit) as e:
        grpo.main(tiny("grpo", tmp_path / "b", ref_checkpoint=str(out["run_dir"] / "checkpoints" / "last.pt"), **kw))
    assert "reference_dist" in str(e.value.code) and "\n" not in str(e.value.code)
