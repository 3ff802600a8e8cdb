"""Strict validation of scheduler configuration, the way kube-scheduler decodes and validates it.

An unknown or misspelt field, or a refused value, makes kube-scheduler exit at start-up, and a static pod that
exits is a cluster without a scheduler. So everything we write is checked here first, against the types of its
apiVersion in the node's minor (``schema``) and upstream's rules (``rules``), all problems of a file at once.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from difflib import get_close_matches
from typing import Any

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.duration import parse_duration_ns
from patcher.core.schedconfig.rules import effective, extender_problems, is_int, rule_problems
from patcher.core.schedconfig.schema import (
    CONFIG_KIND,
    Schema,
    TypeSpec,
    added_in,
    all_schemas,
    canonical_schema,
    find_schema,
    for_version,
    served_config_schemas,
)
from patcher.core.schedconfig.version import KubeVersion

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_FLOAT32_MAX = 3.4028234663852886e38
_MAX_REPORTED = 8


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {_clip(repr(value))}"
    return f"{type(value).__name__} {_clip(repr(value))}"


def _clip(text: str, limit: int = 80) -> str:
    """Values are quoted in one-line errors; a 100 KB string must not make the line 100 KB."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Walker:
    """Checks a document against the type tree of one schema, collecting ``field.path: problem`` lines."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.errors: list[str] = []

    def check(self, value: Any, type_expr: str, path: str) -> None:
        if value is None:
            return  # the decoder leaves a null field at its zero value
        if type_expr.startswith("map[string]"):
            if not isinstance(value, dict):
                self.errors.append(f"{path}: must be a mapping, got {_describe(value)}")
                return
            for key, item in value.items():
                self.check(item, type_expr.removeprefix("map[string]"), f"{path}[{_clip(repr(key), 40)}]")
            return
        if type_expr.startswith("[]"):
            if not isinstance(value, list):
                self.errors.append(f"{path}: must be a list, got {_describe(value)}")
                return
            for index, item in enumerate(value):
                if item is None and type_expr[2:] in self.schema.types:
                    item = {}  # Go decodes a null entry as the zero struct, whose required fields are then empty
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
        for key, item in value.items():
            key_text = key if isinstance(key, str) and key.isprintable() else _clip(repr(key), 40)
            if not isinstance(key, str) or key_text not in spec.fields:
                self.errors.append(self._unknown(spec, key_text, path))
                continue
            if spec.name == "PluginConfig" and key == "args" and not self._in_tree(value):
                continue  # runtime.Unknown: kube-scheduler keeps another plugin's args as raw bytes
            self.check(item, spec.fields[key], join(path, key_text))
        disabled = spec.name == "Plugin" and path.rsplit(".", 1)[-1].startswith("disabled[")
        for required in spec.required:
            if required == "name" and (spec.name == "PluginConfig" or disabled):
                continue  # kube-scheduler 1.34-1.37 start with a nameless pluginConfig or disabled entry
            if value.get(required) in (None, ""):
                self.errors.append(f"{join(path, required)}: required field is missing or empty")
        if spec.name == "PluginConfig" and self.schema.plugin_args:
            self.check_args(value, path)

    def _in_tree(self, config: dict[Any, Any]) -> bool:
        """Whether a pluginConfig entry names an in-tree plugin whose args kind this apiVersion registers."""
        name = config.get("name")
        return not self.schema.plugin_args or (isinstance(name, str) and name in self.schema.plugin_args)

    def check_args(self, config: dict[Any, Any], path: str) -> None:
        """Args of an in-tree plugin decode strictly into its registered ``<Name>Args`` kind (upstream
        ``PluginConfig.decodeNestedObjects``); a kind or group given in them must be that one."""
        name, args = config.get("name"), config.get("args")
        args_type = self.schema.plugin_args.get(name) if isinstance(name, str) else None
        if args_type is None or not isinstance(args, dict):
            return
        where = join(path, "args")
        self.check_struct(args, self.schema.types[args_type], where)
        kind, api_version = args.get("kind"), args.get("apiVersion")
        if isinstance(kind, str) and kind and kind != args_type:
            self.errors.append(f"{where}.kind: args for plugin {name} must be of kind {args_type}, got {kind!r}")
        group = self.schema.api_version.split("/")[0]
        if isinstance(api_version, str) and api_version and api_version.split("/")[0] != group:
            self.errors.append(
                f"{where}.apiVersion: args for plugin {name} must be in group {group}, got {api_version!r}"
            )

    def _unknown(self, spec: TypeSpec, key: str, path: str) -> str:
        where = f"{self.schema.api_version} {spec.name}"
        node = self.schema.node_minor
        if self.schema.minor is not None and node is not None:
            added = added_in(self.schema.api_version, spec.name, key, self.schema.minor)
            if added is not None:
                return (
                    f"{join(path, key)}: not known to kube-scheduler {node[0]}.{node[1]} "
                    f"(added in {added[0]}.{added[1]})"
                )
            where = f"{where} of kube-scheduler {self.schema.minor[0]}.{self.schema.minor[1]}"
        close = get_close_matches(key, list(spec.fields), n=1, cutoff=0.6) or [
            name for name in spec.fields if name.casefold() == key.casefold()
        ]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{join(path, key)}: unknown field (strict decoding: {where} has no such field{hint})"


def _is(kind: type, wants: str) -> Callable[[Any], str | None]:
    return lambda value: None if isinstance(value, kind) else f"must be {wants}, got {_describe(value)}"


def _int_checker(kind: str) -> Callable[[Any], str | None]:
    low, high = _INT_RANGES[kind]

    def check(value: Any) -> str | None:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # YAML 1e2 reaches Go's JSON decoder as 100, which an int field takes
        if not is_int(value):
            return f"must be an integer, got {_describe(value)}"
        if not low <= value <= high:
            return f"{value} does not fit in {kind}"
        return None

    return check


def _check_float(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None
    return f"must be a number, got {_describe(value)}"


def _check_float32(value: Any) -> str | None:
    problem = _check_float(value)
    if problem is None and not -_FLOAT32_MAX <= value <= _FLOAT32_MAX:
        return f"{value} does not fit in float32"
    return problem


def _check_duration(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a duration string such as 15s, got {_describe(value)}"
    try:
        ns = parse_duration_ns(value)
    except ValueError as exc:
        return f"must be a duration: {exc}"
    return "must not be negative" if ns < 0 else None


def _check_bytes(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be base64 text, got {_describe(value)}"
    try:
        base64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error included
        return "must be base64 text (PEM data base64-encoded once more)"
    return None


_SCALARS: dict[str, Callable[[Any], str | None]] = {
    "string": _is(str, "a string"),
    "bool": _is(bool, "true or false"),
    "int32": _int_checker("int32"),
    "int64": _int_checker("int64"),
    "float": _check_float,
    "float64": _check_float,
    "float32": _check_float32,
    "object": _is(dict, "a mapping"),
    "duration": _check_duration,
    "bytes": _check_bytes,
}


# ---- entry points ------------------------------------------------------------------------------------------


def problems_for(data: dict[Any, Any], schema: Schema) -> list[str]:
    """Every problem of ``data`` against ``schema``: the type errors, then the rules' findings.

    The rules run even when some types are wrong (they skip values of the wrong type), so that one misspelt
    field does not hide a bad URL elsewhere: the operator fixes everything in one round.
    """
    walker = _Walker(schema)
    walker.check_struct(data, schema.types[schema.root], "")
    # what the scheduler validates: the config with the manifest's flags over it
    found = rule_problems(effective(data, schema), schema)
    return walker.errors + found  # disjoint: no rule's message has a type error's wording


def raise_problems(path: str, problems: list[str]) -> None:
    if not problems:
        return
    shown = problems[:_MAX_REPORTED]
    more = len(problems) - len(shown)
    text = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    raise ConfigError(path, text)


def validate_document(data: Any, path: str, *, version: KubeVersion | None = None) -> Schema:
    """Identify (``kind``, ``apiVersion``) and strictly validate one document, for the node's scheduler ``version``
    when known (an apiVersion it does not serve refused first, then the types of its minor); returns its schema or
    raises ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(path, f"not a KubeSchedulerConfiguration: the document is {_describe(data)}")
    kind = data.get("kind")
    api_version = data.get("apiVersion")
    if kind != CONFIG_KIND:
        raise ConfigError(path, f"not a {CONFIG_KIND} (kind is {kind!r})")
    schema = find_schema(str(api_version))
    if schema is None:
        known = ", ".join(s.api_version for s in all_schemas())
        raise ConfigError(path, f"apiVersion: {api_version!r} is not a known {kind} apiVersion (known: {known})")
    if version is not None:
        check_served(schema, version, path)
        schema = for_version(schema, version)
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
    extenders = data.get("extenders") if isinstance(data, dict) else None
    if isinstance(extenders, list) and not extenders:
        problems.append("extenders: must list at least one extender")
    if isinstance(extenders, list):
        problems += extender_problems(extenders)
    raise_problems(path, problems)
    return schema
