"""The schemas are data: every file must be self-consistent, so that adding an apiVersion is a data change."""

from __future__ import annotations

import re

import pytest

from patcher.core.schedconfig.schema import CONFIG_KIND, Schema, all_schemas, canonical_schema, generated
from patcher.core.schedconfig.validate import _SCALARS

SCALARS = {
    "string", "bool", "int32", "int64", "float", "float32", "float64", "duration", "bytes", "object",
}


def _base(type_expr: str) -> str:
    while True:
        if type_expr.startswith("[]"):
            type_expr = type_expr[2:]
        elif type_expr.startswith("map[string]"):
            type_expr = type_expr.removeprefix("map[string]")
        else:
            return type_expr


def test_every_type_expression_the_schemas_use_is_one_the_validator_knows() -> None:
    assert set(_SCALARS) == SCALARS


@pytest.mark.parametrize(
    ("minor", "api_version"),
    [(minor, api) for minor, apis in generated().items() for api in apis],
    ids=lambda v: v if isinstance(v, str) else f"1.{v[1]}",
)
def test_generated_types_are_consistent(minor: tuple[int, int], api_version: str) -> None:
    entry = generated()[minor][api_version]
    assert "KubeSchedulerConfiguration" in entry.types
    for spec in entry.types.values():
        for field, type_expr in spec.fields.items():
            assert _base(type_expr) in SCALARS or _base(type_expr) in entry.types, (spec.name, field, type_expr)
    assert all(kind in entry.types and kind == f"{name}Args" for name, kind in entry.plugin_args.items())


@pytest.mark.parametrize("schema", all_schemas(), ids=lambda s: s.file)
def test_schema_is_consistent(schema: Schema) -> None:
    assert schema.root in schema.types
    for spec in schema.types.values():
        for field, type_expr in spec.fields.items():
            base = _base(type_expr)
            assert base in SCALARS or base in schema.types, (spec.name, field, type_expr)
        assert set(spec.required) <= set(spec.fields), spec.name
    assert schema.kind == CONFIG_KIND and "Extender" in schema.types
    group, _, version = schema.api_version.rpartition("/")
    assert schema.file == f"{group}-{version}.json"
    assert re.fullmatch(r"v\d+((alpha|beta)\d+)?", version)


def test_one_schema_per_api_version_and_kind() -> None:
    keys = [(s.api_version, s.kind) for s in all_schemas()]
    assert len(keys) == len(set(keys))


def test_canonical_spelling_is_v1_and_every_api_version_spells_extenders_alike() -> None:
    assert canonical_schema().api_version == "kubescheduler.config.k8s.io/v1"
    assert canonical_schema().types["Extender"].fields["httpTimeout"] == "duration"
    canonical = tuple(canonical_schema().types["Extender"].fields)
    assert {tuple(s.types["Extender"].fields) for s in all_schemas()} == {canonical}
