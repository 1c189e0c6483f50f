"""The transformers VLA (examples/hf_vla) in every VLA trainer: one iteration each (ppo_vla_ddp on two gloo ranks,
replicated and sharded with FSDP2), checkpoints that hold only the adapters and heads, ppo_vla_async snapshots of the
trainable tensors only, GRPO's KL reference without a second model, and bit-identical resume."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer_args import FOUR_ENVS, tiny_args

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

from cleanrl_embodied import grpo_vla, ppo_vla, ppo_vla_async, ppo_vla_ddp, shared
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.model_state import model_state
from examples.hf_vla import make_policy

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"ppo_vla": ppo_vla, "ppo_vla_ddp": ppo_vla_ddp, "ppo_vla_async": ppo_vla_async, "grpo_vla": grpo_vla}
ENV = {"obs_mode": "state+rgb", "image_size": 32, "action_mode": "ee_delta_pos"}
POLICY = {"lora_rank": 4, "head_hidden": 16}


# 2 iterations, a checkpoint after each (grpo_vla in groups of 2)
TWO_ITERATIONS = dict(
    FOUR_ENVS, env_id="PushCubeLangRL", env_kwargs=json.dumps(ENV), seed=1, num_steps=4, update_epochs=1,
    total_timesteps=4 * 4 * 2, eval_freq=0, save_freq=1, policy="examples.hf_vla:make_policy",
    policy_kwargs=json.dumps(POLICY), action_head="bins", action_bins=8, compile="off",
)  # fmt: skip


def vla_args(name: str, out: Path, **kw):
    return tiny_args(name, out, TWO_ITERATIONS, **kw)


def checkpoints(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run / "checkpoints"


def nbytes(state: dict) -> int:
    return sum(v.numel() * v.element_size() for v in state.values())


@pytest.fixture(scope="module")
def policy():
    env = make_env("PushCubeLangRL", num_envs=2, **ENV)
    return make_policy(env.single_observation_space, env.single_action_space, vla_args("ppo_vla", Path(".")),
                       **POLICY)  # fmt: skip


@pytest.mark.parametrize("name", ["ppo_vla", "ppo_vla_async", "grpo_vla", "ppo_vla_ddp"])
def test_every_trainer_trains_the_vla_and_checkpoints_only_what_trains(name, tmp_path, policy):
    SCRIPTS[name].main(vla_args(name, tmp_path))
    ckpt = torch.load(checkpoints(tmp_path) / "last.pt", weights_only=True)
    trainable = {k for k, p in policy.named_parameters() if p.requires_grad}
    assert set(ckpt["model"]) == set(model_state(policy)) and trainable <= set(ckpt["model"])
    assert any("lora_" in k for k in ckpt["model"]) and not any(
        "lora_" not in k and k.startswith("vlm.") for k in ckpt["model"]
    )  # the adapters, never the backbone's own weights
    whole = nbytes(policy.state_dict())
    assert nbytes(ckpt["model"]) < 0.5 * whole and len(ckpt["frozen"]) == 64
    optimized = ckpt["optimizer"]["param_groups"][0]["params"]  # the optimizer holds the trainables, nothing else
    assert len(optimized) == len(trainable) and len(ckpt["optimizer"]["state"]) <= len(trainable)
    if name == "grpo_vla":
        assert "ref_model" not in ckpt  # the policy's reference_dist: adapters off, heads as built; no copy
    if name == "ppo_vla_async":  # the collector's snapshots copy what trains, never the frozen backbone
        for _version, snapshot in ckpt["collector"]["snapshots"].values():
            assert set(snapshot) == set(ckpt["model"])
            assert nbytes(snapshot) <= 2 * nbytes({k: p for k, p in policy.named_parameters() if p.requires_grad})


def test_the_inference_copy_shares_the_vlas_frozen_backbone_and_syncs_what_trains():
    """`shared.inference_copy` of the VLA (ppo_vla_async's collector, ppo_vla_ddp --fsdp's inference copy): every frozen
    parameter is the learner's storage, every trainable one the copy's own; after an update the learner's trainable
    tensors reach the copy through either trainer's sync (the collector's snapshot, FSDP's copy_unsharded_into) and
    the two act alike."""
    env = make_env("PushCubeLangRL", num_envs=2, **ENV)
    args = vla_args("ppo_vla_async", Path("."), num_envs=2, max_staleness=0)
    learner = make_policy(env.single_observation_space, env.single_action_space, args, **POLICY)
    copy = shared.inference_copy(learner)
    frozen = [(n, p, q) for (n, p), q in zip(learner.named_parameters(), copy.parameters()) if not p.requires_grad]
    trained = [(n, p, q) for (n, p), q in zip(learner.named_parameters(), copy.parameters()) if p.requires_grad]
    assert all(p.data_ptr() == q.data_ptr() for _, p, q in frozen) and len(frozen) > len(trained) > 0
    assert all(p.data_ptr() != q.data_ptr() and q.requires_grad for _, p, q in trained)
    assert any("lora_" in n for n, _, _ in trained) and any(n.startswith("value_head.") for n, _, _ in trained)
    obs = env.reset(seed=0)[0]
    dist, value = learner(obs)
    optimizer = torch.optim.Adam([p for _, p, _ in trained], lr=1e-2)
    (value.pow(2).sum() - dist.log_prob(dist.mode).sum()).backward()
    optimizer.step()
    assert not all(torch.equal(p, q) for _, p, q in trained)
    collector = ppo_vla_async.Collector(env, copy, args, total_rollouts=1, device=torch.device("cpu"))
    collector.publish(0, 1, learner)
    snapshot = collector.snapshots[0][1]
    assert set(snapshot) == set(model_state(learner))  # what trains and the buffers, no frozen weight
    copy.load_state_dict(snapshot, strict=False)  # as the collector does before a rollout
    assert all(torch.equal(p, q) for _, p, q in trained)
    with torch.no_grad():
        for *_, q in trained:
            q.zero_()
        shared.copy_unsharded_into(copy, learner)  # ppo_vla_ddp --fsdp's sync after an update
        assert all(torch.equal(p, q) for _, p, q in trained)
        assert torch.equal(learner.dist(obs).logits, copy.dist(obs).logits)
    assert all(p.data_ptr() == q.data_ptr() for _, p, q in frozen)
    env.close()


@pytest.mark.parametrize("name", ["ppo_vla", "ppo_vla_ddp", "ppo_vla_ddp --fsdp", "ppo_vla_async", "grpo_vla"])
def test_a_vla_run_resumes_bit_identically(name, tmp_path):
    """Chunks of 2 actions of 16 bins, under bf16 autocast in pieces of 3: three iterations straight, or one and two
    more resumed (ppo_vla_ddp: in a world of one) give the same adapters and heads, bit for bit. With --fsdp too:
    the LoRA adapters of SigLIP's pooling head, which the policy never uses, get no gradient and so no optimizer
    state, which the sharded optimizer's load must accept (benchmarks/gpu_check.py's dry run found it refused)."""
    kw = dict(total_timesteps=4 * 4 * 2 * 3, action_chunk=2, action_bins=16, autocast="bf16", micro_batch_size=3)
    if name.endswith("--fsdp"):
        name, kw["fsdp"] = "ppo_vla_ddp", True
    SCRIPTS[name].main(vla_args(name, tmp_path / "a", **kw))
    half = checkpoints(tmp_path / "a") / "iter_000001.pt"
    SCRIPTS[name].main(vla_args(name, tmp_path / "b", resume=str(half), **kw))
    straight, resumed = (torch.load(checkpoints(tmp_path / d) / "last.pt", weights_only=True) for d in "ab")
    assert straight["global_step"] == resumed["global_step"] == 96 and resumed["iteration"] == 3
    for key, value in straight["model"].items():
        assert torch.equal(value, resumed["model"][key]), key


def test_a_checkpoint_is_refused_for_another_base_model(tmp_path):
    ppo_vla.main(vla_args("ppo_vla", tmp_path / "a"))
    other = json.dumps({**POLICY, "init_seed": 7})  # another random backbone: the adapters were not trained on it
    with pytest.raises(SystemExit) as e:
        ppo_vla.main(vla_args("ppo_vla", tmp_path / "b", policy_kwargs=other,
                              eval_checkpoint=str(checkpoints(tmp_path / "a") / "last.pt")))  # fmt: skip
    assert "\n" not in str(e.value.code)
    assert "--policy-kwargs" in str(e.value.code) or "frozen weights" in str(e.value.code)


def ddp_worker(out: Path) -> None:
    """Under torchrun, on each of two ranks: the VLA replicated, then sharded with FSDP2, in one process group that
    this worker sets up (main() keeps a group its caller made; a second init_process_group after a destroy in the
    same process can hang in gloo's rendezvous); the sharded run with gradient checkpointing (the same update) and
    what its agent and inference copy hold in fsdp_RANK.json."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    copies, original = [], shared.inference_copy  # (agent, its inference copy) of the sharded run

    def recorded(module):
        copies.append((module, original(module)))
        return copies[-1][1]

    dist.init_process_group("gloo")
    shared.inference_copy = recorded
    try:
        for name, fsdp in (("replicated", False), ("sharded", True)):  # (sharded: with gradient checkpointing too)
            kwargs = json.dumps({**POLICY, "gradient_checkpointing": fsdp})
            ppo_vla_ddp.main(vla_args("ppo_vla_ddp", out / name, fsdp=fsdp, total_timesteps=2 * 4 * 4 * 2,
                                      policy_kwargs=kwargs))  # fmt: skip
        dist.barrier()  # leave together (rank 0 may still be writing; see tests/torchrun.py)
    finally:
        shared.inference_copy = original
        dist.destroy_process_group()
    ((agent, copy),) = copies
    pairs = list(zip(agent.parameters(), copy.parameters()))
    checks = {
        "units": sum(isinstance(m, FSDPModule) for m in agent.modules()),
        "checkpointing": copy.backbone.is_activation_checkpointing,
        "layers": len(copy.fsdp_units()),
        "frozen_shared_whole": all(p.data_ptr() == q.data_ptr() and not isinstance(p, DTensor)
                                   for p, q in pairs if not p.requires_grad),
        "trainable_sharded": all(isinstance(p, DTensor) and not isinstance(q, DTensor)
                                 for p, q in pairs if p.requires_grad),
    }  # fmt: skip
    (out / f"fsdp_{os.environ['RANK']}.json").write_text(json.dumps(checks))


def test_ppo_vla_ddp_trains_the_vla_on_two_ranks_replicated_and_sharded(tmp_path):
    from tests.torchrun import two_ranks as two_ranks_run

    output = two_ranks_run(__file__, str(tmp_path), timeout=900, pythonpath=(str(REPO),))
    replicated, sharded = (torch.load(checkpoints(tmp_path / n) / "last.pt", weights_only=True)
                           for n in ("replicated", "sharded"))  # fmt: skip
    assert replicated["global_step"] == sharded["global_step"] == 2 * 4 * 4 * 2
    assert replicated["model"].keys() == sharded["model"].keys()
    for key, value in replicated["model"].items():  # whole tensors, the same update up to float rounding
        torch.testing.assert_close(sharded["model"][key], value, rtol=1e-3, atol=1e-5)
    assert "fsdp: this rank holds" in output
    for rank in (0, 1):  # each layer its own unit; the frozen backbone whole, once: the agent's and its copy's
        checks = json.loads((tmp_path / f"fsdp_{rank}.json").read_text())
        assert checks == {"units": checks["layers"] + 1, "layers": 4, "checkpointing": True,
                          "frozen_shared_whole": True, "trainable_sharded": True}  # fmt: skip


if __name__ == "__main__":
    ddp_worker(Path(sys.argv[1]))
