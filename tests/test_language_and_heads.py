"""Instructions in observations, the language-conditioned PushCubeLangRL with its scripted expert, action heads (bins,
chunks), micro-batches, bf16 autocast and GRPO's group filter, in all four trainers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import grpo
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.envs.push_cube import (
    HELDOUT_INSTRUCTIONS,
    OBS_GOAL_CENTRE_COLOR,
    OBS_GOAL_REGION_COLOR,
    TASKS,
    expert_action,
)
from cleanrl_embodied.shared.language import decode_instructions, encode_instructions
from tests.checks import micro_batch_runs, pieces_train_like_whole
from tests.instructed_envs import TARGETS
from tests.trainer_args import ONE_OF_EACH_KIND, tiny_args, trainers

SCRIPTS = trainers(ONE_OF_EACH_KIND)


# ---- instructions ----------------------------------------------------------------------------------------------
def test_instruction_tokens_round_trip_and_refuse_what_does_not_fit():
    texts = ["push the cube to the left", "", "grüß dich"]
    tokens = encode_instructions(texts, 32)
    assert tokens["input_ids"].dtype == torch.int64 and tokens["input_ids"].shape == (3, 32)
    assert tokens["attention_mask"].sum(-1).tolist() == [len(t.encode()) for t in texts]
    assert decode_instructions(tokens) == texts
    with pytest.raises(ValueError, match="bytes long"):
        encode_instructions(["x" * 33], 32)


def test_push_cube_lang_instructions_differ_per_env_and_change_at_reset():
    env = make_env("PushCubeLangRL", num_envs=64, seed=0)
    obs, info = env.reset(seed=1)
    texts = decode_instructions(obs["instruction"])
    names = env.metadata["task_names"]
    assert set(texts) == {TASKS[name][1] for name in names}  # all four among 64 envs
    assert texts == [TASKS[names[t]][1] for t in info["task_id"].tolist()]  # the words name the task the env has
    assert obs["state"].shape == (64, 25)  # no goal position, no cube-to-goal offset: only the words tell
    changed = torch.zeros(64, dtype=torch.bool)
    for _ in range(60):  # every episode ends (truncation at 50 steps) and the next draws its task anew
        before = obs["instruction"]["input_ids"].clone()
        obs, _, _, _, info = env.step(torch.zeros(64, 7))
        final_texts = decode_instructions(info["final_obs"]["instruction"])
        ended = info["_episode"]
        before_texts = decode_instructions(TensorDict(input_ids=before, attention_mask=(before > 0).long()))
        for i in torch.nonzero(ended).flatten().tolist():  # the finished episode's words stay in final_obs
            assert final_texts[i] == before_texts[i]
        changed |= ended & (obs["instruction"]["input_ids"] != before).any(-1)
        assert torch.equal(obs["instruction"]["input_ids"][~ended], before[~ended])  # fixed within an episode
    assert changed.float().mean() > 0.5  # about 3 in 4 envs drew another task


def test_heldout_instructions_keep_the_starts_and_tasks_and_draw_a_paraphrase_per_episode():
    """instructions="heldout": the same seed gives the same starts and tasks as the training instructions, each env's
    words are one of its task's paraphrases (none of them a training instruction), a new episode draws its phrase
    anew, the phrase survives state_dict/load_state_dict, and a bad value is refused in one line."""
    kwargs = {"obs_mode": "state+rgb", "image_size": 32}
    train = make_env("PushCubeLangRL", num_envs=64, seed=0, **kwargs)
    heldout = make_env("PushCubeLangRL", num_envs=64, seed=0, instructions="heldout", **kwargs)
    (a, info_a), (b, info_b) = train.reset(seed=5), heldout.reset(seed=5)
    assert torch.equal(a["state"], b["state"]) and torch.equal(a["rgb"], b["rgb"])
    assert torch.equal(info_a["task_id"], info_b["task_id"])
    names = heldout.metadata["task_names"]
    texts = decode_instructions(b["instruction"])
    assert all(t in HELDOUT_INSTRUCTIONS[names[k]] for t, k in zip(texts, info_b["task_id"].tolist()))
    assert not set(texts) & {text for _, text in TASKS.values()}
    assert set(texts) == {t for name in names for t in HELDOUT_INSTRUCTIONS[name]}  # all 12 among 64
    raw = heldout.unwrapped if hasattr(heldout, "unwrapped") else heldout
    while not hasattr(raw, "state_dict"):
        raw = raw.env
    saved = raw.state_dict()
    assert "phrase" in saved
    for _ in range(55):  # every episode ends at 50 steps; the next one draws task and phrase anew
        obs, *_ = heldout.step(torch.zeros(64, 7))
    after = decode_instructions(obs["instruction"])
    assert after != texts and all(t in HELDOUT_INSTRUCTIONS[names[k]] for t, k in zip(after, raw.task.tolist()))
    raw.load_state_dict(saved)
    assert torch.equal(raw.phrase, saved["phrase"])
    with pytest.raises(ValueError, match='instructions must be "train" or "heldout"'):
        make_env("PushCubeLangRL", num_envs=2, instructions="test")


def test_group_resets_share_the_task_and_rgb_shows_no_goal():
    env = make_env("PushCubeLangRL", num_envs=16, seed=0, obs_mode="rgb", image_size=48)
    obs, info = env.reset(seed=3, options={"group_size": 4})
    tasks = info["task_id"].view(4, 4)
    assert (tasks == tasks[:, :1]).all() and len(set(tasks[:, 0].tolist())) > 1
    pixels = obs["rgb"].permute(0, 2, 3, 1).reshape(-1, 3)
    for color in (OBS_GOAL_REGION_COLOR, OBS_GOAL_CENTRE_COLOR):  # the goal is not drawn: words only
        rgb = torch.tensor([round(255 * c) for c in color], dtype=torch.uint8)
        assert not (pixels == rgb).all(-1).any()


def test_gymnasium_text_observations_pass_through_as_tokens():
    env = make_env("tests.instructed_envs:PointReachText-v0", num_envs=8, seed=0)
    assert env.single_observation_space["instruction"]["input_ids"].shape == (16,)
    obs, _ = env.reset(seed=0)
    texts = decode_instructions(obs["instruction"])
    assert set(texts) <= set(TARGETS) and len(set(texts)) > 1
    assert obs["position"].dtype == torch.float32
    seen = set()
    for _ in range(25):  # every episode ends by step 20: the instructions are drawn again
        obs, _, _, _, info = env.step(torch.zeros(8, 2))
        seen |= set(decode_instructions(obs["instruction"]))
        assert decode_instructions(info["final_obs"]["instruction"])  # the final obs carries its words too
    assert seen == set(TARGETS)


# ---- the scripted expert --------------------------------------------------------------------------------------
def _expert_success(env, steps: int, goal_xy=None) -> tuple[float, dict[str, float], int]:
    env.reset(seed=5)
    names = env.metadata.get("task_names", ())
    ok, n = torch.zeros(len(names) or 1), torch.zeros(len(names) or 1)
    for _ in range(steps):
        goal = None if goal_xy is None else goal_xy(env)
        _, _, _, _, info = env.step(expert_action(env, goal))
        ended, ep = info["_episode"], info["episode"]
        task = ep["task_id"][ended] if names else torch.zeros(int(ended.sum()), dtype=torch.long)
        ok.index_add_(0, task, ep["success"][ended])
        n.index_add_(0, task, torch.ones(len(task)))
    return float(ok.sum() / n.sum()), {name: float(ok[i] / n[i]) for i, name in enumerate(names)}, int(n.sum())


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"action_mode": "ee_delta_pos"}, {"action_mode": "joint_pos"}, {"obs_mode": "rgb", "image_size": 48}],
)
def test_scripted_expert_solves_every_task(kwargs):
    env = make_env("PushCubeLangRL", num_envs=64, seed=0, **kwargs)
    overall, per_task, episodes = _expert_success(env, 80)
    assert episodes >= 200
    assert overall >= 0.95 and min(per_task.values()) >= 0.95, per_task


def test_a_policy_deaf_to_the_instruction_stays_at_chance():
    """The expert pushing every cube the same way (as if always told "forward") solves that task and no other, so
    success is the share of that task, 1/4: the tasks need different behaviour from the same starts."""
    env = make_env("PushCubeLangRL", num_envs=64, seed=0)
    forward = torch.tensor([math.cos(TASKS["forward"][0]), math.sin(TASKS["forward"][0])])

    def always_forward(env):
        raw = env.unwrapped
        start = raw.goal_xy - raw.goal_distance * raw.goal_direction()  # where the cube started
        return start + raw.goal_distance * forward

    overall, per_task, episodes = _expert_success(env, 200, always_forward)
    assert episodes >= 200
    assert per_task["forward"] >= 0.95 and max(per_task[t] for t in ("left", "back", "right")) <= 0.05, per_task
    assert 0.15 <= overall <= 0.35


def _args(script: str, env_id: str, tmp_path: Path, **kw):
    common = dict(
        env_id=env_id, seed=1, num_envs=8, num_steps=4, num_minibatches=2, total_timesteps=8 * 4 * 2, eval_freq=0,
        save_freq=0, num_eval_envs=2, num_eval_episodes=2, hidden_sizes=(16,), cuda=False,
    )  # fmt: skip
    if env_id == "Pendulum-v1":
        common["action_bins"] = 16
    return tiny_args(script, tmp_path, common, default_group_size=4, **kw)


def _train(script: str, args) -> dict:
    SCRIPTS[script].main(args)
    (run,) = [p for p in Path(args.output_dir).iterdir() if p.is_dir()]
    return json.loads((run / "summary.json").read_text()) | {"run_dir": str(run)}


HEADS = {"gaussian": {}, "bins": {"action_head": "bins"}, "chunk": {"action_chunk": 4}}


@pytest.mark.parametrize("env_id", ["PushCubeLangRL", "tests.envs_for_tests:PointReach-v0"])
@pytest.mark.parametrize(  # the classic trainers' bins and chunks: the VLA trainers' since issue 37
    "script, head",  # (tests/test_grpo.py, tests/test_ppo_vla.py)
    [(s, h) for s in SCRIPTS for h in HEADS if s not in ("grpo", "ppo_continuous", "ppo_ddp") or h == "gaussian"],
)
def test_every_trainer_trains_every_head_and_the_first_minibatch_has_ratio_one(script, head, env_id, tmp_path):
    """One iteration, one epoch, one minibatch (the whole rollout): the update's first (and only) minibatch sees
    the behaviour policy itself, so ratio = 1 for every sample, whatever the head."""
    kw = dict(
        HEADS[head], update_epochs=1, num_minibatches=1, total_timesteps=8 * 4 * HEADS[head].get("action_chunk", 1)
    )
    summary = _train(script, _args(script, env_id, tmp_path, **kw))
    assert summary["global_step"] == 8 * 4 * HEADS[head].get("action_chunk", 1)
    train = summary["train"]
    assert abs(train["losses/approx_kl"]) < 1e-6 and train["losses/clipfrac"] == 0.0, train
    assert abs(train["losses/old_approx_kl"]) < 1e-5
    assert summary["eval"]["episodic_return"] is not None


@pytest.mark.parametrize(  # the VLA trainers' since issue 37: tests/test_grpo.py, tests/test_ppo_vla.py
    "script", [s for s in SCRIPTS if s not in ("grpo", "ppo_continuous", "ppo_ddp")]
)
def test_micro_batches_give_the_unsplit_update(script, tmp_path):
    """fp32: minibatches of 16 in pieces of 5 (5 + 5 + 5 + 1) take the same optimizer steps as in one piece (and
    another learning rate gives other weights: the updates do move them). 4 envs, fewer than a piece: the rollout
    also acts in pieces, which would draw other samples from the same random stream."""
    models = []
    for name, kw in micro_batch_runs():
        kw.update(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 2)
        args = _args(script, "PushCubeLangRL", tmp_path / name, update_epochs=2, target_kl=None, **kw)
        summary = _train(script, args)
        assert summary["train"]["charts/skipped_updates"] == 0
        models.append(torch.load(Path(summary["checkpoint"]), weights_only=True)["model"])
    pieces_train_like_whole(*models)


@pytest.mark.parametrize(  # the VLA trainers' since issue 37: tests/test_grpo.py, tests/test_ppo_vla.py
    "script", [s for s in SCRIPTS if s not in ("grpo", "ppo_continuous", "ppo_ddp")]
)
def test_bf16_autocast_trains_and_is_recorded(script, tmp_path):
    summary = _train(script, _args(script, "PushCubeLangRL", tmp_path, autocast="bf16", micro_batch_size=7))
    assert summary["args"]["autocast"] == "bf16" and summary["args"]["micro_batch_size"] == 7
    assert np.isfinite(summary["train"]["losses/policy_loss"])
    model = torch.load(Path(summary["checkpoint"]), weights_only=True)["model"]
    assert all(v.dtype in (torch.float32, torch.float64, torch.int64) for v in model.values())  # fp32 weights


# ---- per-task success and GRPO's group filter ---------------------------------------------------------------------
def test_success_is_logged_per_task_in_training_and_evaluation(tmp_path):
    summary = _train("ppo_continuous", _args("ppo_continuous", "PushCubeLangRL", tmp_path, num_steps=50,
                                             total_timesteps=8 * 50, num_eval_envs=8, num_eval_episodes=8))  # fmt: skip
    names = [f"success_rate/{t}" for t in ("forward", "left", "back", "right")]
    assert any(f"charts/{n}" in summary["train"] for n in names)
    assert all(n in summary["eval"] for n in names)


def test_informative_groups_are_those_whose_returns_differ():
    advantages = torch.zeros(3, 8)
    advantages[1, 5] = 0.3  # group 1 (envs 4..7) has a signal at one time step
    kept = grpo.informative_groups(advantages, 4)
    assert kept.tolist() == [False] * 4 + [True] * 4


def test_grpo_filter_groups_logs_the_kept_fraction(tmp_path):
    sparse = json.dumps({"reward_weights": {"reach": 0, "place": 0, "time": 0, "success": 1}})
    args = _args("grpo", "PushCubeLangRL", tmp_path, filter_groups=True, env_kwargs=sparse, eval_env_kwargs=sparse)
    summary = _train("grpo", args)
    # 0/1 success rewards of an untrained policy: every group's members tie (all failures), none is kept
    assert summary["train"]["grpo/kept_group_frac"] == 0.0
    assert "losses/policy_loss" not in summary["train"]  # nothing to learn from: no update was made


# Checkpoints of ppo_continuous.py / ppo_ddp.py from before the action flags (and from before the VLA trainers split
# off, with them): tests/test_ppo_continuous.py::test_old_checkpoints_load_unless_they_used_what_only_the_vla_...
