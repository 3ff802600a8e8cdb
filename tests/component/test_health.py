"""The health server over real HTTP: liveness by heartbeat, readiness by state, Prometheus metrics."""

from __future__ import annotations

import collections
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import patcher
from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.adapters.httpserver import MAX_REQUEST_HEAD, parse_listen
from patcher.core.status import NodeState
from tests.harness.emu.kubeemu import wait_until
from tests.harness.emu.loadgen import burst, get_once
from tests.harness.helpers import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def health(clock: Clock) -> Health:
    return Health(max_age=30.0, clock=clock)


@pytest.fixture
def server(health: Health, metrics: Metrics) -> Iterator[HealthServer]:
    with HealthServer(health, metrics, "127.0.0.1:0") as s:
        yield s


def get(server: HealthServer, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_healthz_follows_the_heartbeat(server: HealthServer, health: Health, clock: Clock) -> None:
    assert get(server, "/healthz")[0] == 503  # no beat yet
    health.beat()
    assert get(server, "/healthz")[:3:2] == (200, "ok\n")
    clock.now += 29
    assert get(server, "/healthz")[0] == 200
    clock.now += 2
    assert get(server, "/healthz") == (503, "text/plain; charset=utf-8", "agent loop stalled\n")


def test_livez_is_healthz(server: HealthServer, health: Health, clock: Clock) -> None:
    assert get(server, "/livez")[0] == 503
    health.beat()
    assert get(server, "/livez") == get(server, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")


def test_readyz_only_when_ready_and_alive(server: HealthServer, health: Health, clock: Clock) -> None:
    health.beat()
    for state in NodeState:
        health.set_state(state)
        code, _, body = get(server, "/readyz")
        assert (code == 200) == (state is NodeState.READY), state
        if code != 200:
            assert body == f"state {state}\n"
    clock.now += 60  # Ready, but the loop stopped beating: it can no longer vouch for that
    assert get(server, "/readyz")[0] == 503


def test_unknown_path(server: HealthServer) -> None:
    assert get(server, "/nope")[0] == 404


def samples(server: HealthServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, ctype, text = get(server, "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_text(server: HealthServer, metrics: Metrics) -> None:
    metrics.set_state(NodeState.WAITING_FOR_RESTART)
    metrics.count("reconciled")
    metrics.count("reconciled")
    metrics.count("wrote")
    metrics.count("restored")
    metrics.count("rolled_back")
    metrics.error("api")
    metrics.error("api")
    metrics.error("manifest")
    metrics.restart_seen(4.2)
    metrics.restart_seen(45.0)
    s = samples(server)
    assert s[("scheduler_patcher_reconciles_total", ())] == 2
    assert s[("scheduler_patcher_writes_total", ())] == 1
    assert s[("scheduler_patcher_restores_total", ())] == 1
    assert s[("scheduler_patcher_rollbacks_total", ())] == 1
    assert s[("scheduler_patcher_errors_total", (("kind", "api"),))] == 2
    assert s[("scheduler_patcher_errors_total", (("kind", "manifest"),))] == 1
    states = {dict(labels)["state"]: v for (name, labels), v in s.items() if name == "scheduler_patcher_state"}
    assert states == {str(st): (1.0 if st is NodeState.WAITING_FOR_RESTART else 0.0) for st in NodeState
                      if st is not NodeState.HELD}  # Held is the Node's word for a hold, with a gauge of its own
    assert s[("scheduler_patcher_held", ())] == 0
    metrics.set_held(True)
    assert samples(server)[("scheduler_patcher_held", ())] == 1
    assert s[("scheduler_patcher_restart_seconds_count", ())] == 2
    assert s[("scheduler_patcher_restart_seconds_sum", ())] == pytest.approx(49.2)
    assert s[("scheduler_patcher_restart_seconds_bucket", (("le", "5.0"),))] == 1
    assert s[("scheduler_patcher_restart_seconds_bucket", (("le", "60.0"),))] == 2
    metrics.set_state(NodeState.READY)
    states = {dict(labels)["state"]: v for (name, labels), v in samples(server).items()
              if name == "scheduler_patcher_state"}
    assert states["Ready"] == 1 and sum(states.values()) == 1


def test_probe_refusal_and_config_series(server: HealthServer, metrics: Metrics) -> None:
    """The series the alert rules and the dashboard read (charts/scheduler-patcher/files/): present from the first
    scrape where an alert compares them to a number, absent where a label would have nothing to say."""
    s = samples(server)
    assert s[("scheduler_patcher_extenders_unreachable", (("ignorable", "false"),))] == 0
    assert s[("scheduler_patcher_extenders_unreachable", (("ignorable", "true"),))] == 0
    assert s[("scheduler_patcher_source_refused", ())] == 0
    assert s[("scheduler_patcher_extender_probe_seconds_count", ())] == 0
    assert not any(name == "scheduler_patcher_config_info" for name, _ in s)  # no config yet: no series
    metrics.extenders_probed([0.004, 0.3, 5.0], unreachable=1, unreachable_ignorable=2)
    metrics.source_refused(True)
    metrics.set_config("a" * 64, "b" * 64)
    s = samples(server)
    assert s[("scheduler_patcher_extenders_unreachable", (("ignorable", "false"),))] == 1
    assert s[("scheduler_patcher_extenders_unreachable", (("ignorable", "true"),))] == 2
    assert s[("scheduler_patcher_source_refused", ())] == 1
    assert s[("scheduler_patcher_extender_probe_seconds_count", ())] == 3
    assert s[("scheduler_patcher_extender_probe_seconds_bucket", (("le", "0.005"),))] == 1
    assert s[("scheduler_patcher_extender_probe_seconds_bucket", (("le", "0.5"),))] == 2
    assert s[("scheduler_patcher_extender_probe_seconds_sum", ())] == pytest.approx(5.304)
    assert s[("scheduler_patcher_config_info", (("config_hash", "a" * 64), ("source_hash", "b" * 64)))] == 1
    metrics.extenders_probed([], unreachable=0, unreachable_ignorable=0)  # the next round replaces the gauges
    metrics.set_config("", "")
    s = samples(server)
    assert s[("scheduler_patcher_extenders_unreachable", (("ignorable", "true"),))] == 0
    assert not any(name == "scheduler_patcher_config_info" for name, _ in s)


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.count("wrote")
    assert b"scheduler_patcher_writes_total 1.0" in a.render()
    assert b"scheduler_patcher_writes_total 0.0" in b.render()


@pytest.mark.parametrize(
    ("listen", "parsed"),
    [(":9808", ("", 9808)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9808", ("::1", 9808))],
)
def test_parse_listen(listen: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(listen) == parsed


@pytest.mark.parametrize("listen", ["9808", "host:", "host:port", ":70000"])
def test_parse_listen_rejects(listen: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(listen)


def test_no_created_series_and_build_info_and_process_metrics(server: HealthServer) -> None:
    _, _, text = get(server, "/metrics")
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert not [n for n in names if n.endswith("_created")]
    s = samples(server)
    info = [labels for (name, labels), value in s.items() if name == "scheduler_patcher_build_info" and value == 1]
    assert len(info) == 1 and dict(info[0])["version"] == patcher.__version__ and dict(info[0])["python_version"]
    if Path("/proc/self/stat").exists():  # the process collector reads /proc (Linux)
        assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} <= names


def test_an_unverified_restart_adds_no_histogram_sample(server: HealthServer, metrics: Metrics) -> None:
    metrics.restart_seen(None)
    assert samples(server)[("scheduler_patcher_restart_seconds_count", ())] == 0
    metrics.restart_seen(3.0)
    assert samples(server)[("scheduler_patcher_restart_seconds_count", ())] == 1


def raw(server: HealthServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_head_and_other_methods_and_garbage(server: HealthServer, health: Health) -> None:
    health.beat()
    head = raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 3\r\n" in head and head.endswith(b"\r\n\r\n")
    assert raw(server, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw(server, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize("value", [b"\xc274", "\u0663".encode(), b"1 2", b"-1"],
                         ids=["byte-outside-ascii", "arabic-indic-digit", "two-numbers", "negative"])
def test_a_content_length_that_is_not_ascii_digits_gets_411(server: HealthServer, value: bytes) -> None:
    # email's parser gives a value with bytes outside ASCII back as a Header, not a str (found by the fuzzer)
    answer = raw(server, b"POST /healthz HTTP/1.1\r\nHost: x\r\nConnection: \xc2close\r\nContent-Length: " + value
                 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 411 ")


def closed_after(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset or a client timeout raises instead)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_100_kb_request_line_gets_414_and_the_connection_is_closed(server: HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = closed_after(sock)
    assert answer.startswith(b"HTTP/1.1 414 URI Too Long\r\n") and b"Connection: close\r\n" in answer


def test_a_70_kb_header_gets_431_and_the_connection_is_closed(server: HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n")
        answer = closed_after(sock)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


def test_a_head_just_within_the_limit_is_served(server: HealthServer, health: Health) -> None:
    health.beat()
    request = b"GET /healthz HTTP/1.1\r\nX-Pad: "
    request += b"p" * (MAX_REQUEST_HEAD - len(request) - 4) + b"\r\n\r\n"
    assert len(request) == MAX_REQUEST_HEAD
    assert raw(server, request).startswith(b"HTTP/1.1 200 OK\r\n")


# -- under load: counts, never durations; the latency figures are in bench/probe_burst.py --


def ready_server(**kw: float) -> HealthServer:
    metrics = Metrics()
    health = Health()
    health.beat()
    health.set_state(NodeState.READY)
    return HealthServer(health, metrics, "127.0.0.1:0", **kw)  # type: ignore[arg-type]


def closed_now(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (it sends nothing else here): reads without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False


def test_a_burst_of_1000_requests_is_answered_in_full() -> None:
    with ready_server() as server:
        result = burst("127.0.0.1", server.port, requests=1000, concurrency=100, timeout=60.0)
        assert result.outcomes == {"200": 1000}


def test_connections_that_arrive_before_the_server_accepts_wait_in_the_backlog() -> None:
    """300 connections while nothing accepts: all complete their handshake (a backlog of 5 would drop the
    SYNs beyond it, and those connects would hang), and all are answered once the server runs, the ones
    beyond the connection cap after the first ones are done."""
    server = ready_server()
    socks = []
    try:
        for _ in range(300):
            socks.append(socket.create_connection(("127.0.0.1", server.port), timeout=20))
            socks[-1].sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        server.start()
        answers = []
        for sock in socks:
            sock.settimeout(60)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            answers.append(data.split(b" ", 2)[1])
        assert collections.Counter(answers) == {b"200": 300}
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def test_idle_connections_are_closed_after_the_timeout() -> None:
    with ready_server(timeout=0.2) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(20)]
        try:
            idle[0].sendall(b"GET /healthz HTTP/1.1\r\n")  # a head that never ends
            for sock in idle:  # 20 is under the cap: none was evicted, the timeout closed them
                assert sock.recv(1) == b""  # the server closed it; a client timeout would raise instead
        finally:
            for sock in idle:
                sock.close()
        assert get_once("127.0.0.1", server.port, "/readyz", 60.0)[0] == "200"


def test_idle_connections_never_hold_more_than_the_cap() -> None:
    """50 idle connections against a cap of 5, with a timeout that never fires here: the 45 oldest are closed
    (each evicted by a newer one), the 5 newest stay open, and a probe is answered afterwards (evicting one)."""
    with ready_server(max_connections=5, timeout=600.0) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=600) for _ in range(50)]
        try:
            for sock in idle[:45]:
                assert sock.recv(1) == b""  # closed by the server (a client timeout would raise)
            for sock in idle[45:]:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
            assert get_once("127.0.0.1", server.port, "/readyz", 600.0)[0] == "200"
            assert idle[45].recv(1) == b""  # the oldest one made room for the probe
        finally:
            for sock in idle:
                sock.close()


# -- slow clients holding connections open: the latency figure is in bench/probe_burst.py --


def test_500_idle_connections_do_not_keep_a_probe_waiting_the_oldest_are_evicted() -> None:
    """500 connections that send nothing against the default cap (256), with a timeout that never fires
    here: the probe is answered at once (before, it waited for the idle ones' timeout), and what made room
    for it and for the idle ones beyond the cap is the eviction of the oldest idle ones, in order."""
    with ready_server(timeout=600.0) as server:
        cap = server.max_connections
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=600) for _ in range(500)]
        try:
            status, _ = get_once("127.0.0.1", server.port, "/healthz", 600.0)
            assert status == "200"
            evicted = 500 - (cap - 1)  # the probe's slot came from one more
            for sock in idle[:evicted]:
                assert sock.recv(1) == b""  # closed by the server (a client timeout would raise)
            for sock in idle[evicted:]:  # the newest still open, nothing sent on them
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in idle:
                sock.close()


class BigBody:
    """Metrics too large for the socket buffers: a client that does not read keeps its request in progress."""

    body = b"x" * (16 << 20)

    def render(self) -> bytes:
        return self.body


def test_a_request_in_progress_is_never_evicted_a_half_sent_head_is() -> None:
    """Cap 3: one connection waits for its large answer to be read, one has sent half its head; idle
    connections arriving after them evict the oldest connection whose head is not complete (the
    half-sent one too: it would hold its slot until its timeout), never the one being answered."""
    health = Health()
    health.beat()
    with HealthServer(health, BigBody(), "127.0.0.1:0", max_connections=3, timeout=600.0,
                      head_timeout=600.0) as server:
        slow_reader = socket.socket()
        slow_reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow_reader.settimeout(600)
        slow_reader.connect(("127.0.0.1", server.port))
        slow_reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        half = socket.create_connection(("127.0.0.1", server.port), timeout=600)
        half.sendall(b"GET /healthz HTTP/1.1\r\n")
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=600) for _ in range(10)]
        try:
            assert get_once("127.0.0.1", server.port, "/healthz", 600.0)[0] == "200"
            for sock in [half, *idle[:9]]:  # evicted (the timeouts are 600 s)
                assert sock.recv(1) == b""
            idle[9].setblocking(False)
            with pytest.raises(BlockingIOError):  # the newest: still open
                idle[9].recv(1)
            answer = closed_after(slow_reader)
            assert answer.endswith(b"\r\n\r\n" + BigBody.body)
        finally:
            for sock in [slow_reader, half, *idle]:
                sock.close()


# -- half-sent requests: the latency figure is in bench/probe_burst.py --half-sent ------------------


def test_a_half_sent_head_is_closed_after_the_head_timeout_an_idle_connection_is_not() -> None:
    """The head's deadline runs from its first byte: a connection that sent nothing keeps its (long) timeout."""
    with ready_server(timeout=600.0, head_timeout=0.05) as server:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=600)
        half = socket.create_connection(("127.0.0.1", server.port), timeout=600)
        try:
            half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            assert half.recv(1) == b""  # closed by the server (a client timeout would raise instead)
            idle.setblocking(False)
            with pytest.raises(BlockingIOError):
                idle.recv(1)
            idle.setblocking(True)
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_after(idle).startswith(b"HTTP/1.1 200 OK\r\n")
        finally:
            idle.close()
            half.close()


def test_a_head_finished_in_pieces_within_the_head_timeout_is_answered() -> None:
    with ready_server(timeout=600.0, head_timeout=600.0) as server, \
            socket.create_connection(("127.0.0.1", server.port), timeout=600) as sock:
        for piece in (b"GET /healthz HTTP/1.1\r", b"\nHost: x\r\n\r", b"\n"):  # the end split across segments
            sock.sendall(piece)
        assert closed_after(sock).startswith(b"HTTP/1.1 200 OK\r\n")


def test_500_half_sent_requests_do_not_keep_a_probe_waiting() -> None:
    """500 connections that each sent a request line and a Host header and never finished their
    head, against the default cap: they count toward it as idle ones do, so the oldest are evicted to make
    room and the probe is answered at once, with no timeout firing (both are 600 s here)."""
    with ready_server(timeout=600.0, head_timeout=600.0) as server:
        cap = server.max_connections
        held = []
        try:
            for _ in range(500):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=600)
                held.append(sock)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert get_once("127.0.0.1", server.port, "/healthz", 600.0)[0] == "200"
            # As many evicted as make room (the probe's slot came from one more); mostly the oldest, but one
            # whose bytes still wait in the kernel is passed over. The others stay open.
            evicted = 500 - (cap - 1)
            assert wait_until(lambda: sum(map(closed_now, held)) == evicted, 60)
        finally:
            for sock in held:
                sock.close()
