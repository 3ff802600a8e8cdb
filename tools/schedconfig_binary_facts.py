"""What each built kube-scheduler says about itself: its flags, its feature gates and their defaults (issue 33).

`plan` must refuse what the binary refuses before it reads ``--config``: a flag it does not know (``--port``,
``--address``, ``--lock-object-name`` … are gone), a feature gate it does not know, a gate switched off that an
enabled gate depends on. The binary's ``--help`` lists every flag and every gate with its default, and a probe
per gate (``--feature-gates=G=<not default>``, 35 ms each) makes it name the gates that depend on ``G``. The
facts go to ``patcher/core/schedconfig/schemas/binary-facts.json``, read by the pure core:

    python -m tools.schedconfig_binary_facts      # every built minor (about 20 s on 2 cores)
    python -m tools.schedconfig_binary_facts --plugins-from-oracle   # after `make config-oracle`

The second adds, per minor, which in-tree plugins the binary registers and the extension points each
implements, read from the oracle's recorded runs of every plugin at every point (``plugins_from_oracle``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.real.controlplane import Binaries, built_releases  # noqa: E402

OUT = ROOT / "patcher/core/schedconfig/schemas/binary-facts.json"
_FLAG = re.compile(r"^\s+(?:-\w, )?--([a-z0-9-]+)")
_GATE = re.compile(r"^\s+kube:([A-Za-z0-9]+)=true\|false \((\w+) - default=(true|false)\)")
RULE_GATES = {"DRASchedulerFilterTimeout", "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus",
              "VolumeCapacityPriority", "StorageCapacityScoring", "DynamicResourceAllocation"}
_DEPENDS = re.compile(r"(\w+) is enabled, but depends on features that are disabled: \[([^\]]*)\]")


def _run(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, check=False)
    return proc.stdout + proc.stderr


def facts(binaries: Binaries, candidates: set[str]) -> dict[str, Any]:
    binary = binaries.path("kube-scheduler")
    help_text = _run(binary, "--help")
    flags = sorted({m.group(1) for line in help_text.splitlines() if (m := _FLAG.match(line))})
    gates = {m.group(1): m.group(3) == "true" for line in help_text.splitlines() if (m := _GATE.match(line))}

    def probe(name: str) -> list[tuple[str, str]]:
        value = "false" if gates[name] else "true"
        out = _run(binary, f"--feature-gates={name}={value}", "--kubeconfig=/nonexistent/kubeconfig")
        return [(gate, dep) for gate, deps in _DEPENDS.findall(out) for dep in re.split(r"[,\s]+", deps) if dep]

    def locked(name: str) -> bool | None:
        """A gate --help does not list may still be known: GA or deprecated gates locked to their value are
        hidden. None: unknown to this binary; else the value it is locked to."""
        for value in (True, False):
            out = _run(binary, f"--feature-gates={name}={str(value).lower()}", "--kubeconfig=/nonexistent/k")
            if "unrecognized feature gate" in out:
                return None
            if "locked to" not in out:
                continue
            return not value
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        edges = sorted({edge for found in pool.map(probe, sorted(gates)) for edge in found})
    with ThreadPoolExecutor(max_workers=4) as pool:
        hidden = dict(zip(sorted(candidates - set(gates)), pool.map(locked, sorted(candidates - set(gates))),
                          strict=True))
    locked_gates = {name: value for name, value in hidden.items() if value is not None}
    depends: dict[str, list[str]] = {}
    for gate, dep in edges:
        depends.setdefault(gate, []).append(dep)
    return {"version": binaries.version, "flags": flags, "gates": dict(sorted(gates.items())),
            "locked": dict(sorted(locked_gates.items())), "depends": depends}


def listed_gates(binaries: Binaries) -> set[str]:
    help_text = _run(binaries.path("kube-scheduler"), "--help")
    return {m.group(1) for line in help_text.splitlines() if (m := _GATE.match(line))}


_CASE = re.compile(r"^plugin (\w+) at (\w+)$")


def plugins_from_oracle(minor: int) -> dict[str, Any] | None:
    """What this minor's binary registers, read from the oracle's recorded runs of the "plugin X at point P"
    cases (tools/schedconfig_cases.py ``plugins``): ``points`` is plugin -> point -> implements, for the runs that
    settle it (started: yes; NewFramework's "plugin X does not extend P": no; an exit for another reason, e.g.
    validation refusing a removed plugin first, settles nothing), ``unregistered`` the plugins NewFramework says
    do not exist. None when this minor has no recorded runs."""
    from tools.schedconfig_oracle import DATA, read_cases, read_results

    if not (DATA / f"1.{minor}.json").is_file():
        return None
    cases, verdicts = read_cases(), read_results(minor)["verdicts"]
    points: dict[str, dict[str, bool]] = {}
    unknown: set[str] = set()
    for key, case in sorted(cases.items(), key=lambda kv: kv[1].origin):
        match = _CASE.match(case.origin)
        if not match or match.group(2) == "multiPoint" or key not in verdicts:
            continue
        name, point = match.groups()
        verdict = verdicts[key]
        if "does not exist" in verdict["message"]:
            unknown.add(name)
        elif "does not extend" in verdict["message"]:
            points.setdefault(name, {})[point] = False
        elif verdict["outcome"] == "started":
            points.setdefault(name, {})[point] = True
    return {"unregistered": sorted(unknown),
            "points": {name: dict(sorted(found.items())) for name, found in sorted(points.items())
                       if name not in unknown}}


def main() -> int:
    found: dict[str, Any] = json.loads(OUT.read_text()) if OUT.is_file() else {}
    if sys.argv[1:] == ["--plugins-from-oracle"]:
        for minor, item in found.items():
            plugins = plugins_from_oracle(int(minor))
            if plugins is not None:
                item["plugins"] = plugins
                print(f"1.{minor}: {len(plugins['points'])} plugins settled, unregistered {plugins['unregistered']}")
        OUT.write_text(json.dumps(found, indent=1) + "\n")
        return 0
    releases = built_releases()
    # every gate any built minor lists, and those the rules name: a minor that hides one may still know it
    candidates = set().union(*(listed_gates(b) for b in releases)) | RULE_GATES
    for binaries in releases:
        plugins = found.get(str(binaries.minor), {}).get("plugins")
        found[str(binaries.minor)] = facts(binaries, candidates)
        if plugins is not None:  # kept: it comes from the oracle's runs (--plugins-from-oracle)
            found[str(binaries.minor)]["plugins"] = plugins
        item = found[str(binaries.minor)]
        print(f"{binaries.version}: {len(item['flags'])} flags, {len(item['gates'])} gates "
              f"(+{len(item['locked'])} locked, hidden), "
              f"{sum(map(len, item['depends'].values()))} dependencies")
    OUT.write_text(json.dumps(dict(sorted(found.items(), key=lambda kv: int(kv[0]))), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
