"""The one table of the figures, from the rows the bench scripts of one ``make bench`` run recorded.

Each script appends its figures to the file named by ``BENCH_ROWS`` (``bench/rows.py``); this prints them with
their targets, so one run on one (possibly busy) machine gives every figure and its verdict side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rows import Row, load  # noqa: E402

#: figure -> (median target, p99 target); None: no target, shown for comparison (baselines, floors).
TARGETS: dict[str, tuple[float | None, float | None]] = {
    "corpus: patch step": (15.0, None),
    "corpus: restore step": (5.0, None),
    "corpus: naive patch": (None, None),
    "corpus: floor (read+write+fsync+rename)": (None, None),
    "kubeadm: apply (config changed: plan + write, kubeadm)": (None, None),
    "ConfigMap ..data swap -> manifest rewritten (run --no-api)": (50.0, 150.0),
    "ConfigMap ..data swap -> manifest rewritten (run --rollout=independent (API emulator))": (50.0, 150.0),
    "exec -> signal-safe (run --no-api)": (100.0, None),
    "exec -> signal-safe (run --rollout=independent (API emulator))": (100.0, None),
    "exec -> signal-safe floor (python -c, a handler, nothing else)": (None, None),
    "exec -> manifest patched (run --rollout=independent (API emulator))": (700.0, None),
    "SIGTERM -> manifest restored (real process)": (5.0, None),
    # the stop (bench/agent_bench.py)
    "SIGTERM -> restored, API black-holed (coordinated)": (1000.0, 1000.0),
    "SIGTERM -> restored, API black-holed (coordinated, a change waiting for its turn)": (1000.0, 1000.0),
    "SIGTERM -> restored, API black-holed (coordinated, DaemonSet deleted, auto)": (1000.0, 1000.0),
    "scheduler restarts per node during an agent rolling update (restore-on-exit=auto)": (0.0, 0.0),
    "scheduler restarts per node during an agent rolling update (restore-on-exit=always)": (None, None),
    "idle agent CPU % of a core (run --no-api)": (0.03, None),
    "idle agent RSS MiB (run --no-api)": (50.0, None),
    # the gatekeeper draining 10 000 gated pods (bench/gate_bench.py)
    "gatekeeper: 10k gated pods released, s (5 ms/request)": (10.0, None),
    "gatekeeper: pods/s released (5 ms/request)": (None, None),  # at least: AT_LEAST
    "gatekeeper: ms per released pod (target >= 1000 pods/s)": (1.0, None),
    "gatekeeper: requests per drain (PATCH + verdict reads)": (None, None),
    # the GIL gives the gatekeeper one core: 1 ms of CPU per pod caps it at 1000 pods/s on any machine
    "gatekeeper: CPU ms per released pod": (1.0, None),
    "emulator (+ bench script): CPU ms per request": (None, None),
    "gatekeeper: peak RSS MiB, 10k pods cached": (100.0, None),
    "gatekeeper: pods released after a NotReady watch event, per release slot": (1.0, None),
    # the gatekeeper against the real kube-apiserver, beside a plain client's ceiling
    # (bench/gate_real_bench.py; absent where `make real-k8s` built nothing)
    "real apiserver: 10k gated pods released by the gatekeeper, s": (None, None),
    "real apiserver: gatekeeper pods/s released": (None, None),
    "real apiserver: plain client, same PATCHes and concurrency (ceiling), pods/s": (None, None),
    "real apiserver: gatekeeper / ceiling (goal >= 0.8)": (None, None),  # at least: AT_LEAST
    "real apiserver: machine CPU per pod, ceiling / gatekeeper": (None, None),
    "real apiserver: gatekeeper CPU ms per released pod": (None, None),
    "real apiserver: gatekeeper peak RSS MiB, backlog cached": (None, None),
    # what the extender pre-flight adds to a patch (bench/extprobe_bench.py)
    "extender pre-flight added to a patch (HTTP, answering)": (50.0, None),
    "extender pre-flight added to a patch (HTTPS, CA file, answering)": (50.0, None),
    # what the admission webhook adds to a pod's creation (bench/webhook_bench.py)
    "webhook review, kept-open connection (8 at once)": (10.0, None),
    "webhook review, new TLS connection": (20.0, None),
    "webhook rules alone (no server)": (None, None),
}


#: figure -> the median's lower bound (a rate: more is better).
AT_LEAST: dict[str, float] = {
    "gatekeeper: pods/s released (5 ms/request)": 1000.0,
    "real apiserver: gatekeeper / ceiling (goal >= 0.8)": 0.8,
}


def verdict(row: Row) -> str:
    if row.figure in AT_LEAST:
        floor = AT_LEAST[row.figure]
        return f"{'ok' if row.median >= floor else 'MISSED'} (p50 >= {floor:g})"
    median_target, p99_target = TARGETS.get(row.figure, (None, None))
    if median_target is None and p99_target is None:
        return ""
    ok = (median_target is None or row.median <= median_target) and (p99_target is None or row.p99 <= p99_target)
    want = " / ".join(f"{k} <= {v:g}" for k, v in (("p50", median_target), ("p99", p99_target)) if v is not None)
    return f"{'ok' if ok else 'MISSED'} ({want})"


def main() -> None:
    rows = {row.figure: row for row in load(Path(sys.argv[1]))}  # the last of a figure wins
    shown = [rows[f] for f in TARGETS if f in rows]
    print(f"\n== figures of this run ({len(shown)} of {len(TARGETS)}; ms unless the figure says "
          "else)")
    width = max((len(row.figure) for row in shown), default=6)
    print(f"{'figure':<{width}} {'n':>5} {'median':>9} {'p99':>9}  verdict")
    for row in shown:
        print(f"{row.figure:<{width}} {row.n:>5} {row.median:>9.2f} {row.p99:>9.2f}  {verdict(row)}")


if __name__ == "__main__":
    main()
