"""``adapters/kubelet.KubeletHealth`` against real sockets on loopback: a kubelet healthz that answers 200, one
that answers 500, one that accepts and never answers, and a port nobody listens on (a stopped kubelet)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from patcher.adapters.kubelet import KubeletHealth

#: Generous for a server that answers (a busy 2-core machine); the hanging one gets ``HANG``.
ANSWER = 10.0
HANG = 0.2


@contextmanager
def healthz(status: list[int]) -> Iterator[str]:
    """A kubelet-like /healthz answering ``status[0]`` (change it to change the answer)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"ok" if status[0] == 200 else b"[-]syncloop failed: reason withheld"
            self.send_response(status[0])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def test_a_healthy_kubelet_is_not_down_and_arms_the_check() -> None:
    with healthz([200]) as url:
        k = KubeletHealth(url, timeout=ANSWER)
        assert k.down() == "" and k.armed


def test_a_kubelet_that_answers_500_is_down_with_its_answer() -> None:
    with healthz([500]) as url:
        why = KubeletHealth(url, timeout=ANSWER).down()
    assert why.startswith(f"{url} answered 500") and "syncloop failed" in why


def test_a_kubelet_that_stops_after_answering_is_down_and_back_once_it_answers_again() -> None:
    status = [200]
    with healthz(status) as url:
        k = KubeletHealth(url, timeout=ANSWER)
        assert k.down() == ""
        port = url.split(":")[2].split("/")[0]
    # The server is gone: the port refuses, as a stopped kubelet's does.
    assert k.down() == f"http://127.0.0.1:{port}/healthz refused the connection"


def test_a_refusing_endpoint_that_never_answered_is_no_verdict() -> None:
    """Not reachable from this agent (no hostNetwork, another port): never a reason to hold every write."""
    k = KubeletHealth(f"http://127.0.0.1:{closed_port()}/healthz", timeout=ANSWER)
    assert k.down() == "" and not k.armed


def test_a_kubelet_that_accepts_and_never_answers_is_down_within_the_deadline() -> None:
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(8)  # the kernel completes the handshake; nobody reads or answers
    try:
        k2 = KubeletHealth(f"http://127.0.0.1:{hang.getsockname()[1]}/healthz", timeout=HANG)
        k2.armed = True  # as after an earlier answer
        assert k2.down().endswith(f"did not answer within {HANG:g}s")
    finally:
        hang.close()


@pytest.mark.parametrize("url", ["", "https://127.0.0.1:10248/healthz", "127.0.0.1:10248"])
def test_an_empty_or_non_http_address_turns_the_check_off(url: str) -> None:
    k = KubeletHealth(url, timeout=HANG)
    assert not k.enabled and k.down() == ""
