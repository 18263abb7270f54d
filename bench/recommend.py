"""Benchmark: `kubectl vramguard recommend` over 1,000 workloads and 7 days of history in a real Prometheus.

    .venv/bin/python bench/recommend.py               # 1,000 workloads, 7 days, a sample every 5 minutes
    .venv/bin/python bench/recommend.py --quick       # 100 workloads, 2 days: a smoke run
    .venv/bin/python bench/recommend.py --step 30     # a 30 s scrape: Prometheus holds 10x the samples

The history is what the agents' two gauges would have left, as the chart's ServiceMonitor scrapes them (each series
with its agent's `job` and `instance`, each agent's `up` and its GPUs' memory): per pod, container and GPU, the usage
and the peak gauge,
for workloads of every kind recommend places (70 % Deployments rolled out once a day, so seven ReplicaSets' pods a
week, only the last three ReplicaSets still listed; 10 % StatefulSets of two replicas; 10 % CronJobs that run once a
day; 10 % bare pods, half of them since deleted), in ten namespaces. It is written as OpenMetrics with timestamps,
turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`, and served by the Prometheus that
`scripts/prometheus.sh` builds (3.16). The cluster's lists are generated alongside, as the API server would answer
them.

Each series carries its pod's controller (`owner_kind`, `owner_name`), as the agents' gauges do, and the history
holds what the chart's recording rule would have recorded from the peak gauge (its maximum over each 5 minutes,
every 5 minutes, `RECORDED_METRIC`), written alongside rather than evaluated, since promtool cannot backfill a rule
without a live Prometheus to ask.

It prints, for all namespaces (1,000 workloads) and for one (100), read both ways (the gauges as scraped, and the
recording rule's series): the Prometheus queries made, the series answered, the time Prometheus took for them, the
time recommend took in all (the queries, placing each pod in its workload, resolving each template's quota, the
table), and that time against the 5 s goal.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.plugin.fetch import Release
from vramguard.plugin.patch import patches
from vramguard.plugin.prometheus import (
    PEAK_METRIC,
    RECORD_INTERVAL_S,
    RECORDED_METRIC,
    TOTAL_METRIC,
    USED_METRIC,
    read_peaks,
)
from vramguard.plugin.recommend import recommend, within_gpu_memory
from vramguard.plugin.render import RecommendOutput, render_recommend
from vramguard.plugin.workloads import Owners

PROMETHEUS_DIR = Path.home() / ".cache/vramguard/prometheus/3.16.0"  # scripts/prometheus.sh
CACHE = Path.home() / ".cache/vramguard/bench-recommend"
GOAL_S = 5.0
DAY_S = 86400
NAMESPACES = 10
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
GPUS, GPUS_PER_NODE = 64, 8
RELEASE = Release("vramguard", "vramguard")
JOB = f"{RELEASE.daemonset}-metrics"


def _random(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def _meta(ns: str, name: str, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": ns, "name": name, "uid": name}
    if owner is not None:
        out["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return out


def _template(quota_gib: int | None) -> dict[str, Any]:
    limits = {"vramguard.io/vram": f"{quota_gib}Gi"} if quota_gib else {}
    return {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


Pod = tuple[str, str, int, int, str]  # namespace, name, first second, last second, owner ("Kind/name" or "")


def history(
    workloads: int, days: int, now: int, rng: random.Random
) -> tuple[list[Pod], dict[str, list[dict[str, Any]]]]:
    """((namespace, pod, first second, last second, controller) of every pod of the days up to `now`, the cluster's
    lists then)."""
    start = now - days * DAY_S
    pods: list[Pod] = []
    objects: dict[str, list[dict[str, Any]]] = {k: [] for k in ("Pod", "ReplicaSet", "Deployment", "StatefulSet",
                                                                "CronJob", "Job")}  # fmt: skip
    for i in range(workloads):
        ns = f"team-{i % NAMESPACES}"
        quota = rng.choice([None, 4, 8, 16, 24, 40])
        kind = rng.random()
        if kind < 0.7:
            name = f"svc-{i}"
            objects["Deployment"].append({"metadata": _meta(ns, name), "spec": {"template": _template(quota)}})
            for day in range(days):
                rs = f"{name}-{_random(rng, 9)}"
                pod = f"{rs}-{_random(rng, 5)}"
                pods.append((ns, pod, start + day * DAY_S, start + (day + 1) * DAY_S, f"ReplicaSet/{rs}"))
                if day >= days - 3:  # revisionHistoryLimit: the last three are still listed
                    objects["ReplicaSet"].append(
                        {"metadata": _meta(ns, rs, ("Deployment", name)), "spec": {"template": _template(quota)}}
                    )
                if day == days - 1:
                    objects["Pod"].append({"metadata": _meta(ns, pod, ("ReplicaSet", rs)), "spec": {}})
        elif kind < 0.8:
            name = f"db-{i}"
            objects["StatefulSet"].append({"metadata": _meta(ns, name), "spec": {"template": _template(quota)}})
            for ordinal in range(2):
                pods.append((ns, f"{name}-{ordinal}", start, now, f"StatefulSet/{name}"))
                objects["Pod"].append({"metadata": _meta(ns, f"{name}-{ordinal}", ("StatefulSet", name)), "spec": {}})
        elif kind < 0.9:
            name = f"nightly-{i}"
            template = {"jobTemplate": {"spec": {"template": _template(quota)}}}
            objects["CronJob"].append({"metadata": _meta(ns, name), "spec": template})
            for day in range(days):
                scheduled = (start + day * DAY_S) // 60
                first = start + day * DAY_S
                pods.append(
                    (ns, f"{name}-{scheduled}-{_random(rng, 5)}", first, first + 7200, f"Job/{name}-{scheduled}")
                )
        else:
            name = f"notebook-{i}"
            pods.append((ns, name, start, now if i % 2 else start + DAY_S, ""))
            if i % 2:
                objects["Pod"].append({"metadata": _meta(ns, name), "spec": _template(quota)["spec"]})
    return pods, objects


def _target(gpu: int) -> str:
    """The labels of the agent's target on the node of GPU `gpu`, as the chart's ServiceMonitor scrapes it."""
    return f'job="{JOB}",instance="10.0.0.{gpu // GPUS_PER_NODE}:9400"'


def write_openmetrics(path: Path, pods: list[Pod], step_s: int, rng: random.Random, start: int, end: int) -> int:
    """The two gauges of every pod every `step_s` over its life, with its controller, and the recording rule's
    series of the peak gauge; each agent's `up` and its GPUs' memory from `start` to `end`; the samples written."""
    samples = 0
    recorded: dict[str, list[tuple[int, int]]] = {}  # the peak gauge's samples of each series, for the rule
    with path.open("w") as f:
        f.write("# TYPE up gauge\n")
        for node in range(GPUS // GPUS_PER_NODE):
            labels = f'{{{_target(node * GPUS_PER_NODE)},namespace="{RELEASE.namespace}"}}'
            f.writelines(f"up{labels} 1 {t}\n" for t in range(start - start % step_s + step_s, end, step_s))
        f.write(f"# TYPE {TOTAL_METRIC} gauge\n")
        for gpu in range(GPUS):
            labels = f'{{{_target(gpu)},namespace="{RELEASE.namespace}",gpu="0",gpu_uuid="GPU-{gpu}"}}'
            f.writelines(
                f"{TOTAL_METRIC}{labels} {80 * GiB} {t}\n" for t in range(start - start % step_s + step_s, end, step_s)
            )
        for metric in (USED_METRIC, PEAK_METRIC):
            f.write(f"# TYPE {metric} gauge\n")
            for ns, pod, first, last, owner in pods:
                base = rng.randint(1, 30) * GiB
                gpu = zlib.crc32(pod.encode()) % GPUS
                kind, _, owner_name = owner.partition("/") if owner else ("<none>", "", "<none>")
                exposed = (
                    f'namespace="{ns}",pod="{pod}",container="main",gpu="0",gpu_uuid="GPU-{gpu}",'
                    f'owner_kind="{kind}",owner_name="{owner_name}"'
                )
                labels = f"{{{_target(gpu)},{exposed}}}"  # honorLabels: the workload's namespace, not the agent's
                lines = []
                points = recorded.setdefault(labels, []) if metric == PEAK_METRIC else []
                for t in range(first - first % step_s + step_s, last, step_s):
                    value = base + rng.randint(0, 1024) * MiB
                    if metric == PEAK_METRIC and rng.random() < 0.05:
                        value += rng.randint(1, 8) * GiB
                    lines.append(f"{metric}{labels} {value} {t}\n")
                    points.append((t, value))
                f.writelines(lines)
                samples += len(lines)
        # What `max_over_time(peak[5m])` evaluated every 5 minutes records: each series' highest in (t - 5m, t].
        f.write(f"# TYPE {RECORDED_METRIC} gauge\n")
        for labels, points in recorded.items():
            highest: dict[int, int] = {}
            for t, value in points:
                at = t - t % RECORD_INTERVAL_S + (RECORD_INTERVAL_S if t % RECORD_INTERVAL_S else 0)
                highest[at] = max(highest.get(at, 0), value)
            f.writelines(f"{RECORDED_METRIC}{labels} {value} {at}\n" for at, value in sorted(highest.items()))
            samples += len(highest)
        f.write("# EOF\n")
    return samples


def serve(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = data.parent / "prometheus.yaml"
    config.write_text("global: {scrape_interval: 30s}\n")
    proc = subprocess.Popen(
        [str(PROMETHEUS_DIR / "prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(data.parent / "prometheus.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"Prometheus did not become ready; see {data.parent / 'prometheus.log'}")


def run_once(
    url: str, window_s: float, namespace: str | None, objects: dict[str, list[dict[str, Any]]], recorded: bool
) -> dict[str, Any]:
    """recommend as the command runs it, timed: the queries (reading the recording rule's series where `recorded`),
    the placing and resolving, the table."""
    started = time.perf_counter()
    scraped = read_peaks(url, window_s, RELEASE.scrape_selector, namespace, recorded=recorded)
    series, refused = within_gpu_memory(scraped.series, scraped.gpu_total_bytes)
    assert not refused, f"{len(refused)} peaks over their GPU's memory"
    asked = time.perf_counter()
    lists = {
        k: [o for o in v if namespace is None or o["metadata"]["namespace"] == namespace] for k, v in objects.items()
    }
    owners = Owners(lists)
    rows = recommend(series, owners, Policy())
    text = render_recommend(rows, patches(rows, owners), {}, [], RecommendOutput.table)
    done = time.perf_counter()
    return {
        "queries": scraped.queries,
        "recorded": scraped.recorded,
        "series": len(series),
        "workloads": len({r.workload for r in rows}),
        "rows": len(rows),
        "prometheus_s": asked - started,
        "total_s": done - started,
        "lines": text.count("\n"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--step", type=int, default=300, help="seconds between samples in the history")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.workloads, args.days = 100, 2
    if not (PROMETHEUS_DIR / "promtool").exists():
        print(f"no Prometheus at {PROMETHEUS_DIR} (bash scripts/prometheus.sh builds it)", file=sys.stderr)
        return 2
    rng = random.Random(34)
    with tempfile.TemporaryDirectory(prefix="vramguard-bench-recommend-") as tmp:
        work = Path(tmp)
        began = time.monotonic()
        # The blocks take minutes (promtool reads OpenMetrics on one core): kept for the next run of the same shape,
        # with the time they end at; a later run's window reaches back to their start.
        # v3: with the agents' targets, the owner labels and the recording rule's series
        cached = CACHE / f"v3-w{args.workloads}-d{args.days}-s{args.step}"
        made = int((cached / "done").read_text().split()[1]) if (cached / "done").exists() else None
        now = made if made is not None else int(time.time()) // 60 * 60
        pods, objects = history(args.workloads, args.days, now, rng)
        if made is None:
            samples = write_openmetrics(work / "history.om", pods, args.step, rng, now - args.days * DAY_S, now)
            written = time.monotonic()
            subprocess.run(
                [str(PROMETHEUS_DIR / "promtool"), "tsdb", "create-blocks-from", "openmetrics",
                 str(work / "history.om"), str(work / "blocks")],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
            (work / "history.om").unlink()
            shutil.rmtree(cached, ignore_errors=True)
            shutil.copytree(work / "blocks", cached)
            (cached / "done").write_text(f"{samples} {now}\n")
            print(f"history written in {written - began:.1f} s, its blocks built in {time.monotonic() - written:.1f} s")
        samples = int((cached / "done").read_text().split()[0])
        print(
            f"history: {args.workloads} workloads, {len(pods)} pods over {args.days} days, {samples} samples "
            f"(one per {args.step} s, two gauges, and the recording rule's every {RECORD_INTERVAL_S} s), "
            f"blocks in {cached}"
        )
        shutil.copytree(cached, work / "data", ignore=shutil.ignore_patterns("done"))
        proc, url = serve(work / "data")
        try:
            # The window less the history's first hour: the recording rule is there at its start (it records from the
            # history's start), as where the chart was installed before the window began.
            window_s = args.days * DAY_S + (time.time() - now) - 3600
            for label, namespace in (("all namespaces", None), ("one namespace", "team-0")):
                for how, recorded in (("the gauges as scraped", False), ("the recording rule", True)):
                    runs = [run_once(url, window_s, namespace, objects, recorded) for _ in range(args.repeat)]
                    best = min(runs, key=lambda r: r["total_s"])
                    worst = max(r["total_s"] for r in runs)
                    print(
                        f"{label}, {how}: {best['workloads']} workloads, {best['rows']} rows, {best['series']} series "
                        f"from {best['queries']} queries{' (the rule)' if best['recorded'] else ''}; Prometheus "
                        f"{best['prometheus_s']:.2f} s, recommend in all {best['total_s']:.2f} s (best of "
                        f"{args.repeat}; worst {worst:.2f} s), {best['total_s'] / GOAL_S:.2f} of the {GOAL_S:g} s goal"
                    )
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
