"""The Helm chart, rendered by the real helm, held to the kustomize manifests and to the code.

One source of truth: each chart render is compared, whole object by whole object, with the kustomization it stands
for (the default values with ``manifests/overlays/kubeadm`` plus its restore Job, ``platform=rke2`` with the rke2
overlay, and so on). Only the differences listed in ``normalise`` are forgiven, so any other drift (a security
setting, a host path, an RBAC verb, a probe, a toleration) fails here, and the property tests of
test_deploy_manifests.py therefore hold for the chart too. Renders are validated against the Kubernetes OpenAPI
schema strictly, the values schema must refuse typos, and the settings a render sets are read back through the
real CLI parser.

helm comes from ``../shared/tools/get-helm.sh`` (real helm 4): without it this module skips with one line
(tests/deploy/test_chart_values.py checks what needs no helm).
"""

from __future__ import annotations

import base64
import copy
import json
import shlex
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import patcher
from patcher.adapters.httpserver import CertReloader, HttpServer
from patcher.commands.cli import CLUSTER_COMMANDS, build_parser
from patcher.core.admission import Selection
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.services.webhook import AdmissionWebhook
from tests.deploy.test_chart_values import ALL_VALUES
from tests.deploy.test_deploy_manifests import (
    K8S_SCHEMA,
    all_containers,
    api_calls_in,
    configmap_folder,
    env_of,
    flag_env_names,
    host_mounts,
    modules_of,
    objects,
    parsed,
    pod_spec,
    subparser,
)
from tests.deploy.test_deploy_manifests import clean_env as cli_env  # noqa: F401  (a fixture: no PATCHER_* leaks in)
from tests.deploy.test_gate_admission import SCHEMA as ADMISSION_SCHEMA
from tests.deploy.test_gate_admission import Policy, configmap, gates, readme_overlay
from tests.deploy.test_webhook_rules import review
from tests.harness.admission_samples import new_pod
from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE, find_helm, run_helm, template

#: Labels helm's convention adds to every object (kustomize's objects carry only name/part-of/component).
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
#: Annotations that only mean something to helm: the restore Job is a post-delete hook, and a chart-made
#: Namespace is kept on uninstall so that hook can still run in it.
HELM_ANNOTATIONS = {"helm.sh/hook", "helm.sh/hook-delete-policy", "helm.sh/hook-weight", "helm.sh/resource-policy"}
#: ConfigMap keys holding YAML that the chart writes from values (toYaml: no comments, sorted keys): compared parsed.
YAML_DATA = {"extenders.yaml"}

Obj = dict[str, Any]
Render = Callable[..., Any]  # (values=None, *, expect_error=False) -> the objects, or helm's error text


# -- helm -----------------------------------------------------------------------------------------------------


HELM, WHY_NOT = find_helm()
if HELM is None:
    pytest.skip(f"real helm unavailable ({WHY_NOT})", allow_module_level=True)


@pytest.fixture(scope="session")
def helm() -> str:
    assert HELM is not None
    return HELM


@pytest.fixture(scope="session")
def render(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Render]:
    """``helm template`` of the chart with the given values (hooks included), cached for the session."""
    tmp = tmp_path_factory.mktemp("helm")
    cache: dict[str, list[Obj]] = {}

    def _render(values: Obj | None = None, *, expect_error: bool = False, namespace: str = NAMESPACE) -> Any:
        key = json.dumps([values or {}, namespace], sort_keys=True)
        if key not in cache or expect_error:
            if expect_error:
                proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", namespace,
                                values=values or {}, tmp=tmp)
                assert proc.returncode != 0, f"helm template accepted {values}"
                return proc.stderr
            cache[key] = template(helm, values or {}, tmp, namespace)
        return copy.deepcopy(cache[key])

    yield _render


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# -- the comparison -------------------------------------------------------------------------------------------


def normalise(obj: Any) -> Any:
    """``obj`` with only the documented, intended helm/kustomize differences taken out (see the constants above),
    and lists of named items (containers, env, volumes, mounts, ports) keyed by name: their order means nothing."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key == "metadata" and isinstance(value, dict):
                value = dict(value)
                for field, drop in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
                    kept = {k: v for k, v in (value.get(field) or {}).items() if k not in drop}
                    value.pop(field, None)
                    if kept:
                        value[field] = kept
            if key == "data" and isinstance(value, dict) and obj.get("kind") == "ConfigMap":
                value = {k: yaml.safe_load(v) if k in YAML_DATA else v for k, v in value.items()}
            out[key] = normalise(value)
        return out
    if isinstance(obj, list):
        items = [normalise(v) for v in obj]
        names = [v.get("name") if isinstance(v, dict) else None for v in items]
        if items and None not in names and len(set(names)) == len(names):
            return {f"[{n}]": v for n, v in zip(names, items, strict=True)}
        return items
    return obj


def identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every path where ``a`` (kustomize) and ``b`` (helm) differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path and not str(key).startswith("[") else f"{path}{key}"
            if key not in a:
                out.append(f"{sub}: only in helm: {b[key]!r}")
            elif key not in b:
                out.append(f"{sub}: only in kustomize: {a[key]!r}")
            else:
                out += differences(a[key], b[key], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: kustomize {a!r} != helm {b!r}"]


def drift(kustomize: list[Obj], helm: list[Obj]) -> list[str]:
    k = {identity(o): normalise(o) for o in kustomize}
    h = {identity(o): normalise(o) for o in helm}
    assert len(k) == len(kustomize) and len(h) == len(helm), "an object appears twice"
    out = [f"{i[1]} {i[2]}/{i[3]}: only in kustomize" for i in sorted(set(k) - set(h))]
    out += [f"{i[1]} {i[2]}/{i[3]}: only in helm" for i in sorted(set(h) - set(k))]
    for i in sorted(set(k) & set(h)):
        out += [f"{i[1]}/{i[3]}: {d}" for d in differences(k[i], h[i])]
    return out


def kustomize(*names: str) -> list[Obj]:
    """The objects of several kustomizations together, each object once (the uninstall Namespace is the install's)."""
    seen: dict[tuple[str, str, str, str], Obj] = {}
    for name in names:
        for obj in objects(name):
            assert seen.setdefault(identity(obj), obj) == obj, f"{name}: {identity(obj)} differs from another folder's"
    return list(seen.values())


#: The folder the kustomize overlay for a foreign --config mounts (csi-baremetal-operator's patcher's).
FOREIGN_DIRS = ["/etc/kubernetes/scheduler"]
MASTER_ONLY = {"kubernetes.io/os": "linux", "node-role.kubernetes.io/master": ""}
#: kustomizations -> the values that render the same objects (besides the chart's restore Job: its uninstall folder).
EQUIVALENTS: list[tuple[tuple[str, ...], Obj]] = [
    (("overlays/kubeadm", "uninstall/kubeadm"), {}),
    (("overlays/rke2", "uninstall/rke2"), {"platform": "rke2"}),
    (("overlays/local-check", "uninstall/kubeadm"), {"agent": {"localCheck": True}}),
    (("overlays/master-label", "uninstall/kubeadm"), {"nodeSelector": MASTER_ONLY}),
    (("overlays/csi-baremetal", "uninstall/kubeadm"), {"csiBaremetal": {"enabled": True}}),
    (("overlays/foreign-config", "uninstall/kubeadm"), {"hostPaths": {"foreignConfigDirs": FOREIGN_DIRS}}),
    (("overlays/kubeadm", "uninstall/kubeadm", "gatekeeper"), {"gatekeeper": {"enabled": True}}),
    (("overlays/kubeadm", "uninstall/kubeadm", "overlays/gatekeeper-admission"),
     {"gatekeeper": {"enabled": True, "admission": {"enabled": True}}}),
    (("overlays/kubeadm", "uninstall/kubeadm", "overlays/gatekeeper-admission-v1beta1"),
     {"gatekeeper": {"enabled": True, "admission": {"enabled": True, "apiVersion": "v1beta1"}}}),
    (("overlays/kubeadm", "uninstall/kubeadm", "overlays/gatekeeper-webhook"),
     {"gatekeeper": {"enabled": True, "webhook": {"enabled": True, "certManager": True}}}),
]


#: The chart's pre-delete hook has no kustomize object: manifests/uninstall/README.md deletes the DaemonSet with
#: `kubectl delete --cascade=foreground` (which waits as the hook does) before the rest.
NO_STOP_HOOK: Obj = {"stopAgentsJob": {"enabled": False}}


def test_the_default_render_is_the_kubeadm_overlay_and_its_restore_job(render: Render) -> None:
    """The chart's defaults against the README's default install: the one difference is the Namespace, which helm
    leaves to `--create-namespace` unless namespace.create is set (the next test compares it too), and the
    pre-delete hook's objects, helm's own way to do what the README's `kubectl delete --cascade=foreground` does."""
    found = drift(kustomize("overlays/kubeadm", "uninstall/kubeadm"), render())
    assert found == ["Namespace /scheduler-patcher: only in kustomize",
                     *[f"{kind} scheduler-patcher/scheduler-patcher-stop-agents: only in helm"
                       for kind in ("Job", "Role", "RoleBinding", "ServiceAccount")]]


@pytest.mark.parametrize(("folders", "values"), EQUIVALENTS, ids=["+".join(f) for f, _ in EQUIVALENTS])
def test_chart_and_kustomize_render_the_same_objects(render: Render, folders: tuple[str, ...], values: Obj) -> None:
    found = drift(kustomize(*folders), render({**values, **NO_STOP_HOOK, "namespace": {"create": True}}))
    assert not found, "the chart and manifests/ drifted apart:\n" + "\n".join(found)


def test_the_readme_admission_example_is_the_charts_values(render: Render, tmp_path: Path) -> None:
    """The overlay example of docs/scheduling-gates.md (csi-baremetal storage, pods labelled app=db) and the chart
    values that say the same select the same pods: the objects are equal."""
    values = {**NO_STOP_HOOK, "namespace": {"create": True}, "gatekeeper": {"enabled": True, "admission": {
        "enabled": True, "storageClasses": ["csi-baremetal-sc-hddlvg"], "csiDrivers": ["csi-baremetal.dell.com"],
        "objectSelector": {"matchLabels": {"app": "db"}}}}}
    found = drift(kustomize("overlays/kubeadm", "uninstall/kubeadm") + readme_overlay(tmp_path), render(values))
    assert not found, "the chart and docs/scheduling-gates.md's overlay example drifted apart:\n" + "\n".join(found)


def test_the_readme_webhook_example_is_the_charts_values(render: Render, tmp_path: Path) -> None:
    """The webhook overlay example of docs/scheduling-gates.md and the chart values that say the same (the selection in
    gatekeeper.admission.*, cert-manager as in the overlay): the objects are equal."""
    values = {**NO_STOP_HOOK, "namespace": {"create": True}, "gatekeeper": {"enabled": True, "webhook": {
        "enabled": True, "certManager": True}, "admission": {
        "storageClasses": ["csi-baremetal-sc-hddlvg"], "csiDrivers": ["csi-baremetal.dell.com"],
        "objectSelector": {"matchLabels": {"app": "db"}}}}}
    example = readme_overlay(tmp_path, "# your overlay's kustomization.yaml (webhook):")
    found = drift(kustomize("overlays/kubeadm", "uninstall/kubeadm") + example, render(values))
    assert not found, "the chart and docs/scheduling-gates.md's webhook example drifted apart:\n" + "\n".join(found)


def test_the_comparison_catches_drift(render: Render) -> None:
    """Controls: one changed field anywhere in any object, a missing object, a reordered toleration list."""
    base = kustomize("overlays/kubeadm", "uninstall/kubeadm")
    helm_objs = render({**NO_STOP_HOOK, "namespace": {"create": True}})
    assert not drift(base, helm_objs)
    cases: list[tuple[Callable[[list[Obj]], object], str]] = [
        (lambda o: pod_spec(find(o, "DaemonSet"))["containers"][0]["securityContext"].update(privileged=True),
         "DaemonSet/scheduler-patcher: spec.template.spec.containers[agent].securityContext.privileged"),
        (lambda o: find(o, "ClusterRole", "scheduler-patcher-nodes")["rules"][0]["verbs"].append("update"),
         "ClusterRole/scheduler-patcher-nodes: rules[0].verbs"),
        (lambda o: find(o, "PodTemplate")["template"]["spec"]["volumes"][2]["hostPath"].update(path="/var/lib/other"),
         "PodTemplate/scheduler-patcher-restore: template.spec.volumes[state].hostPath.path"),
        (lambda o: pod_spec(find(o, "DaemonSet"))["tolerations"].reverse(),
         "DaemonSet/scheduler-patcher: spec.template.spec.tolerations["),
        (lambda o: find(o, "DaemonSet")["metadata"]["labels"].update({"app.kubernetes.io/component": "x"}),
         "DaemonSet/scheduler-patcher: metadata.labels.app.kubernetes.io/component"),
        (lambda o: o.remove(find(o, "Role", "scheduler-patcher-status")),
         "Role scheduler-patcher/scheduler-patcher-status: only in kustomize"),
    ]
    for mutate, expected in cases:
        changed = copy.deepcopy(helm_objs)
        mutate(changed)
        found = drift(base, changed)
        assert found and all(f.startswith(expected) for f in found), found


# -- lint, every value, OpenAPI ------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [{}, ALL_VALUES], ids=["defaults", "every-value"])
def test_helm_lint_strict_passes(helm: str, values: Obj, tmp_path: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), values=values, tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


@pytest.mark.parametrize("values", [{}, ALL_VALUES], ids=["defaults", "every-value"])
def test_rendered_objects_validate_against_the_openapi_schema_strictly(render: Render, values: Obj) -> None:
    """The other renders equal kustomize objects that test_deploy_manifests.py validates the same way."""
    objs = render(values)
    assert objs
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD's kind: tests/deploy/test_monitoring.py validates them against the CRDs' own schema
        try:
            kubernetes_validate.validate(obj, ADMISSION_SCHEMA.get(obj["apiVersion"], K8S_SCHEMA), strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")


def test_every_value_reaches_the_objects(render: Render, cli_env: pytest.MonkeyPatch) -> None:  # noqa: F811
    objs = render(ALL_VALUES)
    image = "registry.example.com/ops/scheduler-patcher@sha256:" + "ab" * 32
    ds, job, gk = find(objs, "DaemonSet"), find(objs, "Job", "scheduler-patcher-restore"), find(objs, "Deployment")
    stop_job = find(objs, "Job", "scheduler-patcher-stop-agents")
    ns = find(objs, "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    spec = pod_spec(ds)
    for workload in (ds, job, gk):
        pspec = pod_spec(workload)
        assert pspec["imagePullSecrets"] == [{"name": "regcred"}]
        assert {c["image"] for c in all_containers(pspec)} == {image}
        assert {c["imagePullPolicy"] for c in all_containers(pspec)} == {"Always"}
    assert spec["nodeSelector"] == ALL_VALUES["nodeSelector"]
    assert spec["tolerations"] == pod_spec(job)["tolerations"] == ALL_VALUES["tolerations"]
    assert spec["affinity"] == ALL_VALUES["affinity"]
    assert spec["priorityClassName"] == pod_spec(job)["priorityClassName"] == "cp-critical"
    assert spec["hostPID"] is True and spec["terminationGracePeriodSeconds"] == 50
    assert (spec["hostNetwork"], spec["dnsPolicy"], spec["dnsConfig"]) == (False, "None", ALL_VALUES["dnsConfig"])
    assert ds["spec"]["template"]["metadata"]["annotations"] == ALL_VALUES["podAnnotations"]
    agent = spec["containers"][0]
    assert agent["resources"] == ALL_VALUES["resources"]
    assert agent["args"] == ["run", "--resync-interval=10m"]
    assert agent["ports"][0]["containerPort"] == 9900
    args = parsed(cli_env, agent, "run")
    assert (args.check_extenders, args.extender_probe_interval) == (False, 120)
    assert (args.manifest_dir, args.manifest_name, args.host_config_dir, args.state_dir) == (
        "/opt/k8s/manifests", "scheduler.yaml", "/opt/k8s/sp-config", "/opt/k8s/sp-state")
    assert (args.annotation_prefix, args.listen, args.rollback_on_failure, args.restore_on_exit) == (
        "sp.example.com", ":9900", False, "never")
    assert (args.rollout, args.rollout_lease, args.log_format, args.log_level, args.local_check) == (
        "coordinated", "sp-rollout", "json", "debug", True)
    assert (args.restart_timeout, args.grace_period, args.resync_interval) == (900, 30, 600)
    assert (args.compat_csi_baremetal, args.compat_namespace, args.on_foreign_config) == (True, "csi", "replace")
    assert set(env_of(agent)) - {"NODE_NAME", "POD_NAME", "POD_NAMESPACE"} <= flag_env_names("run")
    lease = find(objs, "Role", "scheduler-patcher-rollout-lease")
    assert lease["rules"][1]["resourceNames"] == ["sp-rollout"]
    readiness = find(objs, "Role", "scheduler-patcher-extender-readiness")
    assert readiness["metadata"]["namespace"] == find(objs, "RoleBinding", readiness["metadata"]["name"])[
        "metadata"]["namespace"] == "csi"
    # the restore Job undoes what this agent wrote: same node paths, same prefix, same mounts
    node_spec = find(objs, "PodTemplate")["template"]["spec"]
    restore = node_spec["containers"][0]
    mounts = host_mounts(spec, agent)
    foreign = {k: mounts.pop(k) for k in list(mounts) if k.startswith("foreign-config-")}  # the agent's only
    assert foreign == {"foreign-config-0": ("/etc/kubernetes/scheduler", "Directory", "/host/etc/kubernetes/scheduler")}
    assert host_mounts(node_spec, restore) == mounts
    assert mounts["manifests"] == ("/opt/k8s/manifests", "Directory", "/host/opt/k8s/manifests")
    assert {e["name"]: e.get("value") for e in restore["env"]} == {
        k: v.get("value") for k, v in env_of(agent).items() if k in {e["name"] for e in restore["env"]}}
    job_args = build_parser(load=["restore-nodes"]).parse_args(pod_spec(job)["containers"][0]["args"])
    assert (job_args.timeout, job_args.annotation_prefix) == (180, "sp.example.com")
    assert (job["spec"]["activeDeadlineSeconds"], job["spec"]["ttlSecondsAfterFinished"]) == (600, 3600)
    stop_args = build_parser(load=["stop-agents"]).parse_args(pod_spec(stop_job)["containers"][0]["args"])
    assert (stop_args.timeout, stop_args.daemonset) == (150, ds["metadata"]["name"])
    assert (stop_job["spec"]["activeDeadlineSeconds"], stop_job["spec"]["ttlSecondsAfterFinished"]) == (300, 7200)
    assert pod_spec(stop_job)["tolerations"] == ALL_VALUES["tolerations"]
    assert pod_spec(stop_job)["priorityClassName"] == "cp-critical"
    assert {c["image"] for c in all_containers(pod_spec(stop_job))} == {image}
    # each hook Job gets its own extraEnv after its own variables, the per-node restore pods none of it
    assert env_of(pod_spec(stop_job)["containers"][0]) == {
        "POD_NAMESPACE": {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        "KUBERNETES_SERVICE_HOST": {"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.10"}}
    assert list(env_of(pod_spec(job)["containers"][0])) == ["POD_NAME", "POD_NAMESPACE", "HTTPS_PROXY"]
    assert env_of(pod_spec(job)["containers"][0])["HTTPS_PROXY"]["value"] == "http://proxy:3128"
    assert not {"KUBERNETES_SERVICE_HOST", "HTTPS_PROXY"} & set(env_of(restore))
    # the gatekeeper
    gspec = pod_spec(gk)
    gate = gspec["containers"][0]
    assert gk["spec"]["replicas"] == 3 and gspec["priorityClassName"] == "gk-critical"
    assert gate["resources"] == ALL_VALUES["gatekeeper"]["resources"]
    assert gspec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert gspec["affinity"] == ALL_VALUES["gatekeeper"]["affinity"]
    assert gspec["tolerations"] == [{"key": "a", "operator": "Exists"}]
    assert gk["spec"]["template"]["metadata"]["annotations"] == {"example.com/gk": "yes"}
    assert {e["name"]: e.get("value") for e in gate["env"]}.items() >= {
        "PATCHER_GATE_NAME": "example.com/ready", "PATCHER_LISTEN": ":9910", "PATCHER_LOG_FORMAT": "text"}.items()
    assert gate["ports"][0]["containerPort"] == 9910
    # the admission policy: v1beta1, the gatekeeper's gate name, every selection value
    policy, binding = find(objs, "MutatingAdmissionPolicy"), find(objs, "MutatingAdmissionPolicyBinding")
    assert {policy["apiVersion"], binding["apiVersion"]} == {"admissionregistration.k8s.io/v1beta1"}
    assert binding["spec"]["paramRef"]["namespace"] == NAMESPACE
    selection = binding["spec"]["matchResources"]
    assert selection["objectSelector"] == ALL_VALUES["gatekeeper"]["admission"]["objectSelector"]
    assert selection["namespaceSelector"] == {"matchLabels": {"team": "a"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["gold"]},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]}
    admit = Policy(policy["spec"]).admit
    inline = {"name": "v", "csi": {"driver": "csi-baremetal.dell.com"}}
    hdd = {"name": "d", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "csi-baremetal-sc-hddlvg"}}}}
    for volume in (inline, hdd):
        assert gates(admit(new_pod(schedulerName="my-scheduler", volumes=[volume]), configmap(False))) == [
            "example.com/ready"]
    assert gates(admit(new_pod(schedulerName="other", volumes=[inline]), configmap(False))) is None
    assert gates(admit(new_pod(schedulerName="my-scheduler"), configmap(False))) is None  # no such volume
    # the webhook: its port, timeout and generated certificate, the admission selection as its flags; the release pool
    hook = find(objs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["timeoutSeconds"] == 3 and hook["clientConfig"]["caBundle"]
    assert {k: hook[k] for k in ("namespaceSelector", "objectSelector")} == selection
    assert [p["containerPort"] for p in gate["ports"] if p["name"] == "webhook"] == [9443]
    gk_args = parsed(cli_env, gate, "gatekeeper")
    assert (gk_args.webhook_listen, gk_args.webhook_scheduler_names, gk_args.webhook_storage_classes,
            gk_args.webhook_csi_drivers) == (":9443", "default-scheduler,my-scheduler", "csi-baremetal-sc-hddlvg",
                                             "csi-baremetal.dell.com")
    assert (gk_args.release_concurrency, gk_args.release_batch, gk_args.kube_api_qps, gk_args.kube_api_burst) == (
        8, 64, 500.5, 16)
    gk_env = {f"[env {n}]" for n in set(env_of(gate)) - {"POD_NAME", "POD_NAMESPACE"}}
    assert all(any(e in (a.help or "") for a in subparser("gatekeeper")._actions) for e in gk_env), gk_env


def test_the_rendered_extenders_pass_the_projects_validation(render: Render, tmp_path: Path) -> None:
    cm = find(render(ALL_VALUES), "ConfigMap", "scheduler-patcher-source")
    source = configmap_folder(tmp_path / "source", cm["data"])
    config = build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version="1.31"))
    assert config.form == "extenders.yaml"
    text = config.files[config.main].decode()
    assert "urlPrefix: https://127.0.0.1:8443/csi" in text and "example.com/disk" in text


def test_scheduler_config_renders_config_yaml(render: Render, tmp_path: Path) -> None:
    ksc = ("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders:\n"
           "- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n")
    cm = find(render({"extenders": [], "schedulerConfig": ksc}), "ConfigMap")
    assert cm["data"] == {"config.yaml": ksc}
    config = build_config(ConfigRequest(source_dir=configmap_folder(tmp_path / "s", cm["data"]),
                                        host_config_dir="/etc/x", kube_version="1.31"))
    assert config.form == "config.yaml"


# -- the values schema refuses what the agent would ------------------------------------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({"platfrom": "rke2"}, "additional properties 'platfrom' not allowed"),
    ({"agent": {"restoreOnExt": "never"}}, "additional properties 'restoreOnExt' not allowed"),
    ({"extenders": [{"urlPrefix": "http://x", "wieght": 1}]}, "additional properties 'wieght' not allowed"),
    ({"extenders": [{"filterVerb": "filter"}]}, "urlPrefix"),
    ({"platform": "k3s"}, "platform"),
    ({"agent": {"gracePeriod": "45 seconds"}}, "gracePeriod"),
    ({"agent": {"restoreOnExit": "sometimes"}}, "restoreOnExit"),
    ({"stopAgentsJob": {"timeout": "135s"}}, "stopAgentsJob.timeout: 135s is not longer than "
                                             "agent.terminationGracePeriodSeconds (135)"),
    ({"stopAgentsJob": {"timeout": "4 minutes"}}, "stopAgentsJob.timeout"),
    ({"image": {"digest": "abc"}}, "digest"),
    ({"hostPaths": {"stateDir": "var/lib/x"}}, "stateDir"),
    ({"schedulerConfig": "kind: KubeSchedulerConfiguration\n"}, "not both"),
    ({"extenders": []}, "no scheduler configuration"),
    ({"agent": {"port": 10259}}, "agent.port: --listen :10259: port 10259 is kube-scheduler's"),  # in the host network
    ({"agent": {"port": 10251}}, "agent.port: --listen :10251"),
    ({"agent": {"checkExtender": False}}, "additional properties 'checkExtender' not allowed"),
    ({"agent": {"restartTimeout": "1h30m"}}, "restartTimeout"),  # a Go duration the agent does not read
    ({"agent": {"extenderProbeInterval": "1 minute"}}, "extenderProbeInterval"),
    ({"dnsPolicy": "ClusterFirstWithHostnet"}, "dnsPolicy"),
    ({"dnsPolicy": "None"}, "nameservers"),  # None without a nameserver: a pod the API server refuses
    ({"dnsConfig": {"nameserver": ["10.0.0.10"]}}, "additional properties 'nameserver' not allowed"),
    ({"hostNetwork": "yes"}, "hostNetwork"),
    ({"gatekeeper": {"admission": {"enabled": True}}}, "needs gatekeeper.enabled"),
    ({"gatekeeper": {"admission": {"apiVersion": "v1alpha1"}}}, "apiVersion"),
    ({"gatekeeper": {"admission": {"schedulerName": ["x"]}}}, "additional properties 'schedulerName' not allowed"),
    ({"gatekeeper": {"admission": {"objectSelector": {"matchLabel": {"app": "db"}}}}},
     "additional properties 'matchLabel' not allowed"),
    ({"gatekeeper": {"admission": {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "in"}]}}}},
     "operator"),
    # a quote would end the CEL string literal the name is written into
    ({"gatekeeper": {"admission": {"schedulerNames": ["x') || true || ('"]}}}, "schedulerNames"),
    ({"gatekeeper": {"admission": {"storageClasses": ["Fast"]}}}, "storageClasses"),
    ({"gatekeeper": {"admission": {"csiDrivers": ["csi'x"]}}}, "csiDrivers"),
    ({"gatekeeper": {"webhook": {"enabled": True}}}, "gatekeeper.webhook.enabled needs gatekeeper.enabled"),
    ({"gatekeeper": {"webhook": {"certmanager": True}}}, "additional properties 'certmanager' not allowed"),
    ({"gatekeeper": {"webhook": {"timeoutSeconds": 31}}}, "timeoutSeconds"),
    ({"gatekeeper": {"release": {"concurrency": 0}}}, "concurrency"),
    ({"gatekeeper": {"release": {"kubeApiQps": 0}}}, "kubeApiQps"),
    ({"gatekeeper": {"gateName": "ready'"}}, "gateName"),
])
def test_values_that_the_chart_refuses(render: Render, values: Obj, message: str) -> None:
    error: str = render(values, expect_error=True)
    assert message in error, error


# -- NOTES.txt, the version, packaging -------------------------------------------------------------------------


def test_notes_tell_how_to_watch_the_rollout_with_real_commands(helm: str, tmp_path: Path) -> None:
    proc = run_helm(helm, "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    values={}, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n scheduler-patcher rollout status daemonset/scheduler-patcher" in notes
    assert "scheduler-patcher\\.io/state" in notes and "scheduler-patcher\\.io/config-hash" in notes
    assert "EXAMPLE extender" in notes
    (line,) = [ln for ln in notes.splitlines() if "scheduler-patcher readiness" in ln]
    argv = shlex.split(line)
    assert build_parser().parse_args(argv[1:]).wait is True  # flags the CLI really has
    (status,) = [ln for ln in notes.splitlines() if "-- scheduler-patcher status" in ln]
    assert build_parser().parse_args(shlex.split(status.split("--", 1)[1])[1:]).command == "status"


def test_notes_tell_how_to_opt_a_namespace_into_the_admission_gate(helm: str, tmp_path: Path) -> None:
    values = {"gatekeeper": {"enabled": True, "admission": {"enabled": True, "apiVersion": "v1beta1"}}}
    proc = run_helm(helm, "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    values=values, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "admissionregistration.k8s.io/v1beta1" in notes
    assert "  kubectl label namespace <namespace> scheduler-patcher.io/gate=enabled\n" in notes
    assert "port 9808" in notes  # a host port (hostNetwork): it must be free on the nodes


def test_notes_tell_how_to_opt_a_namespace_into_the_webhook_gate(helm: str, tmp_path: Path) -> None:
    values = {"gatekeeper": {"enabled": True, "webhook": {"enabled": True, "certManager": True}}}
    proc = run_helm(helm, "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    values=values, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "mutating webhook scheduler-patcher-gate" in notes and "cert-manager" in notes
    assert "  kubectl label namespace <namespace> scheduler-patcher.io/gate=enabled\n" in notes


def test_helm_package_names_the_version(helm: str, tmp_path: Path) -> None:
    proc = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / f"scheduler-patcher-{patcher.__version__}.tgz").is_file()


def test_objects_follow_the_release_namespace_and_drop_rbac_they_do_not_need(render: Render) -> None:
    """Installed elsewhere, everything of the agent moves along (the Lease and status Roles included); the Roles
    that must live elsewhere stay there. A Role nothing uses is not rendered."""
    objs = render({"csiBaremetal": {"enabled": True, "namespace": "ops"}, "agent": {"rollout": "independent"},
                   "gatekeeper": {"enabled": True}}, namespace="ops")
    fixed = {"scheduler-patcher-node-events": "default", "scheduler-patcher-mirror-pod": "kube-system"}
    for obj in objs:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == fixed.get(obj["metadata"]["name"], "ops"), identity(obj)
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == "ops"
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "Role"}
    assert "scheduler-patcher-rollout-lease" not in names  # independent rollout: no Lease
    assert [r["resources"] for r in find(objs, "Role", "scheduler-patcher-mirror-pod")["rules"]] == [["pods"]]  # nor
    # kube-scheduler's Lease: the leader-aware order is the coordinated rollout's
    assert "scheduler-patcher-extender-readiness" not in names  # the status Role already covers it in "ops"
    assert "extender-readiness" in find(objs, "Role", "scheduler-patcher-status")["rules"][1]["resourceNames"]


def test_the_daemonset_role_comes_with_restore_on_exit_auto_only(render: Render) -> None:
    """``auto`` (the default) reads the agent's own pod and watches its DaemonSet by name; ``always`` and
    ``never`` read neither, so their release grants neither."""
    objs = render({}, namespace="ops")
    role = find(objs, "Role", "scheduler-patcher-daemonset")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"][1]["resourceNames"] == [find(objs, "DaemonSet")["metadata"]["name"]]
    env = {e["name"]: e.get("value") for e in find(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
           ["env"]}
    assert env["PATCHER_RESTORE_ON_EXIT"] == "auto" and "POD_NAME" in env
    for mode in ("always", "never"):
        names = {o["metadata"]["name"] for o in render({"agent": {"restoreOnExit": mode}}) if "Role" in o["kind"]}
        assert "scheduler-patcher-daemonset" not in names, mode


def test_the_restore_job_is_a_post_delete_hook(render: Render) -> None:
    """The drift tests forgive the hook annotations; here they are pinned. Post-delete: while the agents run they
    would patch a restored node again within a second, so the restore must come after the DaemonSet is deleted."""
    objs = render()
    job = find(objs, "Job", "scheduler-patcher-restore")
    assert job["metadata"]["annotations"] == {"helm.sh/hook": "post-delete",
                                              "helm.sh/hook-delete-policy": "before-hook-creation"}
    # its ServiceAccount, RBAC and PodTemplate: hooks too (the release's own are deleted before a post-delete hook
    # runs), created before the Job (lower weight) and removed once the hook succeeded
    restore_objs = [o for o in objs if o["metadata"]["name"] == "scheduler-patcher-restore" and o["kind"] != "Job"]
    assert sorted(o["kind"] for o in restore_objs) == ["ClusterRole", "ClusterRoleBinding", "PodTemplate", "Role",
                                                       "RoleBinding", "ServiceAccount"]
    for o in restore_objs:
        assert o["metadata"]["annotations"] == {"helm.sh/hook": "post-delete", "helm.sh/hook-weight": "-10",
                                                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
    kinds = {o["kind"] for o in render({"restoreJob": {"enabled": False}, **NO_STOP_HOOK})}
    assert not kinds & {"Job", "PodTemplate"}


def test_the_agents_are_stopped_by_a_pre_delete_hook_while_their_rbac_is_there(render: Render) -> None:
    """Pre-delete: helm runs it before it deletes any object of the release, so the agents keep their
    ServiceAccount and RBAC (the rollout Lease, their Node) while they take turns restoring. Its own
    ServiceAccount and RBAC come first and go once it succeeded; its Role names the one DaemonSet."""
    objs = render()
    ds = find(objs, "DaemonSet")
    job = find(objs, "Job", "scheduler-patcher-stop-agents")
    assert job["metadata"]["annotations"] == {"helm.sh/hook": "pre-delete",
                                              "helm.sh/hook-delete-policy": "before-hook-creation"}
    hook_objs = [o for o in objs if o["metadata"]["name"] == "scheduler-patcher-stop-agents" and o["kind"] != "Job"]
    assert sorted(o["kind"] for o in hook_objs) == ["Role", "RoleBinding", "ServiceAccount"]
    for o in hook_objs:
        assert o["metadata"]["annotations"] == {"helm.sh/hook": "pre-delete", "helm.sh/hook-weight": "-10",
                                                "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
    role = find(objs, "Role", "scheduler-patcher-stop-agents")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                              "resourceNames": [ds["metadata"]["name"]], "verbs": ["delete", "list", "watch"]}]
    binding = find(objs, "RoleBinding", "scheduler-patcher-stop-agents")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "scheduler-patcher-stop-agents",
                                    "namespace": NAMESPACE}]
    spec = pod_spec(job)
    assert spec["serviceAccountName"] == "scheduler-patcher-stop-agents" and "automountServiceAccountToken" not in spec
    assert spec["securityContext"]["runAsNonRoot"] is True and not spec.get("hostNetwork")
    args = build_parser(load=["stop-agents"]).parse_args(spec["containers"][0]["args"])
    assert args.daemonset == ds["metadata"]["name"]
    # it gives up after the agents' whole grace period, and before helm's own 5 min wait for a hook
    assert ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] < args.timeout < 300
    assert "Job" not in {o["kind"] for o in render(NO_STOP_HOOK) if o["metadata"]["name"].endswith("stop-agents")}


def test_every_commands_rbac_is_exactly_what_its_code_calls(render: Render) -> None:
    """Each workload's ServiceAccount may do what the code of its command calls (``api_calls_in``, from the
    command's module: not what a module it imports could do for another command), and nothing more: the agents,
    the gatekeeper with its webhook, and the uninstall's two hooks."""
    objs = render({"gatekeeper": {"enabled": True, "webhook": {"enabled": True}}})
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    commands = {}
    for workload in (o for o in objs if o["kind"] in ("DaemonSet", "Deployment", "Job")):
        spec = pod_spec(workload)
        commands[spec["serviceAccountName"]] = spec["containers"][0]["args"][0]
    assert sorted(commands.values()) == ["gatekeeper", "restore-nodes", "run", "stop-agents"]
    for account, command in commands.items():
        granted = set()
        for b in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"]):
                ref = b["roleRef"]
                rules = roles[(ref["kind"], b["metadata"].get("namespace") if ref["kind"] == "Role" else None,
                               ref["name"])]
                granted |= {(g, res, verb) for r in rules for g in r["apiGroups"] for res in r["resources"]
                            for verb in r["verbs"]}
        module = "patcher.services.runner" if command == "run" else CLUSTER_COMMANDS[command][0]
        used = api_calls_in(modules_of(module), module)
        assert used - granted == set(), f"{command} calls the API without permission"
        assert granted - used == set(), f"{command} is granted what it never calls"


# -- the admission webhook's certificate ----------------------------------------------------------------------

CERT_MANAGER_KINDS = {"Issuer", "Certificate"}


def test_the_webhook_without_cert_manager_is_the_overlay_with_a_generated_certificate(
        render: Render, tmp_path: Path) -> None:
    """certManager: false renders the overlay's objects except cert-manager's, plus the Secret they would have
    made, and the CA in caBundle instead of the cainjector's annotation; and that certificate really serves the
    webhook under the Service's DNS name, verified by the caBundle, with the webhook's own TLS server."""
    values = {**NO_STOP_HOOK, "namespace": {"create": True},
              "gatekeeper": {"enabled": True, "webhook": {"enabled": True}}}
    objs = render(values)
    secret = find(objs, "Secret", "scheduler-patcher-gatekeeper-webhook-tls")
    hook_config = find(objs, "MutatingWebhookConfiguration")
    ca_bundle = hook_config["webhooks"][0]["clientConfig"].pop("caBundle")
    assert secret["type"] == "kubernetes.io/tls" and ca_bundle == secret["data"]["ca.crt"]
    objs.remove(secret)
    expected = [o for o in kustomize("overlays/kubeadm", "uninstall/kubeadm", "overlays/gatekeeper-webhook")
                if o["kind"] not in CERT_MANAGER_KINDS]
    find(expected, "MutatingWebhookConfiguration")["metadata"].pop("annotations")
    found = drift(expected, objs)
    assert not found, "the chart (certManager: false) and the overlay drifted apart:\n" + "\n".join(found)
    assert not {o["kind"] for o in objs} & CERT_MANAGER_KINDS
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_bytes(base64.b64decode(secret["data"][name]))
    service = "scheduler-patcher-gatekeeper-webhook.scheduler-patcher.svc"
    webhook = AdmissionWebhook(Selection(), lambda: (True, {"data": {"ready": "false"}}))
    server = HttpServer(webhook.handle, "127.0.0.1:0",
                        certs=CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")))
    server.start()
    try:
        ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=service) as tls:
            body = json.dumps(review(new_pod())).encode()
            tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: " + service.encode() + b"\r\nContent-Type: application/json"
                        b"\r\nConnection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer[:100]
        response = json.loads(answer.split(b"\r\n\r\n", 1)[1])["response"]
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    finally:
        server.stop()


def test_the_webhook_follows_the_release_namespace(render: Render) -> None:
    for cert_manager in (True, False):
        objs = render({"gatekeeper": {"enabled": True, "webhook": {"enabled": True, "certManager": cert_manager}}},
                      namespace="ops")
        hook = find(objs, "MutatingWebhookConfiguration")
        assert hook["webhooks"][0]["clientConfig"]["service"]["namespace"] == "ops"
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "ops"]} in \
            hook["webhooks"][0]["namespaceSelector"]["matchExpressions"]
        if cert_manager:
            assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
                "ops/scheduler-patcher-gatekeeper-webhook"
            cert = find(objs, "Certificate", "scheduler-patcher-gatekeeper-webhook")
            assert cert["spec"]["dnsNames"][0] == "scheduler-patcher-gatekeeper-webhook.ops.svc"
        else:
            pem = base64.b64decode(find(objs, "Secret")["data"]["tls.crt"])
            assert ssl.PEM_cert_to_DER_cert(pem.decode()).find(b"scheduler-patcher-gatekeeper-webhook.ops.svc") > 0
        for obj in objs:
            if obj["kind"] not in CERT_MANAGER_KINDS:  # CRDs: no schema in kubernetes-validate
                kubernetes_validate.validate(obj, ADMISSION_SCHEMA.get(obj["apiVersion"], K8S_SCHEMA), strict=True)


def test_foreign_config_dirs_mount_read_only_in_the_agent_only(render: Render) -> None:
    """hostPaths.foreignConfigDirs: each folder read-only at its node path below /host in the agent (where its
    "foreign scheduler config not found" error says to mount it); the restore Job reads no foreign config."""
    from patcher.services import nodefiles

    assert "Helm: hostPaths.foreignConfigDirs" in nodefiles.FOREIGN_MOUNT_HINT
    objs = render({"hostPaths": {"foreignConfigDirs": ["/etc/kubernetes/scheduler", "/opt/sched"]}})
    spec = pod_spec(find(objs, "DaemonSet"))
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    mounts = host_mounts(spec, agent)
    assert mounts["foreign-config-0"] == ("/etc/kubernetes/scheduler", "Directory", "/host/etc/kubernetes/scheduler")
    assert mounts["foreign-config-1"] == ("/opt/sched", "Directory", "/host/opt/sched")
    assert all(m.get("readOnly") is True for m in agent["volumeMounts"] if m["name"].startswith("foreign-config-"))
    node_spec = find(objs, "PodTemplate")["template"]["spec"]
    assert not any(v["name"].startswith("foreign-config-") for v in node_spec["volumes"])
    for bad in (["relative/dir"], ["/"], ["/a", "/a"]):
        render({"hostPaths": {"foreignConfigDirs": bad}}, expect_error=True)
