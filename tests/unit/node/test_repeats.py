"""The repeat memory in the state directory: what a restarted agent reads back, and what it refuses to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.agent.act import Enforcer
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.base.worker import Inline
from vramguard.core.model import GiB, GpuProcess, GpuSample, Mode, Policy
from vramguard.node.repeats import MAX_ENTRIES, MAX_FILE_BYTES, KillFile, parse_kills
from vramguard.testing.fakes import (
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


def _doc(kills: object, boot_id: object = BOOT) -> bytes:
    return json.dumps({"boot_id": boot_id, "kills": kills}).encode()


@pytest.mark.parametrize(
    ("data", "kept", "dropped", "problem"),
    [
        pytest.param(_doc({A: 990.0, B: 12}), {A: 990.0, B: 12.0}, 0, None, id="entries-of-this-boot-are-kept"),
        pytest.param(_doc({}), {}, 0, None, id="an-empty-memory"),
        pytest.param(_doc({A: 990.0}, OTHER_BOOT), {}, 0, None, id="another-boot-is-dropped-whole-not-junk"),
        pytest.param(b"\x00\xffjunk", {}, 1, "not JSON", id="not-json"),
        pytest.param(b"[" * 100_000, {}, 1, "not JSON", id="nesting-bomb"),
        pytest.param(b'{"boot_id": "x"}', {}, 1, "not an object with a kills object", id="no-kills"),
        pytest.param(b"[1, 2]", {}, 1, "not an object with a kills object", id="not-an-object"),
        pytest.param(
            _doc({A: 990.0, "../../etc": 1.0, A.upper()[:64]: 1.0, "c" * 63: 1.0}), {A: 990.0}, 3,
            "a key that is not a 64-hex container ID", id="keys-not-of-the-agents-shape",
        ),
        pytest.param(
            _doc({A: "990", B: True}), {}, 2, "a time that is not a number", id="times-that-are-not-numbers",
        ),
        pytest.param(_doc({A: 1e309}), {}, 1, "a time that is not a number", id="infinite-time"),
        pytest.param(_doc({A: NOW + 1, B: -1.0}), {}, 2, "a time outside this boot's past", id="future-or-negative"),
        pytest.param(
            _doc({f"{i:064x}": 1.0 for i in range(MAX_ENTRIES + 5)}), None, 5, f"more than {MAX_ENTRIES} entries",
            id="too-many-entries-are-cut",
        ),
    ],
)  # fmt: skip
def test_parse_kills(data: bytes, kept: dict[str, float] | None, dropped: int, problem: str | None) -> None:
    """Only entries the agent could have written, from this boot, are kept; the rest are counted and named."""
    found = parse_kills(data, BOOT, NOW)
    if kept is not None:
        assert dict(found.kills) == kept
    else:
        assert len(found.kills) == MAX_ENTRIES
    assert found.dropped == dropped
    assert (problem in found.problems) if problem is not None else found.problems == ()


def _file(tmp_path: Path) -> KillFile:
    boot = tmp_path / "boot_id"
    boot.write_text(BOOT + "\n")
    return KillFile(str(tmp_path / "state"), boot_id_path=str(boot))


def test_saved_kills_are_read_back(tmp_path: Path) -> None:
    """What one agent saves, the next one of the same boot loads; no temporary file is left behind."""
    memory = _file(tmp_path)
    memory.save({A: 990.0, B: 995.5})
    assert dict(_file(tmp_path).load(NOW)) == {A: 990.0, B: 995.5}
    assert os.listdir(memory.directory) == ["kills.json"]
    assert os.stat(memory.path).st_mode & 0o777 == 0o600


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        target = path.parent / "elsewhere.json"
        target.write_bytes(_doc({A: 990.0}))
        path.symlink_to(target)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        path.write_bytes(b" " * (MAX_FILE_BYTES + 1))


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        pytest.param("symlink", "Too many levels of symbolic links", id="a-link-is-not-followed"),
        pytest.param("directory", "not a regular file", id="a-directory"),
        pytest.param("huge", f"larger than {MAX_FILE_BYTES} bytes", id="a-huge-file-is-not-read-whole"),
    ],
)
def test_a_hostile_file_is_refused_in_one_line(tmp_path: Path, kind: str, problem: str) -> None:
    """Whatever sits at kills.json, load returns at once with nothing, and says why in one log line. A FIFO, which
    could block a reader, is the node tier's (tests/node/test_node_repeats.py)."""
    memory = _file(tmp_path)
    _plant(Path(memory.path), kind)
    with capture_logs() as logs:
        assert memory.load(NOW) == {}
    assert [(e["event"], e["problems"]) for e in logs] == [("kill_memory_junk", [problem])]


def test_junk_entries_are_reported_in_one_line(tmp_path: Path) -> None:
    """20,000 junk entries: the good one is kept, the rest counted in a single warning."""
    memory = _file(tmp_path)
    Path(memory.directory).mkdir()
    junk = {f"junk-{i}": 1.0 for i in range(20_000)}
    Path(memory.path).write_bytes(_doc({A: 990.0, **junk})[:MAX_FILE_BYTES])  # cut: not JSON any more
    with capture_logs() as logs:
        assert memory.load(NOW) == {}
    assert len(logs) == 1
    Path(memory.path).write_bytes(_doc({A: 990.0, **{f"j{i}": 1.0 for i in range(10_000)}}))
    with capture_logs() as logs:
        assert dict(memory.load(NOW)) == {A: 990.0}
    assert [(e["event"], e["dropped"], e["kept"]) for e in logs] == [("kill_memory_junk", 10_000, 1)]


def test_a_failed_save_is_logged_once_per_run(tmp_path: Path) -> None:
    """A state directory that cannot be written: one warning for the run of failures, not one per kill."""
    (tmp_path / "state").write_text("a file where the directory should be")
    memory = _file(tmp_path)
    with capture_logs() as logs:
        memory.save({A: 990.0})
        memory.save({A: 990.0, B: 991.0})
    assert [e["event"] for e in logs] == ["kill_memory_unsaved"]


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


def test_a_restarted_agent_still_knows_a_repeat(tmp_path: Path) -> None:
    """The agent kills in a container, is restarted, and the new agent escalates that container instance's next
    violation as a repeat (every process of the container)."""
    clock, sampler, ids = FakeClock(), FakeSampler(), FakeIdentifier()
    p = pod("ray-head", "ml", containers={"main": {"vramguard.io/vram": "1Gi"}})
    pods = FakePodSource([p])
    device = gpu(0, total_bytes=16 * GiB, used_bytes=2 * GiB)

    def worker(pid: int) -> None:
        ids.add(pid, p.uid, p.containers[0].container_id)
        sampler.next = GpuSample(devices=(device,), processes=(GpuProcess(pid, device.uuid, 2 * GiB),))

    worker(100)
    first = _agent(_file(tmp_path), clock, sampler, ids, pods)
    (kill,) = [o for o in first.scan().outcomes if o.action.kind is Mode.KILL]
    assert kill.action.escalation is None

    clock.step(30.0)  # the agent restarted; the supervisor respawned its worker
    worker(101)
    second = _agent(_file(tmp_path), clock, sampler, ids, pods)
    (kill,) = [o for o in second.scan().outcomes if o.action.kind is Mode.KILL]
    assert kill.action.escalation is not None
    assert kill.action.escalation.came_back == "GPU processes came back within 30.0 s of the last kill"
