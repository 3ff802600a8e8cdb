"""The real helm for tests, and ``helm template`` of the project's chart.

Its own module (not tests/deploy/test_helm_chart.py, which skips itself whole without helm) so that a test elsewhere can
render the chart as one more source, e.g. the admission policy's CEL tests run against the chart's render too, and
skip just that case with one line when helm cannot be had.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.test_deploy_manifests import ROOT

CHART = ROOT / "charts/scheduler-patcher"
GET_HELM = ROOT.parent / "shared/tools/get-helm.sh"
RELEASE, NAMESPACE = "scheduler-patcher", "scheduler-patcher"


@functools.cache
def find_helm() -> tuple[str | None, str]:
    """(path of the real helm, "") or (None, why not)."""
    if not GET_HELM.is_file():
        return None, f"{GET_HELM} not found"
    proc = subprocess.run(["sh", str(GET_HELM)], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        return None, f"{GET_HELM}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}"
    return proc.stdout.strip(), ""


def run_helm(helm: str, *args: str, values: dict[str, Any] | None = None,
             tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``helm args...``, with ``values`` (if given) passed as a JSON file in ``tmp``."""
    argv = [helm, *args]
    if values is not None:
        assert tmp is not None
        path = tmp / f"values-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]}.json"
        path.write_text(json.dumps(values))
        argv += ["-f", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def template(helm: str, values: dict[str, Any], tmp: Path, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders (hooks included); a failed render fails the calling test."""
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", namespace, values=values, tmp=tmp)
    assert proc.returncode == 0, f"helm template {values}: {proc.stderr.strip()}"
    return [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]


#: Every monitoring switch on: the agents' and the gatekeeper's PodMonitors, the PrometheusRule and the
#: dashboard ConfigMap. A real-cluster test applies ``tests.harness.real.promcrds.crd_paths()`` first, then this render.
MONITORING_VALUES: dict[str, Any] = {
    "gatekeeper": {"enabled": True},
    "monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                   "dashboard": {"enabled": True}},
}
