#!/usr/bin/env python3
"""Time and peak memory of the source limits (docs/scheduler-config.md, "Input limits"), one case per process.

    python tools/measure_schedconfig_limits.py largest   # the largest source that is accepted
    python tools/measure_schedconfig_limits.py items     # 256 KiB of "- {}" items: refused at the node limit
    python tools/measure_schedconfig_limits.py nest      # 100 000 levels of flow nesting: refused at the depth limit

Prints bytes, the outcome, wall seconds and peak RSS. A measurement, not a test: numbers depend on the machine.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES

HEAD = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


def source(kind: str) -> tuple[str, str]:
    if kind == "largest":  # just under the size and node limits: a long NodeAffinity values list
        values = "".join(f"              - v{i:04d}{'x' * 30}\n" for i in range(4700))
        text = (
            HEAD
            + "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n    args:\n      addedAffinity:\n"
            "        requiredDuringSchedulingIgnoredDuringExecution:\n          nodeSelectorTerms:\n"
            "          - matchExpressions:\n            - key: zone\n              operator: In\n"
            "              values:\n"
            + values
            + "extenders:\n- urlPrefix: http://127.0.0.1:8888/\n  filterVerb: filter\n"
        )
        return "config.yaml", text
    if kind == "items":
        return "extenders.yaml", ("extenders:\n" + "- {}\n" * 200_000)[: MAX_SOURCE_BYTES - 1]
    if kind == "nest":
        return "extenders.yaml", ("extenders: " + "[" * 100_000 + "]" * 100_000)[: MAX_SOURCE_BYTES - 1]
    raise SystemExit(f"unknown case {kind!r}: largest, items or nest")


def main() -> int:
    name, text = source(sys.argv[1] if len(sys.argv) > 1 else "largest")
    folder = Path(tempfile.mkdtemp())
    (folder / name).write_text(text, encoding="utf-8")
    start = time.perf_counter()
    try:
        rendered = build_config(ConfigRequest(source_dir=folder, host_config_dir="/etc/x", kube_version="1.30"))
        outcome = f"accepted ({len(rendered.files[rendered.main])} bytes rendered)"
    except ConfigError as err:
        outcome = f"refused: {err.problem}"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{len(text.encode())} bytes; {outcome}; {seconds:.2f} s; peak RSS {peak:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
