"""The scheduler's semantic rules, applied after the strict type check passed.

Each rule mirrors a check kube-scheduler makes at start-up (its config validation, or an error it would hit while
building an extender's client), plus two that catch what would make it exit later: a relative or placeholder
kubeconfig path and an extender URL that is not one. A schema names the rules that apply to it (``rules``).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from patcher.core.schedconfig.duration import parse_duration_ns
from patcher.core.schedconfig.gourl import url_problem
from patcher.core.schedconfig.schema import Schema, TypeSpec
from patcher.core.schedconfig.upstream import upstream_problems

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_int(value: Any) -> TypeGuard[int]:
    """An integer as the decoder sees it (YAML's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_qualified_name(name: str) -> bool:
    """Kubernetes ``IsQualifiedName``: an optional DNS subdomain prefix, ``/``, and a 63-character name."""
    prefix, _, local = name.rpartition("/")
    if "/" in name and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(local) <= 63 and bool(_QUALIFIED_NAME.fullmatch(local))


def is_extended_resource_name(name: str) -> bool:
    """Upstream ``validateExtendedResourceName``: ``IsQualifiedName``, then v1helper ``IsExtendedResourceName`` (a
    domain prefix that is not a native ``kubernetes.io/`` one, not ``requests.``-prefixed, and still a
    qualified name as the quota resource ``requests.<name>``)."""
    if not is_qualified_name(name) or "/" not in name:
        return False
    if "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return is_qualified_name("requests." + name)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def extender_problems(extenders: list[Any], spec: TypeSpec) -> list[str]:
    """The scheduler's extender validation, plus a URL check: problems as ``extenders[i].field: rule`` lines."""
    problems: list[str] = []
    binders: list[int] = []
    owners: dict[str, int] = {}

    def field(extender: Mapping[str, Any], canonical: str) -> Any:
        for key, item in extender.items():
            name = spec.lookup(str(key))
            if name is not None and spec.to_canonical(name) == canonical:
                return item
        return None

    for index, extender in enumerate(extenders):
        if not isinstance(extender, dict):
            continue
        path = f"extenders[{index}]"
        url = _text(field(extender, "urlPrefix"))
        problem = url_problem(url) if url else None
        if problem:
            problems.append(f"{path}.urlPrefix: {problem}, got {url!r}")
        weight = field(extender, "weight")
        if _text(field(extender, "prioritizeVerb")) and not (is_int(weight) and weight > 0):
            problems.append(f"{path}.weight: must be > 0 when prioritizeVerb is set (got {weight})")
        if _text(field(extender, "bindVerb")):
            binders.append(index)
        tls = field(extender, "tlsConfig")
        if isinstance(tls, dict):
            problems += _tls_problems(tls, f"{path}.tlsConfig")
        resources = field(extender, "managedResources")
        for r_index, resource in enumerate(resources if isinstance(resources, list) else []):
            name = _text(resource.get("name")) if isinstance(resource, dict) else ""
            r_path = f"{path}.managedResources[{r_index}].name"
            if not name:
                continue
            if not is_extended_resource_name(name):
                problems.append(
                    f"{r_path}: {name!r} must be a qualified extended resource name such as example.com/gpu "
                    "(not in kubernetes.io/, not starting with requests.)"
                )
            if name in owners:
                problems.append(
                    f"{r_path}: duplicate extender managed resource {name!r} (also managed by "
                    f"extenders[{owners[name]}])"
                )
            else:
                owners[name] = index
    if len(binders) > 1:
        which = ", ".join(f"extenders[{i}]" for i in binders)
        problems.append(f"extenders: at most one extender may set bindVerb, found {len(binders)} ({which})")
    return problems


def _tls_problems(tls: Mapping[str, Any], path: str) -> list[str]:
    """A client certificate needs its key and vice versa, else the extender's transport cannot be built."""
    lowered = {str(key).casefold(): value for key, value in tls.items()}
    has_cert = bool(lowered.get("certfile") or lowered.get("certdata"))
    has_key = bool(lowered.get("keyfile") or lowered.get("keydata"))
    if has_cert != has_key:
        missing = "keyFile/keyData" if has_cert else "certFile/certData"
        return [f"{path}: a client certificate needs both cert and key; {missing} is missing"]
    problems = []
    for key, field in (("certdata", "certData"), ("keydata", "keyData"), ("cadata", "caData")):
        value = lowered.get(key)
        if isinstance(value, str) and value and not _PEM_BLOCK.search(_base64(value)):
            problems.append(f"{path}.{field}: no PEM data in it (the scheduler exits building the extender's "
                            "client: 'tls: failed to find any PEM data'; rule extender.tlsPEM)")
    return problems


#: encoding/pem's Decode needs a whole block: a BEGIN line and its END line (the scheduler's TLS setup finds no
#: PEM data otherwise; a BEGIN header alone exits kube-scheduler 1.34-1.37 the same way)
_PEM_BLOCK = re.compile(rb"-----BEGIN ([^\n-]+)-----\r?\n.*?-----END \1-----", re.DOTALL)


def _base64(value: str) -> bytes:
    """A []byte field as Go's JSON decoder reads it: standard base64 (invalid input is refused elsewhere)."""
    try:
        return base64.b64decode(value, validate=False)
    except (ValueError, binascii.Error):
        return b""


def _profile_problems(data: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    profiles = data.get("profiles")
    seen: dict[str, int] = {}
    for index, profile in enumerate(profiles if isinstance(profiles, list) else []):
        if not isinstance(profile, dict):
            continue
        name = profile.get("schedulerName", "default-scheduler")
        if name == "":
            problems.append(f"profiles[{index}].schedulerName: must not be empty")
            continue
        name = name if isinstance(name, str) else "default-scheduler"
        if name in seen:
            problems.append(
                f"profiles[{index}].schedulerName: {name!r} is already used by profiles[{seen[name]}]; "
                "schedulerName must be unique"
            )
        else:
            seen[name] = index
    return problems


def _kubeconfig_problems(data: Mapping[str, Any]) -> list[str]:
    client = data.get("clientConnection")
    kubeconfig = _text(client.get("kubeconfig")) if isinstance(client, dict) else ""
    if kubeconfig and not posixpath.isabs(kubeconfig):
        return [
            f"clientConnection.kubeconfig: must be an absolute path inside the scheduler container, got "
            f"{kubeconfig!r} (kube-scheduler exits when it cannot read it)"
        ]
    return []


def _leader_election_problems(data: Mapping[str, Any]) -> list[str]:
    election = data.get("leaderElection")
    if not isinstance(election, dict) or election.get("leaderElect") is False:
        return []
    durations = {}
    for key in ("leaseDuration", "renewDeadline", "retryPeriod"):
        value = election.get(key)
        if isinstance(value, str):
            try:
                durations[key] = parse_duration_ns(value)
            except ValueError:
                continue  # the type check reports it
    problems = []
    lease, renew, retry = (durations.get(k) for k in ("leaseDuration", "renewDeadline", "retryPeriod"))
    if lease is not None and renew is not None and lease <= renew:
        problems.append("leaderElection.leaseDuration: must be greater than renewDeadline")
    if renew is not None and retry is not None and renew * 5 <= retry * 6:  # renewDeadline > 1.2 * retryPeriod
        problems.append("leaderElection.renewDeadline: must be greater than retryPeriod*1.2")
    return problems


def _range_problems(data: Mapping[str, Any]) -> list[str]:
    problems = []

    def number(key: str) -> int | None:
        value = data.get(key)
        return value if is_int(value) else None

    parallelism = number("parallelism")
    if parallelism is not None and parallelism <= 0:
        problems.append("parallelism: must be > 0")
    percentage = number("percentageOfNodesToScore")
    if percentage is not None and not 0 <= percentage <= 100:
        problems.append("percentageOfNodesToScore: must be between 0 and 100")
    initial = number("podInitialBackoffSeconds")
    if initial is not None and initial <= 0:
        problems.append("podInitialBackoffSeconds: must be > 0")
    maximum = number("podMaxBackoffSeconds")
    if maximum is not None and maximum < (initial if initial is not None else 1):
        problems.append("podMaxBackoffSeconds: must be >= podInitialBackoffSeconds")
    weight = number("hardPodAffinitySymmetricWeight")
    if weight is not None and not 0 <= weight <= 100:
        problems.append("hardPodAffinitySymmetricWeight: must be between 0 and 100")
    return problems


def _policy_problems(data: Mapping[str, Any]) -> list[str]:
    problems = []
    priorities = data.get("priorities")
    for index, priority in enumerate(priorities if isinstance(priorities, list) else []):
        weight = priority.get("weight") if isinstance(priority, dict) else None
        if not (is_int(weight) and weight > 0):
            problems.append(f"priorities[{index}].weight: must be > 0 (got {weight})")
    return problems + _range_problems(data)


def _extenders_rule(data: Mapping[str, Any], schema: Schema) -> list[str]:
    extenders = data.get("extenders")
    if isinstance(extenders, list) and "Extender" in schema.types:
        return extender_problems(extenders, schema.extender_type)
    return []


# The rules a schema may name in its ``rules`` list.
RULES: dict[str, Callable[[Mapping[str, Any], Schema], list[str]]] = {
    "extenders": _extenders_rule,
    "profiles": lambda data, schema: _profile_problems(data),
    "kubeconfig": lambda data, schema: _kubeconfig_problems(data),
    "leaderElection": lambda data, schema: _leader_election_problems(data),
    "ranges": lambda data, schema: _range_problems(data),
    "policy": lambda data, schema: _policy_problems(data),
    "upstream": upstream_problems,
}


def rule_problems(data: Mapping[str, Any], schema: Schema) -> list[str]:
    """Apply the rules the schema names (``rules`` in its JSON)."""
    problems: list[str] = []
    for rule in schema.rules:
        problems += RULES[rule](data, schema)
    return problems
