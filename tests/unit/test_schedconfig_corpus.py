"""Every real-world config in ../shared/corpus/configs through strict validation, and through a merge of one of
our extenders where the file can be a foreign ``--config``.

The expected outcome of each file is recorded here, so a change in validation shows up as a failing test.
Skipped when the corpus is not next to the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, ForeignConfig, build_config
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.yamlio import load_single, to_plain
from tests.unit.test_schedconfig_source import make_configmap

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "configs"
pytestmark = [pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not present"), pytest.mark.sweep]

REPLACE_ME = "clientConnection.kubeconfig: must be an absolute path"
XVERSIONX = "apiVersion: 'kubescheduler.config.k8s.io/XVERSIONX' is not a known"
# apiVersions and the legacy Policy of kube-scheduler 1.18 and older: outside the supported range (1.19-1.37)
OLD_API = "is not a known KubeSchedulerConfiguration apiVersion"
POLICY = "not a KubeSchedulerConfiguration (kind is 'Policy')"

# file -> None when it validates, else a piece of the expected refusal.
VALIDATION: dict[str, str | None] = {
    "cap-k8s-v1-topologicalsort-commented.yaml": None,
    "cka-notes-multi-profile-apiversion-typo.yaml": "apiVersion: 'kuberscheduler.config.k8s.io/v1' is not a known",
    "coscheduling-v1beta1-commented.yaml": None,
    "csi-baremetal-operator-policy-v1-commented.yaml": POLICY,
    "csi-baremetal-operator-v1alpha1-policy-file.yaml": OLD_API,
    "csi-baremetal-scheduler-plugin-v1alpha1.yaml": OLD_API,
    "gpushare-policy-v1.json": POLICY,
    "gpushare-v1beta2-extender.yaml": None,
    "ibm-kube-safe-scheduler-policy-v1-two-extenders.json": POLICY,
    "ibm-kube-safe-scheduler-v1alpha1-policy-configmap.yaml": OLD_API,
    "intel-tas+gas-two-extenders-crlf.yaml": XVERSIONX,
    "intel-tas-extender-crlf.yaml": XVERSIONX,
    "intel-tas-policy-v1-tls.json": POLICY,
    "k8s-scheduler-perf-policy-predicates-priorities-v1.json": POLICY,
    "k8s-scheduler-perf-serviceaffinity-v1beta1.yaml": None,
    "kind-scheduler-v1alpha1.yaml": OLD_API,
    "kops-golden-v1-minimal.yaml": None,
    "kube-scheduler-simulator-v1-full-trailing-ws.yaml": None,
    "limit-await-v1beta1-commented.yaml": None,
    "masterthesis-v1-3space-indent.yaml": None,
    "onuryilmaz-extender-v1beta1.yaml": None,
    "openshift4-defaultconfig-v1.yaml": None,
    "openshift4-highnodeutilization-v1.yaml": None,
    "openshift4-noscoring-v1beta1.yaml": None,
    "openshift4.1-postbootstrap-v1alpha1.yaml": OLD_API,
    "proins-extender-policy-v1.json": POLICY,
    "proins-extender-v1alpha1-policy-file.yaml": OLD_API,
    "qos-scheduler-v1beta1-plugins-args.yaml": None,
    "reverse-sort-v1alpha2-full.yaml": OLD_API,
    "sample-extender-policy-v1.yaml": POLICY,
    "sample-extender-v1alpha1-policy-file.yaml": OLD_API,
    "scheduler-plugins-coscheduling-v1.yaml": REPLACE_ME,
    "scheduler-plugins-coscheduling-v1alpha2.yaml": OLD_API,
    "scheduler-plugins-coscheduling-v1beta2.yaml": REPLACE_ME,
    "scheduler-plugins-networktopology-v1.yaml": None,
    "scheduler-plugins-nodemetadata-v1-multidoc.yaml": "4 YAML documents: kube-scheduler reads only the first",
    "scheduler-plugins-noderesources-v1beta1.yaml": REPLACE_ME,
    "scheduler-plugins-trimaran-v1beta3.yaml": REPLACE_ME,
    "stork-policy-v1.json": POLICY,
    "stork-v1beta3-full-extender.yaml": None,
    "temple-extender-policy-v1.json": POLICY,
    "tkestack-gpu-v1-full-json.json": None,
    "topolvm-policy-v1.json": POLICY,
    "topolvm-rancher-rke1-v1alpha1.yaml": OLD_API,
    "topolvm-v1.yaml": None,
    "topolvm-v1alpha1-policy-file.yaml": OLD_API,
    "topolvm-v1beta1.yaml": None,
    "topolvm-v1beta2.yaml": None,
    "topolvm-v1beta3.yaml": None,
    "zhengyansheng-extender-v1-cjk-comment.yaml": None,
}

# Valid KubeSchedulerConfigurations, merged as the foreign --config: None when the merge succeeds.
MERGE: dict[str, str | None] = {name: None for name, expected in VALIDATION.items() if expected is None}
# A minor version that serves each apiVersion, to merge at.
MERGE_AT = {"v1beta1": "1.21", "v1beta2": "1.22", "v1beta3": "1.27", "v1": "1.30"}
OURS = (
    "extenders:\n- urlPrefix: http://127.0.0.1:18889\n  filterVerb: filter\n  prioritizeVerb: prioritize\n"
    "  weight: 1\n"
)


def test_every_corpus_file_has_an_expectation() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(VALIDATION)


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_validation(name: str) -> None:
    path = str(CORPUS / name)
    expected = VALIDATION[name]
    if expected is None:
        validate_document(load_single((CORPUS / name).read_text(encoding="utf-8"), path), path)
        return
    with pytest.raises(ConfigError) as err:
        validate_document(load_single((CORPUS / name).read_text(encoding="utf-8"), path), path)
    assert err.value.path == path
    assert expected in err.value.problem


def _comments(text: str) -> list[str]:
    return [m.group(0).strip() for m in re.finditer(r"(?m)(?:^|\s)#.*$", text)]


@pytest.mark.parametrize("name", sorted(MERGE))
def test_merge(tmp_path: Path, name: str) -> None:
    text = (CORPUS / name).read_text(encoding="utf-8")
    version = MERGE_AT[str(load_single(text, name)["apiVersion"]).rsplit("/", 1)[1]]
    request = ConfigRequest(
        source_dir=make_configmap(tmp_path / "cm", {"extenders.yaml": OURS}),
        host_config_dir="/etc/kubernetes/scheduler-patcher",
        kube_version=version,
        foreign=ForeignConfig("/etc/kubernetes/" + name, "/etc/kubernetes/" + name, text),
    )
    expected = MERGE[name]
    if expected is not None:
        with pytest.raises(ConfigError, match=re.escape(expected)):
            build_config(request)
        return
    rendered = build_config(request)
    out = rendered.files[rendered.main].decode()
    before, after = to_plain(load_single(text, name)), to_plain(load_single(out, rendered.main))
    theirs = before.pop("extenders", None) or []  # kept in order (no corpus config holds our URL), ours appended
    assert after.pop("extenders") == [*theirs, {"urlPrefix": "http://127.0.0.1:18889", "filterVerb": "filter",
                                                 "prioritizeVerb": "prioritize", "weight": 1}]
    assert after == before  # every other field, profile and plugin kept
    assert [c for c in _comments(out) if not c.startswith("# Rendered by")] == _comments(text)
