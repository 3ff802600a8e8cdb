"""Admission for real: the 26 sample pods of tests/harness/admission_samples.py created in the real API
server.

The same table the CEL runtime and the webhook's rules are held to offline, now judged by kube-apiserver itself:
once through the MutatingAdmissionPolicy and its binding as the kustomize overlay installs them (the selection
patched the way README's overlay example patches it), once through the gatekeeper's webhook registered with its
caBundle and called by the API server over TLS. Pods are created with `dryRun=All`: admission runs in full and the
server answers with the admitted pod, but stores nothing, so every sample reuses one name.

The API server picks a policy, binding or ConfigMap change up from its informers a moment later: each group of
samples (one selection, one verdict) is retried until it all matches, and a mismatch that persists fails.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME
from tests.deploy.test_deploy_manifests import MANIFESTS, objects
from tests.deploy.test_gate_admission import cel_list
from tests.harness import admission_samples as samples
from tests.harness.real.controlplane import (
    ControlPlane,
    built_releases,
    control_plane,
    free_port,
    issue,
    missing_reason,
    wait_until,
)

pytestmark = pytest.mark.real_cluster

NS = "team-a"  # the samples' namespace (admission_samples.new_pod)
GATE_LABEL = {"scheduler-patcher.io/gate": "enabled"}
SETTLE = 30.0  # seconds for the server's informers to see a change; far more than the ~1 s they take
DEFAULT_SELECTION = {"schedulerNames": ["default-scheduler"], "storageClasses": [], "csiDrivers": []}


def selection_key(sample: samples.Sample) -> str:
    return json.dumps({**DEFAULT_SELECTION, **sample.selection}, sort_keys=True)


#: The samples by selection, then by verdict: one policy patch (or gatekeeper start) per selection.
GROUPS = [(json.loads(key), [(verdict, list(by_verdict)) for verdict, by_verdict in
                             groupby(sorted(group, key=lambda s: s.verdict), key=lambda s: s.verdict)])
          for key, group in groupby(sorted(samples.SAMPLES, key=selection_key), key=selection_key)]


@pytest.fixture(scope="module", params=[b.version for b in built_releases()] or ["none"])
def plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own (the install tests leave a policy and webhooks behind on the shared one), with
    the samples' namespace opted in and the agents' namespace."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    binaries = next(b for b in built_releases() if b.version == request.param)
    with control_plane(binaries, tmp_path_factory.mktemp(f"admission-{binaries.version}")) as cp:
        cp.ensure_namespace("scheduler-patcher")
        cp.ensure_namespace(NS)
        cp.ok("PATCH", f"/api/v1/namespaces/{NS}", {"metadata": {"labels": GATE_LABEL}},
              "application/merge-patch+json")
        yield cp


def set_verdict(cp: ControlPlane, state: str) -> None:
    """The readiness ConfigMap as the agents publish it, or none at all."""
    path = "/api/v1/namespaces/scheduler-patcher/configmaps"
    cm = samples.configmap(state)
    cp.request("DELETE", f"{path}/{DEFAULT_STATUS_NAME}")
    if cm is not None:
        cp.ok("POST", path, cm)


def admitted_gates(cp: ControlPlane, sample: samples.Sample) -> list[str] | None:
    pod = sample.pod()
    pod.pop("status", None)
    admitted = cp.ok("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", pod)
    return samples.gates(admitted)


def check_groups(cp: ControlPlane, configure: Any) -> None:
    """For each selection: `configure(selection)`, then each verdict, then every sample until the table holds."""
    for selection, verdicts in GROUPS:
        configure(selection)
        for verdict, group in verdicts:
            set_verdict(cp, verdict)

            def mismatches(group: list[samples.Sample] = group) -> list[str]:
                return [f"{s.id}: got {got}, table says {s.gates}" for s in group
                        if (got := admitted_gates(cp, s)) != s.gates]

            try:
                wait_until(lambda m=mismatches: not m(), timeout=SETTLE, what="the table")  # type: ignore[misc]
            except AssertionError:
                pytest.fail(f"selection {selection}, verdict {verdict}:\n" + "\n".join(mismatches()))


# -- the MutatingAdmissionPolicy ------------------------------------------------------------------------------


def test_the_admission_policy_gates_the_samples_as_the_table_says(plane: ControlPlane) -> None:
    cp = plane
    overlay = "overlays/gatekeeper-admission"
    status, _ = cp.request("GET", "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies")
    api = "v1"
    if status != 200:
        overlay, api = "overlays/gatekeeper-admission-v1beta1", "v1beta1"
    proc = cp.kubectl("apply", "-k", str(MANIFESTS / overlay), "--server-side")
    assert proc.returncode == 0, proc.stderr
    policy_path = f"/apis/admissionregistration.k8s.io/{api}/mutatingadmissionpolicies/scheduler-patcher-gate"
    names = [v["name"] for v in cp.ok("GET", policy_path)["spec"]["variables"]]

    def configure(selection: dict[str, list[str]]) -> None:
        # README's overlay example: a JSON patch of the variables' expressions.
        patch = [{"op": "replace", "path": f"/spec/variables/{names.index(k)}/expression", "value": cel_list(v)}
                 for k, v in selection.items()]
        cp.ok("PATCH", policy_path, patch, "application/json-patch+json")

    check_groups(cp, configure)


# -- the gatekeeper's webhook ---------------------------------------------------------------------------------


class Gatekeeper:
    """`scheduler-patcher gatekeeper` serving the webhook, restarted for each selection (its flags)."""

    def __init__(self, cp: ControlPlane, folder: Path) -> None:
        self.cp, self.folder = cp, folder
        self.cert, self.key = issue(cp.pki, "webhook", "/CN=gatekeeper-webhook", server_names=("127.0.0.1",))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, selection: dict[str, list[str]]) -> None:
        self.stop()
        flags = {"schedulerNames": "--webhook-scheduler-names", "storageClasses": "--webhook-storage-classes",
                 "csiDrivers": "--webhook-csi-drivers"}
        log = open(self.folder / "gatekeeper.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "patcher", "gatekeeper", "--kubeconfig", str(self.cp.kubeconfig),
             "--namespace", "scheduler-patcher", "--identity", "gk-0", "--listen", "127.0.0.1:0",
             "--leader-elect", "false", "--webhook-listen", f"127.0.0.1:{self.port}",
             "--webhook-cert", str(self.cert), "--webhook-key", str(self.key),
             *[f"{flags[k]}={','.join(v)}" for k, v in selection.items()]],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


def test_the_webhook_called_by_the_real_server_gates_as_the_table_says(plane: ControlPlane, tmp_path: Path) -> None:
    cp = plane
    # The policy of the other test is gone: only the webhook decides here.
    for kind in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
        for api in ("v1", "v1beta1"):
            cp.request("DELETE", f"/apis/admissionregistration.k8s.io/{api}/{kind}/scheduler-patcher-gate")
    gatekeeper = Gatekeeper(cp, tmp_path)
    config = next(o for o in objects("overlays/gatekeeper-webhook") if o["kind"] == "MutatingWebhookConfiguration")
    config["metadata"].pop("annotations", None)  # no cert-manager here: the caBundle is set below
    # The API server reaches the gatekeeper on loopback by URL (no Service routing without kube-proxy); the rest
    # (rules, selectors, failurePolicy, timeout, sideEffects) is the overlay's.
    service = config["webhooks"][0]["clientConfig"]["service"]
    config["webhooks"][0]["clientConfig"] = {
        "url": f"https://127.0.0.1:{gatekeeper.port}{service['path']}",
        "caBundle": base64.b64encode((cp.pki / "ca.crt").read_bytes()).decode()}
    cp.ok("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config)
    try:
        check_groups(cp, gatekeeper.start)
    finally:
        gatekeeper.stop()
    log = (tmp_path / "gatekeeper.log").read_text()
    assert "Traceback" not in log, log
