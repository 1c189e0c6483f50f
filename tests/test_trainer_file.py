"""shared/trainer_file.py: what a run records of the trainer file that made it: the network code a checkpoint's
weights depend on (followed from make_agent and eval_action through the names they use, formatting, comments,
docstrings and annotations aside) and the file's git state."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from cleanrl_embodied import ppo_continuous, ppo_ddp, ppo_recurrent, ppo_vla, ppo_vla_async, ppo_vla_ddp
from cleanrl_embodied.shared import trainer_file
from cleanrl_embodied.shared.trainer_file import describe_trainer, network_definitions, network_differences

TRAINER = textwrap.dedent('''
    HIDDEN = 64


    def helper(x):
        return x + HIDDEN


    def unrelated():
        return 0


    class Agent:
        def act(self, x: "Args") -> "Args":
            """acts"""
            return helper(x)


    def make_agent(envs, args):
        return Agent()


    def eval_action(agent, obs):
        return agent.act(obs)
''')


def test_the_network_is_what_make_agent_and_eval_action_reach():
    network = network_definitions(TRAINER)
    assert set(network) == {"make_agent", "eval_action", "Agent", "helper", "HIDDEN"}  # not `unrelated`, not Args


@pytest.mark.parametrize(
    "edit, changed",
    [
        (("HIDDEN = 64", "HIDDEN = 65"), ["HIDDEN (changed)"]),  # a constant two calls away
        (("return x + HIDDEN", "return x * HIDDEN"), ["helper (changed)"]),
        (("return helper(x)", "return helper(x) + 1"), ["Agent (changed)"]),
        (('"""acts"""', '"""acts on x, documented at length"""'), []),  # a docstring computes nothing
        (("return helper(x)", "return helper(x)  # a comment"), []),
        (('x: "Args") -> "Args"', "x)"), []),  # annotations name types
        (("def unrelated():\n    return 0", "def unrelated():\n    return 1"), []),
        (
            ("return Agent()", "return Other()\n\n\nclass Other:\n    pass"),
            [
                "Agent (only in theirs)",
                "HIDDEN (only in theirs)",
                "Other (only in ours)",
                "helper (only in theirs)",
                "make_agent (changed)",
            ],  # (what only the old Agent used is gone from the network too)
        ),
    ],
)
def test_a_change_shows_where_the_network_code_changed_and_nowhere_else(edit, changed):
    theirs = network_definitions(TRAINER)
    ours = network_definitions(TRAINER.replace(*edit))
    assert network_differences(theirs, ours) == changed


def test_trainers_that_read_each_others_checkpoints_have_the_same_network_code():
    def network(module):
        return describe_trainer(module.__file__)["network"]

    assert network(ppo_continuous) == network(ppo_ddp)
    assert network(ppo_vla) == network(ppo_vla_ddp) == network(ppo_vla_async)
    assert network_differences(network(ppo_continuous), network(ppo_recurrent))  # memory: another network


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_the_git_state_tells_a_clean_a_modified_and_an_untracked_file_and_one_outside(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@t")
    git(repo, "config", "user.name", "t")
    tracked = repo / "pkg" / "ppo_x.py"
    tracked.write_text(TRAINER)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "x")
    monkeypatch.setattr(trainer_file, "PACKAGE_DIR", repo / "pkg")  # this package lives in that repository
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert describe_trainer(tracked)["git"] == {"state": "clean", "repository": str(repo.resolve()), "commit": head,
                                                "file": "clean"}  # fmt: skip
    tracked.write_text(TRAINER + "\n# edited\n")
    assert describe_trainer(tracked)["git"]["state"] == "modified"
    copy = repo / "pkg" / "my_ppo.py"
    copy.write_text(TRAINER)
    record = describe_trainer(copy)
    assert record["git"]["state"] == "untracked" and record["script"] == "my_ppo"
    outside = tmp_path / "elsewhere" / "my_ppo.py"
    outside.parent.mkdir()
    outside.write_text(TRAINER)
    assert describe_trainer(outside)["git"] == {"state": "not in this repository", "repository": None,
                                                "commit": None, "file": None}  # fmt: skip
    other = tmp_path / "lab"
    other.mkdir()
    git(other, "init", "-q")
    (other / "my_ppo.py").write_text(TRAINER)
    state = describe_trainer(other / "my_ppo.py")["git"]
    assert state["state"] == "not in this repository" and state["repository"] == str(other.resolve())
    assert state["file"] == "untracked"  # (the state in its own repository)
