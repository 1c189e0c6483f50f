"""rsl_rl 5.5.1's PPO (its OnPolicyRunner) on our PushCubeRL, matched to ppo_continuous.py's defaults: vs_rsl_rl.py's
peer. Not part of this project's dependencies; rsl_rl comes from a temporary target (benchmarks/peers/vs_rsl_rl.py):

    uv pip install --target /tmp/rsl_rl --no-deps rsl-rl-lib==5.5.1 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3
    PYTHONPATH=/tmp/rsl_rl OMP_NUM_THREADS=1 uv run --extra export python -m benchmarks.peers.rsl_rl_push_cube \\
        --seed 1 --total-timesteps 1000000 --log-dir /tmp/rsl_rl_run

`PushCubeVecEnv` is rsl_rl's `VecEnv` around `make_env("PushCubeRL", ...)`: observations as a TensorDict with one
group, "policy" (the 31 floats PushCubeRL observes), which the runner's "actor" and "critic" sets both read; `step`
returns (observations, rewards, dones, extras) with dones = terminated | truncated and extras["time_outs"] = the
episodes that hit the 50-step limit without succeeding, which rsl_rl bootstraps its way (it adds gamma * V(s_t), the
value of the observation the last action was taken in, to the reward); extras["log"] holds the success of the
episodes that just ended (rsl_rl logs it as `Episode/success_rate`): on CUDA (`--device cuda`, for
benchmarks/gpu_check.py) that selection is a host sync per step, beside the several of rsl_rl's own logger in every
step (the indices of the finished episodes, their sums copied to the host). `episode_length_buf` counts each env's
steps in its episode; rsl_rl only writes it (`init_at_random_ep_len`, which this run does not use, as ours has no
such option).

The settings (`train_cfg`): 256 envs x 20 steps, 4 epochs x 8 minibatches, Adam at 1e-3 annealed linearly to 0 over
the run, gamma 0.8, lambda 0.9, clip 0.2, no entropy bonus, gradient norm 0.5, no value clipping, advantages
normalized per minibatch, actor and critic MLPs [128, 128] with tanh, a Gaussian with a state-independent log-std
starting at exp(-0.5), no observation normalization. The value loss coefficient is 0.25: rsl_rl's value loss is the
mean squared error, ours half of it times vf_coef 0.5. rsl_rl has no linear schedule ("adaptive" or "fixed"): the
run uses "fixed" and a hook sets the optimizer's learning rate before each update to 1e-3 * (1 - i / iterations),
as ours does. Its MLPs start with torch's default initialization; `MLP.init_weights` (rsl_rl's own method) gives
them ours' orthogonal one (gain sqrt(2) in the hidden layers, 0.01 in the actor's last layer, 1 in the critic's,
zero biases). `--compile default` is rsl_rl's `torch_compile_mode="default"` (its actor and critic through
torch.compile); `none` runs eager.

At the end the final policy (deterministic: the Gaussian's mean) is evaluated with this project's `evaluate` (the
function every trainer's final evaluation runs) on 64 envs for 64 episodes, from the same starts as ours' final
evaluation of the same seed and step (`evaluation_seed(seed, global_step)`). `--timings` writes a JSON of when each
phase ended (time.time(): imports, env, runner, learning, evaluation) and the evaluation's result.
"""

from __future__ import annotations

import time

STARTED = time.time()  # (before the imports: what they cost is part of the record)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

try:
    from rsl_rl.env import VecEnv
    from rsl_rl.runners import OnPolicyRunner
except ImportError as e:  # (one line that says how to get it)
    raise ImportError(
        "rsl_rl is neither a dependency nor an extra of this project: `uv pip install --target /tmp/rsl_rl --no-deps "
        "rsl-rl-lib==5.5.1 gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3`, then PYTHONPATH=/tmp/rsl_rl",
        name=e.name,
    ) from e

from cleanrl_embodied.shared.envs import make_env  # noqa: E402
from cleanrl_embodied.shared.evaluation import evaluate, evaluation_seed  # noqa: E402
from cleanrl_embodied.shared.random_streams import stream_seed  # noqa: E402

IMPORTED = time.time()

ENV_ID = "PushCubeRL"
OBS_GROUP = "policy"


class PushCubeVecEnv(VecEnv):
    """rsl_rl's VecEnv interface around `make_env(env_id, num_envs, device, seed)` (the module docstring)."""

    def __init__(self, num_envs: int, device: str = "cpu", seed: int = 0, env_id: str = ENV_ID, **env_kwargs):
        self.env = make_env(env_id, num_envs=num_envs, device=device, seed=seed, **env_kwargs)
        self.num_envs = num_envs
        self.num_actions = math.prod(self.env.single_action_space.shape)
        self.max_episode_length = int(self.env.unwrapped.max_episode_steps)
        self.device = torch.device(device)
        self.cfg = {"env_id": env_id, "num_envs": num_envs, "seed": seed, **env_kwargs}
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._obs, _ = self.env.reset(seed=seed)

    def get_observations(self) -> TensorDict:
        return TensorDict({OBS_GROUP: self._obs}, batch_size=[self.num_envs], device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        self._obs, rewards, terminated, truncated, info = self.env.step(actions)
        dones = terminated | truncated
        self.episode_length_buf = torch.where(dones, 0, self.episode_length_buf + 1)
        extras = {"time_outs": truncated & ~terminated}  # a time limit, not a terminal state: rsl_rl bootstraps it
        if bool(dones.any()):
            extras["log"] = {"Episode/success_rate": info["success"][dones].float()}
        return self.get_observations(), rewards, dones.long(), extras

    def close(self) -> None:
        self.env.close()


def train_cfg(args: argparse.Namespace) -> dict:
    """OnPolicyRunner's configuration: ppo_continuous.py's defaults where rsl_rl has the setting (module docstring)."""
    mlp = {"class_name": "MLPModel", "hidden_dims": [128, 128], "activation": "tanh", "obs_normalization": False}
    return {
        "num_steps_per_env": args.num_steps,
        "save_interval": 10**9,  # (rsl_rl saves at iteration 0 and at the end; ours at the end)
        "obs_groups": {"actor": [OBS_GROUP], "critic": [OBS_GROUP]},
        "logger": "tensorboard",
        "torch_compile_mode": None if args.compile == "none" else args.compile,
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": 4,
            "num_mini_batches": 8,
            "clip_param": 0.2,
            "gamma": 0.8,
            "lam": 0.9,
            "value_loss_coef": 0.25,
            "entropy_coef": 0.0,
            "learning_rate": args.learning_rate,
            "max_grad_norm": 0.5,
            "optimizer": "adam",
            "use_clipped_value_loss": False,
            "schedule": "fixed",
            "desired_kl": None,
            "normalize_advantage_per_mini_batch": True,
        },
        "actor": {
            **mlp,
            "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": math.exp(-0.5), "std_type": "log"},
        },
        "critic": dict(mlp),
    }


def orthogonal_init(runner: OnPolicyRunner) -> None:
    """ppo_continuous.py's initialization through rsl_rl's `MLP.init_weights` (gains per module index of the
    Sequential: Linear, Tanh, Linear, Tanh, Linear)."""
    root2 = math.sqrt(2)
    runner.alg.get_policy().mlp.init_weights([root2, 0, root2, 0, 0.01])
    runner.alg._raw_critic.mlp.init_weights([root2, 0, root2, 0, 1.0])


def anneal_learning_rate(runner: OnPolicyRunner, iterations: int, learning_rate: float) -> None:
    """Linear annealing, which rsl_rl lacks: before update i (0-based) the learning rate is lr * (1 - i / N)."""
    alg, update, calls = runner.alg, runner.alg.update, [0]

    def annealed_update():
        lr = learning_rate * (1.0 - calls[0] / iterations)
        calls[0] += 1
        alg.learning_rate = lr
        for group in alg.optimizer.param_groups:
            group["lr"] = lr
        return update()

    alg.update = annealed_update


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-timesteps", type=int, default=1_000_000)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--num-steps", type=int, default=20)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu", help="where the envs and the runner live (cpu, cuda)")
    parser.add_argument("--compile", choices=("none", "default"), default="none", help="rsl_rl's torch_compile_mode")
    parser.add_argument("--num-eval-envs", type=int, default=64)
    parser.add_argument("--num-eval-episodes", type=int, default=64)
    parser.add_argument("--log-dir", default=None, help="rsl_rl's log_dir (TensorBoard, models); none: no logging")
    parser.add_argument("--timings", default=None, help="write the phase times and the evaluation here (JSON)")
    args = parser.parse_args(argv)
    if min(args.total_timesteps, args.num_envs, args.num_steps, args.num_eval_envs, args.num_eval_episodes) < 1:
        parser.error("--total-timesteps, --num-envs, --num-steps and the eval sizes must be positive")
    iterations = max(1, args.total_timesteps // (args.num_envs * args.num_steps))
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    times = {"started": STARTED, "imported": IMPORTED}
    device = args.device
    env = PushCubeVecEnv(args.num_envs, device, stream_seed(args.seed, "train_envs"))
    eval_env = make_env(ENV_ID, num_envs=args.num_eval_envs, device=device, seed=stream_seed(args.seed, "eval_envs"))
    times["env_built"] = time.time()
    runner = OnPolicyRunner(env, train_cfg(args), log_dir=args.log_dir, device=device)
    orthogonal_init(runner)
    anneal_learning_rate(runner, iterations, args.learning_rate)
    times["runner_built"] = time.time()
    runner.learn(num_learning_iterations=iterations)
    times["learned"] = time.time()

    global_step = iterations * args.num_envs * args.num_steps
    policy = runner.get_inference_policy(device=device)  # deterministic: the Gaussian's mean

    def act(obs, generator, starts):
        return policy(TensorDict({OBS_GROUP: obs}, batch_size=obs.shape[:1]))

    result = evaluate(act, eval_env, args.num_eval_episodes, evaluation_seed(args.seed, global_step))
    times["evaluated"] = time.time()
    print(f"eval: global_step={global_step} {result}", flush=True)
    env.close()
    eval_env.close()
    record = {"times": times, "iterations": iterations, "global_step": global_step, "eval": result,
              "compile": args.compile, "device": device, "torch_threads": torch.get_num_threads()}  # fmt: skip
    if args.timings:
        Path(args.timings).write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
