"""The admission webhook's kustomize component (manifests/gatekeeper/webhook, overlay gatekeeper-webhook), rendered
by the real ``kubectl kustomize``: the Kubernetes objects validated strictly against the OpenAPI schema, the
cert-manager objects (CRDs, not in that schema) checked for the chain they must form, the webhook configuration
held to the policy binding's selection, and the Deployment's environment read back by the real CLI parser.
tests/deploy/test_helm_chart.py holds the chart's render (gatekeeper.webhook.*) equal to this overlay.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from patcher.commands.cli import build_parser
from patcher.commands.gatekeeper import webhook_selection
from patcher.core.admission import pod_patch
from patcher.services.webhook import MUTATE_PATH
from tests.deploy.test_deploy_manifests import K8S_SCHEMA, env_of, objects, pod_spec
from tests.deploy.test_gate_admission import V1 as POLICY_OVERLAY
from tests.deploy.test_gate_admission import Policy, policy_objects, readme_overlay
from tests.harness import admission_samples as samples
from tests.harness.emu.kubeemu import json_patch

OVERLAY = "overlays/gatekeeper-webhook"
NS = "scheduler-patcher"
CERT_MANAGER = "cert-manager.io/v1"
WEBHOOK_EXAMPLE = "# your overlay's kustomization.yaml (webhook):"


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def test_the_overlay_adds_the_webhook_to_the_gatekeeper_and_the_rest_validates() -> None:
    objs = objects(OVERLAY)
    base = {(o["kind"], o["metadata"]["name"]) for o in objects("gatekeeper")}
    added = sorted((o["kind"], o["metadata"]["name"]) for o in objs if (o["kind"], o["metadata"]["name"]) not in base)
    assert added == [("Certificate", "scheduler-patcher-gatekeeper-webhook"),
                     ("Certificate", "scheduler-patcher-gatekeeper-webhook-ca"),
                     ("Issuer", "scheduler-patcher-gatekeeper-webhook-ca"), ("Issuer", "scheduler-patcher-selfsigned"),
                     ("MutatingWebhookConfiguration", "scheduler-patcher-gate"),
                     ("Role", "scheduler-patcher-gatekeeper-webhook"),
                     ("RoleBinding", "scheduler-patcher-gatekeeper-webhook"),
                     ("Service", "scheduler-patcher-gatekeeper-webhook")]
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "scheduler-patcher"
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "gatekeeper"
        if obj["apiVersion"] == CERT_MANAGER:
            continue  # a CRD: checked by the chain test below
        try:
            kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_webhook_configuration_never_blocks_and_selects_what_the_policy_binding_selects() -> None:
    hook_config = one(objects(OVERLAY), "MutatingWebhookConfiguration")
    [hook] = hook_config["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["matchPolicy"] == "Equivalent" and hook["reinvocationPolicy"] == "Never"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    policy, binding = policy_objects(POLICY_OVERLAY)
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {k: v for k, v in hook["rules"][0].items() if k != "scope"}]
    selection = binding["spec"]["matchResources"]
    assert hook["namespaceSelector"] == selection["namespaceSelector"]
    assert hook["objectSelector"] == selection["objectSelector"]
    assert hook["clientConfig"]["service"] == {"name": "scheduler-patcher-gatekeeper-webhook", "namespace": NS,
                                              "path": MUTATE_PATH, "port": 443}
    assert "caBundle" not in hook["clientConfig"]  # cert-manager's cainjector writes it


def test_the_certificate_chain_the_cainjector_and_the_service_fit_together() -> None:
    objs = objects(OVERLAY)
    hook_config = one(objs, "MutatingWebhookConfiguration")
    ns, name = hook_config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    serving = one(objs, "Certificate", name)
    assert serving["metadata"]["namespace"] == ns == NS
    service = one(objs, "Service", hook_config["webhooks"][0]["clientConfig"]["service"]["name"])
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert svc in serving["spec"]["dnsNames"] and "server auth" in serving["spec"]["usages"]
    ca_issuer = one(objs, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca_cert = one(objs, "Certificate", "scheduler-patcher-gatekeeper-webhook-ca")
    assert ca_cert["spec"]["isCA"] is True and ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert one(objs, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    for cert in (serving, ca_cert):
        assert cert["apiVersion"] == CERT_MANAGER and cert["spec"]["issuerRef"]["kind"] == "Issuer"
        assert cert["spec"]["issuerRef"]["group"] == "cert-manager.io"
    # The gatekeeper mounts the serving certificate's Secret and listens where the Service sends.
    spec = pod_spec(one(objs, "Deployment"))
    [container] = spec["containers"]
    [volume] = spec["volumes"]
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] == "webhook" and "webhook" in ports
    assert service["spec"]["selector"].items() <= spec_labels(one(objs, "Deployment")).items()


def spec_labels(deploy: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deploy["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_gatekeeper_reads_the_webhook_settings_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    objs = objects(OVERLAY)
    spec = pod_spec(one(objs, "Deployment"))
    [container] = spec["containers"]
    for name in [n for n in os.environ if n.startswith("PATCHER_")]:
        monkeypatch.delenv(name)
    for name, entry in env_of(container).items():
        if name.startswith("PATCHER_"):
            monkeypatch.setenv(name, entry["value"])
    args = build_parser().parse_args(["gatekeeper"])
    mount = container["volumeMounts"][0]["mountPath"]
    assert (args.webhook_cert, args.webhook_key) == (f"{mount}/tls.crt", f"{mount}/tls.key")
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["webhook"]
    assert args.webhook_listen == f":{port}"
    assert args.webhook_scheduler_names == "default-scheduler"  # the policy's default variables
    assert (args.webhook_storage_classes, args.webhook_csi_drivers) == ("", "")
    # It reads the ConfigMap the policy's paramRef names, and its Role allows exactly that one.
    _, binding = policy_objects(POLICY_OVERLAY)
    assert args.webhook_verdict_configmap == binding["spec"]["paramRef"]["name"]
    role = one(objs, "Role", "scheduler-patcher-gatekeeper-webhook")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": [args.webhook_verdict_configmap], "verbs": ["list", "watch"]}]
    bound = one(objs, "RoleBinding", "scheduler-patcher-gatekeeper-webhook")
    assert bound["subjects"][0]["name"] == spec["serviceAccountName"]


def test_the_readme_webhook_example_selects_what_the_policy_example_selects(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/scheduling-gates.md's webhook and policy overlay examples gate the same pods."""
    objs = readme_overlay(tmp_path / "webhook", WEBHOOK_EXAMPLE)
    hook = one(objs, "MutatingWebhookConfiguration")["webhooks"][0]
    policy_objs = readme_overlay(tmp_path / "policy")
    binding = one(policy_objs, "MutatingAdmissionPolicyBinding")
    selected = binding["spec"]["matchResources"]
    assert hook["objectSelector"] == selected["objectSelector"] == {"matchLabels": {"app": "db"}}
    assert hook["namespaceSelector"] == selected["namespaceSelector"]
    [container] = pod_spec(one(objs, "Deployment"))["containers"]
    for name in [n for n in os.environ if n.startswith("PATCHER_")]:
        monkeypatch.delenv(name)
    for name, entry in env_of(container).items():
        if name.startswith("PATCHER_"):
            monkeypatch.setenv(name, entry["value"])
    args = build_parser().parse_args(["gatekeeper"])
    selection = webhook_selection(args)
    policy = Policy(one(policy_objs, "MutatingAdmissionPolicy")["spec"])
    hdd = samples.ephemeral("csi-baremetal-sc-hddlvg")
    for sample in [*samples.SAMPLES, samples.Sample("hddlvg", {"volumes": [hdd]}, samples.NOT_READY, None),
                   samples.Sample("hddlvg, ready", {"volumes": [hdd]}, samples.READY, None)]:
        pod, params = sample.pod(), samples.configmap(sample.verdict)
        patch = pod_patch(pod, params, selection)
        assert (pod if patch is None else json_patch(pod, patch)) == policy.admit(pod, params), sample.id
    assert pod_patch(samples.new_pod(volumes=[hdd]), samples.configmap(samples.NOT_READY), selection)
