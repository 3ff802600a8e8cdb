"""The scheduler's configuration APIs, kept as data: one JSON file per apiVersion under ``schemas/``.

Each ``kubescheduler.config.k8s.io-<version>.json`` says which kube-scheduler minors serve the apiVersion and
whether we render it. The types come per minor from ``kube-scheduler-1.N.json`` (written by
``tools/gen_schedconfig_schemas.py`` from the Go types of that release): kube-scheduler decodes strictly, so a
field its minor lacks is fatal even when a later minor added it; ``for_version`` swaps in the node's minor.

Type expressions: ``string``, ``bool``, ``int32``, ``int64``, ``float``/``float64``, ``float32``, ``duration``
(Go duration string), ``bytes`` (base64), ``object`` (any mapping), ``[]T``, ``map[string]T``, or another type's
name; a type may list ``required`` fields (present and non-empty).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from patcher.core import fileread
from patcher.core.schedconfig.version import KubeVersion, Launch

CONFIG_KIND = "KubeSchedulerConfiguration"
#: The data files, beside this module (the package is installed as files; ``importlib.resources`` would add
#: its imports, zipfile's among them, to the agent's start for nothing).
SCHEMAS = Path(__file__).with_name("schemas")


@dataclass(frozen=True)
class TypeSpec:
    """One struct of a configuration API: its fields and how they decode."""

    name: str
    fields: dict[str, str]
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Schema:
    """One apiVersion+kind: when it is served, how to render it, and its types."""

    api_version: str
    kind: str
    served_from: tuple[int, int]
    removed_in: tuple[int, int] | None
    render: bool
    root: str
    types: dict[str, TypeSpec]
    file: str
    plugin_args: dict[str, str] = field(default_factory=dict)  # plugin name -> its registered args type
    minor: tuple[int, int] | None = None  # the kube-scheduler minor whose generated types these are
    node_minor: tuple[int, int] | None = None  # the node's scheduler minor, for rules that changed between minors
    node_gates: frozenset[str] | None = None  # feature gates the node's scheduler runs with (None: not known)
    node_launch: Launch | None = None  # the manifest's flags and image, for the start-up checks (rules.py)

    def serves(self, version: KubeVersion) -> bool:
        return self.served_from <= version.key and (self.removed_in is None or version.key < self.removed_in)

    @property
    def served_text(self) -> str:
        """``1.23–1.28`` or ``1.25 and later``: for error messages that tell the user what would work."""
        start = f"{self.served_from[0]}.{self.served_from[1]}"
        if self.removed_in is None:
            return f"{start} and later"
        end = f"{self.removed_in[0]}.{self.removed_in[1] - 1}"
        return start if end == start else f"{start}–{end}"


def minor_of(text: str | None) -> tuple[int, int] | None:
    """``(1, 29)`` of ``"1.29"``; None of None."""
    if text is None:
        return None
    major, minor = text.split(".")
    return (int(major), int(minor))


def _types(raw: dict[str, Any]) -> dict[str, TypeSpec]:
    return {
        type_name: TypeSpec(
            name=type_name,
            fields=dict(spec["fields"]),
            required=tuple(spec.get("required", ())),
        )
        for type_name, spec in raw.items()
    }


def _parse(name: str, raw: dict[str, Any]) -> Schema:
    served_from = minor_of(raw["served"]["from"])
    assert served_from is not None, f"{name}: served.from is required"
    return Schema(
        api_version=raw["apiVersion"],
        kind=raw["kind"],
        served_from=served_from,
        removed_in=minor_of(raw["served"].get("removedIn")),
        render=bool(raw["render"]),
        root=raw["root"],
        types=_types(raw["types"]),
        file=name,
    )


#: The largest shipped data file is ~70 KiB; the bound is the one reader's rule, not a worry about these files.
MAX_SCHEMA_BYTES = 1024 * 1024


def read_data(name: str) -> str:
    """A data file of ``schemas/``, by the one bounded reader."""
    return fileread.read_file(SCHEMAS / name, "packaged schema", limit=MAX_SCHEMA_BYTES).decode("utf-8")


@cache
def all_schemas() -> tuple[Schema, ...]:
    """Every per-apiVersion schema shipped in the package (``kubescheduler.config.k8s.io-<version>.json``)."""
    names = sorted(entry.name for entry in SCHEMAS.glob("kubescheduler.config.k8s.io-*.json"))
    return tuple(_parse(name, json.loads(read_data(name))) for name in names)


@dataclass(frozen=True)
class MinorTypes:
    """The generated types of one apiVersion in one kube-scheduler minor."""

    types: dict[str, TypeSpec]
    plugin_args: dict[str, str]


@cache
def _generated() -> dict[tuple[int, int], tuple[dict[str, MinorTypes], frozenset[str] | None]]:
    """minor -> (apiVersion -> its types, the in-tree registry's plugin names where that was read), from every
    ``kube-scheduler-1.N.json``, oldest first."""
    found = {}
    for entry in SCHEMAS.glob("kube-scheduler-*.json"):
        raw = json.loads(read_data(entry.name))
        minor = minor_of(raw["kubeScheduler"])
        assert minor is not None
        types = {api_version: MinorTypes(_types(content["types"]), dict(content["pluginArgs"]))
                 for api_version, content in raw["apiVersions"].items()}
        found[minor] = (types, frozenset(raw["registry"]) if raw.get("registry") is not None else None)
    return dict(sorted(found.items()))


def generated() -> dict[tuple[int, int], dict[str, MinorTypes]]:
    """minor -> apiVersion -> types, oldest minor first."""
    return {minor: types for minor, (types, _) in _generated().items()}


def registry(minor: tuple[int, int]) -> frozenset[str] | None:
    """The plugin names the in-tree registry of this minor holds (``NewInTreeRegistry``, generated from its
    k8s.io/kubernetes where that was read); None when not generated for it."""
    return _generated().get(minor, ({}, None))[1]


def generated_minor(version: KubeVersion) -> tuple[int, int] | None:
    """Which generated minor describes ``version``: its own, the newest one for a newer scheduler, else None."""
    return max((minor for minor in _generated() if minor <= version.key), default=None)


def for_version(schema: Schema, version: KubeVersion) -> Schema:
    """``schema`` as kube-scheduler ``version`` reads it: with the types of its generated minor (the newest one for a
    newer scheduler) and what its manifest adds (the minor, gates and flags the rules read)."""
    node = replace(schema, node_minor=version.key, node_gates=version.feature_gates, node_launch=version.launch)
    minor = generated_minor(version)
    entry = generated()[minor].get(schema.api_version) if minor is not None else None
    if entry is None:
        return node
    return replace(node, types=entry.types, plugin_args=entry.plugin_args, minor=minor)


def added_in(api_version: str, type_name: str, field_name: str, after: tuple[int, int]) -> tuple[int, int] | None:
    """The first minor after ``after`` whose ``api_version`` has ``type_name.field_name``, if any."""
    for minor, api_versions in generated().items():
        entry = api_versions.get(api_version)
        if minor > after and entry is not None and field_name in entry.types.get(type_name, TypeSpec("", {})).fields:
            return minor
    return None


def find_schema(api_version: str) -> Schema | None:
    return next((schema for schema in all_schemas() if schema.api_version == api_version), None)


def served_config_schemas(version: KubeVersion) -> list[Schema]:
    """KubeSchedulerConfiguration apiVersions this scheduler decodes, newest (latest introduced) first."""
    served = [s for s in all_schemas() if s.serves(version)]
    return sorted(served, key=lambda s: s.served_from, reverse=True)


def target_schema(version: KubeVersion) -> Schema:
    """The apiVersion to render for this scheduler: the newest renderable one it serves."""
    for schema in served_config_schemas(version):
        if schema.render:
            return schema
    raise LookupError(f"no renderable KubeSchedulerConfiguration apiVersion is served by kube-scheduler {version}")


def canonical_schema() -> Schema:
    """The newest config apiVersion: its field names are the version-neutral spelling."""
    return max((s for s in all_schemas() if s.render), key=lambda s: s.served_from)
