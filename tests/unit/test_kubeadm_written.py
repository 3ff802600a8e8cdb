"""The scheduler manifest the real `kubeadm init` writes, 1.34 to 1.37 (the same bytes but the image tag), patched
and restored by the pure core.

`tests/fixtures/kubeadm/kube-scheduler.yaml` is what kubeadm 1.37.2 wrote on the kubeadm node
(tests/harness/real/kubeadm_node.py), and tests/real/test_real_kubeadm.py checks that each release's kubeadm still
writes it. Unlike the older kubeadm manifest of tests/fixtures/manifests/ and every kubeadm one of the shared corpus,
its probes name a port (`probe-port`, declared under `ports:`), it has startup and readiness probes, and `priority`.
"""

from __future__ import annotations

from pathlib import Path

from patcher.core import manifestedit as m

KUBEADM_INIT = Path(__file__).resolve().parents[1] / "fixtures" / "kubeadm" / "kube-scheduler.yaml"
SPEC = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-0123456789ab.yaml",
                   config_hash="0123456789ab" * 5, on_foreign="fail")


def test_the_manifest_kubeadm_init_writes_is_patched_once_and_restored_byte_for_byte() -> None:
    raw = KUBEADM_INIT.read_bytes()
    result = m.patch(raw.decode("utf-8"), SPEC, KUBEADM_INIT.name)
    assert result.changed
    assert "    - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n" in result.text
    assert "      path: /etc/kubernetes/scheduler-patcher\n" in result.text
    again = m.patch(result.text, SPEC, KUBEADM_INIT.name)
    assert not again.changed and again.text == result.text
    assert m.restore(result.text, KUBEADM_INIT.name, prefix="scheduler-patcher.io").encode("utf-8") == raw


def test_the_patch_leaves_kubeadm_s_probes_and_their_named_port_as_they_are() -> None:
    raw = KUBEADM_INIT.read_text("utf-8")
    patched = m.patch(raw, SPEC, KUBEADM_INIT.name).text
    for kept in ("    ports:\n    - containerPort: 10259\n      name: probe-port\n", "    startupProbe:\n",
                 "    readinessProbe:\n", "        port: probe-port\n", "  priority: 2000001000\n"):
        assert raw.count(kept) == patched.count(kept) > 0, kept
