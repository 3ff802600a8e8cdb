"""In-process figures of the file side, side by side with two baselines measured in the same run (``make bench``).

For every manifest set (the shared corpus, examples/), repetition i patches or restores manifest i mod N on a
real temporary node folder:

* patch step: ``plan_apply`` (config already rendered, as the peer copies a ready file) + ``apply``: read,
  validate, edit, re-parse proof, write config file, state record and manifest, all fsynced, under the lock;
* restore step: ``plan_restore`` + ``restore``;
* naive patch / naive restore: ruamel round-trip load -> edit -> dump -> write (bench/baselines.py);
* floor: read + write + fsync + rename of the same bytes (bench/baselines.py).

Ratios are ours / baseline, medians over the same manifests. Timing targets live here, not in the tests, so the
test suite stays deterministic on a busy machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import baselines  # noqa: E402
from bench import rows as bench_rows  # noqa: E402
from bench.rows import stats, timed  # noqa: E402
from patcher.core.errors import PatcherError  # noqa: E402
from patcher.core.schedconfig import RenderedConfig  # noqa: E402
from patcher.core.settings import Files  # noqa: E402
from patcher.services import nodefiles  # noqa: E402
from patcher.services.record import state_store  # noqa: E402

KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
CORPUS = ROOT.parent / "shared" / "corpus" / "manifests"
EXAMPLES = ROOT / "examples" / "manifests"
SOURCE = ROOT / "examples" / "scheduler-config" / "extenders.yaml"
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"

TARGETS = {"patch step": 15.0, "restore step": 5.0}  # ms


class Node:
    """A node folder under a temporary host root, with one manifest at a time."""

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "node"
        (self.root / "etc/kubernetes/manifests").mkdir(parents=True)
        self.manifest = self.root / MANIFEST
        src = tmp / "src"
        src.mkdir()
        shutil.copy(SOURCE, src / "extenders.yaml")
        self.opts = Files(source=src, host_root=self.root, on_foreign="replace")
        self.manifest.write_bytes(KUBEADM.read_bytes())
        plan = nodefiles.plan_apply(self.opts)
        assert plan.config is not None
        self.config: RenderedConfig = plan.config

    def reset(self, data: bytes) -> None:
        self.manifest.write_bytes(data)
        state_store(self.opts).clear()

    def patch(self) -> None:
        plan = nodefiles.plan_apply(self.opts, config=self.config)
        assert plan.pending
        nodefiles.apply(self.opts, plan)

    def restore(self) -> None:
        nodefiles.restore(self.opts, nodefiles.plan_restore(self.opts))


def usable(node: Node, files: list[Path]) -> tuple[list[bytes], list[str]]:
    """Manifests both we and the naive baseline patch (ours refuses shell-wrapped schedulers, for instance)."""
    good, skipped = [], []
    for path in files:
        data = path.read_bytes()
        try:
            node.reset(data)
            node.patch()
            node.restore()
            assert node.manifest.read_bytes() == data, f"{path.name}: restore(patch(m)) != m"
            baselines.naive_patch(node.manifest, "/etc/kubernetes/scheduler-patcher", "config-x.yaml", "0" * 64)
            baselines.naive_restore(node.manifest)
        except (PatcherError, KeyError, IndexError, TypeError, AttributeError):
            skipped.append(path.name)
            continue
        good.append(data)
    return good, skipped


def bench_set(name: str, files: list[Path], n: int) -> list[tuple[str, str, int, float, float]]:
    rows: list[tuple[str, str, int, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp))
        good, skipped = usable(node, files[:max(n, 1)])  # a tiny smoke run (-n 3) screens only what it uses
        print(f"# {name}: {len(good)} manifests ({len(skipped)} refused by us or the naive baseline: "
              f"{', '.join(skipped) or '-'})")
        if not good:
            return rows
        patch, restore, naive_p, naive_r, floor = [], [], [], [], []
        for i in range(n):
            data = good[i % len(good)]
            node.reset(data)
            patch.append(timed(node.patch))
            restore.append(timed(node.restore))
            node.reset(data)
            naive_p.append(timed(lambda: baselines.naive_patch(node.manifest, node.opts.host_config_dir,
                                                               node.config.main, node.config.config_hash)))
            naive_r.append(timed(lambda: baselines.naive_restore(node.manifest)))
            node.reset(data)
            floor.append(timed(lambda: baselines.floor(node.manifest)))
        for label, ms in (("patch step", patch), ("restore step", restore), ("naive patch", naive_p),
                          ("naive restore", naive_r), ("floor (read+write+fsync+rename)", floor)):
            rows.append((name, label, len(ms), *stats(ms)))
    return rows


def bench_apply_with_render(n: int) -> list[tuple[str, str, int, float, float]]:
    """The agent's real path on a config change: render the source too (config side, for information)."""
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp))
        src = node.opts.source / "extenders.yaml"
        texts = [SOURCE.read_text().replace("weight: 1", f"weight: {w}") for w in (10, 20)]
        ms = []
        for i in range(n):
            src.write_text(texts[i % 2])
            t0 = time.perf_counter()
            plan = nodefiles.plan_apply(node.opts)
            nodefiles.apply(node.opts, plan)
            ms.append((time.perf_counter() - t0) * 1000)
        return [("kubeadm", "apply (config changed: plan + write, kubeadm)", n, *stats(ms))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=200, help="repetitions per figure (>= 100 for the issue)")
    args = parser.parse_args()
    rows = []
    corpus = sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else []
    if corpus:
        rows += bench_set("corpus", corpus, args.n)
    rows += bench_set("examples", sorted(EXAMPLES.glob("*.yaml")), args.n)
    rows += bench_apply_with_render(args.n)
    for set_name, label, count, median, p99 in rows:
        bench_rows.record(bench_rows.Row(f"{set_name}: {label}", count, median, p99))
    base = {(r[0], r[1]): r[3] for r in rows}
    print(f"{'set':<9} {'figure':<46} {'n':>5} {'median ms':>10} {'p99 ms':>9} {'/naive':>7} {'/floor':>7} "
          f"{'target':>7}")
    for set_name, label, count, median, p99 in rows:
        kind = label.split()[0]
        naive = base.get((set_name, f"naive {kind}")) if kind in ("patch", "restore") else None
        floor = base.get((set_name, "floor (read+write+fsync+rename)"))
        r_naive = f"{median / naive:7.2f}" if naive else f"{'':>7}"
        r_floor = f"{median / floor:7.2f}" if floor and kind in ("patch", "restore", "naive") else f"{'':>7}"
        target = TARGETS.get(label)
        verdict = f"{'ok' if median <= target else 'MISSED':>7}" if target else f"{'':>7}"
        print(f"{set_name:<9} {label:<46} {count:>5} {median:>10.2f} {p99:>9.2f} {r_naive} {r_floor} {verdict}")


if __name__ == "__main__":
    main()
