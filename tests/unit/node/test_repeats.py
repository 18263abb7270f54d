"""The repeat memory in the state directory: what a restarted agent reads back, what it checks against the node's
processes (a fake /proc here; real processes in tests/node/test_repeats.py), and what it refuses."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.agent.act import Enforcer
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.base.worker import Inline
from vramguard.core.actions import KillRecord
from vramguard.core.policy import ActionKind, Mode, Policy
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuProcess, GpuSample
from vramguard.node.repeats import (
    GONE,
    MAX_CONTAINERS_SHOWN,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_KILLED_SAVED,
    NO_PROCESS,
    OLD_FORMAT,
    OLDER_THAN_CONTAINER,
    PID_MAX_LIMIT,
    PID_TAKEN,
    STARTS_LATER,
    STILL_RUNNING,
    UNREADABLE,
    KillFile,
    NodeView,
    disagreement,
    parse_kills,
    read_node,
)
from vramguard_testbed.fakes import (
    FakeClock,
    FakeEvictor,
    FakeIdentifier,
    FakePodSource,
    FakeSampler,
    RecordingEventRecorder,
    RecordingKiller,
    gpu,
    pod,
)

BOOT = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER_BOOT = "11111111-2222-3333-4444-555555555555"
A, B = "a" * 64, "b" * 64
NOW = 1000.0


def _entry(at: object, *killed: object) -> dict[str, object]:
    return {"at": at, "killed": list(killed)}


def _doc(kills: object, boot_id: object = BOOT, version: object = 2) -> bytes:
    document = {"boot_id": boot_id, "kills": kills}
    if version is not None:
        document["version"] = version
    return json.dumps(document).encode()


def _record(at: float, *killed: tuple[int, int], restored: bool = True) -> KillRecord:
    return KillRecord(at, tuple(ProcessRef(pid, start) for pid, start in killed), restored)


KEPT = _entry(990.0, [100, 5000])


@pytest.mark.parametrize(
    ("data", "kept", "dropped", "problem"),
    [
        pytest.param(
            _doc({A: KEPT, B: _entry(12, [7, 10], [8, 20])}),
            {A: _record(990.0, (100, 5000)), B: _record(12.0, (7, 10), (8, 20))}, 0, None,
            id="entries-of-this-boot-are-kept-restored",
        ),
        pytest.param(_doc({}), {}, 0, None, id="an-empty-memory"),
        pytest.param(_doc({A: KEPT}, OTHER_BOOT), {}, 0, None, id="another-boot-is-dropped-whole-not-junk"),
        pytest.param(
            _doc({A: 990.0, B: 12}, version=None), {}, 2, OLD_FORMAT,
            id="format-1-without-killed-processes-is-refused",
        ),
        pytest.param(
            _doc({A: KEPT}, version=3), {}, 1, "an unknown format version: '3'", id="an-unknown-format-is-refused",
        ),
        pytest.param(b"\x00\xffjunk", {}, 1, "not JSON", id="not-json"),
        pytest.param(b"[" * 100_000, {}, 1, "not JSON", id="nesting-bomb"),
        pytest.param(b'{"boot_id": "x"}', {}, 1, "not an object with a kills object", id="no-kills"),
        pytest.param(b"[1, 2]", {}, 1, "not an object with a kills object", id="not-an-object"),
        pytest.param(
            _doc({A: KEPT, "../../etc": KEPT, A.upper(): KEPT, "c" * 63: KEPT}), {A: _record(990.0, (100, 5000))},
            3, "a key that is not a 64-hex container ID", id="keys-not-of-the-agents-shape",
        ),
        pytest.param(_doc({A: 990.0, B: [1]}), {}, 2, "an entry that is not an object", id="entries-not-objects"),
        pytest.param(
            _doc({A: _entry("990", [1, 2]), B: _entry(True, [1, 2])}), {}, 2, "a time that is not a number",
            id="times-that-are-not-numbers",
        ),
        pytest.param(_doc({A: _entry(1e309, [1, 2])}), {}, 1, "a time that is not a number", id="infinite-time"),
        pytest.param(
            _doc({A: _entry(NOW + 1, [1, 2]), B: _entry(-1.0, [1, 2])}), {}, 2, "a time outside this boot's past",
            id="future-or-negative",
        ),
        pytest.param(
            _doc({A: _entry(990.0), B: {"at": 990.0}}), {}, 2, NO_PROCESS, id="an-entry-naming-no-killed-process",
        ),
        pytest.param(
            _doc({A: _entry(990.0, [1]), B: _entry(990.0, ["1", 2]), "c" * 64: _entry(990.0, [True, 2]),
                  "d" * 64: _entry(990.0, [1, 2.5]), "e" * 64: _entry(990.0, 7)}),
            {}, 5, "a killed process that is not [PID, start time]", id="killed-processes-not-pairs-of-integers",
        ),
        pytest.param(
            _doc({A: _entry(990.0, [0, 2]), B: _entry(990.0, [PID_MAX_LIMIT + 1, 2]),
                  "c" * 64: _entry(990.0, [5, -1])}),
            {}, 3, "a killed PID or start time out of range", id="killed-pid-or-start-time-out-of-range",
        ),
        pytest.param(
            _doc({A: _entry(990.0, *([p, p] for p in range(1, MAX_KILLED_SAVED + 2)))}), {}, 1,
            f"more than {MAX_KILLED_SAVED} killed processes", id="more-killed-processes-than-the-agent-saves",
        ),
        pytest.param(
            _doc({f"{i:064x}": _entry(1.0, [1, 2]) for i in range(MAX_ENTRIES + 5)}), None, 5,
            f"more than {MAX_ENTRIES} entries", id="too-many-entries-are-cut",
        ),
    ],
)  # fmt: skip
def test_parse_kills(data: bytes, kept: dict[str, KillRecord] | None, dropped: int, problem: str | None) -> None:
    """Only entries the agent could have written, from this boot and of this format, each naming the processes it
    killed, are kept (marked restored); the rest are counted and named."""
    found = parse_kills(data, BOOT, NOW)
    if kept is not None:
        assert dict(found.kills) == kept
    else:
        assert len(found.kills) == MAX_ENTRIES
    assert found.dropped == dropped
    assert (problem in found.problems) if problem is not None else found.problems == ()


NOW_TICKS = 100_000
# The container instance A: its first process started at tick 1000; a kill in it at tick 5000 of PID 100.
SEEN = NodeView(now_ticks=NOW_TICKS, running={}, unreadable=frozenset(), oldest={A: 1000})


@pytest.mark.parametrize(
    ("record", "node", "expected"),
    [
        pytest.param(_record(990, (100, 5000)), SEEN, None, id="a-kill-the-node-agrees-with"),
        pytest.param(
            _record(990, (100, 5000)), NodeView(NOW_TICKS, {100: 9000}, frozenset(), {A: 1000}), None,
            id="its-pid-reused-since-by-a-newer-process",
        ),
        pytest.param(
            _record(990, (100, 5000), (101, 500)), SEEN, None,
            id="one-killed-process-newer-than-the-containers-first-is-enough",
        ),
        pytest.param(_record(990, (100, NOW_TICKS + 50)), SEEN, STARTS_LATER, id="a-killed-process-starting-after-now"),
        pytest.param(
            _record(990, (100, 5000)), NodeView(NOW_TICKS, {100: 5000}, frozenset(), {A: 1000}), STILL_RUNNING,
            id="a-killed-process-still-running-was-never-killed",
        ),
        pytest.param(
            _record(990, (100, 5000)), NodeView(NOW_TICKS, {100: 4000}, frozenset(), {A: 1000}), PID_TAKEN,
            id="a-killed-pid-held-since-before-that-process-started",
        ),
        pytest.param(
            _record(990, (100, 5000)), NodeView(NOW_TICKS, {}, frozenset({100}), {A: 1000}), UNREADABLE,
            id="a-killed-process-that-cannot-be-read",
        ),
        pytest.param(
            _record(990, (100, 500), (101, 900)), SEEN, OLDER_THAN_CONTAINER,
            id="killed-processes-all-older-than-the-container",
        ),
        pytest.param(_record(990), SEEN, NO_PROCESS, id="a-kill-that-names-no-process"),
        pytest.param(
            _record(990, (100, 5000)), NodeView(NOW_TICKS, {}, frozenset(), {}), GONE,
            id="a-container-with-no-process-left-is-gone-not-false",
        ),
    ],
)  # fmt: skip
def test_disagreement(record: KillRecord, node: NodeView, expected: str | None) -> None:
    """A remembered kill is trusted only if nothing the node shows contradicts it: every process it killed
    started before now, is not running, and had a PID no older process held; one of them started no earlier than
    the container instance's first process."""
    assert disagreement(A, record, node) == expected


# --------------------------------------------------------------------------------------------------------------
# Over a fake /proc


@dataclass
class FakeProc:
    """A /proc tree: `add` a process (stat, cgroup)."""

    root: Path

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int, start_time: int, container_id: str | None = None, state: str = "S") -> None:
        directory = self.root / str(pid)
        directory.mkdir()
        fields = ["0"] * 49
        fields[18] = str(start_time)  # field 22, the 20th after the state
        (directory / "stat").write_text(f"{pid} (python3) {state} " + " ".join(fields) + "\n")
        where = f"/kubepods/burstable/pod{BOOT}/{container_id}" if container_id else "/system.slice/sshd.service"
        (directory / "cgroup").write_text(f"0::{where}\n")

    def unreadable(self, pid: int) -> None:
        """A process whose stat cannot be read (a directory where the file is: EISDIR, not "gone")."""
        (self.root / str(pid)).mkdir()
        (self.root / str(pid) / "stat").mkdir()

    def __str__(self) -> str:
        return str(self.root)


def test_read_node_sees_running_processes_and_each_containers_first(tmp_path: Path) -> None:
    """What the node shows: the PIDs asked about that run (a zombie does not), those that cannot be read, and the
    start time of each container's oldest running process."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(10, 1000, A)  # A's first process
    proc.add(11, 1500, A)
    proc.add(12, 800, A, state="Z")  # exited: no longer the container's
    proc.add(20, 3000, B)
    proc.add(30, 200)  # outside any container
    proc.add(100, 9000)
    proc.add(101, 4000, state="Z")
    proc.unreadable(102)
    node = read_node(str(proc), [100, 101, 102, 103], [A, "c" * 64], NOW_TICKS)
    assert node == NodeView(NOW_TICKS, {100: 9000}, frozenset({102}), {A: 1000})


def test_read_node_without_a_proc_cannot_check(tmp_path: Path) -> None:
    """A /proc that cannot be listed shows nothing: the read fails (and the caller trusts nothing)."""
    with pytest.raises(OSError):
        read_node(str(tmp_path / "no-proc"), [1], [A], NOW_TICKS)


def _file(tmp_path: Path, proc: FakeProc | None = None) -> KillFile:
    boot = tmp_path / "boot_id"
    boot.write_text(BOOT + "\n")
    proc = proc if proc is not None else FakeProc(tmp_path / "proc")
    return KillFile(str(tmp_path / "state"), proc_root=str(proc), boot_id_path=str(boot), now_ticks=lambda: NOW_TICKS)


def test_saved_kills_are_read_back_restored(tmp_path: Path) -> None:
    """What one agent saves (each kill with its newest processes), the next one of the same boot loads, marked
    restored, and says so in one line; no temporary file is left behind."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(10, 1000, A)
    proc.add(20, 1000, B)
    memory = _file(tmp_path, proc)
    many = [(200 + i, 2000 + i) for i in range(MAX_KILLED_SAVED + 3)]
    memory.save({A: _record(990.0, *many, restored=False), B: _record(995.5, (7, 1200), restored=True)})
    with capture_logs() as logs:
        loaded = _file(tmp_path, proc).load(NOW)
    assert dict(loaded) == {A: _record(990.0, *many[-MAX_KILLED_SAVED:]), B: _record(995.5, (7, 1200))}
    assert logs == [
        {
            "event": "kill_memory_restored",
            "log_level": "info",
            "file": memory.path,
            "restored": 2,
            "containers": [A[:12], B[:12]],
            "gone": 0,
        }
    ]
    assert os.listdir(memory.directory) == ["kills.json"]
    assert os.stat(memory.path).st_mode & 0o777 == 0o600
    assert json.loads(Path(memory.path).read_bytes())["version"] == 2


def test_what_the_node_contradicts_is_refused_in_one_line(tmp_path: Path) -> None:
    """Entries the node contradicts are refused and named (short container IDs) with why, in one warning; an entry
    whose container is gone is counted, not refused; the rest is restored."""
    proc = FakeProc(tmp_path / "proc")
    c, d, e = "c" * 64, "d" * 64, "e" * 64
    proc.add(10, 1000, A)
    proc.add(20, 1000, B)
    proc.add(30, 1000, c)
    proc.add(77, 3000, B)  # "killed", yet running
    memory = _file(tmp_path, proc)
    Path(memory.directory).mkdir()
    kills = {
        A: _entry(990.0, [100, 5000]),
        B: _entry(990.0, [77, 3000]),
        c: _entry(990.0, [100, NOW_TICKS * 2]),
        d: _entry(990.0, [100, 5000]),  # no process of d's left
        e: 990.0,
    }
    Path(memory.path).write_bytes(_doc(kills))
    with capture_logs() as logs:
        assert dict(memory.load(NOW)) == {A: _record(990.0, (100, 5000))}
    assert [(x["event"], x.get("restored"), x.get("gone"), x["containers"]) for x in logs] == [
        ("kill_memory_restored", 1, 1, [A[:12]]),
        ("kill_memory_refused", None, None, [e[:12], B[:12], c[:12]]),
    ]
    refused = logs[1]
    assert (refused["refused"], refused["kept"]) == (3, 1)
    assert refused["problems"] == ("an entry that is not an object", STILL_RUNNING, STARTS_LATER)


def test_an_unreadable_proc_trusts_nothing(tmp_path: Path) -> None:
    """Where the node's processes cannot be read, no entry can be checked: every one is refused, with why."""
    memory = KillFile(str(tmp_path / "state"), proc_root=str(tmp_path / "no-proc"), boot_id_path=os.devnull)
    memory.save({A: _record(990.0, (100, 5000), restored=False)})
    with capture_logs() as logs:
        assert memory.load(NOW) == {}
    (line,) = logs
    assert (line["event"], line["refused"], line["containers"]) == ("kill_memory_refused", 1, [A[:12]])
    assert line["problems"][0].startswith(f"cannot read {tmp_path / 'no-proc'}: ")


def test_the_log_names_a_bounded_number_of_containers(tmp_path: Path) -> None:
    """However many entries, the log line names at most MAX_CONTAINERS_SHOWN containers and counts them all."""
    proc = FakeProc(tmp_path / "proc")
    ids = [f"{i:064x}" for i in range(1, 41)]
    for i, cid in enumerate(ids):
        proc.add(1000 + i, 1000, cid)
    memory = _file(tmp_path, proc)
    memory.save({cid: _record(990.0, (100 + i, 5000), restored=False) for i, cid in enumerate(ids)})
    with capture_logs() as logs:
        assert len(memory.load(NOW)) == 40
    ((line),) = logs
    assert line["restored"] == 40 and len(line["containers"]) == MAX_CONTAINERS_SHOWN


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        target = path.parent / "elsewhere.json"
        target.write_bytes(_doc({A: KEPT}))
        path.symlink_to(target)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_bytes(b" " * (MAX_FILE_BYTES + 1))
    elif kind == "writable":
        path.write_bytes(_doc({A: KEPT}))
        path.chmod(0o666)
    elif kind == "foreign":
        path.write_bytes(_doc({A: KEPT}))
        os.chown(path, os.geteuid() + 1, -1)


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        pytest.param("symlink", "Too many levels of symbolic links", id="a-link-is-not-followed"),
        pytest.param("directory", "not a regular file", id="a-directory"),
        pytest.param("huge", f"larger than {MAX_FILE_BYTES} bytes", id="a-huge-file-is-not-read-whole"),
        pytest.param("writable", "writable by others than its owner", id="a-file-others-may-write"),
        pytest.param(
            "foreign",
            f"owned by UID {os.geteuid() + 1}, not the agent's",
            id="a-file-of-another-user",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root"),
        ),
    ],
)
def test_a_hostile_file_is_refused_in_one_line(tmp_path: Path, kind: str, problem: str) -> None:
    """Whatever sits at kills.json, load returns at once with nothing, and says why in one log line. A FIFO, which
    could block a reader, is the node tier's (tests/node/test_repeats.py)."""
    memory = _file(tmp_path)
    _plant(Path(memory.path), kind)
    with capture_logs() as logs:
        assert memory.load(NOW) == {}
    assert [(e["event"], e["refused"], e["problems"]) for e in logs] == [("kill_memory_refused", "all", [problem])]


def test_junk_entries_are_reported_in_one_line(tmp_path: Path) -> None:
    """40,000 junk entries: the good one is kept, the rest counted in a single warning, which names no junk key."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(10, 1000, A)
    memory = _file(tmp_path, proc)
    Path(memory.directory).mkdir()
    Path(memory.path).write_bytes(_doc({A: KEPT, **{f"junk-{i}": KEPT for i in range(40_000)}})[:MAX_FILE_BYTES])
    with capture_logs() as logs:
        assert memory.load(NOW) == {}
    assert [(e["event"], e["problems"]) for e in logs] == [("kill_memory_refused", ("not JSON",))]
    Path(memory.path).write_bytes(_doc({A: KEPT, **{f"j{i}": KEPT for i in range(10_000)}}))
    with capture_logs() as logs:
        assert dict(memory.load(NOW)) == {A: _record(990.0, (100, 5000))}
    assert [(e["event"], e.get("refused"), e["containers"]) for e in logs] == [
        ("kill_memory_restored", None, [A[:12]]),
        ("kill_memory_refused", 10_000, []),
    ]


def test_a_failed_save_is_logged_once_per_run(tmp_path: Path) -> None:
    """A state directory that cannot be written: one warning for the run of failures, not one per kill."""
    (tmp_path / "state").write_text("a file where the directory should be")
    memory = _file(tmp_path)
    with capture_logs() as logs:
        memory.save({A: _record(990.0, (1, 2))})
        memory.save({A: _record(990.0, (1, 2)), B: _record(991.0, (3, 4))})
    assert [e["event"] for e in logs] == ["kill_memory_unsaved"]


# --------------------------------------------------------------------------------------------------------------
# The agent over it


def _agent(memory: KillFile, clock: FakeClock, sampler: FakeSampler, ids: FakeIdentifier, pods: FakePodSource) -> Agent:
    killer = RecordingKiller(sampler)
    policy = Policy(mode=Mode.KILL, cooldown_s=0.0)
    enforcer = Enforcer(
        killer=killer,
        evictor=FakeEvictor(),
        events=RecordingEventRecorder(),
        policy=policy,
        clock=clock,
        evictions=Inline(),
    )
    return Agent(
        sampler=sampler,
        identifier=ids,
        pods=pods,
        policy=policy,
        enforcer=enforcer,
        metrics=Metrics(),
        clock=clock,
        agent_pid=1,
        kill_memory=memory,
    )


RESTORED = "GPU processes came back within 30.0 s of the last kill (a kill recorded by an earlier agent, restored"


def test_a_restarted_agent_still_knows_a_repeat_and_says_it_is_restored(tmp_path: Path) -> None:
    """The agent kills in a container, is restarted, and the new agent escalates that container instance's next
    violation as a repeat (every process of the container), saying the kill was restored; the kill it then makes
    is its own, not restored."""
    clock, sampler, ids = FakeClock(), FakeSampler(), FakeIdentifier()
    p = pod("ray-head", "ml", containers={"main": {"vramguard.io/vram": "1Gi"}})
    container_id = p.containers[0].container_id
    pods = FakePodSource([p])
    device = gpu(0, total_bytes=16 * GiB, used_bytes=2 * GiB)
    proc = FakeProc(tmp_path / "proc")
    proc.add(50, 10, container_id)  # the container's supervisor (FakeIdentifier's start time is pid * 10)

    def worker(pid: int) -> None:
        ids.add(pid, p.uid, container_id)
        sampler.next = GpuSample(devices=(device,), processes=(GpuProcess(pid, device.uuid, 2 * GiB),))

    worker(100)
    first = _agent(_file(tmp_path, proc), clock, sampler, ids, pods)
    (kill,) = [o for o in first.scan().outcomes if o.action.kind is ActionKind.KILL]
    assert kill.action.escalation is None

    clock.step(30.0)  # the agent restarted; the supervisor respawned its worker
    worker(101)
    second = _agent(_file(tmp_path, proc), clock, sampler, ids, pods)
    assert second.state.kills[container_id or ""] == KillRecord(1000.0, (ProcessRef(100, 1000),), restored=True)
    (kill,) = [o for o in second.scan().outcomes if o.action.kind is ActionKind.KILL]
    assert kill.action.escalation is not None
    assert kill.action.escalation.came_back.startswith(RESTORED)
    assert second.state.kills[container_id or ""] == KillRecord(1030.0, (ProcessRef(101, 1010),), restored=False)


def test_a_forged_entry_is_not_a_repeat(tmp_path: Path) -> None:
    """An entry an agent never wrote (this boot, the container's ID, 5 s ago) naming its running process as killed:
    refused, and the container's first offence is a plain kill of its GPU process."""
    clock, sampler, ids = FakeClock(), FakeSampler(), FakeIdentifier()
    p = pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "1Gi"}})
    container_id = p.containers[0].container_id or ""
    device = gpu(0, total_bytes=16 * GiB, used_bytes=2 * GiB)
    proc = FakeProc(tmp_path / "proc")
    proc.add(50, 10, container_id)
    proc.add(100, 1000, container_id)
    ids.add(100, p.uid, container_id)
    sampler.next = GpuSample(devices=(device,), processes=(GpuProcess(100, device.uuid, 2 * GiB),))
    memory = _file(tmp_path, proc)
    Path(memory.directory).mkdir()
    Path(memory.path).write_bytes(_doc({container_id: _entry(clock.now() - 5, [50, 10])}))
    with capture_logs() as logs:
        agent = _agent(memory, clock, sampler, ids, FakePodSource([p]))
    assert [(e["event"], e["containers"], e["problems"]) for e in logs] == [
        ("kill_memory_refused", [container_id[:12]], (STILL_RUNNING,))
    ]
    (kill,) = [o for o in agent.scan().outcomes if o.action.kind is ActionKind.KILL]
    assert kill.action.escalation is None
