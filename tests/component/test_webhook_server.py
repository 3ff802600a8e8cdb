"""The admission webhook over real HTTPS: a CA made by the openssl CLI (tests/harness/emu/extservers.Pki),
AdmissionReviews posted with the standard library's TLS client, the answer's JSON patch applied to the pod with the
emulator's RFC 6902 implementation. The certificate lives in a directory laid out as kubelet mounts a Secret (files
behind a ``..data`` symlink, swapped to rotate them). Last, the ``gatekeeper`` command serving it against the API
emulator, with the verdict read from the readiness ConfigMap.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.httpserver import CertReloader, Handler, HttpServer
from patcher.commands import gatekeeper
from patcher.core.admission import Selection
from patcher.core.kubeobj import Obj
from patcher.services.gatekeeper import GateMetrics
from patcher.services.webhook import MUTATE_PATH, AdmissionWebhook
from tests.deploy.test_webhook_rules import review
from tests.harness import admission_samples as samples
from tests.harness.admission_samples import NOT_READY, READY, G, configmap
from tests.harness.emu.extservers import Pki
from tests.harness.emu.kubeemu import json_patch, wait_until
from tests.harness.emu.kubeemu_ext import KubeEmulatorExt

NS = "scheduler-patcher"


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    """Two unrelated CAs, each with a server certificate for 127.0.0.1: before and after a rotation."""
    return Pki.make(tmp_path_factory.mktemp("pki-a")), Pki.make(tmp_path_factory.mktemp("pki-b"))


class SecretMount:
    """A folder as kubelet mounts a Secret: ``tls.crt -> ..data/tls.crt``, ``..data -> ..<timestamp>``; a new
    version is written to a new folder and ``..data`` swapped to it with one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir()

    def publish(self, cert: Path, key: Path) -> None:
        self.versions += 1
        version = self.root / f"..2026_11_25_08_00_0{self.versions}.{self.versions}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert.read_bytes())
        (version / "tls.key").write_bytes(key.read_bytes())
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")

    @property
    def cert(self) -> str:
        return str(self.root / "tls.crt")

    @property
    def key(self) -> str:
        return str(self.root / "tls.key")


class Params:
    """What the ConfigMap view would say: ``(known, ConfigMap or None)``."""

    def __init__(self, known: bool = True, params: Obj | None = None) -> None:
        self.value: tuple[bool, Obj | None] = (known, params)

    def __call__(self) -> tuple[bool, Obj | None]:
        return self.value


def post(port: int, ca: Path, body: bytes, path: str = MUTATE_PATH) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def admit(port: int, ca: Path, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST the pod's AdmissionReview; the answer's ``response`` and the pod with its patch applied."""
    status, body = post(port, ca, json.dumps(review(pod)).encode())
    assert status == 200
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["allowed"] is True
    assert response["uid"] == review(pod)["request"]["uid"]
    if "patch" not in response:
        return response, pod
    assert response["patchType"] == "JSONPatch"
    return response, json_patch(pod, json.loads(base64.b64decode(response["patch"])))


@pytest.fixture
def mount(tmp_path: Path, pkis: tuple[Pki, Pki]) -> SecretMount:
    m = SecretMount(tmp_path / "webhook-tls")
    m.publish(pkis[0].path("server.crt"), pkis[0].path("server.key"))
    return m


@pytest.fixture
def params() -> Params:
    return Params(True, configmap(NOT_READY))


@pytest.fixture
def webhook(params: Params) -> AdmissionWebhook:
    return AdmissionWebhook(Selection(), params, GateMetrics().registry)


def tls_server(mount: SecretMount, app: Handler, **limits: Any) -> HttpServer:
    return HttpServer(app, "127.0.0.1:0", certs=CertReloader(mount.cert, mount.key), **limits)


@pytest.fixture
def server(mount: SecretMount, webhook: AdmissionWebhook) -> Iterator[HttpServer]:
    s = tls_server(mount, webhook.handle)
    s.start()
    yield s
    s.stop()


def test_a_review_gets_the_gate_as_a_json_patch(server: HttpServer, pkis: tuple[Pki, Pki]) -> None:
    ca = pkis[0].path("ca.crt")
    _, pod = admit(server.port, ca, samples.new_pod())
    assert samples.gates(pod) == [G]
    _, pod = admit(server.port, ca, samples.new_pod(schedulingGates=[{"name": "a/b"}]))
    assert samples.gates(pod) == ["a/b", G]


@pytest.mark.parametrize("sample", samples.SAMPLES, ids=lambda s: s.id)
def test_the_shared_samples_over_https(server: HttpServer, pkis: tuple[Pki, Pki], params: Params,
                                       webhook: AdmissionWebhook, sample: samples.Sample) -> None:
    webhook.selection = sample.webhook_selection()
    params.value = (True, configmap(sample.verdict))
    _, pod = admit(server.port, pkis[0].path("ca.crt"), sample.pod())
    assert samples.gates(pod) == sample.gates


def test_no_patch_while_the_verdict_is_ready(server: HttpServer, pkis: tuple[Pki, Pki], params: Params) -> None:
    params.value = (True, configmap(READY))
    response, pod = admit(server.port, pkis[0].path("ca.crt"), samples.new_pod())
    assert "patch" not in response and samples.gates(pod) is None


def test_the_verdict_not_read_yet_gates_and_no_configmap_does_not(server: HttpServer, pkis: tuple[Pki, Pki],
                                                                  params: Params) -> None:
    ca = pkis[0].path("ca.crt")
    params.value = (False, None)  # the ConfigMap watch has not listed yet: fail safe, the gatekeeper releases
    assert samples.gates(admit(server.port, ca, samples.new_pod())[1]) == [G]
    params.value = (True, None)  # listed, not there: parameterNotFoundAction: Allow
    assert samples.gates(admit(server.port, ca, samples.new_pod())[1]) is None


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"kind": "AdmissionReview"}', b"[" * 200_000,
                                  json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                              "request": {"uid": "u-1", "operation": "CREATE",
                                                          "kind": {"group": "", "kind": "Pod"},
                                                          "resource": {"resource": "pods"}}}).encode()])
def test_a_malformed_review_is_allowed_unchanged_and_logged(server: HttpServer, pkis: tuple[Pki, Pki],
                                                            webhook: AdmissionWebhook, body: bytes,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="patcher.services.webhook"):
        status, answer = post(server.port, pkis[0].path("ca.crt"), body)
    assert status == 200
    response = json.loads(answer)["response"]
    assert response["allowed"] is True and "patch" not in response
    assert any("cannot read the AdmissionReview" in r.getMessage() for r in caplog.records)


def test_a_pod_whose_metadata_is_not_an_object_is_gated_all_the_same(webhook: AdmissionWebhook) -> None:
    """Every answer allows the pod: a ``metadata`` the API server would refuse later is not a reason for a 500."""
    body = review(samples.new_pod())
    body["request"]["object"]["metadata"] = "x"
    status, answer, _ = webhook.handle("POST", MUTATE_PATH, json.dumps(body).encode())
    response = json.loads(answer)["response"]
    assert status == 200 and response["allowed"] is True and "patch" in response


def test_other_paths_methods_and_oversized_bodies(mount: SecretMount, webhook: AdmissionWebhook,
                                                  pkis: tuple[Pki, Pki]) -> None:
    s = tls_server(mount, webhook.handle, max_body=1000)
    s.start()
    try:
        ca = pkis[0].path("ca.crt")
        assert post(s.port, ca, b"{}", "/other")[0] == 404
        assert post(s.port, ca, b"x" * 1001)[0] == 413
        conn = http.client.HTTPSConnection("127.0.0.1", s.port, context=ssl.create_default_context(cafile=str(ca)),
                                           timeout=10)
        conn.request("GET", MUTATE_PATH)
        assert conn.getresponse().status == 405
        conn.close()
    finally:
        s.stop()


def test_a_rotated_certificate_is_picked_up_on_the_next_connection(server: HttpServer, mount: SecretMount,
                                                                   pkis: tuple[Pki, Pki]) -> None:
    old, new = pkis
    assert samples.gates(admit(server.port, old.path("ca.crt"), samples.new_pod())[1]) == [G]
    mount.publish(new.path("server.crt"), new.path("server.key"))  # kubelet's ..data swap
    assert samples.gates(admit(server.port, new.path("ca.crt"), samples.new_pod())[1]) == [G]
    with pytest.raises(ssl.SSLCertVerificationError):
        admit(server.port, old.path("ca.crt"), samples.new_pod())


def test_a_pair_that_does_not_load_keeps_the_previous_certificate(server: HttpServer, mount: SecretMount,
                                                                  pkis: tuple[Pki, Pki],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    old, new = pkis
    with caplog.at_level(logging.WARNING, logger="patcher.adapters.httpserver"):
        mount.publish(new.path("server.crt"), old.path("server.key"))  # a key that does not match
        for _ in range(2):
            assert samples.gates(admit(server.port, old.path("ca.crt"), samples.new_pod())[1]) == [G]
    warnings = [r for r in caplog.records if "cannot load the new certificate" in r.getMessage()]
    assert len(warnings) == 1  # once per change, not per connection
    mount.publish(new.path("server.crt"), new.path("server.key"))  # the next good pair is taken
    assert samples.gates(admit(server.port, new.path("ca.crt"), samples.new_pod())[1]) == [G]


def test_a_missing_certificate_is_an_error_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        CertReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))


def test_connections_open_at_once_are_bounded(mount: SecretMount, webhook: AdmissionWebhook,
                                             pkis: tuple[Pki, Pki]) -> None:
    """Cap 2, both connections busy (their heads complete, their bodies not sent yet): a third review waits for
    a slot (neither busy one is evicted for it; one in its handshake would be, as a half-sent head is), and is
    answered once one of them is done."""
    s = tls_server(mount, webhook.handle, max_connections=2, timeout=600, keep_alive=True)
    s.start()
    ca = pkis[0].path("ca.crt")
    context = ssl.create_default_context(cafile=str(ca))
    body = json.dumps(review(samples.new_pod())).encode()
    busy = []
    result: list[list[str] | None] = []
    third = threading.Thread(target=lambda: result.append(samples.gates(admit(s.port, ca, samples.new_pod())[1])))
    try:
        for _ in range(2):
            tls = context.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=60),
                                      server_hostname="127.0.0.1")
            tls.sendall(f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n".encode())
            busy.append(tls)
        third.start()
        assert not wait_until(lambda: bool(result), 0.5)  # no slot: it waits
        busy[0].sendall(body)
        assert closed_after(busy[0]).startswith(b"HTTP/1.1 200 OK\r\n")
        third.join(60)
        assert result == [[G]]
    finally:
        for tls in busy:
            tls.close()
        s.stop()


def closed_after(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_client_that_stalls_in_the_handshake_gives_its_slot_up(mount: SecretMount, webhook: AdmissionWebhook,
                                                              pkis: tuple[Pki, Pki]) -> None:
    s = tls_server(mount, webhook.handle, max_connections=1, timeout=600)
    s.start()
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=600) as stalled:  # never starts the handshake
            # Accepted first, it takes the only slot; idle, it gives it up to this request (no timeout fires).
            assert samples.gates(admit(s.port, pkis[0].path("ca.crt"), samples.new_pod())[1]) == [G]
            assert stalled.recv(1) == b""  # closed by the server (a client timeout would raise instead)
    finally:
        s.stop()


def test_a_client_that_trickles_its_request_frees_its_slot_after_the_timeout(
        mount: SecretMount, webhook: AdmissionWebhook, pkis: tuple[Pki, Pki]) -> None:
    """A client that sends a byte of its body now and then, each before the socket's timeout, held the slot
    for as long as it liked (the timeout is per read): a few such clients starve the webhook, and every pod
    creation waits the API server's ``timeoutSeconds``. A request has ``timeout`` seconds in all."""
    s = tls_server(mount, webhook.handle, max_connections=1, timeout=0.5)
    s.start()
    ca = pkis[0].path("ca.crt")
    stop = threading.Event()
    raw = socket.create_connection(("127.0.0.1", s.port))
    slow = ssl.create_default_context(cafile=str(ca)).wrap_socket(raw, server_hostname="127.0.0.1")

    def trickle() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(0.1):  # well within the per-read timeout
                slow.sendall(b" ")

    thread = threading.Thread(target=trickle, daemon=True)
    # Accepted first, it holds the only slot; its head is complete, so it is not idle and cannot be evicted.
    slow.sendall(f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".encode())
    thread.start()
    try:
        assert samples.gates(admit(s.port, ca, samples.new_pod())[1]) == [G]
        slow.settimeout(60)
        assert slow.recv(1) == b""  # cut off by the server (its head was complete: it could not be evicted)
    finally:
        stop.set()
        thread.join(10)
        slow.close()
        s.stop()


# -- the gatekeeper command serving it ---------------------------------------------------------------------------


@pytest.fixture
def emu() -> Iterator[KubeEmulatorExt]:
    with KubeEmulatorExt() as e:
        yield e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command_args(kubeconfig: Path, mount: SecretMount, *extra: str, health_port: int = 0) -> tuple[
        argparse.Namespace, int]:
    parser = argparse.ArgumentParser()
    gatekeeper.add_arguments(parser)
    port = free_port()
    args = parser.parse_args(["--kubeconfig", str(kubeconfig), "--namespace", NS, "--identity", "gk-0",
                              "--listen", f"127.0.0.1:{health_port}", "--leader-elect", "false",
                              "--webhook-listen", f"127.0.0.1:{port}", "--webhook-cert", mount.cert,
                              "--webhook-key", mount.key, *extra])
    return args, port


def test_the_gatekeeper_serves_the_webhook_with_the_verdict_of_the_configmap(
        emu: KubeEmulatorExt, kubeconfig: Path, mount: SecretMount, pkis: tuple[Pki, Pki]) -> None:
    cm = configmap(NOT_READY)
    assert cm is not None
    emu.upsert(cm)
    health_port = free_port()
    args, port = command_args(kubeconfig, mount, "--webhook-scheduler-names", "my-scheduler",
                              health_port=health_port)
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(gatekeeper.run(args, stop)), daemon=True)
    thread.start()
    ca = pkis[0].path("ca.crt")

    def gated(**spec: Any) -> bool:
        try:
            return samples.gates(admit(port, ca, samples.new_pod(**spec))[1]) == [G]
        except OSError:  # not listening yet
            return False

    try:
        assert wait_until(lambda: gated(schedulerName="my-scheduler"), 10)
        assert not gated()  # default-scheduler is not selected by the flag
        cm["data"]["ready"] = "true"
        emu.upsert(cm)
        assert wait_until(lambda: not gated(schedulerName="my-scheduler"), 10)
        emu.delete("configmaps", cm["metadata"]["name"], NS)
        assert wait_until(lambda: not gated(schedulerName="my-scheduler"), 10)  # absent: Allow, no gate
        cm["data"]["ready"] = "false"
        emu.upsert(cm)
        assert wait_until(lambda: gated(schedulerName="my-scheduler"), 10)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=5).read().decode()
        assert 'scheduler_patcher_webhook_reviews_total{result="gated"}' in metrics
        assert 'scheduler_patcher_webhook_reviews_total{result="unchanged"}' in metrics
    finally:
        stop.set()
        thread.join(10)
    assert result == [0]
    watches = {(r.path, r.query.get("fieldSelector")) for r in emu.requests("GET")
               if r.query.get("watch") == "true" and "configmaps" in r.path}
    assert watches == {(f"/api/v1/namespaces/{NS}/configmaps", "metadata.name=scheduler-patcher-status")}


def test_the_webhook_flags_must_come_together(kubeconfig: Path, mount: SecretMount, emu: KubeEmulatorExt) -> None:
    args, _ = command_args(kubeconfig, mount)
    args.webhook_key = ""
    assert gatekeeper.run(args, threading.Event()) == 64  # flags that cannot work together: a usage error
    args, _ = command_args(kubeconfig, mount)
    args.webhook_cert = str(Path(mount.cert).with_name("missing.crt"))
    assert gatekeeper.run(args, threading.Event()) == 1


def test_an_idle_keep_alive_connection_gives_its_slot_to_a_waiting_one(mount: SecretMount, webhook: AdmissionWebhook,
                                                                      pkis: tuple[Pki, Pki]) -> None:
    """The API server keeps connections open between reviews: one that idles must not hold a review waiting
    until its timeout (600 s here, longer than the client below waits); nor one that sent nothing after its
    TLS handshake."""
    s = tls_server(mount, webhook.handle, max_connections=1, timeout=600, keep_alive=True)
    s.start()
    ca = pkis[0].path("ca.crt")
    context = ssl.create_default_context(cafile=str(ca))
    idle = http.client.HTTPSConnection("127.0.0.1", s.port, context=context, timeout=10)
    try:
        for _ in range(2):  # two reviews on one connection
            idle.request("POST", MUTATE_PATH, body=json.dumps(review(samples.new_pod())).encode())
            answer = idle.getresponse()
            answer.read()
            assert answer.status == 200 and answer.getheader("Connection") != "close"
        # The slot is held by the idle connection; this one is served once it is given up.
        assert samples.gates(admit(s.port, ca, samples.new_pod())[1]) == [G]
        assert idle.sock is not None and idle.sock.recv(1) == b""  # closed by the server
        with context.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=60),
                                 server_hostname="127.0.0.1") as quiet:  # handshake, then nothing
            assert samples.gates(admit(s.port, ca, samples.new_pod())[1]) == [G]
            assert quiet.recv(1) == b""
    finally:
        idle.close()
        s.stop()
