"""Every published figure traces to a report that says where it came from, and a report whose numbers the code no
longer computes says so, in the report and wherever it is quoted (a paragraph that links its folder or its section of
docs/benchmarks.md): in the quoting paragraph, or in an earlier paragraph of its section that quotes it too
(benchmarks/suite/provenance.py, docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from benchmarks.suite import provenance, quotes
from benchmarks.suite.quotes import paragraph_quotes, quoted, report_anchors, section_anchors
from tests.extras import needs
from tests.numerics import FINGERPRINTS

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"

REPORTS = sorted(p for p in RESULTS.iterdir() if p.is_dir())
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "figures.md")]
"""The pages that quote reports (docs/figures.md, the index written from them, quotes them all, fresh or not)."""
LINK = quotes.LINK  # a mention of a report folder (not of a run directory under it)


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_every_report_records_its_commit_date_machine_and_command(report):
    path = report / provenance.FILE
    assert path.is_file(), f"docs/results/{report.name} has no {provenance.FILE} (benchmarks/suite/provenance.py)"
    prov = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", prov["commit"]), prov["commit"]
    assert re.match(r"20\d\d-\d\d-\d\d", prov["date"]) and prov["machine"], (prov["date"], prov["machine"])
    command = prov["command"]
    assert isinstance(command, str) and ("benchmarks" in command or "cleanrl_embodied/" in command), command
    assert isinstance(prov["runs"], list)
    assert prov["fingerprints"] is None or set(prov["fingerprints"]) <= set(FINGERPRINTS), prov["fingerprints"]


@pytest.mark.parametrize("report", REPORTS, ids=[r.name for r in REPORTS])
def test_every_report_command_names_a_script_that_exists(report):
    """The command that measures a report again starts a script of this repository that is there today: by its path
    (`benchmarks/gpu_check.py`, `cleanrl_embodied/ppo_continuous.py`) or as a module (`-m benchmarks.suite.run`)."""
    command = json.loads((report / provenance.FILE).read_text())["command"]
    tokens = shlex.split(command)
    found = provenance.script_of(tokens)
    assert found is not None, f"{report.name}: no script in {command!r}"
    at, _, _ = found
    path = tokens[at] if tokens[at].endswith(".py") else tokens[at].replace(".", "/") + ".py"
    assert (REPO / path).is_file(), f"{report.name}: {command!r} starts {path}, which does not exist"


def test_every_suite_report_command_names_configs_that_exist():
    """A report of the reproducibility suite is measured again by its command: the scripts and tasks it names have
    their config files today (run.suite_pairs accepts them), or the report is stale and its record says, instead of
    that command, how it is measured again (`again`, which the banner gives)."""
    import tyro

    from benchmarks.suite import run

    checked, problems = 0, []
    for report in REPORTS:
        prov = provenance.load(report)
        tokens = shlex.split(prov["command"])
        if "benchmarks.suite.run" not in tokens:
            continue
        checked += 1
        args = tyro.cli(run.Args, args=tokens[tokens.index("benchmarks.suite.run") + 1 :])
        try:
            run.suite_pairs(args)
        except SystemExit as e:
            if not (prov["stale"] and prov["stale"].get("again")):
                problems.append(f"{report.name}: {e}")
            continue
        if prov["stale"] and prov["stale"].get("again"):
            problems.append(f"{report.name}: its command runs, but its banner gives another sentence instead")
    assert checked > 10 and not problems, problems


def test_a_stale_banner_gives_the_records_own_way_to_measure_it_again(tmp_path, monkeypatch):
    """mark_stale with `again`: the record keeps that sentence and the banner gives it instead of the command."""
    report = tmp_path / "results" / "old"
    report.mkdir(parents=True)
    prov = {"commit": "a" * 40, "date": "2026-11-25", "command": "uv run python -m benchmarks.suite.run --tasks X",
            "stale": None, "runs": [], "fingerprints": {}}  # fmt: skip
    (report / provenance.FILE).write_text(json.dumps(prov))
    (report / "report.md").write_text("# old\n\ntext\n")
    monkeypatch.setattr(provenance, "RESULTS_MD", tmp_path / "benchmarks.md")
    monkeypatch.setattr(provenance, "ARCHIVE_MD", tmp_path / "benchmarks-archive.md")
    provenance.mark_stale(report, "its config is gone", again="It cannot be measured again as it ran.")
    text = (report / "report.md").read_text()
    assert text.startswith(provenance.STALE_BANNER) and "its config is gone. It cannot be measured again" in text
    assert "Measure it again with" not in text and provenance.load(report)["stale"]["again"].startswith("It cannot")
    provenance.mark_stale(report, "its numbers moved")
    assert "its numbers moved. Measure it again with `uv run python -m benchmarks.suite.run --tasks X`." in (
        report / "report.md").read_text()  # fmt: skip


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


def test_a_report_shows_the_command_its_runs_json_records():
    """A report drawn from runs.json by its driver (`--report-only` redraws it) shows runs.json's command: a command
    edited in the report alone (a script moved) would go back to the old one when the report is redrawn."""
    checked, wrong = 0, []
    for report in REPORTS:
        runs = report / "runs.json"
        data = json.loads(runs.read_text()) if runs.is_file() else None
        if not (isinstance(data, dict) and isinstance(data.get("command"), str)):
            continue
        checked += 1
        text = (report / "report.md").read_text()
        if not any(line.startswith(f"- command: `{data['command']}`") for line in text.splitlines()):
            wrong.append(f"{report.name}: runs.json records `{data['command']}`")
    assert checked >= 3 and not wrong, wrong


def test_a_run_directory_in_a_recorded_command_is_not_a_mention_of_a_report(tmp_path):
    """A record moved to another folder keeps its exact commands as they ran (`--output-dir docs/results/<old>/runs/
    ...`): that names where the runs were written, not a report, so it neither needs `<old>` to exist nor quotes
    whatever report holds that name now. A report's own path (its folder, report.md, a plot) is a mention."""
    text = ("python x.py --output-dir docs/results/old-name/runs/x__1\n"
            "[report](results/new-name/report.md) results/plain ![plot](results/new-name/a@b.png)")  # fmt: skip
    assert [m.group(1) for m in LINK.finditer(text)] == ["new-name", "plain", "new-name"]
    results = tmp_path / "results"
    for name in ("old-name", "new-name"):
        (results / name).mkdir(parents=True)
    page = tmp_path / "page.md"
    assert quoted("`--output-dir docs/results/old-name/runs/s__1`", page, results, {}, None) == set()
    assert quoted("see results/old-name and results/new-name/report.md", page, results, {}, None) == {
        "old-name", "new-name"}  # fmt: skip


def test_a_report_whose_fingerprints_moved_is_marked_stale():
    unmarked = []
    for report in REPORTS:
        prov = json.loads((report / provenance.FILE).read_text())
        why = provenance.why_stale(prov)
        if why and not prov["stale"]:
            unmarked.append(f"docs/results/{report.name} ({why})")
    assert not unmarked, (
        "measure these again or mark them stale (uv run python -m benchmarks.suite.provenance --mark-stale): "
        f"{unmarked}"
    )


def unmarked_quotes(pages: list[Path], results: Path) -> list[str]:
    """Where a stale report under `results` is shown without saying so: its page without the banner, and each
    paragraph of `pages` (README.md, docs/*.md) that quotes it without "stale", in the paragraph or in an earlier one
    of its section that quotes it too (a table's rows: each row that quotes it). A paragraph quotes a report when it
    links its folder or its section of docs/benchmarks.md or its archive (benchmarks/suite/quotes.py)."""
    root = results.parents[1]
    stale = {r.name for r in results.iterdir() if (r / provenance.FILE).is_file() and provenance.load(r)["stale"]}
    problems = []
    for name in sorted(stale):
        page = provenance.report_markdown(results / name)
        if page is not None and not page.read_text().startswith(provenance.STALE_BANNER):
            problems.append(f"{page.relative_to(root)} does not start with '{provenance.STALE_BANNER}'")
    anchors = report_anchors(results)
    for page in pages:
        for section in paragraph_quotes(page, results, anchors):
            for i, (paragraph, names) in enumerate(section):
                for name in sorted(names & stale):
                    said = any("stale" in p.lower() and name in q for p, q in section[: i + 1])
                    lines = paragraph.strip().splitlines()
                    if all(line.lstrip().startswith("|") for line in lines):  # a table: each row says it itself
                        rows = [line for line in lines if name in quoted(line, page, results, anchors, None)]
                        said = all("stale" in row.lower() for row in rows)
                    if not said:
                        first = paragraph.strip().splitlines()[0][:80]
                        problems.append(f"{page.relative_to(root)}: quotes {name} without saying stale: {first!r}")
    return problems


def test_a_stale_report_says_so_at_its_top_and_wherever_it_is_quoted():
    problems = unmarked_quotes(PAGES, RESULTS)
    assert not problems, "\n".join(problems)


def test_a_report_section_is_reached_by_its_headings_and_those_it_lies_under():
    anchors = {**section_anchors(RESULTS.parent / "benchmarks.md"),
               **section_anchors(RESULTS.parent / "benchmarks-archive.md")}  # fmt: skip
    assert anchors["vs-cleanrl-cpu"] == {"ours-vs-cleanrl-on-cleanrls-mujoco-settings-cpu"}
    assert anchors["vla-rl-cpu-split"] == {"vla-rl-from-behaviour-cloning-cpu_1"}  # (a second heading of that name)
    assert "vla-what-rl-adds-to-a-pretrained-base-from-few-demonstrations-cpu" in anchors["vla-fewshot-cpu"]
    assert {"propriorgb-k1", "statergb-k10"} <= anchors["vla-fewshot-cpu"]
    assert anchors["pixels-rgb-cpu"] == {"pixel-ppo-on-pushcuberl-cpu", "image-only-obs_modergb", "pushcuberlrgb"}
    assert anchors["pixels-rgb-2026-11-23"] == {
        "pixel-ppo-rgb-pushcuberl-cpu",
        "image-only-obs_modergb",
        "pushcuberlrgb",
    }  # (the archive's headings of the same names)
    # a section after another's subsections: under their heading, not theirs
    assert anchors["lang-6m-cpu"] == {"pushcubelangrl-language-action-heads-and-grpo-group-filtering-cpu",
                                      "pushcubelangrlchunk4-6m"}  # fmt: skip


def test_a_figure_quoted_through_a_link_to_its_docs_section_says_stale(tmp_path, monkeypatch):
    """README's Results row (2.36x) and docs/ppo_continuous.md quote vs-cleanrl-cpu through a link to its section of
    docs/benchmarks.md, with no results/ path: marked stale (in a copy of the docs), both quotes are caught."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    for page in PAGES:
        (root / page.relative_to(REPO)).write_text(page.read_text())
    for report in REPORTS:
        copy = root / "docs" / "results" / report.name
        copy.mkdir(parents=True)
        for file in [report / provenance.FILE, *report.glob("*.md")]:
            (copy / file.name).write_text(file.read_text())
    monkeypatch.setattr(provenance, "RESULTS_DIR", root / "docs" / "results")
    monkeypatch.setattr(provenance, "RESULTS_MD", root / "docs" / "benchmarks.md")
    monkeypatch.setattr(provenance, "ARCHIVE_MD", root / "docs" / "benchmarks-archive.md")
    pages = [root / p.relative_to(REPO) for p in PAGES]
    assert unmarked_quotes(pages, root / "docs" / "results") == []  # the copy passes as the docs do
    provenance.mark_stale(root / "docs" / "results" / "vs-cleanrl-cpu", "the numbers of ppo_continuous moved (a test)")
    problems = [p for p in unmarked_quotes(pages, root / "docs" / "results") if "quotes vs-cleanrl-cpu" in p]
    assert {p.split(":")[0] for p in problems} == {"README.md", "docs/ppo_continuous.md"}, problems
    assert any(p.startswith("README.md") and "| what | result |" in p for p in problems), problems  # the Results row


def chapters(page: Path) -> list[tuple[str, set[str]]]:
    """The page's `##` chapters in order, each with the reports whose sections (BEGIN/END markers) it holds; a
    section that opens with its own heading belongs to the chapter of that heading."""
    text = page.read_text()
    out: list[tuple[str, set[str]]] = []
    pending: set[str] = set()  # a marker just before a heading: its section opens that chapter
    for m in re.finditer(r"^## (.+)$|<!-- BEGIN (\S+) -->", text, flags=re.M):
        if m.group(1):
            out.append((m.group(1), pending))
            pending = set()
        elif re.match(r"\s*## ", text[m.end() :]):
            pending = {m.group(2)}
        elif out:
            out[-1][1].add(m.group(2))
    return out


def test_the_benchmarks_page_leads_with_fresh_reports_and_the_archive_holds_only_stale_ones():
    """docs/benchmarks.md: no chapter whose reports are all stale comes before one with a fresh report;
    docs/benchmarks-archive.md: every report it holds is stale (one measured again goes back to the benchmarks page)."""
    stale = {r.name for r in REPORTS if (r / provenance.FILE).is_file() and provenance.load(r)["stale"]}
    known = {r.name for r in REPORTS if (r / provenance.FILE).is_file()}
    main = chapters(RESULTS.parent / "benchmarks.md")
    kinds = []
    for heading, names in main:
        names &= known
        kinds.append((heading, "stale" if names and names <= stale else "fresh" if names else "none"))
    first_stale = next((i for i, (_, kind) in enumerate(kinds) if kind == "stale"), len(kinds))
    late = [h for h, kind in kinds[first_stale:] if kind == "fresh"]
    assert not late, f"docs/benchmarks.md: fresh reports after a stale chapter: {late}"
    fresh_in_archive = sorted({n for _, names in chapters(RESULTS.parent / "benchmarks-archive.md") for n in names}
                              & known - stale)  # fmt: skip
    assert not fresh_in_archive, f"fresh reports in docs/benchmarks-archive.md, move them back: {fresh_in_archive}"
    assert any(kind == "fresh" for _, kind in kinds) and len(chapters(RESULTS.parent / "benchmarks-archive.md")) > 3


def test_the_fingerprint_names_reports_depend_on_exist():
    named = {n for names in provenance.SCRIPT_FINGERPRINTS.values() for n in names}
    named |= set(provenance.ENV_FINGERPRINTS.values()) | set(provenance.PIXEL_FINGERPRINTS.values())
    named |= {provenance.DROPOUT_FINGERPRINT, provenance.HF_VLA_FINGERPRINT, provenance.LANG_FINGERPRINT}
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
    compiled = "python cleanrl_embodied/ppo_continuous.py --env-id HalfCheetah-v5 --compile on"
    assert provenance.depends_on(compiled) == ["ppo_continuous", "ppo_continuous-compiled"]
    assert provenance.depends_on(compiled.replace("--compile on", "--compile off")) == ["ppo_continuous"]


VLA_TARGET = json.dumps({"obs_mode": "state+rgb", "image_size": 64, "action_mode": "ee_delta_pos"})


def test_depends_on_reads_a_vla_trainers_default_policy():
    """ppo_vla's --policy is examples.hf_vla:make_policy unless the command names another (its Args default)."""
    command = f"python cleanrl_embodied/ppo_vla.py --env-id PushCubeLangRL --env-kwargs '{VLA_TARGET}' --seed 1"
    assert "hf_vla" in provenance.depends_on(command)
    toy = "python cleanrl_embodied/ppo_vla.py --env-id PushCubeLangRL --policy toy_policies:ToyVLA"
    assert provenance.depends_on(toy) == ["env-PushCubeLangRL", "ppo_vla"]


def test_depends_on_reads_the_few_shot_targets_tasks_and_images():
    """The few-shot VLA runs' env (the diagonal tasks, view_tasks, 64x64 images) has its own fingerprint; the default
    tasks' state mode does not use it."""
    target = json.dumps({"obs_mode": "proprio+rgb", "image_size": 64, "tasks": ["forward_right", "back_left"],
                         "view_tasks": ["forward", "left", "back", "right"]})  # fmt: skip
    command = f"python cleanrl_embodied/grpo_vla.py --env-id PushCubeLangRL --env-kwargs '{target}'"
    assert provenance.depends_on(command) == ["env-PushCubeLangRL", "env-PushCubeLangRL-fewshot", "grpo_vla", "hf_vla"]
    tasks_only = (
        'python cleanrl_embodied/ppo_continuous.py --env-id PushCubeLangRL --env-kwargs \'{"tasks": ["back_left"]}\''
    )
    assert "env-PushCubeLangRL-fewshot" in provenance.depends_on(tasks_only)
    assert provenance.depends_on("python cleanrl_embodied/ppo_continuous.py --env-id PushCubeLangRL") == [
        "env-PushCubeLangRL",
        "ppo_continuous",
    ]
    assert "env-PushCubeLangRL-fewshot" in provenance.depends_on("python examples/hf_vla/demos.py --seed 1")


def test_depends_on_reads_a_flag_with_an_equals_sign():
    command = "python cleanrl_embodied/ppo_continuous.py --env-id=PushCubeLangRL --seed=1"
    assert provenance.depends_on(command) == ["env-PushCubeLangRL", "ppo_continuous"]


def test_depends_on_reads_json_as_the_shell_passes_it():
    command = 'python cleanrl_embodied/ppo_continuous.py --env-kwargs "{\\"obs_mode\\": \\"rgb\\"}" --env-id PushCubeRL'
    assert provenance.depends_on(command) == ["env-PushCubeRL", "ppo_continuous", "ppo_continuous-pixels"]
    state = 'python cleanrl_embodied/ppo_continuous.py --env-kwargs \'{"obs_mode": "state", "note": "rgb"}\''
    assert provenance.depends_on(state) == ["env-PushCubeRL", "ppo_continuous"]  # the word alone is no image mode


def test_depends_on_reads_a_trainers_default_env():
    assert provenance.depends_on("python cleanrl_embodied/ppo_vla.py --seed 1") == [
        "env-PushCubeLangRL",
        "hf_vla",
        "ppo_vla",
    ]
    assert provenance.depends_on("python cleanrl_embodied/grpo_vla.py")[0] == "env-PushCubeRL"  # (grpo_vla's default)


def test_depends_on_reads_the_recurrent_trainers_pixel_path():
    command = 'OMP_NUM_THREADS=1 python cleanrl_embodied/ppo_recurrent.py --env-kwargs \'{"obs_mode": "proprio+rgb"}\''
    assert provenance.depends_on(command) == ["env-PushCubeRL", "ppo_recurrent", "ppo_recurrent-gru-pixels"]


def test_depends_on_reads_the_sensor_dropout_in_either_env():
    train = 'python cleanrl_embodied/ppo_recurrent.py --env-kwargs=\'{"dropout_sensor": "cube"}\''
    evaluate = 'python cleanrl_embodied/ppo_continuous.py --eval-env-kwargs \'{"dropout_sensor": "camera"}\''
    for command in (train, evaluate):
        assert "env-PushCubeRL-dropout" in provenance.depends_on(command), command
    # frame stacks and chosen observation entries (make_env's wrappers) are pinned by no fingerprint of their own
    stacked = "python cleanrl_embodied/ppo_continuous.py --env-id Pendulum-v1 --env-kwargs '{\"frame_stack\": 4}'"
    assert provenance.depends_on(stacked) == ["ppo_continuous"]


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


def test_marking_a_report_stale_puts_the_banner_in_its_section_on_either_page(tmp_path, monkeypatch):
    """The banner goes under the heading of the report's section, on the benchmarks page or in the archive."""
    for name, on in (("on-main", "main"), ("in-archive", "archive")):
        report = tmp_path / name
        report.mkdir()
        (report / "report.md").write_text("# r\n\nfigures\n")
        (report / provenance.FILE).write_text(json.dumps({"commit": "a" * 40, "date": "d", "command": "c"}))
        pages = {"main": tmp_path / "benchmarks.md", "archive": tmp_path / "benchmarks-archive.md"}
        for which, page in pages.items():
            section = f"<!-- BEGIN {name} -->\n## {name}\n\nfigures\n<!-- END {name} -->\n" if which == on else ""
            page.write_text(f"# {which}\n\n{section}")
        monkeypatch.setattr(provenance, "RESULTS_MD", pages["main"])
        monkeypatch.setattr(provenance, "ARCHIVE_MD", pages["archive"])
        provenance.mark_stale(report, "a test")
        text = pages[on].read_text()
        assert f"## {name}\n\n{provenance.STALE_BANNER}" in text and text.count(provenance.STALE_BANNER) == 1, text
        other = pages["archive" if on == "main" else "main"].read_text()
        assert provenance.STALE_BANNER not in other


# ---- each run's commit: a report is judged by the golden files of the commits its runs ran at -----------------------
RECURRENT_BEFORE = "fd270970c753f4ac3294362432833b0bbcbe99d6"  # ppo_recurrent's golden file was written anew after it
RECURRENT_RUN = "python cleanrl_embodied/ppo_recurrent.py --env-id Pendulum-v1 --seed 1"


@pytest.fixture
def quiet_machine(monkeypatch):
    monkeypatch.setattr(provenance, "describe_machine", lambda machine: "a machine")
    monkeypatch.setattr(provenance, "machine_info", lambda: {})


def _have(sha: str) -> None:
    if subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("needs the repository's history (a full clone, not a shallow one)")


def test_a_report_records_the_golden_files_of_the_commit_its_runs_ran_at(tmp_path, quiet_machine):
    """Its runs ran at a commit whose ppo_recurrent golden file has been written anew since: the report is stale
    however late it is written (a --report-only today), because its digests are that commit's, not the disk's."""
    _have(RECURRENT_BEFORE)
    prov = provenance.record(tmp_path, RECURRENT_RUN, git={"git_sha": RECURRENT_BEFORE, "git_dirty": False})
    why = provenance.why_stale(prov) or ""
    assert why.startswith("the numbers of ppo_recurrent (its runs at fd27097) have changed since"), prov
    old = provenance.digest_at(RECURRENT_BEFORE, "ppo_recurrent")
    assert old is not None and old != provenance.golden_digest("ppo_recurrent")
    assert prov["fingerprints"]["ppo_recurrent"] == old


def test_each_run_records_its_commit_and_the_digests_there(tmp_path, quiet_machine):
    """A driver whose runs ran at two commits (one run resumed from an earlier invocation): each run's commit and its
    fingerprints' digests at that commit are recorded, and the report is stale by the older run."""
    _have(RECURRENT_BEFORE)
    head = {"git_sha": provenance.git_commit()[0], "git_dirty": False}
    runs = [RECURRENT_RUN, "python cleanrl_embodied/ppo_continuous.py --env-id Pendulum-v1 --seed 1"]
    before = {"git_sha": RECURRENT_BEFORE, "git_dirty": False}
    prov = provenance.record(tmp_path, "uv run python benchmarks/pomdp.py", runs, git=head, run_git=[before, head])
    assert [(g["commit"], g["runs"]) for g in prov["runs_at"]] == [(RECURRENT_BEFORE, [0]), (head["git_sha"], [1])]
    assert prov["runs_at"][0]["fingerprints"] == {"ppo_recurrent": provenance.digest_at(RECURRENT_BEFORE,
                                                                                        "ppo_recurrent")}  # fmt: skip
    why = provenance.why_stale(prov)
    assert why.startswith("the numbers of ppo_recurrent (its runs at fd27097) have changed since"), why
    fresh = provenance.record(tmp_path, "uv run python benchmarks/pomdp.py", runs, git=head, run_git=[head, head])
    assert provenance.why_stale(fresh) is None and len(fresh["runs_at"]) == 1


def test_a_suites_runs_are_at_the_commits_their_summaries_name():
    """run.py and pomdp.py take each run's commit from its summary.json (a --skip-done run was run by an earlier
    invocation, maybe at another commit); a run without one ran in this invocation."""
    now = {"git_sha": "a" * 40, "git_dirty": False}
    earlier = {"git_sha": "b" * 40, "git_dirty": True}
    records = [{"summary": {"versions": {"python": "3.11", **earlier}}}, {"returncode": 1, "error": "..."}]
    assert [c["git_sha"] for c in provenance.commits_of(records, now)] == ["b" * 40, "a" * 40]


def test_a_run_at_an_unknown_commit_or_without_a_digest_is_stale(tmp_path, quiet_machine):
    runs = ["python cleanrl_embodied/grpo.py --seed 1"]
    head = {"git_sha": provenance.git_commit()[0], "git_dirty": False}
    unknown = provenance.record(tmp_path, runs[0], runs, git=head, run_git=[None])
    assert unknown["runs_at"][0]["commit"] is None and "an unknown commit" in provenance.why_stale(unknown)
    # an old provenance.json (one commit and its digests for every run) that lacks a fingerprint its runs use now
    old = {"commit": head["git_sha"], "fingerprints": {"grpo": provenance.golden_digest("grpo")}, "runs": runs,
           "command": runs[0], "stale": None}  # fmt: skip
    assert provenance.why_stale(old) == (
        "its runs depend on env-PushCubeRL, which it holds no digest of (verify the runs' commits compute what "
        "today's golden files hold, or measure it again)"
    )
    old["fingerprints"]["env-PushCubeRL"] = provenance.golden_digest("env-PushCubeRL")
    assert provenance.why_stale(old) is None


@needs("vla")
def test_vla_fewshot_records_the_commit_each_run_started_from(tmp_path, quiet_machine):
    """--report-only writes the provenance from the runs' time files: each run at the commit its time file names,
    one without (as this report's own runs were recorded) at an unknown commit, a run not yet run at the driver's."""
    _have(RECURRENT_BEFORE)
    fs = importlib.import_module("benchmarks.experiments.vla_fewshot")
    args = fs.Args(runs_dir=str(tmp_path / "runs"), seeds=(1,), obs_modes=("proprio+rgb",), ks=(1,), rows=("grpo",),
                   out=str(tmp_path / "out"), report_only=True)  # fmt: skip
    runs = Path(args.runs_dir)
    before = {"git_sha": RECURRENT_BEFORE, "git_dirty": False}
    for name, cmd, git in (("pretrain", fs.pretrain_command(args), None),
                           ("proprio_rgb/demos_s1", fs.demos_command(args, "proprio+rgb", 1), before)):  # fmt: skip
        record = {"cpu_s": 1.0, "wall_s": 1.0, "command": fs.shell_command(cmd), **({"git": git} if git else {})}
        fs.vla_runs.time_file(runs, name).parent.mkdir(parents=True, exist_ok=True)
        fs.vla_runs.time_file(runs, name).write_text(json.dumps(record))
    fs.main(args)
    prov = json.loads((tmp_path / "out" / provenance.FILE).read_text())
    groups = {g["commit"]: g["runs"] for g in prov["runs_at"]}
    assert groups[None] == [0] and groups[RECURRENT_BEFORE] == [1] and groups[prov["commit"]] == [2, 3], groups
    why = provenance.why_stale(prov)
    assert "ran at an unknown commit" in why and re.search("no golden file at [^;]*fd27097", why), why


def test_the_figures_index_is_current_and_maps_each_quoted_figure_to_its_report():
    """docs/figures.md is what benchmarks/suite/quotes.py writes today; in it, README's Results rows stand under the
    reports they link (a table row, not the table's header), each report with its command and whether it is fresh."""
    page = REPO / "docs" / "figures.md"
    stale = "docs/figures.md is out of date: uv run python -m benchmarks.suite.quotes"
    assert page.read_text() == quotes.index(), stale
    text = page.read_text()
    full = text.split("## full-cpu\n", 1)[1].split("\n## ", 1)[0]
    assert "- fresh" in full or "- stale since" in full
    assert "uv run python -m benchmarks.suite.run --suite full" in full and "eval return **2795" in full
    assert "`README.md`: / Pusher-v5, the same" in full and "/ what / result /" not in full
    reports = {r.name for r in REPORTS if (r / provenance.FILE).is_file()}
    assert set(re.findall(r"^## (\S+)$", text, flags=re.M)) == reports


def test_every_driver_that_writes_a_report_records_its_provenance():
    """A driver whose report reaches docs/ (a section of a docs page, or a markdown report) writes provenance.json
    too: without it a report measured again would still read as the stale one (async_speed wrote none until
    2026-12-02). Found by reading each module under benchmarks/: the writes of a report, and the call of
    provenance.record."""
    writes = re.compile(r"write_section\(|write_report\(|\.md\"\)\.write_text|/ \"report\.md\"\)\.write_text")
    missing = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in ("benchmarks/common.py", "benchmarks/suite/provenance.py", "benchmarks/suite/quotes.py"):
            continue  # the plumbing that others call, and the index of every figure
        text = path.read_text()
        if writes.search(text) and "provenance.record(" not in text:
            missing.append(rel)
    assert missing == []
