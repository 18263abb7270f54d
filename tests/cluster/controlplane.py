"""A real Kubernetes control plane for tests: etcd and kube-apiserver on loopback with throwaway certificates,
started envtest-style, plus kube-scheduler and kube-controller-manager on demand.

The binaries come from ``scripts/controlplane.sh``, which builds them from ``hack/k8s/<version>/go.mod`` into a cache
outside the repo (``find_binaries()`` reads the same path) and installs Debian's ``etcd-server``.

    plane = ControlPlane(find_binaries()).start()
    core = kubernetes.client.CoreV1Api(plane.api_client())          # admin: system:masters
    plane.add_node("gpu-1", labels={"nvidia.com/gpu.present": "true"})
    agent_kubeconfig = plane.service_account_kubeconfig("vramguard", "vramguard")   # RBAC applies to it
    plane.start_controller_manager()                                 # PodDisruptionBudget status for evictions
    plane.restart_apiserver()                                        # same port and certificates; etcd keeps data
    plane.stop()

With ``ControlPlane(..., audit_log=True)`` the apiserver writes an audit log of every request (`audit_events()`
reads it, one `AuditEvent` per request); `apiserver_metrics()` and `etcd_metrics()` return their /metrics, and
`pid(name)` the process of a component (for its CPU time in /proc/<pid>/stat).

What is real: authentication (an admin client certificate from our own CA; ServiceAccount tokens from the
TokenRequest API, signed with our RSA key), authorization (``Node,RBAC``), admission (the default plugins except
``ServiceAccount``, which would demand a ``default`` ServiceAccount that only kube-controller-manager creates),
storage (etcd, kept across apiserver restarts). What is missing: kubelets. Tests create Node objects themselves
(`add_node`), and nothing marks them NotReady later because no node-lifecycle controller runs.

Processes: each component is started through a small exec shim that sets ``PR_SET_PDEATHSIG=SIGKILL``, so a
test session that crashes or is killed takes its control plane with it (the kernel sends the signal when the
*thread* that started the component exits: start it from the main thread or one that outlives it). Each runs in
its own session, so a Ctrl-C in the terminal reaches pytest, which stops them in order. `stop()` also runs at
interpreter exit. Every component logs to ``<workdir>/logs/<name>.log``; a start failure raises
`ControlPlaneError` with the last lines of that log.

Certificates are made with the ``openssl`` command (the ``cryptography`` package is not a dependency).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client, config

from vramguard_testbed.waiting import WaitTimeout, wait_until

# Must match hack/k8s/<minor>/go.mod (a test checks it): the build script keys the cache by that version. The
# integration tests run on both: the newest release, and the oldest the README claims (the own-node admission
# policy needs 1.32's node name in ServiceAccount tokens; 1.33 is the oldest built).
NEWEST = "v1.37.2"
OLDEST = "v1.33.13"
KUBERNETES_VERSIONS = (NEWEST, OLDEST)
KUBERNETES_VERSION = NEWEST


def serves_dra(version: str) -> bool:
    """Whether an API server of `version` serves resource.k8s.io/v1 (DRA is GA from 1.34)."""
    major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    return (major, minor) >= (1, 34)


BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
NODE_BINARIES = ("kubelet", "kubectl")  # the test node's; built by the same script from the same go.mod
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

_MERGE_PATCH = "application/merge-patch+json"
# Every request at level Metadata (who, what, when, the answer's code; no bodies). RequestReceived is left out: each
# request then logs ResponseComplete, and a long-running one (a WATCH) ResponseStarted too, when its response
# begins.
_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""
# The user extra the apiserver puts in a token bound to a pod: the pod's node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
_WORKDIR_PREFIX = "vramguard-controlplane-"
_OWNER_FILE = "owner.pid"
_LOG_TAIL_LINES = 40
_POLL_S = 0.1

# Runs in the child between fork and the component's exec: asks the kernel to SIGKILL it when its parent dies,
# then checks the parent did not die before that took effect. Python's preexec_fn would do the same without a
# second interpreter, but it is documented as unsafe when the test process runs threads.
_PDEATHSIG_SHIM = """\
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
if os.getppid() != int(sys.argv[1]):
    sys.exit("controlplane: the test process exited before its component started")
os.execv(sys.argv[2], sys.argv[2:])
"""

# One CA signs the apiserver's serving certificate and the admin client certificate, so one file serves as
# both --client-ca-file and the clients' certificate-authority. authorityKeyIdentifier on the leaves keeps strict
# X.509 verifiers (Python 3.13's default context) content.
_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = vramguard-test
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""


class ControlPlaneError(RuntimeError):
    """A component failed to start or to answer; the message carries the end of its log."""


def cache_dir() -> Path:
    """``$VRAMGUARD_CACHE``, or ``~/.cache/vramguard``: the same rule as scripts/controlplane.sh."""
    return Path(os.environ.get("VRAMGUARD_CACHE") or Path.home() / ".cache" / "vramguard")


def binaries_dir(version: str = KUBERNETES_VERSION) -> Path:
    """Where scripts/controlplane.sh puts the binaries of `version`."""
    return cache_dir() / "k8s" / version


def find_binaries(version: str = KUBERNETES_VERSION) -> Path | None:
    """The directory holding all of kube-apiserver, kube-scheduler and kube-controller-manager, or None."""
    directory = binaries_dir(version)
    if all(os.access(directory / name, os.X_OK) for name in BINARIES):
        return directory
    return None


def find_etcd() -> Path | None:
    found = shutil.which("etcd")
    return Path(found) if found else None


def unavailable_reason(version: str = KUBERNETES_VERSION) -> str | None:
    """Why a control plane cannot start here (missing binaries or tools, and how to get them), or None."""
    problems = []
    directory = binaries_dir(version)
    missing = [name for name in BINARIES if not os.access(directory / name, os.X_OK)]
    if missing:
        problems.append(f"{', '.join(missing)} not built in {directory}")
    if find_etcd() is None:
        problems.append("etcd not on PATH")
    if shutil.which("openssl") is None:
        problems.append("openssl not on PATH")
    if not problems:
        return None
    return "; ".join(problems) + " (run scripts/controlplane.sh)"


@dataclass(eq=False)
class Component:
    """One running control-plane process and its log."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64 * 1024))
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        if self.running():
            raise ControlPlaneError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"==== {datetime.now(timezone.utc).isoformat()} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self, timeout_s: float = 15.0, *, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with `kill`, or once `timeout_s` passed), then reap. A no-op when not running."""
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        popen.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def failure(self, what: str) -> ControlPlaneError:
        exited = self.popen is not None and self.popen.poll() is not None
        state = f" (exit status {self.popen.returncode})" if exited and self.popen is not None else ""
        return ControlPlaneError(f"{self.name} {what}{state}; last lines of {self.log_path}:\n{self.log_tail()}")

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll `ready` until it holds (`waiting.wait_until`); fail at once if the process exits, or after
        `timeout_s`, with the last lines of its log."""

        def ready_while_running() -> bool:
            if not self.running():
                raise self.failure(f"exited while waiting for {what}")
            return ready()

        try:
            wait_until(ready_while_running, timeout_s, what=f"{self.name} {what}", interval_s=_POLL_S)
        except WaitTimeout:
            raise self.failure(f"not {what} after {timeout_s:.0f}s") from None


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(avoid: Sequence[int] = ()) -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range.

    Below it, no outgoing connection can take the port as its local port while the apiserver is down between a
    stop and a restart on the same port.
    """
    high = min(_ephemeral_low(), 65536)
    low = 10000 if high > 12000 else 1024
    for _ in range(200):
        port = low + secrets.randbelow(high - low)
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ControlPlaneError(f"no free port on 127.0.0.1 in [{low}, {high})")


def _http_ok(url: str, context: ssl.SSLContext | None = None, *, body: bytes | None = None) -> bool:
    # No proxies: an http(s)_proxy in the environment must not capture loopback requests.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=2) as response:
            payload: bytes = response.read()
            return response.status == 200 and (body is None or body in payload)
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return False


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One request as the apiserver's audit log records it (level Metadata).

    `at_s` is when the apiserver received the request (requestReceivedTimestamp, seconds since the epoch);
    `verb` is the audit log's: get, list, watch, create, patch, update, delete (a LIST with ``watch=true`` is a
    watch); `node_name` is the node recorded in a pod-bound ServiceAccount token (empty for other users);
    `code` is the response's status code, None where the log has none; `completed_s` is when the response ended
    (stageTimestamp of ResponseComplete), None for a WATCH still open when the log was read, or cut by the
    apiserver's death (a SIGKILL logs no ResponseComplete).
    """

    audit_id: str
    at_s: float
    stage: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    request_uri: str
    user_agent: str
    username: str
    node_name: str
    code: int | None
    completed_s: float | None


def _timestamp_s(text: str) -> float:
    # RFC 3339 with microseconds and a "Z", which datetime.fromisoformat reads only from Python 3.11.
    return datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def read_audit_log(path: Path) -> list[AuditEvent]:
    """Each request in the JSON audit log at `path` once, in the order logged.

    A long-running request (a WATCH) logs ResponseStarted when its response begins and ResponseComplete when it
    ends (if it ended), both under one auditID; it is kept once, as first logged, so a watch counts when it
    starts, with the time it ended as `completed_s`. A request refused before its response began logs
    ResponseComplete only. Lines cut short (the apiserver writing as this reads) are skipped.
    """
    events: dict[str, AuditEvent] = {}
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        audit_id = entry.get("auditID", "")
        complete = entry.get("stage") == "ResponseComplete"
        completed_s = _timestamp_s(entry["stageTimestamp"]) if complete else None
        known = events.get(audit_id)
        if known is not None:
            if completed_s is not None:
                events[audit_id] = dataclasses.replace(known, completed_s=completed_s)
            continue
        ref = entry.get("objectRef") or {}
        user = entry.get("user") or {}
        node_names = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or [""]
        code = (entry.get("responseStatus") or {}).get("code")
        events[audit_id] = AuditEvent(
            audit_id=audit_id,
            at_s=_timestamp_s(entry["requestReceivedTimestamp"]),
            stage=entry.get("stage", ""),
            verb=entry.get("verb", ""),
            resource=ref.get("resource", ""),
            subresource=ref.get("subresource", ""),
            namespace=ref.get("namespace", ""),
            name=ref.get("name", ""),
            request_uri=entry.get("requestURI", ""),
            user_agent=entry.get("userAgent", ""),
            username=user.get("username", ""),
            node_name=node_names[0],
            code=int(code) if code is not None else None,
            completed_s=completed_s,
        )
    return list(events.values())


# ECDSA P-256 for the TLS keys: generated in milliseconds, where RSA takes a noticeable share of start-up on a
# busy 2-core machine. The ServiceAccount signing key stays RSA (RS256), the common choice for clusters.
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


class _Pki:
    """The CA, serving, admin-client and ServiceAccount-signing keys of one control plane, made with openssl."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca_cert = directory / "ca.crt"
        self.ca_key = directory / "ca.key"
        self.serving_cert = directory / "apiserver.crt"
        self.serving_key = directory / "apiserver.key"
        self.admin_cert = directory / "admin.crt"
        self.admin_key = directory / "admin.key"
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"

    def issue_client(self, name: str, subject: str) -> tuple[Path, Path]:
        """A client certificate and key for `subject` (``/O=<group>/CN=<user>``), signed by the CA."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        if not cert.exists():
            self._leaf("client", subject, cert, key, self.directory / "openssl.cnf")
        return cert, key

    def create(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "openssl.cnf"
        config.write_text(_OPENSSL_CONFIG)
        self._openssl(
            "req", "-x509", "-config", config, "-extensions", "ca", *_EC_KEY, "-nodes",
            "-keyout", self.ca_key, "-out", self.ca_cert, "-days", "3650", "-subj", "/CN=vramguard-test-ca",
        )  # fmt: skip
        self._leaf("server", "/CN=kube-apiserver", self.serving_cert, self.serving_key, config)
        # O=system:masters: the group the apiserver authorizes for everything, without RBAC bindings.
        self._leaf("client", "/O=system:masters/CN=vramguard-test-admin", self.admin_cert, self.admin_key, config)
        self._openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", self.sa_key)
        self._openssl("pkey", "-in", self.sa_key, "-pubout", "-out", self.sa_pub)

    def _leaf(self, extensions: str, subject: str, cert: Path, key: Path, config: Path) -> None:
        request = cert.with_suffix(".csr")
        self._openssl(
            "req", "-new", "-config", config, *_EC_KEY, "-nodes", "-keyout", key, "-out", request,
            "-subj", subject,
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", request, "-CA", self.ca_cert, "-CAkey", self.ca_key,
            "-set_serial", str(secrets.randbits(63)), "-days", "3650", "-extfile", config, "-extensions", extensions,
            "-out", cert,
        )  # fmt: skip
        request.unlink()

    @staticmethod
    def _openssl(*args: str | Path) -> None:
        argv = ["openssl", *map(str, args)]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ControlPlaneError(f"{' '.join(argv)} failed:\n{result.stderr.strip()}")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user_name: str, user: Mapping[str, str]) -> Path:
    """A self-contained kubeconfig (certificates inlined) for one user of the cluster at `server`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "vramguard-test", "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)}}
        ],
        "users": [{"name": user_name, "user": dict(user)}],
        "contexts": [{"name": user_name, "context": {"cluster": "vramguard-test", "user": user_name}}],
        "current-context": user_name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass(eq=False)
class ControlPlane:
    """etcd + kube-apiserver for one test session; scheduler and controller-manager on demand.

    `binaries_dir` holds kube-apiserver, kube-scheduler and kube-controller-manager (`find_binaries()`);
    `etcd` defaults to the one on PATH; `workdir` (certificates, etcd data, kubeconfigs, logs) defaults to a
    fresh temporary directory, removed by `stop()` unless `keep_workdir`. `apiserver_args` are appended to the
    apiserver's flags (a later flag wins). With `audit_log`, the apiserver logs every request at level Metadata
    to `audit_log_path` (JSON lines, never rotated), read by `audit_events()`.

    With `kubelets`, real kubelets can join (tests/cluster/node.py): the ServiceAccount admission plugin is on
    (pods get their token volume; kube-controller-manager's serviceaccount controller must then make each
    namespace's ``default`` ServiceAccount), and the apiserver reaches kubelets at their InternalIP with the
    admin client certificate, for ``kubectl exec`` and ``logs``.
    """

    binaries_dir: Path
    etcd: Path | None = None
    workdir: Path | None = None
    keep_workdir: bool = False
    start_timeout_s: float = 90.0
    apiserver_args: Sequence[str] = ()
    kubelets: bool = False
    audit_log: bool = False
    components: dict[str, Component] = field(default_factory=dict, init=False)
    _owns_workdir: bool = field(default=False, init=False)
    _apiserver_port: int = field(default=0, init=False)
    _etcd_url: str = field(default="", init=False)
    _pki: _Pki | None = field(default=None, init=False)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start etcd and the apiserver and wait until the apiserver is ready. Returns self."""
        if self.components:
            raise ControlPlaneError("this control plane was already started")
        if self.workdir is None:
            _remove_abandoned_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
            (self.workdir / _OWNER_FILE).write_text(_process_identity(os.getpid()) or "")
            self._owns_workdir = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        workdir = self._dir
        etcd = self.etcd or find_etcd()
        if etcd is None:
            raise ControlPlaneError("etcd is not on PATH (scripts/controlplane.sh installs Debian's etcd-server)")
        for name in BINARIES:
            if not os.access(self.binaries_dir / name, os.X_OK):
                raise ControlPlaneError(f"{self.binaries_dir / name} is missing (run scripts/controlplane.sh)")
        self._pki = _Pki(workdir / "pki")
        self._pki.create()

        client_port = free_port()
        peer_port = free_port(avoid=[client_port])
        self._apiserver_port = free_port(avoid=[client_port, peer_port])
        etcd_url = self._etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        # etcd 3.4 has no --unsafe-no-fsync (added in 3.5); its fsyncs cost little at test write rates.
        etcd_component = self._component(
            "etcd",
            [
                str(etcd),
                "--name=vramguard-test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=vramguard-test={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
            ],
        )
        etcd_component.start()
        etcd_component.wait_until(
            lambda: _http_ok(f"{etcd_url}/health", body=b'"true"'), self.start_timeout_s, "healthy"
        )

        pki = self._pki
        self._component(
            "kube-apiserver",
            [
                str(self.binaries_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self._apiserver_port}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                *self._admission_and_kubelet_args(pki),
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # No Endpoints for the kubernetes Service: nothing in the tests routes through it.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                *self._audit_args(),
                *self.apiserver_args,
            ],
        )
        self.start_apiserver()

    def _audit_args(self) -> list[str]:
        if not self.audit_log:
            return []
        policy = self._dir / "audit-policy.yaml"
        policy.write_text(_AUDIT_POLICY)
        self.audit_log_path.parent.mkdir(parents=True, exist_ok=True)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # each event written before the response: a read after it sees it
            "--audit-log-maxsize=0",  # never rotated: one file holds the whole run
        ]

    def _admission_and_kubelet_args(self, pki: _Pki) -> list[str]:
        if not self.kubelets:
            # Without it every pod would need a "default" ServiceAccount, which only kube-controller-manager
            # creates.
            return ["--disable-admission-plugins=ServiceAccount"]
        return [
            # Else exec and logs look the node's name up in DNS.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.admin_cert}",
            f"--kubelet-client-key={pki.admin_key}",
        ]

    def stop(self) -> None:
        """Stop every component (the last started first) and remove the workdir unless kept. Idempotent."""
        atexit.unregister(self.stop)
        # SIGKILL: the data goes with the workdir, and kube-apiserver's graceful stop takes ~10 s with a kubelet's
        # and controllers' watches open (restart tests stop it gracefully on their own).
        for component in reversed(list(self.components.values())):
            component.stop(kill=True)
        if self._owns_workdir and not self.keep_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop_apiserver(self, *, kill: bool = False) -> None:
        """Stop the apiserver (SIGKILL with `kill`, as in a crash); etcd and the other components keep running."""
        self.components["kube-apiserver"].stop(kill=kill)

    def start_apiserver(self) -> None:
        """Start the apiserver (again) on the same port with the same certificates, and wait until it is ready."""
        apiserver = self.components["kube-apiserver"]
        apiserver.start()
        context = self._admin_ssl_context()
        apiserver.wait_until(lambda: _http_ok(f"{self.host}/readyz", context), self.start_timeout_s, "ready")
        # /readyz does not wait for the system namespaces; tests use "default" at once.
        apiserver.wait_until(
            lambda: _http_ok(f"{self.host}/api/v1/namespaces/default", context), self.start_timeout_s, "serving"
        )

    @contextlib.contextmanager
    def frozen_apiserver(self) -> Iterator[None]:
        """The apiserver stopped with SIGSTOP for the duration: the kernel still accepts its connections, and
        nothing answers them (a hung server, not a dead one). SIGCONT at the end, whatever happens inside."""
        popen = self.components["kube-apiserver"].popen
        if popen is None:
            raise ControlPlaneError("kube-apiserver is not running")
        popen.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            popen.send_signal(signal.SIGCONT)

    def restart_apiserver(self, *, kill: bool = False) -> None:
        """Stop and start the apiserver: same port, certificates and data. Clients reconnect on their own."""
        self.stop_apiserver(kill=kill)
        self.start_apiserver()

    def start_scheduler(self, kubeconfig: Path | None = None) -> Component:
        """Start kube-scheduler (no leader election) against the apiserver and wait until it is healthy."""
        return self._start_controller("kube-scheduler", kubeconfig, ["--leader-elect=false"])

    def start_controller_manager(
        self, kubeconfig: Path | None = None, controllers: str = "disruption-controller"
    ) -> Component:
        """Start kube-controller-manager running only `controllers` (comma-separated; default: the disruption
        controller, which computes PodDisruptionBudget status so evictions are judged against it)."""
        return self._start_controller(
            "kube-controller-manager",
            kubeconfig,
            [
                f"--controllers={controllers}",
                "--leader-elect=false",
                # One client for all controllers: no per-controller ServiceAccounts to create.
                "--use-service-account-credentials=false",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # The CA that root-ca-certificate-publisher puts in every namespace's kube-root-ca.crt, which pods'
                # token volumes mount.
                f"--root-ca-file={self._keys.ca_cert}",
            ],
        )

    def _start_controller(self, name: str, kubeconfig: Path | None, extra: list[str]) -> Component:
        kubeconfig = kubeconfig or self.kubeconfig_path
        port = free_port(avoid=[self._apiserver_port])
        component = self._component(
            name,
            [
                str(self.binaries_dir / name),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._dir / (name + '-certs')}",
                *extra,
            ],
        )
        component.start()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate; only /healthz is read
        component.wait_until(
            lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", insecure), self.start_timeout_s, "healthy"
        )
        return component

    def _component(self, name: str, argv: list[str]) -> Component:
        existing = self.components.get(name)
        if existing is not None and existing.running():
            raise ControlPlaneError(f"{name} is already running")
        component = Component(name, argv, self._dir / "logs" / f"{name}.log")
        self.components[name] = component
        return component

    # -- access --------------------------------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.workdir is None:
            raise ControlPlaneError("the control plane has not been started")
        return self.workdir

    @property
    def _keys(self) -> _Pki:
        if self._pki is None:
            raise ControlPlaneError("the control plane has not been started")
        return self._pki

    @property
    def host(self) -> str:
        """The apiserver's URL, e.g. ``https://127.0.0.1:23456``; stable across `restart_apiserver()`."""
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def ca_path(self) -> Path:
        """The CA that signed the apiserver's serving certificate (and the admin client certificate)."""
        return self._keys.ca_cert

    @property
    def serving_cert_path(self) -> Path:
        """The apiserver's serving certificate (for 127.0.0.1 and localhost), for a proxy that stands in for it."""
        return self._keys.serving_cert

    @property
    def serving_key_path(self) -> Path:
        """The key of `serving_cert_path`."""
        return self._keys.serving_key

    @property
    def kubeconfig_path(self) -> Path:
        """An admin kubeconfig (client certificate in group system:masters), written on first use."""
        path = self._dir / "kubeconfigs" / "admin.yaml"
        if not path.exists():
            keys = self._keys
            user = {"client-certificate-data": _b64(keys.admin_cert), "client-key-data": _b64(keys.admin_key)}
            write_kubeconfig(path, self.host, keys.ca_cert, "admin", user)
        return path

    def node_kubeconfig(self, node_name: str) -> Path:
        """A kubeconfig for the kubelet of `node_name`: ``system:node:<name>`` in ``system:nodes``, which the Node
        authorizer and the NodeRestriction admission plugin limit to that node and its pods."""
        path = self._dir / "kubeconfigs" / f"node-{node_name}.yaml"
        if not path.exists():
            cert, key = self._keys.issue_client(f"node-{node_name}", f"/O=system:nodes/CN=system:node:{node_name}")
            user = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
            write_kubeconfig(path, self.host, self._keys.ca_cert, f"node-{node_name}", user)
        return path

    @property
    def audit_log_path(self) -> Path:
        """Where the apiserver writes its audit log (with `audit_log`)."""
        return self._dir / "audit" / "audit.log"

    def audit_events(self) -> list[AuditEvent]:
        """Every request in the audit log so far, once each (`read_audit_log`); empty without `audit_log`."""
        return read_audit_log(self.audit_log_path)

    def pid(self, name: str) -> int:
        """The process ID of the running component `name` ("etcd", "kube-apiserver", ...): the shim execs it."""
        component = self.components.get(name)
        if component is None or component.popen is None or not component.running():
            raise ControlPlaneError(f"{name} is not running")
        return component.popen.pid

    def apiserver_metrics(self) -> str:
        """The apiserver's /metrics (Prometheus text), read as admin."""
        with urllib.request.urlopen(f"{self.host}/metrics", context=self._admin_ssl_context(), timeout=10) as resp:
            text: str = resp.read().decode()
        return text

    def etcd_metrics(self) -> str:
        """etcd's /metrics (Prometheus text), from its client URL."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self._etcd_url}/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
        return text

    def request_count(self, resource: str, verb: str, group: str = "", metric: str = "apiserver_request_total") -> int:
        """How many `verb` requests (GET, LIST, POST, ...) for `resource` the apiserver has served since it
        started, from its own /metrics (apiserver_request_total, summed over response codes and scopes). A WATCH
        is counted there when it ends: `metric="apiserver_longrunning_requests"` counts the open ones."""
        text = self.apiserver_metrics()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(metric + "{"):
                continue
            labels, _, value = line.rpartition(" ")
            if (
                f'resource="{resource}"' in labels
                and f'verb="{verb}"' in labels
                and f'group="{group}"' in labels
                and 'subresource=""' in labels
            ):
                total += float(value)
        return int(total)

    def _admin_ssl_context(self) -> ssl.SSLContext:
        keys = self._keys
        context = ssl.create_default_context(cafile=str(keys.ca_cert))
        context.load_cert_chain(str(keys.admin_cert), str(keys.admin_key))
        return context

    def api_client(self) -> client.ApiClient:
        """A new admin ApiClient (system:masters: RBAC does not apply). Close it when done."""
        keys = self._keys
        configuration = client.Configuration(
            host=self.host, ssl_ca_cert=str(keys.ca_cert), cert_file=str(keys.admin_cert), key_file=str(keys.admin_key)
        )
        return client.ApiClient(configuration)

    def service_account_kubeconfig(self, namespace: str, name: str, *, expiration_s: int = 3600) -> Path:
        """A kubeconfig that acts as ServiceAccount `namespace/name`, created with its namespace if missing.

        The token comes from the TokenRequest API, so the apiserver authenticates it as
        ``system:serviceaccount:<namespace>:<name>`` and RBAC decides what it may do.
        """
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            _create_ignoring_conflict(
                lambda: core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
            )
            _create_ignoring_conflict(
                lambda: core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
                )
            )
            # No audiences: the token gets the apiserver's own (--api-audiences, defaulting to the issuer).
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_s)
            )
            granted = core.create_namespaced_service_account_token(name, namespace, request)
        if granted.status is None or not granted.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        path = self._dir / "kubeconfigs" / f"sa-{namespace}-{name}.yaml"
        return write_kubeconfig(
            path, self.host, self._keys.ca_cert, f"{namespace}-{name}", {"token": granted.status.token}
        )

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
    ) -> client.V1Node:
        """Create a Node as a kubelet would leave it: Ready, with capacity = allocatable, and schedulable.

        The TaintNodesByCondition admission plugin taints every new Node ``node.kubernetes.io/not-ready``; the
        node-lifecycle controller would lift it once the kubelet reports Ready. Neither runs here, so this writes
        the Ready condition through the status subresource and removes the taint itself.
        """
        resources = dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"})
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "created by the vramguard tests",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {}))))
            # JSON merge patches: the client would otherwise send a dict as a JSON Patch (a list of operations).
            core.patch_node_status(
                name,
                {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
                _content_type=_MERGE_PATCH,
            )
            node: client.V1Node = core.patch_node(name, {"spec": {"taints": None}}, _content_type=_MERGE_PATCH)
        return node


def kubeconfig_api_client(path: Path) -> client.ApiClient:
    """A new ApiClient that acts as the user of the kubeconfig at `path` (as the agent's --kubeconfig would)."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]  # untyped in the client
        config_file=str(path), persist_config=False
    )
    return api


def _process_identity(pid: int) -> str | None:
    """``"<pid> <start time>"`` of a live process (not a zombie), or None: survives PID reuse."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    state, start_ticks = fields[0], fields[19]
    return None if state in ("Z", "X") else f"{pid} {start_ticks}"


def _remove_abandoned_workdirs() -> None:
    """Remove the temporary workdirs of test processes that died without `stop()` (SIGKILL, a crash).

    Their components died with them (PR_SET_PDEATHSIG), but the directories stay, and etcd's preallocated WAL
    makes each one over 100 MB.
    """
    for workdir in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
        try:
            owner = (workdir / _OWNER_FILE).read_text()
            pid = int(owner.split()[0])
        except (OSError, ValueError, IndexError):
            continue  # no owner recorded: not ours to judge
        if _process_identity(pid) != owner:
            shutil.rmtree(workdir, ignore_errors=True)


def _create_ignoring_conflict(create: Callable[[], Any]) -> None:
    try:
        create()
    except client.ApiException as error:
        if error.status != 409:
            raise
