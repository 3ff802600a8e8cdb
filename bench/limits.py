"""Time and RSS for the largest manifest the file side accepts.

Run in a fresh process (``python bench/limits.py``): RSS is the process's peak, imports included.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from patcher.core.settings import Files  # noqa: E402
from patcher.services import nodefiles  # noqa: E402

KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
SOURCE = ROOT / "examples/scheduler-config/extenders.yaml"


def largest_manifest() -> str:
    """kubeadm's manifest with 4,800 more flags (~4,900 nodes), padded with a comment to just below the size at
    which its patched form would pass the limit."""
    text = KUBEADM.read_text()
    flags = "".join(f"    - --v{i}={'x' * 12}\n" for i in range(4800))
    text = text.replace("    - --leader-elect=true\n", "    - --leader-elect=true\n" + flags)
    return text + "#" * (nodefiles.MAX_MANIFEST_BYTES - 700 - len(text.encode()) - 1) + "\n"


def main() -> None:
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node"
        manifest = node / "etc/kubernetes/manifests/kube-scheduler.yaml"
        manifest.parent.mkdir(parents=True)
        text = largest_manifest()
        manifest.write_text(text)
        src = Path(tmp) / "src"
        src.mkdir()
        shutil.copy(SOURCE, src / "extenders.yaml")
        opts = Files(source=src, host_root=node)
        t0 = time.perf_counter()
        nodefiles.apply(opts, nodefiles.plan_apply(opts))
        t1 = time.perf_counter()
        nodefiles.restore(opts, nodefiles.plan_restore(opts))
        t2 = time.perf_counter()
        assert manifest.read_text() == text
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"largest accepted manifest: {len(text.encode())} bytes; apply {1000 * (t1 - t0):.0f} ms, restore "
          f"{1000 * (t2 - t1):.0f} ms; peak RSS {rss:.1f} MiB (after imports {rss0:.1f} MiB)")


if __name__ == "__main__":
    main()
