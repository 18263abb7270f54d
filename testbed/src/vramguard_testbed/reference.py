"""The reference pages under docs/reference/, generated from what defines them: the metrics from the agent's own
registry, the policy keys from the parser's table, the commands and flags from the CLIs, the chart's values from
values.yaml (its comments are the docs) and values.schema.json. Nothing is written by hand but the lines that say
where a page comes from, so a page cannot drift from the code; tests/unit/test_docs_reference.py fails when one is
stale.

    bash scripts/docs.sh            # writes every page (python -m vramguard_testbed.reference)
    bash scripts/docs.sh --check    # exit 1, naming each stale page, without writing

The output is deterministic (no timestamps, no paths of this machine), so the test compares it byte for byte.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
import typer.main
import yaml
from prometheus_client.metrics import MetricWrapperBase

from vramguard.agent.metrics import Metrics
from vramguard.agent.reload import RESTART_FIELDS
from vramguard.cli import probe
from vramguard.cli.main import app as agent_app
from vramguard.core.decide import Decision, quota_rows
from vramguard.core.driver_limit import LimitTarget
from vramguard.core.exited import HeldByExited
from vramguard.core.peaks import Peak
from vramguard.core.policy import NAMESPACE_KEYS, POLICY_KEYS, PolicyKey
from vramguard.core.quantity import GiB
from vramguard.core.quota import PodQuota, Quota
from vramguard.plugin.command import build_app as plugin_app
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod

ROOT = Path(__file__).resolve().parents[3]  # the repository: the test bench is installed editable from it
REFERENCE = Path("docs/reference")
COMMAND = "bash scripts/docs.sh"
CHART = Path("deploy/helm/vramguard")


def pages(root: Path = ROOT) -> dict[Path, str]:
    """Each page's path under `root` and its text."""
    return {
        REFERENCE / "metrics.md": metrics_page(),
        REFERENCE / "policy.md": policy_page(),
        REFERENCE / "cli.md": cli_page(),
        REFERENCE / "helm-values.md": helm_values_page(root),
    }


def stale(root: Path = ROOT) -> list[Path]:
    """The pages whose file differs from what the code generates now (missing ones included)."""
    found = []
    for path, text in pages(root).items():
        file = root / path
        if not file.is_file() or file.read_text() != text:
            found.append(path)
    return found


def _generated(source: str) -> str:
    return f"Generated from {source} by `{COMMAND}`; edit the source, not this page."


def _prose(text: str) -> str:
    """Text for Markdown: a `<` outside code spans escaped, so that `<name>` shows rather than passing for HTML."""
    parts = text.split("`")
    return "`".join(p.replace("<", "&lt;") if i % 2 == 0 else p for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, `<` escaped as in prose, pipes escaped."""
    return _prose(" ".join(text.split())).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _paragraphs(doc: str) -> str:
    """A docstring's paragraphs, each on one line."""
    return "\n\n".join(_prose(" ".join(p.split())) for p in inspect.cleandoc(doc).split("\n\n"))


# --------------------------------------------------------------------------------------------------------------
# Metrics: from the agent's registry


def filled_metrics() -> Metrics:
    """The agent's metrics after a scan that fills every family (a container on a DRA claim's share, its peak, a
    driver limit, a claim source, a GPU held by exited processes, orphaned memory) and with one child of each
    labelled counter and gauge, so that every family's label names show in its samples."""
    metrics = Metrics()
    p = pod("trainer", "ml")
    device = gpu(0)
    snapshot = SnapshotBuilder().use(p, "main", device, GiB).build()
    share = Quota(limit_bytes=2 * GiB, source="claim", share="uid/0", claim="gpu")
    quotas = {p.uid: PodQuota(shares={"main": {device.uuid: share}})}
    limit = LimitTarget(p, "main", "c1", 0, device.uuid, 2 * GiB, "claim")
    decision = Decision(actions=(), violations=(), rows=quota_rows(snapshot, quotas))
    metrics.observe_scan(
        snapshot,
        decision,
        [limit],
        claim_source_up=True,
        peaks=(Peak(p, "main", device.uuid, "0", GiB),),
        exited={device.uuid: HeldByExited(device.uuid, GiB, (7,), 0.0)},
        orphaned={device.uuid: GiB},
    )
    for wrapper in vars(metrics).values():
        # client_python keeps a wrapper's label names only on this attribute; a child makes the family's series.
        labelnames = getattr(wrapper, "_labelnames", ())
        if isinstance(wrapper, MetricWrapperBase) and labelnames:
            wrapper.labels(*("x" for _ in labelnames))
    return metrics


@dataclass(frozen=True, slots=True)
class MetricDoc:
    name: str  # as scraped: a counter with its `_total`
    type: str
    labels: tuple[str, ...]
    help: str


def metric_docs() -> list[MetricDoc]:
    """Every family the agent's registry exports, sorted by name. A family without a sample after
    `filled_metrics()` is an error: its labels would go unlisted."""
    docs = []
    for family in filled_metrics().registry.collect():
        if not family.samples:
            raise ValueError(f"{family.name} has no sample: fill it in vramguard_testbed.reference.filled_metrics()")
        labels = sorted({label for s in family.samples for label in s.labels} - {"le"})  # `le`: a bucket's bound
        name = family.name + "_total" if family.type == "counter" else family.name
        docs.append(MetricDoc(name, family.type, tuple(labels), family.documentation))
    return sorted(docs, key=lambda d: d.name)


def plugin_exports_metrics(root: Path = ROOT) -> bool:
    """Whether any module of the kubectl plugin imports prometheus_client (the metrics page says it does not)."""
    for path in sorted((root / "src" / "vramguard" / "plugin").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "prometheus_client" for n in names):
                return True
    return False


def metrics_page() -> str:
    if plugin_exports_metrics():
        raise ValueError("the kubectl plugin imports prometheus_client: list what it exports on the metrics page")
    lines = [
        "# Metrics",
        "",
        _generated("the agent's registry (`vramguard.agent.metrics.Metrics`)"),
        "",
        "The agent serves these at `/metrics` on its port (9400 by default), in the Prometheus text format or",
        "OpenMetrics. Counters carry their `_total` suffix, a histogram its `_bucket`, `_count` and `_sum` series;",
        "every label value a counter counts under is exported at 0 from the agent's start. Scraped through the",
        "chart's ServiceMonitor, each series also carries its target's labels (the agent's `pod`, and `node`); the",
        "per-container series keep their workload's `namespace`, `pod` and `container` (`honorLabels`).",
        "",
        "The usage and peak gauges also carry the pod's controller, `owner_kind` and `owner_name`, as",
        "kube-state-metrics' `kube_pod_owner` names them (`<none>` for a pod without one), which `kubectl vramguard",
        "recommend` groups by. What they cost: no series, since a pod has one controller and `pod` is already a",
        "label, so each (pod, container, GPU) stays one series (a pod adopted by another controller, rare, starts a",
        'second one); about 45 bytes a series in each scrape (`owner_kind="ReplicaSet",owner_name=...`);',
        "in Prometheus' index, one value per distinct controller and two postings a series; and, once, a new series",
        "for each (pod, container, GPU) when its agent is upgraded to one that sets them.",
        "",
        "`kubectl vramguard` exports no metrics (no module of `vramguard.plugin` imports prometheus_client): it",
        "reads each agent's `/status`, and `recommend` reads the agents' series back from Prometheus.",
        "",
        "| Metric | Type | Labels | Help |",
        "|---|---|---|---|",
    ]
    for m in metric_docs():
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {_cell(m.help)} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Policy: from the parser's table


def policy_page() -> str:
    names = {k.name for k in POLICY_KEYS}
    unknown = [f for f in RESTART_FIELDS if f not in names]
    if unknown:
        raise ValueError(f"RESTART_FIELDS names no policy key: {', '.join(unknown)}")

    def table(keys: Sequence[PolicyKey], reload: Callable[[PolicyKey], str]) -> list[str]:
        rows = ["| Key | Type | Default | Reload | Description |", "|---|---|---|---|---|"]
        for k in keys:
            default = _code(k.default) if k.default is not None else "unset"
            rows.append(f"| `{k.name}` | {_cell(k.type)} | {_cell(default)} | {reload(k)} | {_cell(k.doc)} |")
        return rows

    def top_level(k: PolicyKey) -> str:
        return "restart¹" if k.name in RESTART_FIELDS else "live"

    lines = [
        "# Policy file",
        "",
        _generated("the policy parser's table of keys (`vramguard.core.policy.POLICY_KEYS`)"),
        "The same keys, commented, in a file you can start from: `config/policy.example.yaml`.",
        "",
        "Every key is optional: a missing one takes its default. An unknown key is an error, and so is a value the",
        "parser refuses; `vramguard policy check FILE` lists every problem, each naming the key and the value.",
        "Durations are `500ms`, `30s`, `5m`, `1h`, `1m30s` or a number of seconds; byte quantities are Kubernetes",
        "quantities (`16Gi`, `16G`, `17179869184`, `12e9`). The agent's flags `--mode`, `--driver-limits` and",
        "`--watch-interval` override the file's keys of those names, at start and at each reload.",
        "",
        'A change of the file is in force from the next scan ("live"). An invalid one is refused and the last',
        "good policy stays in force (`vramguard_policy_invalid`).",
        "",
        *table(POLICY_KEYS, top_level),
        "",
        "¹ Live, except where the new value needs a part the agent builds only at start (a `claim:` quota source,",
        "the driver-limits programmer, the watch turned on or off): the agent then keeps what it runs for that key,",
        "sets `vramguard_policy_restart_needed{field=...}` to 1, and the key takes effect after a restart.",
        "",
        "## Under `namespaces.<name>`",
        "",
        "Each key overrides the top-level one in that namespace; unset, the top-level one applies.",
        "",
        *table(NAMESPACE_KEYS, lambda k: "live"),
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# CLI: from the typer apps


def _options(command: Any, ctx: typer.Context) -> list[str]:
    rows = ["| Option | Default | Environment | Description |", "|---|---|---|---|"]
    for param in command.params:
        if getattr(param, "hidden", False) or param.param_type_name != "option":
            continue
        record = param.get_help_record(ctx)
        flag = record[0] if record else ", ".join(param.opts)
        default = param.default
        if default is None:
            shown = ""
        elif isinstance(default, bool):
            shown = _code(str(default).lower())
        else:
            shown = f"`{getattr(default, 'value', default)}`" if default != "" else '`""`'
        bounds = [f"at least {param.min:g}"] if param.min is not None else []
        bounds += [f"at most {param.max:g}"] if param.max is not None else []
        help_text = " ".join([param.help or "", f"({', '.join(bounds)})" if bounds else ""]).strip()
        envvar = ", ".join(f"`{e}`" for e in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or []))
        rows.append(f"| {_cell(_code(flag))} | {_cell(shown)} | {envvar} | {_cell(help_text)} |")
    return rows if len(rows) > 2 else []


def _commands(command: Any, ctx: typer.Context) -> Iterator[tuple[Any, typer.Context]]:
    """Each command below a group (a group's own commands in its place), by name."""
    for name in sorted(command.list_commands(ctx)):
        sub = command.get_command(ctx, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        sub_ctx = typer.Context(sub, info_name=name, parent=ctx)
        if hasattr(sub, "list_commands"):
            yield from _commands(sub, sub_ctx)
        else:
            yield sub, sub_ctx


def _program(app: typer.Typer, prog: str, intro: str = "") -> list[str]:
    group = typer.main.get_command(app)
    ctx = typer.Context(group, info_name=prog)
    lines = [f"## {prog}", "", *([intro, ""] if intro else []), _paragraphs(group.help or ""), ""]
    for command, sub_ctx in _commands(group, ctx):
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        options = _options(command, sub_ctx)
        words = [sub_ctx.command_path, *(["[OPTIONS]"] if options else []), *(a.name.upper() for a in arguments)]
        usage = " ".join(words)
        lines += [f"### {sub_ctx.command_path}", "", "```", usage, "```", "", _paragraphs(command.help or ""), ""]
        for a in arguments:
            lines += [f"`{a.name.upper()}`: {_prose(' '.join((getattr(a, 'help', '') or '').split()))}", ""]
        if options:
            lines += [*options, ""]
    return lines


def cli_page() -> str:
    lines = [
        "# Commands and flags",
        "",
        _generated("the commands themselves (their typer apps, and `vramguard.cli.probe`)"),
        "Every command also takes `--help`, which prints the same. Options meant for tests only are left out.",
        "",
        *_program(agent_app, "vramguard"),
        *_program(plugin_app(), "kubectl-vramguard", "On the PATH, kubectl runs it as `kubectl vramguard`."),
        "## vramguard-probe",
        "",
        "```",
        probe.USAGE,
        "```",
        "",
        _paragraphs(probe.__doc__ or ""),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------------------------------------------
# Helm values: values.yaml, its comments, and values.schema.json

# A commented-out key (`# on_repeat: kill-container  # what it is`): a value the chart leaves unset.
_COMMENTED_KEY = re.compile(r"#\s([a-z][A-Za-z0-9_]*):\s(.*)$")


@dataclass
class Value:
    """One key of values.yaml: its dotted path, its default as the file spells it (None: unset), whether that is a
    block of lines, the comments that document it, and where it sits."""

    path: str
    line: int
    indent: int
    leaf: bool = True
    default: str | None = None
    block: bool = False
    comment: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _comment_text(line: str) -> str:
    """A comment line's text: '# a b' → 'a b' (indentation within the comment kept: a list in a comment)."""
    text = line.strip()[1:]
    return text[1:] if text.startswith(" ") else text


def _inline_comment(line: str, after: int) -> str:
    """The comment ending `line`, looked for from column `after` (past the value: a `#` in a quoted string is not
    one)."""
    match = re.search(r"\s#\s?(.*)$", " " + line[after:])
    return match.group(1).strip() if match else ""


def _last_line(node: yaml.Node) -> int:
    """The line a value ends on: that of its last scalar (a block collection's own end mark is the next token's)."""
    if isinstance(node, yaml.SequenceNode) and node.value:
        return _last_line(node.value[-1])
    if isinstance(node, yaml.MappingNode) and node.value:
        return _last_line(node.value[-1][1])
    return int(node.end_mark.line)


def _free_form(schema: Mapping[str, Any]) -> bool:
    """A map whose keys are the user's (labels, a node selector): one value, not one per key."""
    return isinstance(schema.get("additionalProperties"), dict) and "properties" not in schema


class _ValuesFile:
    """values.yaml's keys with the comments around them: the lines right above a key (no blank line between) and
    the one ending its line; a block value keeps its own. A comment block that sits above no key belongs to the
    nearest key above it that is no deeper; the file's opening block is its own."""

    def __init__(self, text: str, schema: Mapping[str, Any]) -> None:
        self.lines = text.splitlines()
        self.values: list[Value] = []
        self.used: set[int] = set()  # comment lines given to a value
        document = yaml.compose(text)
        if not isinstance(document, yaml.MappingNode):
            raise ValueError("values.yaml is not a mapping")
        self.walk(document, "", schema)
        self.values.sort(key=lambda v: v.line)
        self.header: list[str] = []
        for first, indent, block in self.orphans():
            owners = [v for v in self.values if v.line < first and v.indent <= indent]
            if owners:
                owners[-1].notes.append(" ".join(block))
            else:
                self.header = block

    def walk(self, node: yaml.MappingNode, prefix: str, schema: Mapping[str, Any]) -> None:
        for key_node, value_node in node.value:
            path = f"{prefix}{key_node.value}"
            props = schema.get("properties", {}).get(key_node.value, {})
            line, indent = key_node.start_mark.line, key_node.start_mark.column
            value = Value(path, line, indent, comment=self.preceding(line, indent, prefix))
            on_its_line = value_node.start_mark.line == line and _last_line(value_node) == line
            after = value_node.end_mark.column if on_its_line else key_node.end_mark.column + 1
            inline = _inline_comment(self.lines[line], after)
            value.comment += [inline] if inline else []
            self.values.append(value)
            if isinstance(value_node, yaml.MappingNode) and not on_its_line and not _free_form(props):
                value.leaf = False
                self.walk(value_node, f"{path}.", props)
            elif on_its_line:
                value.default = self.lines[line][value_node.start_mark.column : value_node.end_mark.column]
            else:  # a block: its lines as written, comments included
                first, last = line + 1, _last_line(value_node)
                self.used.update(range(first, last + 1))
                block = self.lines[first : last + 1]
                margin = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                value.default, value.block = "\n".join(b[margin:] for b in block).rstrip(), True

    def preceding(self, line: int, indent: int, prefix: str) -> list[str]:
        """The comment lines right above a key. A commented-out key at their end is a value of its own, unset, and
        the block is its comment, not the key's below."""
        first = line
        while first > 0 and self.lines[first - 1].strip().startswith("#"):
            first -= 1
        block = list(range(first, line))
        self.used.update(block)
        last = self.lines[block[-1]] if block else ""
        commented = _COMMENTED_KEY.fullmatch(last.strip())
        if commented is None or len(last) - len(last.lstrip()) != indent:
            return [_comment_text(self.lines[i]) for i in block]
        example = commented.group(2).split(" #")[0].strip()
        inline = _inline_comment(commented.group(2), 0)
        unset = Value(f"{prefix}{commented.group(1)}", block[-1], indent)
        unset.comment = [_comment_text(self.lines[i]) for i in block[:-1]] + ([inline] if inline else [])
        unset.notes.append(f"Unset by default; for example `{example}`.")
        self.values.append(unset)
        return []

    def orphans(self) -> Iterator[tuple[int, int, list[str]]]:
        """Comment blocks given to no value: (first line, indentation, text)."""
        i = 0
        while i < len(self.lines):
            first = i
            while i < len(self.lines) and self.lines[i].strip().startswith("#") and i not in self.used:
                i += 1
            if i > first:
                indent = len(self.lines[first]) - len(self.lines[first].lstrip())
                yield first, indent, [_comment_text(line) for line in self.lines[first:i]]
            i += 1


def _schema_at(schema: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    node: Mapping[str, Any] = schema
    for part in path.split("."):
        node = node.get("properties", {}).get(part, {})
    return node


def _schema_only(schema: Mapping[str, Any], known: set[str], prefix: str = "") -> Iterator[str]:
    """The keys the schema takes below `prefix` that values.yaml does not set, where it sets their parent."""
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        if path not in known:
            yield path
        else:
            yield from _schema_only(sub, known, f"{path}.")


def _schema_type(schema: Mapping[str, Any]) -> str:
    """What the schema takes, in words."""
    parts = []
    if "const" in schema:
        parts.append(f"only `{schema['const']}`")
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{json.dumps(e) if e == '' else e}`" for e in schema["enum"]))
    if "type" in schema:
        parts.append(schema["type"])
    if "type" in schema.get("items", {}):
        parts.append(f"of {schema['items']['type']}s")
    if _free_form(schema):
        parts.append(f"of {schema['additionalProperties'].get('type', 'any')}s")
    if schema.get("minLength") == 1:
        parts.append("not empty")
    parts += [f"at least {schema['minimum']}"] if "minimum" in schema else []
    parts += [f"at most {schema['maximum']}"] if "maximum" in schema else []
    parts += [f"matching `{schema['pattern']}`"] if "pattern" in schema else []
    if schema.get("additionalProperties") is False:
        parts.append("no other keys")
    return ", ".join(parts)


def _value_type(v: Value, schema: Mapping[str, Any]) -> str:
    """A value's type: the schema's words; for a policy key, the policy parser's; else the default's own."""
    described = _schema_type(_schema_at(schema, v.path))
    if described:
        return described
    key = v.path.removeprefix("policy.")
    policy = {k.name: k for k in POLICY_KEYS}.get(key) if v.path.startswith("policy.") else None
    if policy is not None:
        return f"{_prose(policy.type)} ([policy reference](policy.md))"
    if v.default is None:
        return ""
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return f"{kinds.get(type(yaml.safe_load(v.default)), 'null')} (the default's; the schema does not say)"


def _comment(lines: Sequence[str]) -> list[str]:
    """A comment as Markdown: one paragraph, or, where its lines are laid out (indented within the comment), as
    written."""
    if any(line.startswith(" ") for line in lines):
        return ["```text", *lines, "```"]
    return [_prose(" ".join(" ".join(line.split()) for line in lines))]


def helm_values_page(root: Path = ROOT) -> str:
    schema = json.loads((root / CHART / "values.schema.json").read_text())
    values_file = _ValuesFile((root / CHART / "values.yaml").read_text(), schema)
    values = values_file.values
    known = {v.path for v in values}
    for path in _schema_only(schema, known):
        parent = path.rpartition(".")[0]
        after = max((v.line for v in values if v.path == parent or v.path.startswith(f"{parent}.")), default=1 << 30)
        values.append(Value(path, after, 0, notes=["Unset by default."]))
    values.sort(key=lambda v: v.line)  # stable: a key the schema alone has follows its siblings

    lines = [
        "# Helm chart values",
        "",
        _generated("`deploy/helm/vramguard/values.yaml` (its comments) and `values.schema.json` (the types)"),
        "`helm show values` prints the same file; `helm install` refuses a value the schema does not take.",
        "",
        *_comment(values_file.header),
        "",
    ]
    for v in values:
        described = bool(v.comment or v.notes or _schema_at(schema, v.path).get("description"))
        if not v.leaf and not described and "." in v.path:
            continue  # a map within a value, with nothing to say of its own: its keys follow
        lines += [f"{'##' if '.' not in v.path else '###'} {v.path}", ""]
        facts = []
        if v.leaf and v.default is not None and not v.block:
            facts.append(f"Default: `{v.default}`")
        if v.leaf and _value_type(v, schema):
            facts.append(f"Type: {_value_type(v, schema)}")
        if facts:
            lines += [" · ".join(facts), ""]
        description = _schema_at(schema, v.path).get("description")
        if description:
            lines += [_prose(" ".join(description.split())) + ".", ""]
        if v.comment:
            lines += [*_comment(v.comment), ""]
        for note in v.notes:
            lines += [_prose(" ".join(note.split())), ""]
        if v.path == "policy":
            lines += ["Any key of the policy file goes here: see the [policy reference](policy.md).", ""]
        if v.block:
            lines += ["Default:", "", "```yaml", v.default or "", "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Writes the reference pages under docs/reference/.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale page")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"{path} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if found else 0
    for path, text in pages().items():
        file = ROOT / path
        if not file.is_file() or file.read_text() != text:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
