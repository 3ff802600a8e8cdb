"""Building the API client: kubeconfig, $KUBECONFIG, in-cluster, TLS always verified, short timeouts."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher.adapters.kube.client import (
    ApiConfigError,
    ClientSettings,
    build_api_client,
    load_configuration,
    server_version,
)
from tests.harness.emu.kubeemu import KubeEmulator, tls_available
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

needs_tls = pytest.mark.skipif(not tls_available(), reason="the openssl tool is needed to make certificates")


@pytest.fixture(scope="module")
def tls_emu() -> Iterator[KubeEmulator]:
    if not tls_available():
        pytest.skip("the openssl tool is needed to make certificates")
    with KubeEmulator(tls=True, token="t0ken", git_version="v1.30.4") as emu:
        yield emu


def test_explicit_kubeconfig_over_http(tmp_path: Path) -> None:
    with KubeEmulator(git_version="v1.29.9") as emu:
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        assert server_version(api) == "v1.29.9"
        assert api.configuration.retries == 1  # our callers retry with backoff, urllib3 only once
        api.close()


@pytest.mark.parametrize("code", [403, 503])
def test_an_error_answer_is_none_and_one_line_naming_the_deed(tmp_path: Path, code: int,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="patcher.adapters.kube.client")
    with KubeEmulatorExt(git_version="v1.29.9") as emu:
        emu.fail("GET", "/version/", code)
        api = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc"))))
        assert server_version(api) is None
        assert server_version(api) == "v1.29.9"  # asked again, answered
        api.close()
    [line] = [r.getMessage() for r in caplog.records if r.name == "patcher.adapters.kube.client"
              and r.levelno == logging.INFO]
    assert line.startswith(f"cannot read the API server version: HTTP {code}") and "\n" not in line


def test_kubeconfig_from_the_environment_wins_over_in_cluster(tmp_path: Path) -> None:
    with KubeEmulator() as emu:
        path = emu.write_kubeconfig(tmp_path / "kc")
        env = {"KUBECONFIG": str(path), "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
        cfg = load_configuration(ClientSettings(), env)
        assert cfg.host == emu.url


@needs_tls
def test_tls_kubeconfig_with_token(tls_emu: KubeEmulator, tmp_path: Path) -> None:
    api = build_api_client(ClientSettings(kubeconfig=str(tls_emu.write_kubeconfig(tmp_path / "kc"))))
    assert server_version(api) == "v1.30.4"
    assert tls_emu.requests("GET", "/version/")[-1].headers["authorization"].lower() == "bearer t0ken"
    api.close()


@needs_tls
def test_in_cluster_configuration(tls_emu: KubeEmulator, tmp_path: Path) -> None:
    env, token, ca = tls_emu.incluster_files(tmp_path)
    api = build_api_client(ClientSettings(token_file=str(token), ca_file=str(ca)), env)
    assert api.configuration.host == tls_emu.url
    assert server_version(api) == "v1.30.4"
    api.close()


@needs_tls
def test_tls_verification_cannot_be_switched_off(tls_emu: KubeEmulator, tmp_path: Path) -> None:
    # A kubeconfig that asks to skip verification and names no CA: the server's certificate is unknown.
    kc = tmp_path / "insecure"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": tls_emu.url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    api = build_api_client(ClientSettings(kubeconfig=str(kc)))
    assert api.configuration.verify_ssl is True
    before = len(tls_emu.requests())
    assert server_version(api) is None  # the handshake fails: no request ever reaches the server
    assert len(tls_emu.requests()) == before
    api.close()


@needs_tls
def test_a_foreign_ca_is_refused(tls_emu: KubeEmulator, tmp_path: Path) -> None:
    with KubeEmulator(tls=True) as other:
        kc = other.write_kubeconfig(tmp_path / "kc")  # trusts the other server's CA ...
        cfg = json.loads(kc.read_text())
        cfg["clusters"][0]["cluster"]["server"] = tls_emu.url  # ... but talks to this one
        kc.write_text(json.dumps(cfg))
        api = build_api_client(ClientSettings(kubeconfig=str(kc)))
        assert server_version(api) is None
        api.close()


def test_missing_configuration_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ApiConfigError, match="in-cluster"):
        load_configuration(ClientSettings(token_file=str(tmp_path / "none")), {})
    with pytest.raises(ApiConfigError, match="kubeconfig"):
        load_configuration(ClientSettings(kubeconfig=str(tmp_path / "missing")), {})


@pytest.mark.parametrize(("body", "problem"), [
    ("clusters: " + "[" * 100 + "]" * 100 + "\n", "line 1: nested more than 64 levels deep (the limit)"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}' if i else '*a'] * 9)}]\n"
                                                  for i in range(5)), "YAML nodes (the limit; aliases count as"),
])
def test_a_hostile_kubeconfig_is_refused_by_the_yaml_limits_naming_the_file(tmp_path: Path, body: str,
                                                                               problem: str) -> None:
    # Refused before the official loader (PyYAML, no limits) reads it: composing 10^5 levels crashes a process.
    (tmp_path / "kc").write_text(body)
    with pytest.raises(ApiConfigError) as info:
        load_configuration(ClientSettings(kubeconfig=str(tmp_path / "kc")), {})
    assert str(info.value).startswith(f"cannot load the kubeconfig {tmp_path}/kc: not YAML (")
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_requests_time_out_against_a_hung_server_with_one_retry_at_most(tmp_path: Path) -> None:
    # A server that accepts connections but never answers: every attempt ends in the read timeout, so the
    # number of connections it saw is the number of attempts (the time taken is the bench's business).
    accepted: list[socket.socket] = []
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        stop = threading.Event()

        def accept() -> None:
            hung.settimeout(0.05)
            while not stop.is_set():
                try:
                    accepted.append(hung.accept()[0])
                except TimeoutError:
                    continue

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        kc = tmp_path / "kc"
        kc.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{hung.getsockname()[1]}"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))
        api = build_api_client(ClientSettings(kubeconfig=str(kc), timeout=(0.3, 0.3)))
        try:
            assert server_version(api) is None  # answered, not raised: the caller never blocks on retries
        finally:
            stop.set()
            acceptor.join(5)
            api.close()
            for conn in accepted:
                conn.close()
    assert 1 <= len(accepted) <= 2  # one attempt plus at most one urllib3 retry
