"""kube-scheduler's refusals of a KubeSchedulerConfiguration, ported: one table, one walk, one message per rule.

kube-scheduler fills defaults, then validates (``pkg/scheduler/apis/config/validation``), applies the
``--leader-elect*`` flags over the config (1.23 and later), creates the leader-election lock and builds one
framework per profile (``NewFramework``); any failure makes it exit. Several rules bite only *after* defaulting
(a lone ``leaseDuration: 5s`` is not longer than the default 10 s renew deadline), so every rule reads the value the
scheduler will see. Two more catch what makes it exit later: a relative kubeconfig path, and an extender whose URL
or TLS material its client cannot be built from. Values of the wrong type are skipped: the type check reports them.

Which minors each rule holds for, and which minors register each in-tree plugin, is data: ``schemas/rules.json``,
hand-checked against the upstream source or PR each entry names (docs/scheduler-config.md's table is generated
from it). A boundary not read upstream is not enforced: a rule applied to a minor that does not have it refuses a
config the scheduler accepts, which is as wrong as a missing rule.
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from difflib import get_close_matches
from typing import Any, TypeGuard

from patcher.core.schedconfig import binary
from patcher.core.schedconfig.binary import tag
from patcher.core.schedconfig.duration import is_duration, parse_duration_ns
from patcher.core.schedconfig.flags import CARRIED, parse_bool
from patcher.core.schedconfig.gourl import url_problem
from patcher.core.schedconfig.schema import Schema, minor_of, read_data, registry
from patcher.core.schedconfig.version import Launch

Minor = tuple[int, int]
DEFAULT_SCHEDULER_NAME = "default-scheduler"


@dataclass(frozen=True)
class Rule:
    """One refusal, of ``validation.go`` or at start-up outside it."""

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
                     frozenset(p["points"]) if p["points"] is not None else None,
                     p.get("firstExact", True), p.get("lastExact", True), frozenset(p.get("always", ())))
        for name, p in raw["plugins"].items()
    }
    return rules, plugins


RULES, PLUGINS = _table()
RULE_BY_KEY = {rule.key: rule for rule in RULES}
INVALID_VOLUME_LIMITS = frozenset(name for name, plugin in PLUGINS.items() if plugin.last == (1, 31))  # left in 1.32
LOCK_TYPES = ("leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases")  # client-go interface.go
# --leader-elect* flags -> the leaderElection field each sets and its type (component-base BindLeaderElectionFlags)
LEADER_ELECTION_FLAGS = {flag: (str(path[1]), kind) for flag, (path, kind) in CARRIED.items()
                         if flag.startswith("leader-elect")}
# Image repositories that run upstream's kube-scheduler binary, and so only the in-tree registry
# (registry.k8s.io/kube-scheduler or a mirror of it, hyperkube, RKE2's hardened-kubernetes).
UPSTREAM_IMAGES = ("kube-scheduler", "hyperkube", "hardened-kubernetes")


def point_interface(point: str) -> str:
    """The Go interface ``NewFramework`` names for an extension point: ``<Field>Plugin`` (the points are the
    fields of the minor's generated ``Plugins`` type but ``multiPoint``; the generator checks the interfaces)."""
    return point[0].upper() + point[1:] + "Plugin"


def holds(key: str, minor: Minor | None) -> bool:
    return RULE_BY_KEY[key].holds(minor)


def is_int(value: Any) -> TypeGuard[int]:
    """An integer as the decoder sees it (YAML's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_map(value: Any) -> Mapping[Any, Any]:
    """A decoded mapping, or an empty one when the value has another type (the type check reports it)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _names(plugin_set: Any, key: str) -> list[str]:
    """The names of a plugin set's ``enabled`` or ``disabled`` list."""
    return [name for p in as_list(as_map(plugin_set).get(key)) if isinstance(name := as_map(p).get("name"), str)]


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


def override_notes(data: Mapping[str, Any], minor: Minor, launch: Launch | None) -> list[str]:
    """One note per manifest flag that replaces a value the config sets (what ``plan`` shows)."""
    if launch is None or not flags_apply(minor):
        return []
    election = as_map(data.get("leaderElection"))
    notes = []
    for flag, raw in launch.leader_election:
        field = LEADER_ELECTION_FLAGS[flag][0]
        value = _flag_value(flag, raw)
        if field in election and value is not None and election[field] != value:
            notes.append(
                f"the manifest's --{flag}{'' if raw is None else '=' + raw} overrides leaderElection.{field}="
                f"{election[field]!r} of the config (kube-scheduler {minor[0]}.{minor[1]} applies --leader-elect* "
                "flags over --config)"
            )
    return notes


# ---- resource lock --------------------------------------------------------------------------------------------


def _lock_problems(data: Mapping[str, Any], minor: Minor, launch: Launch | None) -> list[str]:
    election = as_map(data.get("leaderElection"))
    if election.get("leaderElect") is False:
        return []
    lock = election.get("resourceLock")
    if not isinstance(lock, str) or not lock or holds("leaderElection.resourceLock", minor):  # validation's then
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


def _does_not_exist(name: str, minor: Minor) -> str:
    """The refusal of an unknown plugin, at a point or in multiPoint, with ``; did you mean 'NodeResourcesFit'?``
    for a typo of a plugin this minor registers."""
    known = sorted(registry(minor) or (n for n, p in PLUGINS.items() if p.registered(minor)))
    close = get_close_matches(name, known, n=1, cutoff=0.8)
    hint = f"; did you mean {close[0]!r}?" if close and close[0] != name else ""
    return f"{name!r} does not exist{hint}{tag('framework.unknownPlugin', minor)}"


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


def _framework_problems(
    profile: Mapping[Any, Any], where: str, schema: Schema, minor: Minor, points: list[str]
) -> list[str]:
    launch = schema.node_launch
    plugins = as_map(profile.get("plugins"))
    given = profile.get("schedulerName")
    scheduler = given if isinstance(given, str) else DEFAULT_SCHEDULER_NAME
    problems: list[str] = []
    multipoint = minor >= (1, 23) and _multipoint(schema)
    # each plugin set read once (the document is a ruamel mapping, slow to walk): point -> names
    wanted = {*points, "multiPoint"}
    enabled = {point: _names(sets, "enabled") for point, sets in plugins.items() if point in wanted}
    disabled = {point: set(_names(sets, "disabled")) for point, sets in plugins.items() if point in wanted}
    for point in points:
        seen: set[str] = set()
        for index, name in enumerate(enabled.get(point, ())):
            path = f"{where}.plugins.{point}.enabled[{index}]"
            if not _exists(name, minor, launch):
                problems.append(f"{path}: {point_interface(point)} {_does_not_exist(name, minor)}")
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
        if is_int(weight) and weight < 0 and holds("framework.scoreWeight", minor):
            problems.append(
                f"{where}.plugins.score.enabled[{index}].weight: {weight} is negative: total score of Score plugins "
                f"could overflow{tag('framework.scoreWeight', minor)}"
            )
    custom_multi = enabled.get("multiPoint", []) if multipoint else []
    for index, name in enumerate(custom_multi):
        if not _exists(name, minor, launch):
            problems.append(f"{where}.plugins.multiPoint.enabled[{index}]: {_does_not_exist(name, minor)}")
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
    default, implementers = _DEFAULTS[point], {name for name, p in PLUGINS.items() if p.points and point in p.points}
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


def launch_for(flags: Mapping[str, str | None], image: str | None) -> Launch:
    name = (image or "").strip().split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]  # the image's repository
    return Launch(
        # as written: options.ApplyLeaderElectionTo applies those the command line changed
        leader_election=tuple((flag, flags[flag]) for flag in LEADER_ELECTION_FLAGS if flag in flags),
        upstream_image=name in UPSTREAM_IMAGES,
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
    if {"*", "DynamicResources"} & set(_names(multi, "disabled")) and binary.facts_for(minor[1]) is None:
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


# Defaults (pkg/scheduler/apis/config/v1*/defaults.go SetDefaults_KubeSchedulerConfiguration, component-base
# RecommendedDefaultLeaderElectionConfiguration): the same in v1beta2, v1beta3 and v1 for what is validated.
_DEFAULT_INITIAL_BACKOFF = 1
_DEFAULT_MAX_BACKOFF = 10
_DEFAULT_ELECTION = {"leaseDuration": "15s", "renewDeadline": "10s", "retryPeriod": "2s"}
_MAX_CUSTOM_PRIORITY_SCORE = 10  # config.MaxCustomPriorityScore

# isPluginInvalid: plugins removed from the registry, refused by name. v1beta2's list (the plugins whose last minor
# is 1.22) holds from its start for every later apiVersion (the loop walks the versions in order).
_REMOVED_IN_V1BETA2 = frozenset(name for name, plugin in PLUGINS.items() if plugin.last == (1, 22))
# Refused in v1 only, from the minor in RULES (framework.invalid*): SelectorSpread from v1's start,
# the in-tree volume-limit plugins from 1.31.
_INVALID_IN_V1 = {name: "framework.invalidVolumeLimits" for name in INVALID_VOLUME_LIMITS} | {
    "SelectorSpread": "framework.invalidSelectorSpread"
}
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


# ---- reading values the way the scheduler sees them ---------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if is_int(value) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _duration(given: Mapping[Any, Any], key: str) -> int | None:
    """A leaderElection duration after RecommendedDefault*: zero or absent means the default; None if unreadable."""
    value = given.get(key)
    if value is not None and not isinstance(value, str):
        return None
    try:
        ns = parse_duration_ns(value) if value is not None else 0
    except ValueError:
        return None
    return ns or parse_duration_ns(_DEFAULT_ELECTION[key])


def qualified_name_problem(name: str) -> str | None:
    """apimachinery ``validation.IsQualifiedName`` (also ``ValidateLabelName``), first reason only."""
    prefix, slash, local = name.rpartition("/")
    if slash and not prefix:
        return "prefix part must be non-empty"
    if slash and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if not local:
        return "name part must be non-empty"
    if len(local) > 63:
        return "name part must be no more than 63 characters"
    if not _LABEL_NAME.fullmatch(local):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and start and end with one"
    return None


# ---- the configuration ------------------------------------------------------------------------------------------


def _client_connection(data: Mapping[str, Any]) -> list[str]:
    connection = as_map(data.get("clientConnection"))
    problems = []
    kubeconfig = _str(connection.get("kubeconfig"))
    if kubeconfig and not posixpath.isabs(kubeconfig):
        problems.append(
            f"clientConnection.kubeconfig: must be an absolute path inside the scheduler container, got "
            f"{kubeconfig!r} (kube-scheduler exits when it cannot read it)"
        )
    burst = _int(connection.get("burst"))
    if burst is not None and burst < 0:
        problems.append("clientConnection.burst: must be non-negative")
    return problems


def _leader_election(data: Mapping[str, Any], schema: Schema) -> list[str]:
    election = as_map(data.get("leaderElection"))
    if election.get("leaderElect") is False:
        return []
    problems = []
    lock = election.get("resourceLock")
    leases_only = holds("leaderElection.resourceLock", schema.node_minor)
    if leases_only and isinstance(lock, str) and lock and lock != "leases":
        problems.append(f'leaderElection.resourceLock: must be "leases", got {lock!r}')
    lease, renew, retry = (_duration(election, key) for key in _DEFAULT_ELECTION)
    if lease is not None and renew is not None and lease <= renew:
        shown = f"{_shown('leaseDuration', election)} <= {_shown('renewDeadline', election)}"
        problems.append(f"leaderElection.leaseDuration: must be greater than renewDeadline ({shown})")
    # client-go leaderelection.NewLeaderElector: the scheduler exits when it cannot build its elector.
    if renew is not None and retry is not None and renew * 5 <= retry * 6:
        shown = f"{_shown('renewDeadline', election)} vs {_shown('retryPeriod', election)}"
        problems.append(f"leaderElection.renewDeadline: must be greater than retryPeriod*1.2 ({shown})")
    return problems


def _shown(key: str, given: Mapping[Any, Any]) -> str:
    """``5s`` as written, or ``10s, the default``: a rule that bites after defaulting must say so."""
    written = given.get(key)
    if isinstance(written, str) and parse_duration_ns(written) != 0:
        return written
    return f"{_DEFAULT_ELECTION[key]}, the default"


def _top_level(data: Mapping[str, Any]) -> list[str]:
    problems = []
    parallelism = _int(data.get("parallelism"))
    if parallelism is not None and parallelism <= 0:
        problems.append("parallelism: should be an integer value greater than zero")
    problems += _percentage("percentageOfNodesToScore", data.get("percentageOfNodesToScore"))
    initial = _int(data.get("podInitialBackoffSeconds"))
    if initial is None and data.get("podInitialBackoffSeconds") is not None:
        return problems  # a type error
    initial = _DEFAULT_INITIAL_BACKOFF if initial is None else initial
    given_maximum = data.get("podMaxBackoffSeconds")
    maximum = _DEFAULT_MAX_BACKOFF if given_maximum is None else _int(given_maximum)
    if initial <= 0:
        problems.append("podInitialBackoffSeconds: must be greater than 0")
    if maximum is not None and maximum < initial:
        default = ", the default" if given_maximum is None else ""
        problems.append(
            f"podMaxBackoffSeconds: must be greater than or equal to podInitialBackoffSeconds "
            f"({maximum}{default} < {initial})"
        )
    return problems


def _percentage(path: str, value: Any) -> list[str]:
    number = _int(value)
    return [f"{path}: not in valid range [0-100]"] if number is not None and not 0 <= number <= 100 else []


def _profiles(data: Mapping[str, Any], schema: Schema, minor: Minor | None, at_start: list[str]) -> list[str]:
    """Validation's problems of the profiles; start-up's (with a minor to judge) are added to ``at_start``."""
    given = as_list(data.get("profiles"))
    profiles = [p if isinstance(p, Mapping) else {} for p in given]
    if not profiles:
        return []  # defaulting adds one profile named default-scheduler
    problems: list[str] = []
    spec = schema.types.get("Plugins")
    points = [p for p in (spec.fields if spec is not None else ()) if p != "multiPoint"]  # the minor's points
    seen: dict[str, int] = {}
    for index, profile in enumerate(profiles):
        path = f"profiles[{index}]"
        name = profile.get("schedulerName")
        if name is None and len(profiles) == 1:
            name = DEFAULT_SCHEDULER_NAME  # "Only apply a default scheduler name when there is a single profile"
        if name is None or name == "":
            more = "; with more than one profile each needs its own" if len(profiles) > 1 else ""
            problems.append(f"{path}.schedulerName: required{more}")
        elif isinstance(name, str):
            if name in seen:
                problems.append(
                    f"{path}.schedulerName: {name!r} is already used by profiles[{seen[name]}]; schedulerName must "
                    "be unique"
                )
            else:
                seen[name] = index
        problems += _percentage(f"{path}.percentageOfNodesToScore", profile.get("percentageOfNodesToScore"))
        problems += _plugin_config(profile, path, schema, points)
        if minor is not None and isinstance(given[index], Mapping):
            at_start += _framework_problems(profile, path, schema, minor, points)  # then the args read when built
            at_start += _dra_problems(profile, path, minor, schema.node_launch)
    problems += _queue_sort(profiles, schema)
    return problems


def _version(schema: Schema) -> str:
    """``v1beta2`` of ``kubescheduler.config.k8s.io/v1beta2``."""
    return schema.api_version.rsplit("/", 1)[-1]


def _multipoint(schema: Schema) -> bool:
    """v1beta3 and v1 fill their defaults through multiPoint (1.23 and later); v1beta1/v1beta2 per point."""
    return _version(schema) in ("v1beta3", "v1")


def _removed(name: str, schema: Schema) -> str | None:
    """isPluginInvalid: the apiVersion in which ``name`` became invalid, for this config's apiVersion (from
    v1beta2: v1beta1 still has every plugin)."""
    if name in _REMOVED_IN_V1BETA2 and _version(schema) in ("v1beta2", "v1beta3", "v1"):
        return schema.api_version.rsplit("/", 1)[0] + "/v1beta2"
    rule = _INVALID_IN_V1.get(name)
    if schema.api_version.endswith("/v1") and rule is not None and holds(rule, schema.node_minor):
        return schema.api_version
    return None


def _plugin_config(profile: Mapping[Any, Any], path: str, schema: Schema, points: list[str]) -> list[str]:
    problems = []
    plugins = as_map(profile.get("plugins"))
    for stage in points:  # validatePluginConfig's stagesToPluginSet (multiPoint is not checked upstream)
        for index, plugin in enumerate(as_list(as_map(plugins.get(stage)).get("enabled"))):
            name = _str(as_map(plugin).get("name"))
            removed = _removed(name, schema)
            if removed:
                problems.append(
                    f"{path}.plugins.{stage}.enabled[{index}]: {name} was invalid in version {removed} "
                    f"(KubeSchedulerConfiguration is version {schema.api_version}): the plugin no longer exists"
                )
    seen: set[str] = set()
    for index, config in enumerate(as_list(profile.get("pluginConfig"))):
        name = _str(as_map(config).get("name"))
        where = f"{path}.pluginConfig[{index}]"
        if name in seen:
            problems.append(f"{where}: duplicate pluginConfig for {name}")
        seen.add(name)
        removed = _removed(name, schema)
        # kube-scheduler 1.34-1.37 refuse only the v1 volume-limit plugins in pluginConfig and start with the other
        # removed ones (NodeLabel, SelectorSpread …: the binary decides); older minors keep the reading
        proven = binary.facts_for(schema.node_minor[1] if schema.node_minor else None) is not None
        if removed and (not proven or name in INVALID_VOLUME_LIMITS):
            problems.append(
                f"{where}: {name} was invalid in version {removed} (KubeSchedulerConfiguration is version "
                f"{schema.api_version})"
            )
            continue
        check = PLUGIN_ARGS.get(name)
        args = as_map(config).get("args")
        if check is not None and isinstance(args, Mapping):
            problems += check(args, f"{where}.args", schema)
    return problems


def _effective_queue_sort(profile: Mapping[Any, Any], schema: Schema) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """A profile's queueSort after defaulting (mergePluginSet), as (enabled (name, weight), disabled names).

    v1beta3 and v1 default every plugin through multiPoint, so queueSort is what the profile wrote; the older
    apiVersions have PrioritySort as the default queue sort, which the profile's own set is merged into.
    """
    queue = as_map(as_map(profile.get("plugins")).get("queueSort"))
    custom = [(_str(as_map(p).get("name")), _int(as_map(p).get("weight")) or 0) for p in as_list(queue.get("enabled"))]
    disabled = tuple(_str(as_map(p).get("name")) for p in as_list(queue.get("disabled")))
    enabled = list(custom)
    if not _multipoint(schema) and "*" not in disabled and "PrioritySort" not in disabled:
        # the default comes first, with the weight the profile gives it where it lists it too
        mine = [index for index, (name, _) in enumerate(custom) if name == "PrioritySort"]
        enabled.insert(0, enabled.pop(mine[0]) if mine else ("PrioritySort", 0))
    return tuple(enabled), disabled


def _queue_sort(profiles: list[Mapping[Any, Any]], schema: Schema) -> list[str]:
    problems = []
    canon = _effective_queue_sort(profiles[0], schema)
    if len(canon[0]) > 1:
        problems.append(
            f"profiles[0].plugins.queueSort.enabled: only one queue sort plugin can be enabled, found {len(canon[0])}"
        )
    name = canon[0][0][0] if canon[0] else None
    if name is None and "*" not in canon[1] and "PrioritySort" not in canon[1]:
        name = "PrioritySort"  # v1beta3/v1 enable it through the default multiPoint set

    def args_of(profile: Mapping[Any, Any]) -> Any:
        for config in as_list(profile.get("pluginConfig")):
            if name is not None and as_map(config).get("name") == name:
                return as_map(config).get("args")
        return None

    canon_args = args_of(profiles[0])
    for index, profile in enumerate(profiles[1:], start=1):
        if _effective_queue_sort(profile, schema) != canon:
            problems.append(f"profiles[{index}].plugins.queueSort: must be the same for all profiles")
        # NewFramework compares the queueSort plugin's args of every profile, an absent entry included: args {}
        # in one profile and none in another differ (kube-scheduler 1.34-1.37 exit)
        if name is not None and args_of(profile) != canon_args:
            problems.append(
                f"profiles[{index}].pluginConfig: the args of queueSort {name} must be the same for all profiles"
            )
    return problems


# ---- per-plugin args (after SetDefaults_<Plugin>Args) -------------------------------------------------------------


def _default_preemption(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    percentage = _int(args.get("minCandidateNodesPercentage"))
    absolute = _int(args.get("minCandidateNodesAbsolute"))
    percentage = 10 if args.get("minCandidateNodesPercentage") is None else percentage
    absolute = 100 if args.get("minCandidateNodesAbsolute") is None else absolute
    problems = []
    if percentage is not None and not 0 <= percentage <= 100:
        problems.append(f"{path}.minCandidateNodesPercentage: not in valid range [0, 100]")
    if absolute is not None and absolute < 0:
        problems.append(f"{path}.minCandidateNodesAbsolute: not in valid range [0, inf)")
    if percentage == 0 and absolute == 0:
        problems.append(
            f"{path}.minCandidateNodesPercentage: cannot be zero at the same time as minCandidateNodesAbsolute"
        )
    return problems


def _inter_pod_affinity(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    weight = _int(args.get("hardPodAffinityWeight"))
    if weight is not None and not 0 <= weight <= 100:
        return [f"{path}.hardPodAffinityWeight: not in valid range [0, 100]"]
    return []


def _requirement(req: Mapping[Any, Any], path: str, *, fields: bool) -> list[str]:
    """component-helpers nodeaffinity: nodeSelectorRequirementsAsSelector / nodeSelectorRequirementsAsFieldSelector."""
    operator = _str(req.get("operator"))
    values = [v for v in as_list(req.get("values")) if isinstance(v, str)]
    problems = []
    if fields:
        # no rule on the key: nodeSelectorRequirementsAsFieldSelector takes any (only the API server's pod
        # validation limits it to metadata.name); kube-scheduler 1.34-1.37 start with metadata.uid
        if operator not in ("In", "NotIn"):
            problems.append(f"{path}.operator: {operator!r} is not a valid field selector operator (In, NotIn)")
        elif len(values) != 1:
            problems.append(f"{path}.values: must have one element")
        return problems
    if operator in ("In", "NotIn"):
        if not values:
            problems.append(f"{path}.values: must be specified when `operator` is 'In' or 'NotIn'")
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            problems.append(f"{path}.values: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
    elif operator in ("Gt", "Lt"):
        if len(values) != 1 or not re.fullmatch(r"[-+]?\d+", values[0]):
            problems.append(f"{path}.values: must be a single integer value when `operator` is 'Gt' or 'Lt'")
    else:
        problems.append(f"{path}.operator: {operator!r} is not a valid node selector operator")
    key = _str(req.get("key"))
    reason = qualified_name_problem(key)
    if reason is not None:
        problems.append(f"{path}.key: {key!r}: {reason}")
    for v_index, value in enumerate(values):
        if operator in ("In", "NotIn") and (len(value) > 63 or not _LABEL_VALUE.fullmatch(value)):
            problems.append(f"{path}.values[{v_index}]: {value!r} is not a valid label value")
    return problems


def _term(term: Mapping[Any, Any], path: str) -> list[str]:
    problems = []
    for index, req in enumerate(as_list(term.get("matchExpressions"))):
        problems += _requirement(as_map(req), f"{path}.matchExpressions[{index}]", fields=False)
    for index, req in enumerate(as_list(term.get("matchFields"))):
        problems += _requirement(as_map(req), f"{path}.matchFields[{index}]", fields=True)
    return problems


def _node_affinity(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    affinity = as_map(args.get("addedAffinity"))
    base = f"{path}.addedAffinity"
    problems = []
    required = as_map(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for index, term in enumerate(as_list(required.get("nodeSelectorTerms"))):
        where = f"{base}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{index}]"
        problems += _term(as_map(term), where)
    for index, preferred in enumerate(as_list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))):
        where = f"{base}.preferredDuringSchedulingIgnoredDuringExecution[{index}].preference"
        problems += _term(as_map(as_map(preferred).get("preference")), where)
    return problems


def _pod_topology_spread(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    constraints = as_list(args.get("defaultConstraints"))
    defaulting = args.get("defaultingType") or "System"
    problems = []
    if defaulting not in ("System", "List"):
        problems.append(f'{path}.defaultingType: Unsupported value: {defaulting!r}: supported values: "List", "System"')
    elif defaulting == "System" and constraints:
        problems.append(f"{path}.defaultingType: must be List when defaultConstraints are not empty")
    seen: dict[tuple[str, str], int] = {}
    for index, constraint in enumerate(constraints):
        item = as_map(constraint)
        where = f"{path}.defaultConstraints[{index}]"
        skew = _int(item.get("maxSkew"))
        if skew is None or skew <= 0:
            problems.append(f"{where}.maxSkew: not in valid range (0, inf)")
        key = _str(item.get("topologyKey"))
        reason = "can not be empty" if not key else qualified_name_problem(key)
        if reason:
            problems.append(f"{where}.topologyKey: {reason}")
        action = _str(item.get("whenUnsatisfiable"))
        if not action:
            problems.append(f"{where}.whenUnsatisfiable: can not be empty")
        elif action not in ("DoNotSchedule", "ScheduleAnyway"):
            problems.append(
                f'{where}.whenUnsatisfiable: Unsupported value: {action!r}: supported values: "DoNotSchedule", '
                '"ScheduleAnyway"'
            )
        if item.get("labelSelector") is not None:
            problems.append(
                f"{where}.labelSelector: constraint must not define a selector, as they deduced for each pod"
            )
        if (key, action) in seen:
            problems.append(f"{where}: duplicate of [{seen[(key, action)]}] {{{key}, {action}}}")
        else:
            seen[(key, action)] = index
    return problems


def _shape(shape: list[Any], path: str) -> list[str]:
    """validateFunctionShape."""
    if not shape:
        return [f"{path}: at least one point must be specified"]
    points = [(_int(as_map(p).get("utilization")) or 0, _int(as_map(p).get("score")) or 0) for p in shape]
    problems = []
    for index in range(1, len(points)):
        if points[index - 1][0] >= points[index][0]:
            problems.append(f"{path}[{index}].utilization: values must be sorted in increasing order")
            break
    for index, (utilization, score) in enumerate(points):
        if not 0 <= utilization <= 100:
            problems.append(f"{path}[{index}].utilization: not in valid range [0, 100]")
        if not 0 <= score <= _MAX_CUSTOM_PRIORITY_SCORE:
            problems.append(f"{path}[{index}].score: not in valid range [0, {_MAX_CUSTOM_PRIORITY_SCORE}]")
    return problems


def _node_resources_fit(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    problems = []
    for index, name in enumerate(as_list(args.get("ignoredResources"))):
        reason = qualified_name_problem(_str(name))
        if reason:
            problems.append(f"{path}.ignoredResources[{index}]: {reason}")
    for index, group in enumerate(as_list(args.get("ignoredResourceGroups"))):
        text = _str(group)
        if "/" in text:
            problems.append(f"{path}.ignoredResourceGroups[{index}]: resource group name can't contain '/'")
        elif reason := qualified_name_problem(text):
            problems.append(f"{path}.ignoredResourceGroups[{index}]: {reason}")
    strategy = args.get("scoringStrategy")
    if strategy is None:
        return problems  # SetDefaults_NodeResourcesFitArgs: LeastAllocated on cpu and memory
    strategy = as_map(strategy)
    where = f"{path}.scoringStrategy"
    kind = strategy.get("type")
    if kind not in ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"):
        problems.append(
            f'{where}.type: Unsupported value: {kind!r}: supported values: "LeastAllocated", "MostAllocated", '
            '"RequestedToCapacityRatio"'
        )
    for index, resource in enumerate(as_list(strategy.get("resources"))):
        given = as_map(resource).get("weight")
        weight = 1 if given in (None, 0) else _int(given)  # 0/absent is defaulted to 1
        if weight is not None and not 0 < weight <= 100:
            name = as_map(resource).get("name")
            problems.append(f"{where}.resources[{index}].weight: resource weight of {name} not in valid range (0, 100]")
    ratio = strategy.get("requestedToCapacityRatio")
    minor = schema.node_minor
    if kind == "RequestedToCapacityRatio" and ratio is None:
        # 1.34+ validation (kubernetes#132120); before it NewFit dereferenced the nil field and panicked
        problems.append(f"{where}.requestedToCapacityRatio: must be specified when type is RequestedToCapacityRatio")
    if ratio is not None:
        shape = as_list(as_map(ratio).get("shape"))
        if shape or holds("pluginArgs.rtcrEmptyShape", minor):  # empty shape: checked from 1.23
            problems += _shape(shape, f"{where}.requestedToCapacityRatio.shape")
    only_with_type = RULE_BY_KEY["pluginArgs.rtcrOnlyWithType"]
    if kind != "RequestedToCapacityRatio" and ratio is not None and only_with_type.holds(minor):
        shown = "{}.{} and later".format(*only_with_type.first) if minor is None else "{}.{}".format(*minor)
        problems.append(
            f"{where}.requestedToCapacityRatio: must be nil when type is not RequestedToCapacityRatio "
            f"(kube-scheduler {shown}; rule {only_with_type.key})"
        )
    return problems


def _balanced_allocation(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    problems = []
    seen: set[str] = set()
    for index, resource in enumerate(as_list(args.get("resources"))):
        item = as_map(resource)
        name = _str(item.get("name"))
        if name in seen:
            problems.append(f"{path}.resources[{index}].name: duplicate resource {name!r}")
        seen.add(name)
        weight = item.get("weight")
        if weight not in (None, 0, 1) and _int(weight) is not None:  # 0/absent is defaulted to 1
            problems.append(f"{path}.resources[{index}].weight: must be 1")
    return problems


def _volume_binding(args: Mapping[Any, Any], path: str, schema: Schema) -> list[str]:
    problems = []
    timeout = _int(args.get("bindTimeoutSeconds"))
    if timeout is not None and timeout < 0:
        problems.append(f"{path}.bindTimeoutSeconds: invalid BindTimeoutSeconds, should not be a negative value")
    shape = args.get("shape")
    if shape is None:
        return problems
    recent = schema.node_minor is None or schema.node_minor >= (1, 33)  # the gate was renamed in 1.33
    gate = "StorageCapacityScoring" if recent else "VolumeCapacityPriority"
    if schema.node_gates is None or gate in schema.node_gates:  # gates unknown (no manifest): check the shape
        problems += _shape(as_list(shape), f"{path}.shape")
    else:
        problems.append(
            f"{path}.shape: unexpected field `shape`, remove it or turn on the feature gate {gate} "
            "(--feature-gates in the scheduler's manifest)"
        )
    return problems


PLUGIN_ARGS: dict[str, Callable[[Mapping[Any, Any], str, Schema], list[str]]] = {
    "DefaultPreemption": _default_preemption,
    "InterPodAffinity": _inter_pod_affinity,
    "NodeAffinity": _node_affinity,
    "PodTopologySpread": _pod_topology_spread,
    "NodeResourcesFit": _node_resources_fit,
    "NodeResourcesBalancedAllocation": _balanced_allocation,
    "VolumeBinding": _volume_binding,
}


def is_extended_resource_name(name: str) -> bool:
    """Upstream ``validateExtendedResourceName``: ``IsQualifiedName``, then v1helper ``IsExtendedResourceName`` (a
    domain prefix that is not a native ``kubernetes.io/`` one, not ``requests.``-prefixed, and still a
    qualified name as the quota resource ``requests.<name>``)."""
    if qualified_name_problem(name) or "/" not in name:
        return False
    if "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return qualified_name_problem("requests." + name) is None


def extender_problems(extenders: list[Any]) -> list[str]:
    """The scheduler's extender validation, plus a URL check: problems as ``extenders[i].field: rule`` lines."""
    problems: list[str] = []
    binders: list[int] = []
    owners: dict[str, int] = {}

    for index, extender in enumerate(extenders):
        if not isinstance(extender, dict):
            continue
        path = f"extenders[{index}]"
        url = _str(extender.get("urlPrefix"))
        problem = url_problem(url) if url else None
        if problem:
            problems.append(f"{path}.urlPrefix: {problem}, got {url!r}")
        weight = extender.get("weight")
        if _str(extender.get("prioritizeVerb")) and not (is_int(weight) and weight > 0):
            problems.append(f"{path}.weight: must be > 0 when prioritizeVerb is set (got {weight})")
        if _str(extender.get("bindVerb")):
            binders.append(index)
        tls = extender.get("tlsConfig")
        if isinstance(tls, dict):
            problems += _tls_problems(tls, f"{path}.tlsConfig")
        for r_index, resource in enumerate(as_list(extender.get("managedResources"))):
            name = _str(as_map(resource).get("name"))
            r_path = f"{path}.managedResources[{r_index}].name"
            if not name:
                continue
            if not is_extended_resource_name(name):
                problems.append(
                    f"{r_path}: {name!r} must be a qualified extended resource name such as example.com/gpu "
                    "(not in kubernetes.io/, not starting with requests.)"
                )
            if name in owners:
                problems.append(
                    f"{r_path}: duplicate extender managed resource {name!r} (also managed by "
                    f"extenders[{owners[name]}])"
                )
            else:
                owners[name] = index
    if len(binders) > 1:
        which = ", ".join(f"extenders[{i}]" for i in binders)
        problems.append(f"extenders: at most one extender may set bindVerb, found {len(binders)} ({which})")
    return problems


def _tls_problems(tls: Mapping[str, Any], path: str) -> list[str]:
    """A client certificate needs its key and vice versa, else the extender's transport cannot be built."""
    has_cert = bool(tls.get("certFile") or tls.get("certData"))
    has_key = bool(tls.get("keyFile") or tls.get("keyData"))
    if has_cert != has_key:
        missing = "keyFile/keyData" if has_cert else "certFile/certData"
        return [f"{path}: a client certificate needs both cert and key; {missing} is missing"]
    problems = []
    for field in ("certData", "keyData", "caData"):
        value = tls.get(field)
        if isinstance(value, str) and value and not _PEM_BLOCK.search(_base64(value)):
            problems.append(f"{path}.{field}: no PEM data in it (the scheduler exits building the extender's "
                            "client: 'tls: failed to find any PEM data'; rule extender.tlsPEM)")
    return problems


#: encoding/pem's Decode needs a whole block: a BEGIN line and its END line (the scheduler's TLS setup finds no
#: PEM data otherwise; a BEGIN header alone exits kube-scheduler 1.34-1.37 the same way)
_PEM_BLOCK = re.compile(rb"-----BEGIN ([^\n-]+)-----\r?\n.*?-----END \1-----", re.DOTALL)


def _base64(value: str) -> bytes:
    """A []byte field as Go's JSON decoder reads it: standard base64 (invalid input is refused elsewhere)."""
    try:
        return base64.b64decode(value, validate=False)
    except ValueError:  # binascii.Error included
        return b""


def rule_problems(data: Mapping[str, Any], schema: Schema) -> list[str]:
    """Every refusal of ``data`` after defaulting: validation's, then start-up's (the scheduler validates first,
    so what it would report first comes first); one walk over the profiles finds both.

    Without the node's minor, a rule that changed between minors reads the newest minor serving the apiVersion
    (a ``v1beta1`` config is not held to the ``leases``-only lock of 1.27), and nothing is judged at start-up."""
    minor = schema.node_minor  # the minor whose start-up is judged; None: not judged
    if schema.node_minor is None and schema.removed_in is not None:
        schema = replace(schema, node_minor=(schema.removed_in[0], schema.removed_in[1] - 1))
    at_start = [] if minor is None else (_lock_problems(data, minor, schema.node_launch)
                                         + _zero_flag_problems(data, minor, schema.node_launch))
    validation = extender_problems(as_list(data.get("extenders"))) + _client_connection(data)
    validation += _leader_election(data, schema) + _top_level(data)
    validation += _profiles(data, schema, minor, at_start)
    return validation + at_start
