"""A prepared JSON body sent through the client's own transport (``kube.rawjson``, issue 25): the gatekeeper's
release PATCH skips the generated method's overhead, never the client's TLS, token, retries or timeouts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.client import ClientSettings, TimeoutApiClient, build_api_client, load_configuration
from patcher.adapters.kube.errors import NotFound, TooManyRequests, Unauthorized, Unreachable, api_call
from patcher.adapters.kube.rawjson import RawJson
from tests.blackhole import BlackHole
from tests.kubeemu import tls_available
from tests.kubeemu_ext import KubeEmulatorExt, make_pod

JSON_PATCH = "application/json-patch+json"
POD = "/api/v1/namespaces/{namespace}/pods/{name}"


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    if not tls_available():
        pytest.skip("the openssl tool is needed to make certificates")
    with KubeEmulatorExt(tls=True, token="t0ken") as e:
        yield e


@pytest.fixture
def api(emu: KubeEmulatorExt, tmp_path: Path) -> Iterator[TimeoutApiClient]:
    client = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc")),
                                             timeout=(0.5, 2.0)))
    client.user_agent = "rawjson-test"
    yield client
    client.close()


def label(value: str) -> bytes:
    return json.dumps([{"op": "add", "path": "/metadata/labels", "value": {"v": value}}]).encode()


def test_a_prepared_patch_goes_over_the_clients_tls_with_its_token_and_headers(emu: KubeEmulatorExt,
                                                                                api: TimeoutApiClient) -> None:
    emu.create(make_pod("p", "team-a"))
    raw = RawJson(api)
    assert raw.path(POD, namespace="a/b", name="c d") == "/api/v1/namespaces/a%2Fb/pods/c%20d"  # as generated
    answer = json.loads(raw.send("PATCH", raw.path(POD, namespace="team-a", name="p"), label("1"), JSON_PATCH))
    assert answer["metadata"]["labels"] == {"v": "1"}
    stored = emu.get("pods", "p", "team-a")
    assert stored is not None and stored["metadata"]["labels"] == {"v": "1"}
    [req] = emu.requests("PATCH")
    assert req.headers["authorization"] == "Bearer t0ken" and req.headers["user-agent"] == "rawjson-test"
    assert req.headers["content-type"] == JSON_PATCH and req.headers["accept"] == "application/json"


def test_the_clients_token_refresh_hook_runs_for_every_request(emu: KubeEmulatorExt,
                                                               api: TimeoutApiClient) -> None:
    # In-cluster token rotation and exec plugins refresh the token through this hook: it must not be skipped.
    emu.create(make_pod("p"))
    raw = RawJson(api)
    calls: list[str] = []
    token = ["t0ken"]

    def refresh(cfg: Any) -> None:
        calls.append(token[0])
        cfg.api_key["BearerToken"] = f"Bearer {token[0]}"

    api.configuration.refresh_api_key_hook = refresh
    raw.send("PATCH", raw.path(POD, namespace="default", name="p"), label("1"), JSON_PATCH)
    token[0] = "revoked"
    with pytest.raises(Unauthorized), api_call("release pod default/p"):
        raw.send("PATCH", raw.path(POD, namespace="default", name="p"), label("2"), JSON_PATCH)
    assert calls == ["t0ken", "revoked"]
    assert [r.headers["authorization"] for r in emu.requests("PATCH")] == ["Bearer t0ken", "Bearer revoked"]


def test_error_answers_are_the_clients_exception_and_translate_like_a_generated_call(
        emu: KubeEmulatorExt, api: TimeoutApiClient) -> None:
    emu.create(make_pod("p"))
    raw = RawJson(api)
    path = raw.path(POD, namespace="default", name="p")
    emu.fail("PATCH", path, 429, retry_after=3)
    with pytest.raises(TooManyRequests, match=r"^cannot release pod default/p: HTTP 429") as info, \
            api_call("release pod default/p"):
        raw.send("PATCH", path, label("1"), JSON_PATCH)
    assert info.value.retry_after == 3.0
    with pytest.raises(NotFound), api_call("release pod default/gone"):
        raw.send("PATCH", raw.path(POD, namespace="default", name="gone"), label("1"), JSON_PATCH)


def test_a_pool_the_client_closed_is_looked_up_again(emu: KubeEmulatorExt, api: TimeoutApiClient) -> None:
    emu.create(make_pod("p"))
    raw = RawJson(api)
    path = raw.path(POD, namespace="default", name="p")
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
        raw = RawJson(api)
        with pytest.raises(Unreachable), api_call("release pod default/p"):
            raw.send("PATCH", raw.path(POD, namespace="default", name="p"), label("1"), JSON_PATCH)
        api.close()
        assert 1 <= len(hole.conns) <= 1 + api.configuration.retries
    finally:
        hole.close()


def test_through_a_proxy_the_request_goes_via_the_clients_proxy_manager(tmp_path: Path) -> None:
    # The emulator serves absolute-form request targets by their path, so it can stand in for an HTTP proxy:
    # the API server's name does not resolve, so only a request sent through the proxy can succeed.
    with KubeEmulatorExt() as emu:
        emu.create(make_pod("p"))
        cfg = load_configuration(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        cfg.host, cfg.proxy = "http://kube-apiserver.invalid:6443", emu.url
        api = TimeoutApiClient(cfg, (0.5, 2.0))
        raw = RawJson(api)
        raw.send("PATCH", raw.path(POD, namespace="default", name="p"), label("1"), JSON_PATCH)
        api.close()
        stored = emu.get("pods", "p", "default")
        assert stored is not None and stored["metadata"]["labels"] == {"v": "1"}
        assert [r.headers["host"] for r in emu.requests("PATCH")] == ["kube-apiserver.invalid:6443"]
