"""Where the figures of README.md and docs/ come from: which paragraph quotes which report (docs/results/<name>), by a
link to its folder or to its section of the benchmarks page or its archive, and the index page that lists them with
each report's command and whether today's code still computes it.

    uv run python -m benchmarks.suite.quotes       # writes docs/figures.md (tests/test_reports.py checks it is current)

tests/test_reports.py builds its staleness checks on the same reading (`paragraph_quotes`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.suite import provenance

LINK = re.compile(r"results/([A-Za-z0-9_.@+-]+)(?![A-Za-z0-9_.@+-]|/runs/)")
"""A mention of a report folder, `results/<name>`; not a run directory under it (`results/<name>/runs/...`, the
`--output-dir` of a recorded exact command), which names the folder the runs were written to, not a report: a record
moved to another name keeps its commands as they ran."""


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


MARKDOWN_EXTENSIONS = ["toc", "tables", "attr_list", "md_in_html", "admonition", "pymdownx.details",
                       "pymdownx.superfences", "pymdownx.highlight", "pymdownx.inlinehilite"]  # fmt: skip
"""mkdocs.yml's markdown extensions: the page rendered as the site renders it gives the site's heading anchors."""
HEADING_OR_MARKER = re.compile(r'<h([1-6]) id="([^"]+)"|<!-- (BEGIN|END) ([A-Za-z0-9_.@+-]+) -->')
MARKER = re.compile(r"<!-- (BEGIN|END) ([A-Za-z0-9_.@+-]+) -->")
TARGET = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target


def section_anchors(benchmarks_md: Path) -> dict[str, set[str]]:
    """Per report with a section of its own in docs/benchmarks.md (between `<!-- BEGIN name -->` and its END), the
    anchors a link reaches it by, as mkdocs builds them (the page rendered with mkdocs.yml's extensions): the headings
    inside the section and those of the sections it lies in (the page's title excepted)."""
    import markdown

    html = markdown.Markdown(extensions=MARKDOWN_EXTENSIONS).convert(benchmarks_md.read_text())
    anchors: dict[str, set[str]] = {}
    stack: list[tuple[int, str, str | None]] = []  # the headings the text is under: (level, anchor, section)
    inside: str | None = None
    for m in HEADING_OR_MARKER.finditer(html):
        if m.group(1):
            level = int(m.group(1))
            stack = [h for h in stack if h[0] < level] + [(level, m.group(2), inside)]
            if inside:
                anchors[inside].add(m.group(2))
        elif m.group(3) == "BEGIN":
            inside = m.group(4)
            own = re.match(r"\s*<h([1-6])", html[m.end() :])  # a section that starts with its own heading
            below = int(own.group(1)) if own else 7  # (is not under the headings of its level and above)
            anchors[inside] = {anchor for level, anchor, _ in stack if 1 < level < below}
        else:  # END: the section's own headings end with it
            stack = [h for h in stack if h[2] != m.group(4)]
            inside = None
    return anchors


REPORT_PAGES = ("benchmarks.md", "benchmarks-archive.md")
"""The pages that hold the reports' sections: the benchmarks page (fresh reports first) and its archive."""


def report_anchors(results: Path) -> dict[Path, dict[str, set[str]]]:
    """`section_anchors` of each page of REPORT_PAGES beside `results`, by the page's resolved path."""
    pages = [results.parent / name for name in REPORT_PAGES]
    return {page.resolve(): section_anchors(page) for page in pages if page.is_file()}


def quoted(paragraph: str, page: Path, results: Path, anchors: dict[Path, dict[str, set[str]]],
           inside: str | None) -> set[str]:  # fmt: skip
    """The reports a paragraph of `page` quotes: those whose folder it links (a path into `results`) and those whose
    section of docs/benchmarks.md or its archive it links (an anchor of `anchors`, by page; not from inside that
    section, `inside`)."""
    names = {m.group(1) for m in LINK.finditer(paragraph) if (results / m.group(1)).is_dir()}
    for target in TARGET.findall(paragraph):
        path, _, anchor = target.partition("#")
        on = anchors.get((page.parent / path).resolve() if path else page.resolve())
        if anchor and on is not None:
            names |= {name for name, reach in on.items() if anchor in reach and name != inside}
    return names


def pages(root: Path = REPO) -> list[Path]:
    """The pages whose figures are tracked: README.md and every page of docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def paragraph_quotes(page: Path, results: Path, anchors: dict[Path, dict[str, set[str]]]):
    """Each section of `page` as a list of (paragraph, the reports it quotes); a paragraph inside a report's own
    section of the benchmarks page does not quote that report."""
    out = []
    inside = None  # the report section of the benchmarks page a paragraph lies in
    for section in sections(page):
        rows = []
        for paragraph in section:
            markers = MARKER.findall(paragraph)
            begins = [name for kind, name in markers if kind == "BEGIN"]
            inside = begins[-1] if begins else inside
            rows.append((paragraph, quoted(paragraph, page, results, anchors, inside)))
            if markers and markers[-1][0] == "END":
                inside = None
        out.append(rows)
    return out


def figure_lines(paragraph: str, name: str) -> list[str]:
    """The lines of `paragraph` that quote report `name` (a table's rows rather than its header), shortened; the
    paragraph's first line where it quotes the report through a section link on another line."""
    lines = [line.strip() for line in paragraph.strip().splitlines()]
    hits = [line for line in lines if f"results/{name}" in line] or [
        next((line for line in lines if "benchmarks" in line and "](" in line), lines[0])
    ]
    out = []
    for hit in hits:
        text = re.sub(r"\]\([^)]*\)", "]", hit).replace("|", "/").replace("`", "")
        out.append(text[:100] + ("..." if len(text) > 100 else ""))
    return out


def index(root: Path = REPO) -> str:
    """docs/figures.md: per report, whether it is fresh, its command, and every place that quotes it."""
    results = root / "docs" / "results"
    anchors = report_anchors(results)
    quotes: dict[str, list[str]] = {}
    for page in pages(root):
        if page.name in ("figures.md", *REPORT_PAGES):  # (the pages that hold the reports' sections)
            continue
        for section in paragraph_quotes(page, results, anchors):
            for paragraph, names in section:
                for name in sorted(names):
                    where = page.relative_to(root).as_posix()
                    quotes.setdefault(name, []).extend(f"`{where}`: {line}" for line in figure_lines(paragraph, name))
    lines = [
        "# Where each figure comes from",
        "",
        "Every report under `docs/results/`: whether the code today still computes what it measured (fresh) or not",
        "(stale, and why), the command that measures it again, and each place in README.md and `docs/` that quotes",
        "it (a link to its folder, or to its section of [Benchmarks](benchmarks.md) or of",
        "[the archive](benchmarks-archive.md)). Written by `uv run python -m benchmarks.suite.quotes`; a test fails "
        "when it",
        "is out of date.",
        "",
    ]
    for report in sorted(p for p in results.iterdir() if p.is_dir()):
        if not (report / provenance.FILE).is_file():
            continue
        prov = provenance.load(report)
        state = f"stale since {prov['stale']['since']}: {prov['stale']['why']}" if prov["stale"] else "fresh"
        if prov["stale"] and prov["stale"].get("again"):  # (its command no longer runs as it ran)
            state += f". {prov['stale']['again']}"
        lines += [f"## {report.name}", "", f"- {state}", f"- measured {prov['date']} at commit {prov['commit'][:10]}",
                  f"- command: `{prov['command']}`"]  # fmt: skip
        page = provenance.report_markdown(report)
        if page is not None:
            link = page.relative_to(root / "docs").as_posix()
            lines.append(f"- report: [{link}]({link})")
        held = [name for name in REPORT_PAGES if f"<!-- BEGIN {report.name} -->" in (root / "docs" / name).read_text()]
        lines += [f"- its section: [{name}]({name})" for name in held]
        found = quotes.get(report.name, [])
        lines += ["- quoted in:" if found else "- quoted nowhere", *[f"    - {q}" for q in found], ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    path = REPO / "docs" / "figures.md"
    path.write_text(index())
    print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
