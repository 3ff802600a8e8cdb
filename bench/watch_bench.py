"""Watcher benchmarks: config-change latency, idle cost and misbehaving watches.

* ConfigMap ``..data`` swap -> ``FolderWatcher`` callback, kubeadm-style temp+rename -> callback, and the
  swap -> manifest rewritten by an in-process agent (defaults, no API): p50/p99 over ``-n`` repetitions;
* idle cost: threads and wake-ups per minute (context switches of the watcher threads, from
  ``/proc/self/task``) with nothing happening: ``FolderWatcher`` on two folders, ``MirrorPodWatcher`` on an
  idle emulator, and a bare watchdog ``Observer`` with its default timeout on the same two folders (before
  watchdog 5 its dispatcher wakes every second: ``FolderWatcher`` sets an hour);
* a busy parent: the watcher threads' wake-ups while 1000 files next to the watched folder come and go
  (watchdog cannot ask inotify for an ancestor's own move only: its reader sees the deletions and drops them);
* watch requests per second against a server whose watch streams close at once, or right after one event,
  with the backoff policy of today and with the old one (any event reset the backoff: ``min_healthy_s=0``).

Run: ``.venv/bin/python bench/watch_bench.py`` (about two minutes; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows  # noqa: E402
from patcher.adapters import fsio  # noqa: E402
from patcher.adapters.health import Metrics  # noqa: E402
from patcher.adapters.kube.backoff import Backoff  # noqa: E402
from patcher.adapters.kube.client import ClientSettings, build_api_client  # noqa: E402
from patcher.adapters.kube.mirrorpod import MirrorPodWatcher  # noqa: E402
from patcher.adapters.watch import FolderWatcher  # noqa: E402
from patcher.core.fileread import fingerprint as file_fingerprint  # noqa: E402
from patcher.core.fileread import folder_fingerprint  # noqa: E402
from patcher.core.lifecycle import Counter  # noqa: E402
from patcher.core.settings import Files  # noqa: E402
from patcher.services import process  # noqa: E402
from patcher.services.agent import Agent  # noqa: E402
from tests.conftest import write_configmap  # noqa: E402
from tests.harness.settings import build_settings  # noqa: E402

LIMIT = 1 << 20  # every fingerprint is bounded; these files are a few bytes
from tests.harness.emu.kubeemu import KubeEmulator, make_mirror_pod  # noqa: E402

KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
CONFIG = (ROOT / "examples/scheduler-config/extenders.yaml").read_text()


def summary(name: str, ms: list[float]) -> None:
    row = rows.of(name, ms)
    rows.record(row)
    print(f"{name:<58} n={row.n:<4} p50 {row.median:7.1f} ms   p99 {row.p99:7.1f} ms")


def wait(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(0.0005)


# -- latency ----------------------------------------------------------------------------------------------


def bench_callback_latency(n: int) -> None:
    with tempfile.TemporaryDirectory() as t:
        folder, manifests = Path(t) / "source", Path(t) / "manifests"
        folder.mkdir()
        manifests.mkdir()
        write_configmap(folder, {"extenders.yaml": "a: 0\n"})
        (manifests / "kube-scheduler.yaml").write_text("v0")
        seen: queue.Queue[tuple[str, float]] = queue.Queue()
        w = FolderWatcher(lambda name: seen.put((name, time.perf_counter())))
        w.add("source", folder, lambda: folder_fingerprint(folder, limit=LIMIT))
        w.add("manifest", manifests, lambda: file_fingerprint(manifests / "kube-scheduler.yaml", limit=LIMIT))
        w.start()
        swap, rename = [], []
        for i in range(n):
            gen = folder / f"..gen{i}"
            gen.mkdir()
            (gen / "extenders.yaml").write_text(f"a: {i + 1}\n")
            (folder / "..data_tmp").symlink_to(gen.name)
            t0 = time.perf_counter()
            os.replace(folder / "..data_tmp", folder / "..data")  # the swap: one rename
            name, t1 = seen.get(timeout=10)
            assert name == "source"
            swap.append((t1 - t0) * 1000)
            t0 = time.perf_counter()
            fsio.atomic_write(manifests / "kube-scheduler.yaml", f"v{i + 1}".encode())
            name, t1 = seen.get(timeout=10)
            assert name == "manifest"
            rename.append((t1 - t0) * 1000)
        w.stop()
    summary("ConfigMap ..data swap -> watcher callback (no quiet time)", swap)
    summary(f"kubeadm temp+rename write -> watcher callback (quiet {w.debounce * 1000:.0f} ms)", rename)


def bench_swap_to_manifest(n: int) -> None:
    with tempfile.TemporaryDirectory() as t:
        root = Path(t) / "node"
        (root / "etc/kubernetes/manifests").mkdir(parents=True)
        shutil.copy(KUBEADM, root / MANIFEST)
        src = Path(t) / "src"
        src.mkdir()
        write_configmap(src, {"extenders.yaml": CONFIG})
        metrics = CountingMetrics()
        settings = build_settings(check_extenders=False, files=Files(source=src, host_root=root), resync_interval=3600)
        agent = Agent(settings, metrics=metrics)
        process.start_watching(agent)
        th = threading.Thread(target=process.run, args=(agent,), daemon=True)
        th.start()
        manifest = root / MANIFEST
        wait(lambda: b"--config=" in manifest.read_bytes())
        out = []
        reconciles = metrics.reconciles
        for i in range(n):
            before = manifest.read_bytes()
            t0 = time.perf_counter()
            write_configmap(src, {"extenders.yaml": CONFIG.replace("weight: 1", f"weight: {i + 2}")})
            wait(lambda b=before: manifest.read_bytes() != b)  # type: ignore[misc]
            out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.5)  # late events of the last change (our own write) have been looked at
        reconciles = metrics.reconciles - reconciles
        agent.request_stop()
        th.join(10)
    summary(f"ConfigMap swap -> manifest rewritten (agent, debounce {agent.opts.debounce}s)", out)
    print(f"{'  reconciles per config change (1.0: our own write stays quiet)':<58} {reconciles / n:7.2f}")


class CountingMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.reconciles = 0

    def count(self, name: Counter) -> None:
        if name == "reconciled":
            self.reconciles += 1
        super().count(name)


# -- idle cost --------------------------------------------------------------------------------------------


def _switches(native_ids: set[int]) -> dict[int, int]:
    out = {}
    for tid in native_ids:
        try:
            text = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        out[tid] = sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches" in line)
    return out


def idle_cost(label: str, before: set[int], seconds: float) -> None:
    """Threads started since ``before`` and their wake-ups per minute over ``seconds`` of nothing."""
    time.sleep(0.5)  # let start-up settle
    ours = {t.native_id for t in threading.enumerate() if t.native_id is not None} - before
    a = _switches(ours)
    time.sleep(seconds)
    b = _switches(ours)
    wakeups = sum(b[t] - a.get(t, b[t]) for t in b) * 60.0 / seconds
    print(f"{label:<58} threads {len(ours):<3} wake-ups/min {wakeups:7.1f}")


def _thread_ids() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.native_id is not None}


@contextmanager
def two_folders() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory() as t:
        a, b = Path(t) / "source", Path(t) / "manifests"
        a.mkdir()
        b.mkdir()
        yield a, b


def bench_idle(seconds: float) -> None:
    with two_folders() as (a, b):
        before = _thread_ids()
        w = FolderWatcher(lambda name: None)
        w.add("source", a, lambda: folder_fingerprint(a, limit=LIMIT))
        w.add("manifest", b, lambda: folder_fingerprint(b, limit=LIMIT))
        w.start()
        idle_cost("idle: FolderWatcher, 2 folders", before, seconds)
        w.stop()
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
    except ImportError:
        print("idle: watchdog Observer (baseline)                          not installed")
    else:
        with two_folders() as (a, b):
            before = _thread_ids()
            obs = Observer()
            for folder in (a, b):
                obs.schedule(FileSystemEventHandler(), str(folder), recursive=False)
            obs.start()
            idle_cost("idle: watchdog Observer, 2 folders (the baseline)", before, seconds)
            obs.stop()
            obs.join(2)
    with tempfile.TemporaryDirectory() as t, KubeEmulator() as emu:
        emu.set_pod(make_mirror_pod(node_name="cp-1", started_at="2026-11-21T23:40:02Z"))
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(Path(t) / "kc"))))
        before = _thread_ids()
        pods = MirrorPodWatcher(api, "kube-system", "kube-scheduler-cp-1")
        pods.start()
        pods.wait_synced(5)
        wait(lambda: emu.open_watches == 1)
        before |= {t.native_id for t in threading.enumerate()
                   if t.native_id is not None and not t.name.startswith("mirror-pod")}  # the emulator's
        idle_cost("idle: MirrorPodWatcher, open watch, no events", before, seconds)
        pods.stop()
        api.close()


# -- misbehaving watch streams ----------------------------------------------------------------------------


def bench_busy_parent(n: int) -> None:
    with tempfile.TemporaryDirectory() as t:
        folder = Path(t) / "manifests"
        folder.mkdir()
        before = _thread_ids()
        w = FolderWatcher(lambda name: None)
        w.add("manifest", folder, lambda: folder_fingerprint(folder, limit=LIMIT))
        w.start()
        time.sleep(0.5)  # let start-up settle
        ours = _thread_ids() - before
        a = _switches(ours)
        for i in range(n):
            (Path(t) / f"sibling-{i}").write_text("x")
            (Path(t) / f"sibling-{i}").unlink()
        time.sleep(0.5)  # the last events are read
        b = _switches(ours)
        w.stop()
    wakeups = sum(b[tid] - a.get(tid, b[tid]) for tid in b)
    label = f"busy parent: {n} sibling files created+deleted"
    print(f"{label:<58} threads {len(ours):<3} wake-ups {wakeups:7d}")


def watch_requests(emu: KubeEmulator) -> int:
    """The watch requests the emulator received (a misbehaving server's closes show here first)."""
    return sum(1 for r in emu.requests("GET") if r.query.get("watch") == "true")


def bench_closing_watches(seconds: float) -> None:
    for close_after, label in ((0, "closes at once"), (1, "closes after one event")):
        for min_healthy, policy in ((1.0, "now"), (0.0, "old: events reset the backoff")):
            if close_after == 0 and min_healthy == 0.0:
                continue  # an empty stream never reset the backoff: the old policy is the same there
            with tempfile.TemporaryDirectory() as t, KubeEmulator(bookmark_interval=0.01) as emu:
                emu.set_pod(make_mirror_pod(node_name="cp-1", started_at="2026-11-21T23:40:02Z"))
                emu.watch_close_after = close_after
                api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(Path(t) / "kc"))))
                pods = MirrorPodWatcher(api, "kube-system", "kube-scheduler-cp-1", backoff=Backoff(),
                                        min_healthy_s=min_healthy)
                pods.start()
                pods.wait_synced(5)
                t0, n0 = time.monotonic(), watch_requests(emu)
                time.sleep(seconds)
                rate = (watch_requests(emu) - n0) / (time.monotonic() - t0)
                pods.stop()
                api.close()
            print(f"{'watch ' + label + ' (' + policy + ')':<58} {rate:7.2f} watch requests/s over {seconds:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("-n", type=int, default=200, help="repetitions of each latency figure")
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--watch-seconds", type=float, default=60.0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the watchers' first-failure warnings are expected here
    from watchdog.version import VERSION_STRING

    print(f"watchdog {VERSION_STRING}")
    if args.quick:
        args.n, args.idle_seconds, args.watch_seconds = 3, 1.0, 1.0
    bench_callback_latency(args.n)
    bench_swap_to_manifest(max(3, args.n // 2))
    bench_idle(args.idle_seconds)
    bench_busy_parent(10 if args.quick else 1000)
    bench_closing_watches(args.watch_seconds)


if __name__ == "__main__":
    main()
