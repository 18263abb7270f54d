"""The headings of a Markdown file and the anchors GitHub gives them, for the tests that check links into the docs
(alerts' runbook links, the docs' own relative links, the code's citations of headings)."""

from __future__ import annotations

import re

HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")


def headings(markdown: str) -> list[str]:
    """The text of each heading of `markdown`, in order; headings in code blocks are none."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            found.append(match.group(1))
    return found


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation but `-` and `_` dropped, spaces
    to `-`, a repeated one suffixed -1, -2, ...; headings in code blocks are none."""
    found: set[str] = set()
    for heading in headings(markdown):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found
