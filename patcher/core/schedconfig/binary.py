"""What the real kube-scheduler of a built minor knows before it reads ``--config``: its own facts, not guesses.

pflag and component-base parse the manifest's flags before the config: an unknown flag (``--port``,
``--lock-object-name`` … are gone), an unknown or locked feature gate, or a gate off that an enabled one depends
on, and kube-scheduler exits. ``tools/schedconfig_binary_facts.py`` reads these facts from the binaries
``make real-k8s`` builds into ``schemas/binary-facts.json``; minors without facts are not checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from patcher.core.schedconfig.flags import parse_bool
from patcher.core.schedconfig.schema import read_data


@dataclass(frozen=True)
class BinaryFacts:
    """One kube-scheduler release as its binary describes itself."""

    version: str
    flags: frozenset[str]
    gates: Mapping[str, bool]  # gate -> default (those --help lists, and the hidden ones locked to a value)
    locked: Mapping[str, bool]  # hidden gates locked to their value: setting the other value is refused
    depends: Mapping[str, tuple[str, ...]]  # gate -> gates it needs enabled
    points: Mapping[str, Mapping[str, bool]] | None = None  # plugin -> point -> implements, where settled


@cache
def _all() -> dict[int, BinaryFacts]:
    raw = json.loads(read_data("binary-facts.json"))
    return {int(minor): BinaryFacts(item["version"], frozenset(item["flags"]),
                                    {**item["gates"], **item.get("locked", {})}, dict(item.get("locked", {})),
                                    {gate: tuple(deps) for gate, deps in item["depends"].items()},
                                    item["plugins"]["points"] if "plugins" in item else None)
            for minor, item in raw.items()}


def tag(key: str, minor: tuple[int, int]) -> str:
    """The suffix every start-up refusal carries: which minor refuses it and the rule (docs/scheduler-config.md)."""
    return f" (kube-scheduler {minor[0]}.{minor[1]} exits at start-up; rule {key})"


def facts_for(minor: int | None) -> BinaryFacts | None:
    """The facts of this minor's binary, or None when it was not built (then nothing here is checked)."""
    return _all().get(minor) if minor is not None else None


def gate_settings(raw: str | None) -> dict[str, bool | None]:
    """``--feature-gates=A=true,kube:B=0`` as gate -> value, spelled as component-base takes it (trimmed,
    strconv.ParseBool); None when the value is missing or not a boolean. Only a blank item is skipped, as
    kube-scheduler skips it (probed on 1.34-1.37): ``=true`` is the gate ``""``, which it refuses."""
    found: dict[str, bool | None] = {}
    for item in (raw or "").split(","):
        name, sep, value = item.partition("=")
        if item.strip():
            found[name.strip().removeprefix("kube:")] = parse_bool(value.strip()) if sep else None
    return found


def gates_set_to(flags: Mapping[str, str | None], value: bool) -> frozenset[str]:
    """The gates the manifest's ``--feature-gates`` sets to ``value``."""
    return frozenset(gate for gate, given in gate_settings(flags.get("feature-gates")).items() if given is value)


def effective_gates(flags: Mapping[str, str | None], minor: int | None) -> frozenset[str] | None:
    """The gates on in this scheduler: the binary's defaults with the manifest's ``--feature-gates`` over them;
    None when the minor's defaults are not known."""
    facts = facts_for(minor)
    if facts is None:
        return None
    on = {gate for gate, default in facts.gates.items() if default}
    return frozenset((on - gates_set_to(flags, False)) | gates_set_to(flags, True))


def flag_problems(flags: Mapping[str, str | None], minor: int | None) -> list[str]:
    """Why this minor's kube-scheduler exits on the manifest's flags before reading the config: rules
    ``flags.unknown`` and ``featureGates.*``; nothing for a minor not built."""
    facts = facts_for(minor)
    if facts is None or minor is None:
        return []
    problems = [f"--{name}: not a flag of kube-scheduler{tag('flags.unknown', (1, minor))}"
                for name in flags if name not in facts.flags and name != "config"]
    settings = gate_settings(flags.get("feature-gates"))
    for gate, value in settings.items():
        if value is None:
            problems.append(
                f"--feature-gates: {gate or 'an entry without a gate name'} needs the value true or false (or "
                f"another spelling of Go's strconv.ParseBool: 1, t, T, TRUE, True, 0, f, F, FALSE, False)"
                f"{tag('featureGates.value', (1, minor))}"
            )
        elif not gate:
            problems.append(f"--feature-gates: an entry gives a value but no gate name, as in =true (write "
                            f"Name=true){tag('featureGates.unknown', (1, minor))}")
        elif gate in facts.locked and value != facts.locked[gate]:
            problems.append(f"--feature-gates: {gate} is locked to {str(facts.locked[gate]).lower()}"
                            f"{tag('featureGates.locked', (1, minor))}")
        elif gate not in facts.gates:
            problems.append(f"--feature-gates: {gate} is not a feature gate of this scheduler"
                            f"{tag('featureGates.unknown', (1, minor))}")
    on = effective_gates(flags, minor) or frozenset()
    for gate in sorted(on):
        missing = [dep for dep in facts.depends.get(gate, ()) if dep not in on]
        if missing and gate in facts.gates:
            problems.append(f"--feature-gates: {gate} is enabled but depends on {', '.join(missing)}, which is "
                            f"off{tag('featureGates.dependency', (1, minor))}")
    return problems


def implements(name: str, point: str, minor: int | None) -> bool | None:
    """Whether this minor's binary builds plugin ``name`` at ``point``; None where the binary did not settle it."""
    facts = facts_for(minor)
    if facts is None or facts.points is None:
        return None
    return facts.points.get(name, {}).get(point)
