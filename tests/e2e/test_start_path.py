"""The path from exec to the first manifest write carries only what that write needs, and what was
moved off it still works when it is needed: the probes' server (asyncio) once the start has settled or at the
first connection, the metrics (prometheus_client) at the first scrape. (The process table, psutil, comes with the
restart watch's first scan: tests/component/test_proc.py scans real processes.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.adapters.health import PROBE_BUCKETS, RESTART_BUCKETS, Health, HealthServer, Metrics, prometheus
from patcher.core.lifecycle import LoopEvent
from patcher.core.settings import Files
from patcher.core.status import NodeState
from patcher.services import process
from patcher.services.runner import build_agent
from tests.harness.childproc import ROOT
from tests.harness.emu.kubeemu import wait_until
from tests.harness.helpers import KUBEADM, MANIFEST, node_folders
from tests.harness.settings import build_settings

EXAMPLE_SOURCE = (ROOT / "examples/scheduler-config/extenders.yaml").read_text()

#: Runs ``python -m patcher`` with an audit hook that writes ``sys.modules`` to a file at the first fsync of the
#: manifest's folder that follows a patch (the write is durable then): what the process had imported by its
#: first write. argv: manifest folder, output file, then the command line.
FIRST_WRITE_PROBE = """
import os, runpy, sys
folder, out = sys.argv[1], sys.argv[2]
manifest = os.path.join(folder, "kube-scheduler.yaml")
state = {"busy": False, "done": False}
def hook(event, args):
    if event != "open" or state["done"] or state["busy"] or not isinstance(args[0], (str, bytes)):
        return
    if os.fsdecode(args[0]) != folder:
        return
    state["busy"] = True
    try:
        with open(manifest, "rb") as f:
            patched = b"--config=" in f.read()
    finally:
        state["busy"] = False
    if patched:
        state["done"] = True
        with open(out + ".tmp", "w") as f:
            f.write("\\n".join(sorted(sys.modules)))
        os.replace(out + ".tmp", out)
sys.addaudithook(hook)
sys.argv = ["scheduler-patcher", *sys.argv[3:]]
runpy.run_module("patcher", run_name="__main__", alter_sys=True)
"""


def test_run_no_api_reaches_its_first_write_without_asyncio_prometheus_or_psutil(tmp_path: Path) -> None:
    root, src = node_folders(tmp_path, source=EXAMPLE_SOURCE)  # the bench's node: an ignorable extender
    out = tmp_path / "modules.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", FIRST_WRITE_PROBE, str(root / MANIFEST.rsplit("/", 1)[0]), str(out), "run",
         "--host-root", str(root), "--source", str(src), "--listen", "127.0.0.1:0", "--no-api", "--log-level=debug"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stderr or ()), daemon=True)
    reader.start()
    try:
        assert wait_until(lambda: out.exists() or child.poll() is not None, 120), "".join(lines)
        assert out.exists(), "".join(lines)
        loaded = set(out.read_text().split())
        # The probe saw the real start: the agent, its ``nodefiles`` and the YAML library were there by the write.
        assert {"patcher.services.agent", "patcher.services.nodefiles", "patcher.adapters.health",
                "ruamel.yaml"} <= loaded
        assert not {"asyncio", "prometheus_client", "psutil"} & loaded, sorted(loaded)
        # What moved off the path still serves: the probe and the metrics, with the write counted.
        url = next(line.split("url=")[1].split()[0] for line in list(lines) if "health server listening" in line)
        with urllib.request.urlopen(url + "/healthz", timeout=30) as resp:
            assert resp.status == 200

        def metrics() -> bytes:
            with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
                body: bytes = resp.read()
                return body

        # The probe saw the manifest's rename; the loop counts the write once the write call has returned.
        assert wait_until(lambda: b"scheduler_patcher_writes_total 1.0" in metrics(), 30), metrics()
    finally:
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 0, "".join(lines)
        reader.join(10)
    assert (root / MANIFEST).read_bytes() == KUBEADM


def test_the_loop_says_settled_once_and_after_the_first_write(tmp_path: Path) -> None:
    """With the extender pre-flight on, the write waits for the probe: ``settled`` must not come before it."""
    root, src = node_folders(tmp_path, source=EXAMPLE_SOURCE)
    config = build_settings(files=Files(source=src, host_root=root), check_extenders=True, no_api=True)
    wiring = build_agent(config, None)
    agent = wiring.agent
    seen: list[bool] = []
    done = threading.Event()

    def settled() -> None:
        seen.append(b"--config=" in (root / MANIFEST).read_bytes())
        done.set()

    wiring.start()
    code: list[int] = []
    runner = threading.Thread(target=lambda: code.append(process.run(agent, settled=settled)), daemon=True)
    runner.start()
    try:
        assert done.wait(60)
        agent.notify(LoopEvent.SOURCE)  # more passes of the loop: it is said once only
        assert wait_until(lambda: agent.events.empty(), 30)
    finally:
        agent.request_stop()
        runner.join(60)
        wiring.close()
    assert seen == [True] and code == [0]
    assert (root / MANIFEST).read_bytes() == KUBEADM


def test_a_deferred_server_is_woken_by_its_first_connection_and_serves_the_metrics_then() -> None:
    metrics = Metrics()
    health = Health()
    health.beat()
    health.set_state(NodeState.READY)  # as the agent does: /readyz, and the state gauge
    metrics.set_state(NodeState.READY)
    metrics.count("wrote")
    server = HealthServer(health, metrics, "127.0.0.1:0")
    server.start(deferred=True)  # nobody wakes it: the connection must
    try:
        with urllib.request.urlopen(server.url + "/readyz", timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        assert "scheduler_patcher_writes_total 1.0" in text
        assert 'scheduler_patcher_state{state="Ready"} 1.0' in text
        assert "process_resident_memory_bytes" in text and "scheduler_patcher_build_info{" in text
    finally:
        server.stop()


def test_a_deferred_server_never_woken_stops_at_once() -> None:
    health = Health()
    server = HealthServer(health, Metrics(), "127.0.0.1:0")
    server.start(deferred=True)
    thread = server._thread
    assert thread is not None and thread.is_alive()
    server.stop()
    assert not thread.is_alive()
    assert server._loop is None  # it never ran a loop


def test_wake_serves_without_a_connection() -> None:
    health = Health()
    health.beat()
    server = HealthServer(health, Metrics(), "127.0.0.1:0")
    server.start(deferred=True)
    try:
        server.wake()
        assert server._started.wait(60)  # the loop runs: set by _serve once it accepts
        assert server._loop is not None
        with urllib.request.urlopen(server.url + "/healthz", timeout=30) as resp:
            assert resp.status == 200
    finally:
        server.stop()


# -- the metrics: plain values, rendered through prometheus_client as its own metric objects would be ----------

CALLS = st.lists(st.one_of(
    st.sampled_from(["reconciled", "wrote", "restored", "rolled_back"]).map(lambda m: ("count", (m,))),
    st.sampled_from(["api", "manifest", "watch", "internal"]).map(lambda k: ("error", (k,))),
    st.one_of(st.none(), st.floats(-5, 2000, allow_nan=False), st.sampled_from(RESTART_BUCKETS)).map(
        lambda s: ("restart_seen", (s,))),
    st.sampled_from([*map(str, NodeState), "Unheard-of"]).map(lambda s: ("set_state", (s,))),
    st.tuples(st.lists(st.one_of(st.floats(-1, 30, allow_nan=False), st.sampled_from(PROBE_BUCKETS)), max_size=3),
              st.integers(0, 3), st.integers(0, 3)).map(lambda a: ("extenders_probed", a)),
    st.booleans().map(lambda b: ("source_refused", (b,))),
    st.booleans().map(lambda b: ("config_missing", (b,))),
    st.booleans().map(lambda b: ("set_held", (b,))),
    st.tuples(st.sampled_from(["", "a" * 64, "c" * 64]), st.sampled_from(["", "b" * 64])).map(
        lambda h: ("set_config", h)),
), max_size=40)


class Reference:
    """The agent's metrics as they once were: prometheus_client's Counter, Gauge and Histogram."""

    def __init__(self) -> None:
        prom = prometheus()
        self.registry = prom.CollectorRegistry(auto_describe=True)
        kw = {"namespace": "scheduler_patcher", "registry": self.registry}
        self.reconciles = prom.Counter("reconciles", "Reconcile passes run.", **kw)
        self.writes = prom.Counter("writes", "Manifest writes (patches applied).", **kw)
        self.restores = prom.Counter("restores", "Manifest restores.", **kw)
        self.rollbacks = prom.Counter("rollbacks", "Rollbacks after a failed restart.", **kw)
        self.errors = prom.Counter("errors", "Errors by kind.", ["kind"], **kw)
        self.state = prom.Gauge("state", "Current node state (1 for the current one, 0 for the others).",
                                ["state"], **kw)
        self.restart = prom.Histogram("restart_seconds", "Seconds from the manifest write to the restart seen.",
                                      buckets=RESTART_BUCKETS, **kw)
        self.config = prom.Gauge("config_info", "Always 1; the labels name the config the node should run (the "
                                 "Node's hash annotations).", ["config_hash", "source_hash"], **kw)
        self.probe = prom.Histogram("extender_probe_seconds", "Seconds one extender took to answer the probe, or to "
                                    "fail it.", buckets=PROBE_BUCKETS, **kw)
        self.unreachable = prom.Gauge("extenders_unreachable", "Extenders that did not answer the last probe, by "
                                      "whether the config marks them ignorable.", ["ignorable"], **kw)
        self.refused = prom.Gauge("source_refused", "1 while the last plan refused the source config (invalid), "
                                  "else 0.", **kw)
        self.missing = prom.Gauge("config_missing", "1 while kube-scheduler's --config names a file that is not on "
                                  "the node and the agent does not write it back (its next start fails), else 0.", **kw)
        self.held = prom.Gauge("held", "1 while an operator holds the node (its hold annotation): the agent writes "
                               "nothing there, else 0.", **kw)
        self.states = tuple(str(s) for s in NodeState if s is not NodeState.HELD)
        for state in self.states:
            self.state.labels(state=state).set(0)
        for ignorable in ("false", "true"):
            self.unreachable.labels(ignorable=ignorable).set(0)

    def call(self, name: str, args: tuple[object, ...]) -> None:
        if name == "count":
            {"reconciled": self.reconciles, "wrote": self.writes, "restored": self.restores,
             "rolled_back": self.rollbacks}[args[0]].inc()  # type: ignore[index]
        elif name == "error":
            self.errors.labels(kind=args[0]).inc()
        elif name == "restart_seen":
            if args[0] is not None:
                self.restart.observe(max(0.0, float(args[0])))  # type: ignore[arg-type]
        elif name == "extenders_probed":
            seconds, unreachable, ignorable = args
            for value in seconds:  # type: ignore[attr-defined]
                self.probe.observe(max(0.0, value))
            self.unreachable.labels(ignorable="false").set(unreachable)
            self.unreachable.labels(ignorable="true").set(ignorable)
        elif name == "source_refused":
            self.refused.set(1 if args[0] else 0)
        elif name == "config_missing":
            self.missing.set(1 if args[0] else 0)
        elif name == "set_held":
            self.held.set(1 if args[0] else 0)
        elif name == "set_config":
            self.config.clear()
            if args[0]:
                self.config.labels(config_hash=args[0], source_hash=args[1]).set(1)
        else:
            for known in self.states:
                self.state.labels(state=known).set(1 if known == args[0] else 0)
            if args[0] not in self.states:
                self.state.labels(state=args[0]).set(1)

    def render(self) -> bytes:
        data: bytes = prometheus().generate_latest(self.registry)
        return data


def ours_only(text: bytes) -> list[str]:
    """The agent's own series (the process collector's values change between two renders)."""
    return [line for line in text.decode().splitlines() if "scheduler_patcher_" in line
            and "build_info" not in line]


@settings(max_examples=60, deadline=None)
@given(CALLS)
def test_the_exposition_is_what_prometheus_clients_own_metrics_give(calls: list[tuple[str, tuple[object, ...]]]
                                                                    ) -> None:
    ours, reference = Metrics(), Reference()
    for name, args in calls:
        getattr(ours, name)(*args)
        reference.call(name, args)
    assert ours_only(ours.render()) == ours_only(reference.render())


def test_metrics_counted_before_the_first_scrape_are_all_there() -> None:
    """The agent counts from its first reconcile; the registry is made at the first scrape and shows it all."""
    metrics = Metrics()
    metrics.count("reconciled")
    metrics.error("watch")
    metrics.restart_seen(3.0)
    first = metrics.render().decode()
    assert "scheduler_patcher_reconciles_total 1.0" in first
    assert 'scheduler_patcher_errors_total{kind="watch"} 1.0' in first
    assert 'scheduler_patcher_restart_seconds_bucket{le="5.0"} 1.0' in first
    metrics.count("reconciled")
    assert "scheduler_patcher_reconciles_total 2.0" in metrics.render().decode()
    assert "_created" not in first

