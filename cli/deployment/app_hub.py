"""A stand-in for Flower Hub on loopback: serves signed FABs to the SuperLink, which passes them to the sites.

Flower 1.42 attaches verification records (signatures) to a run's FAB only when the SuperLink fetched it
from Flower Hub: ``flwr run @publisher/app==x.y.z`` makes the SuperLink POST ``{app_id, app_version}`` to
``$FLWR_SUPERGRID_API_URL/hub/fetch-fab``, read ``fab_url`` and ``verifications`` from the answer and GET
the FAB from ``fab_url`` (flwr/superlink/servicer/control/control_handlers.py, ``_get_remote_fab``). The
pilot has no network, so `AppHub` answers those two requests itself. It is trusted with nothing: each site
checks the signature with its own copy of the reviewer's public key (cli/deployment/app_signing.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from cli.deployment.app_signing import Verification
from cli.deployment.http_service import HttpService, QuietHandler
from cli.deployment.processes import LOOPBACK

FETCH_PATH = "/hub/fetch-fab"
_FAB_PREFIX = "/fab/"


@dataclass
class PublishedApp:
    """One app version on the hub: its FAB and the signatures that come with it."""

    app_id: str  # "@publisher/name"
    version: str  # "x.y.z"
    fab: bytes
    verifications: list[Verification] = field(default_factory=list)

    @property
    def fab_hash(self) -> str:
        """The FAB's sha256, hex: its name under /fab/."""
        return hashlib.sha256(self.fab).hexdigest()


class AppHub(HttpService):
    """A threaded HTTP server on 127.0.0.1 answering Flower's ``fetch-fab`` and FAB downloads.

    Use as a context manager; ``url`` is what the SuperLink gets as ``FLWR_SUPERGRID_API_URL``.
    """

    def __init__(self) -> None:
        self.apps: dict[tuple[str, str], PublishedApp] = {}
        self.requests: list[dict[str, object]] = []
        super().__init__(ThreadingHTTPServer((LOOPBACK, 0), _handler_for(self)), "app-hub")

    @property
    def url(self) -> str:
        """The hub's base URL (``http://127.0.0.1:<port>``)."""
        return f"http://{LOOPBACK}:{self.port}"

    def publish(self, app: PublishedApp) -> str:
        """Serve ``app`` (replacing an earlier FAB of the same id and version); return its ``flwr run`` spec."""
        self.apps[(app.app_id, app.version)] = app
        return f"{app.app_id}=={app.version}"

    def fetch(self, body: dict[str, object]) -> tuple[int, dict[str, object]]:
        """Flower Hub's ``fetch-fab`` answer for ``{app_id, app_version}``: 404 with a detail if unknown."""
        self.requests.append(body)
        key = (str(body.get("app_id")), str(body.get("app_version")))
        app = self.apps.get(key)
        if app is None:
            return 404, {"detail": f"{key[0]}=={key[1]} is not published on this hub"}
        records: list[object] = [record.as_hub_record() for record in app.verifications]
        return 200, {"fab_url": f"{self.url}{_FAB_PREFIX}{app.fab_hash}", "verifications": records}

    def fab_by_hash(self, fab_hash: str) -> bytes | None:
        """A published FAB's bytes by its sha256, or None."""
        return next((app.fab for app in self.apps.values() if app.fab_hash == fab_hash), None)


def _handler_for(hub: AppHub) -> type[QuietHandler]:
    class Handler(QuietHandler):
        """POST /hub/fetch-fab (JSON) and GET /fab/<sha256> (the FAB's bytes); anything else is 404."""

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != FETCH_PATH:
                return self.send_body(404, b'{"detail": "not found"}', "application/json")
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            except ValueError:
                return self.send_body(400, b'{"detail": "body is not JSON"}', "application/json")
            status, answer = hub.fetch(body if isinstance(body, dict) else {})
            self.send_body(status, json.dumps(answer).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802
            fab = hub.fab_by_hash(self.path.removeprefix(_FAB_PREFIX)) if self.path.startswith(_FAB_PREFIX) else None
            if fab is None:
                return self.send_body(404, b"not found", "text/plain")
            self.send_body(200, fab, "application/octet-stream")

    return Handler
