"""The named checks: one answer from the first stage that fails, every check listed for `?verbose`. The health
writer: the checks written whole every interval, the first at once, removed at the stop, and a directory it cannot
write logged once per run of failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.agent.health import Checks, HealthWriter, unless, write
from vramguard.base import healthfile
from vramguard.base.healthfile import HealthDocument
from vramguard_testbed.fakes import FakeClock


def passes(note: str = "") -> tuple[bool, str]:
    return True, note


def fails(why: str) -> tuple[bool, str]:
    return False, why


@pytest.mark.parametrize(
    ("stages", "answer"),
    [
        pytest.param([[("a", passes)], [("b", passes)]], (True, "ready"), id="all-pass-nothing-noted"),
        pytest.param(
            [[("http", passes)], [("scan-loop", lambda: passes("last scan 0.4s ago"))]],
            (True, "last scan 0.4s ago"),
            id="all-pass-saying-what-they-found",
        ),
        pytest.param(
            [[("nvml", lambda: fails("NVML down")), ("pods", lambda: fails("pods not listed yet"))], [("b", passes)]],
            (False, "NVML down; pods not listed yet"),
            id="a-stages-failing-reasons-joined",
        ),
        pytest.param(
            [[("nvml", lambda: fails("NVML down"))], [("scan", lambda: fails("no scan completed yet"))]],
            (False, "NVML down"),
            id="a-later-stage-is-not-named-while-an-earlier-fails",
        ),
        pytest.param(
            [[("nvml", passes)], [("scan", lambda: fails("no scan completed yet"))]],
            (False, "no scan completed yet"),
            id="the-later-stage-once-the-earlier-pass",
        ),
        pytest.param([[("pods", lambda: fails(""))]], (False, "pods failed"), id="a-failure-without-a-reason-is-named"),
    ],
)
def test_the_answer_speaks_of_the_first_stage_that_fails(
    stages: list[list[tuple[str, object]]], answer: tuple[bool, str]
) -> None:
    """The probes' answer: the failing reasons of the first stage with a failure, joined; all passing, what the
    checks found, or the set's word for it."""
    assert Checks("readyz", stages, passed="ready")() == answer  # type: ignore[arg-type]


def test_the_listing_names_every_check_as_the_kube_apiserver_does() -> None:
    """`?verbose`: each check of every stage on a line, `[+]name ok` (with what it found) or `[-]name failed: why`,
    then whether the set passed."""
    checks = Checks(
        "readyz",
        [[("nvml", passes), ("pods", lambda: fails("pod cache not synced"))], [("scan", lambda: passes("0.1s ago"))]],
    )
    assert checks.listing() == (
        False,
        "[+]nvml ok\n[-]pods failed: pod cache not synced\n[+]scan ok: 0.1s ago\nreadyz check failed",
    )
    assert Checks("healthz", [[("ping", passes)]]).listing() == (True, "[+]ping ok\nhealthz check passed")


def test_checks_registered_by_their_parts_answer_in_stage_and_registration_order() -> None:
    """`add` places a check after its stage's earlier ones, whatever stage was added first; a name is registered
    once; `supply` hands in a part's own checker in the place its name was given, and only for a known name."""
    checks = Checks("readyz", passed="ready")
    checks.add("scan", lambda: fails("no scan completed yet"), stage=1)
    checks.add("nvml", passes)
    checks.add("pods", passes)
    assert checks.names() == ("nvml", "pods", "scan")
    with pytest.raises(ValueError, match="pods"):
        checks.add("pods", passes, stage=1)
    assert checks() == (False, "no scan completed yet")
    checks.supply("scan", lambda: passes("last scan 0.1s ago"))
    assert checks() == (True, "last scan 0.1s ago") and checks.names() == ("nvml", "pods", "scan")
    with pytest.raises(KeyError, match="watch"):
        checks.supply("watch", passes)


@pytest.mark.parametrize(
    ("problem", "answer"),
    [pytest.param(None, (True, ""), id="no-problem-passes"), pytest.param("down", (False, "down"), id="says-why")],
)
def test_a_check_from_a_problem_passes_only_without_one(problem: str | None, answer: tuple[bool, str]) -> None:
    """A part that says what is wrong (None for nothing) is a check that fails saying it."""
    assert unless(lambda: problem)() == answer


def test_the_first_document_is_written_at_start_and_each_round_after(tmp_path: Path) -> None:
    """start() writes the checks' answers at once (the probe may come at once); each round writes them again at
    the clock's time; the stop removes the file (a stopped agent is not live)."""
    clock = FakeClock()
    path = tmp_path / "health"
    answers = iter([(True, "starting"), (True, "last scan 0.1s ago")])
    writer = HealthWriter(str(path), lambda: next(answers), lambda: (False, "no scan completed yet"), clock=clock)
    writer.write_once()
    first = healthfile.decode(path.read_bytes())
    assert first == HealthDocument(clock.now(), os.getpid(), (True, "starting"), (False, "no scan completed yet"))
    clock.step(1.0)
    seen: list[HealthDocument] = []

    def after_one_round() -> None:
        seen.append(healthfile.decode(path.read_bytes()))
        writer.loop.stopping.set()

    clock.on_wait = after_one_round
    writer.loop.run()
    assert [(d.written_at, d.live) for d in seen] == [(clock.now(), (True, "last scan 0.1s ago"))]
    assert clock.waits == [healthfile.WRITE_EVERY_S]
    assert not path.exists(), "removed once the loop ended"


def test_a_directory_that_cannot_be_written_is_logged_once_and_retried(tmp_path: Path) -> None:
    """A missing directory: one health_file_unwritable line for the run of failures, each round retried, and one
    health_file_written line once it can be written."""
    path = tmp_path / "missing" / "health"
    writer = HealthWriter(str(path), lambda: (True, "live"), lambda: (True, "ready"), clock=FakeClock())
    with capture_logs() as logs:
        for _ in range(3):
            writer.write_once()
        path.parent.mkdir()
        writer.write_once()
        writer.write_once()
    assert [e["event"] for e in logs] == ["health_file_unwritable", "health_file_written"]
    assert writer.writes == 2


def test_a_write_replaces_the_file_whole_and_never_follows_a_link(tmp_path: Path) -> None:
    """The document goes to a temporary file of this process, then a rename: a link planted at the final path is
    replaced, not written through, and no temporary file is left."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "health"
    path.symlink_to(victim)
    document = HealthDocument(1.0, 2, (True, "a"), (True, "b"))
    write(str(path), document)
    assert victim.read_text() == "keep" and not path.is_symlink()
    assert healthfile.decode(path.read_bytes()) == document
    assert sorted(p.name for p in tmp_path.iterdir()) == ["health", "victim"]


def test_started_and_stopped_on_a_thread(tmp_path: Path) -> None:
    """The lifecycle: start() writes and starts the thread, stop(deadline) ends it and removes the file."""
    path = tmp_path / "health"
    written = threading.Event()

    def live() -> tuple[bool, str]:
        written.set()
        return True, "live"

    writer = HealthWriter(str(path), live, lambda: (True, "ready"), interval_s=0.01)
    writer.start()
    assert path.exists() and written.wait(5)
    writer.stop(writer.clock.now() + 5)
    assert not writer.loop.running and not path.exists()
