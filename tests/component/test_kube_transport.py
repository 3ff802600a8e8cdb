"""The one request path (``kube.transport.Api``): the official client's configuration and pool
manager without its generated classes; its TLS, token (refreshed per request), retries and timeouts all apply,
and its errors are the client's own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.client import ClientSettings, build_api_client, load_configuration
from patcher.adapters.kube.errors import NotFound, TooManyRequests, Unauthorized, Unreachable, api_call
from patcher.adapters.kube.listwatch import decode_event, split_records
from patcher.adapters.kube.transport import LEASES, MERGE_PATCH, NODES, PODS, Api, Resource
from tests.harness.emu.blackhole import BlackHole
from tests.harness.emu.kubeemu import tls_available
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt, make_pod

JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    if not tls_available():
        pytest.skip("the openssl tool is needed to make certificates")
    with KubeEmulatorExt(tls=True, token="t0ken") as e:
        yield e


@pytest.fixture
def api(emu: KubeEmulatorExt, tmp_path: Path) -> Iterator[Api]:
    client = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc")),
                                             timeout=(0.5, 2.0)))
    client.default_headers["User-Agent"] = "transport-test"
    yield client
    client.close()


def label(value: str) -> bytes:
    return json.dumps([{"op": "add", "path": "/metadata/labels", "value": {"v": value}}]).encode()


def test_a_prepared_patch_goes_over_the_clients_tls_with_its_token_and_headers(emu: KubeEmulatorExt,
                                                                                api: Api) -> None:
    emu.create(make_pod("p", "team-a"))
    raw = api
    assert PODS.path("a/b", "c d") == "/api/v1/namespaces/a%2Fb/pods/c%20d"  # as the generated client quotes
    answer = json.loads(raw.send("PATCH", PODS.path("team-a", "p"), label("1"), JSON_PATCH))
    assert answer["metadata"]["labels"] == {"v": "1"}
    stored = emu.get("pods", "p", "team-a")
    assert stored is not None and stored["metadata"]["labels"] == {"v": "1"}
    [req] = emu.requests("PATCH")
    assert req.headers["authorization"] == "Bearer t0ken" and req.headers["user-agent"] == "transport-test"
    assert req.headers["content-type"] == JSON_PATCH and req.headers["accept"] == "application/json"


def test_the_clients_token_refresh_hook_runs_for_every_request(emu: KubeEmulatorExt,
                                                               api: Api) -> None:
    # In-cluster token rotation and exec plugins refresh the token through this hook: it must not be skipped.
    emu.create(make_pod("p"))
    raw = api
    calls: list[str] = []
    token = ["t0ken"]

    def refresh(cfg: Any) -> None:
        calls.append(token[0])
        cfg.api_key["BearerToken"] = f"Bearer {token[0]}"

    api.configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed None in the client
    raw.send("PATCH", PODS.path("default", "p"), label("1"), JSON_PATCH)
    token[0] = "revoked"
    with pytest.raises(Unauthorized), api_call("release pod default/p"):
        raw.send("PATCH", PODS.path("default", "p"), label("2"), JSON_PATCH)
    assert calls == ["t0ken", "revoked"]
    assert [r.headers["authorization"] for r in emu.requests("PATCH")] == ["Bearer t0ken", "Bearer revoked"]


def test_error_answers_are_the_clients_exception_and_translate_like_a_generated_call(
        emu: KubeEmulatorExt, api: Api) -> None:
    emu.create(make_pod("p"))
    raw = api
    path = PODS.path("default", "p")
    emu.fail("PATCH", path, 429, retry_after=3)
    with pytest.raises(TooManyRequests, match=r"^cannot release pod default/p: HTTP 429") as info, \
            api_call("release pod default/p"):
        raw.send("PATCH", path, label("1"), JSON_PATCH)
    assert info.value.retry_after == 3.0
    with pytest.raises(NotFound), api_call("release pod default/gone"):
        raw.send("PATCH", PODS.path("default", "gone"), label("1"), JSON_PATCH)


def test_a_pool_the_client_closed_is_looked_up_again(emu: KubeEmulatorExt, api: Api) -> None:
    emu.create(make_pod("p"))
    raw = api
    path = PODS.path("default", "p")
    raw.send("PATCH", path, label("1"), JSON_PATCH)
    api.rest_client.pool_manager.clear()  # what ApiClient.close() does to its connections
    raw.send("PATCH", path, label("2"), JSON_PATCH)
    assert [r.status for r in emu.requests("PATCH")] == [200, 200]


def test_a_hung_server_costs_the_clients_retries_and_no_more(tmp_path: Path) -> None:
    # The client's own urllib3 retries (one) and timeouts apply: every attempt ends in the read timeout, so the
    # connections the server saw are the attempts (how long it took is the bench's business, not a test's).
    hole = BlackHole()
    try:
        kc = tmp_path / "kc"
        kc.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{hole.port}"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        api = build_api_client(ClientSettings(kubeconfig=str(kc), timeout=(0.5, 0.2)))
        raw = api
        with pytest.raises(Unreachable), api_call("release pod default/p"):
            raw.send("PATCH", PODS.path("default", "p"), label("1"), JSON_PATCH)
        api.close()
        retries = api.configuration.retries
        assert isinstance(retries, int) and 1 <= len(hole.conns) <= 1 + retries
    finally:
        hole.close()


def test_through_a_proxy_the_request_goes_via_the_clients_proxy_manager(tmp_path: Path) -> None:
    # The emulator serves absolute-form request targets by their path, so it can stand in for an HTTP proxy:
    # the API server's name does not resolve, so only a request sent through the proxy can succeed.
    with KubeEmulatorExt() as emu:
        emu.create(make_pod("p"))
        cfg = load_configuration(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        cfg.host, cfg.proxy = "http://kube-apiserver.invalid:6443", emu.url
        api = Api(cfg, (0.5, 2.0))
        raw = api
        raw.send("PATCH", PODS.path("default", "p"), label("1"), JSON_PATCH)
        api.close()
        stored = emu.get("pods", "p", "default")
        assert stored is not None and stored["metadata"]["labels"] == {"v": "1"}
        assert [r.headers["host"] for r in emu.requests("PATCH")] == ["kube-apiserver.invalid:6443"]


def test_the_verbs_speak_json_with_the_paths_and_queries_of_the_api(emu: KubeEmulatorExt, api: Api) -> None:
    emu.add_node("cp-1", labels={"role": "cp"})
    emu.add_node("w-1")
    assert [n["metadata"]["name"] for n in api.list(NODES, label_selector="role=cp")["items"]] == ["cp-1"]
    assert [n["metadata"]["name"] for n in api.list(NODES, field_selector="metadata.name=w-1")["items"]] == ["w-1"]
    node = api.patch(NODES, "cp-1", {"metadata": {"annotations": {"a": "1"}}}, content_type=MERGE_PATCH)
    assert node["metadata"]["annotations"] == api.get(NODES, "cp-1")["metadata"]["annotations"] == {"a": "1"}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l", "namespace": "ns"},
             "spec": {"holderIdentity": "me"}}
    created = api.create(LEASES, lease, namespace="ns")
    created["spec"]["holderIdentity"] = "you"
    assert api.update(LEASES, "l", created, namespace="ns")["spec"]["holderIdentity"] == "you"
    assert [r.path for r in emu.requests("PUT")] == ["/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"]
    assert [r.query for r in emu.requests("GET", "/api/v1/nodes")][:2] == [{"labelSelector": "role=cp"},
                                                                          {"fieldSelector": "metadata.name=w-1"}]
    assert Resource("apps", "v1", "daemonsets").path("a b", "c/d") == "/apis/apps/v1/namespaces/a%20b/daemonsets/c%2Fd"
    with pytest.raises(ValueError):
        NODES.path("ns")


def test_a_watch_streams_events_and_its_error_answer_is_the_clients_exception(emu: KubeEmulatorExt,
                                                                               api: Api) -> None:
    emu.create(make_pod("p"))
    rv = api.list(PODS, namespace="default")["metadata"]["resourceVersion"]
    resp = api.watch(PODS, namespace="default", resource_version=rv, timeout_seconds=60, connect_timeout=0.5)
    emu.create(make_pod("q"))
    events = []
    for line in split_records(resp.stream(amt=None, decode_content=True)):
        event = decode_event(line)
        if event is not None and event[0] != "BOOKMARK":
            events.append((event[0], event[1]["metadata"]["name"]))
            break
    resp.release_conn()
    assert events == [("ADDED", "q")]
    [req] = [r for r in emu.requests("GET") if r.query.get("watch") == "true"]
    assert req.query["timeoutSeconds"] == "60" and req.query["allowWatchBookmarks"] == "true"
    assert req.query["resourceVersion"] == rv and req.headers["authorization"] == "Bearer t0ken"
    api.configuration.api_key, api.configuration.refresh_api_key_hook = {"authorization": "Bearer wrong"}, None
    with pytest.raises(Unauthorized), api_call("watch pods"):
        api.watch(PODS, namespace="default", resource_version=rv, timeout_seconds=60, connect_timeout=0.5)

