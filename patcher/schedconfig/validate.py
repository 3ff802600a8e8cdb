"""Strict validation of scheduler configuration, the way kube-scheduler decodes and validates it.

kube-scheduler decodes its config strictly (an unknown or misspelt field is fatal) and then validates it; either
failure makes it exit at start-up, and a static pod that exits is a cluster without a scheduler. Everything we
write is checked here first, against the schema of its apiVersion (data in ``schemas/``) and the rules below.
Each problem names the field path and the rule, and all problems of a file are reported at once.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from collections.abc import Callable, Mapping
from difflib import get_close_matches
from typing import Any
from urllib.parse import urlsplit

from patcher.errors import ConfigError
from patcher.schedconfig.duration import parse_duration_ns
from patcher.schedconfig.schema import (
    CONFIG_KIND,
    POLICY_KIND,
    Schema,
    TypeSpec,
    canonical_schema,
    config_api_versions,
    find_schema,
    served_config_schemas,
)
from patcher.schedconfig.version import KubeVersion

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_MAX_REPORTED = 8


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if _is_bool(value):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value!r}"
    return f"{type(value).__name__} {value!r}"


class _Walker:
    """Checks a document against the type tree of one schema, collecting ``field.path: problem`` lines."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.errors: list[str] = []

    def check(self, value: Any, type_expr: str, path: str) -> None:
        if value is None:
            return  # the decoder leaves a null field at its zero value
        if type_expr.startswith("[]"):
            if not isinstance(value, list):
                self.errors.append(f"{path}: must be a list, got {_describe(value)}")
                return
            for index, item in enumerate(value):
                self.check(item, type_expr[2:], f"{path}[{index}]")
            return
        checker = _SCALARS.get(type_expr)
        if checker is not None:
            problem = checker(value)
            if problem:
                self.errors.append(f"{path}: {problem}")
            return
        self.check_struct(value, self.schema.types[type_expr], path)

    def check_struct(self, value: Any, spec: TypeSpec, path: str) -> None:
        if not isinstance(value, dict):
            self.errors.append(f"{path or '(document)'}: must be a mapping ({spec.name}), got {_describe(value)}")
            return
        seen: dict[str, str] = {}
        for key, item in value.items():
            key_text = str(key)
            name = spec.lookup(key_text)
            if name is None:
                self.errors.append(self._unknown(spec, key_text, path))
                continue
            if name in seen:
                self.errors.append(f"{join(path, key_text)}: duplicate of field {seen[name]!r}")
                continue
            seen[name] = key_text
            self.check(item, spec.fields[name], join(path, key_text))
        for required in spec.required:
            given = seen.get(required)
            if given is None or value.get(given) in (None, ""):
                self.errors.append(f"{join(path, required)}: required field is missing or empty")

    def _unknown(self, spec: TypeSpec, key: str, path: str) -> str:
        where = f"{self.schema.api_version} {spec.name}"
        hint = ""
        close = get_close_matches(key, list(spec.fields), n=1, cutoff=0.6)
        if not close:
            close = [name for name in spec.fields if name.casefold() == key.casefold()]
        if close:
            hint = f"; did you mean {close[0]!r}?"
        if spec.case_insensitive:
            return (
                f"{join(path, key)}: unknown field ({where} has no such field{hint}; the legacy decoder would "
                "silently ignore it, scheduler-patcher refuses it so that a typo cannot switch a setting off)"
            )
        return f"{join(path, key)}: unknown field (strict decoding: {where} has no such field{hint})"


def _check_string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"must be a string, got {_describe(value)}"


def _check_bool(value: Any) -> str | None:
    return None if _is_bool(value) else f"must be true or false, got {_describe(value)}"


def _int_checker(kind: str) -> Callable[[Any], str | None]:
    low, high = _INT_RANGES[kind]

    def check(value: Any) -> str | None:
        if not _is_int(value):
            return f"must be an integer, got {_describe(value)}"
        if not low <= value <= high:
            return f"{value} does not fit in {kind}"
        return None

    return check


def _check_float(value: Any) -> str | None:
    if isinstance(value, int | float) and not _is_bool(value):
        return None
    return f"must be a number, got {_describe(value)}"


def _check_duration(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a duration string such as 15s, got {_describe(value)}"
    try:
        ns = parse_duration_ns(value)
    except ValueError as exc:
        return f"must be a duration: {exc}"
    return "must not be negative" if ns < 0 else None


def _check_nanoseconds(value: Any) -> str | None:
    if not _is_int(value):
        return f"must be an integer number of nanoseconds (e.g. 15000000000 for 15s), got {_describe(value)}"
    return "must not be negative" if value < 0 else None


def _check_bytes(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be base64 text, got {_describe(value)}"
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return "must be base64 text (PEM data base64-encoded once more)"
    return None


_SCALARS: dict[str, Callable[[Any], str | None]] = {
    "string": _check_string,
    "bool": _check_bool,
    "int32": _int_checker("int32"),
    "int64": _int_checker("int64"),
    "float": _check_float,
    "duration": _check_duration,
    "nanoseconds": _check_nanoseconds,
    "bytes": _check_bytes,
    "any": lambda value: None,
}


# ---- rules -------------------------------------------------------------------------------------------------


def is_qualified_name(name: str) -> bool:
    """Kubernetes ``IsQualifiedName``: an optional DNS subdomain prefix, ``/``, and a 63-character name."""
    prefix, _, local = name.rpartition("/")
    if "/" in name and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(local) <= 63 and bool(_QUALIFIED_NAME.fullmatch(local))


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
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                problems.append(f"{path}.urlPrefix: must be an http:// or https:// URL with a host, got {url!r}")
        weight = field(extender, "weight")
        if _text(field(extender, "prioritizeVerb")) and not (_is_int(weight) and weight > 0):
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
            if not is_qualified_name(name) or name.count("/") != 1:
                problems.append(
                    f"{r_path}: {name!r} must be a qualified extended resource name such as example.com/gpu"
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
    return []


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
            durations[key] = parse_duration_ns(value)
    problems = []
    if "leaseDuration" in durations and "renewDeadline" in durations:
        if durations["leaseDuration"] <= durations["renewDeadline"]:
            problems.append("leaderElection.leaseDuration: must be greater than renewDeadline")
    if "renewDeadline" in durations and "retryPeriod" in durations:
        if durations["renewDeadline"] * 5 <= durations["retryPeriod"] * 6:  # renewDeadline > 1.2 * retryPeriod
            problems.append("leaderElection.renewDeadline: must be greater than retryPeriod*1.2")
    return problems


def _range_problems(data: Mapping[str, Any]) -> list[str]:
    problems = []

    def number(key: str) -> int | None:
        value = data.get(key)
        return value if _is_int(value) else None

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
    if maximum is not None and maximum < (initial or 1):
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
        if not (_is_int(weight) and weight > 0):
            problems.append(f"priorities[{index}].weight: must be > 0 (got {weight})")
    return problems + _range_problems(data)


def rule_problems(data: Mapping[str, Any], schema: Schema) -> list[str]:
    """Apply the rules the schema names (``rules`` in its JSON)."""
    problems: list[str] = []
    for rule in schema.rules:
        if rule == "extenders":
            extenders = data.get("extenders")
            if isinstance(extenders, list) and "Extender" in schema.types:
                problems += extender_problems(extenders, schema.extender_type)
        elif rule == "profiles":
            problems += _profile_problems(data)
        elif rule == "kubeconfig":
            problems += _kubeconfig_problems(data)
        elif rule == "leaderElection":
            problems += _leader_election_problems(data)
        elif rule == "ranges":
            problems += _range_problems(data)
        elif rule == "policy":
            problems += _policy_problems(data)
        else:  # pragma: no cover - a schema naming a rule we do not have is a packaging bug
            raise ValueError(f"{schema.file}: unknown rule {rule!r}")
    return problems


# ---- entry points ------------------------------------------------------------------------------------------


def problems_for(data: Any, schema: Schema) -> list[str]:
    """Every problem of ``data`` against ``schema``: types first, then (only if the types are right) the rules."""
    walker = _Walker(schema)
    walker.check_struct(data, schema.types[schema.root], "")
    if walker.errors:
        return walker.errors
    return rule_problems(data, schema)


def raise_problems(path: str, problems: list[str]) -> None:
    if not problems:
        return
    shown = problems[:_MAX_REPORTED]
    more = len(problems) - len(shown)
    text = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    raise ConfigError(path, text)


def identify(data: Any, path: str, *, allow_policy: bool = False) -> Schema:
    """The schema for a parsed document, from its ``kind`` and ``apiVersion``; refuses anything else."""
    if not isinstance(data, dict):
        raise ConfigError(path, f"not a KubeSchedulerConfiguration: the document is {_describe(data)}")
    kind = data.get("kind")
    api_version = data.get("apiVersion")
    kinds = (CONFIG_KIND, POLICY_KIND) if allow_policy else (CONFIG_KIND,)
    if kind not in kinds:
        raise ConfigError(path, f"not a {' or '.join(kinds)} (kind is {kind!r})")
    schema = find_schema(str(api_version), str(kind))
    if schema is None:
        known = config_api_versions() if kind == CONFIG_KIND else ["v1"]
        raise ConfigError(
            path, f"apiVersion: {api_version!r} is not a known {kind} apiVersion (known: {', '.join(known)})"
        )
    return schema


def validate_document(data: Any, path: str, *, allow_policy: bool = False) -> Schema:
    """Identify and strictly validate one document; returns its schema or raises ConfigError."""
    schema = identify(data, path, allow_policy=allow_policy)
    raise_problems(path, problems_for(data, schema))
    return schema


def check_served(schema: Schema, version: KubeVersion, path: str) -> None:
    """Refuse an apiVersion the node's scheduler cannot decode, naming both versions and what would work."""
    if schema.serves(version):
        return
    served = [s.api_version for s in served_config_schemas(version)]
    alternatives = f"; kube-scheduler {version.short} serves {', '.join(served)}" if served else ""
    raise ConfigError(
        path,
        f"apiVersion: {schema.api_version} is not served by kube-scheduler {version} ({version.source}); "
        f"it is served by {schema.served_text}{alternatives} — or write a version-neutral extenders.yaml",
    )


def validate_extenders_file(data: Any, path: str) -> Schema:
    """Check the version-neutral ``extenders.yaml``: a mapping whose only key is a non-empty ``extenders`` list,
    each entry spelled like the newest apiVersion (v1). Returns that schema."""
    schema = canonical_schema()
    walker = _Walker(schema)
    walker.check_struct(data, TypeSpec("extenders.yaml", {"extenders": "[]Extender"}, ("extenders",)), "")
    problems = walker.errors
    if not problems and not data["extenders"]:
        problems = ["extenders: must list at least one extender"]
    if not problems:
        problems = extender_problems(data["extenders"], schema.extender_type)
    raise_problems(path, problems)
    return schema
