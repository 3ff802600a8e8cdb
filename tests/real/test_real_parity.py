"""The emulator against the real server, request for request: where tests/harness/emu/kubeemu.py answered
differently from kube-apiserver, found while telling the node story on the real server (tests/real/test_real_nodes.py).

Each probe sends the same requests to both and reduces the answers to what the project's code depends on; the two
must agree. Each divergence found was fixed in the emulator (the code was right about the real server) or in the
code (tests/component/test_kube_mirrorpod.py, tests/component/test_kube_annotations.py: a 403 that heals), and has its
probe here. What the emulator models on purpose and the real server does differently is written down in its docstring
(its `compact()`: a watch cache gone as well, which on the real server takes a restart, `restart_apiserver`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness.emu.kubeemu import KubeEmulator
from tests.harness.real.controlplane import ControlPlane

pytestmark = pytest.mark.real_cluster

NS = "parity"
JSON_PATCH = "application/json-patch+json"
Send = Callable[[str, str, Any, str], tuple[int, Any]]
POD: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
       "spec": {"schedulingGates": [{"name": "example.com/g"}], "containers": [{"name": "c", "image": "i"}]}}


def emulator_send(emu: KubeEmulator) -> Send:
    def send(method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{emu.url}{path}", data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")
    return send


@pytest.fixture(scope="module")
def emu() -> Iterator[KubeEmulator]:
    with KubeEmulator() as server:
        yield server


@pytest.fixture
def both(real_cluster: ControlPlane, emu: KubeEmulator) -> Iterator[dict[str, Send]]:
    """A fresh pod `p` (gated) in namespace `parity` on each server."""
    real_cluster.ensure_namespace(NS)
    def real(method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        return real_cluster.request(method, path, body, content_type)

    sends: dict[str, Send] = {"real": real, "emulator": emulator_send(emu)}
    for send in sends.values():
        send("DELETE", f"/api/v1/namespaces/{NS}/pods/p", {"gracePeriodSeconds": 0}, "application/json")
        status, out = send("POST", f"/api/v1/namespaces/{NS}/pods", POD, "application/json")
        assert status == 201, out
    yield sends


def agree(both: dict[str, Send], probe: Callable[[Send], Any]) -> Any:
    answers = {name: probe(send) for name, send in both.items()}
    assert answers["emulator"] == answers["real"], answers
    return answers["real"]


def patch(send: Send, ops: list[dict[str, Any]]) -> int:
    return send("PATCH", f"/api/v1/namespaces/{NS}/pods/p", ops, JSON_PATCH)[0]


def test_a_json_patch_test_of_null_on_a_missing_path_passes(both: dict[str, Send]) -> None:
    """The real server's JSON patch reads a missing path as null: `test` with null passes, anything else fails."""
    missing = "/spec/nodeName"  # its parent exists: a missing parent fails any test (below)
    values: list[Any] = [None, [], "x"]
    assert agree(both, lambda s: [patch(s, [{"op": "test", "path": missing, "value": v}])
                                  for v in values]) == [200, 422, 422]


def test_a_json_patch_that_removes_or_replaces_a_missing_path_fails(both: dict[str, Send]) -> None:
    assert agree(both, lambda s: [patch(s, [{"op": op, "path": "/spec/nodeName", "value": "x"}])
                                  for op in ("remove", "replace")]
                 + [patch(s, [{"op": "test", "path": "/metadata/labels/absent", "value": None}])]) == [422, 422, 422]


def test_emptied_scheduling_gates_are_stored_absent(both: dict[str, Send]) -> None:
    """The gatekeeper's release replaces the gates with `[]`; the server stores no field at all (omitempty), so a
    second release built from the stored pod tests a missing path."""
    def probe(send: Send) -> Any:
        status = patch(send, [{"op": "test", "path": "/spec/schedulingGates", "value": POD["spec"]["schedulingGates"]},
                              {"op": "replace", "path": "/spec/schedulingGates", "value": []}])
        _, pod = send("GET", f"/api/v1/namespaces/{NS}/pods/p", None, "application/json")
        again = patch(send, [{"op": "test", "path": "/spec/schedulingGates", "value": []},
                             {"op": "replace", "path": "/spec/schedulingGates", "value": []}])
        return status, "schedulingGates" in pod["spec"], again
    assert agree(both, probe) == (200, False, 422)


def test_a_created_pod_has_the_status_the_server_gives_it(both: dict[str, Send]) -> None:
    """The server drops the status of a created pod (Pending, no container statuses): a kubelet sets it through
    the status subresource afterwards (tests/harness/real/node_client.py)."""
    def probe(send: Send) -> Any:
        send("DELETE", f"/api/v1/namespaces/{NS}/pods/p", {"gracePeriodSeconds": 0}, "application/json")
        status, pod = send("POST", f"/api/v1/namespaces/{NS}/pods", {**POD, "status": {
            "phase": "Running", "containerStatuses": [{"name": "c", "ready": True, "restartCount": 3,
                                                       "image": "i", "imageID": "", "state": {"running": {}}}]}},
            "application/json")
        return status, pod["status"].get("phase"), pod["status"].get("qosClass"), "containerStatuses" in pod["status"]
    assert agree(both, probe) == (201, "Pending", "BestEffort", False)


def test_a_field_selector_on_an_unset_field_matches_the_empty_value(both: dict[str, Send]) -> None:
    def probe(send: Send) -> Any:
        out = []
        for selector in ("spec.nodeName%3D", "spec.nodeName!%3D", "status.nominatedNodeName%3D"):
            status, body = send("GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector={selector}", None,
                                "application/json")
            out.append((status, [i["metadata"]["name"] for i in body.get("items", [])]))
        return out
    assert agree(both, probe) == [(200, ["p"]), (200, []), (200, ["p"])]


def test_a_pod_deleted_without_grace_is_marked_before_it_goes(both: dict[str, Send]) -> None:
    """The kubelet deletes a mirror pod with no grace period: the server marks it (`deletionTimestamp`,
    `deletionGracePeriodSeconds: 0`, a MODIFIED event the kubelet recording shows, tests/fixtures/kubelet/), then
    removes it, and answers with the marked pod. The emulator removed it unmarked."""
    def probe(send: Send) -> Any:
        status, pod = send("DELETE", f"/api/v1/namespaces/{NS}/pods/p", {"gracePeriodSeconds": 0},
                           "application/json")
        gone, _ = send("GET", f"/api/v1/namespaces/{NS}/pods/p", None, "application/json")
        return status, bool(pod["metadata"].get("deletionTimestamp")), \
            pod["metadata"].get("deletionGracePeriodSeconds"), gone
    assert agree(both, probe) == (200, True, 0, 404)
