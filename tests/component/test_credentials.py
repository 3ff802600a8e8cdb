"""Credentials found as kubectl finds them, and an API server that does not answer said in one line.

Against the API emulator through real kubeconfig files in tmp_path (nothing of the client is replaced): each
emulator answers only the requests that reach it, so which one saw the request says which credentials were used.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters.kube.client import ApiConfigError, ClientSettings, build_api_client, load_configuration
from patcher.adapters.kube.errors import Unreachable, api_json
from patcher.adapters.kube.transport import NODES
from patcher.commands import cli
from tests.component.test_readiness import ready_cluster
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt


@pytest.fixture
def two() -> Iterator[tuple[KubeEmulatorExt, KubeEmulatorExt]]:
    with KubeEmulatorExt() as a, KubeEmulatorExt() as b:
        yield a, b


def kubeconfig(path: Path, servers: dict[str, str], current: str | None) -> Path:
    """A kubeconfig with one context (and cluster, user) per name in ``servers``."""
    config: dict[str, object] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in servers.items()],
        "users": [{"name": n, "user": {}} for n in servers],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in servers],
    }
    if current is not None:
        config["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def host(settings: ClientSettings, env: dict[str, str]) -> str:
    return str(load_configuration(settings, env).host)


def test_kubectls_order(two: tuple[KubeEmulatorExt, KubeEmulatorExt], tmp_path: Path) -> None:
    a, b = two
    home = tmp_path / "home"
    kubeconfig(home / ".kube/config", {"home": a.url}, "home")
    first = kubeconfig(tmp_path / "first", {"one": b.url}, "one")
    flag = kubeconfig(tmp_path / "flag", {"flag": a.url, "other": b.url}, "other")
    incluster = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    # ~/.kube/config over the service account, $KUBECONFIG over ~/.kube/config, --kubeconfig over both
    assert host(ClientSettings(), {"HOME": str(home), **incluster}) == a.url
    assert host(ClientSettings(), {"HOME": str(home), "KUBECONFIG": str(first)}) == b.url
    assert host(ClientSettings(kubeconfig=str(flag)), {"HOME": str(home), "KUBECONFIG": str(first)}) == b.url
    assert host(ClientSettings(kubeconfig=str(flag), context="flag"), {"KUBECONFIG": str(first)}) == a.url
    # no file anywhere and not in a pod: one sentence with the order looked in
    with pytest.raises(ApiConfigError) as info:
        load_configuration(ClientSettings(), {"HOME": str(tmp_path / "nobody")})
    assert str(info.value) == ("no Kubernetes credentials found: looked for --kubeconfig, $KUBECONFIG, "
                               "~/.kube/config, then the in-cluster service account (KUBERNETES_SERVICE_HOST is "
                               "not set: not in a pod)")


def test_kubeconfig_is_a_merged_list_where_the_first_file_wins(two: tuple[KubeEmulatorExt, KubeEmulatorExt],
                                                               tmp_path: Path) -> None:
    a, b = two
    one = kubeconfig(tmp_path / "one", {"a": a.url}, "a")
    two_ = kubeconfig(tmp_path / "two", {"b": b.url, "a": b.url}, "b")  # its "a" is shadowed by one's
    listed = f"{tmp_path / 'missing'}:{one}:{two_}"  # a missing file is skipped, as kubectl does
    assert host(ClientSettings(), {"KUBECONFIG": listed}) == a.url  # the first current-context wins
    assert host(ClientSettings(context="b"), {"KUBECONFIG": listed}) == b.url  # a context of the second file
    assert host(ClientSettings(context="a"), {"KUBECONFIG": listed}) == a.url  # the first file's "a"
    no_current = kubeconfig(tmp_path / "none", {"c": b.url}, None)
    assert host(ClientSettings(), {"KUBECONFIG": f"{no_current}:{one}"}) == a.url


@pytest.mark.parametrize(("settings", "message"), [
    (ClientSettings(context="nope"), "--context nope: no such context in the kubeconfig {kc} ($KUBECONFIG; its "
                                     "contexts: a)"),
    (ClientSettings(kubeconfig="{tmp}/absent"), "cannot load the kubeconfig {tmp}/absent (--kubeconfig): no such file"),
])
def test_refusals_are_one_line(tmp_path: Path, settings: ClientSettings, message: str) -> None:
    kc = kubeconfig(tmp_path / "kc", {"a": "http://127.0.0.1:1"}, "a")
    if settings.kubeconfig:
        settings = ClientSettings(kubeconfig=settings.kubeconfig.format(tmp=tmp_path))
    with pytest.raises(ApiConfigError) as info:
        load_configuration(settings, {"KUBECONFIG": str(kc)})
    assert str(info.value).startswith(message.format(kc=kc, tmp=tmp_path)) and "\n" not in str(info.value)
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(ApiConfigError, match=f"cannot load the kubeconfig {tmp_path}/broken: not YAML"):
        load_configuration(ClientSettings(kubeconfig=str(tmp_path / "broken")), {})
    with pytest.raises(ApiConfigError, match="--context nope: no kubeconfig found"):
        load_configuration(ClientSettings(context="nope"), {"HOME": str(tmp_path / "nobody")})


def test_readiness_on_an_admin_machine_reads_home_kube_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with KubeEmulatorExt() as emu, KubeEmulatorExt() as other:
        ready_cluster(emu)
        kubeconfig(tmp_path / ".kube/config", {"admin": emu.url, "other": other.url}, "admin")
        for name in ("KUBECONFIG", "PATCHER_KUBECONFIG", "PATCHER_CONTEXT", "KUBERNETES_SERVICE_HOST"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        assert cli.main(["readiness"]) == 0
        assert "verdict: Ready: 3/3" in capsys.readouterr().out
        assert cli.main(["readiness", "--context", "other"]) == 1  # kubectl's --context: the other server
        assert other.requests("GET", "/api/v1/nodes")
        assert "verdict: NotReady" in capsys.readouterr().out


def closed_port() -> Iterator[int]:
    """A port bound but not listening: a connection to it is refused at once (no race with another bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def refused() -> Iterator[int]:
    yield from closed_port()


def test_an_unreachable_server_is_one_line_naming_it(tmp_path: Path, refused: int) -> None:
    kc = kubeconfig(tmp_path / "kc", {"a": f"https://127.0.0.1:{refused}"}, "a")
    api = build_api_client(ClientSettings(kubeconfig=str(kc), timeout=(0.5, 0.5)))
    try:
        with pytest.raises(Unreachable) as info:
            api_json("list nodes", api.list, NODES)
    finally:
        api.close()
    assert str(info.value) == f"cannot list nodes: cannot reach https://127.0.0.1:{refused}: connection refused"
    assert info.value.detail == f"cannot reach https://127.0.0.1:{refused}: connection refused"


def test_readiness_against_an_unreachable_server(tmp_path: Path, refused: int, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    kc = kubeconfig(tmp_path / "kc", {"a": f"https://127.0.0.1:{refused}"}, "a")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    assert cli.main(["readiness"]) == 1
    err = capsys.readouterr().err
    assert err == (f"scheduler-patcher: error: cannot list nodes (node-role.kubernetes.io/control-plane): "
                   f"cannot reach https://127.0.0.1:{refused}: connection refused\n")
