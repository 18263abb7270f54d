"""Every alert of the chart's PrometheusRule links, by its `runbook_url`, to a heading that exists in this repository's
docs (kubernetes-mixin's convention): read from the template itself, without helm."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from markdown_anchors import anchors

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "vramguard"
RULES = CHART / "templates" / "prometheusrule.yaml"
HOME = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
BLOB = f"{HOME}/blob/main/"  # the runbooks of the chart's own version of the docs


def untemplated(text: str) -> str:
    """The template as YAML: `{{ .Chart.Home }}` as Chart.yaml says, a line that is only an action dropped, and
    every other action (nested ones included: `{{ "{{ $labels.node }}" }}`) replaced by `T`."""
    text = text.replace("{{ .Chart.Home }}", HOME)
    lines = [line for line in text.splitlines() if not re.fullmatch(r"\s*\{\{-.*\}\}\s*", line)]
    out, depth, i = [], 0, 0
    joined = "\n".join(lines)
    while i < len(joined):
        if joined.startswith("{{", i):
            out.append("T" if depth == 0 else "")
            depth, i = depth + 1, i + 2
        elif joined.startswith("}}", i) and depth:
            depth, i = depth - 1, i + 2
        else:
            out.append(joined[i] if depth == 0 else "")
            i += 1
    return "".join(out)


def alerts(text: str) -> list[dict[str, Any]]:
    spec = yaml.safe_load(untemplated(text))["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def broken_runbook(rule: dict[str, Any], root: Path) -> str | None:
    """What is wrong with an alert's runbook link, or None when it points at a heading of a file of `root`."""
    url = rule.get("annotations", {}).get("runbook_url")
    if url is None:
        return "no runbook_url"
    if not url.startswith(BLOB) or "#" not in url:
        return f"{url} is not {BLOB}<file>#<heading>"
    path, _, anchor = url.removeprefix(BLOB).partition("#")
    if not (root / path).is_file():
        return f"{path} does not exist"
    if anchor not in anchors((root / path).read_text()):
        return f"{path} has no heading #{anchor}"
    return None


RULE_LIST = alerts(RULES.read_text())


@pytest.mark.parametrize("rule", RULE_LIST, ids=lambda r: r["alert"])
def test_every_alert_links_to_a_runbook_heading_that_exists(rule: dict[str, Any]) -> None:
    """The alert's runbook_url names a file of this repository and one of its headings."""
    assert broken_runbook(rule, ROOT) is None


def test_the_template_is_read_whole() -> None:
    """Reading the template without helm finds every alert it defines, each with its summary."""
    assert len(RULE_LIST) == RULES.read_text().count("- alert: ") > 0
    assert all(r["annotations"]["summary"] for r in RULE_LIST)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        pytest.param(None, "no runbook_url", id="missing"),
        pytest.param("https://example.com/x.md#a", "is not", id="another-site"),
        pytest.param(f"{BLOB}docs/nothing.md#a", "docs/nothing.md does not exist", id="no-such-file"),
        pytest.param(f"{BLOB}docs/operations.md#no-such-alert", "has no heading #no-such-alert", id="no-such-heading"),
        pytest.param(f"{BLOB}docs/operations.md#alerts", None, id="a-heading-that-exists"),
    ],
)
def test_a_broken_runbook_is_caught(url: str | None, problem: str | None) -> None:
    """The check above fails on a link to another site, a missing file or a missing heading."""
    rule = {"alert": "X", "annotations": {} if url is None else {"runbook_url": url}}
    found = broken_runbook(rule, ROOT)
    assert found is None if problem is None else problem in (found or "")


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        pytest.param("### VramguardAgentDown", {"vramguardagentdown"}, id="case-folded"),
        pytest.param("## What it means, and why?", {"what-it-means-and-why"}, id="punctuation-dropped"),
        pytest.param("## `code` and snake_case", {"code-and-snake_case"}, id="code-and-underscore"),
        pytest.param("# A\n# A", {"a", "a-1"}, id="repeated-suffixed"),
        pytest.param("```\n# not a heading\n```", set(), id="not-in-code"),
    ],
)
def test_anchors_follow_githubs_rules(markdown: str, expected: set[str]) -> None:
    """Headings become the anchors GitHub gives them."""
    assert anchors(markdown) == expected
