"""grpo_vla.py: a run with its checkpoints (what trains, the frozen fingerprint, no copy of the reference),
bit-identical resume (with chunks, bins and micro-batches too), outcome advantages over chunks (two successes at
different steps of a chunk tie), the KL to the policy's own reference, forward passes bounded by --micro-batch-size,
and the refusal of grpo.py checkpoints. The policy is tests/toy_policies.py's `ToyVLA` (the trainer has none)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import toy_policies
from grpo_test_helpers import SuccessToy
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied import grpo_vla

TINY = dict(
    num_envs=8, group_size=4, num_steps=5, num_minibatches=2, update_epochs=2, num_eval_envs=4, num_eval_episodes=4,
    eval_freq=0, save_freq=0, cuda=False, compile="off", policy="toy_policies:ToyVLA", policy_kwargs='{"hidden": 32}',
)  # fmt: skip


pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


def tiny_args(tmp_path, iterations: int = 3, **overrides) -> grpo_vla.Args:
    steps = iterations * 8 * 5 * overrides.get("action_chunk", 1)
    return grpo_vla.Args(**{**TINY, "output_dir": str(tmp_path), "total_timesteps": steps, **overrides})


def summary(out: dict) -> dict:
    return json.loads((Path(out["run_dir"]) / "summary.json").read_text())


def scalars(run_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class ChunkSuccess(SuccessToy):
    """Every episode succeeds (reward 1, terminated) early: at its 2nd step if the action given there is > 0, else at
    its 3rd; up to 10 steps. `SUCCESS_STEPS` records the step of every success."""

    SUCCESS_STEPS: list[int] = []

    def succeeds(self, t: int, action) -> bool:
        success = t == 3 or super().succeeds(t, action)
        if success:
            ChunkSuccess.SUCCESS_STEPS.append(t)
        return success


if "GRPOVLAChunkSuccess-v0" not in gym.registry:
    gym.register("GRPOVLAChunkSuccess-v0", entry_point=ChunkSuccess, max_episode_steps=10)


def test_smoke_run_writes_what_trains_and_no_copy_of_the_reference(tmp_path):
    out = grpo_vla.main(tiny_args(tmp_path, eval_freq=2, save_freq=2, kl_coef=0.1))
    s = summary(out)
    assert s["script"] == "grpo_vla" and s["global_step"] == 120 and s["eval"]["episodic_return"] is not None
    for name in ("losses/policy_loss", "grpo/kl_ref", "grpo/mask_frac", "grpo/kept_group_frac", "charts/SPS"):
        assert name in s["train"], name
    names = {p.name for p in (Path(out["run_dir"]) / "checkpoints").iterdir()}
    assert {"last.pt", "best.pt", "iter_000002.pt"} <= names
    ckpt = torch.load(out["checkpoint"], weights_only=True)
    assert ckpt["script"] == "grpo_vla" and ckpt["iteration"] == 3 and "ref_model" not in ckpt
    assert ckpt["frozen"] == ""  # (ToyVLA trains all of itself)
    kl = scalars(out["run_dir"])["grpo/kl_ref"]  # against the policy as built (its reference_dist)
    assert len(kl) == 3 and all(math.isfinite(v) and v >= 0 for v in kl) and kl[-1] > 0


@pytest.mark.parametrize(
    "extra",
    [{}, {"action_chunk": 3, "action_head": "bins", "action_bins": 8, "micro_batch_size": 7, "advantage": "episode"}],
    ids=["gaussian", "chunks_bins_micro"],
)
def test_resume_is_bit_identical_to_a_straight_run(tmp_path, extra):
    common = dict(save_freq=2, eval_freq=2, kl_coef=0.05, **extra)
    straight = grpo_vla.main(tiny_args(tmp_path / "a", iterations=4, **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000002.pt"
    resumed = grpo_vla.main(tiny_args(tmp_path / "b", iterations=4, resume=str(half), **common))
    assert resumed["global_step"] == straight["global_step"] == 4 * 40 * extra.get("action_chunk", 1)
    a, b = (torch.load(r["checkpoint"], weights_only=True) for r in (straight, resumed))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("exp_avg", "exp_avg_sq"):
        for i in a["optimizer"]["state"]:
            assert torch.equal(a["optimizer"]["state"][i][key], b["optimizer"]["state"][i][key])
    assert resumed["eval"] == straight["eval"]


def test_episode_advantages_tie_two_successes_at_different_steps_of_a_chunk(tmp_path):
    """Chunks of 4: every member succeeds inside its first chunk, some at their 2nd env step, some at their 3rd.
    Their undiscounted first-episode returns are all 1, so --advantage episode gives every sample a zero advantage
    (no group is kept by --filter-groups: no update at all). The discounted chunk reward (gamma or gamma^2) that
    --advantage step compares does tell them apart."""
    common = dict(env_id="GRPOVLAChunkSuccess-v0", action_chunk=4, num_steps=3, filter_groups=True, iterations=1)
    ChunkSuccess.SUCCESS_STEPS.clear()
    episode = summary(grpo_vla.main(tiny_args(tmp_path / "episode", advantage="episode", **common)))
    steps = ChunkSuccess.SUCCESS_STEPS[:8]  # the first episode of each of the 8 training envs
    assert sorted(set(steps)) == [2, 3], steps  # both kinds of success happened
    assert episode["train"]["charts/success_rate"] == 1.0
    assert episode["train"]["grpo/zero_adv_group_frac"] == 1.0 and episode["train"]["grpo/kept_group_frac"] == 0.0
    assert "losses/policy_loss" not in episode["train"]  # nothing to learn from
    step = summary(grpo_vla.main(tiny_args(tmp_path / "step", advantage="step", **common)))
    assert step["train"]["grpo/kept_group_frac"] > 0.0 and "losses/policy_loss" in step["train"]


def test_decision_returns_discount_by_the_steps_each_decision_ran():
    """Two decisions of one env: a chunk of 4 steps (discounted reward 1.5), then a decision that ran 2 steps before
    its episode ended (reward 2): the first's return adds the second's times gamma^4."""
    rewards, dones = torch.tensor([[1.5], [2.0]]), torch.tensor([[False], [True]])
    discounts = torch.tensor([[0.5**4], [0.5**2]])
    returns = grpo_vla.decision_returns_to_go(rewards, dones, discounts)
    assert torch.allclose(returns.flatten(), torch.tensor([1.5 + 0.5**4 * 2.0, 2.0]))


@pytest.mark.parametrize("head", ["gaussian", "bins"])
def test_micro_batch_size_bounds_every_forward_pass(tmp_path, head):
    """Rollout (8 envs), the reference's log-probs over the rollout's 40 samples, the update's minibatches of 20 and
    evaluation (4 envs): no forward pass sees more than 3 observations."""
    toy_policies.BATCHES.clear()
    flags = dict(micro_batch_size=3, action_chunk=2, action_head=head, action_bins=8, policy_kwargs="{}")
    out = grpo_vla.main(tiny_args(tmp_path, iterations=2, policy="toy_policies:batch_sizes", **flags))
    assert out["global_step"] == 2 * 40 * 2
    calls = toy_policies.BATCHES
    assert {name for name, _ in calls} == {"dist", "reference_dist"} and max(n for _, n in calls) == 3
    assert sum(n for name, n in calls if name == "reference_dist") == 2 * 40  # every sample, once per iteration


def test_a_grpo_checkpoint_is_refused_in_one_line(tmp_path):
    out = grpo_vla.main(tiny_args(tmp_path / "a", iterations=1))
    ckpt = torch.load(out["checkpoint"], weights_only=True)
    ckpt["script"] = "grpo"  # what grpo.py wrote before the VLA trainers split off (issue 37): no trainer record yet
    del ckpt["trainer"]
    torch.save(ckpt, tmp_path / "old.pt")
    for flag in ("resume", "eval_checkpoint"):
        with pytest.raises(SystemExit) as e:
            grpo_vla.main(tiny_args(tmp_path / "b", iterations=2, **{flag: str(tmp_path / "old.pt")}))
        message = str(e.value.code)
        assert "\n" not in message and "grpo.py" in message and "before the VLA trainers split" in message, message


def test_a_checkpoint_of_todays_grpo_is_refused_naming_both_files(tmp_path):
    """grpo.py's checkpoints record its file and network code (grpo.py's Actor), which is not grpo_vla.py's: one
    line names both files and the definitions that differ, for --resume and --eval-checkpoint."""
    from cleanrl_embodied import grpo

    out = grpo.main(grpo.Args(env_id="PushCubeLangRL", num_envs=8, group_size=4, num_steps=5, total_timesteps=40,
                              num_minibatches=2, update_epochs=1, num_eval_envs=2, num_eval_episodes=2, eval_freq=0,
                              save_freq=0, cuda=False, compile="off", hidden_sizes=(8,),
                              output_dir=str(tmp_path / "grpo")))  # fmt: skip
    checkpoint = str(Path(out["run_dir"]) / "checkpoints" / "last.pt")
    for flag in ("resume", "eval_checkpoint"):
        with pytest.raises(SystemExit) as e:
            grpo_vla.main(tiny_args(tmp_path / "b", iterations=2, **{flag: checkpoint}))
        message = str(e.value.code)
        assert "\n" not in message and str(Path(grpo.__file__).resolve()) in message, message
        assert str(Path(grpo_vla.__file__).resolve()) in message and "make_agent (changed)" in message, message


def test_eval_checkpoint_evaluates_without_training(tmp_path):
    out = grpo_vla.main(tiny_args(tmp_path / "a", iterations=1))
    evaluated = grpo_vla.main(tiny_args(tmp_path / "b", eval_checkpoint=out["checkpoint"]))
    assert evaluated["global_step"] == 40 and evaluated["eval"]["episodic_length"] > 0
    assert not any((Path(tmp_path) / "b").glob("*/checkpoints/*.pt"))  # nothing was trained


def test_a_policy_without_a_reference_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        grpo_vla.main(tiny_args(tmp_path, policy="toy_policies:without_forward", policy_kwargs="{}"))
    assert "reference_dist" in str(e.value.code) and "\n" not in str(e.value.code)
