"""Issue 28: ten defects found in review, one test (or a few) each, every one failing on the code before the fix.

1. Gymnasium ids: at an episode end, ``info["rewards"]``/``info["metrics"]`` describe the last step, not the reset.
2. A checkpoint records its env (id, kwargs, observation layout); a resume or evaluation on another is refused.
3. Every numeric flag of every trainer is checked for its range.
4. PushCubeRL keeps the Panda's velocity and acceleration limits when the fingertip meets a surface.
5. ``--resume A --eval-checkpoint B`` is refused (it evaluated A and called it B).
6. ppo_ddp logs ``rewards/<term>`` as a single process would (tested with two ranks in tests/test_ppo_ddp.py).
7. Independent random streams derived from the run seed.
8. ppo_async logs no stale losses for a dropped rollout or an iteration whose every step was skipped.
9. Images below 36 pixels work with the built-in pixel encoder.
10. ppo_async snapshots hold only what changes, not frozen weights.

Plus: each trainer still resumes a checkpoint written before these changes (tests/fixtures/, made by main).
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_embodied import grpo, ppo_async, ppo_continuous, ppo_ddp
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.evaluation import evaluate

SCRIPTS = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp, "ppo_async": ppo_async, "grpo": grpo}
TINY = dict(
    num_envs=4,
    num_steps=5,
    num_minibatches=2,
    update_epochs=1,
    num_eval_envs=2,
    num_eval_episodes=2,
    hidden_sizes=(8, 8),
    cuda=False,
    eval_freq=0,
    save_freq=1,
    total_timesteps=2 * 20,
)


def tiny(name: str, tmp_path: Path, **overrides):
    extra = {"group_size": 2} if name == "grpo" else {}
    return SCRIPTS[name].Args(output_dir=str(tmp_path), **{**TINY, **extra, **overrides})


def one_line_error(call) -> str:
    with pytest.raises(SystemExit) as e:
        call()
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


# --------------------------------------------------------------------------- 1. final-step info of Gymnasium ids
TERMS_ENV_ID = "CleanrlEmbodiedTermsTest-v0"


class TermsEnv(gym.Env):
    """Every step reports reward term ``a`` = 1 and metric ``m`` = 7; resets report other numbers (-100, -1), as an
    env may; episodes end (terminated) every third step."""

    metadata = {"render_modes": []}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {"rewards": {"a": -100.0}, "metrics": {"m": -1.0}}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t == 3, False, {"rewards": {"a": 1.0}, "metrics": {"m": 7.0}}


if TERMS_ENV_ID not in gym.registry:
    gym.register(TERMS_ENV_ID, entry_point=TermsEnv, max_episode_steps=50)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_gymnasium_rewards_and_metrics_at_episode_ends_come_from_the_last_step(vectorization):
    env = make_env(TERMS_ENV_ID, num_envs=3, seed=0, vectorization=vectorization)
    env.reset()
    ends = 0
    for _ in range(7):
        _, _, terminated, _, info = env.step(torch.zeros(3, 1))
        ends += int(terminated.sum())
        assert set(info["rewards"]) == {"a"} and set(info["metrics"]) == {"m"}  # no Gymnasium `_a` masks
        assert info["rewards"]["a"].tolist() == [1.0, 1.0, 1.0], (terminated, info["rewards"])
        assert info["metrics"]["m"].tolist() == [7.0, 7.0, 7.0], (terminated, info["metrics"])
    assert ends == 6
    result = evaluate(lambda obs, gen: torch.zeros(obs.shape[0], 1), env, 4, seed=5)
    assert result["m"] == 7.0 and result["episodic_length"] == 3.0
    env.close()


def test_a_trainer_logs_the_terms_of_a_gymnasium_id_without_masks(tmp_path):
    out = ppo_continuous.main(tiny("ppo_continuous", tmp_path, env_id=f"tests.test_review_defects:{TERMS_ENV_ID}"))
    summary = json.loads((Path(out["run_dir"]) / "summary.json").read_text())
    assert summary["train"]["rewards/a"] == 1.0 and "rewards/_a" not in summary["train"]
    assert summary["eval"]["m"] == 7.0
