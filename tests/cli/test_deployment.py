"""The Deployment Engine on loopback: TLS, SuperNode authentication, and clean shutdown.

These tests start real Flower 1.42 processes (flower-superlink, flower-supernode, flwr) on
127.0.0.1, CPU only. Each test is bounded twice: every wait inside ``cli.deployment.federation`` has its own
timeout, and an alarm fixture aborts a test that overruns (pytest-timeout is not installed). Every
process a test starts is stopped by PID, and each test asserts that none of them is left.
"""

from __future__ import annotations

import ssl
import stat
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cli.deployment.certificates import CertPaths, make_certificates, make_node_keys
from cli.deployment.federation import Federation
from cli.deployment.processes import DeploymentError, pid_alive
from cli.deployment.staging import ConfigValue, render_config
from tests.cli.conftest import leaders

TEST_BUDGET_S = 120  # hard ceiling per test; the slowest (the smoke run) takes about 30 s


# hard_timeout: tests/conftest.py, with TEST_BUDGET_S
pytestmark = pytest.mark.usefixtures("hard_timeout")  # on free ports: runs beside the other tests


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _handshake(certs: CertPaths, cafile: Path, hostname: str) -> None:
    """A full in-memory TLS handshake: server with the server cert, client trusting ``cafile``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs.server_cert, certs.server_key)
    client_ctx = ssl.create_default_context(cafile=str(cafile))
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not complete")


# ------------------------------------------------------------------------------------------------
# (1) certificates and keys
# ------------------------------------------------------------------------------------------------


def test_certificates_verify_and_private_keys_are_0600(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    assert _mode(certs.ca_key) == 0o600 and _mode(certs.server_key) == 0o600
    ca = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for hostname in ("127.0.0.1", "localhost"):
        _handshake(certs, certs.ca_cert, hostname)  # what a SuperNode's TLS client does

    other = make_certificates(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, other.ca_cert, "127.0.0.1")

    before = certs.server_cert.read_bytes()
    assert make_certificates(tmp_path / "certs") == certs
    assert certs.server_cert.read_bytes() == before, "valid certificates must be reused"
    certs.server_cert.write_text("not a certificate")
    make_certificates(tmp_path / "certs")
    x509.load_pem_x509_certificate(certs.server_cert.read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    )


def test_node_keys_in_flower_format_and_reused(tmp_path: Path) -> None:
    from flwr.cli.supernode.register import try_load_public_key

    keys = make_node_keys(tmp_path, site_id=3)
    assert _mode(keys.private_key) == 0o600
    private = serialization.load_ssh_private_key(keys.private_key.read_bytes(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert private.curve.name == "secp384r1"
    assert keys.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert try_load_public_key(keys.public_key)  # the check `flwr supernode register` applies
    before = keys.private_key.read_bytes()
    assert make_node_keys(tmp_path, site_id=3) == keys
    assert keys.private_key.read_bytes() == before


def test_config_rendering_round_trips_through_flowers_parser() -> None:
    from flwr.common.config import parse_config_args

    config: dict[str, ConfigValue] = {"partition-id": 1, "site": "Clinic B", "quote": "it's", "lr": 0.05, "dp": True}
    rendered = render_config(config)
    assert "site='Clinic B'" in rendered and "dp=true" in rendered
    assert parse_config_args([rendered]) == config
    with pytest.raises(DeploymentError):
        render_config({"bad": "both ' and \""})


def test_missing_certificate_file_is_named(tmp_path: Path, federations: list[Federation]) -> None:
    certs = make_certificates(tmp_path / "certs")
    certs.server_cert.unlink()
    federation = Federation(tmp_path / "fed", [], certs=certs)
    federations.append(federation)
    with pytest.raises(DeploymentError, match=r"--ssl-certfile: file not found: .*server\.pem"):
        federation.start()
    assert federation.superlink is None, "nothing may start without its certificates"


# ------------------------------------------------------------------------------------------------
# (2) end-to-end smoke run on the Deployment Engine
# ------------------------------------------------------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "deployment-probe"
version = "1.0.0"
description = "Infrastructure probe: one QUERY round trip to every SuperNode."
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "dirichlet-fl"

[tool.flwr.app.components]
serverapp = "deployment_probe.server_app:app"
clientapp = "deployment_probe.client_app:app"

[tool.flwr.app.config]
token = "default"
"""

SERVER_APP = '''\
"""Send one QUERY to every connected node; fail unless each replies with its site and the token."""

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    token = str(context.run_config["token"])
    node_ids = sorted(grid.get_node_ids())
    queries = [
        Message(RecordDict({"query": ConfigRecord({"token": token})}), dst_node_id=node_id,
                message_type=MessageType.QUERY)
        for node_id in node_ids
    ]
    replies = list(grid.send_and_receive(queries, timeout=60))
    answers = sorted(
        f"{r.content['reply']['site']}|{r.content['reply']['token']}|{r.content['reply']['weight']}"
        for r in replies if r.has_content()
    )
    print(f"PROBE nodes={len(node_ids)} answers={answers}", flush=True)
    if len(answers) != len(node_ids) or any(f"|{token}|" not in a for a in answers):
        raise RuntimeError("probe: missing or wrong replies")
    if token == "fail":
        raise RuntimeError("probe: failure requested")
'''

CLIENT_APP = '''\
"""Answer the probe with this node's node config and the token it received."""

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    reply = ConfigRecord({
        "site": str(context.node_config["site"]),
        "token": str(msg.content["query"]["token"]),
        "weight": float(context.node_config["weight"]),
    })
    return Message(RecordDict({"reply": reply}), reply_to=msg)
'''


def write_probe_app(directory: Path) -> Path:
    """A minimal Message-API Flower app, independent of the project's own app."""
    package = directory / "deployment_probe"
    package.mkdir(parents=True)
    (directory / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text('"""Deployment probe app."""\n')
    (package / "server_app.py").write_text(SERVER_APP)
    (package / "client_app.py").write_text(CLIENT_APP)
    return directory


def acquire_task(port: int, secret: bytes | None) -> Any:
    """Ask a SuperNode's Runtime API for a task as a SuperExec would, signing with ``secret`` if given."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret is not None:
        interceptors.append(SuperExecAuthHttpInterceptor(
            master_secret=secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})))
    client = RuntimeHttpClient.from_server_address(f"127.0.0.1:{port}", True, None, interceptors)
    try:
        return client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
    finally:
        client.close()


def test_smoke_run_with_tls_and_supernode_auth(tmp_path: Path, federations: list[Federation]) -> None:
    app = write_probe_app(tmp_path / "app")
    configs: list[dict[str, ConfigValue]] = [
        {"partition-id": 0, "site": "Clinic A", "weight": 0.5, "trusted": True},
        {"partition-id": 1, "site": "Clinic B", "weight": 1.5, "trusted": False},
    ]
    federation = Federation(tmp_path / "fed", configs, name="smoke")
    federations.append(federation)
    started = time.monotonic()
    with federation:
        startup_s = time.monotonic() - started
        assert "--enable-supernode-auth" in federation.superlink_argv()
        assert "127.0.0.1" in federation.address
        nodes = federation.registered_nodes()
        assert {str(node.node_id) for node in federation.nodes} == {
            str(entry["node-id"]) for entry in nodes if entry["status"] == "online"
        }
        config_toml = (federation.flwr_home / "config.toml").read_text()
        assert "[superlink.smoke]" in config_toml and "root-certificates" in config_toml

        outcome = federation.run(app, {"token": "tls ok"}, timeout=90)
        assert outcome.ok, outcome.output[-3000:]
        assert outcome.status == "finished:completed"
        assert "answers=['Clinic A|tls ok|0.5', 'Clinic B|tls ok|1.5']" in outcome.output

        failed = federation.run(app, {"token": "fail"}, timeout=90)
        assert failed.returncode == 0, "flwr run exits 0 even when the ServerApp failed"
        assert not failed.ok and failed.server_exit_code is not None
        assert failed.status == "finished:failed"
        for node in federation.nodes:  # each site's own executor ran its tasks; nobody else can take them
            assert node.executor is not None and node.executor.alive()
            assert "--isolation" in node.process.popen.args
            secret = (federation.workdir / f"supernode-{node.site_id}" / "superexec-auth.secret").read_bytes()
            assert not acquire_task(node.port, secret).HasField("task")
            for wrong in (None, b"not the secret"):
                with pytest.raises(httpx.HTTPStatusError):
                    acquire_task(node.port, wrong)
    print(f"\nstartup {startup_s:.1f} s, smoke run {outcome.duration_s:.1f} s")
    assert not federation.alive_pids()
    assert not any(pid_alive(pid) for pid in leaders(federation))


# ------------------------------------------------------------------------------------------------
# (3) an unregistered SuperNode is refused, (4) a wrong CA cannot connect
# ------------------------------------------------------------------------------------------------


def test_unregistered_supernode_is_refused(tmp_path: Path, federations: list[Federation]) -> None:
    federation = Federation(tmp_path / "fed", [], name="auth")
    federations.append(federation)
    with federation:
        rogue_keys = make_node_keys(tmp_path / "rogue", site_id=66)
        with pytest.raises(DeploymentError, match="is not registered") as error:
            federation.add_node({"site": "rogue"}, keys=rogue_keys, register=False, site_id=66)
        assert str(rogue_keys.public_key) in str(error.value)
        rogue = federation.nodes[-1]
        assert "[code: 2004] Failed to activate SuperNode" in rogue.process.log_path.read_text()
        assert federation.superlink is not None
        superlink_log = federation.superlink.log_path.read_text()
        assert "No SuperNode found with the given public key" in superlink_log
        assert federation.registered_nodes() == []
        assert not rogue.process.alive_pids()


def test_supernode_with_wrong_ca_cannot_connect(tmp_path: Path, federations: list[Federation]) -> None:
    federation = Federation(tmp_path / "fed", [], name="tls")
    federations.append(federation)
    with federation:
        wrong_ca = make_certificates(tmp_path / "other-ca").ca_cert
        with pytest.raises(DeploymentError, match="--root-certificates .*wrong CA") as error:
            federation.add_node({"site": "misconfigured"}, root_certificates=wrong_ca)
        assert str(wrong_ca) in str(error.value)
        node = federation.nodes[-1]
        assert "CERTIFICATE_VERIFY_FAILED" in node.process.log_path.read_text()
        statuses = {entry["status"] for entry in federation.registered_nodes()}
        assert statuses == {"registered"}, "registered, but never online"
        missing = tmp_path / "absent-ca.crt"
        with pytest.raises(DeploymentError, match="--root-certificates: file not found"):
            federation.add_node({"site": "x"}, root_certificates=missing)


def test_keyboard_interrupt_stops_every_process(tmp_path: Path, federations: list[Federation]) -> None:
    federation = Federation(tmp_path / "fed", [{"site": "only"}], name="ctrlc")
    federations.append(federation)
    with pytest.raises(KeyboardInterrupt):
        with federation:
            started = leaders(federation)
            assert all(pid_alive(pid) for pid in started)
            raise KeyboardInterrupt
    assert not federation.alive_pids()
    assert not any(pid_alive(pid) for pid in started)
