"""The real-cluster harness never hands a child process a port that someone else may take first.

`free_port()` binds port 0, reads the port and closes it: from then until the child binds it (5-18 s for a
gatekeeper on a busy 2-core machine, most of it Python's imports) the port is free for any other bind to port
0, another `free_port()` of the other xdist worker's fixture among them. A gatekeeper that loses its port exits
1 at once ("cannot start the gatekeeper: [Errno 98] Address already in use"), and tests/real/test_real_rbac.py's
`gate_cases` then waited its whole 180 s for that gatekeeper to be refused or to meet the hold. Two `gate_cases`
fixtures at once (one per worker) hand out 22 such ports: one port to two children in ~1.7 % of such pairs
(birthday odds over the ~14 000 odd ports Linux gives a bind to port 0). So the children bind port 0 and
report what they bound; `listening_port` reads it back from their log.

No cluster here: the gatekeeper starts, and binds, before it first asks its (absent) API server anything.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.real.controlplane import listening_port
from tests.real.test_real_nodes import gatekeeper


class NoPlane:
    """What `gatekeeper` needs of a ControlPlane: a kubeconfig (here of a server that is not there)."""

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [{"name": "c", "user": {"token": "unused"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "c"}}]}))
        return path


@pytest.fixture
def taken_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port another process listens on, and the answer of every `free_port` the harness might ask: the race
    lost, every time."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port: int = other.getsockname()[1]
        for module in ("tests.harness.real.controlplane", "tests.real.test_real_nodes", "tests.harness.real.simnodes"):
            monkeypatch.setattr(f"{module}.free_port", lambda: port, raising=False)
        yield port


def test_a_gatekeeper_serves_on_the_port_it_bound_itself(tmp_path: Path, taken_port: int) -> None:
    proc, log = gatekeeper(NoPlane(), tmp_path, "ns", "example.com/gate", "gk")  # type: ignore[arg-type]
    try:
        port = listening_port(proc, log, timeout=60)
        assert port != taken_port
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(64).startswith(b"HTTP/1.1 ")
        assert proc.poll() is None, log.read_text()
    finally:
        proc.kill()
        proc.wait(10)


def test_listening_port_fails_at_once_for_a_child_that_exited(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["sh", "-c", "echo 'cannot start: [Errno 98] Address already in use'; exit 1"],
                                stdout=out, stderr=subprocess.STDOUT)
    proc.wait(10)
    with pytest.raises(AssertionError, match=r"exited with 1 before listening:\n.*Errno 98"):
        listening_port(proc, log, timeout=60)
