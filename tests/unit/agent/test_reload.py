"""The policy file's reload: what is read off the loop, what the loop swaps in, and what waits for a restart."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from policy_fixtures import NOT_POLICY_FILES, Make, swap_in, unblocked, write_atomically
from unit.agent.test_loop import FakeClaimSource, Node
from vramguard.agent.checks import AgentChecks, DriverLimitsCheck
from vramguard.agent.reload import UNREADABLE_AFTER, Built, InForce, PolicyReloader, ReloadResult, digest_of, fit
from vramguard.agent.watch import MemoryWatch, ScanTrigger
from vramguard.base.policyfile import read_policy_file
from vramguard.cli.driver import nvidia_side
from vramguard.cli.serve import Running, Started, StatusFacts
from vramguard.core.policy import ActionKind, DefaultKind, DefaultQuota, DriverLimits, Mode, Overrides, Policy
from vramguard.http.status import PolicyFacts
from vramguard_testbed import configmap
from vramguard_testbed.fakes import FakeClock, pod

GiB = 1024**3
CLAIM = ("claim:gpu.nvidia.com", "resource:vramguard.io/vram")
BUILT_ALL = Built(claims=True, limiter=True, watch=True, dry_run=False)
BUILT_BARE = Built(claims=False, limiter=False, watch=True, dry_run=False)
NO_WATCH = Built(claims=False, limiter=False, watch=False, dry_run=False)
UNWATCHED = "watch_interval: 0s\n"  # as the Node's agent, built without a watch, runs


class ConfigMapVolume:
    """A ConfigMap volume as the kubelet writes it: `policy.yaml` → `..data/policy.yaml`, and each update a new
    `..<timestamp>` directory that a `..data_tmp` link to it, renamed over `..data`, swaps in at once."""

    def __init__(self, root: Path, content: str) -> None:
        self.root = root
        self.versions = 0
        self.update(content)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def update(self, content: str) -> None:
        self.versions += 1
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        stamp = self.root / f"..2026_11_28_09_00_{self.versions:02d}.000000001"
        stamp.mkdir()
        (stamp / "policy.yaml").write_text(content)
        (self.root / "..data_tmp").symlink_to(stamp.name)
        os.rename(self.root / "..data_tmp", self.root / "..data")
        if old is not None:
            shutil.rmtree(self.root / old)


class Reloads:
    """A reloader over a ConfigMap volume, its counts, and its policies taken, checked by hand (`check`) after the
    look its loop takes at start."""

    def __init__(
        self,
        tmp_path: Path,
        content: str = "mode: warn\n",
        overrides: Overrides | None = None,
        policy: Policy | None = None,
    ) -> None:
        """`policy`: the one the agent started with (the defaults where not given)."""
        overrides = overrides if overrides is not None else Overrides()
        self.volume = ConfigMapVolume(tmp_path, content)
        self.counted: list[str] = []
        self.restarts: list[tuple[str, ...]] = []  # the fields waiting for a restart, at each reload
        self.reloader = PolicyReloader(
            self.volume.path,
            overrides.apply,
            digest_of(content.encode()),
            policy=policy if policy is not None else Policy(),
            clock=FakeClock(),
            count=self.counted.append,
            report_restarts=self.restarts.append,
        )
        self.reloader.check()

    def check(self) -> float:
        return self.reloader.check()

    def taken(self) -> Policy | None:
        loaded = self.reloader.take()
        return loaded.policy if loaded is not None else None


def test_a_configmap_swap_is_read_and_handed_over_once(tmp_path: Path) -> None:
    r = Reloads(tmp_path)
    assert r.check() == 2.0 and r.taken() is None, "the content the agent started with changes nothing"
    r.volume.update("mode: kill\ncooldown: 5m\n")
    r.check()
    loaded = r.reloader.take()
    assert loaded is not None and loaded.policy.mode is Mode.KILL and loaded.policy.cooldown_s == 300.0
    assert loaded.digest == digest_of(b"mode: kill\ncooldown: 5m\n")
    assert r.reloader.take() is None, "taken once"
    r.check()
    assert r.taken() is None, "read again, unchanged: nothing new"
    assert r.counted == [] and r.reloader.invalid is None


def test_a_config_map_directory_reloads_when_any_of_its_keys_changes(tmp_path: Path) -> None:
    """Pointed at a policy ConfigMap's directory (as the chart points the agent), a changed cap in its own key is
    a change like one in the document, and a key the policy ConfigMap cannot have is refused."""
    data = {"policy.yaml": "mode: kill\n", "namespaces.ml.max_quota": "8Gi"}
    volume = configmap.ConfigMapVolume(tmp_path, data)
    counted: list[str] = []
    started = digest_of(read_policy_file(tmp_path).text.content)
    reloader = PolicyReloader(
        tmp_path, Overrides().apply, started, policy=Policy(), clock=FakeClock(), count=counted.append
    )
    reloader.check()
    assert reloader.take() is None, "the content the agent started with changes nothing"
    volume.update({**data, "namespaces.ml.max_quota": "4Gi"})
    reloader.check()
    loaded = reloader.take()
    assert loaded is not None and loaded.policy.cap_for("ml") == 4 * GiB
    volume.update({**data, "namespace.ml.max_quota": "2Gi"})
    reloader.check()
    assert reloader.take() is None and counted == ["invalid"]
    assert "namespace.ml.max_quota: is not a key of a policy ConfigMap" in (reloader.invalid or "")


def test_an_edit_in_place_of_the_same_size_is_seen(tmp_path: Path) -> None:
    """Each check reads the file: an edit that keeps its size and lands within one mtime tick is not missed."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: warn\n")
    clock = FakeClock()
    reloader = PolicyReloader(path, Overrides().apply, digest_of(b"mode: warn\n"), policy=Policy(), clock=clock)
    reloader.check()
    before = path.stat()
    path.write_text("mode: kill\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    for _ in range(2):
        clock.step(reloader.check())
    loaded = reloader.take()
    assert loaded is not None and loaded.policy.mode is Mode.KILL


START = "mode: kill\nexempt_namespaces:\n  - kube-system\n  - research\n"
HALF = "mode: kill\nexempt_namespaces:\n  - kube-system\n  - ops\n"  # cut before its last entry, and a policy
REST = "  - research\n"
WHOLE = HALF + REST


def in_place(content: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(content)  # truncated and written: the same inode

    return write


def appended(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with path.open("a") as f:
            f.write(text)

    return write


def renamed(content: str) -> Callable[[Path], None]:
    return lambda path: write_atomically(path, content)


def nothing(path: Path) -> None:
    pass


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [(0.0, in_place(HALF), None), (1.0, appended(REST), None), (2.0, nothing, WHOLE)],
            id="in-place-in-two-steps-applied-whole-an-interval-after-the-last",
        ),
        pytest.param(
            [(0.0, in_place(WHOLE), None), (1.0, nothing, None), (1.0, nothing, WHOLE)],
            id="in-place-settles-on-the-clock-not-on-the-looks",
        ),
        pytest.param([(0.0, renamed(WHOLE), WHOLE)], id="renamed-over-the-path-applied-at-once"),
        pytest.param(
            [(0.0, in_place(HALF), None), (1.0, renamed(WHOLE), WHOLE)],
            id="renamed-over-an-edit-in-place-applied-at-once",
        ),
        pytest.param(
            [(0.0, renamed(HALF), HALF), (2.0, appended(REST), None), (2.0, nothing, WHOLE)],
            id="a-renamed-file-edited-in-place-after-waits",
        ),
        pytest.param(
            [(0.0, in_place(HALF), None), (1.0, in_place(START), None), (2.0, nothing, None)],
            id="in-place-back-to-the-content-in-force-changes-nothing",
        ),
        pytest.param(
            [(0.0, in_place(HALF), None), (2.0, nothing, HALF)],
            id="in-place-stalled-for-an-interval-is-applied-as-no-reader-can-tell",
        ),
    ],
)
def test_a_policy_is_put_in_force_only_when_whole_as_far_as_a_reader_can_tell(
    tmp_path: Path, steps: list[tuple[float, Callable[[Path], None], str | None]]
) -> None:
    """A file changed in place (same inode) is parsed only once it has stayed the same for an interval on the
    clock, so a writer that pauses for less is never caught halfway; a file renamed over the path is whole and in
    force at once. Each step: the clock moves, the file is written, the reloader looks, and hands over that."""
    path = tmp_path / "policy.yaml"
    path.write_text(START)
    clock = FakeClock()
    reloader = PolicyReloader(path, Overrides().apply, digest_of(START.encode()), policy=Policy(), clock=clock)
    reloader.check()  # the loop's look at start
    for seconds, write, handed in steps:
        clock.step(seconds)
        write(path)
        reloader.check()
        loaded = reloader.take()
        assert (loaded.digest if loaded is not None else None) == (digest_of(handed.encode()) if handed else None)


def test_the_flags_override_every_reload_as_they_did_at_start(tmp_path: Path) -> None:
    overrides = Overrides(Mode.EVICT, DriverLimits.OFF, 0.0, "vramguard-system")
    r = Reloads(tmp_path, overrides=overrides)
    r.volume.update("mode: kill\ndriver_limits: require\nwatch_interval: 50ms\nexempt_namespaces: [ops]\n")
    r.check()
    policy = r.taken()
    assert policy is not None
    assert (policy.mode, policy.driver_limits, policy.watch_interval_s) == (Mode.EVICT, DriverLimits.OFF, 0.0)
    assert policy.exempt_namespaces == {"ops", "vramguard-system"}, "the agent's own namespace stays exempt"


def test_an_invalid_policy_is_refused_logged_once_and_counted_once(tmp_path: Path) -> None:
    r = Reloads(tmp_path)
    with capture_logs() as logs:
        r.volume.update("mode: kil\n")
        for _ in range(3):
            r.check()
    assert r.taken() is None, "nothing to swap in: the last good policy stays in force"
    assert r.counted == ["invalid"]
    invalid = [e for e in logs if e["event"] == "policy_invalid"]
    assert len(invalid) == 1, "once per distinct content, not once per check"
    assert invalid[0]["keeping"] == "last good policy"
    assert "mode:" in invalid[0]["errors"][0] and '"kil"' in invalid[0]["errors"][0], "names the field and value"
    assert r.reloader.invalid is not None and "mode:" in r.reloader.invalid

    r.volume.update("mode: kill\nbogus: 1\n")
    r.check()
    assert r.counted == ["invalid", "invalid"], "another bad content is another refusal"
    assert "bogus" in (r.reloader.invalid or "")

    r.volume.update("mode: evict\n")
    r.check()
    assert r.reloader.invalid is None
    policy = r.taken()
    assert policy is not None and policy.mode is Mode.EVICT


def test_a_file_gone_mid_swap_is_read_again_soon_and_reported_only_when_it_stays_gone(tmp_path: Path) -> None:
    r = Reloads(tmp_path)
    target = tmp_path / os.readlink(tmp_path / "..data")
    hidden = tmp_path / "hidden"
    target.rename(hidden)
    with capture_logs() as logs:
        first = r.check()
        assert first < 2.0, "retried sooner than the next check"
        assert r.reloader.invalid is None and r.counted == [], "one failed read is a swap caught mid-way"
        for _ in range(UNREADABLE_AFTER + 2):
            r.check()
    assert r.counted == ["invalid"] and "cannot read the file" in (r.reloader.invalid or "")
    assert [e["event"] for e in logs] == ["policy_unreadable"]
    hidden.rename(target)
    assert r.check() == 2.0
    assert r.reloader.invalid is None and r.taken() is None, "back as it was: nothing to reload"


@pytest.mark.parametrize(("make", "says"), NOT_POLICY_FILES)
def test_what_is_not_a_policy_file_is_refused_once_and_a_good_file_after_it_is_in_force_at_once(
    tmp_path: Path, make: Make, says: str
) -> None:
    """A FIFO, a device, a socket, a directory or a file over 1 MiB at the path is refused without blocking and
    without reading it whole: one log line naming the path and what is there, counted once, shown until a good
    file is swapped in, which the next look (within one interval) hands over."""
    path = tmp_path / "policy.yaml"
    (tmp_path / "good").write_text("mode: warn\n")
    swap_in(path, tmp_path / "good")
    counted: list[str] = []
    reloader = PolicyReloader(
        path, Overrides().apply, digest_of(b"mode: warn\n"), policy=Policy(), clock=FakeClock(), count=counted.append
    )
    make(tmp_path / "bad")
    swap_in(path, tmp_path / "bad")
    with capture_logs() as logs:
        waits = [unblocked(reloader.check) for _ in range(3)]
    assert waits == [2.0] * 3, "looked at again at the interval, for a good file swapped in"
    assert reloader.take() is None, "the last good policy stays in force"
    assert [(e["event"], e["path"]) for e in logs] == [("policy_refused", str(path))]
    assert says in logs[0]["error"] and logs[0]["keeping"] == "last good policy"
    assert counted == ["invalid"] and says in (reloader.invalid or "")

    (tmp_path / "fixed").write_text("mode: kill\n")
    swap_in(path, tmp_path / "fixed")
    unblocked(reloader.check)
    loaded = reloader.take()
    assert loaded is not None and loaded.policy.mode is Mode.KILL
    assert reloader.invalid is None


def test_the_reloader_runs_on_its_background_loop(tmp_path: Path) -> None:
    clock = FakeClock()
    volume = ConfigMapVolume(tmp_path, "mode: warn\n")
    reloader = PolicyReloader(volume.path, Overrides().apply, digest_of(b"mode: warn\n"), policy=Policy(), clock=clock)

    def on_wait() -> None:
        if len(clock.waits) == 2:
            volume.update("mode: evict\n")
        if len(clock.waits) == 4:
            reloader.loop.stopping.set()

    clock.on_wait = on_wait
    reloader.loop.run()
    assert clock.waits[:3] == [2.0, 2.0, 2.0]
    loaded = reloader.take()
    assert loaded is not None and loaded.policy.mode is Mode.EVICT


@pytest.mark.parametrize(
    ("new", "built", "restart", "kept"),
    [
        pytest.param(Policy(mode=Mode.KILL, cooldown_s=5.0), BUILT_ALL, (), {}, id="everything-built-applies-live"),
        pytest.param(Policy(mode=Mode.WARN), BUILT_ALL, (), {}, id="limits-no-longer-wanted-apply-live"),
        pytest.param(
            Policy(quota_sources=CLAIM),
            BUILT_BARE,
            ("quota_sources",),
            {"quota_sources": Policy().quota_sources},
            id="claim-source-added-needs-restart",
        ),
        pytest.param(Policy(mode=Mode.KILL), BUILT_BARE, ("driver_limits",), {}, id="limits-turned-on-need-restart"),
        pytest.param(
            Policy(mode=Mode.KILL, driver_limits=DriverLimits.OFF), BUILT_BARE, (), {}, id="kill-without-limits-live"
        ),
        pytest.param(
            Policy(mode=Mode.KILL),
            Built(claims=False, limiter=False, watch=True, dry_run=True),
            (),
            {},
            id="dry-run-never-limits",
        ),
        pytest.param(
            Policy(watch_interval_s=0.05),
            NO_WATCH,
            ("watch_interval",),
            {"watch_interval_s": 0.0},
            id="watch-turned-on-from-0s-needs-restart",
        ),
        pytest.param(
            Policy(watch_interval_s=0.0),
            BUILT_ALL,
            ("watch_interval",),
            {"watch_interval_s": 0.02},
            id="watch-turned-off-keeps-watching-until-restart",
        ),
        pytest.param(Policy(watch_interval_s=0.1), BUILT_ALL, (), {"watch_interval_s": 0.1}, id="watch-retuned-live"),
    ],
)
def test_fit_applies_what_the_built_parts_allow(
    new: Policy, built: Built, restart: tuple[str, ...], kept: dict[str, object]
) -> None:
    running = Policy(watch_interval_s=0.0) if not built.watch else Policy()
    policy, needed = fit(new, built, running)
    assert needed == restart
    for name, value in kept.items():
        assert getattr(policy, name) == value
    assert policy.mode is new.mode and policy.cooldown_s == new.cooldown_s, "the rest is the new policy"


def reloading(tmp_path: Path, policy: Policy, **node: object) -> tuple[Reloads, Node]:
    """A Node whose agent started with `policy` and registered its policy holders with a reloader over a volume."""
    r = Reloads(tmp_path, policy=policy)
    return r, Node(policy, reloads=r.reloader, **node)  # type: ignore[arg-type]


def test_the_next_scan_enforces_the_reloaded_policy(tmp_path: Path) -> None:
    """Every part that holds policy has the reloaded one from the next scan on; the reload is counted once."""
    r, n = reloading(tmp_path, Policy(mode=Mode.WARN, driver_limits=DriverLimits.OFF))
    n.trainer_over_quota()
    assert [o.action.kind for o in n.agent.scan().outcomes] == [ActionKind.WARN]
    content = "mode: kill\ndriver_limits: 'off'\neviction_timeout: 42s\n" + UNWATCHED
    r.volume.update(content)
    r.check()
    report = n.agent.scan()
    assert [o.action.kind for o in report.outcomes] == [ActionKind.KILL], "killed at the scan after the change"
    assert n.agent.enforcer.policy.eviction_timeout_s == 42.0
    assert r.reloader.in_force.digest == digest_of(content.encode())
    assert r.counted == [ReloadResult.APPLIED] and r.restarts == [()]
    assert r.reloader.in_force.restart_needed == ()


def test_the_parts_that_hold_policy_are_reached_in_the_order_they_registered(tmp_path: Path) -> None:
    """The agent registers its own (the scan's), the limit planner, the Enforcer and the watch; a part registered
    after them (a check) hears the same policy, after them; a name registers once."""
    policy = Policy(mode=Mode.WARN, driver_limits=DriverLimits.OFF)
    r, n = reloading(
        tmp_path, policy, watch=lambda n: MemoryWatch(n.sampler.memory, ScanTrigger(policy), 0.02, n.clock)
    )
    heard: list[tuple[Mode, Mode]] = []
    r.reloader.register("a-check", lambda in_force: heard.append((in_force.policy.mode, n.agent.policy.mode)))
    assert r.reloader.holders() == ("scan", "limit-planner", "enforcer", "memory-watch", "a-check")
    with pytest.raises(ValueError, match="a-check"):
        r.reloader.register("a-check", lambda in_force: None)
    r.volume.update("mode: evict\ndriver_limits: 'off'\nwatch_interval: 40ms\n")
    r.check()
    n.run_gpu()
    n.agent.scan()
    assert heard == [(Mode.EVICT, Mode.EVICT)], "the scan's own policy was in force before the later holder heard"
    assert n.agent.watch is not None and n.agent.watch.interval_s == 0.04
    n.agent.scan()
    assert heard == [(Mode.EVICT, Mode.EVICT)] and r.counted == [ReloadResult.APPLIED], "applied once"


def test_a_reloaded_default_quota_is_resolved_afresh(tmp_path: Path) -> None:
    """The quota book is rebuilt: a pod whose quota comes from the policy's default gets the new one."""
    r, n = reloading(
        tmp_path, Policy(mode=Mode.WARN, default=DefaultQuota(DefaultKind.FIXED, 8 * GiB), watch_interval_s=0.0)
    )
    p = pod("trainer", "ml")
    n.pods.set_pods([p])
    n.ids.add(100, p.uid, p.containers[0].container_id)
    n.run_gpu((100, 5 * GiB))
    before = n.agent.scan().quotas[p.uid]
    r.volume.update("mode: warn\ndefault: {kind: fixed, bytes: 4Gi}\n" + UNWATCHED)
    r.check()
    after = n.agent.scan()
    assert after.quotas[p.uid] != before
    assert [o.action.violation.limit_bytes for o in after.outcomes] == [4 * GiB]


def test_what_needs_a_part_not_built_waits_for_a_restart_and_says_so(tmp_path: Path) -> None:
    """A field whose part was not built at start keeps its running value; the rest is in force; the fields are
    logged, held in force and reported (for the gauges) at each reload."""
    r, n = reloading(tmp_path, Policy(mode=Mode.WARN, watch_interval_s=0.0))
    r.volume.update(f"mode: kill\nquota_sources: [{CLAIM[0]}, {CLAIM[1]}]\nwatch_interval: 50ms\n")
    r.check()
    n.run_gpu()
    with capture_logs() as logs:
        n.agent.scan()
    assert r.reloader.in_force.restart_needed == ("quota_sources", "driver_limits", "watch_interval")
    assert n.agent.policy.mode is Mode.KILL, "the rest is in force"
    assert n.agent.policy.watch_interval_s == 0.0 and n.agent.policy.quota_sources == Policy().quota_sources
    assert r.restarts == [("quota_sources", "driver_limits", "watch_interval")]
    (line,) = [e for e in logs if e["event"] == "policy_reloaded"]
    assert line["restart_needed"] == ["quota_sources", "driver_limits", "watch_interval"]

    r.volume.update("mode: kill\ndriver_limits: 'off'\n" + UNWATCHED)
    r.check()
    n.agent.scan()
    assert not r.reloader.in_force.restart_needed, "all in force"
    assert r.restarts[-1] == ()


def test_a_claim_source_built_at_start_serves_a_reload_that_keeps_it(tmp_path: Path) -> None:
    r, n = reloading(tmp_path, Policy(quota_sources=CLAIM), claims=FakeClaimSource())
    r.volume.update(f"mode: evict\ndriver_limits: 'off'\nquota_sources: [{CLAIM[1]}, {CLAIM[0]}]\n{UNWATCHED}")
    r.check()
    n.run_gpu()
    n.agent.scan()
    assert r.reloader.in_force.restart_needed == () and n.agent.policy.quota_sources == (CLAIM[1], CLAIM[0])


def test_status_shows_the_policy_in_force_and_the_limits_check_reads_require_from_it(tmp_path: Path) -> None:
    """/status's policy part is the policy in force and the reloader's refusal; a reload to `driver_limits:
    require` on an agent without a limiter fails /readyz (the limits check is a registered holder), saying a
    restart applies it."""
    start = Policy(mode=Mode.WARN, watch_interval_s=0.0)
    r, n = reloading(tmp_path, start)
    started = Started()
    facts = StatusFacts(started, InForce(start, r.reloader.in_force.digest), r.reloader)
    checks = AgentChecks(n.pods, clock=n.clock)
    assert facts.policy() is None, "before the agent: its start policy is in the facts"
    started.publish(Running(n.agent, nvidia_side(None)))
    limits = DriverLimitsCheck(None, InForce(start))
    r.reloader.register("driver-limits-check", limits.apply)
    checks.supply(n.agent, 1.0, limits)
    checks.nvml(None)
    r.volume.update("mode: evict\ndriver_limits: require\n" + UNWATCHED)
    r.check()
    n.run_gpu()
    n.agent.scan()
    assert facts.policy() == PolicyFacts("evict", r.reloader.in_force.digest, None, ("driver_limits",), checks=2)
    assert checks.readyz() == (
        False,
        "driver limits required by the reloaded policy: they apply after a restart of the agent",
    )
    r.volume.update("mode: evict\ndriver_limits: [\n")
    r.check()
    policy = facts.policy()
    assert policy is not None and policy.mode == "evict" and policy.invalid is not None and "YAML" in policy.invalid
