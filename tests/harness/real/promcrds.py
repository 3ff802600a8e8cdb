"""The Prometheus Operator's CRDs, from a pinned module of the Go module proxy, and an offline check of objects
against their ``openAPIV3Schema``.

No package registry reachable here ships the CRDs as YAML, but the operator's Go module zip holds them under
``example/prometheus-operator-crd/``: ``go mod download -json`` puts the module in the Go module cache (once) and
says where. sum.golang.org is not reachable, so the download runs with ``GOSUMDB=off`` and the module's hash is
checked here against the pinned ``MODULE_SUM`` instead (the go.sum line of that version).

For a test that applies them to a real API server: ``crd_paths()`` are the files to apply
first, then the objects ``tests.harness.real.helmtool.template(helm, MONITORING_VALUES, tmp)`` renders.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.harness.real.gomodfiles import module_dir

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.89.0"
#: go.sum's h1: hash of MODULE@VERSION's zip (checked because the checksum database is off).
MODULE_SUM = "h1:2HA351OwWBa10H6TDhjeSdHOA7wiY71sEivg+z2cykk="
CRD_FOLDER = "example/prometheus-operator-crd"
#: The kinds scheduler-patcher renders, by their CRD file.
CRD_FILES = {"PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
             "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml"}
Obj = dict[str, Any]


def crd_folder() -> tuple[Path | None, str]:
    """(the module's CRD folder, "") or (None, why not)."""
    root, why = module_dir(MODULE, VERSION, MODULE_SUM)
    if root is None:
        return None, why
    folder = root / CRD_FOLDER
    if not folder.is_dir():
        return None, f"{MODULE}@{VERSION} has no {CRD_FOLDER}"
    return folder, ""


def crd_paths(kinds: tuple[str, ...] = tuple(CRD_FILES)) -> list[Path]:
    """The CRD files of ``kinds`` (default: the ones the chart renders); AssertionError when they cannot be had
    (call ``crd_folder`` first to skip instead)."""
    folder, why = crd_folder()
    assert folder is not None, why
    return [folder / CRD_FILES[kind] for kind in kinds]


@functools.cache
def _crd(kind: str) -> Obj:
    (path,) = crd_paths((kind,))
    crd: Obj = yaml.safe_load(path.read_text())
    return crd


def strict(schema: Obj) -> Obj:
    """``schema`` with unknown fields refused wherever it lists the fields (``additionalProperties: false`` where it
    says nothing), as ``kubectl apply --validate=strict`` refuses them; ``x-kubernetes-preserve-unknown-fields``
    objects stay open."""
    out = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(out)
    return out


def errors(obj: Obj) -> list[str]:
    """Where ``obj`` breaks its CRD's served schema (strictly: unknown fields too); [] when it fits."""
    kind, (group, _, version) = obj["kind"], obj["apiVersion"].partition("/")
    crd = _crd(kind)
    if crd["spec"]["group"] != group:
        return [f"{kind}: group {group}, the CRD serves {crd['spec']['group']}"]
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in served:
        return [f"{kind}: version {version} is not served (the CRD serves {sorted(served)})"]
    schema = strict(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the API server's, not the CRD's
    validator = jsonschema.Draft7Validator(schema)
    return [f"{kind}/{obj['metadata']['name']}: {'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in validator.iter_errors(obj)]
