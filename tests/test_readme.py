"""The README's quick start is what CI runs: the uv install command, the test command and the set-up commands of
.ci/run appear verbatim in it, and its training / TensorBoard commands are valid for the current code; its links
lead to the documentation site's pages."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import tyro

from cleanrl_embodied import ppo_continuous as ppo

REPO = Path(__file__).resolve().parents[1]


def quick_start() -> str:
    """The README's "## Quick start" section, up to the next heading of the same level."""
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## Quick start\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, "README.md has no '## Quick start' section"
    return match.group(1)


def commands(lines) -> list[str]:
    """Shell lines without comments (a '#' after whitespace) and surrounding blanks; empty lines dropped."""
    out = []
    for line in lines:
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def quick_start_block() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", quick_start(), flags=re.S)
    assert blocks, "the quick start shows no ```bash block"
    return commands(blocks[0].splitlines())


def ci_commands() -> list[str]:
    return commands((REPO / ".ci" / "run").read_text().splitlines())


def test_quick_start_gets_uv_the_way_ci_does():
    block = quick_start_block()
    install = [c for c in block if "install uv" in c]
    assert install == [block[0]], "the quick start's first command must install uv"
    assert install[0] in ci_commands(), f"{install[0]!r} is not how .ci/run installs uv"
    # where pip put uv off the PATH: the README says what .ci/run does about it
    path_line = 'export PATH="$HOME/.local/bin:$PATH"'
    assert path_line in ci_commands() and f"`{path_line}`" in quick_start()


def test_quick_start_test_command_is_the_one_ci_runs():
    tests = [c for c in quick_start_block() if "pytest" in c]
    assert tests == ["uv run pytest"]
    assert ci_commands()[-1] == tests[0]  # CI's last (and deciding) step


def test_every_uv_command_of_ci_is_named_in_the_quick_start():
    section = quick_start()
    uv_steps = [c for c in ci_commands() if c.startswith("uv ") and c != "uv --version"]
    assert len(uv_steps) >= 3
    for step in uv_steps:
        assert f"`{step}`" in section or step in quick_start_block(), f".ci/run runs {step!r}; the README doesn't say"


def test_quick_start_train_and_tensorboard_commands_are_valid():
    block = quick_start_block()
    train = next(c for c in block if "ppo_continuous.py" in c)
    argv = shlex.split(train)
    assert argv[:3] == ["uv", "run", "python"] and (REPO / argv[3]).is_file()
    args = tyro.cli(ppo.Args, args=argv[4:])
    ppo.validate(args)  # the flags parse and pass the trainer's own checks
    assert args.env_id == "PushCubeRL"
    board = next(c for c in block if "tensorboard" in c)
    assert shlex.split(board) == ["uv", "run", "tensorboard", "--logdir", args.output_dir]


def test_quick_start_keeps_the_pip_fallback():
    fallback = "`pip install -e . && python cleanrl_embodied/ppo_continuous.py --env-id PushCubeRL`"
    assert fallback in quick_start()


def test_every_link_of_the_readme_leads_to_a_file_and_every_page_is_linked():
    """The README is the way into the documentation: its relative links (pages, the figure) resolve, and it links
    every page of the site's navigation."""
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    targets = [t.split("#")[0] for t in links if "://" not in t and not t.startswith("#")]  # not: web, same page
    assert targets and all((REPO / t).is_file() for t in targets), [t for t in targets if not (REPO / t).is_file()]
    nav_pages = set(re.findall(r":\s*(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M))
    assert len(nav_pages) >= 10 and all((REPO / "docs" / page).is_file() for page in nav_pages)
    assert nav_pages <= {t.removeprefix("docs/") for t in targets}, nav_pages - set(targets)


def test_the_trainers_sizes_the_readme_quotes_are_the_files_sizes():
    """ "`ppo_continuous.py` is N" and the VLA trainers' range: the line counts of the files as they are."""
    text = (REPO / "README.md").read_text()
    lines = {path.stem: len(path.read_text().splitlines()) for path in (REPO / "cleanrl_embodied").glob("*.py")}
    quoted = dict(re.findall(r"`(\w+)\.py`\s+(?:is\s+)?(\d+)", text))
    classic = ("ppo_continuous", "grpo", "ppo_ddp", "ppo_recurrent")
    assert set(classic) <= set(quoted), f"README.md quotes the sizes of {sorted(quoted)}"
    assert {name: int(quoted[name]) for name in classic} == {name: lines[name] for name in classic}
    vla = [lines[name] for name in ("ppo_vla", "grpo_vla", "ppo_vla_async", "ppo_vla_ddp")]
    assert f"the VLA trainers {min(vla)}-{max(vla)}" in text
