"""A Flower 1.42 Deployment Engine on loopback: one SuperLink, N SuperNodes, TLS and SuperNode authentication.

A consortium pilot needs the real Deployment Engine, secured as a production federation would be: TLS
with a certificate the sites verify against a CA, only SuperNodes whose public key was registered
beforehand (``--enable-supernode-auth``), and no app dependency installed at run time. `Federation`
starts all of that on 127.0.0.1, waits until each part is ready (polling ports and logs, never fixed
sleeps), submits runs through the ``flwr`` CLI and stops every process it started (cli/deployment/processes.py).
Measured against flwr 1.42.0: the three APIs share one HTTPS port, and ``flwr run`` exits 0 even when
the ServerApp failed (it prints ``Exit Code: <n>``; ``flwr list --run-id`` says ``finished:failed``).
Every process gets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` = TASK_POLL_S unless the caller's environment sets
it: each SuperExec asks for a task (a ServerApp or ClientApp to start) that often (0.01-60 s, default 1).
The SuperNode's waits between two pulls that found no message (3 s) and between two looks for a finished
reply (0.5 s) are fixed in Flower 1.42 (flwr/supernode/start_client_internal.py): nothing sets them.
With ``clientapp_executor="fork"`` (default) each SuperNode runs with ``--isolation process`` beside its own
site executor (site_executor.py: ClientApps forked from a warm process, authenticated by a secret);
``"subprocess"`` is Flower's default, a fresh ``flwr-clientapp`` process per message.
"""

from __future__ import annotations

import atexit
import re
import signal
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cli.deployment.app_signing import check_trusted_entities
from cli.deployment.certificates import CertPaths, NodeKeys, make_certificates, make_node_keys
from cli.deployment.fleet_gateway import FleetGateway
from cli.deployment.flwr_output import (
    EXIT_CODE,
    RUN_ID,
    CliResult,
    RunOutcome,
    first_int,
    json_field,
    node_list,
    run_status_of,
    supernode_exit_reason,
)
from cli.deployment.processes import (
    LOOPBACK,
    POLL_S,
    DeploymentError,
    ManagedProcess,
    base_env,
    executable,
    failure_reason,
    free_port,
    port_open,
    read_log,
    require_file,
    start_process,
    stop_processes,
    wait_exit,
)
from cli.deployment.site_executor import (
    CLIENTAPP_EXECUTORS,
    TASK_POLL_ENV,
    TASK_POLL_S,
    site_executor_argv,
    write_executor_secret,
)
from cli.deployment.staging import ConfigValue, render_config
from dirichlet_fl.files import write_atomically

_CONNECTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_NODE_READY = "SuperNode ID:"
_PORT_TAKEN = "address already in use"


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
    executor_secret: Path | None = None  # fork mode: the secret its site executor signs with (else None)
    executor: ManagedProcess | None = None  # that executor, started once the SuperNode's Runtime API listens


class Federation:
    """One SuperLink and N SuperNodes on loopback, with TLS and SuperNode authentication.

    Use as a context manager: entering starts everything and waits until each SuperNode is
    connected; leaving (normally, on an exception or on KeyboardInterrupt) stops every process it
    started. ``stop()`` is also registered with ``atexit`` while the federation runs.

    Layout under ``workdir``: ``certificates/`` (unless ``certs`` is given), ``keys/``,
    ``flwr-home/`` (FLWR_HOME of the SuperLink and the CLI, with the CLI's config.toml),
    ``superlink/`` (the SuperLink's working directory: the ServerApp's outputs land here),
    ``supernode-<site>/`` (each SuperNode's working directory and FLWR_HOME), ``logs/`` (unless
    ``log_dir`` is given: a caller that runs several federations on one workdir gives each its own).
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
        log_dir: Path | None = None,
        hub_url: str | None = None,
        trusted_entities: Sequence[Path | None] = (),
        fleet_gateway: bool = False,
        clientapp_executor: str = "fork",
    ) -> None:
        if not _CONNECTION_NAME.match(name):
            raise DeploymentError(f"connection name must match [A-Za-z0-9_-]+: {name!r}")
        if clientapp_executor not in CLIENTAPP_EXECUTORS:
            raise DeploymentError(f"clientapp_executor={clientapp_executor!r} is not one of {CLIENTAPP_EXECUTORS}")
        self.clientapp_executor = clientapp_executor
        self.workdir = workdir.resolve()
        self.name = name
        self.node_configs = [dict(config) for config in node_configs]
        self._certs = certs
        self.startup_timeout = startup_timeout
        self.grace_period = grace_period
        self.flwr_home = self.workdir / "flwr-home"
        self.superlink_dir = self.workdir / "superlink"
        self.log_dir = log_dir.resolve() if log_dir is not None else self.workdir / "logs"
        self.port: int | None = None
        self.superlink: ManagedProcess | None = None
        self.nodes: list[SuperNodeHandle] = []
        self._processes: list[ManagedProcess] = []
        self._ports: set[int] = set()
        self._runs = 0
        self.hub_url = hub_url
        self.trusted_entities = list(trusted_entities)
        self.use_gateway = fleet_gateway
        self.gateway: FleetGateway | None = None

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

    @property
    def fleet_address(self) -> str:
        """What the SuperNodes dial: the Fleet-only gateway if there is one, else the SuperLink itself."""
        return f"{LOOPBACK}:{self.gateway.port}" if self.gateway is not None else self.address

    def start(self) -> Federation:
        """Start the SuperLink, register each site's key, start and await each SuperNode."""
        if self.superlink is not None:
            raise DeploymentError(f"federation {self.name!r} is already started")
        atexit.register(self.stop)
        try:
            self._start_superlink()
            if self.use_gateway:
                self.gateway = FleetGateway(self.certs, self.port or 0).__enter__()
            self.write_connection()
            pins = self.trusted_entities + [None] * (len(self.node_configs) - len(self.trusted_entities))
            nodes = [self.add_node(config, trusted_entities=pin, wait=False)
                     for config, pin in zip(self.node_configs, pins)]
            self.await_nodes(nodes)
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
        survivors = stop_processes(self._processes, self.grace_period)
        if self.gateway is not None:  # after the SuperNodes, which poll it until they stop
            self.gateway.__exit__(None, None, None)
            self.gateway = None
        return survivors

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
            executable("flower-superlink"),
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
            hub = {"FLWR_SUPERGRID_API_URL": self.hub_url} if self.hub_url else {}
            self.superlink = self._spawn("superlink", argv, self.superlink_dir, self.flwr_home, extra_env=hub)
            deadline = time.monotonic() + self.startup_timeout
            try:
                while not port_open(self.port):
                    self._check_alive(self.superlink, deadline, f"listening on {self.address}")
                    time.sleep(POLL_S)
                return
            except DeploymentError:
                if attempt == attempts or _PORT_TAKEN not in read_log(self.superlink.log_path):
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
        write_atomically(path, tomli_w.dumps(config).encode())
        return path

    # -- SuperNodes ------------------------------------------------------------------------

    def register(self, keys: NodeKeys, site_id: int) -> int:
        """Register a SuperNode's public key with the SuperLink; return the node id it got.

        ``flwr supernode register <key.pub> <connection>`` over the TLS Control API. Only a
        connection failure is retried (until the startup timeout); a refusal (key already in use,
        not an EC key on a NIST curve) is raised at once.
        """
        public = require_file(keys.public_key, "flwr supernode register PUBLIC_KEY")
        argv = [executable("flwr"), "supernode", "register", str(public), self.name]
        argv += ["--name", f"site-{site_id}", "--format", "json"]
        deadline = time.monotonic() + self.startup_timeout
        log_path = self.log_dir / f"register-site-{site_id}.log"
        while True:
            result = self._cli(argv, log_path, timeout=self.startup_timeout)
            node_id = json_field(result.stdout, "node-id")
            if result.returncode == 0 and node_id is not None:
                return int(str(node_id))
            message = str(json_field(result.stdout, "error-message") or failure_reason(read_log(log_path)))
            retry = re.search(r"connect|unavailable|timed? ?out", message, re.I)
            if not retry or time.monotonic() >= deadline:
                gist = " ".join(message.split())
                raise DeploymentError(f"registering {public} failed: {gist} (log: {log_path})")
            time.sleep(0.5)

    def supernode_argv(
        self, handle_keys: NodeKeys, root: Path, port: int, config: str, trusted_entities: Path | None = None,
        executor_secret: Path | None = None,
    ) -> list[str]:
        """A SuperNode's command line: TLS root CA, auth private key, node config, Runtime port, and the
        app signing keys it trusts (``--trusted-entities``: then it refuses any FAB they did not sign; a pin
        that trusts no key is refused, since Flower would then verify nothing). With ``executor_secret`` it
        waits for the site's own SuperExec (``--isolation process``) and serves only one holding that secret."""
        pin = ["--trusted-entities", str(check_trusted_entities(trusted_entities))] if trusted_entities else []
        own_executor = ["--isolation", "process", "--superexec-auth-secret-file", str(executor_secret)]
        return [
            executable("flower-supernode"),
            "--superlink", self.fleet_address,
            "--root-certificates", str(require_file(root, "--root-certificates")),
            "--auth-supernode-private-key",
            str(require_file(handle_keys.private_key, "--auth-supernode-private-key")),
            "--node-config", config,
            "--host", LOOPBACK,
            "--port", str(port),
            *pin,
            *(own_executor if executor_secret is not None else []),
        ]  # fmt: skip

    def add_node(
        self,
        node_config: Mapping[str, ConfigValue],
        *,
        keys: NodeKeys | None = None,
        root_certificates: Path | None = None,
        register: bool = True,
        site_id: int | None = None,
        trusted_entities: Path | None = None,
        wait: bool = True,
    ) -> SuperNodeHandle:
        """Register (unless ``register=False``) and start one SuperNode; with ``wait``, until it connects.

        Keys default to ``workdir/keys/supernode-<site>`` (created if absent), the CA to the
        federation's. Add several with ``wait=False``, then ``await_nodes`` them: they connect in
        parallel. Raises DeploymentError if a SuperNode cannot connect: a CA that did not sign the
        SuperLink's certificate, a key the SuperLink does not know, or no connection in time.
        """
        site = len(self.nodes) if site_id is None else site_id
        keys = keys or make_node_keys(self.workdir / "keys", site)
        root = root_certificates or self.certs.ca_cert
        config = render_config(node_config)
        workdir = self.workdir / f"supernode-{site}"
        secret = write_executor_secret(workdir) if self.clientapp_executor == "fork" else None
        argv = self.supernode_argv(keys, root, port := self._new_port(), config, trusted_entities, secret)
        node_id = self.register(keys, site) if register else None
        process = self._spawn(f"supernode-{site}", argv, workdir, workdir / "flwr-home")
        handle = SuperNodeHandle(site, keys, dict(node_config), port, root, process, node_id, secret)
        self.nodes.append(handle)
        if wait:
            self.await_nodes([handle])
        return handle

    def await_nodes(self, nodes: Sequence[SuperNodeHandle]) -> None:
        """Poll each node's log until it reports its node id; diagnose an early exit or timeout."""
        deadline = time.monotonic() + self.startup_timeout
        pending, moves = list(nodes), 0
        while pending:
            for node in list(pending):
                if _NODE_READY in read_log(node.process.log_path):  # its Runtime API listens from then on
                    pending.remove(node)
                    self._start_executor(node)
                elif not node.process.alive() and _PORT_TAKEN in read_log(node.process.log_path) and moves < 3:
                    moves += 1  # its Runtime port was taken between its choice and its bind: another port
                    self._restart_on_new_port(node)
                elif not node.process.alive():
                    reason = supernode_exit_reason(node.process.name, read_log(node.process.log_path),
                                                   node.root_certificates, node.keys.public_key)
                    raise DeploymentError(f"{reason} (log: {node.process.log_path})")
            if pending and time.monotonic() >= deadline:
                proc = pending[0].process
                raise DeploymentError(
                    f"{proc.name} did not connect to {self.address} within "
                    f"{self.startup_timeout:.0f} s (log: {proc.log_path})"
                )
            time.sleep(POLL_S if pending else 0)

    def _restart_on_new_port(self, node: SuperNodeHandle) -> None:
        """Start a SuperNode that could not bind its Runtime port again, with the same command on a new port."""
        node.port = self._new_port()
        argv = [str(arg) for arg in node.process.popen.args]  # type: ignore[union-attr]
        argv[argv.index("--port") + 1] = str(node.port)
        workdir = self.workdir / f"supernode-{node.site_id}"
        node.process = self._spawn(node.process.name, argv, workdir, workdir / "flwr-home")

    def _start_executor(self, node: SuperNodeHandle) -> None:
        """Start a fork-mode node's site executor, only once the node listens: a client dialing a port before it is
        bound can take the port itself (a loopback self-connect), and the SuperNode then fails to start."""
        if node.executor_secret is not None and node.executor is None:
            argv = site_executor_argv(node.port, node.executor_secret, node.process.pid)
            folder = node.executor_secret.parent
            node.executor = self._spawn(f"site-executor-{node.site_id}", argv, folder, folder / "flwr-home")

    def registered_nodes(self) -> list[dict[str, object]]:
        """The SuperLink's node list (``flwr supernode list <connection> --format json``)."""
        argv = [executable("flwr"), "supernode", "list", self.name, "--format", "json"]
        result = self._cli(argv, self.log_dir / "supernode-list.log", timeout=60)
        try:
            return node_list(result.stdout)
        except ValueError as err:
            raise DeploymentError(f"flwr supernode list: unreadable output: {err}") from err

    # -- runs ------------------------------------------------------------------------------

    def run(
        self,
        app_dir: Path | str,
        run_config: Mapping[str, ConfigValue] | None = None,
        timeout: float = 600.0,
    ) -> RunOutcome:
        """Submit ``app_dir`` with ``flwr run <app_dir> <name> --stream`` and wait for its end.

        ``app_dir`` may instead be a Hub app spec ``@publisher/name==x.y.z`` (a string): the SuperLink then
        fetches the FAB and its signatures from ``hub_url`` (cli/deployment/app_hub.py).

        Success needs more than exit code 0: Flower's CLI returns 0 when the ServerApp failed, so
        the output is scanned for ``Exit Code: <n>`` and the run's recorded status is read back.
        On timeout the CLI is killed and the run stopped on the SuperLink (``flwr stop``).
        """
        if isinstance(app_dir, str) and app_dir.startswith("@"):
            app = app_dir
        else:
            app = str(require_file(Path(app_dir) / "pyproject.toml", "flwr run APP").parent)
        argv = [executable("flwr"), "run", app, self.name, "--stream"]
        if run_config:
            argv += ["--run-config", render_config(run_config)]
        self._runs += 1
        log_path = self.log_dir / f"flwr-run-{self._runs}.log"
        start = time.monotonic()
        proc = self._spawn(f"flwr-run-{self._runs}", argv, self.workdir, self.flwr_home, log_path)
        timed_out = wait_exit(proc, timeout)
        if timed_out:
            stop_processes([proc], self.grace_period)
        output = read_log(log_path)
        run_id = first_int(RUN_ID, output)
        if timed_out and run_id is not None:
            stop_argv = [executable("flwr"), "stop", str(run_id), self.name]
            self._cli(stop_argv, self.log_dir / f"flwr-stop-{run_id}.log", timeout=60)
        code = proc.popen.returncode
        return RunOutcome(
            returncode=code if code is not None else -signal.SIGKILL,
            output=output,
            duration_s=time.monotonic() - start,
            log_path=log_path,
            run_id=run_id,
            server_exit_code=first_int(EXIT_CODE, output),
            status=self.run_status(run_id) if run_id is not None else None,
            timed_out=timed_out,
        )

    def run_status(self, run_id: int) -> str | None:
        """The run's status as the SuperLink records it (e.g. ``finished:completed``)."""
        argv = [executable("flwr"), "list", self.name, "--run-id", str(run_id), "--format", "json"]
        return run_status_of(self._cli(argv, self.log_dir / f"flwr-list-{run_id}.log", timeout=60).stdout)

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
        extra_env: Mapping[str, str] | None = None,
    ) -> ManagedProcess:
        """Start a process with this federation's environment and record it for ``stop()``."""
        log_path = log_path or self.log_dir / f"{name}.log"
        env = {TASK_POLL_ENV: str(TASK_POLL_S)} | base_env(flwr_home) | dict(extra_env or {})
        proc = start_process(name, argv, log_path, cwd, env, stdout_path)
        self._processes.append(proc)
        return proc

    def _cli(self, argv: Sequence[str], log_path: Path, timeout: float) -> CliResult:
        """Run a short ``flwr`` command as a managed process; return its exit code and stdout.

        stderr goes to ``log_path``, stdout (JSON with ``--format json``) to ``<log_path>.out``.
        """
        out_path = log_path.with_suffix(".out")
        proc = self._spawn(f"flwr-{argv[1]}", argv, self.workdir, self.flwr_home, log_path, out_path)
        if wait_exit(proc, timeout):
            stop_processes([proc], self.grace_period)
        code = proc.popen.returncode
        return CliResult(code if code is not None else -signal.SIGKILL, read_log(out_path))

    def _check_alive(self, proc: ManagedProcess, deadline: float, waiting_for: str) -> None:
        if not proc.alive():
            reason = failure_reason(read_log(proc.log_path))
            raise DeploymentError(f"{proc.name} exited: {reason} (log: {proc.log_path})")
        if time.monotonic() >= deadline:
            raise DeploymentError(
                f"{proc.name} not {waiting_for} within {self.startup_timeout:.0f} s (log: {proc.log_path})"
            )


