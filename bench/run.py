"""Benchmarks that back the figures in the README and the issue notes (run with ``make bench``).

Timing targets are checked here, not in tests, so the test suite stays deterministic on a busy CI machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from patcher import engine, manifest, yamltext

ROOT = Path(__file__).resolve().parents[1]
KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:<48} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms")


def bench_apply(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        (node / "etc/kubernetes/manifests").mkdir(parents=True)
        shutil.copy(KUBEADM, node / "etc/kubernetes/manifests/kube-scheduler.yaml")
        src = Path(tmp) / "src"
        src.mkdir()
        opts = engine.Options(source=src, host_root=node)
        configs = [(ROOT / "examples/scheduler-config/extenders.yaml").read_text().replace("weight: 1", f"weight: {i}")
                   for i in (10, 20)]
        i = 0

        def apply_changed() -> None:
            nonlocal i
            (src / "extenders.yaml").write_text(configs[i % 2])
            i += 1
            yamltext.parse.cache_clear()
            plan = engine.plan_apply(opts)
            assert plan.pending
            engine.apply(opts, plan)

        def apply_noop() -> None:
            yamltext.parse.cache_clear()
            assert not engine.plan_apply(opts).pending

        summary("apply (config changed: plan + write, kubeadm)", timed(apply_changed, n))
        summary("apply (nothing to do, kubeadm)", timed(apply_noop, n))
        restore_ms = timed(lambda: engine.restore(opts, engine.plan_restore(opts)), 1)
        summary("restore (kubeadm)", restore_ms)


def bench_pure(n: int) -> None:
    text = KUBEADM.read_text()
    spec = manifest.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher",
                              config_file="config-0123456789ab.yaml", config_hash="0123456789ab" * 5)
    patched = manifest.patch(text, spec, "k").text

    def cold_patch() -> None:
        yamltext.parse.cache_clear()  # measure a real parse, not the per-text cache
        manifest.patch(text, spec, "k")

    def cold_restore() -> None:
        yamltext.parse.cache_clear()
        manifest.restore(patched, "k", prefix="scheduler-patcher.io")

    summary("manifest.patch (pure, kubeadm, cold cache)", timed(cold_patch, n))
    summary("manifest.restore (pure, kubeadm, cold cache)", timed(cold_restore, n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args()
    bench_pure(args.n)
    bench_apply(args.n)


if __name__ == "__main__":
    main()
