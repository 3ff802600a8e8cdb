"""The agent's extender pre-flight, end to end on one node: the real agent loop, the API emulator, the simulated
kubelet and real extender servers on 127.0.0.1.

A non-ignorable extender that does not answer is never written into the manifest and no rollout turn is
taken; the node shows Pending with the URL and the error, a Warning Event ExtenderUnreachable is sent, and the
probe is retried until the extender comes up, when the node is patched without anyone's help. An ignorable one
is patched anyway, with the warning. A SIGTERM during a probe that would wait 30 s is handled at once.
After the restart the extenders are probed again before the node is Ready and the rollout turn passes on;
a failure there rolls back like a crash loop.
"""

from __future__ import annotations

import json
import threading

import pytest

from patcher.adapters.health import Metrics
from patcher.commands.cli import main
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.extservers import ExtenderServer, free_port
from tests.harness.helpers import KUBEADM, Node, Running, metric, wait_until
from tests.harness.helpers import node as node

LEASE = ("leases", "scheduler-patcher-rollout", "scheduler-patcher", "coordination.k8s.io")


def source(url: str, *, ignorable: bool = False, timeout: str = "1s") -> str:
    return (f"extenders:\n- urlPrefix: {url}\n  filterVerb: filter\n  weight: 1\n  httpTimeout: {timeout}\n"
            f"  ignorable: {'true' if ignorable else 'false'}\n")


def unreachable(metrics: Metrics, *, ignorable: bool = False) -> float | None:
    """The gauge the ExtenderUnreachable alert reads."""
    return metric(metrics, "scheduler_patcher_extenders_unreachable", ignorable=str(ignorable).lower())


def warnings(node: Node) -> list[str]:
    return [e["message"] for e in node.emu.events() if e["reason"] == "ExtenderUnreachable" and e["type"] == "Warning"]


def test_a_required_extender_that_does_not_answer_is_never_written_until_it_does(node: Node) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    node.set_source(source(url))
    agent = Running(node, coordinated=True, check_extenders=True, probe_retry=0.05, probe_retry_max=0.2)
    try:
        assert wait_until(lambda: "connection refused" in node.annotations().get("message", ""), 15), \
            node.annotations()
        ann = node.annotations()
        assert ann["state"] == "Pending"
        assert ann["message"].startswith(f"extender {url}/filter does not answer: connection refused; config ")
        assert ann["message"].endswith(" not written")
        assert node.manifest.read_bytes() == KUBEADM  # no write
        assert node.emu.get(*LEASE[:3], group=LEASE[3]) is None  # no turn taken
        assert wait_until(lambda: bool(warnings(node)), 10)
        assert warnings(node)[0] == ann["message"]
        assert wait_until(lambda: 'kind="extender"' in agent.metrics.render().decode(), 5)
        assert unreachable(agent.metrics) == 1 and unreachable(agent.metrics, ignorable=True) == 0
        assert (metric(agent.metrics, "scheduler_patcher_extender_probe_seconds_count") or 0) >= 1
        # the extender's DaemonSet comes up: the next retry patches, with no one touching anything
        with ExtenderServer(port=port) as server:
            assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
            assert server.bodies and json.loads(server.bodies[0][1])["Nodes"]["items"] == []
        assert node.manifest.read_bytes() != KUBEADM
        assert "message" not in node.annotations()
        assert len(warnings(node)) == 1  # one Warning per distinct failure, not one per retry
        assert unreachable(agent.metrics) == 0  # the answer that let the write through cleared it
        ann = node.annotations()
        assert metric(agent.metrics, "scheduler_patcher_config_info", config_hash=ann["config-hash"],
                      source_hash=ann["source-hash"]) == 1
    finally:
        agent.stop()


def test_an_ignorable_extender_that_does_not_answer_is_patched_with_a_warning(
        node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    node.set_source(source(url, ignorable=True))
    agent = Running(node, check_extenders=True, restore_on_exit="never")
    try:
        assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
        assert wait_until(lambda: bool(warnings(node)), 10)
        warning = warnings(node)[0]
        assert unreachable(agent.metrics, ignorable=True) == 1 and unreachable(agent.metrics) == 0
        assert warning.startswith(f"extender {url}/filter does not answer: connection refused; ignorable, so config ")
    finally:
        agent.stop()
    # `status` on the node says so too: the record keeps the last pre-flight's warning
    capsys.readouterr()
    assert main(["status", "--host-root", str(node.root), "--source", str(node.src), "-o", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["extender_warning"] == warning and status["phase"] == "Ready"


def test_a_stop_during_a_long_probe_is_handled_at_once(node: Node) -> None:
    hole = BlackHole()
    try:
        node.set_source(source(f"http://127.0.0.1:{hole.port}", timeout="30s"))
        agent = Running(node, check_extenders=True)
        assert wait_until(lambda: len(hole.conns) == 1, 10)  # the probe is in flight, waiting for an answer
        stopped = threading.Thread(target=agent.stop)
        stopped.start()
        stopped.join(15)  # far below the probe's 30 s: the probe is abandoned, not awaited
        assert not stopped.is_alive() and agent.code == 0
        assert node.manifest.read_bytes() == KUBEADM
    finally:
        hole.close()


def test_an_extender_that_fails_after_the_restart_rolls_the_canary_back(node: Node) -> None:
    with ExtenderServer() as server:
        server.answers = 1  # the pre-flight passes; the probe after the restart gets a 500
        node.set_source(source(server.url))
        agent = Running(node, coordinated=True, check_extenders=True)
        try:
            assert wait_until(lambda: node.state() == "RolledBack", 30), node.annotations()
            message = node.annotations()["message"]
            assert message.startswith(f"extender {server.url}/filter does not answer: HTTP 500 after kube-scheduler "
                                      "restarted with config ")
            assert message.endswith("rolled back to the original manifest")
            assert [path for path, _ in server.bodies] == ["/filter", "/filter"]  # before the write, after it
            assert wait_until(lambda: node.manifest.read_bytes() == KUBEADM, 10)
            def bad_sources() -> str:
                lease = node.emu.get(*LEASE[:3], group=LEASE[3]) or {}
                return str((lease.get("metadata", {}).get("annotations") or {}).get(
                    "scheduler-patcher.io/bad-source-hashes", ""))

            assert wait_until(lambda: bad_sources() != "", 10)  # no other node tries this ConfigMap
        finally:
            agent.stop()


def published_ready(node: Node) -> str | None:
    """The `ready` key of the verdict ConfigMap the agents publish (None: not published)."""
    cm = node.emu.get("configmaps", "scheduler-patcher-status", "scheduler-patcher") or {}
    ready: str | None = (cm.get("data") or {}).get("ready")
    return ready


def test_while_ready_an_extender_that_stops_answering_makes_the_verdict_not_ready(node: Node) -> None:
    from patcher.adapters.kube.client import ClientSettings, build_api_client
    from patcher.adapters.kube.cluster import collect

    with ExtenderServer() as server:
        node.set_source(source(server.url))
        agent = Running(node, check_extenders=True, extender_probe_interval=0.1, publish=True)
        api = build_api_client(ClientSettings(kubeconfig=str(node.kubeconfig)))
        try:
            assert wait_until(lambda: node.state() == "Ready", 30), node.annotations()
            patched = node.manifest.read_bytes()
            assert wait_until(lambda: len(server.bodies) >= 4, 10)  # before, after the restart, then periodic
            server.answers = len(server.bodies)  # the extender stops answering (500 from now on)
            stopped = f"extenders stopped answering: extender {server.url}/filter does not answer: HTTP 500"
            assert wait_until(lambda: node.annotations().get("message") == stopped, 10), node.annotations()
            assert node.state() == "Ready" and node.manifest.read_bytes() == patched  # nothing touched
            row = collect(api).rows[0]
            assert not row.ready and row.reason == stopped
            # Published too, though the phase stayed Ready (the publisher's own refresh is 5 minutes away).
            assert wait_until(lambda: published_ready(node) == "false", 10), published_ready(node)
            assert wait_until(lambda: bool(warnings(node)), 10) and warnings(node) == [stopped]
            assert unreachable(agent.metrics) == 1  # the periodic probe feeds the alert's gauge too
            server.answers = None  # back
            assert wait_until(lambda: "message" not in node.annotations(), 10), node.annotations()
            assert wait_until(lambda: unreachable(agent.metrics) == 0, 10)
            assert wait_until(lambda: collect(api).ready, 10)
            assert wait_until(lambda: published_ready(node) == "true", 10), published_ready(node)
        finally:
            api.close()
            agent.stop()
