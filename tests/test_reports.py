"""Every published figure traces to a report that says where it came from, and a report whose numbers the code no
longer computes says so, in the report and wherever it is quoted: in the quoting paragraph, or in an earlier paragraph
of its section that names the report (benchmarks/provenance.py, docs/benchmarks.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numerics import FINGERPRINTS

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
import provenance  # noqa: E402

REPORTS = sorted(p for p in RESULTS.iterdir() if p.is_dir())
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"results/([A-Za-z0-9_.@+-]+)")


def sections(page: Path) -> list[list[str]]:
    """The page's sections (split at `#` and `##` headings outside code blocks), each a list of its paragraphs."""
    out, current, fenced = [], [], False
    for block in re.split(r"\n\s*\n", page.read_text()):
        if not block.strip():
            continue
        if not fenced and re.match(r"#{1,2} ", block.lstrip()):
            out.append(current)
            current = []
        current.append(block)
        fenced ^= block.count("```") % 2 == 1
    return [*out, current]


def links(paragraph: str) -> set[str]:
    """The report folders a paragraph links to (markdown links and image paths into docs/results/)."""
    return {m.group(1) for m in LINK.finditer(paragraph) if (RESULTS / m.group(1)).is_dir()}


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_every_report_records_its_commit_date_machine_and_command(report):
    path = report / provenance.FILE
    assert path.is_file(), f"docs/results/{report.name} has no {provenance.FILE} (benchmarks/provenance.py)"
    prov = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", prov["commit"]), prov["commit"]
    assert re.match(r"20\d\d-\d\d-\d\d", prov["date"]) and prov["machine"], (prov["date"], prov["machine"])
    command = prov["command"]
    assert isinstance(command, str) and ("benchmarks/" in command or "cleanrl_embodied/" in command), command
    assert isinstance(prov["runs"], list)
    assert prov["fingerprints"] is None or set(prov["fingerprints"]) <= set(FINGERPRINTS), prov["fingerprints"]


def test_every_report_names_a_commit_of_this_repository():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        pytest.skip("needs the repository's history (a full clone, not a shallow one)")
    missing = []
    for report in REPORTS:
        sha = json.loads((report / provenance.FILE).read_text())["commit"]
        known = subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=REPO, capture_output=True)
        if known.returncode != 0:
            missing.append(f"{report.name}: {sha}")
    assert not missing, f"reports naming a commit this repository does not have: {missing}"


def test_every_report_linked_from_the_readme_and_docs_exists():
    broken = []
    for page in PAGES:
        for m in LINK.finditer(page.read_text()):
            name = m.group(1)
            if not (RESULTS / name).exists() and not name.endswith("-"):  # ("results/gpu-<device>-<date>": a pattern)
                broken.append(f"{page.relative_to(REPO)}: results/{name}")
    assert not broken, broken


def test_a_report_whose_fingerprints_moved_is_marked_stale():
    unmarked = []
    for report in REPORTS:
        prov = json.loads((report / provenance.FILE).read_text())
        why = provenance.why_stale(prov)
        if why and not prov["stale"]:
            unmarked.append(f"docs/results/{report.name} ({why})")
    assert not unmarked, (
        f"measure these again or mark them stale (uv run python benchmarks/provenance.py --mark-stale): {unmarked}"
    )


def test_a_stale_report_says_so_at_its_top_and_wherever_it_is_quoted():
    stale = {r.name for r in REPORTS if json.loads((r / provenance.FILE).read_text())["stale"]}
    problems = []
    for name in sorted(stale):
        page = provenance.report_markdown(RESULTS / name)
        if page is not None and not page.read_text().startswith(provenance.STALE_BANNER):
            problems.append(f"{page.relative_to(REPO)} does not start with '{provenance.STALE_BANNER}'")
    for page in PAGES:  # a paragraph that quotes a stale report says so, or an earlier one of its section does
        for section in sections(page):
            for i, paragraph in enumerate(section):
                for name in sorted(links(paragraph) & stale):
                    said = [p for p in section[: i + 1] if "stale" in p.lower() and f"results/{name}" in p]
                    if "stale" not in paragraph.lower() and not said:
                        first = paragraph.strip().splitlines()[0][:80]
                        problems.append(f"{page.relative_to(REPO)}: quotes {name} without saying stale: {first!r}")
    assert not problems, "\n".join(problems)


def test_the_fingerprint_names_reports_depend_on_exist():
    named = {n for names in provenance.SCRIPT_FINGERPRINTS.values() for n in names}
    named |= set(provenance.ENV_FINGERPRINTS.values()) | {"ppo_continuous-pixels", "hf_vla"}
    assert named <= set(FINGERPRINTS), named - set(FINGERPRINTS)


def test_depends_on_reads_the_script_env_pixels_and_policy_of_a_command():
    command = (
        'OMP_NUM_THREADS=1 python cleanrl_embodied/ppo_continuous.py --env-kwargs \'{"obs_mode": "proprio+rgb"}\' '
        "--env-id PushCubeRL --seed 1"
    )
    assert provenance.depends_on(command) == ["env-PushCubeRL", "ppo_continuous", "ppo_continuous-pixels"]
    assert provenance.depends_on("python cleanrl_embodied/ppo_continuous.py --env-id HalfCheetah-v5") == [
        "ppo_continuous"
    ]
    vla = "python cleanrl_embodied/grpo_vla.py --env-id PushCubeLangRL --policy examples.hf_vla:make_policy"
    assert provenance.depends_on(vla) == ["env-PushCubeLangRL", "grpo_vla", "hf_vla"]


def test_marking_a_report_stale_writes_the_banner_once(tmp_path, monkeypatch):
    report = tmp_path / "some-report"
    report.mkdir()
    (report / "report.md").write_text("# some suite\n\nfigures\n")
    monkeypatch.setattr(provenance, "describe_machine", lambda machine: "a machine")
    monkeypatch.setattr(provenance, "machine_info", lambda: {})
    prov = provenance.record(
        report, "uv run python benchmarks/run.py --suite quick", ["python cleanrl_embodied/grpo.py"]
    )
    assert provenance.why_stale(prov) is None and prov["fingerprints"] == {
        "env-PushCubeRL": provenance.golden_digest("env-PushCubeRL"),
        "grpo": provenance.golden_digest("grpo"),
    }
    prov["fingerprints"]["grpo"] = "0" * 16  # as if grpo's golden file had been written anew since
    (report / provenance.FILE).write_text(json.dumps(prov))
    assert provenance.why_stale(prov) == "the numbers of grpo have changed since (tests/numerics.py)"
    for _ in range(2):
        provenance.mark_stale(report, provenance.why_stale(prov))
    text = (report / "report.md").read_text()
    assert text.startswith(provenance.STALE_BANNER) and text.count(provenance.STALE_BANNER) == 1
    assert text.endswith("# some suite\n\nfigures\n") and "benchmarks/run.py --suite quick" in text
    assert json.loads((report / provenance.FILE).read_text())["stale"]["why"].startswith("the numbers of grpo")
