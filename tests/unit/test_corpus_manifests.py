"""Every real-world manifest in ../shared/corpus round-trips byte for byte, or is refused by a stated rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from patcher.core import manifestedit as m
from patcher.core.errors import ManifestError
from tests.conftest import corpus_manifests

SPEC = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-0123456789ab.yaml",
                   config_hash="0123456789ab" * 5, on_foreign="replace")
# Refused by rule: the scheduler is started through a shell string, which we never edit.
REFUSED = {
    "hyperkube-shell-wrapped-placeholders-kube-scheduler.yaml": "shell string",
    "k8s-upstream-ha-doc-fixture-shell-wrapped-kube-scheduler.yaml": "shell string",
}
FILES = corpus_manifests()


@pytest.mark.skipif(not FILES, reason="../shared/corpus is not present")
@pytest.mark.sweep
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_corpus_manifest_round_trips(path: Path) -> None:
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    if path.name in REFUSED:
        with pytest.raises(ManifestError, match=REFUSED[path.name]):
            m.patch(text, SPEC, path.name)
        return
    result = m.patch(text, SPEC, path.name)
    assert result.changed
    again = m.patch(result.text, SPEC, path.name)
    assert not again.changed and again.text == result.text
    assert m.restore(result.text, path.name, prefix="scheduler-patcher.io").encode("utf-8") == raw


@pytest.mark.skipif(not FILES, reason="../shared/corpus is not present")
def test_foreign_configs_in_the_corpus_are_refused_in_fail_mode() -> None:
    fail = m.PatchSpec(SPEC.host_config_dir, SPEC.config_file, SPEC.config_hash, on_foreign="fail")
    refused = []
    for path in FILES:
        if path.name in REFUSED:
            continue
        try:
            m.patch(path.read_text("utf-8"), fail, path.name)
        except ManifestError as exc:
            assert "already runs with --config=" in exc.problem
            refused.append(path.name)
    assert sorted(refused) == sorted(WITH_CONFIG)


# Manifests that already run the scheduler with a --config of their own (a commented-out flag does not count).
WITH_CONFIG = [
    "gpushare-kubeadm-v1.23.3-with-config-kube-scheduler.yaml",
    "grove-kind-args-only-with-config-kube-scheduler.yaml",
    "kops-golden-v1.28.0-kube-scheduler.manifest.yaml",
    "kops-golden-v1.33.0-kube-scheduler.manifest.yaml",
    "kubeadm-v1.16.10-with-config-extender-kube-scheduler.yaml",
    "kubeadm-v1.19.2-with-config-extender-kube-scheduler.yaml",
    "kubeadm-v1.26.3-with-config-kube-scheduler.yaml",
    "openshift4-operator-multi-container-kube-scheduler-pod.yaml",
    "qos-scheduler-template-indented-with-config-kube-scheduler.yaml",
    "scheduler-plugins-networktraffic-with-config-kube-scheduler.yaml",
    "scheduler-plugins-v0.25.7-indented-with-config-kube-scheduler.yaml",
    "scheduler-plugins-v0.30.6-with-config-kube-scheduler.yaml",
    "tkestack-gpu-manager-v1.27.4-commented-kube-scheduler.yaml",
    "topolvm-e2e-kubeadm-v1.18.16-with-config-kube-scheduler.yaml",
    "topolvm-e2e-kubeadm-v1.20.3-with-config-kube-scheduler.yaml",
]
