"""What it takes to prove an extender answers, the way kube-scheduler would call it. Pure.

kube-scheduler never checks its extenders at start-up: a wrong URL or a certificate it rejects shows only when
pods fail to schedule (or are placed without the extender, ``ignorable: true``). So the agent probes first:
this module reads the targets out of the rendered config, builds the harmless request (a filter, else a
prioritize, call with no node; never bind or preempt) and judges the answer; the network part is
``patcher.adapters.extprobe``.

The transport follows kube-scheduler's ``makeTransport``: with ``enableHTTPS`` and no CA the server
certificate is not verified; a CA together with ``insecure`` is refused (client-go's ``TLSConfigFor``). An
unset or zero ``httpTimeout`` is 5 s, the scheduler's ``DefaultExtenderTimeout``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from patcher.core import yamltext
from patcher.core.schedconfig.duration import parse_duration_ns

#: kube-scheduler's ``DefaultExtenderTimeout``.
DEFAULT_TIMEOUT: Final = 5.0
#: The pod of the probe: no volumes, no resources, nothing an extender could act on.
PROBE_POD: Final = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "scheduler-patcher-probe", "namespace": "kube-system", "uid": "scheduler-patcher-probe"},
    "spec": {"containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.9"}]},
}


@dataclass(frozen=True)
class Tls:
    """An extender's ``tlsConfig`` after kube-scheduler's rules; ``*_data`` are decoded PEM bytes, ``*_file``
    node paths (the caller reads them below the host root)."""

    insecure: bool = False
    server_name: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    ca_data: bytes = b""
    cert_data: bytes = b""
    key_data: bytes = b""

    @property
    def has_ca(self) -> bool:
        return bool(self.ca_file or self.ca_data)


@dataclass(frozen=True)
class Target:
    """One extender to probe: where, how, and what to send."""

    url_prefix: str
    verb: str  # the filter (else prioritize) verb
    ignorable: bool
    timeout: float  # seconds: the extender's own httpTimeout
    tls: Tls
    body: bytes
    problem: str = ""  # the config itself rules a call out (e.g. a CA with insecure): reported as the error

    @property
    def url(self) -> str:
        return f"{self.url_prefix.rstrip('/')}/{self.verb.lstrip('/')}" if self.verb else self.url_prefix


@dataclass(frozen=True)
class Result:
    """One probe's outcome. ``error`` is empty when the extender answered; ``skipped`` when there was nothing
    harmless to call (an extender with only bind or preempt verbs)."""

    url: str
    ignorable: bool
    seconds: float
    error: str = ""
    skipped: bool = False

    @property
    def answered(self) -> bool:
        return not self.error

    def line(self) -> str:
        """``<url>: answered in 12 ms`` or ``<url>: <error> (after 5.0 s)``: what ``plan --check-extenders``
        prints and what the message annotation names."""
        took = f"{self.seconds * 1000:.0f} ms" if self.seconds < 1 else f"{self.seconds:.1f} s"
        if self.skipped:
            return f"{self.url}: not probed ({self.error})" if self.error else f"{self.url}: not probed"
        if self.answered:
            return f"{self.url}: answered in {took}"
        return f"{self.url}: {self.error} (after {took})"


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """A field by its v1 name, matched ignoring case: the Policy file and v1alpha2 spell them differently
    (``enableHttps``, ``urlprefix`` is accepted by the legacy decoder too)."""
    lowered = name.lower()
    for key, value in obj.items():
        if str(key).lower() == lowered:
            return value
    return None


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, int):  # the legacy spelling: integer nanoseconds
        ns = value
    else:
        try:
            ns = parse_duration_ns(str(value))
        except ValueError:
            return DEFAULT_TIMEOUT
    return ns / 1e9 if ns > 0 else DEFAULT_TIMEOUT


def _pem(value: Any) -> bytes:
    """``[]byte`` fields are base64 in YAML/JSON; a PEM pasted as is is accepted too."""
    if not isinstance(value, str) or not value:
        return b""
    if value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    try:
        return base64.b64decode(value, validate=False)
    except (binascii.Error, ValueError):
        return value.encode()


def _tls(extender: Mapping[str, Any]) -> tuple[Tls, str]:
    raw = _field(extender, "tlsConfig")
    cfg: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def text(name: str) -> str:
        v = _field(cfg, name)
        return v if isinstance(v, str) else ""

    tls = Tls(insecure=_field(cfg, "insecure") is True, server_name=text("serverName"), ca_file=text("caFile"),
              cert_file=text("certFile"), key_file=text("keyFile"), ca_data=_pem(_field(cfg, "caData")),
              cert_data=_pem(_field(cfg, "certData")), key_data=_pem(_field(cfg, "keyData")))
    problem = ""
    if tls.insecure and tls.has_ca:
        problem = "tlsConfig sets both a CA and insecure: kube-scheduler refuses that combination"
    elif bool(tls.cert_file or tls.cert_data) != bool(tls.key_file or tls.key_data):
        problem = "tlsConfig has a client certificate without its key (or a key without its certificate)"
    if _field(extender, "enableHTTPS") is True and not tls.has_ca:
        tls = replace(tls, insecure=True)  # kube-scheduler: HTTPS without a CA is not verified
    return tls, problem


def request_body(node_cache_capable: bool) -> bytes:
    """``ExtenderArgs`` with no node: the names form for a node-cache-capable extender, else a NodeList. Spelt as
    kube-scheduler sends it (the Go type has no json tags: ``Pod``, ``Nodes``, ``NodeNames``)."""
    args: dict[str, Any] = {"Pod": PROBE_POD}
    if node_cache_capable:
        args["NodeNames"] = []
    else:
        args["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": []}
    return json.dumps(args, separators=(",", ":")).encode()


def target_of(extender: Mapping[str, Any]) -> Target | None:
    """The probe of one extender entry (any spelling); ``None`` without a ``urlPrefix``."""
    prefix = _field(extender, "urlPrefix")
    if not isinstance(prefix, str) or not prefix:
        return None
    verb = next((v for v in (_field(extender, "filterVerb"), _field(extender, "prioritizeVerb"))
                 if isinstance(v, str) and v), "")
    tls, problem = _tls(extender)
    return Target(url_prefix=prefix, verb=verb, ignorable=_field(extender, "ignorable") is True,
                  timeout=_timeout(_field(extender, "httpTimeout")), tls=tls,
                  body=request_body(_field(extender, "nodeCacheCapable") is True), problem=problem)


def _documents(name: str, data: bytes) -> Iterable[Any]:
    if not name.endswith((".yaml", ".yml", ".json")):
        return []
    try:
        return yamltext.load_plain_all(data.decode("utf-8", "replace"))
    except yamltext.YamlTextError:
        return []  # not ours to judge here: the render validated what it wrote


def targets(files: Mapping[str, bytes]) -> list[Target]:
    """Every extender of the rendered config files (a KubeSchedulerConfiguration, or the Policy file of an old
    scheduler), in file and list order, each URL once."""
    out: dict[str, Target] = {}
    for name in sorted(files):
        for doc in _documents(name, files[name]):
            items = _field(doc, "extenders") if isinstance(doc, Mapping) else None
            for item in items if isinstance(items, list) else []:
                target = target_of(item) if isinstance(item, Mapping) else None
                if target is not None:
                    out.setdefault(target.url, target)
    return list(out.values())


def judge(status: int, body: bytes) -> str:
    """The error of an HTTP answer, or ``""`` when it is an answer: any 2xx with a JSON body."""
    if not 200 <= status < 300:
        return f"HTTP {status}"
    try:
        json.loads(body)
    except ValueError:
        shown = body[:60].decode("utf-8", "replace").replace("\n", " ")
        return f"HTTP {status} but the body is not JSON ({shown!r})"
    return ""


def blocking(results: Iterable[Result]) -> list[Result]:
    """The failures that must stop a write: extenders that are not ignorable and did not answer."""
    return [r for r in results if not r.answered and not r.ignorable and not r.skipped]


def summary(results: Iterable[Result]) -> str:
    """One line naming every extender that did not answer (the ``message`` annotation, the Event)."""
    failed = [r for r in results if not r.answered and not r.skipped]
    return "; ".join(f"extender {r.url} does not answer: {r.error}" for r in failed)


def as_data(results: Iterable[Result]) -> list[dict[str, object]]:
    """The ``-o json``/``yaml`` form: one object per extender."""
    return [{"url": r.url, "answered": r.answered, "ignorable": r.ignorable, "skipped": r.skipped,
             "error": r.error or None, "seconds": round(r.seconds, 3)} for r in results]
