"""The benchmark scripts behind docs/benchmarks.md still run (tiny sizes; the figures come from make bench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_engine_bench_runs() -> None:
    out = run("bench/run.py", "-n", "3")
    assert "apply (config changed: plan + write, kubeadm)" in out and "median" in out


def test_agent_bench_runs() -> None:
    out = run("bench/agent_bench.py", "--changes", "2", "--pods", "1", "--sigterms", "1", "--idle-seconds", "1",
              "--starts", "1", "--black-holes", "0", "--rolling-updates", "0", "--report-only")
    for what in ("manifest rewritten", "/readyz 200", "SIGTERM -> manifest restored", "RSS", "signal-safe",
                 "bound ok   idle agent RSS MiB (run --no-api)"):
        assert what in out


def test_extender_probe_bench_runs() -> None:
    out = run("bench/extprobe_bench.py", "-n", "2")
    assert "extender pre-flight added to a patch (HTTPS, CA file, answering)" in out and "/patch" in out


def test_webhook_bench_runs() -> None:
    out = run("bench/webhook_bench.py", "-n", "3", "--clients", "2", "--cold", "2")
    assert "webhook review, new TLS connection" in out and "reviews/s" in out


def test_limits_bench_runs() -> None:
    assert "largest accepted manifest" in run("bench/limits.py")


def test_make_bench_prints_one_table_of_the_recorded_figures(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    env = {"BENCH_ROWS": str(rows)}
    run_env("bench/run.py", "-n", "3", env=env)
    run_env("bench/agent_bench.py", "--changes", "2", "--pods", "1", "--sigterms", "1", "--idle-seconds", "1",
            "--starts", "1", "--black-holes", "0", "--rolling-updates", "0", "--report-only", env=env)
    out = run("bench/table.py", str(rows))
    corpus = ("corpus: patch step",) if (ROOT.parent / "shared" / "corpus" / "manifests").is_dir() else ()
    for figure in (*corpus, "ConfigMap ..data swap -> manifest rewritten (run --no-api)",
                   "ConfigMap ..data swap -> manifest rewritten (run --rollout=independent (API emulator))",
                   "exec -> signal-safe (run --no-api)", "exec -> signal-safe floor", "idle agent RSS MiB"):
        line = next((line for line in out.splitlines() if line.startswith(figure)), None)
        assert line is not None, out
    assert "(p50 <= 50 / p99 <= 150)" in out


def run_env(*argv: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.real_cluster
@pytest.mark.real_bench
def test_the_verdict_scale_bench_measures_both_read_paths(tmp_path: Path) -> None:
    """bench/verdict_scale.py, tiny: the old and the new read path measured in one run on the real server, the
    unlabelled scheduler keeping the verdict NotReady until the bench's agent there says Ready (the drains)."""
    from tests.harness.real.controlplane import missing_reason

    if (why := missing_reason()) is not None:
        pytest.skip(why)
    proc = subprocess.run([sys.executable, "bench/verdict_scale.py", "--json", "--no-lock", "--nodes", "40",
                           "--kube-system-pods", "200", "--gated", "100", "--old-drain-pods", "50",
                           "--idle-minutes", "0.2"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    new, old = out["new"], out["old"]
    assert new["summary"] == old["summary"] == "NotReady: 0/4 nodes ready"
    assert new["verdict_requests"] <= 10 and new["verdict_bytes"] < old["verdict_bytes"] / 10, (new, old)
    for side in (new, old):
        assert side["drain_s"] > 0 and side["agent_rss_mib"] > 0 and side["idle_requests_per_min"] > 0
    assert [p["kube_system_pods"] for p in out["growth"]] == [200]


def test_gate_bench_runs() -> None:
    out = run("bench/gate_bench.py", "--pods", "150", "--stop-pods", "120", "--stop-at", "40")
    for what in ("drain: 150 pods released", "requests", "peak RSS", "stop:", "released after the write",
                 "after its first watch event", "targets ("):
        assert what in out, out


def test_peer_bench_says_in_one_line_when_the_peer_is_not_there(tmp_path: Path) -> None:
    out = run("bench/peer.py", "--peer", str(tmp_path / "no-peer"))
    assert out.startswith("# side by side with the peer: skipped (") and out.count("\n") == 1


def test_peer_bench_worker_answers_with_our_timings(tmp_path: Path) -> None:
    """Our side of the in-process figures (the peer's side needs its venv: make bench builds it)."""
    manifest = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
    requests = "".join(json.dumps({"manifest": str(manifest), "n": 2, "tmp": str(tmp_path / "w"),
                                   "fresh_config": fresh}) + "\n" for fresh in (False, True))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "bench/peer.py", "--worker"], cwd=ROOT, env=env, input=requests,
                          capture_output=True, text=True, timeout=120, check=True)
    kept, fresh = (json.loads(line) for line in proc.stdout.splitlines())
    assert [len(kept[k]) for k in ("patch", "restore", "floor")] == [2, 2, 2]
    assert len(fresh["patch"]) == 2 and all(ms > 0 for ms in kept["restore"])
    assert manifest.read_bytes() == (tmp_path / "w/node/etc/kubernetes/manifests/kube-scheduler.yaml").read_bytes()


def test_taskstats_counts_the_cpu_of_a_thread_that_has_exited() -> None:
    """The idle row's CPU source (``bench/cputime.py``): exact, and a short-lived thread's time is not lost."""
    import threading
    import time

    from bench import cputime

    ts = cputime.open_taskstats(os.getpid())
    if ts is None:
        pytest.skip("taskstats unavailable here (kernel or permission): the idle row falls back to the ticks")
    spent: list[float] = []

    def burn() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.02:
            pass
        spent.append(time.thread_time() - t0)

    try:
        before = ts.cpu_ns(os.getpid())
        worker = threading.Thread(target=burn)
        worker.start()
        worker.join()
        after = ts.cpu_ns(os.getpid())
    finally:
        ts.close()
    assert after - before >= spent[0] * 1e9 * 0.99  # the exited thread's own time, at the least


@pytest.mark.real_cluster
def test_gate_bench_on_the_real_api_server_releases_every_pod(tmp_path: Path) -> None:
    """bench/gate_real_bench.py on the newest built release: every pod of both backlogs released (the script
    lists them and fails otherwise), and its figures recorded as rows. The test holds the real-cluster lock."""
    from tests.harness.real.controlplane import missing_reason

    if (why := missing_reason()) is not None:
        pytest.skip(why)
    rows = tmp_path / "rows.jsonl"
    out = run_env("bench/gate_real_bench.py", "--pods", "200", "--runs", "1", "--warmup", "0", "--no-lock",
                  env={"BENCH_ROWS": str(rows)})
    assert "gatekeeper: 200 pods released in" in out and "ceiling (32 at once): 200 pods released in" in out, out
    recorded = {r["figure"]: r for r in map(json.loads, rows.read_text().splitlines())}
    ratio = recorded["real apiserver: gatekeeper / ceiling (goal >= 0.8)"]
    assert ratio["n"] == 1 and ratio["median"] > 0, recorded
    assert recorded["real apiserver: gatekeeper pods/s released"]["median"] > 0
    assert recorded["real apiserver: gatekeeper CPU ms per released pod"]["median"] > 0
    assert recorded["real apiserver: machine CPU per pod, ceiling / gatekeeper"]["median"] > 0
