"""Peak CPU memory of examples/hf_vla at PaliGemma-3B's real widths, 1 and 2 layers, loaded from a directory:

    uv run python -m benchmarks.experiments.vla_memory                      # --layers 1 2, ~10 min on a 2-core CPU
    uv run python -m benchmarks.experiments.vla_memory --layers 1 --out /tmp/mem

For each depth L (L Gemma layers and L SigLIP layers; Gemma 2B's and SigLIP so400m's widths, vocabulary 257,216)
a policy with random bf16 weights is built and saved with `save_pretrained` (the directory a real checkpoint would
be), then loaded by `make_policy(model_path=...)` in a fresh process, each way:

- `bfloat16`: the directory's own dtype, what a load does now;
- `float32`: `--policy-kwargs '{"dtype": "float32"}'`, what every load did before a directory kept its dtype.

Each process reports its peak resident memory (`ru_maxrss`) after the load, and after one PPO-like step: the action
log-probs (float32 over the bins) and values of a batch of 4 observations, a backward pass into the LoRA adapters and
heads (rank 16, every linear layer), under bf16 autocast.

Then ppo_vla_async's two policies, the learner's and the collector's (each in a fresh process, the directory loaded in
its own dtype), each way:

- `two builds`: the collector's a second `make_policy`, what the trainer did before (a second backbone);
- `shared frozen`: `shared.inference_copy(learner)`, what it does now (the frozen tensors are the learner's).

Each reports its peak resident memory after the learner, after both, and after one no-grad forward of each on the
batch (every weight read), and the bytes the two share. Writes `report.md` and `vla_memory.json` to `--out`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro

from benchmarks.common import REPO, git_info, invocation, machine_info
from benchmarks.suite import provenance

ENV = {"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"}


@dataclass
class Args:
    layers: tuple[int, ...] = (1, 2)
    """depths to measure (layers of each tower)"""
    out: str = str(REPO / "docs" / "results" / "vla-memory-cpu")
    """where report.md and vla_memory.json go"""
    batch: int = 4
    """observations in the measured step"""


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def trainer_args():
    from cleanrl_embodied import ppo_vla

    return ppo_vla.Args(env_id="PushCubeLangRL", env_kwargs=json.dumps(ENV), action_head="bins", action_bins=256,
                        action_chunk=4, autocast="bf16", cuda=False)  # fmt: skip


def spaces():
    from cleanrl_embodied import shared

    env = shared.make_env("PushCubeLangRL", 4, "cpu", seed=0, **ENV)
    return env, env.single_observation_space, env.single_action_space


def build(layers: int, path: str) -> dict:
    """Child: a real-width policy with random bf16 weights, saved as a directory."""
    from benchmarks import real_width_vla as vla

    env, obs_space, act_space = spaces()
    kw = dict(vla.PALIGEMMA_3B, text_layers=layers, vision_layers=layers, lora_rank=16)
    policy = vla.real_width_vla(obs_space, act_space, trainer_args(), **kw)
    policy.save_pretrained(path)
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return {"params": vla.LAST_BUILD["params"], "directory_gib": size / 2**30, "build_peak_gib": peak_gib()}


def load_and_step(path: str, dtype: str | None, batch: int) -> dict:
    """Child: load the directory (its own dtype, or `dtype`), then one PPO-like step on `batch` observations."""
    import torch

    from examples.hf_vla import make_policy

    env, obs_space, act_space = spaces()
    start = time.time()
    kwargs = {"model_path": path, **({"dtype": dtype} if dtype else {})}
    policy = make_policy(obs_space, act_space, trainer_args(), **kwargs)
    loaded = {"load_s": time.time() - start, "after_load_gib": peak_gib()}
    weights = {str(p.dtype).removeprefix("torch.") for p in policy.parameters() if not p.requires_grad}
    obs, _ = env.reset(seed=0)
    obs = obs[:batch]
    start = time.time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dist, value = policy(obs)
        action = dist.sample()
        logprob = dist.log_prob(action)
    loss = -(logprob.flatten(1).sum(-1).float().mean()) + value.float().pow(2).mean()
    loss.backward()
    trained = [p for p in policy.parameters() if p.requires_grad]
    return {**loaded, "frozen_dtypes": sorted(weights), "logprob_dtype": str(logprob.dtype).removeprefix("torch."),
            "step_s": time.time() - start, "after_step_gib": peak_gib(),
            "grads": sum(p.grad is not None for p in trained), "trainable": len(trained)}  # fmt: skip


COPIES = ("two builds", "shared frozen")
"""how the collector's copy is made (see the docstring)"""


def copies(path: str, how: str, batch: int) -> dict:
    """Child: ppo_vla_async's learner and collector policies from the directory (`how`: one of `COPIES`), then one
    no-grad forward of each on `batch` observations under bf16 autocast."""
    import torch

    from cleanrl_embodied import shared
    from examples.hf_vla import make_policy

    env, obs_space, act_space = spaces()
    learner = make_policy(obs_space, act_space, trainer_args(), model_path=path)
    after_learner = peak_gib()
    if how == "two builds":
        collector = make_policy(obs_space, act_space, trainer_args(), model_path=path)
        collector.load_state_dict(learner.state_dict())  # (the first publish copied the learner's whole state)
    else:
        collector = shared.inference_copy(learner)
    after_both = peak_gib()
    obs = env.reset(seed=0)[0][:batch]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        same = torch.equal(learner.dist(obs).logits, collector.dist(obs).logits)
    pointers = {p.data_ptr() for p in learner.parameters()}
    tensors = [*collector.parameters(), *collector.buffers()]
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts) / 2**30
    return {"after_learner_gib": after_learner, "after_both_gib": after_both, "after_forwards_gib": peak_gib(),
            "shared_gib": nbytes(t for t in tensors if t.data_ptr() in pointers),
            "collector_own_gib": nbytes(t for t in tensors if t.data_ptr() not in pointers),
            "same_actions": same}  # fmt: skip


def child(what: str, *argv: str) -> dict:
    code = [sys.executable, __file__, "_" + what, *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(code, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode:
        raise SystemExit(f"error: {what} {argv} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(args: Args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    git, machine = git_info(), machine_info()  # the code that measures, as it starts
    rows, pairs = [], []
    for layers in args.layers:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "vla")
            built = child("build", str(layers), path)
            print(f"[vla_memory] {layers} layer(s): {built}", flush=True)
            for dtype in (None, "float32"):
                measured = child("load", path, dtype or "", str(args.batch))
                row = {"layers": layers, "load": dtype or "its own (bfloat16)", **built, **measured}
                print(f"[vla_memory] {row}", flush=True)
                rows.append(row)
            for how in COPIES:
                measured = child("copies", path, how, str(args.batch))
                pairs.append({"layers": layers, "collector": how, "params": built["params"], **measured})
                print(f"[vla_memory] {pairs[-1]}", flush=True)
    data = {"when": time.strftime("%Y-%m-%d %H:%M"), "invocation": invocation(__file__, sys.argv[1:]),
            "git": git, "args": dataclasses.asdict(args), "rows": rows,
            "async_copies": pairs, "machine": os.uname().machine, "cpus": os.cpu_count()}  # fmt: skip
    (out / "vla_memory.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [
        "# examples/hf_vla at PaliGemma-3B's widths on a CPU: peak memory of a load and one step",
        "",
        f"{data['when']}, {data['cpus']} CPUs, `uv run python -m benchmarks.experiments.vla_memory` "
        f"(batch {args.batch}, bf16 "
        "autocast, LoRA rank 16 on every linear layer, 256 bins per entry, chunks of 4).",
        "",
        "| layers | parameters | directory | load as | frozen weights | peak after load | peak after one step | "
        "load | step | log-probs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        dtypes = ", ".join(r["frozen_dtypes"])
        lines.append(f"| {r['layers']} | {r['params'] / 1e6:.0f}M | {r['directory_gib']:.2f} GiB | {r['load']} | "
                     f"{dtypes} | {r['after_load_gib']:.2f} GiB | {r['after_step_gib']:.2f} GiB | "
                     f"{r['load_s']:.1f} s | {r['step_s']:.1f} s | {r['logprob_dtype']} |")  # fmt: skip
    lines += [
        "",
        "## ppo_vla_async's learner and collector copies",
        "",
        "The directory loaded in its own dtype (bfloat16), then the collector's copy: a second build, or "
        "`shared.inference_copy` of the learner; then one no-grad forward of each (batch "
        f"{args.batch}, bf16 autocast).",
        "",
        "| layers | collector's copy | peak after the learner | peak after both | peak after a forward of each | "
        "shared with the learner | the copy's own | same actions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in pairs:
        lines.append(f"| {r['layers']} | {r['collector']} | {r['after_learner_gib']:.2f} GiB | "
                     f"{r['after_both_gib']:.2f} GiB | {r['after_forwards_gib']:.2f} GiB | {r['shared_gib']:.2f} GiB | "
                     f"{r['collector_own_gib']:.3f} GiB | {r['same_actions']} |")  # fmt: skip
    (out / "report.md").write_text("\n".join(lines) + "\n")
    provenance.record(out, data["invocation"], None, machine, git)
    print("\n".join(lines))
    return data


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_build":
        print(json.dumps(build(int(sys.argv[2]), sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "_copies":
        print(json.dumps(copies(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "_load":
        print(json.dumps(load_and_step(sys.argv[2], sys.argv[3] or None, int(sys.argv[4]))))
    else:
        main(tyro.cli(Args))
