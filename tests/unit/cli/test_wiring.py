"""The composition root's own decisions, without starting anything: the policy it starts with, the stand-ins
for an absent API server, and what /status and `vramguard version` say of the agent and the driver.

Starting the real parts (NVML, cgroups, inotify, the HTTP server) is tested in tests/node/test_wiring.py and
tests/node/test_e2e.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard import __version__
from vramguard.agent.reload import digest_of
from vramguard.cli.wiring import (
    LogEventRecorder,
    NoApiEvictor,
    RunConfig,
    ScanSetup,
    WiringError,
    agent_facts,
    policy_file,
    with_limits,
)
from vramguard.core.model import Mode, NodeRef, Policy
from vramguard.core.policy import Overrides
from vramguard.core.ports import LimitsSupport
from vramguard.http.status import AgentFacts, DriverFacts
from vramguard_testbed.fakes import pod

AGENT_NS = Overrides(agent_namespace="vramguard-system")


def test_without_a_file_the_defaults_go_through_the_flags() -> None:
    """No policy file: the defaults, with the flags over them (the agent's namespace exempt), and no digest."""
    policy, digest = policy_file(None, replace(AGENT_NS, mode=Mode.KILL))
    assert policy == replace(Policy(mode=Mode.KILL), exempt_namespaces=frozenset({"kube-system", "vramguard-system"}))
    assert digest is None


def test_the_file_goes_through_the_flags_as_each_reload_does(tmp_path: Path) -> None:
    """The file's policy with the flags over it, and the hash of the bytes read (what /status and reloads compare)."""
    text = b"mode: evict\nexempt_namespaces: [ops]\n"
    path = tmp_path / "policy.yaml"
    path.write_bytes(text)
    policy, digest = policy_file(path, AGENT_NS)
    assert policy.mode is Mode.EVICT
    assert policy.exempt_namespaces == {"ops", "vramguard-system"}
    assert digest == digest_of(text)


def test_an_invalid_policy_file_stops_the_start_saying_why(tmp_path: Path) -> None:
    """Every problem of the file, by field, in the one error the command prints."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: destroy\nmax_actions_per_scan: 0\n")
    with pytest.raises(WiringError) as raised:
        policy_file(path, Overrides())
    assert "mode" in str(raised.value) and "max_actions_per_scan" in str(raised.value)


def test_without_an_api_server_events_go_to_the_log() -> None:
    """`--pods-file`: an Event is a log line with its pod (or Node), reason and message."""
    with capture_logs() as logs:
        LogEventRecorder().record(pod("trainer", "ml"), "VRAMQuotaExceeded", "over by 2Gi")
        LogEventRecorder().record(NodeRef("node-1"), "VRAMGPUNeedsReset", "GPU 0", warning=False)
    assert [(e["event"], e["pod"], e["reason"], e["message"]) for e in logs] == [
        ("event", "ml/trainer", "VRAMQuotaExceeded", "over by 2Gi"),
        ("event", "node/node-1", "VRAMGPUNeedsReset", "GPU 0"),
    ]


def test_without_an_api_server_every_eviction_fails_visibly() -> None:
    """Not refused (no budget said no) and not gone: failed, saying why."""
    result = NoApiEvictor().evict(pod("trainer", "ml"), "over quota")
    assert (result.evicted, result.refused, result.gone) == (False, False, False)
    assert "no API server" in result.message


FACTS = DriverFacts(binding_version="13.615.71", binds_limits=True, driver_version="615.10")


@pytest.mark.parametrize(
    ("support", "unknown", "possible", "reason"),
    [
        pytest.param(LimitsSupport((0, 1)), "", True, "", id="every-gpu-can"),
        pytest.param(
            LimitsSupport((0,), unavailable="the driver has no nvmlDeviceSetMemoryLimits_v1"),
            "",
            False,
            "the driver has no nvmlDeviceSetMemoryLimits_v1",
            id="the-driver-cannot",
        ),
        pytest.param(
            LimitsSupport((0,), unanswered={0: "GPU 0: timeout"}), "", None, "GPU 0: timeout", id="no-answer-yet"
        ),
        pytest.param(None, "nvmlInit: failed", None, "nvmlInit: failed", id="not-asked-says-why"),
    ],
)
def test_the_driver_facts_say_whether_limits_can_be_held(
    support: LimitsSupport | None, unknown: str, possible: bool | None, reason: str
) -> None:
    """What the driver answered for the cgroup v2 root, or why it was not asked; the rest of the facts kept."""
    facts = with_limits(FACTS, support, unknown)
    assert (facts.limits_possible, facts.limits_reason) == (possible, reason)
    assert replace(facts, limits_possible=None, limits_reason="") == FACTS


def config(poll_interval_s: float = 1.0, **fields: object) -> RunConfig:
    given: dict[str, object] = {
        "node_name": "node-1",
        "policy": Policy(mode=Mode.KILL),
        "dry_run": False,
        "proc_root": "/proc",
        "cgroup_root": "/sys/fs/cgroup",
        "pods_file": None,
        "kubeconfig": None,
    }
    return RunConfig(
        scan=ScanSetup(**{**given, **fields}),  # type: ignore[arg-type]
        poll_interval_s=poll_interval_s,
        metrics_port=9400,
        health_file="",
        metrics_bind_address="0.0.0.0",
        advertise_capacity=False,
        capacity_reserve_bytes=0,
        state_dir="/var/lib/vramguard",
    )


@pytest.mark.parametrize(
    ("run", "facts"),
    [
        pytest.param(config(), AgentFacts(__version__, "node-1", "kill", False, 1.0), id="an-agent"),
        pytest.param(
            config(node_name=None, dry_run=True, policy=Policy(), poll_interval_s=0.5),
            AgentFacts(__version__, "", "warn", True, 0.5),
            id="no-node-name-dry-run",
        ),
    ],
)
def test_status_says_what_the_agent_started_as(run: RunConfig, facts: AgentFacts) -> None:
    """/status's agent part: the version, the node, the mode at start, dry-run and the poll."""
    assert agent_facts(run) == facts
