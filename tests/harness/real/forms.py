"""Every form the agent writes, as static pod files the real kubelet of each release is shown
(tests/real/test_real_kubelet.py on the newest release's node, tests/real/test_real_kubeadm.py on each release's
`kubeadm init` node): the corpus' manifests patched by `scheduler-patcher apply`, CRLF kept, a foreign `--config`
merged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES, write_configmap
from tests.harness.real.controlplane import ROOT

MANIFESTS = "/etc/kubernetes/manifests"
EXTENDERS = "extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n  weight: 1\n"


def patched_forms(tmp: Path) -> dict[str, bytes]:
    """Every manifest of the corpus (tests/fixtures/manifests) as `scheduler-patcher apply` writes it, the
    foreign `--config` one merged, and the kubeadm one with CRLF line ends (the agent keeps a file's)."""
    from tests.unit.test_nodefiles import FOREIGN_CONFIG

    source = tmp / "source"
    source.mkdir(parents=True)
    write_configmap(source, {"extenders.yaml": EXTENDERS})
    fixtures = {p.stem: p.read_bytes() for p in sorted((FIXTURES / "manifests").glob("*.yaml"))}
    fixtures["kubeadm-crlf"] = fixtures["kubeadm"].replace(b"\n", b"\r\n")
    forms = {}
    for name, data in fixtures.items():
        root = tmp / name
        manifest = root / MANIFESTS.lstrip("/") / "kube-scheduler.yaml"
        manifest.parent.mkdir(parents=True)
        manifest.write_bytes(data)
        foreign = root / "srv" / "scheduler" / "scheduler-config.yaml"
        foreign.parent.mkdir(parents=True)
        foreign.write_text(FOREIGN_CONFIG)
        proc = subprocess.run([sys.executable, "-m", "patcher", "apply", "--host-root", str(root), "--source",
                               str(source), "--on-foreign-config", "merge"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
        assert proc.returncode == 0, f"apply {name}: {proc.stderr}"
        forms[name] = manifest.read_bytes()
        assert forms[name] != data and b"--config=/etc/kubernetes/scheduler-patcher/" in forms[name], name
    return forms


def renamed(data: bytes, name: str) -> bytes:
    """The pod's own name (its first `name:`, in metadata in every form) changed, the rest byte for byte: the
    forms then sit side by side in one static pod folder."""
    out, count = re.subn(rb'name: ("?)kube-scheduler\1', f"name: {name}".encode(), data, count=1)
    assert count == 1, data[:200]
    return out
