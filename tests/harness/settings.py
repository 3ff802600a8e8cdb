"""``build_settings``: a ``Settings`` from flat ``name=value`` pairs, for the tests and benches.

The product builds its settings from the ``run`` flags (``cli.run_settings``); a test names only what it
changes (``build_settings(files=..., restart_timeout=30.0)``), each name routed to the one group that declares
it: the field names are unique across groups (``tests/unit/test_settings.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from patcher.core.settings import Settings, groups


def build_settings(*, no_api: bool = False, **values: Any) -> Settings:
    """Settings from flat ``name=value`` pairs, a group (``files=Files(...)``) or a field of one
    (``restart_timeout=30.0``). ``no_api``: a run without a cluster (no API field then). The kubelet check is off
    unless named (``kubelet_healthz=url``): the product's default is this machine's own port 10248, where
    whatever answers must not decide a test."""
    kinds = groups()
    if "kubelet_healthz" not in values and owner_of("kubelet_healthz") not in values:
        values = {**values, "kubelet_healthz": ""}
    made: dict[str, dict[str, Any]] = {}
    whole: dict[str, Any] = {}
    for name, value in values.items():
        if name in kinds:
            whole[name] = value
        else:
            made.setdefault(owner_of(name), {})[name] = value
    if no_api and ("api" in made or "api" in whole):
        raise TypeError("build_settings: API settings given for a run without an API")
    if both := sorted(set(made) & set(whole)):
        raise TypeError(f"build_settings: both the group {both[0]!r} and fields of it given")
    out = {name: whole[name] if name in whole else kind(**made.get(name, {})) for name, kind in kinds.items()}
    if no_api:
        out["api"] = None
    return Settings(**out)


def owner_of(name: str) -> str:
    """The group that declares the setting ``name`` (``TypeError`` for one no group declares)."""
    owners = [g for g, kind in groups().items() if name in {f.name for f in dataclasses.fields(kind)}]
    if len(owners) != 1:
        raise TypeError(f"Settings: {len(owners)} groups declare {name!r}{': ' + ', '.join(owners) if owners else ''}")
    return owners[0]
