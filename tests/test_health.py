"""The health server over real HTTP: liveness by heartbeat, readiness by state, Prometheus metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from patcher.health import Health, HealthServer, Metrics, parse_listen
from patcher.kube.status import NodeState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def health(metrics: Metrics, clock: Clock) -> Health:
    return Health(max_age=30.0, metrics=metrics, clock=clock)


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


def test_metrics_text(server: HealthServer, health: Health, metrics: Metrics) -> None:
    health.set_state(NodeState.WAITING_FOR_RESTART)
    metrics.reconciled()
    metrics.reconciled()
    metrics.wrote()
    metrics.restored()
    metrics.rolled_back()
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
    assert states == {str(st): (1.0 if st is NodeState.WAITING_FOR_RESTART else 0.0) for st in NodeState}
    assert s[("scheduler_patcher_restart_seconds_count", ())] == 2
    assert s[("scheduler_patcher_restart_seconds_sum", ())] == pytest.approx(49.2)
    assert s[("scheduler_patcher_restart_seconds_bucket", (("le", "5.0"),))] == 1
    assert s[("scheduler_patcher_restart_seconds_bucket", (("le", "60.0"),))] == 2
    health.set_state(NodeState.READY)
    states = {dict(labels)["state"]: v for (name, labels), v in samples(server).items()
              if name == "scheduler_patcher_state"}
    assert states["Ready"] == 1 and sum(states.values()) == 1


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.wrote()
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
