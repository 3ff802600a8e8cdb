"""Real extender stand-ins on 127.0.0.1: HTTP and HTTPS servers, and a CA made for the test with openssl.

Paths: ``/filter`` answers like an extender (200, an ``ExtenderFilterResult``), ``/fail`` with 500, ``/html``
with a 200 that is not JSON. Every request body is recorded. ``Pki`` writes a CA, a server certificate (for
``127.0.0.1`` and ``localhost``, or only for a given name) and a client certificate into a folder.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

FILTER_RESULT: dict[str, object] = {"nodes": None, "nodenames": [], "failedNodes": {},
                                   "failedAndUnresolvableNodes": {}, "error": ""}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@dataclass
class Pki:
    folder: Path

    @classmethod
    def make(cls, folder: Path, *, server_names: str = "IP:127.0.0.1,DNS:localhost") -> Pki:
        """A CA, a server certificate with ``server_names`` and a client certificate, all signed by the CA."""
        if shutil.which("openssl") is None:
            pytest.skip("openssl CLI not found: the TLS probe tests need it to make a test CA")
        folder.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                 "-subj", "/CN=scheduler-patcher test CA", cwd=folder)
        for name, ext in (("server", f"subjectAltName={server_names}\nextendedKeyUsage=serverAuth"),
                          ("client", "extendedKeyUsage=clientAuth")):
            (folder / f"{name}.ext").write_text(ext + "\n")
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                     "-subj", f"/CN={name}", cwd=folder)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=folder)
        return cls(folder)

    def path(self, name: str) -> Path:
        return self.folder / name


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ExtenderServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append((self.path, self.rfile.read(length)))
        limit = self.server.answers
        if self.path.endswith("/fail") or (limit is not None and len(self.server.bodies) > limit):
            self._send(500, b'{"error":"boom"}')
        elif self.server.passthrough and self.path.endswith("/filter"):
            args = json.loads(self.server.bodies[-1][1] or b"{}")
            kept = {"nodes": args.get("nodes") or args.get("Nodes"),
                    "nodenames": args.get("nodenames") or args.get("NodeNames")}
            self._send(200, json.dumps({**FILTER_RESULT, **kept}).encode())
        elif self.path.endswith("/html"):
            self._send(200, b"<html>it works</html>", "text/html")
        else:
            self._send(200, json.dumps(FILTER_RESULT).encode())

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def free_port() -> int:
    """A port nothing listens on now (connections are refused) for an extender that comes up later."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExtenderServer(http.server.ThreadingHTTPServer):
    """An extender on 127.0.0.1; with ``pki`` it speaks TLS, and with ``client_ca`` it demands a client cert."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, pki: Pki | None = None, *, client_ca: bool = False, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.bodies: list[tuple[str, bytes]] = []
        #: Answer this many requests, then fail every later one with 500 (None: never fail).
        self.answers: int | None = None
        #: Answer a filter call as an extender that keeps every node (what a real scheduler needs to bind a pod).
        self.passthrough = False
        self.scheme = "http"
        if pki is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(pki.path("server.crt"), pki.path("server.key"))
            if client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(pki.path("ca.crt"))
            self.socket = ctx.wrap_socket(self.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gives up the TLS handshake is what some tests do on purpose

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> ExtenderServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
