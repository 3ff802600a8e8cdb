"""What kube-scheduler refuses at start-up outside ``validation.go``, and the one table of every rule's minors.

After validating its config, kube-scheduler applies the ``--leader-elect*`` flags over it (1.23 and later),
creates the leader-election lock (client-go refuses lock types it dropped) and builds one framework per profile
(``NewFramework``: every enabled plugin must exist and implement its extension point, nothing twice, exactly one
queueSort and at least one bind plugin after defaults and the multiPoint expansion); any failure makes it exit.

Which minors each refusal holds for, and which minors register each in-tree plugin, is data:
``schemas/rules.json``, hand-checked against the upstream source or PR each entry names (the table in
docs/scheduler-config.md is generated from it). A boundary not read upstream is not enforced: a rule applied to
a minor that does not have it refuses a config the scheduler accepts, which is as wrong as a missing rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, TypeGuard

from patcher.core.schedconfig import binary
from patcher.core.schedconfig.duration import is_duration, parse_duration_ns
from patcher.core.schedconfig.flags import CARRIED, parse_bool
from patcher.core.schedconfig.schema import Schema, minor_of, read_data, registry
from patcher.core.schedconfig.version import Launch

Minor = tuple[int, int]
DEFAULT_SCHEDULER_NAME = "default-scheduler"
_UNKNOWN = "framework.unknownPlugin"


@dataclass(frozen=True)
class Rule:
    """One refusal, of ``validation.go`` (``rules.py``) or at start-up outside it (here)."""

    key: str
    cls: str  # validation | framework | resourceLock | pluginArgs | flags
    first: Minor
    last: Minor | None  # None: still in the newest minor
    what: str
    source: str

    def holds(self, minor: Minor | None) -> bool:
        """Unknown minor: the newest behaviour."""
        if minor is None:
            return self.last is None
        return self.first <= minor and (self.last is None or minor <= self.last)


@dataclass(frozen=True)
class Plugin:
    """One in-tree plugin: the minors it is registered in, and every extension point it implemented in any
    of them (a superset where unsure: a point outside it is refused at every minor, so it must be certain)."""

    first: Minor
    last: Minor | None
    points: frozenset[str] | None  # None: not verified, never refused for its extension point
    source: str
    first_exact: bool = True  # False: not refused as unknown before ``first`` (boundary not read upstream)
    last_exact: bool = True
    always: frozenset[str] = frozenset()  # points it implements in every minor of its life (a subset of points)

    def registered(self, minor: Minor) -> bool | None:
        """True / False, or None when the minor lies on a side whose boundary is not verified."""
        if minor < self.first:
            return False if self.first_exact else None
        if self.last is not None and minor > self.last:
            return False if self.last_exact else None
        return True


def _first(text: str) -> Minor:
    minor = minor_of(text)
    assert minor is not None, "rules.json: every rule and plugin has a first minor"
    return minor


def _table() -> tuple[tuple[Rule, ...], dict[str, Plugin]]:
    raw = json.loads(read_data("rules.json"))
    rules = tuple(Rule(r["key"], r["class"], _first(r["first"]), minor_of(r["last"]), r["what"], r["source"])
                  for r in raw["rules"])
    plugins = {
        name: Plugin(_first(p["first"]), minor_of(p["last"]),
                     frozenset(p["points"]) if p["points"] is not None else None, p["source"],
                     p.get("firstExact", True), p.get("lastExact", True), frozenset(p.get("always", ())))
        for name, p in raw["plugins"].items()
    }
    return rules, plugins


RULES, PLUGINS = _table()
RULE_BY_KEY = {rule.key: rule for rule in RULES}
QUEUE_SORT_PLUGINS = frozenset(name for name, p in PLUGINS.items() if p.points and "queueSort" in p.points)
BIND_PLUGINS = frozenset(name for name, p in PLUGINS.items() if p.points and "bind" in p.points)
INVALID_VOLUME_LIMITS = ("AzureDiskLimits", "CinderLimits", "EBSLimits", "GCEPDLimits")
LOCK_TYPES = ("leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases")  # client-go interface.go
# --leader-elect* flags -> the leaderElection field each sets and its type (component-base BindLeaderElectionFlags)
LEADER_ELECTION_FLAGS = {flag: (str(path[1]), kind) for flag, (path, kind) in CARRIED.items()
                         if flag.startswith("leader-elect")}
# Image repositories that run upstream's kube-scheduler binary (and so only the in-tree registry).
UPSTREAM_IMAGES = ("kube-scheduler", "hyperkube", "hardened-kubernetes")


def point_interface(point: str) -> str:
    """The Go interface ``NewFramework`` names for an extension point: ``<Field>Plugin`` (the points are the
    fields of the minor's generated ``Plugins`` type but ``multiPoint``; the generator checks the interfaces)."""
    return point[0].upper() + point[1:] + "Plugin"


def holds(key: str, minor: Minor | None) -> bool:
    return RULE_BY_KEY[key].holds(minor)


def tag(key: str, minor: Minor | None) -> str:
    """The suffix every refusal carries: which minor refuses it and the rule (docs/scheduler-config.md)."""
    shown = f"kube-scheduler {minor[0]}.{minor[1]}" if minor is not None else "kube-scheduler"
    return f" ({shown} exits at start-up; rule {key})"


def is_int(value: Any) -> TypeGuard[int]:
    """An integer as the decoder sees it (YAML's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_map(value: Any) -> Mapping[Any, Any]:
    """A decoded mapping, or an empty one when the value has another type (the type check reports it)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _names(plugin_set: Any) -> list[str]:
    return [name for p in as_list(as_map(plugin_set).get("enabled")) if isinstance(name := as_map(p).get("name"), str)]


def _disabled(plugin_set: Any) -> set[str]:
    return {name for p in as_list(as_map(plugin_set).get("disabled")) if isinstance(name := as_map(p).get("name"), str)}


# ---- flags applied over the config --------------------------------------------------------------------------


def _flag_value(flag: str, raw: str | None) -> Any:
    kind = LEADER_ELECTION_FLAGS[flag][1]
    if kind == "bool":
        return parse_bool(raw)
    if kind == "duration":
        return raw if raw is not None and is_duration(raw) else None
    return raw


def _zero_flag_problems(data: Mapping[str, Any], minor: Minor, launch: Launch | None) -> list[str]:
    """A ``--leader-elect-*`` duration flag of zero or less: applied after the config's defaults, it is not
    replaced by the default (as a zero in the config is), and validation refuses it while leader election is on."""
    if launch is None or not flags_apply(minor) or as_map(data.get("leaderElection")).get("leaderElect") is False:
        return []
    problems = []
    for flag, raw in launch.leader_election:
        value = _flag_value(flag, raw)
        if LEADER_ELECTION_FLAGS[flag][1] == "duration" and isinstance(value, str) and parse_duration_ns(value) <= 0:
            problems.append(f"leaderElection.{LEADER_ELECTION_FLAGS[flag][0]}: the manifest's --{flag}={raw} must "
                            f"be greater than zero{tag('flags.leaderElectionZero', minor)}")
    return problems


def flags_apply(minor: Minor | None) -> bool:
    return holds("flags.leaderElection", minor)


def effective(data: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """The config the scheduler validates and runs: the document with the manifest's ``--leader-elect*`` flags
    applied over ``leaderElection`` (1.23 and later; before, ``--config`` silenced them)."""
    launch = schema.node_launch
    if launch is None or not launch.leader_election or not flags_apply(schema.node_minor):
        return data
    election = dict(as_map(data.get("leaderElection")))
    for flag, raw in launch.leader_election:
        value = _flag_value(flag, raw)
        if value is not None:  # an unreadable value is refused where the flags are read
            election[LEADER_ELECTION_FLAGS[flag][0]] = value
    return {**data, "leaderElection": election}


def override_notes(data: Mapping[str, Any], minor: Minor | None, launch: Launch | None) -> list[str]:
    """One note per manifest flag that replaces a value the config sets (what ``plan`` shows)."""
    if launch is None or not flags_apply(minor):
        return []
    election = as_map(data.get("leaderElection"))
    notes = []
    shown_minor = f"{minor[0]}.{minor[1]}" if minor else "this"
    for flag, raw in launch.leader_election:
        field = LEADER_ELECTION_FLAGS[flag][0]
        value = _flag_value(flag, raw)
        if field in election and value is not None and election[field] != value:
            notes.append(
                f"the manifest's --{flag}{'' if raw is None else '=' + raw} overrides leaderElection.{field}="
                f"{election[field]!r} of the config (kube-scheduler {shown_minor} applies --leader-elect* flags "
                "over --config)"
            )
    return notes


# ---- resource lock --------------------------------------------------------------------------------------------


def _lock_problems(data: Mapping[str, Any], minor: Minor, launch: Launch | None) -> list[str]:
    election = as_map(data.get("leaderElection"))
    if election.get("leaderElect") is False:
        return []
    lock = election.get("resourceLock")
    if not isinstance(lock, str) or not lock or minor >= (1, 27):  # 1.27+: validation.go wants leases (rules.py)
        return []
    flagged = launch is not None and flags_apply(minor) and any(
        f == "leader-elect-resource-lock" for f, _ in launch.leader_election
    )
    origin = " (from the manifest's --leader-elect-resource-lock)" if flagged else ""
    path = "leaderElection.resourceLock"
    if lock not in LOCK_TYPES:
        return [f"{path}: invalid lock-type {lock!r}{origin}{tag('resourceLock.unknown', minor)}"]
    if lock in ("endpoints", "configmaps") and holds("resourceLock.endpoints", minor):
        return [
            f"{path}: the {lock} lock was removed from client-go, migrate to {lock}leases then leases{origin}"
            f"{tag('resourceLock.endpoints', minor)}"
        ]
    if lock in ("endpointsleases", "configmapsleases") and holds("resourceLock.migration", minor):
        rule = "resourceLock.migration"
        return [f"{path}: the {lock} lock was removed from client-go, use leases{origin}{tag(rule, minor)}"]
    return []


# ---- framework construction ----------------------------------------------------------------------------------


def _exists(name: str, minor: Minor, launch: Launch | None) -> bool:
    """False only when the scheduler certainly has no such plugin: an upstream image and a name its registry of
    this minor lacks (a boundary that was not verified counts as present)."""
    upstream = launch is not None and launch.upstream_image
    names = registry(minor) if upstream else None
    if names is not None:  # the minor's registry, generated from its source
        return name in names
    plugin = PLUGINS.get(name)
    if plugin is not None:
        return plugin.registered(minor) is not False
    return not upstream


_WEIGHT = "framework.scoreWeight"


def _hint(name: str, minor: Minor) -> str:
    """``; did you mean 'NodeResourcesFit'?`` for a typo of a plugin this minor registers."""
    known = sorted(registry(minor) or (n for n, p in PLUGINS.items() if p.registered(minor)))
    close = get_close_matches(name, known, n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close and close[0] != name else ""


def _implements(name: str, point: str, minor: Minor) -> bool | None:
    """Whether ``name`` extends ``point``: the minor's binary where it settled it (what runs decides), else the union of
    every minor's points in ``PLUGINS``."""
    proven = binary.implements(name, point, minor[1])
    if proven is not None:
        return proven
    plugin = PLUGINS.get(name)
    if plugin is None or plugin.points is None:
        return None
    return point in plugin.points


def _uses_multipoint(api_version: str, minor: Minor) -> bool:
    """v1beta3 and v1 fill their defaults through multiPoint (1.23 and later); v1beta1/v1beta2 per point."""
    return minor >= (1, 23) and api_version.rsplit("/", 1)[-1] in ("v1beta3", "v1")


def _profile_problems(profile: Mapping[Any, Any], where: str, schema: Schema, minor: Minor) -> list[str]:
    launch = schema.node_launch
    plugins = as_map(profile.get("plugins"))
    given = profile.get("schedulerName")
    scheduler = given if isinstance(given, str) else DEFAULT_SCHEDULER_NAME
    problems: list[str] = []
    multipoint = _uses_multipoint(schema.api_version, minor)
    spec = schema.types.get("Plugins")
    points = [p for p in (spec.fields if spec is not None else ()) if p != "multiPoint"]  # this minor's points
    # each plugin set read once (the document is a ruamel mapping, slow to walk): point -> names
    wanted = {*points, "multiPoint"}
    enabled = {point: _names(sets) for point, sets in plugins.items() if point in wanted}
    disabled = {point: _disabled(sets) for point, sets in plugins.items() if point in wanted}
    for point in points:
        seen: set[str] = set()
        for index, name in enumerate(enabled.get(point, ())):
            path = f"{where}.plugins.{point}.enabled[{index}]"
            if not _exists(name, minor, launch):
                problems.append(f"{path}: {point_interface(point)} {name!r} does not exist{_hint(name, minor)}"
                                f"{tag(_UNKNOWN, minor)}")
                continue
            if _implements(name, point, minor) is False:
                problems.append(
                    f"{path}: plugin {name!r} does not extend {point_interface(point)}"
                    f"{tag('framework.extensionPoint', minor)}"
                )
                continue
            if name in seen:
                problems.append(
                    f"{path}: plugin {name!r} already registered as {point_interface(point)!r}"
                    f"{tag('framework.duplicate', minor)}"
                )
            seen.add(name)
    for index, plugin in enumerate(as_list(as_map(plugins.get("score")).get("enabled"))):
        weight = as_map(plugin).get("weight")
        if is_int(weight) and weight < 0 and holds(_WEIGHT, minor):
            problems.append(
                f"{where}.plugins.score.enabled[{index}].weight: {weight} is negative: total score of Score plugins "
                f"could overflow{tag(_WEIGHT, minor)}"
            )
    custom_multi = enabled.get("multiPoint", []) if multipoint else []
    for index, name in enumerate(custom_multi):
        if not _exists(name, minor, launch):
            problems.append(
                f"{where}.plugins.multiPoint.enabled[{index}]: {name!r} does not exist{_hint(name, minor)}"
                f"{tag(_UNKNOWN, minor)}"
            )
    sets = (enabled, disabled)
    problems += _multipoint_duplicates(sets, custom_multi, points, where, minor)
    for point in ("queueSort", "bind"):
        problems += _count(sets, custom_multi, point, f"{where}.plugins", scheduler, multipoint, minor)
    return problems


_Sets = tuple[dict[str, list[str]], dict[str, set[str]]]  # per point: enabled names, disabled names
_DEFAULTS = {"queueSort": "PrioritySort", "bind": "DefaultBinder"}  # the one default plugin of each point


def _multipoint_duplicates(
    sets: _Sets, custom_multi: list[str], points: list[str], where: str, minor: Minor
) -> list[str]:
    """expandMultiPointPlugins: a name listed twice in multiPoint stays twice after the merge with the defaults
    (the last replaces the default, the first is appended), and fails at the first point it implements where it
    is neither disabled nor enabled explicitly."""
    problems = []
    for name in dict.fromkeys(n for n in custom_multi if custom_multi.count(n) > 1):
        plugin = PLUGINS.get(name)
        if plugin is None:
            continue  # which points it implements is not known here
        for point in points:
            disabled = sets[1].get(point, set())
            if "*" in disabled or name in disabled or name in sets[0].get(point, ()):
                continue
            proven = binary.implements(name, point, minor[1])
            if point in plugin.always or proven:  # certain (every minor, or this minor's binary): met here
                problems.append(
                    f"{where}.plugins.multiPoint.enabled: plugin {name!r} already registered as "
                    f"{point_interface(point)!r}{tag('framework.multiPointDuplicate', minor)}"
                )
                break
    return problems


def _count(sets: _Sets, custom_multi: list[str], point: str, where: str, scheduler: str, multipoint: bool,
           minor: Minor) -> list[str]:
    """How many queueSort / bind plugins the profile ends with, as NewFramework counts them; nothing when an
    out-of-tree plugin in multiPoint might add one."""
    default, implementers = _DEFAULTS[point], QUEUE_SORT_PLUGINS if point == "queueSort" else BIND_PLUGINS
    own, disabled = sets[0].get(point, []), sets[1].get(point, set())
    if multipoint:
        multi_disabled = sets[1].get("multiPoint", set())
        merged = [] if "*" in multi_disabled or default in multi_disabled else [default]
        merged += [n for n in custom_multi if n not in merged]
        if any(n not in PLUGINS for n in merged):  # in-tree, only PrioritySort / DefaultBinder sort or bind
            return []
        extra = [n for n in merged if n in implementers and n not in disabled and n not in own]
        extra = [] if "*" in disabled else extra
        total = len(own) + len(extra)
    else:  # mergePluginSet with the per-point default set
        keep_default = "*" not in disabled and default not in disabled and default not in own
        total = len(own) + (1 if keep_default else 0)
    key = f"framework.{point}"
    if point == "queueSort" and total != 1 and not (total > 1 and len(own) > 1):  # >1 in one list: validation says it
        return [
            f"{where}: only one queue sort plugin required for profile with scheduler name {scheduler!r}, "
            f"but got {total} after defaults, disables and multiPoint{tag(key, minor)}"
        ]
    if point == "bind" and total == 0:
        return [
            f"{where}: at least one bind plugin is needed for profile with scheduler name {scheduler!r} "
            f"after defaults, disables and multiPoint{tag(key, minor)}"
        ]
    return []


def config_problems(data: Mapping[str, Any], minor: Minor, launch: Launch | None) -> list[str]:
    """The start-up refusals of the whole config (lock, flags); the profiles' are ``profile_problems``."""
    return _lock_problems(data, minor, launch) + _zero_flag_problems(data, minor, launch)


def profile_problems(profile: Mapping[Any, Any], where: str, schema: Schema, minor: Minor) -> list[str]:
    """The start-up refusals of one profile: framework construction, then the plugin args read when built."""
    return _profile_problems(profile, where, schema, minor) + _dra_problems(profile, where, minor, schema.node_launch)


def upstream_image(image: str | None) -> bool:
    """Whether the manifest's image runs upstream's kube-scheduler binary (``registry.k8s.io/kube-scheduler``,
    a mirror of it, hyperkube, RKE2's hardened-kubernetes): then only the in-tree registry exists."""
    if not image:
        return False
    name = image.strip().split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return name in UPSTREAM_IMAGES


def launch_for(flags: Mapping[str, str | None], image: str | None) -> Launch:
    return Launch(
        # as written: options.ApplyLeaderElectionTo applies those the command line changed
        leader_election=tuple((flag, flags[flag]) for flag in LEADER_ELECTION_FLAGS if flag in flags),
        upstream_image=upstream_image(image),
        # gates that --feature-gates=A=false switches off: a gated field is then refused whatever the default
        gates_off=binary.gates_set_to(flags, False),
    )


# ---- plugin args checked when the plugin is built ----------------------------------------------------------------


def _dra_problems(profile: Mapping[Any, Any], where: str, minor: Minor, launch: Launch | None) -> list[str]:
    """ValidateDynamicResourcesArgs (called with the scheduler's feature gates): a timeout is refused when its gate
    is off and below its minimum when on. Only what holds whatever the gates' defaults of this minor: a
    bindingTimeout under 1s, or a timeout whose gate the manifest switches off. Not checked when the profile
    disables DynamicResources (its args are then not used to build it)."""
    multi = as_map(as_map(profile.get("plugins")).get("multiPoint"))
    # validation.go checks every pluginConfig's args, built or not: kube-scheduler 1.35 exits on a forbidden
    # bindingTimeout of a disabled DynamicResources (its binary shows it); unproven minors keep the source's reading
    if {"*", "DynamicResources"} & _disabled(multi) and binary.facts_for(minor[1]) is None:
        return []
    off = launch.gates_off if launch is not None else frozenset()
    problems = []
    for index, config in enumerate(as_list(profile.get("pluginConfig"))):
        if as_map(config).get("name") != "DynamicResources":
            continue
        args = as_map(as_map(config).get("args"))
        path = f"{where}.pluginConfig[{index}].args"
        timed = args.get("filterTimeout") is not None and holds("pluginArgs.draFilterTimeout", minor)
        if timed and "DRASchedulerFilterTimeout" in off:
            problems.append(
                f"{path}.filterTimeout: forbidden, the DRASchedulerFilterTimeout feature gate is off in the "
                f"manifest{tag('pluginArgs.draFilterTimeout', minor)}"
            )
        binding = args.get("bindingTimeout")
        if binding is not None and holds("pluginArgs.draBindingTimeout", minor):
            gates = {"DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"} & off
            ns = parse_duration_ns(binding) if isinstance(binding, str) and is_duration(binding) else None
            if gates:
                problems.append(
                    f"{path}.bindingTimeout: forbidden, the {' and '.join(sorted(gates))} feature gate is off in "
                    f"the manifest{tag('pluginArgs.draBindingTimeout', minor)}"
                )
            elif ns is not None and ns < 10**9:
                problems.append(
                    f"{path}.bindingTimeout: must be at least 1 second (forbidden if its gates are off)"
                    f"{tag('pluginArgs.draBindingTimeout', minor)}"
                )
    return problems
