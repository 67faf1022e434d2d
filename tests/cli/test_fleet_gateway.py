"""The Fleet-only gateway forwards exactly the Fleet calls it checked, and nothing that normalises elsewhere.

A recording HTTPS server stands in for the SuperLink, so every request target is sent byte for byte
(``http.client`` does not normalise, as ``curl --path-as-is`` does not) and we see exactly what would have
reached the SuperLink. The end-to-end proof with real Flower processes is tests/cli/test_pilot_registration.py.
"""

from __future__ import annotations

import http.client
import re
import ssl
from pathlib import Path

import pytest

from cli.deployment.certificates import CertPaths, make_certificates
from cli.deployment.fleet_gateway import FLEET_CALLS, FleetGateway, fleet_call
from cli.deployment.http_service import HttpService, QuietHandler, https_server
from cli.deployment.processes import LOOPBACK

BYPASSES = [
    "/v1/fleet/../control/list-nodes",
    "/v1/fleet/../control/register-node",
    "/v1/fleet/%2e%2e/control/list-nodes",
    "/v1/fleet/%2E%2E/control/list-nodes",
    "/v1/fleet/..%2fcontrol/list-nodes",
    "/v1/fleet/..%2Fcontrol/start-run",
    "/v1/fleet/.%2e/control/list-nodes",
    "/v1/fleet/./../control/list-nodes",
    "/v1/fleet//../control/list-nodes",
    "/v1/fleet/..\\control/list-nodes",
    "/v1/fleet/%252e%252e/control/list-nodes",
    "/v1//fleet/pull-messages",
    "//v1/fleet/pull-messages",
    "/v1/fleet/pull-messages?x=/../control",
    "/v1/fleet/pull-messages#frag",
    "/v1/fleet/pull-messages/..",
    "/v1/fleet/",
    "/v1/fleet",
    "/v1/control/list-nodes",
    "/v1/runtime/pull-messages",
    "https://127.0.0.1/v1/control/list-nodes",
    "/V1/fleet/pull-messages",
    "/v1/fleet/register-node",
    "/v1/fleet/unregister-node",
    "/v1/fleet/list-nodes",
]


@pytest.mark.parametrize("target", BYPASSES)
def test_anything_but_one_plain_fleet_call_is_refused(target: str) -> None:
    assert fleet_call(target) is None


@pytest.mark.parametrize("call", sorted(FLEET_CALLS))
def test_each_call_of_a_registered_supernode_is_forwarded_unchanged(call: str) -> None:
    assert fleet_call(f"/v1/fleet/{call}") == f"/v1/fleet/{call}"


def test_every_fleet_call_flower_makes_but_self_registration_is_forwarded() -> None:
    """The allow-list matches what Flower 1.42's SuperNode calls: a new Flower call shows up here."""
    import flwr.supernode.fleet_http_client as client

    made = set(re.findall(r'"/v1/fleet/([a-z-]+)"', Path(client.__file__).read_text()))
    assert made - {"register-node", "unregister-node"} == set(FLEET_CALLS)


class _Recorder(HttpService):
    """An HTTPS server that answers 200 and records every request target it received."""

    def __init__(self, certs: CertPaths) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(QuietHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                seen.append(self.path)
                self.send_body(200, b"{}", "application/json")

            do_GET = do_POST  # noqa: N815

        super().__init__(https_server((LOOPBACK, 0), Handler, certs.server_cert, certs.server_key), "recorder")


def post_as_is(port: int, ca_cert: Path, target: str) -> int:
    """The status of a POST to `target`, sent byte for byte over TLS."""
    context = ssl.create_default_context(cafile=str(ca_cert))
    connection = http.client.HTTPSConnection(LOOPBACK, port, context=context, timeout=30)
    try:
        connection.request("POST", target, body=b"x", headers={"Content-Type": "application/protobuf"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_no_bypass_reaches_the_superlink_and_a_fleet_call_does(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    with _Recorder(certs) as upstream, FleetGateway(certs, upstream.port) as gateway:
        # http.server itself collapses a leading "//" to "/", so that one arrives as a plain Fleet call
        refused = [target for target in BYPASSES if not target.startswith("//")]
        statuses = {target: post_as_is(gateway.port, certs.ca_cert, target) for target in refused}
        assert post_as_is(gateway.port, certs.ca_cert, "/v1/fleet/pull-messages") == 200
    assert set(upstream.seen) == {"/v1/fleet/pull-messages"}, upstream.seen
    assert all(status in (400, 403, 404) for status in statuses.values()), statuses
    assert [entry.split(" ", 1)[1] for entry in gateway.refused] == refused
