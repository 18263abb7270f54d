"""The freeze journal's file: entries recorded and forgotten, genuine abandoned freezes thawed, and everything else a
writer of the state directory can plant there refused and reported in one line.

A fake cgroup root under tmp_path stands in for /sys/fs/cgroup: directories shaped like the kubelet's, each with a
`cgroup.freeze` (v2) or `freezer.state` (v1) file whose content says whether it was thawed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.node import freezes
from vramguard.node.freezer import Freezer
from vramguard.node.freezes import FreezeJournal, Junk, freeze_journal
from vramguard.node.procfs import FdRetry
from vramguard_testbed.fakes import FakeClock

UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
CID = "ab" * 32
DEAD_PID = (1 << 22) + 1  # above the kernel's highest pid_max: no process ever has it


def fake_root(tmp_path: Path) -> Path:
    """A fake cgroup v2 root (it has cgroup.controllers, as `v2_root` looks for)."""
    root = tmp_path / "cgroup"
    root.mkdir(exist_ok=True)
    (root / "cgroup.controllers").touch()
    return root


def _cgroup(directory: Path, v2: bool = True, frozen: bool = True) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ("cgroup.freeze" if v2 else "freezer.state")).write_text(
        ("1" if frozen else "0") if v2 else ("FROZEN" if frozen else "THAWED")
    )
    return str(directory)


def frozen_container(root: Path, v2: bool = True, cid: str = CID) -> str:
    """A frozen container cgroup where the killer finds one (cgroupfs driver, burstable), in v2 or v1's freezer."""
    base = root if v2 else root / "freezer"
    return _cgroup(base / "kubepods" / "burstable" / f"pod{UID}" / cid, v2)


def freeze_state(cgroup: str, v2: bool = True) -> str:
    return Path(cgroup, "cgroup.freeze" if v2 else "freezer.state").read_text()


def _forge(journal: FreezeJournal, cgroup: str, v2: bool = True, name: str = "forged", pid: int = DEAD_PID) -> Path:
    """An entry as an agent that is gone (or a writer of the state directory) left it."""
    os.makedirs(journal.directory, exist_ok=True)
    path = Path(journal.directory, name)
    path.write_text(json.dumps({"cgroup": cgroup, "v2": v2, "pid": pid, "start_time": 1}))
    return path


def test_record_and_forget(tmp_path: Path) -> None:
    """An entry names the cgroup and this process; forgetting it removes it; forgetting twice is harmless."""
    root = fake_root(tmp_path)
    cgroup = frozen_container(root)
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(root))
    path = journal.record(cgroup, v2=True)
    (entry,) = journal.entries()
    assert (entry.cgroup, entry.v2, entry.pid) == (cgroup, True, os.getpid())
    assert journal.abandoned() == [], "this process is alive: its freezes are its own to thaw"
    journal.forget(path)
    journal.forget(path)
    assert journal.entries() == []


@pytest.mark.parametrize("v2", [pytest.param(True, id="v2"), pytest.param(False, id="v1-freezer")])
def test_a_genuine_abandoned_freeze_is_thawed(tmp_path: Path, v2: bool) -> None:
    """A container cgroup below the root, frozen by an agent that is gone, is thawed and its entry forgotten."""
    root = fake_root(tmp_path)
    cgroup = frozen_container(root, v2)
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(root))
    entry = _forge(journal, cgroup, v2)

    recovery = journal.thaw_abandoned()

    assert [(e.cgroup, outcome) for e, outcome in recovery.outcomes] == [(cgroup, "thawed")]
    assert freeze_state(cgroup, v2) == ("0" if v2 else "THAWED")
    assert not entry.exists()
    assert not recovery.junk


def test_record_refuses_what_the_journal_would_not_honour(tmp_path: Path) -> None:
    """A freeze the next agent could not thaw is never recorded (and so never made): record raises ValueError."""
    root = fake_root(tmp_path)
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(root))
    with pytest.raises(ValueError, match="never frozen"):
        journal.record("/sys/fs/cgroup/system.slice", v2=True)
    assert journal.entries() == []


def _outside(tmp_path: Path) -> str:
    """A frozen cgroup-looking directory next to the root, not below it."""
    return _cgroup(tmp_path / "elsewhere" / "kubepods" / "burstable" / f"pod{UID}" / CID)


def _dot_dot_escape(tmp_path: Path) -> str:
    """Below the root by its prefix, outside by its `..` segments."""
    _outside(tmp_path)
    return f"{fake_root(tmp_path)}/kubepods/../../elsewhere/kubepods/burstable/pod{UID}/{CID}"


def _symlink_escape(tmp_path: Path) -> str:
    """Below the root by its text, outside by a symlink on the way."""
    root = fake_root(tmp_path)
    _outside(tmp_path)
    (root / "kubepods" / "burstable").mkdir(parents=True)
    (root / "kubepods" / "burstable" / f"pod{UID}").symlink_to(
        tmp_path / "elsewhere" / "kubepods" / "burstable" / f"pod{UID}"
    )
    return str(root / "kubepods" / "burstable" / f"pod{UID}" / CID)


@pytest.mark.parametrize(
    ("make", "v2", "kind"),
    [
        pytest.param(lambda t: "/sys/fs/cgroup/system.slice", True, Junk.OUTSIDE, id="host-system-slice"),
        pytest.param(lambda t: "/tmp/x", True, Junk.OUTSIDE, id="tmp"),
        pytest.param(_outside, True, Junk.OUTSIDE, id="container-shaped-beside-the-root"),
        pytest.param(_dot_dot_escape, True, Junk.OUTSIDE, id="dot-dot-escape"),
        pytest.param(_symlink_escape, True, Junk.OUTSIDE, id="symlink-on-the-way-out"),
        pytest.param(lambda t: frozen_container(fake_root(t)) + "/", True, Junk.OUTSIDE, id="trailing-slash"),
        pytest.param(lambda t: frozen_container(fake_root(t)), False, Junk.OUTSIDE, id="v2-cgroup-named-as-v1"),
        pytest.param(lambda t: _cgroup(fake_root(t)), True, Junk.NOT_A_CONTAINER, id="the-root-itself"),
        pytest.param(
            lambda t: _cgroup(fake_root(t) / "kubepods" / "burstable" / f"pod{UID}"),
            True,
            Junk.NOT_A_CONTAINER,
            id="a-pod-cgroup",
        ),
        pytest.param(
            lambda t: _cgroup(Path(frozen_container(fake_root(t))) / "sub"),
            True,
            Junk.NOT_A_CONTAINER,
            id="a-sub-cgroup",
        ),
        pytest.param(
            lambda t: _cgroup(fake_root(t) / "system.slice" / f"kubepods-pod{UID.replace('-', '_')}.slice" / CID),
            True,
            Junk.NOT_A_CONTAINER,
            id="look-alike-under-system-slice",
        ),
        pytest.param(lambda t: _cgroup(fake_root(t) / "kubepods"), True, Junk.NOT_A_CONTAINER, id="kubepods"),
    ],
)
def test_a_forged_entry_is_refused(tmp_path: Path, make: Callable[[Path], str], v2: bool, kind: Junk) -> None:
    """An entry that does not name a container's own cgroup below the root is removed and reported, and the cgroup
    it names stays frozen."""
    target = make(tmp_path)
    root = fake_root(tmp_path)
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(root))
    entry = _forge(journal, target, v2)
    before = freeze_state(target) if os.path.exists(f"{target}/cgroup.freeze") else None

    recovery = journal.thaw_abandoned()

    assert recovery.outcomes == ()
    assert dict(recovery.junk.counts) == {kind.value: 1}
    assert not entry.exists()
    if before is not None:
        assert freeze_state(target) == before == "1", "a refused entry's cgroup is never thawed"


def _junk_dir(directory: Path) -> None:
    (directory / "dir").mkdir()


def _junk_symlink(directory: Path) -> None:
    target = directory.parent / "target"
    target.write_text(json.dumps({"cgroup": "/x", "v2": True, "pid": DEAD_PID, "start_time": 1}))
    (directory / "link").symlink_to(target)


def _junk_big(directory: Path) -> None:
    (directory / "big").write_bytes(b" " * (1 << 20))


@pytest.mark.parametrize(
    ("plant", "kind"),
    [
        pytest.param(_junk_dir, Junk.NOT_A_FILE, id="empty-directory"),
        pytest.param(_junk_symlink, Junk.NOT_A_FILE, id="symlink-to-an-entry"),
        pytest.param(_junk_big, Junk.TOO_BIG, id="oversized"),
    ],
)
def test_what_is_not_a_small_regular_file_is_refused(tmp_path: Path, plant: Callable[[Path], None], kind: Junk) -> None:
    """A directory, a symlink or a big file is never read: the look removes it (a symlink's target stays), and
    reports it. FIFOs and sockets, which could block a reader, are the node tier's
    (tests/node/test_freezes_planted.py)."""
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(fake_root(tmp_path)))
    directory = tmp_path / "freezes"
    directory.mkdir()
    plant(directory)
    entries, junk = journal.scan()
    assert entries == []
    assert dict(junk.counts) == {kind.value: 1}
    assert os.listdir(directory) == []
    if plant is _junk_symlink:
        assert (tmp_path / "target").exists(), "the link is removed, never what it points to"


def test_junk_of_every_kind_is_reported_in_one_line(tmp_path: Path) -> None:
    """Junk of several kinds makes one log line that counts each kind, not one line per entry."""
    root = fake_root(tmp_path)
    directory = tmp_path / "state" / "freezes"
    directory.mkdir(parents=True)
    journal = FreezeJournal(str(directory), cgroup_root=str(root))
    _forge(journal, "/sys/fs/cgroup/system.slice", name="outside")
    _forge(journal, str(root), name="root")
    _junk_symlink(directory)
    (directory / "malformed").write_text("{")

    with capture_logs() as logs:
        assert freeze_journal(str(tmp_path / "state"), str(root)) is not None

    assert [e["event"] for e in logs] == ["freeze_journal_junk"]
    assert logs[0]["by_kind"] == {
        Junk.MALFORMED.value: 1,
        Junk.NOT_A_CONTAINER.value: 1,
        Junk.NOT_A_FILE.value: 1,
        Junk.OUTSIDE.value: 1,
    }
    assert logs[0]["refused"] == 4 and logs[0]["not_examined"] == 0 and len(logs[0]["examples"]) == 3
    assert os.listdir(directory) == []


def test_a_directory_with_something_in_it_is_kept_and_reported(tmp_path: Path) -> None:
    """What cannot be removed safely (someone's non-empty directory) is left there, and counted as kept."""
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(fake_root(tmp_path)))
    (tmp_path / "freezes" / "dir").mkdir(parents=True)
    (tmp_path / "freezes" / "dir" / "file").touch()
    entries, junk = journal.scan()
    assert entries == [] and junk.kept == 1 and dict(junk.counts) == {Junk.NOT_A_FILE.value: 1}
    assert (tmp_path / "freezes" / "dir" / "file").exists()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{", id="cut-short"),
        pytest.param('{"cgroup": "/x"}', id="fields-missing"),
        pytest.param('{"cgroup": "/x", "v2": true, "pid": "many", "start_time": 1}', id="pid-not-a-number"),
        pytest.param('{"cgroup": "/x", "v2": true, "pid": true, "start_time": 1}', id="pid-a-boolean"),
        pytest.param('{"cgroup": "/x", "v2": 1, "pid": 5, "start_time": 1}', id="v2-not-a-boolean"),
        pytest.param('{"cgroup": ["/x"], "v2": true, "pid": 5, "start_time": 1}', id="cgroup-not-a-string"),
        pytest.param("[1, 2]", id="not-an-object"),
        pytest.param(json.dumps({"cgroup": "/" + "x" * 5000, "v2": True, "pid": 1, "start_time": 1}), id="too-long"),
    ],
)
def test_a_malformed_entry_is_dropped(tmp_path: Path, content: str) -> None:
    """What does not read as an entry is removed, never acted on."""
    journal = FreezeJournal(str(tmp_path))
    Path(tmp_path, "junk").write_text(content)
    assert journal.entries() == []
    assert not Path(tmp_path, "junk").exists()


def test_an_unfinished_write_is_removed_unless_its_writer_lives(tmp_path: Path) -> None:
    """A temporary entry of an agent that is gone is removed; one of a live process may be a record under way."""
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(fake_root(tmp_path)))
    stale = _forge(journal, "/x", name=f"{'0' * 20}-{DEAD_PID}.tmp")
    live = _forge(journal, "/x", name=f"{'0' * 20}-{os.getpid()}.tmp")
    entries, junk = journal.scan()
    assert entries == [] and dict(junk.counts) == {Junk.UNFINISHED.value: 1}
    assert not stale.exists() and live.exists()


def test_an_unwritable_journal_says_so(tmp_path: Path) -> None:
    """Where the state directory cannot hold the journal, the agent says so in one line and gets no journal; a
    journal that cannot write its entry raises, and the freezer then leaves the container thawed."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    root = fake_root(tmp_path)
    with capture_logs() as logs:
        assert freeze_journal(str(blocker), str(root)) is None
    assert [(e["event"], e["freezing"]) for e in logs] == [("freeze_journal_unavailable", False)]
    assert logs[0]["directory"] == f"{blocker}/freezes" and logs[0]["error"]
    thawed = _cgroup(root / "kubepods" / "burstable" / f"pod{UID}" / CID, frozen=False)
    journal = FreezeJournal(str(blocker / "freezes"), cgroup_root=str(root))
    with pytest.raises(OSError):
        journal.record(thawed, v2=True)
    with Freezer(journal, self_pid=1).frozen(thawed, True, 1e9, FdRetry(FakeClock(), 0.0)) as froze:
        assert not froze and freeze_state(thawed) == "0", "no record, no freeze"
    assert freeze_state(thawed) == "0"


def _freezes_symlink(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere-journal"
    elsewhere.mkdir()
    (state / "freezes").symlink_to(elsewhere)


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(_freezes_symlink, id="symlink"),
        pytest.param(lambda state, _: (state / "freezes").write_text("{}"), id="file"),
    ],
)
def test_a_journal_directory_that_is_not_one_is_refused(tmp_path: Path, plant: Callable[[Path, Path], object]) -> None:
    """Where `<state dir>/freezes` is a symlink or a file, the agent says so in one line and does not freeze; a
    symlinked journal's entries are never acted on. A FIFO there is the node tier's."""
    root = fake_root(tmp_path)
    cgroup = frozen_container(root)
    state = tmp_path / "state"
    state.mkdir()
    plant(state, tmp_path)
    if (tmp_path / "elsewhere-journal").exists():
        _forge(FreezeJournal(str(tmp_path / "elsewhere-journal")), cgroup)
    with capture_logs() as logs:
        journal = freeze_journal(str(state), str(root))
    assert journal is None
    assert [(e["event"], e["freezing"]) for e in logs] == [("freeze_journal_unavailable", False)]
    assert "not a directory" in str(logs[0]["error"])
    assert freeze_state(cgroup) == "1"


def test_a_journal_stuffed_with_junk_makes_one_log_line_and_bounded_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal stuffed with junk costs one start at most `MAX_EXAMINED` looks and one log line that counts the
    junk by kind, shows a few examples and says how much is left for the next start; a genuine entry is honoured
    once it is reached."""
    bound = 32  # rather than 1,024: the same code, with 65 files written rather than 2,049
    monkeypatch.setattr(freezes, "MAX_EXAMINED", bound)
    root = fake_root(tmp_path)
    cgroup = frozen_container(root)
    directory = tmp_path / "state" / "freezes"
    directory.mkdir(parents=True)
    planted = 2 * bound + 1
    for i in range(planted):  # half cut short, half naming host cgroups
        raw = {"cgroup": f"/sys/fs/cgroup/x{i}", "v2": True, **({"pid": DEAD_PID, "start_time": 1} if i % 2 else {})}
        (directory / f"junk-{i:05}").write_text(json.dumps(raw))

    with capture_logs() as logs:
        journal = freeze_journal(str(tmp_path / "state"), str(root))

    assert journal is not None
    assert [e["event"] for e in logs] == ["freeze_journal_junk"]
    (line,) = logs
    assert line["refused"] == bound == sum(line["by_kind"].values())
    assert set(line["by_kind"]) <= {Junk.MALFORMED.value, Junk.OUTSIDE.value}
    assert line["not_examined"] == planted - bound
    assert 1 <= len(line["examples"]) <= 3 and all(len(x) <= 200 for x in line["examples"])
    assert len(os.listdir(directory)) == planted - bound

    for name in os.listdir(directory):
        os.unlink(directory / name)
    _forge(journal, cgroup)
    with capture_logs() as logs:
        assert freeze_journal(str(tmp_path / "state"), str(root)) is not None
    assert [(e["event"], e["outcome"]) for e in logs] == [("abandoned_freeze", "thawed")]
    assert freeze_state(cgroup) == "0"
