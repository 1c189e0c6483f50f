"""ppo_recurrent.py: memory carried through the rollout and reset where episodes start, the update replaying the
rollout exactly, V(final obs) from the memory of that step, a task only memory solves, resume, export, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import toy_policies
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cleanrl_embodied import export, ppo_continuous, ppo_recurrent, shared

CUE = "tests.envs_for_tests:Cue-v0"  # the cue is seen at the first step only; the last step's reward asks for it
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.:FutureWarning"),  # TorchScript is deprecated, still here
    pytest.mark.usefixtures("offline"),  # tests/conftest.py
]
TINY = dict(num_envs=8, num_steps=10, num_minibatches=2, update_epochs=2, num_eval_envs=4, num_eval_episodes=4,
            hidden_sizes=(16,), rnn_hidden_size=16, cuda=False, compile="off", eval_freq=0, save_freq=0)  # fmt: skip


def args(tmp_path: Path, **overrides) -> ppo_recurrent.Args:
    return ppo_recurrent.Args(**{**TINY, "output_dir": str(tmp_path), "total_timesteps": 2 * 80, **overrides})


def scalars(run_dir: str, tag: str) -> list[float]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


@pytest.mark.parametrize("rnn_type", ["lstm", "gru"])
def test_the_update_replays_the_rollout_with_its_memory_resets(tmp_path, rnn_type, monkeypatch):
    """One minibatch, one epoch: the update's first (and only) forward must give the rollout's own log-probs, so its
    approximate KL is 0 up to rounding, although episodes of Cue-v0 (4 steps) end and restart inside every rollout.
    The same replay without the resets (memory carried across episode starts) is measurably off. (A narrow policy
    and a large learning rate make the actor's mean depend on its memory after the first update.)"""
    common = dict(env_id=CUE, num_steps=16, num_minibatches=1, update_epochs=1, target_kl=None, rnn_type=rnn_type,
                  total_timesteps=4 * 8 * 16, learning_rate=1e-2, init_logstd=-2.0)  # fmt: skip
    out = ppo_recurrent.main(args(tmp_path / "a", **common))
    kl = scalars(out["run_dir"], "losses/approx_kl")
    assert len(kl) == 4 and max(abs(v) for v in kl) < 1e-6, kl
    assert scalars(out["run_dir"], "losses/clipfrac") == [0.0] * 4

    unroll = ppo_recurrent.Agent.unroll
    monkeypatch.setattr(ppo_recurrent.Agent, "unroll", lambda self, obs, starts, state: unroll(
        self, obs, torch.zeros_like(starts), state))  # fmt: skip
    broken = ppo_recurrent.main(args(tmp_path / "b", **common))
    assert max(abs(v) for v in scalars(broken["run_dir"], "losses/approx_kl")[1:]) > 1e-4


def test_the_memory_is_zeroed_where_an_episode_starts():
    envs = shared.make_env("PushCubeRL", num_envs=4, seed=0)
    agent = ppo_recurrent.make_agent(envs, args(Path("unused")))
    obs, _ = envs.reset(seed=0)
    state = torch.randn(4, agent.state_size)
    starts = torch.tensor([True, False, True, False])
    with torch.no_grad():
        dist, value, after = agent.step(obs, state, starts)
        zero_dist, zero_value, zero_after = agent.step(obs, torch.zeros_like(state), torch.zeros_like(starts))
        kept_dist, kept_value, _ = agent.step(obs, state, torch.zeros_like(starts))
    assert torch.equal(dist.mean[starts], zero_dist.mean[starts]) and torch.equal(value[starts], zero_value[starts])
    assert torch.equal(after[starts], zero_after[starts])
    assert torch.equal(dist.mean[~starts], kept_dist.mean[~starts]) and torch.equal(value[~starts], kept_value[~starts])
    assert not torch.allclose(dist.mean[~starts], zero_dist.mean[~starts])  # (the memory matters where it is kept)
    assert agent.state_size == 2 * agent.actor_state_size == 2 * 2 * 16  # (an LSTM's h and c, actor and critic)


GAMMA, RADIUS, LIMIT, SCALE, COUNT, ACTION = 0.9, 0.3, 3, 10.0, 1.0, 0.1


def test_truncations_bootstrap_from_the_final_obs_valued_with_the_memory_of_that_step(tmp_path):
    """The return targets the update trains the critic towards, read off the value-loss gradient of a probe
    (tests/toy_policies.py `still_recurrent`, after tests/test_ppo_returns.py): its V counts the observations of the
    episode so far, so a target built from V(final obs) valued with a memory reset at the episode's end (or from the
    next episode's first obs) differs from r + gamma * V(final obs, the memory after that step)."""
    n, t = 8, 8
    toy_policies.PROBE.clear()
    out = ppo_recurrent.main(args(
        tmp_path, env_id="tests.envs_for_tests:PointReach-v0", num_envs=n, num_steps=t, total_timesteps=n * t,
        env_kwargs=json.dumps({"max_episode_steps": LIMIT, "success_radius": RADIUS}), gamma=GAMMA, gae_lambda=0.0,
        num_minibatches=1, update_epochs=1, vf_coef=0.5, eval_env_kwargs='{"max_episode_steps": 3}',
        policy="toy_policies:still_recurrent", policy_kwargs=json.dumps(
            {"action": ACTION, "value_scale": SCALE, "value_index": 2, "count_scale": COUNT}),
    ))  # fmt: skip
    assert out["global_step"] == n * t
    probe = toy_policies.PROBE
    obs = probe["obs"].double()
    targets = probe["value"].double() - probe["value_grad"].double() * n * t / 0.5
    count = (obs[:, 0] / (0.1 * ACTION)).round()  # the point starts each episode at 0 and moves 0.01 per step
    offset = obs[:, 2:] - 0.1 * ACTION  # the offset to the target after the probe's action
    reward = -offset.norm(dim=-1)
    terminated = -reward < RADIUS
    truncated = ~terminated & (count + 1 >= LIMIT)
    assert terminated.any() and truncated.any()  # both kinds of episode end happened in this rollout
    expected = reward + GAMMA * torch.where(terminated, 0.0, SCALE * offset[:, 0] + COUNT * (count + 1))
    torch.testing.assert_close(targets, expected, rtol=1e-4, atol=1e-4)


def test_memory_solves_what_one_observation_cannot(tmp_path):
    """Cue-v0: the cue is seen at the first step, the reward at the fourth asks for its sign. The recurrent trainer
    solves it in a few seconds; ppo_continuous.py, with the same budget, cannot do better than chance."""
    common = dict(env_id=CUE, num_envs=16, num_steps=16, num_minibatches=4, total_timesteps=10 * 256, gamma=0.99,
                  gae_lambda=0.95, learning_rate=3e-3, hidden_sizes=(32,), num_eval_envs=16,
                  num_eval_episodes=64)  # fmt: skip
    memory = ppo_recurrent.main(args(tmp_path / "rnn", **common, rnn_hidden_size=32))
    mlp_args = {**{k: v for k, v in TINY.items() if not k.startswith("rnn")}, **common}
    mlp = ppo_continuous.main(ppo_continuous.Args(**mlp_args, output_dir=str(tmp_path / "mlp")))
    assert memory["eval"]["success_rate"] >= 0.9, memory["eval"]
    assert mlp["eval"]["success_rate"] <= 0.75, mlp["eval"]


def test_resume_is_bit_identical_to_a_straight_run(tmp_path):
    """Every env's memory, whether its next observation starts an episode, and the rest of a resume's state are in
    the checkpoint: 6 iterations straight and 3 + resume + 3 give the same weights bit for bit."""
    common = dict(total_timesteps=6 * 80, save_freq=3, norm_obs=True, norm_reward=True,
                  env_kwargs=json.dumps({"max_episode_steps": 5}))  # (episodes end at iteration 3)  # fmt: skip
    straight = ppo_recurrent.main(args(tmp_path / "a", **common))
    half = Path(straight["run_dir"]) / "checkpoints" / "iter_000003.pt"
    ckpt = torch.load(half, weights_only=True)
    assert ckpt["next_state"].shape == (8, 4 * 16) and ckpt["next_state"].abs().sum() > 0
    assert ckpt["next_starts"].dtype == torch.bool and ckpt["next_starts"].any()  # 3 x 10 steps: some just ended
    resumed = ppo_recurrent.main(args(tmp_path / "b", resume=str(half), **common))
    a = torch.load(Path(straight["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["next_state"], b["next_state"])


def test_pixels_instructions_and_a_privileged_critic_without_memory(tmp_path):
    """Images and instructions go through the same encoder as ppo_continuous.py's; --privileged-critic values the
    privileged entry with an MLP, so only the actor has memory."""
    kwargs = json.dumps({"obs_mode": "proprio+rgb", "image_size": 32, "privileged_state": True})
    out = ppo_recurrent.main(args(tmp_path, env_id="PushCubeLangRL", env_kwargs=kwargs, privileged_critic=True,
                                  norm_obs=True, rnn_type="gru"))  # fmt: skip
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert any(k.startswith("encoder.cnns.") for k in ckpt["model"]) and any(
        k.startswith("encoder.texts.") for k in ckpt["model"]
    )
    assert not any(k.startswith("critic_rnn.") for k in ckpt["model"]) and "critic_rms.mean" in ckpt["model"]
    assert ckpt["next_state"].shape == (8, 16)  # a GRU's h, the actor's alone


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"num_minibatches": 3}, "--num-minibatches must divide --num-envs 8"),
        ({"rnn_hidden_size": 0}, "--rnn-hidden-size"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, overrides, flag):
    with pytest.raises(SystemExit) as e:
        ppo_recurrent.main(args(tmp_path, **overrides))
    assert str(e.value.code).startswith(f"error: {flag}") and "\n" not in str(e.value.code), str(e.value.code)


def test_ppo_continuous_refuses_its_checkpoints_naming_both_files(tmp_path):
    out = ppo_recurrent.main(args(tmp_path / "a"))
    last = str(Path(out["run_dir"]) / "checkpoints" / "last.pt")
    with pytest.raises(SystemExit) as e:
        ppo_continuous.main(ppo_continuous.Args(**{k: v for k, v in TINY.items() if not k.startswith("rnn")},
                                                eval_checkpoint=last, output_dir=str(tmp_path / "b")))  # fmt: skip
    message = str(e.value.code)
    assert message.startswith("error: --eval-checkpoint") and "\n" not in message
    assert (
        str(Path(ppo_recurrent.__file__).resolve()) in message
        and str(Path(ppo_continuous.__file__).resolve()) in message
    )
    assert "Agent (changed)" in message and "eval_action (changed)" in message


def test_the_exported_actor_takes_and_returns_its_memory_and_acts_as_the_evaluation_over_whole_episodes(tmp_path):
    """actor.pt and actor.onnx take the observation and the actor's memory and return the action and the memory
    after it; run over whole episodes (memory zeroed where one starts) they act as the trainer's evaluation does."""
    out = ppo_recurrent.main(args(tmp_path / "run", env_kwargs=json.dumps({"max_episode_steps": 6}), norm_obs=True))
    checkpoint = str(Path(out["run_dir"]) / "checkpoints" / "last.pt")
    description = export.main(export.Args(checkpoint=checkpoint, out=str(tmp_path / "out"), num_check_envs=3))
    assert [i["name"] for i in description["inputs"]] == ["obs", "memory"]
    assert [o["name"] for o in description["outputs"]] == ["action", "next_memory"]
    assert description["check"]["steps"] > 6 and description["check"]["torchscript_max_abs_diff"] <= 1e-5

    # run the file as a robot would, against the trainer's own evaluation policy (not export.py's code)
    actor = torch.jit.load(str(tmp_path / "out" / "actor.pt"))
    ckpt = torch.load(checkpoint, weights_only=True)
    targs = ppo_recurrent.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items()})
    envs = shared.make_env("PushCubeRL", num_envs=2, seed=7, max_episode_steps=6)
    agent = ppo_recurrent.make_agent(envs, targs)
    agent.load_state_dict(ckpt["model"])
    obs, _ = envs.reset(seed=7)
    starts, mine, theirs = torch.ones(2, dtype=torch.bool), torch.zeros(2, agent.actor_state_size), None
    with torch.no_grad():
        for _ in range(14):  # two whole episodes and a bit of the third
            action, mine = ppo_recurrent.eval_action(agent, obs, None, starts, True, mine)
            theirs = torch.zeros_like(mine) if theirs is None else torch.where(starts[:, None], 0.0, theirs)
            exported, theirs = actor(obs, theirs)
            torch.testing.assert_close(exported, action.clamp(-1, 1), rtol=0, atol=1e-5)
            obs, _, terminated, truncated, _ = envs.step(action)
            starts = terminated | truncated


def test_the_compiled_update_agrees_with_the_eager_one():
    """--compile wraps ppo_loss unchanged (the cores' replay stays eager inside it): the same loss and gradients on a
    minibatch of sequences whose episodes start mid-way."""
    from tensordict import TensorDict

    envs = shared.make_env("PushCubeRL", num_envs=4, seed=0)
    targs = args(Path("unused"))
    torch.manual_seed(0)
    agent = ppo_recurrent.make_agent(envs, targs)
    g = torch.Generator().manual_seed(1)
    steps, n = 6, 4
    starts = torch.rand(steps, n, generator=g) < 0.3
    mb = TensorDict(obs=torch.randn(steps, n, envs.single_observation_space.shape[0], generator=g),
                    action=torch.randn(steps, n, 7, generator=g), logprob=torch.randn(steps, n, generator=g) - 5,
                    value=torch.randn(steps, n, generator=g), starts=starts,
                    advantages=torch.randn(steps, n, generator=g), returns=torch.randn(steps, n, generator=g),
                    batch_size=(steps, n))  # fmt: skip
    state = torch.randn(n, agent.state_size, generator=g)
    results = []
    for fn in (ppo_recurrent.ppo_loss, torch.compile(ppo_recurrent.ppo_loss)):
        agent.zero_grad()
        loss, stats = fn(agent, mb, state, targs)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in agent.parameters()]))
    (eager, eager_grads), (compiled, compiled_grads) = results
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
