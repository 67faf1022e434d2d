"""A threaded HTTP(S) server on its own daemon thread, started and stopped as a context manager.

What the pilot's two loopback servers share: the Flower Hub stand-in (cli/deployment/app_hub.py) and the Fleet-only
gateway (cli/deployment/fleet_gateway.py).
"""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self


def https_server(
    address: tuple[str, int], handler: type[BaseHTTPRequestHandler], cert: Path, key: Path
) -> ThreadingHTTPServer:
    """A threaded HTTP server on `address` that speaks TLS with the certificate `cert` and its key `key`."""
    server = ThreadingHTTPServer(address, handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


class HttpService:
    """Serves `server` from a daemon thread named `name` between __enter__ and __exit__."""

    def __init__(self, server: ThreadingHTTPServer, name: str) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        """The port it serves on."""
        return int(self._server.server_address[1])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.close()

    def close(self) -> None:
        """What a service releases once its server has stopped (nothing by default)."""


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that writes no access log (the services keep what they need) and sends bodies whole."""

    def send_body(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Quiet: the SuperLink's log and the services' own records say what was served."""
