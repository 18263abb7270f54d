"""The composition root's own decisions, without starting anything: what /status says of the agent, the policy in
force and the driver, and the policy file's watch counting into the metrics.

Starting the real parts (NVML, cgroups, inotify, the HTTP server) is tested in tests/node (test_e2e.py, test_reload.py,
test_status.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from unit.agent.test_loop import Node
from unit.cli.test_config import config
from vramguard import __version__
from vramguard.agent.metrics import Metrics
from vramguard.agent.reload import RESTART_FIELDS, InForce, ReloadResult, digest_of
from vramguard.cli.config import RunConfig
from vramguard.cli.driver import LIMITS_UNASKED, nvidia_side
from vramguard.cli.serve import Running, Started, StatusFacts, agent_facts, policy_reloader
from vramguard.core.policy import Mode, Policy
from vramguard.http.status import AgentFacts, PolicyFacts
from vramguard_testbed.fakes import FakeClock


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


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_without_a_policy_file_nothing_is_reloaded() -> None:
    """No `--policy`: no watch on a file, and nothing to count."""
    assert policy_reloader(config(), Metrics(), FakeClock()) is None


def test_the_reloader_counts_into_the_metrics_once_a_result_and_sets_the_restart_gauges(tmp_path: Path) -> None:
    """A change's result is counted on vramguard_policy_reloads_total, and each reload sets one gauge a restart
    field: 1 where it waits for a restart, 0 where not; the refusal is exported while it lasts."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: kill\n")
    run = replace(config(), policy_path=path, policy_digest=digest_of(b"mode: kill\n"))
    metrics = Metrics()
    reloader = policy_reloader(run, metrics, FakeClock())
    assert reloader is not None and reloader.in_force == InForce(run.scan.policy, run.policy_digest)
    reloader.count(ReloadResult.INVALID)
    reloader.report_restarts(("driver_limits",))
    assert sample(metrics, "vramguard_policy_reloads_total", result="invalid") == 1.0
    assert sample(metrics, "vramguard_policy_reloads_total", result="applied") == 0.0
    assert {f: sample(metrics, "vramguard_policy_restart_needed", field=f) for f in RESTART_FIELDS} == {
        f: 1.0 if f == "driver_limits" else 0.0 for f in RESTART_FIELDS
    }
    reloader.report_restarts(())
    assert sample(metrics, "vramguard_policy_restart_needed", field="driver_limits") == 0.0
    assert sample(metrics, "vramguard_policy_invalid") == 0.0


def test_status_says_nothing_of_a_running_agent_before_there_is_one() -> None:
    """Before NVML is up and the agent built: no scan, no policy part (the agent's facts hold the start policy), and
    the driver's facts say it is not known yet."""
    facts = StatusFacts(Started(), InForce(Policy(mode=Mode.KILL)))
    assert facts.last_scan() is None and facts.policy() is None
    driver = facts.driver()
    assert driver.limits_possible is None and driver.limits_reason == "not known yet: the agent is starting"
    assert driver.binding_version == nvidia_side(None).binding_version
    assert LIMITS_UNASKED.startswith("not asked")


def test_without_a_policy_file_the_policy_in_force_is_the_one_started_with() -> None:
    """No reloader: the start policy's mode, no digest, nothing refused, nothing waiting and no look taken."""
    n = Node(Policy(mode=Mode.EVICT))
    started = Started()
    facts = StatusFacts(started, InForce(n.agent.policy))
    started.publish(Running(n.agent, nvidia_side(None)))
    assert facts.policy() == PolicyFacts("evict", None, None, (), 0)
    driver = facts.driver()
    assert (driver.limits_possible, driver.limits_reason) == (None, LIMITS_UNASKED), "no limiter: not asked"
