"""Run Flower 1.42's Deployment Engine on loopback, with TLS and SuperNode authentication.

A consortium pilot needs the real Deployment Engine (one SuperLink, one SuperNode per site), not the
simulation engine, and it needs it secured the way a production federation would be: the SuperLink
serves TLS with a certificate the sites verify against a CA, only SuperNodes whose public key was
registered beforehand may connect (``--enable-supernode-auth``), and no app dependency is installed
at run time. This module starts all of that on 127.0.0.1, waits until each part is ready (polling
ports and logs, never fixed sleeps), submits runs through the ``flwr`` CLI, and stops every process
it started, by PID and process group, including the children Flower spawns itself.

Facts measured against flwr 1.42.0 on this machine:

* SuperLink: ``flower-superlink --ssl-ca-certfile CA --ssl-certfile CERT --ssl-keyfile KEY
  --enable-supernode-auth --disable-runtime-dependency-installation --host 127.0.0.1 --port P``;
  Fleet, Control and Runtime APIs share that one HTTPS port.
* SuperNode: ``flower-supernode --superlink 127.0.0.1:P --root-certificates CA
  --auth-supernode-private-key KEY --node-config 'k=v ...' --port Q`` (Q: its local Runtime API).
* Authentication keys: ECDSA on a NIST curve (P-384 here), private key in OpenSSH format (Flower
  reads it with ``load_ssh_private_key``), public key in OpenSSH format, registered with
  ``flwr supernode register KEY.pub <connection>`` before the SuperNode starts.
* ``flwr run`` exits 0 even when the ServerApp failed; it then prints ``Exit Code: <n>`` (201 for
  an exception raised in the ServerApp) and ``flwr list --run-id`` says ``finished:failed``.

Linux only: descendants are found through /proc.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ConfigValue = str | int | float | bool
"""A node-config or run-config value: the scalar types Flower accepts in ``key=value`` pairs."""

LOOPBACK = "127.0.0.1"
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.pem", "server.key"
_VALIDITY = dt.timedelta(days=365)
_RENEW_MARGIN = dt.timedelta(days=1)
_NODE_KEY_CURVE = ec.SECP384R1()  # the curve Flower's docs use (ssh-keygen -t ecdsa -b 384)
_NIST_CURVES = ("secp256r1", "secp384r1", "secp521r1")
_CONNECTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_CONFIG_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXIT_CODE = re.compile(r"Exit Code: (\d+)")
_RUN_ID = re.compile(r"Successfully (?:started|submitted) run (\d+)", re.IGNORECASE)
_NODE_READY = "SuperNode ID:"
_POLL_S = 0.1


class DeploymentError(ValueError):
    """A deployment step failed; the message names the file, flag or process (and its log)."""


@dataclass(frozen=True)
class CertPaths:
    """PEM files for TLS: the CA the sites trust and the SuperLink's server certificate and key."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's authentication key pair, both in OpenSSH format (what Flower 1.42 reads)."""

    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class RunOutcome:
    """What one ``flwr run`` did: its exit code, its output, and the ServerApp's verdict."""

    returncode: int
    output: str
    duration_s: float
    log_path: Path
    run_id: int | None = None
    server_exit_code: int | None = None
    status: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True only if the CLI, the ServerApp and the run's recorded status all report success.

        ``flwr run`` returns 0 even when the ServerApp raised, so its exit code alone is not enough.
        """
        status_ok = self.status is None or "completed" in self.status
        return self.returncode == 0 and self.server_exit_code is None and not self.timed_out and status_ok


@dataclass
class ManagedProcess:
    """A process this module started, in its own session (process group), logging to a file.

    ``seen`` maps every PID of it and of its descendants observed so far to that process's start
    time, so that a PID the kernel later recycles for an unrelated process is never signalled.
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    seen: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The PID of the process itself (also its process-group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process itself is still running (reaps it if it has exited)."""
        return self.popen.poll() is None

    def refresh(self) -> None:
        """Record the current descendants of every recorded live process (they may outlive it)."""
        self.alive()
        roots = [pid for pid, start in self.seen.items() if same_process(pid, start)]
        self.seen.update(descendants(roots))

    def alive_pids(self) -> set[int]:
        """PIDs of this process and its recorded descendants that still run (zombies excluded)."""
        self.alive()
        return {pid for pid, start in self.seen.items() if same_process(pid, start)}


@dataclass
class SuperNodeHandle:
    """One started SuperNode: its site id, keys, node config, ports and process."""

    site_id: int
    keys: NodeKeys
    node_config: dict[str, ConfigValue]
    port: int
    root_certificates: Path
    process: ManagedProcess
    node_id: int | None = None


# ----------------------------------------------------------------------------------------------
# Files: certificates and keys
# ----------------------------------------------------------------------------------------------


def _write_private(path: Path, data: bytes) -> None:
    """Write a secret atomically with mode 0600 (the file never exists with wider permissions)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
    os.chmod(path, 0o600)


def _write_public(path: Path, data: bytes) -> None:
    """Write a public file (certificate, public key) atomically, mode 0644."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + _VALIDITY)


def _build_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that may sign only end-entity certificates (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name("dirichlet-fl pilot CA"))
        .issuer_name(_name("dirichlet-fl pilot CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(ski, critical=False)
    )
    return key, builder.sign(key, hashes.SHA256())


def _build_server(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate for 127.0.0.1 and localhost, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))])
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    return key, builder.sign(ca_key, hashes.SHA256())


def _same_key(private: object, cert: x509.Certificate) -> bool:
    pem = serialization.Encoding.PEM
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    public = private.public_key()  # type: ignore[attr-defined]
    return public.public_bytes(pem, spki) == cert.public_key().public_bytes(pem, spki)


def certificates_valid(paths: CertPaths) -> bool:
    """Whether existing files form a usable set: CA signs server cert, keys match, SANs, dates."""
    try:
        ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
        server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
        ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
        server_key = serialization.load_pem_private_key(paths.server_key.read_bytes(), password=None)
        ca.verify_directly_issued_by(ca)
        server.verify_directly_issued_by(ca)
        san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:  # any unreadable, mismatched or malformed file: the set is not usable
        return False
    horizon = dt.datetime.now(dt.UTC) + _RENEW_MARGIN
    has_names = "localhost" in san.get_values_for_type(x509.DNSName) and ipaddress.ip_address(
        LOOPBACK
    ) in san.get_values_for_type(x509.IPAddress)
    in_date = min(ca.not_valid_after_utc, server.not_valid_after_utc) > horizon
    return has_names and in_date and _same_key(ca_key, ca) and _same_key(server_key, server)


def make_certificates(directory: Path) -> CertPaths:
    """Create (or reuse, if present and valid) a self-signed CA and a loopback server certificate.

    The server certificate carries SAN DNS:localhost and IP:127.0.0.1 so that SuperNodes and the
    CLI, which dial 127.0.0.1, can verify it. Private keys are written with mode 0600. Any
    inconsistent or expiring set is replaced as a whole, so the CA always matches the server cert.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(directory / CA_CERT, directory / CA_KEY, directory / SERVER_CERT, directory / SERVER_KEY)
    if certificates_valid(paths):
        os.chmod(paths.ca_key, 0o600)
        os.chmod(paths.server_key, 0o600)
        return paths
    ca_key, ca_cert = _build_ca()
    server_key, server_cert = _build_server(ca_key, ca_cert)
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    pem = serialization.Encoding.PEM
    _write_private(paths.ca_key, ca_key.private_bytes(pem, pkcs8, none))
    _write_private(paths.server_key, server_key.private_bytes(pem, pkcs8, none))
    _write_public(paths.ca_cert, ca_cert.public_bytes(pem))
    _write_public(paths.server_cert, server_cert.public_bytes(pem))
    return paths


def _node_keys_valid(keys: NodeKeys) -> bool:
    """Whether an existing pair parses as Flower reads it and the public key matches the private."""
    try:
        private = serialization.load_ssh_private_key(keys.private_key.read_bytes(), password=None)
        public = serialization.load_ssh_public_key(keys.public_key.read_bytes())
    except Exception:  # unreadable or not an OpenSSH key: generate a fresh pair
        return False
    if not isinstance(private, ec.EllipticCurvePrivateKey) or private.curve.name not in _NIST_CURVES:
        return False
    ssh = serialization.Encoding.OpenSSH
    return private.public_key().public_bytes(ssh, serialization.PublicFormat.OpenSSH) == (
        public.public_bytes(ssh, serialization.PublicFormat.OpenSSH)
    )


def make_node_keys(directory: Path, site_id: int) -> NodeKeys:
    """Create (or reuse, if present and valid) site ``site_id``'s SuperNode authentication keys.

    Same format as ``ssh-keygen -t ecdsa -b 384 -N ""`` (Flower's documented recipe): an OpenSSH
    private key (mode 0600), given to the SuperNode with ``--auth-supernode-private-key``, and an
    OpenSSH public key, registered with ``flwr supernode register``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    keys = NodeKeys(directory / f"supernode-{site_id}", directory / f"supernode-{site_id}.pub")
    if _node_keys_valid(keys):
        os.chmod(keys.private_key, 0o600)
        return keys
    private = ec.generate_private_key(_NODE_KEY_CURVE)
    private_bytes = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public_bytes = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write_private(keys.private_key, private_bytes)
    _write_public(keys.public_key, public_bytes + f" site-{site_id}\n".encode())
    return keys


def require_file(path: Path, flag: str) -> Path:
    """Return ``path`` resolved, or raise a one-line error naming the file and the flag it feeds."""
    if not path.is_file():
        raise DeploymentError(f"{flag}: file not found: {path}")
    return path.resolve()


# ----------------------------------------------------------------------------------------------
# Config rendering
# ----------------------------------------------------------------------------------------------


def render_value(value: ConfigValue) -> str:
    """One value in the TOML syntax Flower's ``key=value`` parser accepts; strings are quoted.

    Flower splits on whitespace outside quotes and matches quotes without escapes, so a string is
    written as a TOML literal ('...') or, if it contains an apostrophe, as a basic string ("...").
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else _bad(value)
    if isinstance(value, str) and "\n" not in value and "'" not in value:
        return f"'{value}'"
    if isinstance(value, str) and not any(c in value for c in '"\\\n'):
        return f'"{value}"'
    return _bad(value)


def _bad(value: object) -> str:
    raise DeploymentError(f"config value cannot be passed as key=value: {value!r}")


STAGE_IGNORED = (".git", ".venv", ".flwr", "results", "data", "tests", "__pycache__", "*.pyc", "*.egg-info")
"""What a staged app leaves out: environments, outputs, data and tests (Flower's bundle drops tests too)."""


def stage_app(app_dir: Path, destination: Path) -> Path:
    """A fresh snapshot of the app in `destination`, to submit with `flwr run` instead of the checkout.

    Flower 1.42 migrates pyproject.toml's [tool.flwr.federations] section into its own config and
    rewrites the submitted folder's pyproject.toml; submitting a snapshot keeps the checkout untouched,
    and the run uses exactly the code that was staged."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(app_dir, destination, ignore=shutil.ignore_patterns(*STAGE_IGNORED))
    return destination


def render_config(config: Mapping[str, ConfigValue]) -> str:
    """A whole config as Flower's space-separated ``key=value`` string (for --node-config etc.)."""
    parts = []
    for key, value in config.items():
        if not _CONFIG_KEY.match(key):
            raise DeploymentError(f"config key must be a bare TOML key: {key!r}")
        parts.append(f"{key}={render_value(value)}")
    return " ".join(parts)


# ----------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------


def free_port(taken: Iterable[int] = ()) -> int:
    """A TCP port free on loopback now, and not among ``taken`` (ports already handed out)."""
    taken = set(taken)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port
    raise DeploymentError("no free loopback port found")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat this module needs."""

    state: str
    ppid: int
    pgid: int
    start: int  # start time in clock ticks since boot: with the PID, a process's identity


def proc_stat(pid: int) -> ProcStat | None:
    """A PID's state, parent, process group and start time from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return ProcStat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def same_process(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and is not a zombie."""
    stat = proc_stat(pid)
    return stat is not None and stat.start == start and stat.state not in ("Z", "X")


def pid_alive(pid: int) -> bool:
    """Whether a PID is a live process (a zombie counts as gone: it runs nothing)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def descendants(roots: Iterable[int]) -> dict[int, int]:
    """All live descendants of ``roots`` (children, grandchildren, ...) with their start times."""
    stats = {
        int(entry.name): stat
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None
    }
    children: dict[int, list[int]] = {}
    for child, stat in stats.items():
        children.setdefault(stat.ppid, []).append(child)
    found: dict[int, int] = {}
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found[child] = stats[child].start
                stack.append(child)
    return found


def read_log(path: Path, tail: int | None = None) -> str:
    """A log file's text without ANSI colours (empty if absent); the last ``tail`` chars if given."""
    try:
        text = _ANSI.sub("", path.read_text(errors="replace"))
    except OSError:
        return ""
    return text if tail is None else text[-tail:]


def _reason(text: str) -> str:
    """The gist of a Flower failure in a log: the lines after ``Exit Code``, or the last error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if "Exit Code:" in lines[i]:
            return " / ".join(lines[i : i + 3])
    errors = [line for line in lines if "error" in line.lower()]
    return errors[-1] if errors else (lines[-1] if lines else "no output")


def start_process(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    cwd: Path,
    env: Mapping[str, str],
    stdout_path: Path | None = None,
) -> ManagedProcess:
    """Start ``argv`` in a new session (its own process group), its output going to a log file.

    stdout and stderr both go to ``log_path``, unless ``stdout_path`` is given (for commands whose
    stdout is machine-readable, such as ``flwr ... --format json``).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    out_path = stdout_path or log_path
    with log_path.open("ab") as log, out_path.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=log if stdout_path else subprocess.STDOUT,
            start_new_session=True,
        )
    proc = ManagedProcess(name=name, popen=popen, log_path=log_path)
    if (stat := proc_stat(popen.pid)) is not None:
        proc.seen[popen.pid] = stat.start
    return proc


def _signal_tree(proc: ManagedProcess, sig: signal.Signals) -> None:
    """Send ``sig`` to the process's group and to each recorded process that still is itself.

    Only processes whose start time still matches are signalled (never a recycled PID), and only
    their groups, which the kernel does not recycle while a member is left.
    """
    own_group = os.getpgrp()
    groups = {proc.pid} if proc.alive() else set()
    for pid, start in proc.seen.items():
        stat = proc_stat(pid)
        if stat is not None and stat.start == start and stat.state not in ("Z", "X"):
            groups.add(stat.pgid)
            _kill(os.kill, pid, sig)
    for group in groups - {own_group}:
        _kill(os.killpg, group, sig)


def _kill(fn: Callable[[int, int], None], target: int, sig: signal.Signals) -> None:
    try:
        fn(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(processes: Sequence[ManagedProcess], deadline: float) -> set[int]:
    """Poll until every recorded process is gone or the deadline passes; return the survivors."""
    while True:
        for proc in processes:
            proc.refresh()
        alive = {pid for proc in processes for pid in proc.alive_pids()}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(_POLL_S)


def stop_processes(processes: Sequence[ManagedProcess], grace_s: float) -> set[int]:
    """SIGTERM every process, its group and its descendants; SIGKILL what survives ``grace_s``.

    Descendants are collected first because Flower starts some children (the SuperLink's
    SuperExec) in sessions of their own, which a signal to the parent's group would miss.
    Returns the PIDs still alive at the end (normally none).
    """
    for proc in processes:
        proc.refresh()
    for proc in processes:
        _signal_tree(proc, signal.SIGTERM)
    alive = _wait_gone(processes, time.monotonic() + grace_s)
    if alive:
        for proc in processes:
            _signal_tree(proc, signal.SIGKILL)
        alive = _wait_gone(processes, time.monotonic() + 5.0)
    return alive


def _executable(name: str) -> str:
    """A Flower executable from this interpreter's environment, else from PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"executable not found: {name} (install flwr in this environment)")
    return found


def base_env(flwr_home: Path) -> dict[str, str]:
    """The environment for every Flower process: private FLWR_HOME, offline, no runtime installs.

    PATH starts with this interpreter's bin directory because Flower spawns its helpers
    (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
    """
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PYTHONUNBUFFERED="1",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


# ----------------------------------------------------------------------------------------------
# The federation
# ----------------------------------------------------------------------------------------------


class Federation:
    """One SuperLink and N SuperNodes on loopback, with TLS and SuperNode authentication.

    Use as a context manager: entering starts everything and waits until each SuperNode is
    connected; leaving (normally, on an exception or on KeyboardInterrupt) stops every process it
    started. ``stop()`` is also registered with ``atexit`` while the federation runs.

    Layout under ``workdir``: ``certificates/`` (unless ``certs`` is given), ``keys/``,
    ``flwr-home/`` (FLWR_HOME of the SuperLink and the CLI, with the CLI's config.toml),
    ``superlink/`` (the SuperLink's working directory: the ServerApp's outputs land here),
    ``supernode-<site>/`` (each SuperNode's working directory and FLWR_HOME), ``logs/``.
    """

    def __init__(
        self,
        workdir: Path,
        node_configs: Sequence[Mapping[str, ConfigValue]],
        *,
        name: str = "pilot",
        certs: CertPaths | None = None,
        startup_timeout: float = 60.0,
        grace_period: float = 10.0,
    ) -> None:
        if not _CONNECTION_NAME.match(name):
            raise DeploymentError(f"connection name must match [A-Za-z0-9_-]+: {name!r}")
        self.workdir = workdir.resolve()
        self.name = name
        self.node_configs = [dict(config) for config in node_configs]
        self._certs = certs
        self.startup_timeout = startup_timeout
        self.grace_period = grace_period
        self.flwr_home = self.workdir / "flwr-home"
        self.superlink_dir = self.workdir / "superlink"
        self.log_dir = self.workdir / "logs"
        self.port: int | None = None
        self.superlink: ManagedProcess | None = None
        self.nodes: list[SuperNodeHandle] = []
        self._processes: list[ManagedProcess] = []
        self._ports: set[int] = set()
        self._runs = 0

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Federation:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def certs(self) -> CertPaths:
        """The TLS files in use (generated under ``workdir/certificates`` unless given)."""
        if self._certs is None:
            self._certs = make_certificates(self.workdir / "certificates")
        return self._certs

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` of the SuperLink (Fleet, Control and Runtime APIs)."""
        if self.port is None:
            raise DeploymentError("the federation is not started")
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Federation:
        """Start the SuperLink, register each site's key, start and await each SuperNode."""
        if self.superlink is not None:
            raise DeploymentError(f"federation {self.name!r} is already started")
        atexit.register(self.stop)
        try:
            self._start_superlink()
            self.write_connection()
            self.await_nodes([self.launch_node(config) for config in self.node_configs])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> set[int]:
        """Stop every process this federation started, and their children; return survivors.

        Safe to call more than once. SIGTERM first (a SuperNode then deactivates itself), SIGKILL
        after ``grace_period`` seconds for whatever is left.
        """
        atexit.unregister(self.stop)
        return stop_processes(self._processes, self.grace_period)

    def all_pids(self) -> set[int]:
        """Every PID this federation started or saw as a descendant of one it started."""
        return {pid for proc in self._processes for pid in proc.seen}

    def alive_pids(self) -> set[int]:
        """The PIDs among ``all_pids()`` that still run (empty after ``stop()``)."""
        return {pid for proc in self._processes for pid in proc.alive_pids()}

    # -- SuperLink -------------------------------------------------------------------------

    def superlink_argv(self) -> list[str]:
        """The SuperLink's command line: TLS, SuperNode auth, no runtime dependency installs."""
        certs = self.certs
        return [
            _executable("flower-superlink"),
            "--ssl-ca-certfile", str(require_file(certs.ca_cert, "--ssl-ca-certfile")),
            "--ssl-certfile", str(require_file(certs.server_cert, "--ssl-certfile")),
            "--ssl-keyfile", str(require_file(certs.server_key, "--ssl-keyfile")),
            "--enable-supernode-auth",
            "--disable-runtime-dependency-installation",
            "--host", LOOPBACK,
            "--port", str(self.port),
        ]  # fmt: skip

    def _start_superlink(self, attempts: int = 3) -> None:
        """Start the SuperLink and poll its port; pick another port if someone took this one."""
        for attempt in range(1, attempts + 1):
            self.port = self._new_port()
            argv = self.superlink_argv()
            self.superlink = self._spawn("superlink", argv, self.superlink_dir, self.flwr_home)
            deadline = time.monotonic() + self.startup_timeout
            try:
                while not port_open(self.port):
                    self._check_alive(self.superlink, deadline, f"listening on {self.address}")
                    time.sleep(_POLL_S)
                return
            except DeploymentError:
                if attempt == attempts or "address already in use" not in read_log(self.superlink.log_path):
                    raise

    def write_connection(self) -> Path:
        """Write ``[superlink.<name>]`` (address, root-certificates) into FLWR_HOME/config.toml.

        Other connections already in the file are kept; this one becomes the default.
        """
        import tomli_w  # a dependency of flwr 1.42, imported late: only this method needs it

        path = self.flwr_home / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = tomllib.loads(path.read_text()) if path.is_file() else {}
        links = config.setdefault("superlink", {})
        links["default"] = self.name
        links[self.name] = {
            "address": self.address,
            "root-certificates": str(require_file(self.certs.ca_cert, "root-certificates")),
        }
        _write_public(path, tomli_w.dumps(config).encode())
        return path

    # -- SuperNodes ------------------------------------------------------------------------

    def register(self, keys: NodeKeys, site_id: int) -> int:
        """Register a SuperNode's public key with the SuperLink; return the node id it got.

        ``flwr supernode register <key.pub> <connection>`` over the TLS Control API. Only a
        connection failure is retried (until the startup timeout); a refusal (key already in use,
        not an EC key on a NIST curve) is raised at once.
        """
        public = require_file(keys.public_key, "flwr supernode register PUBLIC_KEY")
        argv = [_executable("flwr"), "supernode", "register", str(public), self.name]
        argv += ["--name", f"site-{site_id}", "--format", "json"]
        deadline = time.monotonic() + self.startup_timeout
        log_path = self.log_dir / f"register-site-{site_id}.log"
        while True:
            result = self._cli(argv, log_path, timeout=self.startup_timeout)
            node_id = _json_field(result.stdout, "node-id")
            if result.returncode == 0 and node_id is not None:
                return int(str(node_id))
            message = str(_json_field(result.stdout, "error-message") or _reason(read_log(log_path)))
            retry = re.search(r"connect|unavailable|timed? ?out", message, re.I)
            if not retry or time.monotonic() >= deadline:
                gist = " ".join(message.split())
                raise DeploymentError(f"registering {public} failed: {gist} (log: {log_path})")
            time.sleep(0.5)

    def supernode_argv(self, handle_keys: NodeKeys, root: Path, port: int, config: str) -> list[str]:
        """A SuperNode's command line: TLS root CA, auth private key, node config, Runtime port."""
        return [
            _executable("flower-supernode"),
            "--superlink", self.address,
            "--root-certificates", str(require_file(root, "--root-certificates")),
            "--auth-supernode-private-key",
            str(require_file(handle_keys.private_key, "--auth-supernode-private-key")),
            "--node-config", config,
            "--host", LOOPBACK,
            "--port", str(port),
        ]  # fmt: skip

    def add_node(
        self,
        node_config: Mapping[str, ConfigValue],
        *,
        keys: NodeKeys | None = None,
        root_certificates: Path | None = None,
        register: bool = True,
        site_id: int | None = None,
    ) -> SuperNodeHandle:
        """Register (unless ``register=False``) and start one SuperNode; wait until it connects.

        Raises DeploymentError if the SuperNode cannot connect: a CA that did not sign the
        SuperLink's certificate, a key the SuperLink does not know, or no connection in time.
        """
        node = self.launch_node(
            node_config,
            keys=keys,
            root_certificates=root_certificates,
            register=register,
            site_id=site_id,
        )
        self.await_nodes([node])
        return node

    def launch_node(
        self,
        node_config: Mapping[str, ConfigValue],
        *,
        keys: NodeKeys | None = None,
        root_certificates: Path | None = None,
        register: bool = True,
        site_id: int | None = None,
    ) -> SuperNodeHandle:
        """Register (unless ``register=False``) and start one SuperNode without waiting for it.

        Keys default to ``workdir/keys/supernode-<site>`` (created if absent), the CA to the
        federation's. Launch several, then ``await_nodes`` them: they connect in parallel.
        """
        site = len(self.nodes) if site_id is None else site_id
        keys = keys or make_node_keys(self.workdir / "keys", site)
        root = root_certificates or self.certs.ca_cert
        config = render_config(node_config)
        argv = self.supernode_argv(keys, root, port := self._new_port(), config)
        node_id = self.register(keys, site) if register else None
        workdir = self.workdir / f"supernode-{site}"
        process = self._spawn(f"supernode-{site}", argv, workdir, workdir / "flwr-home")
        handle = SuperNodeHandle(site, keys, dict(node_config), port, root, process, node_id)
        self.nodes.append(handle)
        return handle

    def await_nodes(self, nodes: Sequence[SuperNodeHandle]) -> None:
        """Poll each node's log until it reports its node id; diagnose an early exit or timeout."""
        deadline = time.monotonic() + self.startup_timeout
        pending = list(nodes)
        while pending:
            for node in list(pending):
                if _NODE_READY in read_log(node.process.log_path):
                    pending.remove(node)
                elif not node.process.alive():
                    raise self._node_failure(node)
            if pending and time.monotonic() >= deadline:
                proc = pending[0].process
                raise DeploymentError(
                    f"{proc.name} did not connect to {self.address} within "
                    f"{self.startup_timeout:.0f} s (log: {proc.log_path})"
                )
            time.sleep(_POLL_S if pending else 0)

    def _node_failure(self, node: SuperNodeHandle) -> DeploymentError:
        """Turn a SuperNode's early exit into a one-line error naming the cause and the log."""
        text = read_log(node.process.log_path)
        where = f"(log: {node.process.log_path})"
        if re.search(r"certificate verify failed|CERTIFICATE_VERIFY_FAILED", text, re.I):
            return DeploymentError(
                f"{node.process.name}: --root-certificates {node.root_certificates} did not "
                f"verify the SuperLink's TLS certificate (wrong CA?) {where}"
            )
        if re.search(r"\[code: 2004\]|Failed to activate SuperNode", text):
            return DeploymentError(
                f"{node.process.name}: refused by the SuperLink: public key "
                f"{node.keys.public_key} is not registered (flwr supernode register) {where}"
            )
        return DeploymentError(f"{node.process.name} exited before connecting: {_reason(text)} {where}")

    def registered_nodes(self) -> list[dict[str, object]]:
        """The SuperLink's node list (``flwr supernode list <connection> --format json``)."""
        argv = [_executable("flwr"), "supernode", "list", self.name, "--format", "json"]
        result = self._cli(argv, self.log_dir / "supernode-list.log", timeout=60)
        try:
            payload = json.loads(_json_text(result.stdout))
        except ValueError as err:
            raise DeploymentError(f"flwr supernode list: unreadable output: {err}") from err
        nodes = payload.get("nodes", []) if isinstance(payload, dict) else payload
        return list(nodes)

    # -- runs ------------------------------------------------------------------------------

    def run(
        self,
        app_dir: Path,
        run_config: Mapping[str, ConfigValue] | None = None,
        timeout: float = 600.0,
    ) -> RunOutcome:
        """Submit ``app_dir`` with ``flwr run <app_dir> <name> --stream`` and wait for its end.

        Success needs more than exit code 0: Flower's CLI returns 0 when the ServerApp failed, so
        the output is scanned for ``Exit Code: <n>`` and the run's recorded status is read back.
        On timeout the CLI is killed and the run stopped on the SuperLink (``flwr stop``).
        """
        app = require_file(app_dir / "pyproject.toml", "flwr run APP").parent
        argv = [_executable("flwr"), "run", str(app), self.name, "--stream"]
        if run_config:
            argv += ["--run-config", render_config(run_config)]
        self._runs += 1
        log_path = self.log_dir / f"flwr-run-{self._runs}.log"
        start = time.monotonic()
        proc = self._spawn(f"flwr-run-{self._runs}", argv, self.workdir, self.flwr_home, log_path)
        timed_out = _wait_exit(proc, timeout)
        if timed_out:
            stop_processes([proc], self.grace_period)
        output = read_log(log_path)
        run_id = _first_int(_RUN_ID, output)
        if timed_out and run_id is not None:
            stop_argv = [_executable("flwr"), "stop", str(run_id), self.name]
            self._cli(stop_argv, self.log_dir / f"flwr-stop-{run_id}.log", timeout=60)
        code = proc.popen.returncode
        return RunOutcome(
            returncode=code if code is not None else -signal.SIGKILL,
            output=output,
            duration_s=time.monotonic() - start,
            log_path=log_path,
            run_id=run_id,
            server_exit_code=_first_int(_EXIT_CODE, output),
            status=self.run_status(run_id) if run_id is not None else None,
            timed_out=timed_out,
        )

    def run_status(self, run_id: int) -> str | None:
        """The run's status as the SuperLink records it (e.g. ``finished:completed``)."""
        argv = [_executable("flwr"), "list", self.name, "--run-id", str(run_id), "--format", "json"]
        result = self._cli(argv, self.log_dir / f"flwr-list-{run_id}.log", timeout=60)
        try:
            payload = json.loads(_json_text(result.stdout))
            runs = payload.get("runs", [])
            return str(runs[0]["status"]) if runs else None
        except (ValueError, KeyError, IndexError, AttributeError):
            return None

    # -- helpers ---------------------------------------------------------------------------

    def _new_port(self) -> int:
        port = free_port(self._ports)
        self._ports.add(port)
        return port

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        cwd: Path,
        flwr_home: Path,
        log_path: Path | None = None,
        stdout_path: Path | None = None,
    ) -> ManagedProcess:
        """Start a process with this federation's environment and record it for ``stop()``."""
        log_path = log_path or self.log_dir / f"{name}.log"
        proc = start_process(name, argv, log_path, cwd, base_env(flwr_home), stdout_path)
        self._processes.append(proc)
        return proc

    def _cli(self, argv: Sequence[str], log_path: Path, timeout: float) -> _CliResult:
        """Run a short ``flwr`` command as a managed process; return its exit code and stdout.

        stderr goes to ``log_path``, stdout (JSON with ``--format json``) to ``<log_path>.out``.
        """
        out_path = log_path.with_suffix(".out")
        out_path.unlink(missing_ok=True)
        proc = self._spawn(f"flwr-{argv[1]}", argv, self.workdir, self.flwr_home, log_path, out_path)
        if _wait_exit(proc, timeout):
            stop_processes([proc], self.grace_period)
        code = proc.popen.returncode
        return _CliResult(code if code is not None else -signal.SIGKILL, read_log(out_path))

    def _check_alive(self, proc: ManagedProcess, deadline: float, waiting_for: str) -> None:
        if not proc.alive():
            reason = _reason(read_log(proc.log_path))
            raise DeploymentError(f"{proc.name} exited: {reason} (log: {proc.log_path})")
        if time.monotonic() >= deadline:
            raise DeploymentError(
                f"{proc.name} not {waiting_for} within {self.startup_timeout:.0f} s (log: {proc.log_path})"
            )


@dataclass(frozen=True)
class _CliResult:
    returncode: int
    stdout: str


def _wait_exit(proc: ManagedProcess, timeout: float) -> bool:
    """Wait for a process to exit; True if it was still running after ``timeout`` seconds."""
    try:
        proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    return False


def _first_int(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return int(match.group(1)) if match else None


def _json_text(stdout: str) -> str:
    """The JSON object in a CLI's stdout (Flower may print other lines before it)."""
    start = stdout.find("{")
    return stdout[start:] if start >= 0 else stdout


def _json_field(stdout: str, key: str) -> object | None:
    try:
        payload = json.loads(_json_text(stdout))
    except ValueError:
        return None
    return payload.get(key) if isinstance(payload, dict) else None


# ----------------------------------------------------------------------------------------------
# Command line: start a pilot federation, run one app, stop everything
# ----------------------------------------------------------------------------------------------


def _sigterm_to_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.deployment --workdir W --app A --nodes N``: one secured run, then stop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--app", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_to_exit)  # so that `kill` also runs stop()
    configs = [{"partition-id": i, "num-partitions": args.nodes} for i in range(args.nodes)]
    try:
        with Federation(args.workdir, configs) as federation:
            outcome = federation.run(args.app, timeout=args.timeout)
    except DeploymentError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(outcome.output)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
