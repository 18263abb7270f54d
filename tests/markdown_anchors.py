"""The anchors GitHub gives a Markdown file's headings, for the tests that check links into the docs (alerts'
runbook links, the docs' own relative links)."""

from __future__ import annotations

import re


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation but `-` and `_` dropped, spaces
    to `-`, a repeated one suffixed -1, -2, ...; headings in code blocks are none."""
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found
