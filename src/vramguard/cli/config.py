"""`vramguard run`'s and `top`'s configuration, checked: what the scanning parts are built from (`ScanSetup`), what
the agent `serve` runs adds (`RunConfig`), the policy the agent starts with, and where this node's kubelet makes pod
cgroups. A configuration the agent cannot run with raises `WiringError` with a message for the user."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from vramguard.agent.reload import digest_of
from vramguard.base.policyfile import read_policy
from vramguard.core.exited import EXITED_HOLD_S
from vramguard.core.policy import Overrides, Policy, PolicyError
from vramguard.core.text import show_value
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, find_namespace, kubelet_root
from vramguard.node.kubelet_pods import DEFAULT_POD_LOGS_DIR
from vramguard.nvml import LOADER_SEARCH, NvmlLocation


class WiringError(Exception):
    """The agent cannot start with this configuration; the message says why, for the user."""


@dataclass(frozen=True)
class ScanSetup:
    """What the scanning parts are built from (`connect`, `open_nvml`, `build_agent`): `vramguard run`'s agent and
    `vramguard top`'s own (dry run) alike."""

    node_name: str | None
    policy: Policy
    dry_run: bool
    proc_root: str
    cgroup_root: str
    pods_file: Path | None
    kubeconfig: str | None
    device_prefix: str = "/dev/nvidia"
    sys_root: str = "/sys"  # the host's /sys, where the DRM GPUs are found (--sys-root)
    fdinfo_root: str | None = None  # where the processes' fd/ and fdinfo/ are read: proc_root unless tests say
    drm_device_prefix: str = "/dev/dri/"  # the DRM nodes a GPU process holds (tests stand a directory in)
    nvml_location: NvmlLocation = LOADER_SEARCH  # where libnvidia-ml.so.1 is (--driver-root, --nvml-library)
    exited_hold_s: float = EXITED_HOLD_S  # exited PIDs holding GPU memory this long make a GPU need a reset
    pod_logs_dir: str = DEFAULT_POD_LOGS_DIR  # the kubelet's, as mounted here: what backs a mirror pod's claim
    kubelet: KubeletTree = HOST_KUBELET  # where this node's kubelet makes pod cgroups (`kubelet_tree`)


@dataclass(frozen=True)
class RunConfig:
    """`vramguard run`'s flags, checked: the scanning parts' (`scan`) and the serving ones'."""

    scan: ScanSetup
    poll_interval_s: float
    metrics_port: int
    health_file: str  # where the kubelet's exec probes read liveness and readiness; "" writes none
    metrics_bind_address: str
    advertise_capacity: bool
    capacity_reserve_bytes: int
    state_dir: str
    status_command_lines: bool = False  # /status shows whole command lines (else the program's name)
    # The policy file, watched for changes (`reload.py`): each goes through the same overrides as `scan.policy` did.
    policy_path: Path | None = None
    overrides: Overrides = field(default_factory=Overrides)
    policy_digest: str | None = None  # the hash of the content `scan.policy` was read from


def kubelet_tree(kubelet_cgroup_root: str, proc_root: str, cgroup_root: str) -> KubeletTree:
    """Where this node's kubelet makes pod cgroups: below its --cgroup-root (`kubelet_cgroup_root`, checked), read
    from wherever this agent's cgroup namespace is rooted (`cgroup.find_namespace`, once). Logged once; a
    hierarchy read through a namespace that could not be placed is a warning: none of its paths is a pod's."""
    log = structlog.get_logger(__name__)
    try:
        root = kubelet_root(kubelet_cgroup_root)
    except ValueError as e:
        raise WiringError(f"--kubelet-cgroup-root: {show_value(kubelet_cgroup_root)} {e}") from None
    try:
        namespace = find_namespace(proc_root, cgroup_root, os.getpid())
    except OSError as e:
        # Without the host's PID 1 the agent sees no host process anyway: nothing to place.
        log.warning("cgroup_namespace_unknown", error=e.strerror or repr(e), proc_root=proc_root)
        namespace = ()
    tree = KubeletTree(root, namespace)
    log.info(
        "kubelet_cgroups",
        kubelet_cgroup_root="/" + "/".join(root),
        cgroup_namespace={hid: None if at is None else "/" + "/".join(at) for hid, at in namespace} or "host",
    )
    for hid, at in namespace:
        if at is None:
            log.warning(
                "cgroup_namespace_unplaced",
                hierarchy=hid,
                cgroup_root=cgroup_root,
                consequence="no process read through it is attributed to a pod",
                fix="mount the host's cgroup filesystem at --cgroup-root, or run the agent in the host's cgroup "
                "namespace",
            )
    return tree


def policy_file(path: Path | None, overrides: Overrides) -> tuple[Policy, str | None]:
    """The policy file's policy (defaults without one) through the flags' `overrides`, as every reload of it goes
    (`reload.PolicyReloader`), and the hash of the content read (None without a file)."""
    if path is None:
        return overrides.apply(Policy()), None
    try:
        policy, text = read_policy(path)
    except PolicyError as e:
        raise WiringError(str(e)) from None
    return overrides.apply(policy), digest_of(text.content)
