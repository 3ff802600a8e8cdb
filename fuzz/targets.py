"""The fuzz targets (issue 32): every parser that takes input from outside the agent, and what must hold for it.

Each target is ``name(data: bytes) -> None``: it returns for an input handled as the project means to (a result,
or a refusal as one of its own errors), and raises anything else, an ``AssertionError`` for a broken property
included. The targets import neither atheris nor anything the test extra lacks: ``fuzz/run.py`` drives them
with atheris (``make fuzz``, the short pass in ``.ci/run``) and ``tests/unit/test_fuzz_found.py`` replays their
seeds and every input that once failed, as ordinary tests.

Inputs are split by their first byte where a target has choices (which source file, which Kubernetes minor,
which gate), so that one byte string is one case the replay reproduces exactly.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patcher.adapters.health import Health, HealthServer, Metrics
from patcher.adapters.httpserver import HttpServer
from patcher.core import admission, manifestedit
from patcher.core.errors import PatcherError
from patcher.core.schedconfig import ConfigRequest, ForeignConfig, build_config
from patcher.core.schedconfig.source import CONFIG_FILE, EXTENDERS_FILE, MAX_SOURCE_BYTES
from patcher.core.status import NodeState
from patcher.services.webhook import MUTATE_PATH, AdmissionWebhook

logging.disable(logging.CRITICAL)  # the webhook logs every review it cannot read: millions of lines otherwise

Target = Callable[[bytes], None]
TARGETS: dict[str, Target] = {}


def target(fn: Target) -> Target:
    TARGETS[fn.__name__] = fn
    return fn


def _text(data: bytes) -> str | None:
    """The input as the one reader's callers see it: UTF-8 (else refused before any parser runs)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- the manifest splice ---------------------------------------------------------------------------------------

SPEC = manifestedit.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher",
                              config_file="config-0123456789ab.yaml",
                              config_hash="0123456789abcdef" * 4)
WHERE = "/etc/kubernetes/manifests/kube-scheduler.yaml"


@target
def manifest_splice(data: bytes) -> None:
    """Patch, then restore: the original bytes again, or a refusal (``PatcherError``) at either step. A patch
    of what was patched changes nothing (idempotent); ``merge``/``replace`` modes are chosen by the first byte."""
    if len(data) > manifestedit.MAX_MANIFEST_BYTES or not data:
        return
    mode = ("fail", "replace", "merge")[data[0] % 3]
    text = _text(data[1:])
    if text is None:
        return
    spec = SPEC if mode == "fail" else manifestedit.PatchSpec(SPEC.host_config_dir, SPEC.config_file, SPEC.config_hash,
                                                              on_foreign=mode)  # type: ignore[arg-type]
    try:
        patched = manifestedit.patch(text, spec, WHERE)
    except PatcherError:
        return
    try:
        restored = manifestedit.restore(patched.text, WHERE, prefix=spec.prefix)
    except PatcherError as exc:
        raise AssertionError(f"a manifest we patched cannot be restored: {exc}") from None
    if manifestedit.inspect(manifestedit.parse_manifest(text, WHERE), WHERE, prefix=spec.prefix).marker is None:
        assert restored == text, "patch then restore did not give the original bytes back"
    again = manifestedit.patch(patched.text, spec, WHERE)
    assert not again.changed and again.text == patched.text, "a second patch changed the patched manifest"


# -- the source folder and the scheduler configs it renders ----------------------------------------------------

_MINORS = ("1.19.0", "1.22.3", "1.25.0", "1.29.4", "1.33.1")


@functools.cache
def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="fuzz-source-"))


@target
def source_config(data: bytes) -> None:
    """The source folder's forms and the configs they carry, rendered for a kube-scheduler minor; the first
    byte picks the file (``extenders.yaml``, ``config.yaml``, or a foreign ``--config`` to merge into) and the
    minor. A render or a refusal (``PatcherError``); a render is stable (same input, same bytes)."""
    if not data or len(data) > MAX_SOURCE_BYTES:
        return
    choice, text = data[0], _text(data[1:])
    if text is None:
        return
    folder = _folder()
    for old in folder.iterdir():
        old.unlink()
    version = _MINORS[(choice >> 2) % len(_MINORS)]
    foreign = None
    if choice % 4 == 2:  # the input is a foreign config the extenders are merged into
        (folder / EXTENDERS_FILE).write_text("extenders:\n- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n")
        foreign = ForeignConfig("/etc/kubernetes/scheduler.conf", "/etc/kubernetes/scheduler.conf", text)
    else:
        (folder / (EXTENDERS_FILE if choice % 4 in (0, 3) else CONFIG_FILE)).write_text(text, "utf-8")
    req = ConfigRequest(source_dir=folder, host_config_dir="/etc/kubernetes/scheduler-patcher", kube_version=version,
                        foreign=foreign)
    try:
        first = build_config(req)
    except PatcherError:
        return
    assert build_config(req).files == first.files, "two renders of one source differ"


# -- the health server's request parsing -----------------------------------------------------------------------

class _Writer:
    """What ``HttpServer._handle`` writes with, kept in memory."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out.write(data)

    def write_eof(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@functools.cache
def _health() -> HealthServer:
    metrics = Metrics()
    health = Health()
    health.beat()
    health.set_state(NodeState.READY)
    return HealthServer(health, metrics, "127.0.0.1:0", timeout=5.0)


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.new_event_loop()


def _one_request(server: HttpServer, data: bytes) -> tuple[bytes, bool]:
    """What ``server`` writes for a connection that sends ``data`` then ends, and whether it closed it."""
    from patcher.adapters.streams import HeadReader

    async def one() -> _Writer:
        reader = HeadReader(8192, lambda: None, lambda: None)
        reader.feed_data(data)
        reader.feed_eof()
        writer = _Writer()
        await server._handle(reader, writer)  # type: ignore[arg-type]
        return writer

    writer = _loop().run_until_complete(one())
    return writer.out.getvalue(), writer.closed


@target
def health_request(data: bytes) -> None:
    """Any bytes a client sends, then its end: one HTTP answer (or none for a head that never ended), and the
    connection closed; never an exception out of the handler."""
    out, closed = _one_request(_health(), data)
    assert closed, "the connection was left open"
    assert not out or (out.startswith(b"HTTP/1.1 ") and b"\r\n\r\n" in out), f"not an HTTP answer: {out[:80]!r}"
    if b"\r\n\r\n" in data and len(data.split(b"\r\n\r\n")[0]) < 8000:
        assert out, "a complete head got no answer"


# -- the admission webhook: its HTTP parsing and the AdmissionReview decoder --------------------------------------

def _params() -> tuple[bool, dict[str, Any] | None]:
    return True, {"data": {"ready": "false"}}


@functools.cache
def _webhook() -> AdmissionWebhook:
    return AdmissionWebhook(admission.Selection(storage_classes=("fast",), csi_drivers=("csi.example.com",)), _params)


@target
def admission_review(data: bytes) -> None:
    """Any body POSTed to the webhook: a 200 with an AdmissionReview that allows the pod (a webhook fault must
    never block a pod), carrying the request's uid when it had a string one; the patch, if any, is JSON."""
    status, body, ctype = _webhook().handle("POST", MUTATE_PATH, data)
    assert status == 200 and ctype == "application/json"
    answer = json.loads(body)
    response = answer["response"]
    assert response["allowed"] is True, "a review was not allowed"
    if "patch" in response:
        import base64

        assert isinstance(json.loads(base64.b64decode(response["patch"])), list)


@functools.cache
def _webhook_server() -> HttpServer:
    return HttpServer(_webhook().handle, "127.0.0.1:0", timeout=5.0, max_body=1 << 16)


@target
def webhook_request(data: bytes) -> None:
    """Any bytes on a webhook connection (after TLS): one HTTP answer or none, the connection closed, and
    nothing raised out of the handler."""
    out, closed = _one_request(_webhook_server(), data)
    assert closed, "the connection was left open"
    assert not out or out.startswith(b"HTTP/1.1 "), f"not an HTTP answer: {out[:80]!r}"

