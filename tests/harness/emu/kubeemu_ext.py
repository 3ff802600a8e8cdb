"""Additions to the API emulator for the readiness and gatekeeper tests, kept out of ``kubeemu.py``.

* ``before(method, path, hook)``: run ``hook(emulator)`` once, just before the next matching request is
  served — a concurrent writer that changes an object between our read and our write, so the conflict the
  code must handle (a failed JSON-patch ``test``, a stale resourceVersion) is real, not simulated;
* ``fail(method, path, code)``: answer the next matching request(s) with ``code`` (e.g. a 409 on a JSON
  patch, which the emulator never produces by itself); ``path=None`` matches any path, and ``retry_after``
  adds a ``Retry-After`` header: ``fail("PATCH", None, 429, retry_after=1)`` is API Priority and Fairness
  rejecting a request its queues cannot hold;
* ``make_pod``: a pod as the API server stores it after creation (``status.phase: Pending``, which the server's
  defaulting sets and the gatekeeper's field selector relies on), optionally with scheduling gates;
* ``make_cp_node``/``node_annotations_for``: a control-plane Node with the agent's annotations.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.harness.emu.kubeemu import ApiError, KubeEmulator, Obj

P = "scheduler-patcher.io/"
CONFIG_HASH = "0123456789abcdef" * 4
OTHER_HASH = "fedcba9876543210" * 4
SOURCE_HASH = "5005ce" * 10 + "ab12"
OTHER_SOURCE = "0dd5ce" * 10 + "cd34"
MTIME = "2026-11-21T23:40:01.500000000Z"
STARTED = "2026-11-21T23:40:01Z"  # the same second as the write: counts as after it
BEFORE = "2026-11-21T23:39:59Z"


@dataclass
class _Rule:
    method: str
    path: str | None
    remaining: int
    hook: Callable[[KubeEmulator], object] | None = None
    code: int | None = None
    retry_after: str | None = None


class KubeEmulatorExt(KubeEmulator):
    """``KubeEmulator`` with one-shot hooks and injected failures per (method, exact path)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rules: list[_Rule] = []
        self._rules_lock = threading.Lock()

    def before(self, method: str, path: str, hook: Callable[[KubeEmulator], object], times: int = 1) -> None:
        """Run ``hook`` before serving the next ``times`` requests ``method path``."""
        with self._rules_lock:
            self._rules.append(_Rule(method, path, times, hook=hook))

    def fail(self, method: str, path: str | None, code: int, times: int = 1,
             retry_after: float | str | None = None) -> None:
        """Answer the next ``times`` requests ``method path`` (any path for ``None``) with ``code``, with a
        ``Retry-After`` header when ``retry_after`` is given."""
        with self._rules_lock:
            self._rules.append(_Rule(method, path, times, code=code,
                                     retry_after=None if retry_after is None else str(retry_after)))

    def __enter__(self) -> KubeEmulatorExt:
        self.start()
        return self

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        """Also switch Nagle off on each accepted connection.

        The base handler writes a response's headers and body in two sends; with Nagle on, the body waits for
        the client's delayed ACK of the headers, so every request on a kept-alive connection but the first
        takes ~40 ms. (The fix belongs in ``kubeemu._Handler``: ``disable_nagle_algorithm = True``.)
        """
        if add:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super()._track(conn, add=add)

    def pending_rules(self) -> int:
        with self._rules_lock:
            return sum(r.remaining for r in self._rules)

    def _serve(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
               body: bytes) -> tuple[int, Any] | Iterator[Obj | object]:
        rule = None
        with self._rules_lock:
            for r in self._rules:
                if (r.remaining > 0 and r.method == method and r.path in (None, path)
                        and query.get("watch") != "true"):
                    r.remaining -= 1
                    rule = r
                    break
        if rule is not None and rule.hook is not None:
            rule.hook(self)
        if rule is not None and rule.code is not None:
            extra = {"Retry-After": rule.retry_after} if rule.retry_after is not None else None
            raise ApiError(rule.code, f"injected failure {rule.code} for {method} {path}", headers=extra)
        return super()._serve(method, path, query, headers, body)


def make_pod(name: str, namespace: str = "default", *, gates: list[str] | None = None,
             created: str | None = None, phase: str = "Pending") -> Obj:
    """A pod as stored after creation; ``gates`` become ``spec.schedulingGates`` in that order."""
    spec: Obj = {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    meta: Obj = {"name": name, "namespace": namespace}
    if created is not None:
        meta["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def node_annotations_for(state: str = "Ready", config_hash: str | None = CONFIG_HASH, mtime: str | None = MTIME,
                         restarted_at: str | None = "2026-11-21T23:40:03.000000000Z",
                         message: str | None = None, source_hash: str | None = SOURCE_HASH) -> dict[str, str]:
    """The annotations an agent publishes (``None`` values left out, as the merge patch removes them)."""
    values = {"state": state, "config-hash": config_hash, "source-hash": source_hash, "manifest-mtime": mtime,
              "restarted-at": restarted_at, "message": message}
    return {P + k: v for k, v in values.items() if v is not None}


def marker(config_hash: str = CONFIG_HASH) -> dict[str, str]:
    """The marker annotation the kubelet copies from the patched manifest onto the mirror pod."""
    value = {"v": 1, "hash": config_hash[:12], "flag": "--config=/etc/kubernetes/scheduler-patcher/config.yaml",
             "volume": "scheduler-patcher-config", "mount": "/etc/kubernetes/scheduler-patcher",
             "container": "kube-scheduler"}
    return {P + "patch": json.dumps(value, separators=(",", ":"))}
