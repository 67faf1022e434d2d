"""A Fleet-only TLS gateway: what the sites may reach of the SuperLink, and nothing else.

Flower 1.42 serves its Fleet, Control and Runtime APIs on one HTTPS port (``flower-superlink --host --port``),
and without Flower Enterprise the Control API has no login (``NoOpControlAuthnPlugin``: OIDC needs
``flwr.ee``). Whoever reaches that port with ``ca.crt`` can therefore register a key
(``flwr supernode register``), start or stop runs. The pilot binds the SuperLink to 127.0.0.1 and gives the
sites this gateway's address instead: it terminates TLS with the SuperLink's certificate and forwards only
the Fleet API calls a registered SuperNode makes to the SuperLink; every other request gets 403 without reaching it.
The SuperNode's authentication headers pass through unchanged, so SuperNode auth still holds.

The decision is made on the exact path that is forwarded, never on a prefix of a path that something
downstream may still normalise: a Fleet call is ``/v1/fleet/<endpoint>`` with one segment of lower-case
letters, digits and dashes, and nothing else. ``/v1/fleet/../control/...``, percent-encoded dots or
slashes, doubled slashes, backslashes, a query or an absolute-form target are all refused
(docs/pilot-security.md).
"""

from __future__ import annotations

import json
import re
import ssl

import httpx

from cli.deployment.certificates import CertPaths
from cli.deployment.http_service import HttpService, QuietHandler, https_server
from cli.deployment.processes import LOOPBACK

FLEET_CALLS = frozenset({
    "activate-node", "deactivate-node", "send-node-heartbeat", "get-run", "get-fab",
    "pull-messages", "push-messages", "pull-object", "push-object", "confirm-message-received",
})
"""The Fleet API calls of Flower 1.42 that a registered SuperNode makes (flwr/supernode/fleet_http_client.py).
Fleet's own register-node and unregister-node (self-registration, refused by the SuperLink under SuperNode
authentication) are not forwarded either: joining is the operator's act alone."""
_FLEET_CALL = re.compile(r"/v1/fleet/([a-z][a-z0-9-]{0,63})")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


class FleetGateway(HttpService):
    """A threaded HTTPS server on ``host`` forwarding ``/v1/fleet/*`` to the SuperLink on ``upstream_port``.

    Use as a context manager. ``refused`` counts the requests it turned away (for the report and the tests).
    """

    def __init__(self, certs: CertPaths, upstream_port: int, host: str = LOOPBACK, port: int = 0) -> None:
        self.upstream = f"https://{LOOPBACK}:{upstream_port}"
        self.refused: list[str] = []
        self._client = httpx.Client(verify=ssl.create_default_context(cafile=str(certs.ca_cert)), timeout=120.0)
        server = https_server((host, port), _handler_for(self), certs.server_cert, certs.server_key)
        super().__init__(server, "fleet-gateway")

    def close(self) -> None:
        self._client.close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> httpx.Response | None:
        """The SuperLink's answer to a Fleet call, or None (refused) for any other request target."""
        call = fleet_call(path)
        if call is None:
            self.refused.append(f"{method} {path}")
            return None
        kept = {name: value for name, value in headers.items() if name.lower() not in _HOP_BY_HOP}
        url = httpx.URL(self.upstream).copy_with(raw_path=call.encode("ascii"))
        return self._client.request(method, url, headers=kept, content=body)


def fleet_call(target: str) -> str | None:
    """`target` itself when it is exactly one of the FLEET_CALLS (``/v1/fleet/<call>``), else None.

    Only a path that no normalisation can change is accepted, so the path that is checked is the path
    the SuperLink sees: no dot segment, no percent-encoding, no second slash, no query, one segment.
    """
    match = _FLEET_CALL.fullmatch(target)
    return target if match and match.group(1) in FLEET_CALLS else None


def _handler_for(gateway: FleetGateway) -> type[QuietHandler]:
    class Handler(QuietHandler):
        """Every method goes through `FleetGateway.forward`; refused or failed requests get a JSON detail."""

        protocol_version = "HTTP/1.1"

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
            try:
                answer = gateway.forward(self.command, self.path, dict(self.headers.items()), body)
            except httpx.HTTPError as error:
                return self._send(502, {"detail": f"SuperLink unreachable: {type(error).__name__}"})
            if answer is None:
                return self._send(403, {"detail": f"{self.path}: only the Fleet API is served here"})
            self.send_response(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() not in _HOP_BY_HOP | {"content-encoding"}:  # httpx decoded the body
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay  # noqa: N815 (http.server's naming)

        def _send(self, status: int, payload: dict[str, str]) -> None:
            self.send_body(status, json.dumps(payload).encode(), "application/json")

    return Handler
