"""Every relative link in the README, CONTRIBUTING.md and docs/ points at a file of this repository, and every
`#anchor` at a heading of the file it names (GitHub's anchor rules): moving a section cannot leave a link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from markdown_anchors import anchors, headings

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
# [text](target) outside code: the target up to a space or the closing parenthesis.
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """`markdown` without fenced blocks and inline code, where brackets are not links."""
    kept, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def broken_links(doc: Path) -> list[str]:
    """The relative links of `doc` whose file or heading does not exist, each as `target: why`."""
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not this repository's to check
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: {path} does not exist")
        elif anchor and (file.is_dir() or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: {file.relative_to(ROOT)} has no heading #{anchor}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    """Each relative link names an existing file, and its #anchor a heading there."""
    assert broken_links(doc) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    """A missing file and a missing heading are reported; a good link, a web link and code are not."""
    (tmp_path / "other.md").write_text("# Other\n\n## The path\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n## Here\n\n[ok](other.md#the-path) [self](#here) [web](https://example.com/x#y)\n"
        "[gone](gone.md) [no heading](other.md#nowhere) `[code](gone.md)`\n\n```\n[block](gone.md)\n```\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_links(doc) == [
            "gone.md: gone.md does not exist",
            "other.md#nowhere: other.md has no heading #nowhere",
        ]
    finally:
        ROOT = saved


# Code and the chart cite the docs behind them as `docs/<page>.md` "<heading>", the heading's words possibly broken
# over comment or docstring lines.
CITATION = re.compile(r"docs/(\w+)\.md`?,?\s+(?:#\s*)?\"([^\"]+)\"")
SOURCES = sorted(
    [
        *(p for part in ("src", "testbed/src", "tests", "bench") for p in (ROOT / part).rglob("*.py")),
        *(p for pattern in ("*.yaml", "*.tpl") for p in (ROOT / "deploy").rglob(pattern)),
    ]
)


def stale_citations(source: Path) -> list[str]:
    """The `docs/<page>.md "<heading>"` citations in `source` whose page or heading does not exist."""
    stale = []
    for page, cited in CITATION.findall(source.read_text()):
        heading = " ".join(re.sub(r"\s*#\s*", " ", cited).split())
        doc = ROOT / "docs" / f"{page}.md"
        if not doc.exists() or heading not in headings(doc.read_text()):
            stale.append(f'docs/{page}.md "{heading}"')
    return stale


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_cites_headings_that_exist(source: Path) -> None:
    """Each `docs/<page>.md "<heading>"` in the code names a heading of that page."""
    assert stale_citations(source) == []


def test_a_stale_citation_is_caught(tmp_path: Path) -> None:
    """A heading broken over comment lines is read whole; one that is not there is reported."""
    source = tmp_path / "x.py"
    page = "docs/" + "architecture.md"  # not a citation of this file's own
    source.write_text(f'# see {page} "The watch\n# between scans"; and `{page}` "Gone".\n')
    assert stale_citations(source) == [f'{page} "Gone"']
