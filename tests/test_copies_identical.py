"""The algorithm is copied between trainers on purpose (one file per variant, as in CleanRL), and the copies must not
drift: every function, class or constant listed here is the same code, docstring included, in every file that
copies it (compared as parsed Python, so formatting alone cannot hide a difference)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "cleanrl_embodied"

CLASSIC = ("ppo_continuous", "ppo_ddp", "grpo", "ppo_recurrent")
PPO_CLASSIC = ("ppo_continuous", "ppo_ddp")
PPO_MEMORY = (*PPO_CLASSIC, "ppo_recurrent")  # what the recurrent trainer shares with the other classic PPOs
PPO_VLA = ("ppo_vla", "ppo_vla_ddp", "ppo_vla_async")
VLA = (*PPO_VLA, "grpo_vla")

COPIES: list[tuple[str, tuple[str, ...]]] = [
    # every trainer
    ("clip_gradients", (*CLASSIC, *VLA)),
    # the classic family's networks and its PPO
    ("layer_init", CLASSIC),
    ("mlp", CLASSIC),
    ("InstructionEncoder", CLASSIC),
    ("PixelEncoder", CLASSIC),
    ("Agent", PPO_CLASSIC),
    ("make_agent", PPO_CLASSIC),
    ("policy_step", PPO_CLASSIC),
    ("eval_action", PPO_CLASSIC),
    ("ppo_loss", PPO_CLASSIC),
    ("clipped_loss", PPO_MEMORY),
    ("scale_rewards", PPO_MEMORY),
    # GAE, in both families' PPO
    ("compute_gae", (*PPO_MEMORY, *PPO_VLA)),
    ("normalize_advantages", PPO_VLA),
    # the VLA family's plumbing of the policy and its PPO
    ("ACTION_ARGS", VLA),
    ("action_space", VLA),
    ("in_pieces", VLA),
    ("sample_with", VLA),
    ("tempered", VLA),
    ("aggregate", VLA),
    ("eval_action", VLA),
    ("make_agent", ("ppo_vla_ddp", "ppo_vla_async")),  # ppo_vla's also wraps a --privileged-critic
    ("step_decision", PPO_VLA),
    ("ppo_loss", PPO_VLA),
    ("backward_piece", PPO_VLA),
    ("policy_step", ("ppo_vla", "ppo_vla_ddp")),
    # data-parallel gradients
    ("sync_gradients", ("ppo_ddp", "ppo_vla_ddp")),
    # GRPO, in both families
    # (group_reset is not copied either: grpo_vla's draws further starts for dynamic sampling)
    ("first_episode_mask", ("grpo", "grpo_vla")),
    ("group_advantages", ("grpo", "grpo_vla")),
    ("episode_advantages", ("grpo", "grpo_vla")),
    ("informative_groups", ("grpo", "grpo_vla")),
    # (grpo_loss is no longer copied: grpo_vla's adds the VLA recipe's temperature and clip-higher)
]


def definitions(script: str) -> dict[str, str]:
    """{name: ast dump} of the module-level functions, classes and assigned constants of a trainer."""
    tree = ast.parse((SCRIPTS / f"{script}.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.dump(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = ast.dump(node)
    return found


@pytest.mark.parametrize("name, scripts", COPIES, ids=[f"{name}-{scripts[0]}" for name, scripts in COPIES])
def test_the_copies_of_the_algorithm_are_identical(name, scripts):
    found = {script: definitions(script).get(name) for script in scripts}
    missing = [script for script, code in found.items() if code is None]
    assert not missing, f"{name} is meant to be copied into {missing}"
    first = scripts[0]
    differing = [script for script in scripts[1:] if found[script] != found[first]]
    assert not differing, f"{name} differs from {first}.py's copy in {differing}"


def test_the_check_notices_a_drifted_copy(tmp_path, monkeypatch):
    """The comparison sees a one-character change of a copy (so a drift cannot pass unnoticed)."""
    for script in ("ppo_continuous", "ppo_ddp"):
        text = (SCRIPTS / f"{script}.py").read_text()
        if script == "ppo_ddp":
            text = text.replace("advantages + values", "advantages - values", 1)
        (tmp_path / f"{script}.py").write_text(text)
    monkeypatch.setitem(globals(), "SCRIPTS", tmp_path)
    assert definitions("ppo_continuous")["compute_gae"] != definitions("ppo_ddp")["compute_gae"]
    assert definitions("ppo_continuous")["ppo_loss"] == definitions("ppo_ddp")["ppo_loss"]
