"""Kubernetes objects as the API sends them, plain JSON dicts: reading into them without the client's models.

Pure and shared by the verdicts (restart, readiness), the gatekeeper and the watches: the generated models
insist on fields that servers omit, so everything here works on the raw JSON instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, or ``None`` as soon as a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def ready(obj: Any) -> bool:
    """Whether a Pod's or a Node's ``Ready`` condition is ``True``."""
    for cond in dig(obj, "status", "conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def mirror_pod_name(static_pod_name: str, node_name: str) -> str:
    """The kubelet names a static pod's mirror ``<metadata.name>-<node name>``."""
    return f"{static_pod_name}-{node_name}"
