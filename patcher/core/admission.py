"""Which pods get the scheduling gate at admission, and the JSON patch that adds it. Pure.

The MutatingAdmissionPolicy's rules (manifests/gatekeeper/admission: its ``matchConditions``, one function each
below, in its order) for the webhook that clusters without that API run in the gatekeeper
(``patcher.services.webhook``; docs/scheduling-gates.md). The API server selects namespaces, pod labels and
``CREATE`` of ``pods`` for both (an AdmissionReview carries no namespace labels); here, as in the policy's CEL:
unbound, not gated yet, one of ``scheduler_names``, and one of ``storage_classes``/``csi_drivers`` in a volume
the pod itself shows (not a ``persistentVolumeClaim``'s class: it is on the claim). No readiness ConfigMap
(the policy's ``paramRef``) means no gate, as ``parameterNotFoundAction: Allow``: a gate nobody would release.
tests/harness/admission_samples.py holds the sample pods both paths must gate alike.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from patcher.core.gates import DEFAULT_GATE
from patcher.core.kubeobj import Obj

#: The policy's ``has(object.spec.schedulerName) ? ... : 'default-scheduler'``: the API's default.
DEFAULT_SCHEDULER: Final = "default-scheduler"


@dataclass(frozen=True, slots=True)
class Selection:
    """The policy's ``variables``: the gate, and which pods get it (empty lists: no filter)."""

    gate: str = DEFAULT_GATE
    scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER,)
    storage_classes: tuple[str, ...] = ()
    csi_drivers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.gate:
            raise ValueError("the gate name must not be empty")


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` where CEL's ``has()`` is true: a JSON null or an empty string is an unset field to the API
    server (it decodes the pod into typed structs before admission, where both are the zero value)."""
    if not isinstance(obj, Mapping):
        return None
    value = obj.get(name)
    return None if value in (None, "") else value


def unbound(pod: Obj) -> bool:
    """``!has(object.spec.nodeName) || object.spec.nodeName == ''``: the API refuses a gate on a bound pod."""
    return _field(_field(pod, "spec"), "nodeName") is None


def gated(pod: Obj, gate: str) -> bool:
    """Whether ``pod`` carries ``gate`` already (written by its author, or a re-invocation)."""
    gates = _field(_field(pod, "spec"), "schedulingGates") or []
    return isinstance(gates, list) and any(isinstance(g, Mapping) and g.get("name") == gate for g in gates)


def verdict_not_ready(params: Obj) -> bool:
    """``!has(params.data) || !('ready' in params.data) || params.data['ready'] != 'true'``."""
    data = _field(params, "data")
    return not isinstance(data, Mapping) or data.get("ready") != "true"


def scheduler_selected(pod: Obj, names: Sequence[str]) -> bool:
    if not names:
        return True
    return (_field(_field(pod, "spec"), "schedulerName") or DEFAULT_SCHEDULER) in names


def storage_selected(pod: Obj, classes: Sequence[str], drivers: Sequence[str]) -> bool:
    """A generic ephemeral volume of one of ``classes`` or an inline CSI volume of one of ``drivers``."""
    if not classes and not drivers:
        return True
    volumes = _field(_field(pod, "spec"), "volumes") or []
    for v in volumes if isinstance(volumes, list) else []:
        claim_spec = _field(_field(_field(v, "ephemeral"), "volumeClaimTemplate"), "spec")
        if _field(claim_spec, "storageClassName") in classes:
            return True
        if _field(_field(v, "csi"), "driver") in drivers:
            return True
    return False


def selected(pod: Obj, params: Obj, selection: Selection) -> bool:
    """Every ``matchCondition`` of the policy, in its order."""
    return (unbound(pod) and not gated(pod, selection.gate) and verdict_not_ready(params)
            and scheduler_selected(pod, selection.scheduler_names)
            and storage_selected(pod, selection.storage_classes, selection.csi_drivers))


def pod_patch(pod: Obj, params: Obj | None, selection: Selection) -> list[Obj] | None:
    """The patch for ``pod`` at CREATE, ``None`` for none. ``params``: the readiness ConfigMap, ``None`` when
    it does not exist (``parameterNotFoundAction: Allow``: the policy is not applied). As the policy's mutation,
    the gate goes after existing gates (theirs stay first, in order)."""
    if params is None or not selected(pod, params, selection):
        return None
    gates = _field(_field(pod, "spec"), "schedulingGates")
    if isinstance(gates, list) and gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": selection.gate}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": selection.gate}]}]


class BadReview(ValueError):
    """The AdmissionReview is not one the webhook can answer with a patch (it is still allowed)."""


def review_request(review: Any) -> Obj:
    """The ``request`` of an ``admission.k8s.io/v1`` (or ``v1beta1``) AdmissionReview; ``BadReview`` if none."""
    if not isinstance(review, Mapping):
        raise BadReview(f"an AdmissionReview is a JSON object, not {type(review).__name__}")
    if review.get("kind") != "AdmissionReview" or review.get("apiVersion") not in REVIEW_VERSIONS:
        raise BadReview(f"not an AdmissionReview of {'/'.join(REVIEW_VERSIONS)}: "
                        f"{review.get('apiVersion')!r} {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("the AdmissionReview has no request with a uid")
    return dict(request)


#: The AdmissionReview versions answered, in the webhook configuration's preference order.
REVIEW_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


def review_patch(request: Obj, params: Obj | None, selection: Selection) -> list[Obj] | None:
    """The patch for an AdmissionReview ``request``: only a pod's ``CREATE`` (the configuration's rules say
    so, and this checks again: a gate can only be added at creation). A dry run gets the same patch, as with
    the policy (the patch has no side effect). ``BadReview`` when a pod CREATE carries no pod."""
    kind = request.get("kind")
    resource = request.get("resource")
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return None
    if not (isinstance(kind, Mapping) and kind.get("group", "") == "" and kind.get("kind") == "Pod"
            and isinstance(resource, Mapping) and resource.get("resource") == "pods"):
        return None
    pod = request.get("object")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        raise BadReview("a pod CREATE without a pod object")
    return pod_patch(dict(pod), params, selection)


def review_response(review: Any, patch: list[Obj] | None) -> Obj:
    """The AdmissionReview answer: always ``allowed: true`` (a webhook never blocks a pod), plus the patch.

    The answer echoes the request's version and uid; without a readable uid it carries an empty one, which the
    API server rejects as a webhook failure — ``failurePolicy: Ignore`` then admits the pod unchanged.
    """
    version = review.get("apiVersion") if isinstance(review, Mapping) else None
    request = review.get("request") if isinstance(review, Mapping) else None
    uid = request.get("uid") if isinstance(request, Mapping) else None
    response: Obj = {"uid": uid if isinstance(uid, str) else "", "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {"apiVersion": version if version in REVIEW_VERSIONS else REVIEW_VERSIONS[0],
            "kind": "AdmissionReview", "response": response}
