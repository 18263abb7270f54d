"""The generated references under docs/reference/ (`vramguard_testbed.reference`): each page is what the code makes
of it now, and the generator reads values.yaml's comments as a person does."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from vramguard_testbed import reference
from vramguard_testbed.reference import COMMAND, ROOT, Value, pages, stale

GENERATED = pages()


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_reference_page_is_current(path: Path) -> None:
    """Each page is what `bash scripts/docs.sh` writes from the code today: a metric, flag, policy key or chart
    value added, renamed or removed without regenerating fails here, naming the page and the command."""
    file = ROOT / path
    assert file.is_file() and file.read_text() == GENERATED[path], f"{path} is stale: run {COMMAND}"


def test_a_stale_page_is_named(tmp_path: Path) -> None:
    """`stale` (behind `bash scripts/docs.sh --check`) names a page that differs and one that is missing, and only
    those."""
    chart = tmp_path / reference.CHART
    chart.mkdir(parents=True)
    for name in ("values.yaml", "values.schema.json"):
        shutil.copy(ROOT / reference.CHART / name, chart / name)
    for path, text in GENERATED.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert stale(tmp_path) == []
    metrics, cli = reference.REFERENCE / "metrics.md", reference.REFERENCE / "cli.md"
    (tmp_path / metrics).write_text(GENERATED[metrics].replace("vramguard_scans_failed_total", "vramguard_gone"))
    (tmp_path / cli).unlink()
    assert stale(tmp_path) == [metrics, cli]


def test_every_metric_family_is_listed_with_its_labels() -> None:
    """The metrics page lists every family the registry exports, counters with `_total`, each with its labels."""
    docs = {d.name: d for d in reference.metric_docs()}
    assert docs["vramguard_actions_total"].labels == ("action", "result")
    assert docs["vramguard_claim_share_bytes"].labels == ("claim", "container", "gpu", "gpu_uuid", "namespace", "pod")
    assert docs["vramguard_scan_duration_seconds"].type == "histogram"
    assert docs["vramguard_scan_duration_seconds"].labels == ()  # its buckets' `le` is not a label of its own
    page = GENERATED[reference.REFERENCE / "metrics.md"]
    assert all(f"| `{name}` |" in page for name in docs)


def values_of(text: str, schema: Mapping[str, Any] | None = None) -> dict[str, Value]:
    return {v.path: v for v in reference._ValuesFile(text, schema or {}).values}


@pytest.mark.parametrize(
    ("text", "path", "comment", "notes"),
    [
        pytest.param("# above\na: 1  # inline\n", "a", ["above", "inline"], [], id="above-and-inline"),
        pytest.param("z: 0\n# not a's\n\na: 1\n", "a", [], [], id="a-blank-line-parts-a-comment-from-the-key"),
        pytest.param('a: "x # y"\n', "a", [], [], id="a-hash-in-a-quoted-value-is-no-comment"),
        pytest.param(
            "m:\n  # what b is\n  # b: on  # b's own words\n  c: 1\n",
            "m.b",
            ["what b is", "b's own words"],
            ["Unset by default; for example `on`."],
            id="a-commented-out-key-is-an-unset-value",
        ),
        pytest.param(
            "m:\n  # what b is\n  # b: on  # b's own words\n  c: 1\n", "m.c", [], [], id="and-not-the-next-keys-comment"
        ),
        pytest.param(
            "m:\n  a: 1\n  # about a\n\n  b: 2\n# about m\n\nn: 3\n",
            "m.a",
            [],
            ["about a"],
            id="a-loose-block-goes-to-the-nearest-key-above-no-deeper",
        ),
        pytest.param(
            "m:\n  a: 1\n  # about a\n\n  b: 2\n# about m\n\nn: 3\n", "m", [], ["about m"], id="the-outer-block-to-m"
        ),
    ],
)
def test_values_comments_go_to_their_key(text: str, path: str, comment: list[str], notes: list[str]) -> None:
    """A key's comment is the lines right above it and the end of its line, as a person reads values.yaml."""
    value = values_of(text)[path]
    assert (value.comment, value.notes) == (comment, notes)


def test_a_block_value_keeps_its_lines_and_a_flow_one_its_spelling() -> None:
    """A list written as a block is shown as written, its comments included; a flow value as spelled."""
    values = values_of('a:\n  - x  # why x\n  # why y\n  - y\nb: [1, 2]\nc: ""\nd: {kind: none}\n')
    assert (values["a"].default, values["a"].block) == ("- x  # why x\n# why y\n- y", True)
    assert [values[k].default for k in "bcd"] == ["[1, 2]", '""', "{kind: none}"]


def test_a_free_form_map_is_one_value_and_a_schema_map_is_walked() -> None:
    """A map the schema leaves to the user (labels, a node selector) is one value; a map of known keys, one each."""
    schema = {"properties": {"labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
    values = values_of("labels:\n  a: b\nresources:\n  cpu: 1\n", schema)
    assert set(values) == {"labels", "resources", "resources.cpu"}
    assert values["labels"].leaf and not values["resources"].leaf
