"""sb3-contrib's RecurrentPPO on PendulumNoVel-v1 with RL Zoo's recipe: one seed, then one JSON line on stdout.

    uv pip install --target /tmp/sb3 --no-deps sb3-contrib==2.9.2 stable-baselines3==2.9.2
    PYTHONPATH=/tmp/sb3 OMP_NUM_THREADS=1 uv run python -m benchmarks.peers.sb3_recurrent_ppo --seed 1

The peer of benchmarks/experiments/pomdp.py's `pendulum` experiment (that driver starts it). sb3 and sb3-contrib are
not part of this project: they are installed into a folder of their own, without dependencies (the ones they need at run
time, torch, gymnasium, numpy and cloudpickle, are this environment's: the same versions as our trainers run with), and
put on PYTHONPATH for this script alone. (sb3's optional extras, pandas, matplotlib, tensorboard and the rest,
are not needed: nothing here logs, plots or reads CSV files.)

PendulumNoVel-v1 is RL Zoo's (rl_zoo3/import_envs.py, rl_zoo3/wrappers.py `MaskVelocityWrapper`): Pendulum-v1 with
its angular velocity multiplied by 0, so the observation keeps its shape [cos θ, sin θ, 0]. `RECIPE` is the entry
PendulumNoVel-v1 of RL Zoo's hyperparams/ppo_lstm.yml (DLR-RM/rl-baselines3-zoo at 22e3ff2, 2026-04-23; the zoo
calls RecurrentPPO `ppo_lstm`), each value as written there; what the file leaves out is sb3-contrib's default
(batch_size 128, vf_coef 0.5, max_grad_norm 0.5, ...). `normalize: True` is, in RL Zoo's ExperimentManager,
VecNormalize with its defaults (observations and rewards) and the algorithm's gamma (0.9); the evaluation env gets
`norm_reward=False, training=False` there, as here.

Training: `model.learn(total_timesteps)` on 4 DummyVecEnv envs (`make_vec_env`, seeded), timed alone (`train_s`).
RecurrentPPO collects whole rollouts of 4 x 1024 steps, so it runs 25 of them for 100k (102,400 env steps,
`env_steps`). Evaluation: `--eval-episodes` deterministic episodes, one after another on a fresh env seeded with
seed + `EVAL_SEED_OFFSET`, behind a VecNormalize that holds a copy of the training observation statistics, frozen
and without reward normalization, so the returns are Pendulum's own; the LSTM states and `episode_start` flags are
carried from step to step as sb3-contrib's documentation shows (RecurrentPPO, "Example").
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the whole process, from before the imports of torch and sb3

import copy  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import tyro  # noqa: E402

INSTALL = "uv pip install --target /tmp/sb3 --no-deps sb3-contrib==2.9.2 stable-baselines3==2.9.2"
ZOO = "RL Zoo hyperparams/ppo_lstm.yml, PendulumNoVel-v1 (DLR-RM/rl-baselines3-zoo 22e3ff2)"
RECIPE = {  # PendulumNoVel-v1 in RL Zoo's hyperparams/ppo_lstm.yml
    "normalize": True,
    "n_envs": 4,
    "n_timesteps": 100_000,
    "policy": "MlpLstmPolicy",
    "n_steps": 1024,
    "gae_lambda": 0.95,
    "gamma": 0.9,
    "n_epochs": 10,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
    "clip_range": 0.2,
    "use_sde": True,
    "sde_sample_freq": 4,
    "policy_kwargs": "dict(ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True, "
    "net_arch=dict(pi=[64], vf=[64]))",
}
EVAL_SEED_OFFSET = 10_000  # the evaluation env's seed: seed + this (no training env draws from it)


@dataclass
class Args:
    seed: int = 1
    """seed of the model (sb3's set_random_seed) and of the 4 training envs"""
    total_timesteps: int = RECIPE["n_timesteps"]
    """env steps to train (RL Zoo's n_timesteps; RecurrentPPO rounds up to whole rollouts of 4 x 1024)"""
    eval_episodes: int = 10
    """deterministic evaluation episodes after training"""


class MaskVelocity(gym.ObservationWrapper):
    """Pendulum-v1's angular velocity (observation entry 2) multiplied by 0, as RL Zoo's MaskVelocityWrapper does."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.mask = np.array([1.0, 1.0, 0.0], dtype=env.observation_space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self.mask


def make_pendulum_novel() -> gym.Env:
    return MaskVelocity(gym.make("Pendulum-v1"))


def versions() -> dict[str, str]:
    names = ("sb3-contrib", "stable-baselines3", "torch", "gymnasium", "numpy")
    return {name: importlib.metadata.version(name) for name in names}


def evaluate(model, train_env, seed: int, episodes: int) -> list[float]:
    """Returns of `episodes` deterministic episodes on a fresh env, the training observation statistics frozen."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env = VecNormalize(DummyVecEnv([make_pendulum_novel]), training=False, norm_reward=False, gamma=RECIPE["gamma"])
    env.obs_rms = copy.deepcopy(train_env.obs_rms)
    env.seed(seed)
    obs = env.reset()
    lstm_states, episode_starts = None, np.ones((1,), dtype=bool)
    returns, current = [], 0.0
    while len(returns) < episodes:
        action, lstm_states = model.predict(obs, state=lstm_states, episode_start=episode_starts, deterministic=True)
        obs, rewards, dones, _ = env.step(action)
        current += float(rewards[0])  # (norm_reward=False: Pendulum's own reward)
        episode_starts = dones
        if dones[0]:
            returns.append(current)
            current = 0.0
    env.close()
    return returns


def main(args: Args) -> dict:
    try:
        import torch.nn as nn
        from sb3_contrib import RecurrentPPO
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import VecNormalize
    except ImportError as error:
        sys.exit(f"error: sb3-contrib is not importable ({error}); install it with `{INSTALL}` and run this script "
                 "with PYTHONPATH=/tmp/sb3")  # fmt: skip
    env = VecNormalize(
        make_vec_env(make_pendulum_novel, n_envs=RECIPE["n_envs"], seed=args.seed), gamma=RECIPE["gamma"]
    )
    model = RecurrentPPO(
        RECIPE["policy"],
        env,
        n_steps=RECIPE["n_steps"],
        gae_lambda=RECIPE["gae_lambda"],
        gamma=RECIPE["gamma"],
        n_epochs=RECIPE["n_epochs"],
        ent_coef=RECIPE["ent_coef"],
        learning_rate=RECIPE["learning_rate"],
        clip_range=RECIPE["clip_range"],
        use_sde=RECIPE["use_sde"],
        sde_sample_freq=RECIPE["sde_sample_freq"],
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    returns = evaluate(model, env, args.seed + EVAL_SEED_OFFSET, args.eval_episodes)
    eval_s = time.perf_counter() - start
    env.close()
    result = {
        "method": "sb3_recurrent_ppo",
        "seed": args.seed,
        "env_steps": int(model.num_timesteps),
        "train_s": round(train_s, 3),
        "eval_s": round(eval_s, 3),
        "process_s": round(time.perf_counter() - START, 3),
        "eval_return_mean": float(np.mean(returns)),
        "eval_return_std": float(np.std(returns)),
        "eval_returns": returns,
        "batch_size": model.batch_size,  # sb3-contrib's default where the recipe gives none
        "versions": versions(),
        "recipe": RECIPE,
        "recipe_source": ZOO,
    }
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(tyro.cli(Args))
