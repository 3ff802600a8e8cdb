"""The simulated kubelet follows what the real one was seen doing (tests/test_real_kubelet.py, issue 34)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIXTURES
from tests.helpers import MANIFEST
from tests.kubeemu import KubeEmulator
from tests.kubeletsim import SimKubelet

NODE = "cp-1"


def mirror(emu: KubeEmulator) -> tuple[str, str]:
    pod = emu.get("pods", f"kube-scheduler-{NODE}", "kube-system")
    assert pod is not None
    return pod["metadata"]["uid"], pod["metadata"]["annotations"]["kubernetes.io/config.hash"]


def test_a_byte_only_change_restarts_nothing_and_a_changed_pod_restarts(tmp_path: Path) -> None:
    original = (FIXTURES / "manifests" / "kubeadm.yaml").read_bytes()
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(original)
    with KubeEmulator() as emu:
        kubelet = SimKubelet(emu, NODE, tmp_path)
        kubelet.sync()
        first = mirror(emu)
        manifest.write_bytes((original.decode() + "# a comment\n").replace("\n", "\r\n").encode())
        kubelet.sync()
        assert mirror(emu) == first and len(kubelet.restarts) == 1
        manifest.write_bytes(original.replace(b"    - --leader-elect=true\n", b"    - --leader-elect=true\n"
                                                                              b"    - --v=1\n"))
        kubelet.sync()
        uid, config_hash = mirror(emu)
        assert uid != first[0] and config_hash != first[1] and len(kubelet.restarts) == 2
        assert len(config_hash) == 32  # the real kubelet's: the hex of an md5


def test_metadata_uid_is_the_config_hash_across_edits(tmp_path: Path) -> None:
    """RKE2's manifests set metadata.uid: the real kubelet keeps it as the hash, and still replaces the pod."""
    original = (FIXTURES / "manifests" / "args-rke2.yaml").read_bytes()
    manifest = tmp_path / MANIFEST
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(original)
    with KubeEmulator() as emu:
        kubelet = SimKubelet(emu, NODE, tmp_path)
        kubelet.sync()
        first = mirror(emu)
        assert first[1] == "1f3d2c4e-0000-4000-8000-000000000001"
        manifest.write_bytes(original.replace(b"    - --profiling=false\n", b"    - --profiling=false\n    - --v=1\n"))
        kubelet.sync()
        uid, config_hash = mirror(emu)
        assert config_hash == first[1] and uid != first[0] and len(kubelet.restarts) == 2
