"""The MutatingAdmissionPolicy that gates pods at creation (manifests/gatekeeper/admission), rendered by the real
``kubectl kustomize`` and validated against the OpenAPI schema of the API version it is served as, then its CEL
evaluated against sample pods with a CEL runtime (``common-expression-language``, the cel-rust interpreter).

What the CEL test covers, and what it does not: every ``matchCondition`` and ``variable`` expression is
evaluated as written, with ``object`` (the pod, as JSON), ``params`` (the readiness ConfigMap) and
``variables`` bound as the API server binds them; the mutation's ``JSONPatch{...}`` literals are evaluated
after renaming that Kubernetes-only type to a plain map (the one textual change, counted so that a rewrite
of the expression fails here), and the resulting JSON patch is applied to the pod with the emulator's RFC 6902
implementation. Not covered: the API server's typed (schema-aware) CEL environment, its cost limits, and
the binding's namespace/object selectors and ``paramRef`` resolution (plain label selectors, checked here by
their rendered values only).

The CEL tests run against both sources of the policy: the kustomize component and the Helm chart's render
(``gatekeeper.admission``, real helm; that case skips with one line without it). tests/deploy/test_helm_chart.py holds
the two renders equal object for object; here each source's own way of setting the selection is evaluated.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml

from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME
from patcher.core.gates import DEFAULT_GATE
from patcher.core.readiness import evaluate, status_data
from tests.deploy.test_deploy_manifests import MANIFESTS, kubectl, render
from tests.harness import admission_samples as samples
from tests.harness.admission_samples import new_pod
from tests.harness.emu.kubeemu import json_patch
from tests.harness.real.helmtool import find_helm, template

V1, V1BETA1 = "overlays/gatekeeper-admission", "overlays/gatekeeper-admission-v1beta1"
#: The first Kubernetes whose schemas (shipped in kubernetes-validate) know each API version.
SCHEMA = {"admissionregistration.k8s.io/v1": "1.36", "admissionregistration.k8s.io/v1beta1": "1.34"}
OTHER = "example.com/other"


def rendered(overlay: str) -> list[dict[str, Any]]:
    return render(MANIFESTS / overlay)


def policy_objects(overlay: str) -> tuple[dict[str, Any], dict[str, Any]]:
    objs = rendered(overlay)
    policy = next(o for o in objs if o["kind"] == "MutatingAdmissionPolicy")
    binding = next(o for o in objs if o["kind"] == "MutatingAdmissionPolicyBinding")
    return policy, binding


@pytest.mark.parametrize(("overlay", "version"), [(V1, "v1"), (V1BETA1, "v1beta1")])
def test_the_overlays_render_the_gatekeeper_plus_a_valid_policy_and_binding(overlay: str, version: str) -> None:
    objs = rendered(overlay)
    base = {(o["kind"], o["metadata"]["name"]) for o in render(MANIFESTS / "gatekeeper")}
    added = [o for o in objs if (o["kind"], o["metadata"]["name"]) not in base]
    assert sorted(o["kind"] for o in added) == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    for obj in added:
        assert obj["apiVersion"] == f"admissionregistration.k8s.io/{version}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "scheduler-patcher"
        try:
            kubernetes_validate.validate(obj, SCHEMA[obj["apiVersion"]], strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")


def test_strict_validation_would_catch_a_misspelt_field() -> None:
    policy, _ = policy_objects(V1)
    policy["spec"]["matchConditions"][0]["expresion"] = "true"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, "1.36", strict=True)


def test_the_binding_reads_the_verdict_the_agents_publish_and_spares_system_namespaces() -> None:
    policy, binding = policy_objects(V1)
    spec = binding["spec"]
    assert spec["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    # The ConfigMap `scheduler-patcher run --publish-status` writes, in the agents' namespace.
    assert spec["paramRef"] == {"name": DEFAULT_STATUS_NAME, "namespace": "scheduler-patcher",
                                "parameterNotFoundAction": "Allow"}
    ns = spec["matchResources"]["namespaceSelector"]
    assert ns["matchLabels"] == {"scheduler-patcher.io/gate": "enabled"}
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "scheduler-patcher"]} in ns["matchExpressions"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    assert policy["spec"]["failurePolicy"] == "Ignore"


# -- the CEL, evaluated ---------------------------------------------------------------------------------------


class Policy:
    """The rendered policy's expressions, evaluated as the API server would for one pod and one ConfigMap."""

    def __init__(self, spec: dict[str, Any], **variables: Any) -> None:
        self.spec = copy.deepcopy(spec)
        for var in self.spec["variables"]:
            if var["name"] in variables:  # what an operator's kustomize patch of that expression does
                var["expression"] = variables[var["name"]]

    def admit(self, pod: dict[str, Any], configmap: dict[str, Any] | None) -> dict[str, Any]:
        """The pod after admission (``configmap`` None: the paramRef finds nothing)."""
        if configmap is None:
            return pod  # parameterNotFoundAction: Allow: the policy is not applied
        # matchConditions first, and without variables: the API server compiles them without (a reference to
        # variables there is a 422 on create, which the real-cluster install test meets).
        ctx: dict[str, Any] = {"object": pod, "params": configmap}
        for cond in self.spec["matchConditions"]:
            assert "variables." not in cond["expression"], f"matchCondition {cond['name']} reads variables"
            result = cel.evaluate(cond["expression"], ctx)
            assert isinstance(result, bool), (cond["name"], result)
            if not result:
                return pod
        ctx["variables"] = {}
        for var in self.spec["variables"]:
            ctx["variables"][var["name"]] = cel.evaluate(var["expression"], ctx)
        out = pod
        for mutation in self.spec["mutations"]:
            assert mutation["patchType"] == "JSONPatch"
            out = json_patch(out, cel.evaluate(plain_jsonpatch(mutation["jsonPatch"]["expression"]), {**ctx,
                                                                                                  "object": out}))
        return out


def plain_jsonpatch(expression: str) -> str:
    """``JSONPatch{op: .., path: .., value: ..}`` as a CEL map literal (the runtime has no Kubernetes types)."""
    literals = expression.count("JSONPatch{")
    assert literals == 2  # one per branch: a rewrite of the expression must revisit this test
    plain = expression.replace("JSONPatch{op:", '{"op":').replace(", path:", ', "path":').replace(", value:",
                                                                                                ', "value":')
    assert plain.count('{"op":') == literals and plain.count('"path":') == literals
    return plain


def configmap(ready: bool | None) -> dict[str, Any]:
    """The readiness ConfigMap as the agents publish it (``status_data`` of a verdict: no control-plane node
    seen, so not Ready; its ``ready`` key flipped for Ready); ``None``: a ConfigMap without data."""
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": DEFAULT_STATUS_NAME, "namespace": "scheduler-patcher"}}
    if ready is not None:
        cm["data"] = status_data(evaluate([], {}))
        assert cm["data"]["ready"] == "false"
        cm["data"]["ready"] = "true" if ready else "false"
    return cm


def gates(pod: dict[str, Any]) -> list[str] | None:
    value = pod["spec"].get("schedulingGates")
    return None if value is None else [g["name"] for g in value]


def cel_list(names: list[str]) -> str:
    """A CEL list literal of single-quoted strings, as docs/scheduling-gates.md's overlay example writes them."""
    return "[" + ", ".join(f"'{name}'" for name in names) + "]"


MakePolicy = Callable[..., Policy]  # (**selection: list[str]) -> the Policy selecting that


@pytest.fixture(scope="module", params=["kustomize", "helm"])
def policy_for(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> MakePolicy:
    """The policy of each source, with a selection (schedulerNames, storageClasses, csiDrivers) set the way that
    source sets it: the component's variables patched (as docs/scheduling-gates.md's overlay example does), or the
    chart's values gatekeeper.admission.* (so the chart's own rendering of those lists is what gets evaluated)."""
    if request.param == "kustomize":
        spec = policy_objects(V1)[0]["spec"]
        return lambda **selection: Policy(spec, **{k: cel_list(v) for k, v in selection.items()})
    helm, why_not = find_helm()
    if helm is None:
        pytest.skip(f"real helm unavailable ({why_not})")
    tmp = tmp_path_factory.mktemp("helm-admission")
    specs: dict[str, dict[str, Any]] = {}

    def make(**selection: list[str]) -> Policy:
        key = repr(sorted(selection.items()))
        if key not in specs:
            values = {"gatekeeper": {"enabled": True, "admission": {"enabled": True, **selection}}}
            specs[key] = next(o for o in template(helm, values, tmp) if o["kind"] == "MutatingAdmissionPolicy")["spec"]
        return Policy(specs[key])

    return make


@pytest.mark.parametrize("sample", samples.SAMPLES, ids=lambda s: s.id)
def test_the_shared_samples(policy_for: MakePolicy, sample: samples.Sample) -> None:
    """The table tests/deploy/test_webhook_rules.py runs through the webhook's rules: both paths give these gates."""
    policy = policy_for(**sample.selection)
    assert samples.gates(policy.admit(sample.pod(), samples.configmap(sample.verdict))) == sample.gates


def test_a_pod_gets_the_gate_while_the_verdict_is_not_ready(policy_for: MakePolicy) -> None:
    policy = policy_for()
    assert gates(policy.admit(new_pod(), configmap(False))) == [DEFAULT_GATE]
    assert gates(policy.admit(new_pod(), configmap(None))) == [DEFAULT_GATE]  # a ConfigMap without data
    # Other gates are kept, ours goes last.
    assert gates(policy.admit(new_pod(schedulingGates=[{"name": OTHER}]), configmap(False))) == [OTHER, DEFAULT_GATE]


def test_no_gate_while_ready_nor_twice_nor_on_a_bound_pod_nor_without_the_configmap(policy_for: MakePolicy) -> None:
    policy = policy_for()
    assert gates(policy.admit(new_pod(), configmap(True))) is None  # steady state: nothing added
    assert gates(policy.admit(new_pod(), None)) is None  # the agents have published nothing yet
    already = new_pod(schedulingGates=[{"name": DEFAULT_GATE}, {"name": OTHER}])
    assert gates(policy.admit(already, configmap(False))) == [DEFAULT_GATE, OTHER]
    assert gates(policy.admit(new_pod(nodeName="worker-1"), configmap(False))) is None


def test_scheduler_names_select_pods(policy_for: MakePolicy) -> None:
    policy = policy_for()  # default: pods of the default scheduler
    assert gates(policy.admit(new_pod(schedulerName="my-scheduler"), configmap(False))) is None
    no_name = new_pod()
    del no_name["spec"]["schedulerName"]
    assert gates(policy.admit(no_name, configmap(False))) == [DEFAULT_GATE]  # defaults to default-scheduler
    custom = policy_for(schedulerNames=["my-scheduler"])
    assert gates(custom.admit(new_pod(schedulerName="my-scheduler"), configmap(False))) == [DEFAULT_GATE]
    assert gates(custom.admit(new_pod(), configmap(False))) is None
    anyone = policy_for(schedulerNames=[])
    assert gates(anyone.admit(new_pod(schedulerName="x"), configmap(False))) == [DEFAULT_GATE]


def test_storage_selects_pods_by_what_cel_can_see_in_the_pod(policy_for: MakePolicy) -> None:
    csi = policy_for(storageClasses=["csi-baremetal-sc-hdd"], csiDrivers=["csi-baremetal.dell.com"])
    ephemeral = {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "storageClassName": "csi-baremetal-sc-hdd", "accessModes": ["ReadWriteOnce"]}}}}
    inline = {"name": "inline", "csi": {"driver": "csi-baremetal.dell.com"}}
    other = {"name": "other", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "standard"}}}}
    no_class = {"name": "default-class", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}
    claim = {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}
    assert gates(csi.admit(new_pod(volumes=[claim, ephemeral]), configmap(False))) == [DEFAULT_GATE]
    assert gates(csi.admit(new_pod(volumes=[inline]), configmap(False))) == [DEFAULT_GATE]
    assert gates(csi.admit(new_pod(volumes=[other, no_class]), configmap(False))) is None
    # A claim by name: its StorageClass is on the PVC, which CEL cannot read. Selected by namespace/labels.
    assert gates(csi.admit(new_pod(volumes=[claim]), configmap(False))) is None
    assert gates(csi.admit(new_pod(), configmap(False))) is None
    assert gates(policy_for().admit(new_pod(volumes=[claim]), configmap(False))) == [DEFAULT_GATE]  # no filter


def readme_overlay(tmp_path: Path, title: str = "# your overlay's kustomization.yaml:") -> list[dict[str, Any]]:
    """The objects of the overlay example in docs/scheduling-gates.md whose first line starts with ``title``
    (the policy's; the webhook's says "(webhook):"), rendered by the real kubectl kustomize."""
    doc = (MANIFESTS.parent / "docs/scheduling-gates.md").read_text()
    found = re.search(r"```yaml\n(" + re.escape(title) + r".*?)```", doc, re.S)
    assert found, "docs/scheduling-gates.md: the overlay example is gone"
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(MANIFESTS / "gatekeeper", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(found.group(1).replace("../../gatekeeper", base))
    proc = subprocess.run([kubectl(), "kustomize", "--load-restrictor=LoadRestrictionsNone", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if isinstance(o, dict)]


def test_the_readme_overlay_example_renders_and_selects_what_it_says(tmp_path: Path) -> None:
    objs = readme_overlay(tmp_path)
    policy = next(o for o in objs if o["kind"] == "MutatingAdmissionPolicy")
    binding = next(o for o in objs if o["kind"] == "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["objectSelector"] == {"matchLabels": {"app": "db"}}
    hdd = {"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "csi-baremetal-sc-hddlvg"}}}}
    admitted = Policy(policy["spec"]).admit(new_pod(volumes=[hdd]), configmap(False))
    assert gates(admitted) == [DEFAULT_GATE]
    assert gates(Policy(policy["spec"]).admit(new_pod(), configmap(False))) is None
