"""ppo_vla_ddp.py --fsdp: parameters, gradients and optimizer state sharded over two ranks (FSDP2 on CPU with gloo).

One torchrun launch (module fixture) runs this file as a script on two ranks (see `worker`): the same short run of a
small VLA stand-in (toy_policies.ToyVLA: bins, chunks of 2) with and without --fsdp (the sharded update must equal
the replicated one up to float rounding: FSDP averages the gradients in the backward, ppo_vla_ddp's own all-reduce
otherwise), then the --fsdp run resumed from its middle checkpoint (bit-identical, starting at the checkpoint's
iteration + 1), and a run with a frozen part (a pretrained backbone stand-in) that never trains.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cleanrl_embodied import ppo_vla_ddp as ddp

RUN = dict(
    env_id="PushCubeRL", num_envs=8, num_steps=10, num_minibatches=2, update_epochs=2, num_eval_envs=4,
    num_eval_episodes=4, cuda=False, total_timesteps=4 * 2 * 80 * 2, eval_freq=2, save_freq=2, target_kl=None,
    compile="off", policy="toy_policies:ToyVLA", policy_kwargs=json.dumps({"hidden": 32}), action_head="bins",
    action_bins=16, action_chunk=2,
)  # fmt: skip


def worker(out_dir: Path) -> None:
    """Runs on each rank under torchrun (`python tests/test_ppo_ddp_fsdp.py OUT_DIR`)."""
    rank = int(os.environ["RANK"])
    # One group for every run, which main() keeps (a second init_process_group after a destroy in the same
    # process could hang in gloo's rendezvous); tests/test_ppo_ddp.py runs main() on the group it makes itself.
    dist.init_process_group("gloo")
    for name, fsdp in (("replicated", False), ("sharded", True)):
        out = ddp.main(ddp.Args(output_dir=str(out_dir / name), fsdp=fsdp, **RUN))
        torch.save(out["model"], out_dir / f"{name}_model_{rank}.pt")
    # the sharded run, resumed from its iteration-2 checkpoint
    half_way = next((out_dir / "sharded").iterdir()) / "checkpoints" / "iter_000002.pt"
    ddp.main(ddp.Args(output_dir=str(out_dir / "resumed"), fsdp=True, resume=str(half_way), **RUN))
    frozen = dict(RUN, policy="toy_policies:frozen_backbone", policy_kwargs=json.dumps({"width": 64}), action_chunk=1,
                  action_head="gaussian")  # fmt: skip
    out = ddp.main(ddp.Args(output_dir=str(out_dir / "frozen"), fsdp=True, **frozen))
    torch.save(out["model"], out_dir / f"frozen_model_{rank}.pt")
    dist.barrier()  # rank 1 would otherwise tear its end down while rank 0 still evaluates (see tests/torchrun.py)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("fsdp")
    from tests.torchrun import two_ranks as two_ranks_run

    output = two_ranks_run(__file__, str(out_dir), pythonpath=(str(Path(__file__).parent),))  # toy_policies
    (out_dir / "output.txt").write_text(output)
    return out_dir


def last(out_dir: Path, name: str) -> dict:
    return torch.load(next((out_dir / name).iterdir()) / "checkpoints" / "last.pt", weights_only=True)


def test_sharded_training_equals_replicated_training(two_ranks):
    shares = [line for line in (two_ranks / "output.txt").read_text().splitlines() if "fsdp: this rank holds" in line]
    assert shares, "no fsdp line"
    held, total = (int(w) for w in shares[0].split() if w.isdigit())
    assert 0 < held < total  # rank 0 holds a shard, not the whole
    replicated, sharded = last(two_ranks, "replicated"), last(two_ranks, "sharded")
    assert sharded["global_step"] == replicated["global_step"] == 4 * 2 * 80 * 2
    assert sharded["model"].keys() == replicated["model"].keys()
    for key, value in replicated["model"].items():  # whole tensors in the checkpoint, not shards
        assert sharded["model"][key].shape == value.shape, key
        torch.testing.assert_close(sharded["model"][key], value, rtol=1e-4, atol=1e-5)
    for rank in (0, 1):  # every rank ends with the same (whole) weights
        model = torch.load(two_ranks / f"sharded_model_{rank}.pt", weights_only=True)
        for key, value in sharded["model"].items():
            assert torch.equal(model[key], value), key


def test_a_sharded_run_resumes_bit_identically(two_ranks):
    straight, resumed = last(two_ranks, "sharded"), last(two_ranks, "resumed")
    assert resumed["global_step"] == straight["global_step"] and resumed["iteration"] == straight["iteration"] == 4
    assert "start=3" in (two_ranks / "output.txt").read_text()  # iteration 2's checkpoint: 2 x 8 x 10 x 2 x 2 steps
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    assert straight["optimizer"]["state"].keys() == resumed["optimizer"]["state"].keys()
    for name, state in straight["optimizer"]["state"].items():
        assert all(torch.equal(v, resumed["optimizer"]["state"][name][k]) for k, v in state.items()), name


def test_a_frozen_part_stays_whole_and_untrained(two_ranks):
    ckpt = last(two_ranks, "frozen")
    assert not any(k.startswith("backbone.") for k in ckpt["model"]) and len(ckpt["frozen"]) == 64
    models = [torch.load(two_ranks / f"frozen_model_{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert models[0]["backbone.weight"].shape == (64, 64)  # whole on every rank, and the same
    assert torch.equal(models[0]["backbone.weight"], models[1]["backbone.weight"])


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
