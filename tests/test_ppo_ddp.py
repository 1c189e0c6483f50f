"""ppo_ddp.py: gradients really average, ranks stay bit-identical, rank 0 alone writes, a world of one works.

The two-rank tests share ONE torchrun launch (module fixture): importing torch costs seconds per process on
a 2-core machine. Its workers run this file as a script (see `worker`): a short PushCubeRL run through `ppo_ddp.main`,
the gradient-sync check on fixed data, and the run resumed from its middle checkpoint.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from cleanrl_embodied import ppo_continuous
from cleanrl_embodied import ppo_ddp as ddp
from tests.envs_for_tests import spaces
from tests.torchrun import two_ranks as two_ranks_run
from tests.trainer_args import EIGHT_ENVS

TINY = EIGHT_ENVS
RUN = dict(TINY, total_timesteps=6 * 2 * 80, eval_freq=2, save_freq=3, norm_obs=True, norm_reward=True)


def grad_problem(batch_size: int = 64) -> tuple[ddp.Agent, TensorDict, ddp.Args]:
    """A fixed agent and minibatch (same bits in every process). norm_adv is off: per-minibatch advantage
    normalization uses each rank's own minibatch, so only then is the union's gradient the exact average."""
    torch.manual_seed(0)
    args = ddp.Args(hidden_sizes=(32, 32), norm_adv=False, ent_coef=0.01, clip_vloss=True)
    agent = ddp.Agent(*spaces(31, 7), args)
    obs, action = torch.randn(batch_size, 31), torch.randn(batch_size, 7)
    with torch.no_grad():  # old log-probs near the current ones, so some ratios clip and some don't
        logprob = agent.dist(obs).log_prob(action).sum(-1) + 0.3 * torch.randn(batch_size)
    batch = TensorDict(
        obs=obs,
        action=action,
        logprob=logprob,
        value=torch.randn(batch_size),
        advantages=torch.randn(batch_size),
        returns=torch.randn(batch_size),
        batch_size=[batch_size],
    )
    return agent, batch, args


def worker(out_dir: Path) -> None:
    """Runs on each rank under torchrun (`python tests/test_ppo_ddp.py OUT_DIR`)."""
    out = ddp.main(ddp.Args(output_dir=str(out_dir / "runs"), **RUN))  # makes and ends torchrun's env:// group
    torch.save(out["model"], out_dir / f"model_{rank()}.pt")

    # A second group on a fresh store (torchrun's store still holds the first group's keys).
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank(), world_size=2)
    agent, batch, args = grad_problem()
    half = batch.shape[0] // 2
    loss, _ = ddp.ppo_loss(agent, batch[rank() * half : (rank() + 1) * half], args)
    loss.backward()
    mean_loss = ddp.sync_gradients(list(agent.parameters()), 2, loss)
    torch.save({"grads": [p.grad for p in agent.parameters()], "loss": mean_loss}, out_dir / f"grads_{rank()}.pt")
    # the same two ranks continue the run from its iteration-3 checkpoint (rank 0 reads it, sends it to rank 1);
    # main joins the group that exists
    half_way = next((out_dir / "runs").iterdir()) / "checkpoints" / "iter_000003.pt"
    ddp.main(ddp.Args(output_dir=str(out_dir / "resumed"), resume=str(half_way), **RUN))
    dist.barrier()  # leave together (rank 0 may still be writing; see tests/torchrun.py)
    dist.destroy_process_group()


def rank() -> int:
    return int(os.environ["RANK"])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, str]:
    out_dir = tmp_path_factory.mktemp("ddp")
    return out_dir, two_ranks_run(__file__, str(out_dir), timeout=300)


def test_averaged_gradient_equals_the_gradient_of_the_union(two_ranks):
    out_dir, _ = two_ranks
    ranks = [torch.load(out_dir / f"grads_{r}.pt", weights_only=True) for r in range(2)]
    agent, batch, args = grad_problem()
    loss, _ = ddp.ppo_loss(agent, batch, args)  # one process, both halves at once
    loss.backward()
    for p, g0, g1 in zip(agent.parameters(), ranks[0]["grads"], ranks[1]["grads"]):
        assert torch.equal(g0, g1)  # every rank holds the same bits after the sync
        torch.testing.assert_close(g0, p.grad, rtol=0, atol=1e-6)
        assert p.grad.abs().max() > 1e-4  # a real gradient, not zeros matching zeros
    torch.testing.assert_close(ranks[0]["loss"], loss.detach(), rtol=0, atol=1e-6)


def test_parameters_are_bit_identical_on_both_ranks_after_training(two_ranks):
    out_dir, _ = two_ranks
    m0, m1 = (torch.load(out_dir / f"model_{r}.pt", weights_only=True) for r in range(2))
    assert m0.keys() == m1.keys()
    for key in m0:
        assert torch.equal(m0[key], m1[key]), key
    torch.manual_seed(RUN.get("seed", 1))
    init = ddp.Agent(*spaces(31, 7), ddp.Args(**RUN)).state_dict()
    assert not torch.equal(init["actor_mean.0.weight"], m0["actor_mean.0.weight"])  # it did train


def test_two_rank_run_writes_one_run_dir_counting_both_ranks(two_ranks):
    out_dir, output = two_ranks
    run_dirs = list((out_dir / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    run_dir = run_dirs[0]
    assert len(list(run_dir.glob("events.out.tfevents*"))) == 1
    assert output.count("done: global_step=960") == 2  # rank 0 alone logs (the run and its resumed copy)
    assert "world=2 envs/rank=8 batch/rank=80 minibatch/rank=40 global_batch=160 iterations=6" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["script"] == "ppo_ddp" and summary["world_size"] == 2
    assert summary["global_step"] == 6 * 2 * 8 * 10 and summary["sps"] > 0
    assert 0.0 <= summary["eval"]["success_rate"] <= 1.0
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [160 * i for i in range(1, 7)]
    assert {"eval/success_rate", "charts/episodic_return", "losses/value_loss"} <= set(acc.Tags()["scalars"])

    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["global_step"] == 960 and ckpt["iteration"] == 6 and ckpt["world_size"] == 2
    # the normalizers saw every sample of both ranks: 6 iterations x 2 ranks x 80
    assert ckpt["model"]["obs_rms.count"].item() == pytest.approx(960, abs=1e-3)
    assert ckpt["reward_rms"]["count"].item() == pytest.approx(960, abs=1e-3)
    other = ckpt["other_ranks"][0]  # rank 1's own envs and sampling stream
    assert not torch.equal(ckpt["next_obs"], other["next_obs"])
    assert not torch.equal(ckpt["rng"]["torch"], other["rng"]["torch"])


def test_reward_terms_are_logged_as_one_process_would_log_them(two_ranks):
    """rewards/<term> is the mean per env step over all ranks' envs, as one process logs it, not the sum over ranks
    (issue 28: it was the world size times too big). PushCubeRL's time term is -1 at every step of every env, so
    its logged mean is -1 whatever the world size; the weighted reach and place terms stay within [0, 1/3]."""
    out_dir, _ = two_ranks
    acc = EventAccumulator(str(next((out_dir / "runs").iterdir())))
    acc.Reload()
    assert [e.value for e in acc.Scalars("rewards/time")] == [-1.0] * 6  # one per iteration
    for term in ("reach", "place"):
        assert all(0.0 <= e.value <= 1 / 3 + 1e-6 for e in acc.Scalars(f"rewards/{term}")), term


def test_two_rank_resume_is_bit_identical_to_the_straight_run(two_ranks):
    out_dir, output = two_ranks
    assert "iterations=6 start=4 run_dir=" in output  # same world size: every rank's envs and RNG restored
    straight, resumed = (
        torch.load(next((out_dir / d).iterdir()) / "checkpoints" / "last.pt", weights_only=True)
        for d in ("runs", "resumed")
    )
    assert resumed["global_step"] == straight["global_step"] == 960
    for key in straight["model"]:
        assert torch.equal(straight["model"][key], resumed["model"][key]), key
    assert torch.equal(straight["reward_rms"]["var"], resumed["reward_rms"]["var"])
    assert torch.equal(straight["other_ranks"][0]["next_obs"], resumed["other_ranks"][0]["next_obs"])


def test_two_rank_checkpoint_resumes_in_a_world_of_one(two_ranks, tmp_path, capsys):
    out_dir, _ = two_ranks
    half = next((out_dir / "runs").iterdir()) / "checkpoints" / "iter_000003.pt"
    out = ddp.main(ddp.Args(output_dir=str(tmp_path), resume=str(half), **dict(RUN, total_timesteps=960)))
    printed = capsys.readouterr().out
    assert "checkpoint of 2 rank(s) x 8 envs: envs reset freshly" in printed
    assert "learning rate follows" not in printed  # 12 iterations of 80 alone: the same schedule in env steps
    assert out["global_step"] == 960  # 480 from two ranks, then 6 iterations x 80 alone
    acc = EventAccumulator(out["run_dir"])
    acc.Reload()
    assert [e.step for e in acc.Scalars("charts/SPS")] == [480 + 80 * i for i in range(1, 7)]
    lr = torch.load(half, weights_only=True)["args"]["learning_rate"]  # iteration 7 of 12: half of it, as planned
    assert acc.Scalars("charts/learning_rate")[0].value == pytest.approx(lr * (1 - 6 / 12))


def test_world_of_one_without_torchrun_is_ppo_continuous_bit_for_bit(tmp_path):
    common = dict(TINY, total_timesteps=4 * 80, eval_freq=2, save_freq=2, norm_obs=True, norm_reward=True)
    ours = ddp.main(ddp.Args(output_dir=str(tmp_path / "ddp"), **common))
    assert not dist.is_initialized()  # the world-of-one group is gone again
    reference = ppo_continuous.main(ppo_continuous.Args(output_dir=str(tmp_path / "ref"), **common))
    a = torch.load(Path(ours["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(Path(reference["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert ours["eval"] == reference["eval"] and ours["global_step"] == 320
    summary = json.loads((Path(ours["run_dir"]) / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["global_step"] == 320


def test_ppo_ddp_holds_ppo_continuous_agent_and_checks_as_the_same_code():
    """Beyond tests/test_copies_identical.py: the Agent and the --policy hook, parsed from the files as run (the
    normalizer is shared.RunningMeanStd in both)."""
    ours, theirs = (ast.parse(Path(m.__file__).read_text()) for m in (ppo_continuous, ddp))
    names = ("Agent", "make_agent")

    def code(tree: ast.Module) -> dict[str, str]:
        found = {}
        for node in tree.body:
            name = getattr(node, "name", None) or getattr(getattr(node, "targets", [None])[0], "id", None)
            if name in names:
                found[name] = ast.dump(node)
        return found

    assert code(ours) == code(theirs) and len(code(ours)) == len(names)


@pytest.mark.parametrize("key, value", [("action_head", "bins"), ("action_chunk", 4), ("fsdp", True)])
def test_an_old_checkpoint_of_what_the_vla_trainer_has_now_is_one_line_before_any_process_group(
    tmp_path, monkeypatch, key, value
):
    """A checkpoint of the old ppo_ddp.py written with token bins, action chunks or FSDP: ppo_vla_ddp.py trains such
    policies now (issue 37). The same checkpoint as a Gaussian one resumes (tests/test_ppo_continuous.py)."""
    first = ddp.main(ddp.Args(output_dir=str(tmp_path / "a"), **dict(TINY, total_timesteps=80)))
    ckpt = torch.load(Path(first["run_dir"]) / "checkpoints" / "last.pt", weights_only=True)
    old_args = dict(action_head="gaussian", action_bins=256, action_chunk=1, micro_batch_size=None, autocast="none")
    path = tmp_path / "old.pt"
    torch.save(dict(ckpt, frozen="", args={**ckpt["args"], **old_args, "fsdp": False, key: value}), path)

    def too_early(*args, **kwargs):
        raise AssertionError("a process group was built before the checkpoint was checked")

    monkeypatch.setattr(dist, "init_process_group", too_early)
    with pytest.raises(SystemExit) as e:
        ddp.main(ddp.Args(output_dir=str(tmp_path / "b"), resume=str(path), **TINY))
    message = str(e.value.code)
    assert message.startswith(f"error: --resume {path}: written by the old ppo_ddp.py with --{key.replace('_', '-')}")
    assert "ppo_vla_ddp.py" in message and "\n" not in message


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"num_minibatches": 3}, "--num-minibatches"),  # does not divide the per-rank batch 8*10
        ({"num_minibatches": 1000}, "--num-minibatches"),
        ({"num_envs": 0}, "--num-envs"),
        ({"total_timesteps": -1}, "--total-timesteps"),
        ({"dist_timeout_s": 0}, "--dist-timeout-s"),
        ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
        ({"env_kwargs": "not json"}, "--env-kwargs"),
        ({"resume": "/no/such/file.pt"}, "--resume"),
        ({"backend": "nccl"}, "--backend"),
    ],
)
def test_bad_input_is_one_line_before_any_process_group(tmp_path, monkeypatch, overrides, flag):
    if flag == "--backend" and torch.cuda.is_available():
        pytest.skip("--backend nccl is valid where CUDA exists")

    def too_early(*args, **kwargs):
        raise AssertionError("a process group was built before the input was checked")

    monkeypatch.setattr(dist, "init_process_group", too_early)
    with pytest.raises(SystemExit) as e:
        ddp.main(ddp.Args(output_dir=str(tmp_path), **dict(TINY, **overrides)))
    message = str(e.value.code)
    assert message.startswith("error:") and flag in message and "\n" not in message, message
    assert not list(tmp_path.iterdir())


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
