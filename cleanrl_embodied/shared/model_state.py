"""What of a model a checkpoint holds and what it leaves to the factory: ``model_state`` (the trainable parameters and
buffers), ``frozen_fingerprint`` (a hash of the frozen rest, e.g. a pretrained backbone) and ``inference_copy`` (a
copy that acts beside the learner, sharing the frozen part)."""

from __future__ import annotations

import copy
import hashlib

import torch

__all__ = ["frozen_fingerprint", "inference_copy", "model_state"]


def model_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of a model: its state dict without the frozen parameters (``requires_grad`` off),
    i.e. the trainable parameters and the buffers, detached. A pretrained backbone that is not trained (a VLA
    fine-tuned with LoRA) is thus never written: its factory builds it again, and :func:`frozen_fingerprint`
    checks that it is the same. For the trainers' own agents, which train everything, this is the whole state."""
    state = module.state_dict(keep_vars=True)
    return {k: v.detach() for k, v in state.items() if not (isinstance(v, torch.nn.Parameter) and not v.requires_grad)}


def inference_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``module`` that shares its frozen parameters (``requires_grad`` off: the very same tensors, never
    copied) and holds its own copies of the rest, the trainable parameters and the buffers (what :func:`model_state`
    names, and what a trainer copies into it after each update). A copy that acts beside the learner (an async
    collector, FSDP's whole-weight inference copy) thus costs the trainable part, not a second backbone. A frozen
    parameter the learner changed in place would change in the copy too; buffers are never shared (a trainer writes
    the learner's into the copy, which must not write into the learner's)."""
    memo = {id(p): p for p in module.parameters() if not p.requires_grad}  # deepcopy returns these as they are
    return copy.deepcopy(module, memo)


def frozen_fingerprint(module: torch.nn.Module, prefix: str = "") -> str:
    """SHA-256 of the frozen parameters' names, shapes, dtypes and bytes (in name order): what a checkpoint
    records of the part of the model it does not hold ("" when everything trains). ``prefix``: what the names
    carried in the module that wrote the checkpoint, when ``module`` was a part of it (``"policy."``: the policy
    inside ppo_vla.py's privileged-critic wrapper, :func:`without_privileged_critic`)."""
    frozen = sorted((prefix + k, v) for k, v in module.state_dict(keep_vars=True).items()
                    if isinstance(v, torch.nn.Parameter) and not v.requires_grad)  # fmt: skip
    if not frozen:
        return ""
    digest = hashlib.sha256()
    for name, value in frozen:
        tensor = value.detach().contiguous().cpu()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
