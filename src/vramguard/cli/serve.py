"""The composition root of `vramguard run`: the agent's life from start to stop (`serve`).

`main.py` turns flags into a `RunConfig`; `serve` builds the parts from it (`cluster`, `wiring`), registers each
part's named checks (`agent/checks.py`) and each policy holder with the reloader, and never touches a terminal.
Every background part is built idle, started here in dependency order into one `lifecycle.Services` group, and
stopped in reverse within `SHUTDOWN_BUDGET_S`; one `Clock` is handed to every part that reads time."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog

from vramguard import __version__
from vramguard.agent.checks import AgentChecks, DriverLimitsCheck
from vramguard.agent.health import HealthWriter
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.agent.reload import RESTART_FIELDS, InForce, PolicyReloader
from vramguard.agent.report import LastScan
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.heartbeat import Heartbeat
from vramguard.base.lifecycle import Services
from vramguard.cli.cluster import capacity_publisher, connect
from vramguard.cli.config import RunConfig, WiringError
from vramguard.cli.driver import LIMITS_UNASKED, nvidia_side, with_limits
from vramguard.cli.gpus import memory_limiter, open_gpus
from vramguard.cli.signals import SHUTDOWN_BUDGET_S
from vramguard.cli.tuning import raise_open_file_limit
from vramguard.cli.wiring import Serving, build_agent, driver_limiter, watch_cgroups
from vramguard.core.limit_plan import LimitPlanner
from vramguard.http.server import BindError, HealthServer
from vramguard.http.status import AgentFacts, DriverFacts, PolicyFacts, StatusPage
from vramguard.node.api_uids import ApiUids
from vramguard.node.describe import describer
from vramguard.node.freezes import freeze_journal
from vramguard.node.repeats import KillFile


@dataclass(frozen=True, slots=True)
class Running:
    """The parts that exist only once NVML is up: the agent, and the NVIDIA side as NVML told it at its start."""

    agent: Agent
    driver: DriverFacts


class Started:
    """Where `serve` publishes the `Running` parts once NVML is up, made before the parts that read them (/status,
    through `StatusFacts`): one reference, set once on the main thread and read on the others'."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Running | None = None

    def publish(self, running: Running) -> None:
        with self._lock:
            self._running = running

    def running(self) -> Running | None:
        """The running parts, None before NVML is up and the agent built."""
        with self._lock:
            return self._running


class StatusFacts:
    """What /status says of the parts that change while the agent runs, read where each is kept: the last scan (the
    agent's), the policy in force (the reloader's, else the one the agent started with) and the NVIDIA side (what
    the limiter's probe found). Nothing before NVML is up and the agent built (`started`)."""

    def __init__(self, started: Started, start: InForce, reloader: PolicyReloader | None = None) -> None:
        self.started = started
        self.start = start  # the policy in force for the agent's life where there is no file to reload
        self.reloader = reloader

    def last_scan(self) -> LastScan | None:
        """The agent's last completed scan, None before it has one."""
        running = self.started.running()
        return running.agent.last_scan if running is not None else None

    def policy(self) -> PolicyFacts | None:
        """The policy in force, None before the agent is built (its start policy is in the agent's facts)."""
        if self.started.running() is None:
            return None
        if self.reloader is None:
            return PolicyFacts(self.start.policy.mode.value, self.start.digest, None, (), 0)
        in_force, (invalid, checks) = self.reloader.in_force, self.reloader.looked
        return PolicyFacts(in_force.policy.mode.value, in_force.digest, invalid, in_force.restart_needed, checks)

    def driver(self) -> DriverFacts:
        """The NVIDIA side, from what the agent found out (it asks NVML nothing for this): whether the driver can
        hold limits is what the limiter's probe found, where the agent uses them."""
        running = self.started.running()
        if running is None:
            return with_limits(nvidia_side(None), None, "not known yet: the agent is starting")
        if running.agent.limiter is None:
            return with_limits(running.driver, None, LIMITS_UNASKED)
        return with_limits(running.driver, running.agent.limiter.support(), "not known yet: asked at the first scan")


def policy_reloader(config: RunConfig, metrics: Metrics, clock: Clock) -> PolicyReloader | None:
    """The watch on the policy file (not started), None without one: a change is in force from the next scan. It
    counts what each change came to and says which fields wait for a restart, in the metrics."""
    if config.policy_path is None or config.policy_digest is None:
        return None

    def report_restarts(fields: tuple[str, ...]) -> None:
        for field_name in RESTART_FIELDS:
            metrics.policy_restart_needed.labels(field=field_name).set(1 if field_name in fields else 0)

    reloader = PolicyReloader(
        config.policy_path,
        config.overrides.apply,
        config.policy_digest,
        policy=config.scan.policy,
        clock=clock,
        count=lambda result: metrics.policy_reloads.labels(result=result.value).inc(),
        report_restarts=report_restarts,
    )
    metrics.policy_invalid.set_function(lambda: reloader.invalid is not None)
    return reloader


def agent_facts(config: RunConfig) -> AgentFacts:
    """What /status says of the agent itself."""
    return AgentFacts(
        version=__version__,
        node=config.scan.node_name or "",
        mode=config.scan.policy.mode.value,
        dry_run=config.scan.dry_run,
        poll_interval_s=config.poll_interval_s,
    )


def serve(config: RunConfig, stop: threading.Event, clock: Clock = SYSTEM_CLOCK) -> None:
    """Run the agent until `stop`: start the cluster's parts and the probes and metrics, wait for NVML, start the
    enforcement parts, scan; then stop everything in reverse within `SHUTDOWN_BUDGET_S`."""
    log = structlog.get_logger(__name__)
    setup = config.scan
    if config.advertise_capacity and setup.pods_file is not None:
        raise WiringError("--advertise-capacity needs the API server, not --pods-file")
    open_files = raise_open_file_limit()
    journal = None if setup.dry_run else freeze_journal(config.state_dir, setup.cgroup_root, setup.kubelet)
    metrics = Metrics()
    # What earlier agents on this node saw the API server give its pods: a restarted agent still reclaims those.
    cluster = connect(setup, metrics, clock, ApiUids(None if setup.dry_run else config.state_dir))
    capacity = capacity_publisher(
        cluster, setup.node_name, config.capacity_reserve_bytes, config.advertise_capacity, setup.dry_run, clock
    )
    http_rounds = Heartbeat()
    reloader = policy_reloader(config, metrics, clock)
    started = Started()  # the agent and the driver's facts, once NVML is up
    start = InForce(setup.policy, config.policy_digest)  # the policy in force until a reload
    facts = StatusFacts(started, start, reloader)
    # Every check named from the start; the parts built once NVML is up supply theirs then.
    checks = AgentChecks(cluster.pods, clock=clock, http=http_rounds)
    # /status says whose each process is, as `vramguard top` does; its program's name unless told otherwise.
    describe = describer(setup.proc_root, config.status_command_lines)
    status = StatusPage(
        agent_facts(config),
        facts.last_scan,
        clock,
        describe=describe,
        driver=facts.driver,
        policy=facts.policy,
    )
    server = HealthServer(
        config.metrics_port,
        metrics.registry,
        checks.healthz,
        checks.readyz,
        host=config.metrics_bind_address,
        status=status.body,
        progress=http_rounds,
        clock=clock,
    )
    services = Services(clock)
    try:
        cluster.start(services)
        if capacity is not None:
            services.start("capacity", capacity)
        services.start("status", status)
        try:
            services.start("http", server)
        except BindError as e:
            where = f"{config.metrics_bind_address or '*'}:{e.port}"
            raise WiringError(f"cannot serve /metrics on {where}: {e.strerror or e}") from None
        if config.health_file:
            services.start("health", HealthWriter(config.health_file, checks.healthz, checks.readyz, clock=clock))
        log.info(
            "starting",
            version=__version__,
            node=setup.node_name,
            mode=setup.policy.mode.value,
            dry_run=setup.dry_run,
            address=f"{config.metrics_bind_address or '*'}:{server.port}",
            health_file=config.health_file or None,
            open_file_limit=open_files[1],
        )
        gpus = open_gpus(setup, services, stop, clock, checks.nvml)
        if gpus is None:
            return
        # What the quotas call for in driver limits, for the scan and for the limiter's new cgroups alike.
        planner = LimitPlanner(cluster.pods, cluster.claims, setup.policy, dry_run=setup.dry_run)
        limiter = driver_limiter(
            planner,
            setup.policy,
            setup.dry_run,
            setup.cgroup_root,
            lambda: memory_limiter(gpus, setup.cgroup_root, services),
            clock,
            setup.kubelet,
        )
        serving = Serving(
            planner,
            limiter,
            capacity if config.advertise_capacity else None,
            journal,
            # Repeats survive a restart; what was killed is checked against the node's processes when read.
            None if setup.dry_run else KillFile(config.state_dir, proc_root=setup.proc_root, kubelet=setup.kubelet),
            reloader,
        )
        # The agent registers the parts that hold policy in it with the reloader as it is built; so does the check
        # that reads the policy in force.
        agent = build_agent(setup, gpus, cluster, metrics, clock, serving)
        limits = DriverLimitsCheck(limiter, start)
        if reloader is not None:
            reloader.register("driver-limits-check", limits.apply)
        services.start("evictions", agent.enforcer)
        if agent.orphan_reads is not None:
            services.start("orphan-reads", agent.orphan_reads)
        if agent.watch is not None:
            services.start("watch", agent.watch)
        if limiter is not None:
            services.start("driver-limits", limiter)
            watch_cgroups(limiter, setup.cgroup_root, services, clock, setup.kubelet)  # after the limiter it feeds
        if reloader is not None:
            services.start("policy-reload", reloader)  # what it reads is taken at the start of each scan
        checks.supply(agent, config.poll_interval_s, limits)  # the parts' own checkers, from the first scan on
        started.publish(Running(agent, nvidia_side(gpus.nvml)))
        agent.run(config.poll_interval_s, stop)
    finally:
        services.stop(SHUTDOWN_BUDGET_S)
        log.info("stopped")
