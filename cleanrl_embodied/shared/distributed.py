"""torch.distributed run-keeping for the data-parallel trainer: joining (or making) the process group, one
error line when a peer is lost, teardown, and the bit-for-bit check that all ranks hold the same weights."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.tensor import DTensor

from cleanrl_embodied.shared.cli import fail
from cleanrl_embodied.shared.model_state import frozen_fingerprint, model_state

__all__ = ["broadcast_model", "check_in_sync", "copy_unsharded_into", "process_group", "unsharded", "unsharded_state"]


def _join(backend: str, cuda: bool, timeout_s: int, create: bool) -> tuple[torch.device, str]:
    """Pick this rank's device; with create=True join torchrun's process group (env:// rendezvous) or, without
    torchrun, make a world of one. Returns (device, backend)."""
    cuda = cuda and torch.cuda.is_available()
    backend = backend if backend != "auto" else ("nccl" if cuda else "gloo")
    device, local_rank = torch.device("cpu"), int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        if local_rank >= torch.cuda.device_count():
            fail(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) here: one GPU per rank, "
                "so lower torchrun's --nproc-per-node"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # a failed/timed-out NCCL op aborts the rank
    if not create:
        return device, dist.get_backend()
    timeout = timedelta(seconds=timeout_s)
    device_id = device if backend == "nccl" else None
    if "MASTER_ADDR" in os.environ:  # launched by torchrun (or another launcher that sets the env:// variables)
        dist.init_process_group(backend, timeout=timeout, device_id=device_id)
    else:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    if backend == "gloo" and dist.get_world_size() > 1:
        dist.monitored_barrier(timeout=timeout)  # names the rank that never arrived
    return device, backend


@contextmanager
def process_group(backend: str, cuda: bool, timeout_s: int) -> Iterator[tuple[torch.device, str]]:
    """Yield (this rank's device, backend) inside torchrun's process group, or a world of one without torchrun
    (a caller that set a group up itself keeps it). An error from a collective (a peer died, stalled past
    ``timeout_s``, or the network failed) becomes one line naming this rank; the group is destroyed at exit, once
    every rank has got there (a run that ends normally; a stop or an error leaves at once)."""
    own_group = not dist.is_initialized()
    rank = int(os.environ.get("RANK", 0))
    try:
        yield _join(backend, cuda, timeout_s, create=own_group)
        if own_group and dist.get_world_size() > 1:
            # Every rank leaves together. Rank 0 still evaluates and writes last.pt when the others are done; a rank
            # that destroyed its group and exited meanwhile could die in gloo's teardown (SIGABRT, seen under load),
            # and torchrun would then stop rank 0 in the middle of its writes.
            dist.barrier()
    except RuntimeError as e:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        if not isinstance(e, dist.DistError) and f"torch{os.sep}distributed" not in tb.tb_frame.f_code.co_filename:
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(
            f"rank {rank}: lost another rank ({reason}); see that rank's output. A slow but live rank "
            f"needs a larger --dist-timeout-s (now {timeout_s})"
        )
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()


def broadcast_model(module: torch.nn.Module) -> None:
    """Every rank starts from rank 0's weights. Rank 0's trainable parameters and buffers (``model_state``) are
    broadcast in place; the frozen ones too, but only where some rank built other frozen weights (their
    fingerprints differ: a randomly initialized frozen part): a pretrained backbone every rank loads from the same
    model_path is never sent."""
    for tensor in model_state(module).values():
        dist.broadcast(tensor, src=0)
    prints = [None] * dist.get_world_size()
    dist.all_gather_object(prints, frozen_fingerprint(module))
    if len(set(prints)) > 1:
        for value in module.parameters():
            if not value.requires_grad:
                dist.broadcast(value.data, src=0)


def unsharded(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor (DTensor, e.g. a parameter under FSDP) gathered whole on every rank (a collective); any other
    tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def copy_unsharded_into(copy: torch.nn.Module, module: torch.nn.Module) -> None:
    """Copy ``module``'s trainable parameters and buffers, gathered whole where FSDP shards them (a collective:
    every rank calls it), into ``copy``, a plain module of the same architecture (``inference_copy``: its frozen
    weights are ``module``'s own, never sharded, so nothing else needs copying)."""
    state = copy.state_dict()
    with torch.no_grad():
        for key, value in model_state(module).items():
            state[key].copy_(unsharded(value))


def unsharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> tuple[dict, dict]:
    """What a checkpoint holds of the model (``model_state``) and of the optimizer, whole: with ``sharded`` (FSDP)
    gathered from every rank (a collective: every rank calls it; the optimizer's state keyed by parameter names,
    as ``torch.distributed.checkpoint`` gives it), else as they are."""
    if not sharded:
        return model_state(module), optimizer.state_dict()
    model = {key: unsharded(value) for key, value in model_state(module).items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return model, get_optimizer_state_dict(module, optimizer, options=options)


def check_in_sync(module: torch.nn.Module, rank: int, when: str) -> None:
    """Fail on every rank unless all ranks hold rank 0's trainable parameters and buffers bit for bit (the frozen
    ones never change after :func:`broadcast_model` compared them)."""
    flat = torch.cat([t.double().reshape(-1) for t in model_state(module).values()])  # float32 -> 64 exact
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([float(not torch.equal(flat, reference))], device=flat.device)
    dist.all_reduce(differs)
    if differs.item() > 0:
        fail(f"{int(differs.item())} rank(s) hold other weights than rank 0 {when}", show=rank == 0)
