"""Issue 28: ten defects found in review, one test (or a few) each, every one failing on the code before the fix.

1. Gymnasium ids: at an episode end, ``info["rewards"]``/``info["metrics"]`` describe the last step, not the reset.
2. A checkpoint records its env (id, kwargs, observation layout); a resume or evaluation on another is refused.
3. Every numeric flag of every trainer is checked for its range.
4. PushCubeRL keeps the Panda's velocity and acceleration limits when the fingertip meets a surface.
5. ``--resume A --eval-checkpoint B`` is refused (it evaluated A and called it B).
6. ppo_ddp logs ``rewards/<term>`` as a single process would (tested with two ranks in tests/test_ppo_ddp.py).
7. Independent random streams derived from the run seed.
8. ppo_async (now ppo_vla_async) logs no stale losses for a dropped rollout or an iteration whose steps were skipped.
9. Images below 36 pixels work with the built-in pixel encoder.
10. ppo_async (now ppo_vla_async) snapshots hold only what changes, not frozen weights.

Plus: each trainer still resumes a checkpoint written before these changes (tests/fixtures/, made by main).
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import grpo, ppo_continuous, ppo_ddp, ppo_vla_async
from cleanrl_embodied.shared import make_env
from cleanrl_embodied.shared.evaluation import evaluate

SCRIPTS = {"ppo_continuous": ppo_continuous, "ppo_ddp": ppo_ddp, "ppo_vla_async": ppo_vla_async, "grpo": grpo}
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
    config = {**TINY, **extra, **overrides}
    if name == "ppo_vla_async":  # a VLA trainer: no network of its own (tests/toy_policies.py's ToyVLA), no sizes
        config = {"policy": "toy_policies:ToyVLA", **{k: v for k, v in config.items() if k != "hidden_sizes"}}
    return SCRIPTS[name].Args(output_dir=str(tmp_path), **config)


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


# --------------------------------------------------------------------------- 3. every numeric flag checked
NAN, INF = float("nan"), float("inf")
COMMON_BAD = [
    ({"max_grad_norm": -1.0}, "--max-grad-norm must be > 0, got -1.0"),  # was gradient ascent
    ({"max_grad_norm": 0.0}, "--max-grad-norm must be > 0, got 0.0"),  # was no learning at all
    ({"target_kl": 0.0}, "--target-kl must be > 0, got 0.0"),
    ({"target_kl": -0.1}, "--target-kl must be > 0, got -0.1"),
    ({"clip_coef": 0.0}, "--clip-coef must be > 0, got 0.0"),
    ({"learning_rate": NAN}, "--learning-rate must be a finite number, got nan"),
    ({"learning_rate": INF}, "--learning-rate must be a finite number, got inf"),
    ({"gamma": NAN}, "--gamma must be a finite number, got nan"),
    ({"ent_coef": NAN}, "--ent-coef must be a finite number, got nan"),
    ({"init_logstd": NAN}, "--init-logstd must be a finite number, got nan"),
    ({"seed": -1}, "--seed must be >= 0, got -1"),
]
PPO_BAD = [
    ({"vf_coef": 0.0}, "--vf-coef must be > 0, got 0.0"),  # the critic would never learn
    ({"gae_lambda": NAN}, "--gae-lambda must be a finite number, got nan"),
    ({"clip_obs": NAN}, "--clip-obs must be a finite number, got nan"),
]
CASES = [(name, *case) for name in SCRIPTS for case in COMMON_BAD + (PPO_BAD if name != "grpo" else [])]
CASES = [(n, o, m) for n, o, m in CASES if n != "ppo_vla_async" or not {"init_logstd", "clip_obs"} & set(o)]  # (VLA)
CASES += [("grpo", {"kl_coef": NAN}, "--kl-coef must be a finite number, got nan")]
CASES += [("grpo", {"adv_eps": INF}, "--adv-eps must be a finite number, got inf")]


@pytest.mark.parametrize("name, overrides, message", CASES)
def test_numeric_flags_out_of_range_are_one_line(tmp_path, name, overrides, message):
    got = one_line_error(lambda: SCRIPTS[name].main(tiny(name, tmp_path / "runs", **overrides)))
    assert got.startswith(f"error: {message}"), got
    assert not (tmp_path / "runs").exists()  # refused before anything was built


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_unbounded_clipping_is_still_allowed(name):
    """``inf`` is a meaningful --max-grad-norm (no clipping), as for --clip-obs and --clip-reward."""
    clip_obs = {} if name in ("grpo", "ppo_vla_async") else {"clip_obs": INF}
    args = tiny(name, Path("unused"), max_grad_norm=INF, **clip_obs)
    SCRIPTS[name].validate(*((args, True) if name == "ppo_ddp" else (args,)))


# --------------------------------------------------------------------------- 5. --resume with --eval-checkpoint
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_resume_and_eval_checkpoint_together_are_refused(tmp_path, name):
    first = SCRIPTS[name].main(tiny(name, tmp_path / "a"))
    a = Path(first["run_dir"]) / "checkpoints" / "iter_000001.pt"
    b = Path(first["run_dir"]) / "checkpoints" / "last.pt"
    message = one_line_error(
        lambda: SCRIPTS[name].main(tiny(name, tmp_path / "b", resume=str(a), eval_checkpoint=str(b)))
    )
    assert "--resume" in message and "--eval-checkpoint" in message, message
    assert not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- 2. the env a checkpoint was made for
def first_checkpoint(name: str, tmp_path: Path, **overrides) -> tuple[Path, dict]:
    out = SCRIPTS[name].main(tiny(name, tmp_path / "first", **overrides))
    path = Path(out["run_dir"]) / "checkpoints" / "iter_000001.pt"
    return path, torch.load(path, weights_only=True)


def test_a_checkpoint_records_its_env_options_and_observation_layout(tmp_path):
    kwargs = '{"obs_mode": "dict", "push_friction_range": [0.5, 1.5]}'
    _, ckpt = first_checkpoint("ppo_continuous", tmp_path, env_kwargs=kwargs, eval_env_kwargs='{"obs_mode": "dict"}')
    record = ckpt["env"]
    assert record["env_id"] == "PushCubeRL" and record["env_kwargs"] == json.loads(kwargs)
    assert record["eval_env_kwargs"] == {"obs_mode": "dict"}
    leaves = record["observation"]["leaves"]
    assert record["observation"]["flattened"] and [path for path, _, _ in leaves][:2] == [
        "goal/goal_pos",
        "object/cube_pos",
    ]
    assert sum(int(np.prod(shape)) for _, shape, _ in leaves) == ckpt["obs_dim"] == 31


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.parametrize(
    "option, trained, here",
    [("obs_mode", "dict", "state"), ("action_mode", "joint_pos", "joint_delta")],  # same sizes, other meaning
)
def test_another_observation_or_action_meaning_is_refused(tmp_path, name, option, trained, here):
    kwargs = json.dumps({option: trained})
    path, _ = first_checkpoint(name, tmp_path, env_kwargs=kwargs, eval_env_kwargs=kwargs)
    other = json.dumps({option: here})
    for flag_name, kwargs_flag in (("resume", "env_kwargs"), ("eval_checkpoint", "eval_env_kwargs")):
        args = tiny(name, tmp_path / flag_name, **{flag_name: str(path), "env_kwargs": other, "eval_env_kwargs": other})
        message = one_line_error(lambda args=args: SCRIPTS[name].main(args))
        expected = f"--{flag_name.replace('_', '-')} {path}: its env had {option}={trained!r} (--env-kwargs), this "
        assert message.startswith(f"error: {expected}"), message
        assert f"--{kwargs_flag.replace('_', '-')} give {option}={here!r}" in message, message
        assert not (tmp_path / flag_name).exists()
    # the same options are accepted
    same = tiny(name, tmp_path / "same", eval_checkpoint=str(path), env_kwargs=kwargs, eval_env_kwargs=kwargs)
    assert SCRIPTS[name].main(same)["global_step"] == 20


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_harmless_env_changes_on_resume_are_allowed_and_named(tmp_path, name, capsys):
    """Adding ``randomize_interval`` (an interval-randomization wrapper the saved env state lacks) used to end in a
    KeyError traceback; randomization and friction options change neither observations nor actions."""
    path, _ = first_checkpoint(name, tmp_path)
    kwargs = '{"randomize_interval": 3, "push_friction_range": [0.5, 1.5]}'
    out = SCRIPTS[name].main(tiny(name, tmp_path / "resumed", resume=str(path), env_kwargs=kwargs))
    assert out["global_step"] == 40
    printed = capsys.readouterr().out
    assert (
        f"note: --resume {path}: env options differ from its --env-kwargs: push_friction_range None -> [0.5, 1.5], "
        in printed
    )
    assert "randomize_interval None -> 3 (allowed" in printed, printed


def test_gymnasium_options_must_match_unless_known_to_be_harmless(tmp_path):
    """For ids whose options this code cannot judge, every option counts (a default counts as given); an
    --eval-checkpoint may use the options of the checkpoint's training envs or of its eval envs (which inherit the
    training envs' options, so here both have g=9)."""
    common = dict(env_id="Pendulum-v1", env_kwargs='{"g": 9.0}')
    path, _ = first_checkpoint("ppo_continuous", tmp_path, **common)
    message = one_line_error(
        lambda: ppo_continuous.main(tiny("ppo_continuous", tmp_path / "b", resume=str(path), env_id="Pendulum-v1"))
    )
    assert "its env had g=9.0 (--env-kwargs), this run's --env-kwargs give g=10.0" in message, message
    message = one_line_error(
        lambda: ppo_continuous.main(
            tiny(
                "ppo_continuous",
                tmp_path / "c",
                eval_checkpoint=str(path),
                env_id="Pendulum-v1",
                eval_env_kwargs='{"g": 5.0}',
            )
        )
    )
    assert "its env had g=9.0 (--env-kwargs), this run's --eval-env-kwargs give g=5.0" in message, message
    for eval_kwargs in ('{"g": 9.0}', '{"g": 9.0, "max_episode_steps": 100}'):  # the same env; a harmless change
        ppo_continuous.main(
            tiny(
                "ppo_continuous",
                tmp_path / "d",
                eval_checkpoint=str(path),
                env_id="Pendulum-v1",
                eval_env_kwargs=eval_kwargs,
            )
        )
    resumed = ppo_continuous.main(
        tiny(
            "ppo_continuous",
            tmp_path / "e",
            resume=str(path),
            total_timesteps=3 * 20,
            env_kwargs='{"g": 9.0, "max_episode_steps": 100}',
            env_id="Pendulum-v1",
        )
    )
    assert resumed["global_step"] == 60


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_another_observation_layout_is_refused(tmp_path, name):
    """A checkpoint whose recorded observation entries differ (here: edited, as another version of an env would
    give) is refused in one line naming the first entry that differs."""
    path, ckpt = first_checkpoint(
        name, tmp_path, env_kwargs='{"obs_mode": "dict"}', eval_env_kwargs='{"obs_mode": "dict"}'
    )
    ckpt["env"]["observation"]["leaves"][0][0] = "goal/target"
    torch.save(ckpt, tmp_path / "edited.pt")
    message = one_line_error(
        lambda: SCRIPTS[name].main(
            tiny(
                name,
                tmp_path / "b",
                resume=str(tmp_path / "edited.pt"),
                env_kwargs='{"obs_mode": "dict"}',
                eval_env_kwargs='{"obs_mode": "dict"}',
            )
        )
    )
    assert message == (
        "error: --resume: the checkpoint's observation entry 0 is goal/target (3,) float32 there, goal/goal_pos (3,) "
        "float32 here (pass the env options it was trained with)"
    )


# --------------------------------------------------------------------------- checkpoints written before issue 28
@pytest.mark.parametrize("name", [name for name in SCRIPTS if name != "ppo_vla_async"])  # (ppo_async.pt: refused)
def test_checkpoints_of_the_previous_code_still_resume_and_evaluate(tmp_path, name):
    """tests/fixtures/{name}.pt were written by main before this change (tests/fixtures/make_checkpoints.py): no
    env record, the old random streams. They resume (the env options are checked against the ones in their args)
    and evaluate."""
    from tests.fixtures.make_checkpoints import RUNS

    path = Path(__file__).parent / "fixtures" / f"{name}.pt"
    module, kwargs = RUNS[name]
    assert "env" not in torch.load(path, weights_only=True)
    resumed = module.main(module.Args(output_dir=str(tmp_path / "resumed"), resume=str(path), **kwargs))
    assert resumed["global_step"] == 40
    ckpt = torch.load(Path(resumed["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["iteration"] == 2 and ckpt["env"]["env_id"] == "PushCubeRL"
    evaluated = module.main(module.Args(output_dir=str(tmp_path / "eval"), eval_checkpoint=str(path), **kwargs))
    assert evaluated["global_step"] == 20 and evaluated["eval"]["episodic_length"] > 0
    message = one_line_error(  # and a changed meaning is refused for them too
        lambda: module.main(
            module.Args(
                output_dir=str(tmp_path / "x"),
                resume=str(path),
                **{**kwargs, "env_kwargs": '{"obs_mode": "dict"}', "eval_env_kwargs": '{"obs_mode": "dict"}'},
            )
        )
    )
    assert "its env had obs_mode='state' (--env-kwargs), this run's --env-kwargs give obs_mode='dict'" in message


# --------------------------------------------------------------------------- 8. ppo_async: no stale losses
def scalar_steps(run_dir: str, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)} if tag in acc.Tags()["scalars"] else {}


ASYNC = dict(
    num_envs=8,
    num_steps=10,
    num_minibatches=2,
    update_epochs=2,
    target_kl=None,
    cuda=False,
    num_eval_envs=2,
    num_eval_episodes=2,
    eval_freq=0,
)  # (the policies are tests/toy_policies.py's, on its ToyVLA)


def test_ppo_async_logs_no_losses_for_an_iteration_whose_every_step_was_skipped(tmp_path):
    # 4 training forwards per iteration (2 epochs x 2 minibatches): the first iteration's steps apply, every later
    # one is skipped (NaN loss)
    args = ppo_vla_async.Args(
        output_dir=str(tmp_path),
        total_timesteps=3 * 80,
        max_staleness=0,
        save_freq=0,
        max_consecutive_skips=100,
        policy="toy_policies:nan_loss_after",
        **ASYNC,
    )
    out = ppo_vla_async.main(args)
    assert scalar_steps(out["run_dir"], "charts/skipped_updates") == {80: 0.0, 160: 4.0, 240: 8.0}
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/approx_kl"):
        assert list(scalar_steps(out["run_dir"], tag)) == [80], tag  # not the first iteration's again
    assert list(scalar_steps(out["run_dir"], "losses/explained_variance")) == [80, 160, 240]  # of each rollout


def test_ppo_async_logs_no_losses_for_a_dropped_rollout(tmp_path):
    """A resume with a smaller --max-staleness drops the pending rollouts that became too old. Rollouts 1 and 2 are
    both collected with the initial policy (the collector runs K = 2 ahead of a slow learner), so after the resume
    with K = 1 rollout 1 is learned from (version 1 -> 2) and rollout 2 is dropped: nothing of rollout 1's update
    may be logged again at rollout 2's step."""
    first = ppo_vla_async.main(
        ppo_vla_async.Args(
            output_dir=str(tmp_path / "a"),
            total_timesteps=4 * 80,
            max_staleness=2,
            save_freq=1,
            policy="toy_policies:slow",
            policy_kwargs='{"update_ms": 150}',
            **ASYNC,
        )
    )
    path = Path(first["run_dir"]) / "checkpoints" / "iter_000001.pt"
    pending = torch.load(path, weights_only=True)["collector"]["pending"]
    assert [(p["index"], p["version"]) for p in pending][:2] == [(1, 0), (2, 0)]  # precondition (timing)
    resumed = ppo_vla_async.main(
        ppo_vla_async.Args(
            output_dir=str(tmp_path / "b"),
            total_timesteps=4 * 80,
            max_staleness=1,
            save_freq=0,
            resume=str(path),
            policy="toy_policies:slow",
            policy_kwargs='{"update_ms": 150}',
            **ASYNC,
        )
    )
    assert scalar_steps(resumed["run_dir"], "charts/dropped_rollouts") == {160: 0.0, 240: 1.0, 320: 1.0}
    for tag in ("losses/policy_loss", "losses/explained_variance"):
        assert list(scalar_steps(resumed["run_dir"], tag)) == [160, 320], tag


# --------------------------------------------------------------------------- 9. small images
def test_the_pixel_encoder_takes_images_below_36_pixels():
    from cleanrl_embodied.ppo_continuous import PixelEncoder  # (ppo_ddp.py and grpo.py hold copies of it)

    for shape in ((3, 8, 8), (3, 20, 40), (3, 35, 35), (1, 36, 36), (3, 64, 64)):
        space = gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, shape, np.uint8)})
        torch.manual_seed(0)
        encoder = PixelEncoder(space, state_dim=2, features=16)
        images = torch.randint(0, 256, (5, *shape), dtype=torch.uint8)
        out = encoder(TensorDict(rgb=images, batch_size=[5]), torch.zeros(5, 2))
        assert out.shape == (5, 18) and torch.isfinite(out).all()
        if min(shape[1:]) < 36:  # the same network as for a 36 x 36 image
            torch.manual_seed(0)
            big = PixelEncoder(gym.spaces.Dict({"rgb": gym.spaces.Box(0, 255, (shape[0], 36, 36), np.uint8)}), 2, 16)
            assert encoder.state_dict().keys() == big.state_dict().keys()
            assert all(torch.equal(a, b) for a, b in zip(encoder.state_dict().values(), big.state_dict().values()))


@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_ddp"])  # (the classic trainers' encoder)
def test_a_trainer_learns_from_16_pixel_images(tmp_path, name):
    kwargs = '{"obs_mode": "rgb", "image_size": 16}'
    out = SCRIPTS[name].main(tiny(name, tmp_path, env_kwargs=kwargs, eval_env_kwargs=kwargs, save_freq=0))
    assert out["global_step"] == 40 and out["eval"]["episodic_length"] > 0


# --------------------------------------------------------------------------- 10. ppo_async snapshots
def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_ppo_async_snapshots_hold_what_changes_not_frozen_weights(tmp_path):
    """A snapshot the learner publishes for the collector holds the trainable parameters and the buffers (here the
    bins head's bounds), measured here: exactly what the checkpoint's model holds, and never the
    frozen backbone (256 x 256 + 256 floats, 263 kB), which was copied into every one of the K + 1 snapshots kept
    before; the checkpoint records the backbone's fingerprint instead of its weights."""
    args = ppo_vla_async.Args(
        output_dir=str(tmp_path),
        total_timesteps=3 * 80,
        max_staleness=2,
        save_freq=1,
        action_head="bins",
        action_bins=8,
        policy="toy_policies:frozen_backbone",
        **ASYNC,
    )
    out = ppo_vla_async.main(args)
    ckpt = torch.load(Path(out["run_dir"]) / "checkpoints" / "iter_000002.pt", weights_only=True)
    model = ckpt["model"]  # heads and their buffers: what can change
    assert not any(k.startswith("backbone.") for k in model) and len(ckpt["frozen"]) == 64
    backbone = (256 * 256 + 256) * 4
    assert nbytes(model) < backbone  # (so a snapshot with the backbone would be several times larger)
    assert len(ckpt["collector"]["snapshots"]) >= 2
    for _version, snapshot in ckpt["collector"]["snapshots"].values():
        assert set(snapshot) == set(model)
        assert nbytes(snapshot) == nbytes(model)
    # the collector's copy still acts with the learner's whole policy, frozen part included (toy_policies checks
    # the versions in test_ppo_vla_async); resuming this checkpoint continues the run
    resumed = ppo_vla_async.main(
        ppo_vla_async.Args(
            **{
                **vars(args),
                "output_dir": str(tmp_path / "b"),
                "resume": str(Path(out["run_dir"]) / "checkpoints" / "iter_000002.pt"),
            }
        )
    )
    assert resumed["global_step"] == 240


def test_ppo_async_collector_copies_the_frozen_part_once():
    """Unit level: a snapshot copies the trainable parameters and the buffers, not the frozen parameters the
    collector's copy got once; a frozen parameter changed in place (say, by the user) is noticed and copied from
    then on."""
    args = ppo_vla_async.Args(**{**ASYNC, "num_envs": 2, "action_head": "bins", "action_bins": 8})
    envs = make_env("PushCubeRL", num_envs=2, seed=0)
    import toy_policies

    learner = toy_policies.frozen_backbone(envs.single_observation_space, envs.single_action_space, args, width=64)
    inference = toy_policies.frozen_backbone(envs.single_observation_space, envs.single_action_space, args, width=64)
    collector = ppo_vla_async.Collector(envs, inference, args, total_rollouts=1, device=torch.device("cpu"))
    collector.publish(0, 0, learner)
    assert all(torch.equal(a, b) for a, b in zip(inference.state_dict().values(), learner.state_dict().values()))
    trainable = {k for k, p in learner.named_parameters() if p.requires_grad}
    trainable |= {k for k, _ in learner.named_buffers()}  # the bins head's bounds
    assert set(collector.snapshots[0][1]) == trainable and "action_low" in trainable
    with torch.no_grad():
        learner.backbone.bias.add_(1.0)
    collector.publish(1, 1, learner)
    assert set(collector.snapshots[1][1]) == trainable | {"backbone.bias"}
    envs.close()


# --------------------------------------------------------------------------- 7. independent random streams
def test_sampled_evaluation_draws_from_another_stream_than_the_eval_env():
    env = make_env("PushCubeRL", num_envs=2, seed=0)
    states = []

    def act(obs, gen):
        states.append(gen.get_state())
        return torch.zeros(obs.shape[0], env.single_action_space.shape[0])

    evaluate(act, env, 2, seed=123)
    # PushCubeRL's reset(seed=123) seeds the env's generator with 123: the actions must not replay its numbers
    assert not torch.equal(states[0], torch.Generator().manual_seed(123).get_state())
    env.close()


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_stream_of_a_run_has_its_own_seed(tmp_path, name, monkeypatch):
    """The training envs, the eval envs, torch's global generator (init, sampling, shuffles) and the sampled
    evaluations get unrelated seeds derived from --seed; before, the training envs and torch both got --seed itself
    (a torch.Generator seeded like torch's global one draws the same numbers), and an evaluation's sampling
    generator the eval envs' reset seed."""
    import cleanrl_embodied.shared.cli as cli
    import cleanrl_embodied.shared.evaluation as evaluation

    seeds: dict[str, list[int]] = {"envs": [], "torch": [], "eval_reset": [], "eval_actions": []}
    make_env_, manual_seed, evaluate_ = cli.make_env, torch.manual_seed, evaluation.evaluate
    monkeypatch.setattr(
        cli, "make_env", lambda *a, seed=None, **k: seeds["envs"].append(seed) or make_env_(*a, seed=seed, **k)
    )
    monkeypatch.setattr(torch, "manual_seed", lambda seed: seeds["torch"].append(int(seed)) or manual_seed(seed))

    def recording_evaluate(act, env, num_episodes, seed, *rest):
        def sampling(obs, gen):
            seeds["eval_actions"].append(gen.initial_seed())
            return act(obs, gen)

        seeds["eval_reset"].append(seed)
        return evaluate_(sampling, env, num_episodes, seed, *rest)

    monkeypatch.setattr(evaluation, "evaluate", recording_evaluate)
    SCRIPTS[name].main(tiny(name, tmp_path, eval_deterministic=False, save_freq=0))
    eval_envs, train_envs = seeds["envs"]
    assert seeds["torch"] and seeds["eval_reset"] and seeds["eval_actions"]
    used = [train_envs, eval_envs, seeds["torch"][0], seeds["eval_reset"][0], seeds["eval_actions"][0]]
    assert len(set(used)) == len(used), used
    assert 1 not in used  # --seed 1 itself seeds nothing


def test_env_streams_of_ranks_and_runs_do_not_overlap():
    """ppo_ddp's rank r of seed s used seeds s + r * num_envs + i: rank 1 of seed 1 replayed rank 0 of seed
    1 + num_envs. Now every (seed, rank) has its own stream; their windows of 256 sub-env seeds do not overlap."""
    from cleanrl_embodied.shared.runtime import STREAMS, stream_seed

    starts = sorted(stream_seed(seed, "train_envs", rank) for seed in range(1, 33) for rank in range(8))
    assert all(b - a >= 256 for a, b in zip(starts, starts[1:]))
    streams = {stream_seed(7, name) for name in STREAMS}
    assert len(streams) == len(STREAMS) and max(streams) < 2**30


# --------------------------------------------------------------------------- 4. arm limits at contact
def driving_into_the_table(env, mode: str, step: int) -> torch.Tensor:
    """The worst case for the surface: every joint at full command in the direction that lowers the TCP fastest
    (joint_delta), a target configuration far below the table that way (joint_pos), straight down (ee_delta_pos);
    every fourth step random full commands instead, so the arm also meets the table moving sideways."""
    from cleanrl_embodied.shared.envs import franka

    g = torch.Generator().manual_seed(step)
    if step % 4 == 3:
        return (2 * torch.rand(env.action_space.shape, generator=g) - 1).sign()
    if mode == "ee_delta_pos":
        return torch.cat([0.3 * (2 * torch.rand(env.num_envs, 2, generator=g) - 1), -torch.ones(env.num_envs, 1)], 1)
    down = -franka.tcp_jacobian(env.qpos, env.base_pos)[:, 2].sign()  # [N, 7]
    if mode == "joint_delta":
        return down
    lower, upper = franka.joint_limits()
    return (2 * (env.qpos + 0.8 * down * (upper - lower) - lower) / (upper - lower) - 1).clamp(-1, 1)


@pytest.mark.parametrize("action_mode", ["joint_delta", "joint_pos", "ee_delta_pos"])
def test_arm_limits_hold_when_the_fingertip_meets_the_table_or_the_cube(action_mode):
    """The lift that keeps the TCP on its support (the table, the cube's top) used to be added after the limits:
    joint speeds up to 1.4x the limit, accelerations 5x, when the fingertip met a surface. Now every step keeps
    the velocity and acceleration limits (the TCP brakes before a surface as a joint does before its limit), the
    TCP speed cap and the joint limits, and the TCP stays on the surface (its kinematic position within 1 cm).
    Measured before on this test: joint speeds 2.2x the limit, accelerations 5.9x, the TCP at 2.1 m/s."""
    from cleanrl_embodied.shared.envs import franka
    from cleanrl_embodied.shared.envs.push_cube import CONTROL_DT, TCP_RADIUS, PushCubeRLVecEnv

    velocity_limit, acceleration_limit = franka.motion_limits()
    lower, upper = franka.joint_limits()
    torch.set_num_threads(1)
    env = PushCubeRLVecEnv(num_envs=256, seed=0, action_mode=action_mode, terminate_on_success=False)
    env.reset(seed=0)
    contacts = 0
    for step in range(80):
        qvel, tcp = env.qvel.clone(), env.tcp_pos.clone()
        _, _, terminated, truncated, _ = env.step(driving_into_the_table(env, action_mode, step))
        kept = ~(terminated | truncated)  # (a reset moves the arm to its start pose)
        assert (env.qvel[kept].abs() <= velocity_limit * (1 + 1e-5)).all(), step
        assert ((env.qvel - qvel)[kept].abs() <= acceleration_limit * CONTROL_DT * (1 + 1e-4)).all(), step
        assert ((env.tcp_pos - tcp)[kept].norm(dim=-1) <= franka.MAX_TCP_SPEED * CONTROL_DT * 1.02).all(), step
        assert ((env.qpos >= lower) & (env.qpos <= upper)).all()
        assert (env.tcp_pos[:, 2] >= TCP_RADIUS - 1e-6).all()
        # the kinematic TCP may sink a little where the limits cannot stop it in time (measured: 9 mm, sliding
        # fast along the table; 7.6 cm before); the TCP position observed is held on the surface
        assert (franka.tcp_position(env.qpos, env.base_pos)[:, 2] >= TCP_RADIUS - 0.011).all(), step
        contacts += int((kept & (env.tcp_pos[:, 2] < TCP_RADIUS + 1e-4)).sum())
    assert contacts > 1000  # the arm really pressed on the table, step after step
