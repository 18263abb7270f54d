"""The status document (/status, `top --once --json`): its rows, its GPUs, its bounds, and one build per scan."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from vramguard.agent.report import LastScan, ScanReport
from vramguard.core.decide import DecisionState, decide
from vramguard.core.driver_limit import HeldLimit, LimitKey, LimitSetter
from vramguard.core.exited import ExitedTracker
from vramguard.core.orphans import OrphanTracker, PodRead
from vramguard.core.peaks import PeakWindow
from vramguard.core.policy import Policy
from vramguard.core.process import CgroupIdentity, ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaBook
from vramguard.core.snapshot import UnattributedProcess, UnattributedReason
from vramguard.core.text import MAX_TEXT_CHARS
from vramguard.http.status import (
    KIND,
    MAX_DESCRIBED,
    MAX_PROCESSES,
    MAX_ROWS,
    SCHEMA,
    AgentFacts,
    DriverFacts,
    PolicyFacts,
    StatusPage,
    render,
    scan_json,
)
from vramguard.node.describe import ProcessDetail
from vramguard_testbed.fakes import FakeClock, SnapshotBuilder, gpu, pod

FACTS = AgentFacts(version="1.2.3", node="node-a", mode="kill", dry_run=False, poll_interval_s=1.0)
DRIVER = DriverFacts("13.615.71", True, "615.40.02", "13.615.40.02", True, "")
HOSTILE = "evil\x1b[2J\x07\u202eexe\r\n\u0000forged"
GPU0, GPU1 = gpu(0), gpu(1)


def describe(pid: int) -> ProcessDetail:
    return ProcessDetail(pid, "alice", f"python worker-{pid}.py")


def report_of(builder: SnapshotBuilder, pressured: tuple[str, ...] = ()) -> ScanReport:
    """A scan of `builder`'s rows under the default policy, as the agent's loop makes it."""
    snapshot = builder.build()
    policy = Policy()
    pods = {u.pod.uid: u.pod for u in snapshot.containers}
    quotas, _ = QuotaBook(policy).resolve(pods, {})
    decision, _ = decide(snapshot, quotas, policy, DecisionState(), 0.0)
    return ScanReport(snapshot, quotas, replace(decision, pressured_devices=pressured), (), 0.0)


def document(
    report: ScanReport | None, held: dict[LimitKey, HeldLimit] | None = None, age: float | None = 0.5
) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(render(FACTS, age, scan_json(report, held or {}, describe), DRIVER))
    return doc


def test_the_document_says_the_agent_each_gpu_and_each_containers_row() -> None:
    """The document carries the agent's facts, each GPU with its pressure and limits, and one row per container."""
    trainer = pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    free = pod("free", "ml")
    builder = SnapshotBuilder().use(trainer, "main", GPU0, 6 * GiB, pid=10).use(free, "main", GPU1, GiB, pid=11)
    report = report_of(builder, pressured=(GPU1.uuid,))
    held = {LimitKey(trainer.uid, "main", GPU0.uuid): HeldLimit(4 * GiB, LimitSetter.AGENT)}
    doc = document(report, held, age=2.25)

    assert (doc["kind"], doc["schema"], doc["truncated"]) == (KIND, SCHEMA, 0)
    assert doc["agent"] == {"version": "1.2.3", "node": "node-a", "mode": "kill", "dry_run": False,
                            "poll_interval_s": 1.0, "scan_age_s": 2.25, "nvidia_ml_py": "13.615.71",
                            "driver_version": "615.40.02", "nvml_version": "13.615.40.02",
                            "driver_limits_possible": True, "driver_limits_reason": ""}  # fmt: skip
    gpu0, gpu1 = doc["gpus"]
    assert gpu0 == {"gpu": "0", "uuid": GPU0.uuid, "name": "Fake GPU", "total_bytes": 16 * GiB,
                    "used_bytes": 6 * GiB, "free_bytes": 10 * GiB, "healthy": True, "error": "", "pressure": False,
                    "limits": "driver", "needs_reset": False, "held_by_exited_bytes": 0,
                    "held_by_exited_pids": [], "orphaned_bytes": 0}  # fmt: skip
    assert (gpu1["pressure"], gpu1["limits"]) == (True, "agent")
    rows = {r["pod"]: r for r in doc["containers"]}
    assert rows["trainer"] == {
        "gpu": "0", "namespace": "ml", "pod": "trainer", "container": "main",
        "processes": [{"pid": 10, "user": "alice", "command": "python worker-10.py"}], "used_bytes": 6 * GiB,
        "quota_bytes": 4 * GiB, "state": "over-hard", "held_by": "driver", "claim": "", "pids": [10],
        "percent": 150.0, "quota_source": "limits[vramguard.io/vram]", "reason": "",
    }  # fmt: skip
    assert (rows["free"]["state"], rows["free"]["quota_source"], rows["free"]["quota_bytes"]) == ("unmanaged", "", None)


def test_an_unhealthy_gpu_is_a_gpu_and_a_row() -> None:
    """An unhealthy GPU is a GPU carrying its error exactly, and a row saying so."""
    sick = replace(gpu(2), healthy=False, error=HOSTILE)
    doc = document(report_of(SnapshotBuilder(devices=[sick])))
    (g,) = doc["gpus"]
    assert (g["healthy"], g["error"]) == (False, HOSTILE), "tenant-free, but carried exactly all the same"
    (row,) = doc["containers"]
    assert row["state"] == f"gpu-unhealthy: {HOSTILE}"


def test_before_the_first_scan_nothing_but_the_agent() -> None:
    """Before the first scan the document holds the agent with no scan age, and no GPUs or rows."""
    doc = document(None, age=None)
    assert doc["agent"]["scan_age_s"] is None
    assert (doc["gpus"], doc["containers"], doc["truncated"]) == ([], [], 0)


def test_the_nvidia_side_is_as_known_when_answered() -> None:
    """The agent's part says the driver as known at each answer: before NVML is up, nvidia-ml-py's version, null
    driver and NVML versions and limits not known (and why); once it is up, the driver's, with no rebuild."""
    known = [DriverFacts("13.615.71", True, limits_reason="not known yet: the agent is starting")]
    page = StatusPage(FACTS, lambda: None, FakeClock(), describe, driver=lambda: known[-1])
    before = _answer(page)
    assert before is not None
    assert {k: before["agent"][k] for k in ("nvidia_ml_py", "driver_version", "nvml_version")} == {
        "nvidia_ml_py": "13.615.71", "driver_version": None, "nvml_version": None,
    }  # fmt: skip
    assert before["agent"]["driver_limits_possible"] is None
    assert before["agent"]["driver_limits_reason"] == "not known yet: the agent is starting"

    known.append(DriverFacts("13.615.71", True, "550.54.15", "12.550.54.15", False, "GPU 0 does not support it"))
    after = _answer(page)
    assert after is not None and page.builds == 0
    assert (after["agent"]["driver_version"], after["agent"]["driver_limits_possible"]) == ("550.54.15", False)
    assert after["agent"]["driver_limits_reason"] == "GPU 0 does not support it"


def _crowd(pods: int, processes: int) -> ScanReport:
    """`pods` pods of one container each on GPU 0, each with `processes` processes."""
    builder = SnapshotBuilder()
    for i in range(pods):
        builder.use(pod(f"p{i:05d}", "ml"), "main", GPU0, GiB, pid=1000 + i)
    builder.rows = [u._replace(processes=tuple(u.processes) * processes) for u in builder.rows]
    return report_of(builder)


@pytest.mark.parametrize(
    ("pods", "processes", "rows", "per_row", "truncated"),
    [
        pytest.param(3, 1, 3, 1, 0, id="small-node-whole"),
        pytest.param(MAX_ROWS + 5, 1, MAX_ROWS, 1, 5, id="rows-over-the-cap-counted"),
        pytest.param(2, MAX_PROCESSES + 10, 2, MAX_PROCESSES, 0, id="processes-over-the-cap-cut"),
    ],
)
def test_rows_and_processes_are_bounded(pods: int, processes: int, rows: int, per_row: int, truncated: int) -> None:
    """Rows over MAX_ROWS are counted as truncated and processes over MAX_PROCESSES cut; only those shown are read."""
    described: list[int] = []

    def counting(pid: int) -> ProcessDetail:
        described.append(pid)
        return describe(pid)

    doc = json.loads(render(FACTS, 0.0, scan_json(_crowd(pods, processes), {}, counting), DRIVER))
    assert (len(doc["containers"]), doc["truncated"]) == (rows, truncated)
    assert {len(r["processes"]) for r in doc["containers"]} == {per_row}
    assert {len(r["pids"]) for r in doc["containers"]} == {per_row}
    assert len(described) == min(rows * per_row, MAX_DESCRIBED), "/proc is read for the processes shown only"


def test_no_more_than_max_described_processes_are_read() -> None:
    """However many processes the document shows, at most MAX_DESCRIBED are read from /proc; the rest show their
    PID with an empty user and command."""
    described: list[int] = []

    def counting(pid: int) -> ProcessDetail:
        described.append(pid)
        return describe(pid)

    doc = json.loads(render(FACTS, 0.0, scan_json(_crowd(MAX_DESCRIBED // 4 + 1, 4), {}, counting), DRIVER))
    shown = [p for r in doc["containers"] for p in r["processes"]]
    assert len(shown) == MAX_DESCRIBED + 4 and len(described) == MAX_DESCRIBED
    assert [p["command"] for p in shown[MAX_DESCRIBED:]] == [""] * 4 and shown[-1]["user"] == ""


def test_hostile_text_is_exact_cut_and_the_body_bounded() -> None:
    """Every string is cut to MAX_TEXT_CHARS, carried exactly below it; rows of the worst text (every character
    escaped by JSON) stop at the byte budget, the rest counted, the body well under 8 MiB."""
    long = HOSTILE * 1000
    evil = pod(long, HOSTILE, containers={HOSTILE: {"vramguard.io/vram": "1Gi"}})
    part = scan_json(report_of(SnapshotBuilder().use(evil, HOSTILE, GPU0, GiB)), {},
                     lambda pid: ProcessDetail(pid, HOSTILE, long))  # fmt: skip
    exact = json.loads(render(FACTS, 0.0, part, DRIVER))
    (row,) = exact["containers"]
    assert (row["namespace"], row["container"], row["processes"][0]["user"]) == (HOSTILE, HOSTILE, HOSTILE)
    assert len(row["pod"]) == MAX_TEXT_CHARS and row["pod"].startswith(HOSTILE) and row["pod"].endswith("characters]")
    assert len(row["processes"][0]["command"]) == MAX_TEXT_CHARS

    worst = "\x1b" * 5000  # 6 bytes of JSON a character
    part = scan_json(_crowd(100, MAX_PROCESSES), {}, lambda pid: ProcessDetail(pid, worst, worst))
    body = render(FACTS, 0.0, part, DRIVER)
    doc = json.loads(body)
    assert len(body) < 8 * 1024 * 1024
    assert doc["truncated"] > 0 and len(doc["containers"]) + doc["truncated"] == 100


def _last_scan(finished_at: float) -> LastScan:
    trainer = pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    return LastScan(report_of(SnapshotBuilder().use(trainer, "main", GPU0, GiB)), {}, finished_at)


def _answer(page: StatusPage) -> dict[str, Any] | None:
    """What the page answers a reader now: the document, or None while its reader waits for a build."""
    body = page.body(lambda: None)
    built = body() if callable(body) else body
    doc: dict[str, Any] | None = None if built is None else json.loads(built)
    return doc


def test_the_page_is_built_when_asked_once_a_scan_and_its_age_is_that_of_the_answer() -> None:
    """Nothing is built until a reader asks; the reader waits for the build (never built on its thread), every
    reader of that scan shares it, and the age is the answer's."""
    clock = FakeClock()
    scans: list[LastScan | None] = [None]
    notified: list[int] = []
    page = StatusPage(FACTS, lambda: scans[-1], clock, describe, driver=lambda: DRIVER)

    first = _answer(page)
    assert first is not None and first["agent"]["scan_age_s"] is None and first["containers"] == []

    scans.append(_last_scan(clock.now()))
    clock.step(1.5)
    page.build()
    assert page.builds == 0, "built only when asked"
    waiting = [page.body(lambda: notified.append(page.builds)) for _ in range(100)]
    assert all(callable(w) and w() is None for w in waiting), "the readers wait; nothing is built on their thread"
    page.build()
    assert page.builds == 1 and notified == [1] * 100, "a flood of readers costs one build a scan, and they are told"
    bodies = [json.loads(w() or b"null") for w in waiting if callable(w)]
    assert bodies[0]["agent"]["scan_age_s"] == 1.5 and bodies[0]["containers"][0]["pod"] == "trainer"
    clock.step(2.0)
    answer = _answer(page)
    assert answer is not None and answer["agent"]["scan_age_s"] == 3.5, "the age is the answer's, not the build's"
    assert page.builds == 1


def test_a_reader_is_answered_by_a_later_scan_when_scans_outpace_builds() -> None:
    """A reader waits for the scan that was the last when it asked, or any later one: it never starves."""
    clock = FakeClock()
    scans: list[LastScan | None] = [_last_scan(clock.now())]
    page = StatusPage(FACTS, lambda: scans[-1], clock, describe, driver=lambda: DRIVER)
    waiting = page.body(lambda: None)
    assert callable(waiting) and waiting() is None
    clock.step(0.1)
    scans.append(_last_scan(clock.now()))  # another scan before the build
    page.build()
    assert json.loads(waiting() or b"null")["agent"]["scan_age_s"] == 0.0


def test_the_pages_loop_builds_what_a_reader_asked_for() -> None:
    """A round of the page's loop waits for a reader's ask, then builds once; its readers are told."""
    scan = _last_scan(0.0)
    page = StatusPage(FACTS, lambda: scan, FakeClock(), describe, driver=lambda: DRIVER)
    waiting = page.body(page._loop.stopping.set)
    assert callable(waiting) and waiting() is None
    page._loop.run()
    assert page.builds == 1 and waiting() is not None


def test_the_peaks_since_the_agents_start_are_in_the_document() -> None:
    """The "peaks" carry each container's highest usage since the agent's first scan, with its pod's controller,
    and "peaks_cover_s" how long that is: what `kubectl vramguard recommend` reads without a Prometheus."""
    web = replace(pod("web-7d9f-abcde", "ml"), owner="ReplicaSet/web-7d9f")
    window = PeakWindow()
    for at, used in ((0.0, 3 * GiB), (1.0, 7 * GiB), (90.0, 2 * GiB)):
        window.observe(SnapshotBuilder().use(web, "main", GPU0, used).build().containers, {GPU0.uuid: GPU0}, at)
    report = replace(report_of(SnapshotBuilder().use(web, "main", GPU0, 2 * GiB)), highest=window.highest(90.0))
    doc = document(report)
    assert doc["peaks"] == [
        {"gpu": "0", "gpu_uuid": GPU0.uuid, "namespace": "ml", "pod": "web-7d9f-abcde", "owner": "ReplicaSet/web-7d9f",
         "container": "main", "peak_bytes": 7 * GiB}
    ]  # fmt: skip
    assert doc["peaks_cover_s"] == 90.0
    assert (document(None)["peaks"], document(None)["peaks_cover_s"]) == ([], 0)


def test_the_policy_in_force_is_in_the_agents_part() -> None:
    """A reloaded policy's mode replaces the start's; a refused file and the fields waiting for a restart show."""
    refused = "invalid policy in /etc/vramguard/policy.yaml: mode: ..."
    facts = PolicyFacts("evict", "ab" * 32, refused, ("driver_limits",), checks=7)
    doc = json.loads(render(FACTS, None, scan_json(None, {}), DRIVER, facts))
    assert doc["agent"]["mode"] == "evict"
    assert doc["agent"]["policy"] == {
        "sha256": "ab" * 32,
        "invalid": refused,
        "restart_needed": ["driver_limits"],
        "checks": 7,
    }
    assert "policy" not in json.loads(render(FACTS, None, scan_json(None, {}), DRIVER)), "no reloads: no part"


def test_a_gpu_that_needs_a_reset_says_so_and_its_unattributed_rows_say_why() -> None:
    """A GPU whose memory exited PIDs hold past a teardown carries needs_reset, the bytes and the PIDs; each
    unattributed row carries its reason as the metric's label and in words in its state."""
    builder = SnapshotBuilder(devices=[GPU0, GPU1])
    snapshot = replace(
        builder.build(),
        unattributed=(
            UnattributedProcess(ProcessRef(9, -1), GPU0.uuid, 3 * GiB, UnattributedReason.PROCESS_EXITED),
            UnattributedProcess(ProcessRef(7, 1), GPU1.uuid, GiB, UnattributedReason.NOT_IN_POD),
        ),
    )
    tracker = ExitedTracker(hold_s=0.0)
    report = replace(report_of(builder), snapshot=snapshot, exited=tracker.observe(snapshot.unattributed, 5.0))
    doc = document(report)
    gpu0, gpu1 = doc["gpus"]
    assert (gpu0["needs_reset"], gpu0["held_by_exited_bytes"], gpu0["held_by_exited_pids"]) == (True, 3 * GiB, [9])
    assert (gpu1["needs_reset"], gpu1["held_by_exited_bytes"], gpu1["held_by_exited_pids"]) == (False, 0, [])
    rows = {r["pids"][0]: r for r in doc["containers"]}
    assert (rows[9]["reason"], rows[9]["state"]) == ("process-exited", "unattributed: held by an exited process")
    assert (rows[7]["reason"], rows[7]["state"]) == ("not-in-pod", "unattributed: not in a pod cgroup")


def test_a_gpu_says_what_orphans_hold_on_it_and_their_rows_name_the_pod_that_is_gone() -> None:
    """Each GPU carries orphaned_bytes (0 on one without); an orphan's rows name the pod as the agent saw it before
    it went, and say that it is gone."""
    gone = pod("trainer", "ml")
    cgroup = CgroupIdentity(gone.uid, "c" * 64)

    def row(pid: int, device: str, reason: UnattributedReason) -> UnattributedProcess:
        return UnattributedProcess(ProcessRef(pid, pid * 10), device, 2 * GiB, reason, cgroup)

    tracker = OrphanTracker({gone.uid})
    tracker.observe((), {gone.uid: gone}, healthy=True, now=0.0, grace_s=0.0)  # the pod in the cache
    absent = (row(20, GPU0.uuid, UnattributedReason.POD_NOT_IN_CACHE),)
    assert tracker.observe(absent, {}, healthy=True, now=1.0, grace_s=0.0).read_wanted  # the pod deleted
    tracker.confirm(PodRead(started_at=1.0))  # and the API server does not have it
    orphaned = (row(20, GPU0.uuid, UnattributedReason.ORPHANED), row(21, GPU0.uuid, UnattributedReason.ORPHANED))
    builder = SnapshotBuilder(devices=[GPU0, GPU1])
    snapshot = replace(builder.build(), unattributed=orphaned)
    orphans = tracker.observe(orphaned, {}, healthy=True, now=2.0, grace_s=0.0)
    doc = document(replace(report_of(builder), snapshot=snapshot, orphans=orphans))
    assert [(g["gpu"], g["orphaned_bytes"]) for g in doc["gpus"]] == [("0", 4 * GiB), ("1", 0)]
    assert [
        (r["namespace"], r["pod"], r["container"], r["pids"], r["reason"], r["state"]) for r in doc["containers"]
    ] == [("ml", "trainer", "-", [pid], "orphaned", "unattributed: orphaned: its pod is gone") for pid in (20, 21)]
