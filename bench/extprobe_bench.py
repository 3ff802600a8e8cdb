"""What the extender pre-flight adds to a patch when the extender answers.

The agent's pre-flight is ``extprobe.check`` on the rendered config before the write: one thread per
extender, resolve, connect, TLS, one POST, the answer judged. Measured here against real extenders on
127.0.0.1 (``tests/harness/emu/extservers.py``): plain HTTP, and HTTPS with a CA file read below the host root (a fresh
TLS handshake each time, as each probe makes). The patch step itself (``plan_apply`` + ``apply`` on a real
node folder) is measured in the same run, so the added cost reads as a ratio on a busy machine too.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rows as bench_rows  # noqa: E402
from bench.rows import stats, timed  # noqa: E402
from patcher.adapters import extprobe  # noqa: E402
from patcher.core.schedconfig import RenderedConfig  # noqa: E402
from patcher.core.settings import Files  # noqa: E402
from patcher.services import nodefiles  # noqa: E402
from patcher.services.record import state_store  # noqa: E402
from tests.conftest import write_configmap  # noqa: E402
from tests.harness.emu.extservers import ExtenderServer, Pki  # noqa: E402

KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
GOAL_MS = 50.0


def node(tmp: Path, extender: str) -> tuple[Files, RenderedConfig]:
    root = tmp / "node"
    (root / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    shutil.copy(KUBEADM, root / MANIFEST)
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    write_configmap(src, {"extenders.yaml": f"extenders:\n- {extender}\n"})
    opts = Files(source=src, host_root=root)
    plan = nodefiles.plan_apply(opts)
    assert plan.config is not None
    return opts, plan.config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200, help="repetitions per figure")
    args = parser.parse_args()
    results: list[tuple[str, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        pki = Pki.make(tmp / "node/etc/extender/pki")
        with ExtenderServer() as plain, ExtenderServer(pki) as tls:
            cases = {
                "HTTP": f"{{urlPrefix: '{plain.url}', filterVerb: filter}}",
                "HTTPS, CA file": f"{{urlPrefix: '{tls.url}', filterVerb: filter, "
                                  "tlsConfig: {caFile: /etc/extender/pki/ca.crt}}",
            }
            for label, extender in cases.items():
                opts, config = node(tmp, extender)
                probe = extprobe.check(opts, config)
                assert probe and probe[0].answered, probe

                def check(opts: Files = opts, config: RenderedConfig = config) -> object:
                    return extprobe.check(opts, config)

                ms = [timed(check) for _ in range(args.n)]
                results.append((f"extender pre-flight added to a patch ({label}, answering)", ms))
            opts, config = node(tmp, cases["HTTP"])
            patch = []
            for _ in range(args.n):
                shutil.copy(KUBEADM, opts.host_root / MANIFEST)
                state_store(opts).clear()
                patch.append(timed(lambda: nodefiles.apply(opts, nodefiles.plan_apply(opts, config=config))))
            results.append(("patch step without the pre-flight (kubeadm)", patch))
    base = statistics.median(patch)
    print(f"{'figure':<62} {'n':>5} {'median ms':>10} {'p99 ms':>9} {'/patch':>7} {'goal':>6}")
    for figure, ms in results:
        median, p99 = stats(ms)
        bench_rows.record(bench_rows.Row(figure, len(ms), median, p99))
        goal = ("ok" if median <= GOAL_MS else "MISSED") if "pre-flight added" in figure else ""
        print(f"{figure:<62} {len(ms):>5} {median:>10.2f} {p99:>9.2f} {median / base:>7.2f} {goal:>6}")


if __name__ == "__main__":
    main()
