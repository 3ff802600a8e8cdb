"""The one API error hierarchy: each HTTP answer (and no answer) from a real HTTP server becomes its class.

Against the local emulator, through the generated client, as the adapters call it: the table is only worth
something if it holds for what ``kubernetes`` actually raises (``ApiException`` with a status, urllib3's
``MaxRetryError`` for a refused connection), which a monkey-patched client would not show.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from patcher.adapters.kube.client import ClientSettings, build_api_client
from patcher.adapters.kube.errors import (
    ApiError,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
    api_call,
    api_json,
    error_class,
    translate,
)
from patcher.adapters.kube.transport import CONFIGMAPS, NODES, Api
from tests.harness.emu.kubeemu import KubeEmulator
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

NS = "scheduler-patcher"
CM_PATH = f"/api/v1/namespaces/{NS}/configmaps/status"


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        e.upsert({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "status", "namespace": NS},
                  "data": {"a": "b"}})
        yield e


@pytest.fixture
def core(kubeconfig: Path) -> Iterator[Api]:
    client = build_api_client(ClientSettings(kubeconfig=str(kubeconfig), timeout=(0.5, 2.0)))
    yield client
    client.close()


def read(core: Api, name: str = "status") -> Any:
    return api_json(f"read ConfigMap {NS}/{name}", core.get, CONFIGMAPS, name, namespace=NS)


@pytest.mark.parametrize(("code", "kind"), [
    (400, ApiError), (401, Unauthorized), (403, Forbidden), (404, NotFound), (409, Conflict), (410, ApiError),
    (422, Invalid), (429, TooManyRequests), (500, ServerError), (503, ServerError), (504, ServerError),
])
def test_each_http_status_becomes_its_class(emu: KubeEmulatorExt, core: Api, code: int,
                                            kind: type[ApiError]) -> None:
    emu.fail("GET", CM_PATH, code)
    with pytest.raises(ApiError) as info:
        read(core)
    assert type(info.value) is kind
    assert info.value.status == code
    assert re.match(rf"cannot read ConfigMap {NS}/status: HTTP {code} \w", str(info.value))  # the deed, the reason
    assert "\n" not in str(info.value)
    assert isinstance(info.value.__cause__, ApiException)  # the client's own error stays at hand for debugging
    assert read(core)["data"] == {"a": "b"}  # an answer, not a broken client: the next read works


def test_real_answers_not_injected_ones(emu: KubeEmulatorExt, core: Api) -> None:
    with pytest.raises(NotFound, match=f"cannot read ConfigMap {NS}/missing: HTTP 404"):
        read(core, "missing")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "status", "namespace": NS}}
    with pytest.raises(Conflict) as info:
        api_json(f"create ConfigMap {NS}/status", core.create, CONFIGMAPS, body, namespace=NS)
    assert info.value.status == 409


def test_bad_credentials_are_unauthorized(tmp_path: Path) -> None:
    with KubeEmulator(token="right") as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        kubeconfig.write_text(kubeconfig.read_text().replace('"right"', '"revoked"'))
        client = build_api_client(ClientSettings(kubeconfig=str(kubeconfig), timeout=(0.5, 2.0)))
        try:
            with pytest.raises(Unauthorized) as info:
                api_json("list nodes", client.list, NODES)
        finally:
            client.close()
    assert info.value.status == 401 and not isinstance(info.value, Forbidden)


def test_no_answer_is_unreachable_without_a_status(emu: KubeEmulatorExt, core: Api) -> None:
    with emu.outage("refuse"), pytest.raises(Unreachable) as info:
        read(core)
    assert info.value.status is None
    assert str(info.value).startswith(f"cannot read ConfigMap {NS}/status: ")
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_the_context_manager_translates_and_passes_our_own_errors_through(emu: KubeEmulatorExt,
                                                                          core: Api) -> None:
    emu.fail("GET", CM_PATH, 403)
    with pytest.raises(Forbidden, match="cannot read the status: HTTP 403"), api_call("read the status"):
        core.get(CONFIGMAPS, "status", namespace=NS)
    already = NotFound("read x", "gone", 404)
    assert translate(already, "something else") is already  # the innermost deed names the failure
    with pytest.raises(NotFound) as info, api_call("outer"):
        raise already
    assert info.value is already


def test_an_undecodable_body_is_unreachable() -> None:
    assert type(translate(ValueError("Expecting value: line 1 column 1"), "read x")) is Unreachable


@pytest.mark.parametrize(("status", "kind"), [(None, Unreachable), (401, Unauthorized), (403, Forbidden),
                                              (404, NotFound), (409, Conflict), (422, Invalid), (500, ServerError),
                                              (599, ServerError), (418, ApiError), (600, ApiError)])
def test_the_table(status: int | None, kind: type[ApiError]) -> None:
    assert error_class(status) is kind
