"""Extenders in one canonical spelling, converted to whatever the target apiVersion calls them.

The source's ``extenders.yaml`` uses the v1 field names for every Kubernetes version. Two spellings exist in the
wild: v1beta1 and later (``enableHTTPS``, ``httpTimeout: 15s``) and the legacy one of the Policy file and
v1alpha2 (``enableHttps``, ``httpTimeout`` in integer nanoseconds, field names matched ignoring case). The
schemas say which spelling a type uses (``canonical`` names, ``duration`` vs ``nanoseconds``), so conversion is
driven by data and works both ways.
"""

from __future__ import annotations

from typing import Any

from patcher.core.schedconfig.duration import format_duration, parse_duration_ns
from patcher.core.schedconfig.schema import Schema, TypeSpec

Extender = dict[str, Any]  # canonical (v1) field names, plain values


def _normalize(value: Any, type_expr: str, schema: Schema) -> Any:
    """Plain data with declared field names (legacy input may use any case) for nested structs."""
    if value is None:
        return None
    if type_expr.startswith("[]"):
        return [_normalize(item, type_expr[2:], schema) for item in value]
    spec = schema.types.get(type_expr)
    if spec is None:
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = spec.lookup(str(key))
        if name is not None:
            out[name] = _normalize(item, spec.fields[name], schema)
    return out


def to_canonical(extender: dict[str, Any], schema: Schema) -> Extender:
    """One validated extender of ``schema`` in canonical form (v1 names, ``httpTimeout`` as a duration string)."""
    spec = schema.extender_type
    canonical: Extender = {}
    for key, value in extender.items():
        name = spec.lookup(str(key))
        if name is None:
            continue
        type_expr = spec.fields[name]
        plain = _normalize(value, type_expr, schema)
        if type_expr == "nanoseconds" and plain is not None:
            plain = format_duration(int(plain))
        canonical[spec.to_canonical(name)] = plain
    return canonical


def from_canonical(extender: Extender, schema: Schema) -> dict[str, Any]:
    """The same extender in ``schema``'s spelling, fields in the schema's declared order (deterministic)."""
    spec: TypeSpec = schema.extender_type
    out: dict[str, Any] = {}
    for name, type_expr in spec.fields.items():
        canonical = spec.to_canonical(name)
        if canonical not in extender or extender[canonical] is None:
            continue
        value = extender[canonical]
        if type_expr == "nanoseconds":
            value = parse_duration_ns(str(value))
        out[name] = value
    return out


def url_of(extender: dict[str, Any], spec: TypeSpec) -> str:
    """The extender's urlPrefix, normalized for matching (a trailing slash does not make another extender)."""
    for key, value in extender.items():
        name = spec.lookup(str(key))
        if name is not None and spec.to_canonical(name) == "urlPrefix" and isinstance(value, str):
            return value.rstrip("/")
    return ""
