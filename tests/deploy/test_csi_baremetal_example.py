"""The worked csi-baremetal example (docs/csi-baremetal.md, examples/csi-baremetal/): ``plan`` accepts its source
for every kind of scheduler config it renders, the Helm values say the same as the source file, and a manifest the
csi-baremetal operator's own patcher left patched is merged, its stale copy of the extender replaced by ours."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from patcher.commands.cli import main
from tests.deploy.test_deploy_manifests import ROOT
from tests.harness.real.helmtool import find_helm, template

EXAMPLE = ROOT / "examples/csi-baremetal"
KUBEADM_EXAMPLE = ROOT / "examples/manifests/kube-scheduler.yaml"
#: Where the operator's patcher (csi-baremetal-se-patcher) keeps its files on a kubeadm node: a folder inside the
#: kubelet's manifest folder (the kubelet reads no sub-folder).
OPERATOR_CONFIG = "/etc/kubernetes/manifests/scheduler/config-29.yaml"


def node(tmp_path: Path, manifest: str) -> Path:
    root = tmp_path / "node"
    (root / "etc/kubernetes/manifests").mkdir(parents=True)
    (root / "etc/kubernetes/manifests/kube-scheduler.yaml").write_text(manifest)
    return root


def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(EXAMPLE / "extenders.yaml", src / "extenders.yaml")
    return src


@pytest.mark.parametrize(("version", "rendered"), [
    ("1.19", "kubescheduler.config.k8s.io/v1beta1"), ("1.22", "kubescheduler.config.k8s.io/v1beta2"),
    ("1.30", "kubescheduler.config.k8s.io/v1")])
def test_plan_accepts_the_example_for_each_kind_of_config(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          version: str, rendered: str) -> None:
    # The version as the node tells it, by the image tag (one older than the supported range is refused).
    root = node(tmp_path, KUBEADM_EXAMPLE.read_text().replace("kube-scheduler:v1.30.4", f"kube-scheduler:v{version}.0"))
    code = main(["plan", "--host-root", str(root), "--source", str(source(tmp_path))])
    out = capsys.readouterr()
    assert code == 2, out.err  # changes pending: the source is valid, nothing written
    assert rendered in out.out and "127.0.0.1:8889" in out.out
    assert "managedResources" not in out.out  # the extender is called for every pod


def operator_patched() -> str:
    """The example kubeadm manifest as the csi-baremetal operator's patcher leaves it on 1.29+ when it did not
    restore: its --config, its extra flag, and a hostPath volume of type File for the config."""
    text = KUBEADM_EXAMPLE.read_text()
    text = text.replace("    - --leader-elect=true\n", f"    - --leader-elect=true\n    - --config={OPERATOR_CONFIG}\n"
                        "    - --pod-max-in-unschedulable-pods-duration=60s\n")
    text = text.replace("      name: kubeconfig\n      readOnly: true\n",
                        "      name: kubeconfig\n      readOnly: true\n"
                        f"    - mountPath: {OPERATOR_CONFIG}\n      name: scheduler-config-29\n      readOnly: true\n")
    assert text.endswith("    name: kubeconfig\nstatus: {}\n")
    return text.replace("    name: kubeconfig\nstatus: {}\n", "    name: kubeconfig\n  - hostPath:\n"
                        f"      path: {OPERATOR_CONFIG}\n      type: File\n    name: scheduler-config-29\n"
                        "status: {}\n")


def test_the_operators_leftover_config_is_merged_and_its_extender_replaced(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = node(tmp_path, operator_patched())
    theirs = root / OPERATOR_CONFIG.lstrip("/")
    theirs.parent.mkdir()
    shutil.copy(ROOT / "tests/fixtures/configs/csi-baremetal/config-29.yaml", theirs)
    before = theirs.read_bytes()
    code = main(["apply", "--host-root", str(root), "--source", str(source(tmp_path)), "-o", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    (config,) = (root / "etc/kubernetes/scheduler-patcher").glob("config-*.yaml")
    doc = yaml.safe_load(config.read_text())
    assert [e["urlPrefix"] for e in doc["extenders"]] == ["http://127.0.0.1:8889"]  # one extender, not two
    assert doc["extenders"][0]["httpTimeout"] == "15s" and doc["leaderElection"] == {"leaderElect": True}
    assert theirs.read_bytes() == before  # their file is never modified
    manifest = (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_text()
    assert f"    - --config={OPERATOR_CONFIG}\n" not in manifest  # only in the marker, for the restore
    assert "--pod-max-in-unschedulable-pods-duration=60s" in manifest
    # a restore of ours puts their --config back, byte for byte: their file must stay while the manifest names it
    assert main(["restore", "--host-root", str(root)]) == 0
    assert (root / "etc/kubernetes/manifests/kube-scheduler.yaml").read_text() == operator_patched()


def test_the_helm_values_are_the_source_file(tmp_path: Path) -> None:
    values = yaml.safe_load((EXAMPLE / "values.yaml").read_text())
    assert values["extenders"] == yaml.safe_load((EXAMPLE / "extenders.yaml").read_text())["extenders"]
    helm, why = find_helm()
    if helm is None:
        pytest.skip(f"real helm unavailable ({why})")
    objs = template(helm, values, tmp_path)
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scheduler-patcher-source"]
    assert yaml.safe_load(cm["data"]["extenders.yaml"]) == {"extenders": values["extenders"]}
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    env = {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["PATCHER_COMPAT_CSI_BAREMETAL"], env["PATCHER_COMPAT_NAMESPACE"]) == ("true", "default")
