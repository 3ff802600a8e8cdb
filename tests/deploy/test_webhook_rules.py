"""The admission webhook's rules (``patcher.core.admission``): the policy's rules, in Python.

The shared sample table (tests/harness/admission_samples.py) runs here through ``review_patch`` as an AdmissionReview
request, and through the policy's CEL in tests/deploy/test_gate_admission.py: both must give each sample's gates.
Beyond the table, generated pods go through both the rules and the rendered policy's CEL (the kustomize
component) and must come out equal, and the rules' own properties are checked exhaustively.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.core.admission import (
    BadReview,
    Selection,
    pod_patch,
    review_patch,
    review_request,
    review_response,
)
from tests.deploy.test_gate_admission import V1, Policy, cel_list, policy_objects
from tests.harness import admission_samples as samples
from tests.harness.admission_samples import ABSENT, CSI_DRIVER, CSI_SC, NO_DATA, NOT_READY, OTHER, READY, G, configmap
from tests.harness.emu.kubeemu import json_patch


def admission_request(pod: dict[str, Any], operation: str = "CREATE", uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
                      **extra: Any) -> dict[str, Any]:
    """An ``admission.k8s.io/v1`` AdmissionReview ``request`` as the API server sends it for a pod."""
    return {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"].get("namespace"), "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
            "object": pod, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}, **extra}


def review(pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": admission_request(pod, **kw)}


def admitted(pod: dict[str, Any], patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    return pod if patch is None else json_patch(pod, patch)


@pytest.mark.parametrize("sample", samples.SAMPLES, ids=lambda s: s.id)
def test_the_shared_samples(sample: samples.Sample) -> None:
    """The same table the policy's CEL is tested with, as an AdmissionReview through the webhook's rules."""
    pod = sample.pod()
    before = copy.deepcopy(pod)
    request = review_request(review(pod))
    patch = review_patch(request, configmap(sample.verdict), sample.webhook_selection())
    assert samples.gates(admitted(pod, patch)) == sample.gates
    assert pod == before  # the rules never change what they read
    # The answer carries the patch base64-encoded, and allows the pod either way.
    response = review_response(review(pod), patch)["response"]
    assert response["allowed"] is True
    if patch is None:
        assert "patch" not in response and "patchType" not in response
    else:
        assert response["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(response["patch"])) == patch


def test_the_samples_cover_every_outcome_and_verdict() -> None:
    """A table that lost its gated or its ungated rows would test nothing on one side."""
    assert {s.verdict for s in samples.SAMPLES} == {NOT_READY, READY, NO_DATA, ABSENT}
    assert any(s.gates is None for s in samples.SAMPLES) and any(s.gates and G in s.gates for s in samples.SAMPLES)


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_create(operation: str) -> None:
    pod = samples.new_pod()
    assert review_patch(admission_request(pod, operation), configmap(NOT_READY), Selection()) is None
    assert review_patch(admission_request(pod), configmap(NOT_READY), Selection()) is not None


def test_only_pods_and_not_their_subresources() -> None:
    pod = samples.new_pod()
    other = admission_request(pod, kind={"group": "apps", "version": "v1", "kind": "Deployment"},
                              resource={"group": "apps", "version": "v1", "resource": "deployments"})
    assert review_patch(other, configmap(NOT_READY), Selection()) is None
    binding = admission_request(pod, subResource="binding")
    assert review_patch(binding, configmap(NOT_READY), Selection()) is None


@pytest.mark.parametrize("bad", [
    None, [], "review", {}, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}},
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []},
    {"apiVersion": "v1", "kind": "Pod", "request": {"uid": "u"}},
])
def test_what_is_not_an_admission_review(bad: Any) -> None:
    with pytest.raises(BadReview):
        review_request(bad)
    response = review_response(bad, None)
    assert response["response"]["allowed"] is True and "patch" not in response["response"]


def test_a_pod_create_without_a_pod_is_refused_as_unreadable() -> None:
    request = admission_request(samples.new_pod())
    request["object"] = None
    with pytest.raises(BadReview):
        review_patch(request, configmap(NOT_READY), Selection())


def test_the_answer_echoes_uid_and_version() -> None:
    r = review(samples.new_pod(), uid="abc")
    r["apiVersion"] = "admission.k8s.io/v1beta1"
    answer = review_response(r, None)
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "abc"


def test_an_empty_gate_name_is_refused() -> None:
    with pytest.raises(ValueError, match="gate"):
        Selection(gate="")


# -- generated pods ---------------------------------------------------------------------------------------------

NAMES = ["default-scheduler", "my-scheduler", "x"]
CLASSES = [CSI_SC, "standard"]
DRIVERS = [CSI_DRIVER, "other.csi.example.com"]

volume = st.one_of(
    st.builds(lambda sc: samples.ephemeral(sc), st.sampled_from([*CLASSES, None])),
    st.builds(lambda d: {"name": "inline", "csi": {"driver": d}}, st.sampled_from(DRIVERS)),
    st.just(samples.CLAIM), st.just(samples.EMPTY_DIR),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(NAMES))
    else:
        spec["schedulerName"] = None
    if draw(st.integers(0, 3)) == 0:
        spec["nodeName"] = draw(st.sampled_from(["", "worker-1"]))
    if draw(st.booleans()):
        spec["schedulingGates"] = [{"name": n} for n in draw(st.lists(st.sampled_from([G, OTHER, "b/c"]),
                                                                         max_size=3, unique=True))]
    if draw(st.booleans()):
        spec["volumes"] = draw(st.lists(volume, max_size=3))
    return samples.Sample("generated", spec, NOT_READY, None).pod()


selections = st.fixed_dictionaries({}, optional={
    "schedulerNames": st.lists(st.sampled_from(NAMES), max_size=2, unique=True),
    "storageClasses": st.lists(st.sampled_from(CLASSES), max_size=2, unique=True),
    "csiDrivers": st.lists(st.sampled_from(DRIVERS), max_size=2, unique=True),
})
verdicts = st.sampled_from([NOT_READY, READY, NO_DATA, ABSENT])


@settings(max_examples=300, deadline=None)
@given(pod=pods(), selection=selections, verdict=verdicts)
def test_generated_pods_agree_with_the_policy_cel(pod: dict[str, Any], selection: dict[str, list[str]],
                                                  verdict: str) -> None:
    """Beyond the table: any pod, selection and verdict, through the rendered policy's CEL and the rules."""
    policy = Policy(policy_spec(), **{k: cel_list(v) for k, v in selection.items()})
    sample = samples.Sample("generated", {}, verdict, None, selection)
    cel_result = policy.admit(pod, configmap(verdict))
    rules_result = admitted(pod, pod_patch(pod, configmap(verdict), sample.webhook_selection()))
    assert rules_result == cel_result


@functools.cache
def policy_spec() -> dict[str, Any]:
    """The kustomize render of the policy, once per run (kubectl kustomize takes a second)."""
    spec: dict[str, Any] = policy_objects(V1)[0]["spec"]
    return spec


@settings(max_examples=300, deadline=None)
@given(pod=pods(), selection=selections, verdict=verdicts)
def test_properties_of_the_rules(pod: dict[str, Any], selection: dict[str, list[str]], verdict: str) -> None:
    sel = samples.Sample("generated", {}, verdict, None, selection).webhook_selection()
    patch = pod_patch(pod, configmap(verdict), sel)
    before = samples.gates(pod) or []
    if patch is None:
        return
    # Gated only when everything allows it.
    assert verdict in (NOT_READY, NO_DATA)
    assert not pod["spec"].get("nodeName") and G not in before
    after = json_patch(pod, patch)
    # Ours is appended, theirs stay first and in order; nothing else in the pod changes.
    assert samples.gates(after) == [*before, G]
    assert {k: v for k, v in after["spec"].items() if k != "schedulingGates"} == \
        {k: v for k, v in pod["spec"].items() if k != "schedulingGates"}
    assert after["metadata"] == pod["metadata"]
    # Never twice: the admitted pod is not gated again (a re-invocation, or both policy and webhook).
    assert pod_patch(after, configmap(verdict), sel) is None
    # A Ready verdict or no ConfigMap: never a gate.
    assert pod_patch(pod, configmap(READY), sel) is None and pod_patch(pod, None, sel) is None
    assert pod_patch(pod, configmap(ABSENT), sel) is None
