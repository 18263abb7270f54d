"""The configuration the agent starts with, checked: the policy file through the flags (the same way every reload
goes), and a file the agent cannot run with stopped at the start with a message for the user."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vramguard.agent.reload import digest_of
from vramguard.cli.config import RunConfig, ScanSetup, WiringError, policy_file
from vramguard.core.policy import Mode, Overrides, Policy

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


def test_a_run_configs_optional_parts_are_off_unless_given() -> None:
    """Without a policy file there is nothing to reload (no path, no digest); /status shows program names only."""
    run = config()
    assert (run.policy_path, run.policy_digest, run.status_command_lines) == (None, None, False)
    assert run.scan.device_prefix == "/dev/nvidia"
