"""Checks that several test files make, written once.

- `one_line_exit`, `exits_in_one_line`: a user's mistake ends a run with one line, ``error: ...``, and no traceback
  (a `SystemExit` whose code is that line).
- `one_line`: an exception's message is one line (the envs' `ValueError` for a bad option).
- `compiled_grads_match`: a loss compiled by torch.compile gives the gradients the eager loss gives.
- `micro_batch_runs`, `pieces_train_like_whole`: minibatches run in pieces (--micro-batch-size) train the weights
  the whole ones train.
- `steps_without_a_host_sync`: an env on a GPU steps without waiting for the host (CUDA tests only).
"""

from __future__ import annotations

import pytest
import torch


def one_line_exit(excinfo: pytest.ExceptionInfo) -> str:
    """The message of the `SystemExit` in ``excinfo``, checked to be one line that starts ``error: ``."""
    message = str(excinfo.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def exits_in_one_line(call) -> str:
    """Call ``call()``, which must exit (`SystemExit`) with one line that starts ``error: ``; return that line."""
    with pytest.raises(SystemExit) as e:
        call()
    return one_line_exit(e)


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    """The message of the exception in ``excinfo``, checked to be one line."""
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def compiled_grads_match(loss_fn, model: torch.nn.Module, batch, args) -> None:
    """``loss_fn(model, batch, args)`` (a loss and its stats) and its torch.compile'd self give the same gradients
    of ``model``'s parameters, to compile's tolerance."""
    grads = []
    for fn in (loss_fn, torch.compile(loss_fn)):
        model.zero_grad()
        loss, _ = fn(model, batch, args)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def micro_batch_runs() -> tuple[tuple[str, dict], ...]:
    """(name, overrides) of the three runs `pieces_train_like_whole` compares: minibatches whole, in pieces of 5,
    and whole with another learning rate (fresh dicts: a test may add to them)."""
    return ("whole", {}), ("pieces", {"micro_batch_size": 5}), ("other_lr", {"learning_rate": 3e-3})


def pieces_train_like_whole(whole: dict, pieces: dict, other_lr: dict) -> None:
    """The model states of three runs: ``pieces`` (micro-batches) ends with the weights of ``whole`` (in fp32, to
    float rounding), and ``other_lr`` (another learning rate) with other actor weights: the updates did move them."""
    for key, value in whole.items():
        assert torch.allclose(value.float(), pieces[key].float(), atol=1e-6, rtol=1e-5), key
    assert any(not torch.allclose(v.float(), other_lr[k].float()) for k, v in whole.items() if "actor" in k)


def steps_without_a_host_sync(env, num_envs: int = 64, act_dim: int = 7) -> tuple:
    """Reset ``env`` (on the GPU, ``num_envs`` envs, actions of ``act_dim``) with seed 0 and step it 6 times with
    random actions: the first step may set things up, the other 5 run with CUDA's sync debug mode on "error", so any
    wait for the host fails. Returns what the last step returned."""
    env.reset(seed=0)
    actions = 2 * torch.rand(6, num_envs, act_dim, device="cuda") - 1
    env.step(actions[0])  # (first calls may set things up)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for action in actions[1:]:
            out = env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return out
