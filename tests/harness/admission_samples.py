"""One table of sample pods for both admission paths, so that they cannot drift apart.

tests/deploy/test_gate_admission.py runs every sample through the MutatingAdmissionPolicy's CEL (kustomize and Helm
renders); tests/deploy/test_webhook_rules.py runs the same samples through the webhook's rules
(``patcher.core.admission``) and through the real HTTPS server. Each sample says which selection is set (the
policy's variables / the chart's ``gatekeeper.admission.*`` values / the webhook's flags), what the readiness
ConfigMap says, and which gates the pod must have after admission (``None``: no ``schedulingGates``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME
from patcher.core.admission import Selection
from patcher.core.gates import DEFAULT_GATE
from patcher.core.readiness import evaluate, status_data
from tests.harness.emu.kubeemu_ext import make_pod

G = DEFAULT_GATE
OTHER = "example.com/other"
CSI_SC, CSI_DRIVER = "csi-baremetal-sc-hdd", "csi-baremetal.dell.com"

#: The readiness ConfigMap's states: published not Ready / Ready / without data / not published at all.
NOT_READY, READY, NO_DATA, ABSENT = "not-ready", "ready", "no-data", "absent"


def new_pod(**spec: Any) -> dict[str, Any]:
    """A pod as admission sees it at CREATE: no status, spec defaulted (schedulerName)."""
    pod = make_pod("p", "team-a")
    pod.pop("status")
    pod["spec"].pop("schedulingGates", None)
    pod["spec"]["schedulerName"] = "default-scheduler"
    pod["spec"].update(spec)
    return pod


def configmap(state: str) -> dict[str, Any] | None:
    """The readiness ConfigMap as the agents publish it (``status_data`` of a verdict: no control-plane node
    seen, so not Ready; its ``ready`` key flipped for Ready); ``None`` for ``ABSENT``."""
    if state == ABSENT:
        return None
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": DEFAULT_STATUS_NAME, "namespace": "scheduler-patcher"}}
    if state != NO_DATA:
        cm["data"] = status_data(evaluate([], {}))
        assert cm["data"]["ready"] == "false"
        cm["data"]["ready"] = "true" if state == READY else "false"
    return cm


def ephemeral(storage_class: str | None, name: str = "scratch") -> dict[str, Any]:
    # A size is required: the real API server refuses a claim template without one (the emulator did not).
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"name": name, "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}


INLINE = {"name": "inline", "csi": {"driver": CSI_DRIVER}}
INLINE_OTHER = {"name": "inline-other", "csi": {"driver": "other.csi.example.com"}}
CLAIM = {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}
EMPTY_DIR = {"name": "tmp", "emptyDir": {}}
CSI = {"storageClasses": [CSI_SC], "csiDrivers": [CSI_DRIVER]}


@dataclass(frozen=True)
class Sample:
    id: str
    spec: dict[str, Any]  #: changes to new_pod()'s spec; a None value deletes the field
    verdict: str
    gates: list[str] | None  #: after admission
    selection: dict[str, list[str]] = field(default_factory=dict)  #: schedulerNames, storageClasses, csiDrivers

    def pod(self) -> dict[str, Any]:
        pod = new_pod(**{k: v for k, v in self.spec.items() if v is not None})
        for key in (k for k, v in self.spec.items() if v is None):
            del pod["spec"][key]
        return pod

    def webhook_selection(self) -> Selection:
        """The same selection as the webhook's flags set it."""
        default = Selection()
        return Selection(gate=G,
                         scheduler_names=tuple(self.selection.get("schedulerNames", default.scheduler_names)),
                         storage_classes=tuple(self.selection.get("storageClasses", ())),
                         csi_drivers=tuple(self.selection.get("csiDrivers", ())))


SAMPLES: list[Sample] = [
    # The verdict.
    Sample("not-ready", {}, NOT_READY, [G]),
    Sample("configmap-without-data", {}, NO_DATA, [G]),
    Sample("ready: steady state adds nothing", {}, READY, None),
    Sample("no configmap: the agents published nothing yet", {}, ABSENT, None),
    # Existing gates.
    Sample("other gates kept, ours last", {"schedulingGates": [{"name": OTHER}]}, NOT_READY, [OTHER, G]),
    Sample("ready leaves other gates alone", {"schedulingGates": [{"name": OTHER}]}, READY, [OTHER]),
    Sample("already gated: not twice", {"schedulingGates": [{"name": G}, {"name": OTHER}]}, NOT_READY, [G, OTHER]),
    Sample("an empty gate list is created", {"schedulingGates": []}, NOT_READY, [G]),
    Sample("bound pod", {"nodeName": "worker-1"}, NOT_READY, None),
    Sample("empty nodeName is unbound", {"nodeName": ""}, NOT_READY, [G]),
    # Schedulers.
    Sample("another scheduler, default selection", {"schedulerName": "my-scheduler"}, NOT_READY, None),
    Sample("no schedulerName counts as default-scheduler", {"schedulerName": None}, NOT_READY, [G]),
    Sample("selected scheduler", {"schedulerName": "my-scheduler"}, NOT_READY, [G],
           {"schedulerNames": ["my-scheduler", "other"]}),
    Sample("default pod, another scheduler selected", {}, NOT_READY, None, {"schedulerNames": ["my-scheduler"]}),
    Sample("any scheduler", {"schedulerName": "x"}, NOT_READY, [G], {"schedulerNames": []}),
    # Storage: what CEL can see in the pod.
    Sample("ephemeral volume of a selected class", {"volumes": [CLAIM, ephemeral(CSI_SC)]}, NOT_READY, [G], CSI),
    Sample("inline CSI volume of a selected driver", {"volumes": [INLINE]}, NOT_READY, [G], CSI),
    Sample("other class, no class", {"volumes": [ephemeral("standard"), ephemeral(None, "d")]}, NOT_READY, None,
           CSI),
    Sample("a claim by name: its class is invisible", {"volumes": [CLAIM]}, NOT_READY, None, CSI),
    Sample("no volumes with a storage filter", {}, NOT_READY, None, CSI),
    Sample("other CSI driver", {"volumes": [INLINE_OTHER, EMPTY_DIR]}, NOT_READY, None, CSI),
    Sample("classes only: an inline CSI volume does not count", {"volumes": [INLINE]}, NOT_READY, None,
           {"storageClasses": [CSI_SC]}),
    Sample("drivers only: the class does not count", {"volumes": [ephemeral(CSI_SC)]}, NOT_READY, None,
           {"csiDrivers": [CSI_DRIVER]}),
    Sample("no storage filter: a claim is enough", {"volumes": [CLAIM]}, NOT_READY, [G]),
    Sample("storage selected but ready", {"volumes": [INLINE]}, READY, None, CSI),
    Sample("storage selected but bound", {"volumes": [INLINE], "nodeName": "w"}, NOT_READY, None, CSI),
]


def gates(pod: dict[str, Any]) -> list[str] | None:
    value = pod["spec"].get("schedulingGates")
    return None if value is None else [g["name"] for g in value]
