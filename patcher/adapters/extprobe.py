"""Call each extender once, as kube-scheduler would, from this host's network: resolve, connect, TLS, POST.

The pure half (which extenders, what to send, what counts as an answer, kube-scheduler's TLS rules) is
``patcher.core.extprobe``. Each probe runs in a thread of its own, abandoned at the extender's ``httpTimeout``:
like Go's ``http.Client.Timeout`` the deadline covers the name lookup, which no socket timeout does. The
probes run side by side, so a check takes as long as the slowest one. ``check`` probes one rendered config's
extenders on this node, for ``plan``/``apply --check-extenders`` and the agent's pre-flight (``start_probe``)
alike; TLS files named in the config are node paths, read below the host root.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from patcher.adapters.fsio import HostFS
from patcher.core import lifecycle
from patcher.core.extprobe import Result, Target, Tls, blocking, judge, summary, targets
from patcher.core.schedconfig import RenderedConfig
from patcher.core.settings import Files

log = logging.getLogger("patcher.services.agent")

#: Bytes read of an answer: enough for any filter result; a huge body proves nothing more.
MAX_BODY = 1 << 20


class _Https(http.client.HTTPSConnection):
    """HTTPS with a server name other than the host (``tlsConfig.serverName``), as Go's ``ServerName``."""

    def __init__(self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext,
                 server_name: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
        self.sock = context.wrap_socket(self.sock, server_hostname=self._server_name or self.host)


def _context(tls: Tls, local: Callable[[str], str], scratch: str) -> ssl.SSLContext:
    # The system roots only when they are used: loading them is most of a context's cost.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif not tls.has_ca:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        # Only the given CA, like client-go: a CA in tlsConfig replaces the system roots.
        if tls.ca_file:
            ctx.load_verify_locations(cafile=local(tls.ca_file))
        if tls.ca_data:
            ctx.load_verify_locations(cadata=tls.ca_data.decode("ascii", "replace"))
    if tls.cert_file or tls.cert_data:
        cert = local(tls.cert_file) if tls.cert_file else _scratch_file(scratch, "cert.pem", tls.cert_data)
        key = local(tls.key_file) if tls.key_file else _scratch_file(scratch, "key.pem", tls.key_data)
        ctx.load_cert_chain(cert, key)
    return ctx


def _scratch_file(folder: str, name: str, data: bytes) -> str:
    """``load_cert_chain`` takes paths only: inline PEM goes to a private file that lives for one probe."""
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _error(exc: BaseException, host: str, timeout: float) -> str:
    """One line a person can act on."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {host}: {exc.strerror or exc}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {exc.verify_message or exc.reason or exc}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return f"{type(exc).__name__}: {exc}"


def probe(target: Target, *, local: Callable[[str], str] = lambda p: p) -> Result:
    """One request to ``target``, bounded by its timeout on the socket; ``probe_all`` adds the hard deadline."""
    start = time.monotonic()

    def done(error: str = "") -> Result:
        return Result(url=target.url, ignorable=target.ignorable, seconds=time.monotonic() - start, error=error)

    if target.problem:
        return done(target.problem)
    if not target.verb:
        return Result(url=target.url, ignorable=target.ignorable, seconds=0.0, skipped=True,
                      error="no filter or prioritize verb; bind and preempt are never called")
    parts = urlsplit(target.url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        return done(f"not an http(s) URL: {target.url_prefix!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    inline_pem = bool(target.tls.cert_data or target.tls.key_data)
    try:
        # A private folder only for inline client certificates (load_cert_chain takes paths only)
        with tempfile.TemporaryDirectory(prefix="extprobe-") if inline_pem else contextlib.nullcontext("") \
                as scratch:
            conn: http.client.HTTPConnection
            if parts.scheme == "https":
                conn = _Https(host, parts.port, timeout=target.timeout,
                              context=_context(target.tls, local, scratch), server_name=target.tls.server_name)
            else:
                conn = http.client.HTTPConnection(host, parts.port, timeout=target.timeout)
            try:
                conn.request("POST", path, body=target.body,
                             headers={"Content-Type": "application/json", "Accept": "application/json",
                                      "User-Agent": "scheduler-patcher-extender-probe"})
                response = conn.getresponse()
                body = response.read(MAX_BODY)
            finally:
                conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return done(_error(exc, host, target.timeout))
    return done(judge(response.status, body))


def probe_all(targets: Sequence[Target], *, local: Callable[[str], str] = lambda p: p,
              cancel: threading.Event | None = None) -> list[Result]:
    """Probe every target at once; a probe still running at its own timeout (plus a little for the thread to
    report) or when ``cancel`` is set counts as no answer and is abandoned (a daemon thread: it ends with its
    socket timeout, or the name lookup)."""
    start = time.monotonic()
    results: list[Result | None] = [None] * len(targets)
    threads = []
    for i, target in enumerate(targets):
        def run(i: int = i, target: Target = target) -> None:
            results[i] = probe(target, local=local)

        t = threading.Thread(target=run, name=f"extprobe-{i}", daemon=True)
        t.start()
        threads.append(t)
    for i, (target, t) in enumerate(zip(targets, threads, strict=True)):
        end = start + target.timeout + 0.25
        while t.is_alive() and not (cancel is not None and cancel.is_set()):
            left = end - time.monotonic()
            if left <= 0:
                break
            t.join(min(left, 0.05) if cancel is not None else left)
        if results[i] is None:
            why = "cancelled" if cancel is not None and cancel.is_set() else f"no answer within {target.timeout:g}s"
            results[i] = Result(url=target.url, ignorable=target.ignorable, seconds=time.monotonic() - start, error=why)
    return [r for r in results if r is not None]


def check(files: Files, config: RenderedConfig, *, cancel: threading.Event | None = None) -> list[Result]:
    """Probe every extender of ``config`` at once; one result each, in config order."""
    fs = HostFS(files.host_root)
    return probe_all(targets(config.files), local=lambda p: str(fs.local(p)), cancel=cancel)


def start_probe(files: Files, config: RenderedConfig, *, cancel: threading.Event,
                done: Callable[[lifecycle.Probed], None], log_extra: dict[str, str],
                observe: Callable[[list[Result]], None]) -> None:
    """The agent's probe, in a thread of its own: the loop keeps beating and a SIGTERM is handled at once (the
    probe is cancelled, not awaited). ``done`` gets the answer as the ``lifecycle.Probed`` to feed; ``observe``
    (the metrics) gets every extender's result first, so the gauges an alert reads are current when the state
    changes."""

    def run() -> None:
        try:
            results = check(files, config, cancel=cancel)
        except Exception as exc:  # a bug in the probe must not pass for an answer
            log.debug("extender probe failed", exc_info=True)
            answer = lifecycle.Probed(config.config_hash,
                                      blocking=f"extender probe failed: {type(exc).__name__}: {exc}")
        else:
            for result in results:
                log.info("extender %s", result.line(), extra=log_extra)
            observe(results)
            answer = lifecycle.Probed(config.config_hash, blocking=summary(blocking(results)),
                                      ignored=summary(r for r in results if r.ignorable))
        done(answer)

    threading.Thread(target=run, name="extender-probe", daemon=True).start()
