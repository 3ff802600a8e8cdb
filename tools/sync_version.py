"""Copy the one version (``patcher/__init__.py``'s ``__version__``) to the files that need it as a literal.

helm reads ``version``/``appVersion`` from ``charts/scheduler-patcher/Chart.yaml`` and kustomize reads ``newTag``
from the kustomizations' ``images:``; neither can import Python. Run ``make version-sync`` after a version bump;
``--check`` only reports the copies that differ (exit 1), and tests/deploy/test_helm_chart.py fails on any of them.
The chart's version is the project's: chart and image are released together.

Usage: ``python tools/sync_version.py [--check]``
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = "charts/scheduler-patcher/Chart.yaml"
KUSTOMIZATIONS = ("manifests/base/kustomization.yaml", "manifests/gatekeeper/kustomization.yaml",
                  "manifests/uninstall/base/kustomization.yaml")
#: (file, pattern of the line whose one group is the version, how the new line is written)
RULES: list[tuple[str, str, str]] = [
    (CHART, r'^version: "?([^"\n]*)"?$', "version: {v}"),
    (CHART, r'^appVersion: "?([^"\n]*)"?$', 'appVersion: "{v}"'),
    *[(k, r'^  newTag: "?([^"\n]*)"?$', '  newTag: "{v}"') for k in KUSTOMIZATIONS],
]


def current_version(root: Path = ROOT) -> str:
    found = re.search(r'^__version__ = "([^"]+)"$', (root / "patcher/__init__.py").read_text(), re.M)
    if found is None:
        raise ValueError("patcher/__init__.py: no __version__ = \"...\" line")
    return found.group(1)


def sync(root: Path = ROOT, *, write: bool) -> list[str]:
    """The copies that differ from ``__version__`` ("file: old -> new"); rewritten in place when ``write``."""
    version = current_version(root)
    changes = []
    for rel, pattern, line in RULES:
        path = root / rel
        text = path.read_text()
        matches = list(re.finditer(pattern, text, re.M))
        if len(matches) != 1:
            raise ValueError(f"{rel}: expected one line matching {pattern!r}, found {len(matches)}")
        if matches[0].group(1) != version:
            changes.append(f"{rel}: {matches[0].group(1)} -> {version}")
            text = text[: matches[0].start()] + line.format(v=version) + text[matches[0].end():]
            if write:
                path.write_text(text)
    return changes


def main(argv: list[str]) -> int:
    check = "--check" in argv[1:]
    try:
        changes = sync(write=not check)
    except (OSError, ValueError) as exc:
        print(f"sync_version: {exc}", file=sys.stderr)
        return 1
    for change in changes:
        print(("differs: " if check else "wrote ") + change)
    return 1 if check and changes else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
