"""The API emulator itself (tests/harness/emu/kubeemu.py), through the official client: the semantics other tests rely
on."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.errors import TooManyRequests, api_json
from patcher.adapters.kube.transport import PODS
from tests.harness.emu.kubeemu import KubeEmulator, json_patch, make_mirror_pod, merge_patch
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt


@pytest.fixture
def emu() -> Iterator[KubeEmulator]:
    with KubeEmulator(token="tok", bookmark_interval=0.1) as e:
        yield e


@pytest.fixture
def core(emu: KubeEmulator, tmp_path: Path) -> Iterator[k8s.CoreV1Api]:
    api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
    yield k8s.CoreV1Api(k8s.ApiClient(api.configuration))  # the emulator answers the generated client too
    api.close()


def raw(resp: Any) -> Any:
    return json.loads(resp.data)


def body(resp: Any) -> bytes:
    """The undecoded answer of a call made with ``_preload_content=False``."""
    data: bytes = resp.data
    return data


def test_patch_types(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    emu.set_pod(make_mirror_pod(node_name="n1", started_at="2026-11-21T23:40:02Z"))
    name = "kube-scheduler-n1"
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/nodeName", "value": "n1"},
                                 {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    core.patch_namespaced_pod(name, "kube-system", ops, _preload_content=False)  # json-patch for a list
    assert (emu.get("pods", name, "kube-system") or {})["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(ApiException) as failed:
        core.patch_namespaced_pod(name, "kube-system", [{"op": "test", "path": "/spec/nodeName", "value": "x"}])
    assert failed.value.status == 422
    with pytest.raises(ApiException) as strategic:  # the client's default for an object body
        core.patch_namespaced_pod(name, "kube-system", {"metadata": {"labels": {"c": "d"}}})
    assert strategic.value.status == 415
    core.patch_namespaced_pod(name, "kube-system", {"metadata": {"labels": {"a": None, "c": "d"}}},
                              _content_type="application/merge-patch+json", _preload_content=False)
    assert (emu.get("pods", name, "kube-system") or {})["metadata"]["labels"] == {"c": "d"}


def test_create_replace_conflicts(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    body = k8s.V1ConfigMap.model_validate(
        {"metadata": {"generateName": "cfg-", "namespace": "kube-system"}, "data": {"k": "v"}}
    )
    created = raw(core.create_namespaced_config_map("kube-system", body, _preload_content=False))
    assert created["metadata"]["name"].startswith("cfg-") and created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as wrong_ns:
        core.create_namespaced_config_map("default", body)
    assert wrong_ns.value.status == 400
    stale = k8s.V1ConfigMap.model_validate(dict(created, data={"k": "w"}))
    emu.mutate("configmaps", created["metadata"]["name"], lambda o: o["data"].update(k="x"), "kube-system")
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map(created["metadata"]["name"], "kube-system", stale)
    assert conflict.value.status == 409


def test_selectors_and_auth(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    for node in ("n1", "n2"):
        pod = make_mirror_pod(node_name=node, started_at="2026-11-21T23:40:02Z")
        pod["metadata"]["labels"] = {"tier": "control-plane", "node": node}
        emu.set_pod(pod)

    def names(namespace: str, fields: str | None = None, labels: str | None = None) -> list[str]:
        resp = core.list_namespaced_pod(namespace, field_selector=fields, label_selector=labels,
                                        _preload_content=False)
        return [p["metadata"]["name"] for p in raw(resp)["items"]]

    assert names("kube-system", fields="spec.nodeName=n2") == ["kube-scheduler-n2"]
    assert names("kube-system", labels="tier=control-plane,node!=n1") == ["kube-scheduler-n2"]
    assert names("default") == []
    emu.token = "rotated"
    with pytest.raises(ApiException) as unauthorized:
        core.list_namespaced_pod("kube-system")
    assert unauthorized.value.status == 401


def test_watch_stream_semantics(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    pod = make_mirror_pod(node_name="n1", started_at="2026-11-21T23:40:02Z")
    pod["metadata"]["labels"] = {"watched": "yes"}
    emu.set_pod(pod)
    rv = raw(core.list_namespaced_pod("kube-system", _preload_content=False))["metadata"]["resourceVersion"]
    emu.mutate("pods", "kube-scheduler-n1", lambda p: p["metadata"]["labels"].update(watched="no"), "kube-system")

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return core.list_namespaced_pod(*args, **kwargs)

    watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
    stream = watch.stream(  # type: ignore[no-untyped-call]
        wrapper, "kube-system", label_selector="watched=yes", resource_version=rv,
        allow_watch_bookmarks=True, timeout_seconds=1,
    )
    events = list(stream)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "DELETED"  # it left the selector: a watcher of that selector sees it go
    assert "BOOKMARK" in kinds[1:] and set(kinds[1:]) == {"BOOKMARK"}


def test_outage_refuses_connections_and_keeps_the_port(emu: KubeEmulator) -> None:
    port = emu.port
    with emu.outage("refuse"), pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
    with socket.create_connection(("127.0.0.1", emu.port), timeout=1):
        assert emu.port == port


def test_patch_helpers() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}
    doc = {"spec": {"schedulingGates": [{"name": "a"}, {"name": "ours"}, {"name": "b"}]}}
    out = json_patch(doc, [{"op": "test", "path": "/spec/schedulingGates/1/name", "value": "ours"},
                           {"op": "remove", "path": "/spec/schedulingGates/1"}])
    assert out == {"spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}]}}
    moved = json_patch({"a": {"x": 1}}, [{"op": "move", "from": "/a/x", "path": "/b"},
                                         {"op": "copy", "from": "/b", "path": "/c"}])
    assert moved == {"a": {}, "b": 1, "c": 1}


def _watch_lines(core: k8s.CoreV1Api, rv: str) -> list[bytes]:
    resp: Any = core.list_namespaced_pod("kube-system", watch=True, resource_version=rv,
                                         allow_watch_bookmarks=True, timeout_seconds=5, _preload_content=False)
    return [line for line in resp.data.split(b"\n") if line]


def test_misbehaving_watch_modes(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    emu.set_pod(make_mirror_pod(node_name="n1", started_at="2026-11-21T23:40:02Z"))
    rv = raw(core.list_namespaced_pod("kube-system", _preload_content=False))["metadata"]["resourceVersion"]
    emu.watch_close_after = 0
    assert _watch_lines(core, rv) == []  # ends at once, cleanly (the body is complete)
    emu.watch_close_after = 1
    lines = _watch_lines(core, rv)  # the fixture sends a bookmark every 0.1 s: one, then the end
    assert [json.loads(line)["type"] for line in lines] == ["BOOKMARK"]
    emu.watch_close_after = None
    emu.watch_garbage = b"<html>502</html>"
    emu.mutate("pods", "kube-scheduler-n1", lambda p: p["metadata"].update(labels={"a": "b"}), "kube-system")
    emu.watch_close_after = 2
    lines = _watch_lines(core, rv)
    assert lines[0] == b"<html>502</html>" and json.loads(lines[1])["type"] == "MODIFIED"
    assert emu.open_watches == 0  # every ended stream unsubscribed


def test_paged_lists_come_from_the_first_pages_snapshot(emu: KubeEmulator, core: k8s.CoreV1Api) -> None:
    for i in range(5):
        emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "default"},
                    "spec": {"containers": []}, "status": {"phase": "Pending"}})
    first = raw(core.list_namespaced_pod("default", limit=2, _preload_content=False))
    assert [p["metadata"]["name"] for p in first["items"]] == ["p0", "p1"]
    assert first["metadata"]["remainingItemCount"] == 3
    emu.delete("pods", "p3", "default")  # changes after the first page are not in the pages that follow
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p9", "namespace": "default"}})
    second = raw(core.list_namespaced_pod("default", limit=2, _continue=first["metadata"]["continue"],
                                          _preload_content=False))
    assert [p["metadata"]["name"] for p in second["items"]] == ["p2", "p3"]
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    last = raw(core.list_namespaced_pod("default", limit=2, _continue=second["metadata"]["continue"],
                                        _preload_content=False))
    assert [p["metadata"]["name"] for p in last["items"]] == ["p4"] and "continue" not in last["metadata"]
    again = raw(core.list_namespaced_pod("default", limit=4, _preload_content=False))
    emu.compact()
    with pytest.raises(ApiException) as gone:
        core.list_namespaced_pod("default", limit=4, _continue=again["metadata"]["continue"])
    assert gone.value.status == 410


def test_pod_field_selectors_are_limited_to_what_the_api_server_supports(emu: KubeEmulator,
                                                                         core: k8s.CoreV1Api) -> None:
    sel = "status.phase=Pending,spec.nodeName=,spec.schedulerName=default-scheduler"
    assert raw(core.list_pod_for_all_namespaces(field_selector=sel, _preload_content=False))["items"] == []
    with pytest.raises(ApiException) as bad:
        core.list_pod_for_all_namespaces(field_selector="spec.schedulingGates=x")
    assert bad.value.status == 400 and "field label not supported: spec.schedulingGates" in str(bad.value.body)


def test_injected_429_carries_retry_after_and_the_client_error_reads_it(tmp_path: Path) -> None:
    with KubeEmulatorExt() as ext:
        api = build_api_client(ClientSettings(kubeconfig=str(ext.write_kubeconfig(tmp_path / "kc"))))
        try:
            # A PATCH: urllib3 itself waits out one Retry-After on idempotent methods (GET, PUT, DELETE).
            ext.fail("PATCH", None, 429, retry_after=3)
            with pytest.raises(TooManyRequests, match=r"^cannot patch: HTTP 429") as info:
                api_json("patch", api.patch, PODS, "p", {"metadata": {}}, namespace="default",
                         content_type="application/merge-patch+json")
            assert info.value.retry_after == 3.0
            assert [r.status for r in ext.requests("PATCH")] == [429]
        finally:
            api.close()


def test_latency_delays_each_answer_and_concurrent_requests_overlap(emu: KubeEmulator,
                                                                  core: k8s.CoreV1Api) -> None:
    emu.latency = 0.2
    started = time.monotonic()
    api_json("list pods", core.list_namespaced_pod, "default")
    assert time.monotonic() - started >= 0.2
    assert emu.peak_in_flight == 1
    threads = [threading.Thread(target=api_json, args=("list pods", core.list_namespaced_pod, "default"))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert emu.peak_in_flight >= 2  # each connection has its own thread: the delays overlap


def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_request_headers_are_read_as_http_defines_them() -> None:
    # The emulator reads header fields itself (not through the standard library's email parser):
    # folding, keep-alive until "Connection: close", and the limits of http.client.parse_headers.
    with KubeEmulator() as emu:
        get = b"GET /version HTTP/1.1\r\nHost: x\r\n"
        answer = exchange(emu.port, get + b"X-Folded: one\r\n two\r\n\r\n" + get + b"Connection: close\r\n\r\n")
        assert answer.count(b"HTTP/1.1 200 OK") == 2  # kept alive after the first, closed after the second
        assert [r.headers.get("x-folded") for r in emu.requests("GET")] == ["one two", None]
        many = b"".join(b"X-%d: v\r\n" % i for i in range(101))
        assert exchange(emu.port, get + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
        assert exchange(emu.port, get + b"X-Long: " + b"v" * 70000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
        assert exchange(emu.port, b"BREW /pot HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 501 ")
        assert b"Error code: 400" in exchange(emu.port, b"GET /version HTTP/2.0\r\n\r\n")  # as HTTP/0.9
        assert exchange(emu.port, b"GET /version HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")  # then closed


def test_answers_and_events_are_the_json_text_of_the_stored_objects(emu: KubeEmulator,
                                                                    core: k8s.CoreV1Api) -> None:
    # Each stored version is serialised once and the text reused (answer, watch events, lists): it must be
    # exactly what json.dumps makes of the object as stored now, never an older version's.
    emu.set_pod(make_mirror_pod(node_name="n1"))
    rv = raw(core.list_namespaced_pod("kube-system", _preload_content=False))["metadata"]["resourceVersion"]
    for value in ("a", "b"):
        answer = core.patch_namespaced_pod("kube-scheduler-n1", "kube-system",
                                           [{"op": "add", "path": "/metadata/labels", "value": {"v": value}}],
                                           _content_type="application/json-patch+json", _preload_content=False)
        assert body(answer) == json.dumps(emu.get("pods", "kube-scheduler-n1", "kube-system")).encode()
    listed = body(core.list_namespaced_pod("kube-system", _preload_content=False))
    stored = emu.get("pods", "kube-scheduler-n1", "kube-system")
    assert stored is not None and stored["metadata"]["labels"] == {"v": "b"}
    assert listed == json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": json.loads(listed)["metadata"],
                                 "items": [stored]}).encode()
    stream = core.list_namespaced_pod("kube-system", watch=True, resource_version=rv, timeout_seconds=1,
                                      _preload_content=False)
    lines = [line for line in body(stream).split(b"\n") if line]
    assert [json.loads(line)["object"]["metadata"]["labels"] for line in lines] == [{"v": "a"}, {"v": "b"}]
    assert lines[-1] == json.dumps({"type": "MODIFIED", "object": stored}).encode()


# -- foreground deletion, as kube-apiserver and its garbage collector do it -----------------------------------


def _owned(emu: KubeEmulator, name: str, owner: Any, *, blocks: bool) -> None:
    ref = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": blocks}
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns",
                                                                "ownerReferences": [ref]},
                "spec": {"containers": [{"name": "c", "image": "x"}]}})


def test_a_foreground_delete_keeps_the_owner_until_its_blocking_pods_are_gone(emu: KubeEmulator) -> None:
    ds = emu.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": "ns"}})
    _owned(emu, "blocks", ds, blocks=True)
    _owned(emu, "free", ds, blocks=False)
    marked = emu.delete("daemonsets", "d", "ns", group="apps", options={"propagationPolicy": "Foreground"})
    assert marked["metadata"]["finalizers"] == ["foregroundDeletion"] and marked["metadata"]["deletionTimestamp"]
    for name in ("blocks", "free"):  # both deleted gracefully (30 s: the pod's default), kept for their kubelet
        pod = emu.get("pods", name, "ns")
        assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 30
    emu.delete("pods", "free", "ns")
    assert emu.get("daemonsets", "d", "ns", group="apps") is not None  # a blocking dependent is left
    emu.delete("pods", "blocks", "ns")
    assert emu.get("daemonsets", "d", "ns", group="apps") is None


def test_a_foreground_delete_of_an_owner_without_dependents_or_a_background_one_removes_it_at_once(
        emu: KubeEmulator) -> None:
    for options in ({"propagationPolicy": "Foreground"}, None):
        ds = emu.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": "ns"}})
        if options is None:
            _owned(emu, "p", ds, blocks=True)
        emu.delete("daemonsets", "d", "ns", group="apps", options=options)
        assert emu.get("daemonsets", "d", "ns", group="apps") is None
    assert emu.get("pods", "p", "ns") is not None  # background: no garbage collector here, the pod stays
