"""Extenders in one spelling (every supported apiVersion spells an extender as v1 does), written in the target
apiVersion's field order.
"""

from __future__ import annotations

from typing import Any

from patcher.core.schedconfig.schema import Schema

Extender = dict[str, Any]  # v1 field names, plain values


def _normalize(value: Any, type_expr: str, schema: Schema) -> Any:
    """Plain data with declared field names for nested structs."""
    if value is None:
        return None
    if type_expr.startswith("[]"):
        return [_normalize(item, type_expr[2:], schema) for item in value]
    spec = schema.types.get(type_expr)
    if spec is None:
        return value
    return {str(key): _normalize(item, spec.fields[key], schema) for key, item in value.items() if key in spec.fields}


def to_canonical(extender: dict[str, Any], schema: Schema) -> Extender:
    """One validated extender of ``schema`` as plain data."""
    spec = schema.types["Extender"]
    return {key: _normalize(value, spec.fields[key], schema) for key, value in extender.items() if key in spec.fields}


def from_canonical(extender: Extender, schema: Schema) -> dict[str, Any]:
    """The same extender, fields in the schema's declared order (deterministic)."""
    return {name: extender[name] for name in schema.types["Extender"].fields if extender.get(name) is not None}


def url_of(extender: dict[str, Any]) -> str:
    """The extender's urlPrefix, normalized for matching (a trailing slash does not make another extender)."""
    value = extender.get("urlPrefix")
    return value.rstrip("/") if isinstance(value, str) else ""
