"""Every rule a config is judged by, per minor, as data: one table to check and document.

Each ``Rule`` is one refusal — of ``validation.go`` (``rules.py``) or at start-up outside it (``startup.py``) —
with the minors it holds for (both ends inclusive; ``last=None``: still in the newest minor we know, 1.37) and the
upstream file, function and PR it comes from. ``PLUGINS`` is the in-tree plugin
registry (``pkg/scheduler/framework/plugins/registry.go``) with the minors each plugin is registered in and the
extension points it ever implemented. The checks read their minors only from these tables, and the table in
``docs/scheduler-config.md`` is generated from them (``tools/gen_startup_rules_doc.py``; a test fails when the
doc is stale).

Hand-checked, not generated: the kubernetes/kubernetes history is larger than what can be mirrored here, so each
fact was read in upstream source or in the PR that changed it (named in ``source``). Where a boundary could not
be read in upstream source it is *not* enforced: a registry end marked ``exact=False`` refuses nothing at the
unverified side, and a plugin whose extension points are not known (``points=None``) is never refused for its
extension point. A rule applied to a minor that does not have it refuses a config the scheduler accepts, which
is as wrong as a missing rule.
"""

from __future__ import annotations

from dataclasses import dataclass

Minor = tuple[int, int]

FIRST_MINOR: Minor = (1, 19)  # the oldest minor with generated types; the checks below start there

_FRAMEWORK = "kubernetes pkg/scheduler/framework/runtime/framework.go"
_REGISTRY = "kubernetes pkg/scheduler/framework/plugins/registry.go"
_VALIDATION = "kubernetes pkg/scheduler/apis/config/validation/validation.go"
_ARGS = "kubernetes pkg/scheduler/apis/config/validation/validation_pluginargs.go"
_LOCK = "client-go tools/leaderelection/resourcelock/interface.go New"
_OPTIONS = "kubernetes cmd/kube-scheduler/app/options/options.go"
_COMPONENT = "component-base config/validation/validation.go"


@dataclass(frozen=True)
class Rule:
    key: str
    cls: str  # validation | framework | resourceLock | pluginArgs | flags
    first: Minor
    last: Minor | None
    what: str
    source: str

    def holds(self, minor: Minor | None) -> bool:
        """Unknown minor: the newest behaviour."""
        if minor is None:
            return self.last is None
        return self.first <= minor and (self.last is None or minor <= self.last)


RULES: tuple[Rule, ...] = (
    # ---- 0. validation.go, after upstream's defaults (rules.py) ----------------------------------------------
    Rule("clientConnection.burst", "validation", FIRST_MINOR, None, "`clientConnection.burst` below 0",
         f"{_COMPONENT} ValidateClientConnectionConfiguration"),
    Rule("leaderElection", "validation", FIRST_MINOR, None,
         "leader election on with leaseDuration <= renewDeadline (after defaults) or renewDeadline <= 1.2 x "
         "retryPeriod (client-go `leaderelection.NewLeaderElector`: the scheduler exits when it fails)",
         f"{_COMPONENT} ValidateLeaderElectionConfiguration"),
    Rule("leaderElection.resourceLock", "validation", (1, 27), None,
         "leader election on with a `resourceLock` other than `leases` (kubernetes#114055)",
         f"{_VALIDATION} ValidateKubeSchedulerConfiguration"),
    Rule("parallelism", "validation", FIRST_MINOR, None, "`parallelism` of 0 or less",
         f"{_VALIDATION} ValidateKubeSchedulerConfiguration"),
    Rule("percentageOfNodesToScore", "validation", FIRST_MINOR, None,
         "`percentageOfNodesToScore` outside 0–100, top level and per profile",
         f"{_VALIDATION} validatePercentageOfNodesToScore"),
    Rule("backoff", "validation", FIRST_MINOR, None,
         "`podInitialBackoffSeconds` of 0 or less, or `podMaxBackoffSeconds` below it (after defaults: 1 s / 10 s)",
         f"{_VALIDATION} ValidateKubeSchedulerConfiguration"),
    Rule("profiles.schedulerName", "validation", FIRST_MINOR, None,
         "a profile without a `schedulerName` (the default only fills a single profile), or a name used twice",
         f"{_VALIDATION} ValidateKubeSchedulerConfiguration, validateKubeSchedulerProfile"),
    Rule("queueSort", "validation", FIRST_MINOR, None,
         "more than one queueSort plugin, or a queueSort (after the merge with the defaults) or its args that "
         "differ between profiles",
         f"{_VALIDATION} validateCommonQueueSort"),
    Rule("pluginConfig.duplicate", "validation", FIRST_MINOR, None, "two `pluginConfig` entries for one plugin",
         f"{_VALIDATION} validatePluginConfig"),
    Rule("removedPlugins", "validation", (1, 22), None,
         "from v1beta2, a removed plugin in `enabled` (not `multiPoint`) or `pluginConfig`: NodeLabel, "
         "ServiceAffinity, NodePreferAvoidPods, NodeResourcesLeastAllocated, NodeResourcesMostAllocated, "
         "RequestedToCapacityRatio; in v1 also SelectorSpread and the in-tree volume limits (rules below)",
         f"{_VALIDATION} isPluginInvalid, validatePluginSetForInvalidPlugins"),
    Rule("extenders", "validation", FIRST_MINOR, None,
         "an extender with prioritizeVerb and a weight of 0 or less, two binders, a managed resource twice or not "
         "an extended-resource name (a domain prefix, nothing in `kubernetes.io/`, not `requests.`)",
         f"{_VALIDATION} validateExtenders, validateExtendedResourceName"),
    Rule("extender.url", "validation", FIRST_MINOR, None,
         "an extender `urlPrefix` that Go's url.Parse refuses or that has no scheme and host (stricter than "
         "upstream: the scheduler starts and every call fails)",
         "net/url Parse; kubernetes pkg/scheduler/extender.go NewHTTPExtender"),
    Rule("extender.tlsPEM", "validation", FIRST_MINOR, None,
         "extender TLS with a certificate and no key or the reverse, or certData/keyData/caData without a PEM "
         "block",
         "client-go transport TLSConfigFor: 'tls: failed to find any PEM data'"),
    Rule("kubeconfig", "validation", FIRST_MINOR, None,
         "a relative `clientConnection.kubeconfig` (a placeholder left in: the scheduler exits when it cannot "
         "read it)",
         "kubernetes cmd/kube-scheduler/app/options/options.go createKubeConfig"),
    Rule("DefaultPreemption", "validation", FIRST_MINOR, None, "DefaultPreemption args out of range",
         f"{_ARGS} ValidateDefaultPreemptionArgs"),
    Rule("InterPodAffinity", "validation", FIRST_MINOR, None, "InterPodAffinity hardPodAffinityWeight outside 0–100",
         f"{_ARGS} ValidateInterPodAffinityArgs"),
    Rule("NodeAffinity", "validation", FIRST_MINOR, None,
         "NodeAffinity addedAffinity with a bad operator, values or label key (`matchFields`: In/NotIn, one value)",
         f"{_ARGS} ValidateNodeAffinityArgs (component-helpers nodeaffinity.NewNodeSelector)"),
    Rule("PodTopologySpread", "validation", FIRST_MINOR, None,
         "PodTopologySpread default constraints or defaulting type upstream refuses",
         f"{_ARGS} ValidatePodTopologySpreadArgs"),
    Rule("NodeResourcesFit", "validation", FIRST_MINOR, None,
         "NodeResourcesFit args: strategy type, weights outside (0, 100], shapes, ignored resources",
         f"{_ARGS} ValidateNodeResourcesFitArgs"),
    Rule("NodeResourcesBalancedAllocation", "validation", FIRST_MINOR, None,
         "NodeResourcesBalancedAllocation resources twice or with a weight other than 1",
         f"{_ARGS} ValidateNodeResourcesBalancedAllocationArgs"),
    Rule("VolumeBinding", "validation", FIRST_MINOR, None,
         "VolumeBinding a negative bindTimeoutSeconds, a bad shape, or a `shape` without its feature gate",
         f"{_ARGS} ValidateVolumeBindingArgs, ValidateVolumeBindingArgsWithOptions"),
    # ---- 1. framework construction ------------------------------------------------------------------------
    Rule("framework.unknownPlugin", "framework", FIRST_MINOR, None,
         "a plugin enabled at an extension point (or in multiPoint) is not in the registry of this minor "
         "(upstream image only: another image may register its own plugins)",
         f"{_FRAMEWORK} updatePluginList / expandMultiPointPlugins: '%s %q does not exist'; {_REGISTRY}"),
    Rule("framework.extensionPoint", "framework", FIRST_MINOR, None,
         "a plugin enabled at an extension point whose interface it does not implement",
         f"{_FRAMEWORK} updatePluginList: 'plugin %q does not extend %s plugin'"),
    Rule("framework.duplicate", "framework", FIRST_MINOR, None,
         "the same plugin enabled twice at one extension point",
         f"{_FRAMEWORK} updatePluginList: 'plugin %q already registered as %q'"),
    Rule("framework.multiPointDuplicate", "framework", (1, 23), None,
         "the same plugin twice in multiPoint (after the merge with the default multiPoint set) at a point it "
         "implements and where it is neither disabled nor enabled explicitly",
         f"{_FRAMEWORK} expandMultiPointPlugins (multiPoint added with v1beta3, kubernetes#105611, 1.23)"),
    Rule("framework.queueSort", "framework", FIRST_MINOR, None,
         "a profile without exactly one queueSort plugin after defaults, disables and the multiPoint expansion",
         f"{_FRAMEWORK} NewFramework: 'only one queue sort plugin required for profile'"),
    Rule("framework.bind", "framework", FIRST_MINOR, None,
         "a profile without a bind plugin after defaults, disables and the multiPoint expansion",
         f"{_FRAMEWORK} NewFramework: 'at least one bind plugin is needed for profile'"),
    Rule("framework.invalidSelectorSpread", "framework", (1, 25), None,
         "SelectorSpread enabled or configured in a v1 config",
         f"{_VALIDATION} invalidPluginsByVersion (the v1 entry since v1 was added in 1.25)"),
    Rule("framework.invalidVolumeLimits", "framework", (1, 31), None,
         "AzureDiskLimits, CinderLimits, EBSLimits, GCEPDLimits enabled or configured in a v1 config",
         f"{_VALIDATION} invalidPluginsByVersion (v1), kubernetes#124500 (1.31); left the registry in 1.32, "
         "kubernetes#124003"),
    # ---- 2. resource lock ---------------------------------------------------------------------------------
    Rule("resourceLock.endpoints", "resourceLock", (1, 24), None,
         "leader election on with resourceLock endpoints or configmaps",
         f"{_LOCK}: 'endpoints lock is removed, migrate to endpointsleases', kubernetes#106852 (1.24)"),
    Rule("resourceLock.migration", "resourceLock", (1, 28), None,
         "leader election on with resourceLock endpointsleases or configmapsleases",
         f"{_LOCK}: 'endpointsleases lock is removed, migrate to leases', kubernetes#117558 (1.28)"),
    Rule("resourceLock.unknown", "resourceLock", FIRST_MINOR, None,
         "leader election on with a resourceLock client-go does not know",
         f"{_LOCK}: 'Invalid lock-type %s'"),
    # ---- 3. plugin args ----------------------------------------------------------------------------------
    Rule("pluginArgs.rtcrEmptyShape", "pluginArgs", (1, 23), None,
         "NodeResourcesFit scoringStrategy.requestedToCapacityRatio with an empty shape (before 1.23 an empty "
         "shape was not checked)",
         f"{_ARGS} ValidateNodeResourcesFitArgs, kubernetes#106169 (1.23)"),
    Rule("pluginArgs.rtcrRequired", "pluginArgs", (1, 22), None,
         "NodeResourcesFit scoringStrategy type RequestedToCapacityRatio without requestedToCapacityRatio "
         "(validation from 1.34; 1.22–1.33 NewFit dereferences the nil field and the scheduler panics)",
         f"{_ARGS} ValidateNodeResourcesFitArgs, kubernetes#132120 (1.34); noderesources/fit.go NewFit"),
    Rule("pluginArgs.rtcrOnlyWithType", "pluginArgs", (1, 36), None,
         "NodeResourcesFit scoringStrategy.requestedToCapacityRatio with another strategy type (before 1.36 it "
         "was accepted and ignored)",
         f"{_ARGS} ValidateNodeResourcesFitArgs (release-1.36)"),
    Rule("pluginArgs.draFilterTimeout", "pluginArgs", (1, 34), None,
         "DynamicResources filterTimeout while the manifest switches DRASchedulerFilterTimeout off (a negative "
         "one is refused by the type check)",
         f"{_ARGS} ValidateDynamicResourcesArgs (filterTimeout added in 1.34)"),
    Rule("pluginArgs.draBindingTimeout", "pluginArgs", (1, 35), None,
         "DynamicResources bindingTimeout under 1s, or while the manifest switches DRADeviceBindingConditions or "
         "DRAResourceClaimDeviceStatus off",
         f"{_ARGS} ValidateDynamicResourcesArgs (bindingTimeout added in 1.35)"),
    # ---- 4. flags over the config ----------------------------------------------------------------------
    Rule("flags.leaderElection", "flags", (1, 23), None,
         "the manifest's --leader-elect* flags override the config's leaderElection; the effective config "
         "(config + flags) is what is validated",
         f"{_OPTIONS} ApplyTo / ApplyLeaderElectionTo, kubernetes#105712 (1.23)"),
    # ---- 5. proven by the binary of each built minor (earlier minors not checked) --------------------------
    Rule("framework.scoreWeight", "framework", (1, 34), None,
         "a negative weight of a score plugin (proven from 1.34; earlier minors not run)",
         "kube-scheduler 1.34-1.37 binaries: 'total score of Score plugins could overflow' (NewFramework)"),
    Rule("flags.unknown", "flags", (1, 34), None,
         "a manifest flag this minor's binary does not have (--port, --address, --lock-object-*, "
         "--scheduler-name, --algorithm-provider …); only minors whose binary was built",
         "the binary's --help (tools/schedconfig_binary_facts.py); pflag: 'unknown flag'"),
    Rule("featureGates.unknown", "flags", (1, 34), None,
         "--feature-gates names a gate this minor does not know (hidden gates locked to a value count as known)",
         "the binary's --help and probes; component-base featuregate: 'unrecognized feature gate'"),
    Rule("featureGates.locked", "flags", (1, 35), None,
         "--feature-gates sets a GA or deprecated gate against the value it is locked to",
         "probes of the binary; component-base featuregate: 'cannot set feature gate %v to %v, feature is locked'"),
    Rule("featureGates.dependency", "flags", (1, 35), None,
         "a gate on (by default or by the manifest) whose dependency the manifest switches off, or the reverse",
         "probes of the binary; component-base featuregate: '%s is enabled, but depends on features that are "
         "disabled'"),
    Rule("flags.leaderElectionZero", "flags", (1, 23), None,
         "a --leader-elect-lease-duration, -renew-deadline or -retry-period flag of zero or less (flags are applied "
         "after the config's defaults, so zero is not replaced by the default as it is in the config)",
         f"{_OPTIONS} ApplyLeaderElectionTo; component-base ValidateLeaderElectionConfiguration; proven on "
         "1.34-1.37"),
)

RULE_BY_KEY = {rule.key: rule for rule in RULES}

def point_interface(point: str) -> str:
    """The Go interface ``NewFramework`` names in its errors for an extension point: ``<Field>Plugin``. The points
    themselves are the fields of the minor's generated ``Plugins`` type but ``multiPoint``: tools/gen_schedconfig_
    schemas.py fails unless ``getExtensionPoints`` of each minor whose k8s.io/kubernetes it reads builds exactly
    those, with those interfaces, so nothing here lists them."""
    return point[0].upper() + point[1:] + "Plugin"


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


def _p(*points: str) -> frozenset[str]:
    return frozenset(points)


_ALWAYS = f"{_REGISTRY} release-1.19 … release-1.37"
_SCORING_FILTER = ("preFilter", "filter", "preScore", "score")
PLUGINS: dict[str, Plugin] = {
    **{
        name: Plugin(FIRST_MINOR, None, _p(*ever), _ALWAYS, always=_p(*always))
        for name, ever, always in (
            ("PrioritySort", ("queueSort",), ("queueSort",)),
            ("DefaultBinder", ("bind",), ("bind",)),
            ("DefaultPreemption", ("postFilter", "preEnqueue"), ("postFilter",)),  # PreEnqueue: async preemption
            ("ImageLocality", ("preScore", "score"), ("score",)),
            ("TaintToleration", ("preFilter", "filter", "preScore", "score"), ("filter", "score")),
            ("NodeName", ("preFilter", "filter"), ("filter",)),  # PreFilter from kubernetes#114386
            ("NodePorts", ("preFilter", "filter"), ("preFilter", "filter")),
            ("NodeAffinity", ("preFilter", "filter", "preScore", "score"), ("filter", "score")),
            ("PodTopologySpread", _SCORING_FILTER, _SCORING_FILTER),
            ("NodeUnschedulable", ("preFilter", "filter"), ("filter",)),
            ("NodeResourcesFit", _SCORING_FILTER, ("preFilter", "filter")),
            ("NodeResourcesBalancedAllocation", ("preScore", "score"), ("score",)),
            ("VolumeBinding", ("preEnqueue", "preFilter", "filter", "postFilter", "reserve", "preBind", "preScore",
                               "score"), ("preFilter", "filter", "reserve", "preBind")),
            ("VolumeRestrictions", ("preFilter", "filter"), ("filter",)),
            ("VolumeZone", _SCORING_FILTER, ("filter",)),
            ("NodeVolumeLimits", ("preFilter", "filter"), ("filter",)),
            ("InterPodAffinity", _SCORING_FILTER, _SCORING_FILTER),
        )
    },
    # in-tree volume limits: out of the registry in 1.32 (kubernetes#124003)
    **{
        name: Plugin(FIRST_MINOR, (1, 31), _p("preFilter", "filter"), f"{_REGISTRY}; removed by kubernetes#124003",
                     always=_p("filter"))
        for name in ("AzureDiskLimits", "CinderLimits", "EBSLimits", "GCEPDLimits")
    },
    # alpha in 1.26 with the preEnqueue extension point (KEP-3521) and DRA (KEP-3063)
    "SchedulingGates": Plugin((1, 26), None, _p("preEnqueue"), f"{_REGISTRY}; KEP-3521, 1.26",
                              always=_p("preEnqueue")),
    "DynamicResources": Plugin((1, 26), None, None, f"{_REGISTRY}; KEP-3063, 1.26"),
    # removed from the registry, by the PR named
    "SelectorSpread": Plugin(FIRST_MINOR, (1, 28), _p("preScore", "score"), f"{_REGISTRY}; kubernetes#117720 (1.29)",
                             always=_p("preScore", "score")),
    "NodePreferAvoidPods": Plugin(FIRST_MINOR, (1, 22), _p("score"), f"{_REGISTRY}; kubernetes#105907 (1.23)"),
    "NodeLabel": Plugin(FIRST_MINOR, (1, 22), _p(*_SCORING_FILTER), f"{_REGISTRY}; kubernetes#105906 (1.23)"),
    "ServiceAffinity": Plugin(FIRST_MINOR, (1, 22), _p(*_SCORING_FILTER), f"{_REGISTRY}; kubernetes#105588 (1.23)"),
    # unregistered for NodeResourcesFit's scoringStrategy (kubernetes#105914); the PR was not read: the end is not
    # enforced (validation.go refuses them by name in v1beta2 and later anyway)
    **{
        name: Plugin(FIRST_MINOR, (1, 22), _p("preScore", "score"), f"{_REGISTRY}; kubernetes#105914",
                     last_exact=False)
        for name in ("NodeResourcesLeastAllocated", "NodeResourcesMostAllocated", "RequestedToCapacityRatio")
    },
    # newer than 1.34: the minor each arrived in is that of the first generated registry holding it (1.34-1.37);
    # on another image they are never refused as unknown (first_exact=False)
    **{
        name: Plugin(first, None, None, f"{_REGISTRY} (generated registry of 1.{first[1]})", first_exact=False)
        for name, first in (("NodeDeclaredFeatures", (1, 35)), ("GangScheduling", (1, 35)),
                            ("TopologyPlacementGenerator", (1, 36)), ("PodGroupPodsCount", (1, 36)),
                            ("DeferredPodScheduling", (1, 37)))
    },
}

QUEUE_SORT_PLUGINS = frozenset(name for name, p in PLUGINS.items() if p.points and "queueSort" in p.points)
BIND_PLUGINS = frozenset(name for name, p in PLUGINS.items() if p.points and "bind" in p.points)
INVALID_VOLUME_LIMITS = ("AzureDiskLimits", "CinderLimits", "EBSLimits", "GCEPDLimits")

# client-go resource lock types (interface.go constants).
LOCK_TYPES = ("leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases")

# --leader-elect* flags and the leaderElection field each sets (component-base BindLeaderElectionFlags); the
# lock name/namespace flags are spelled resourceName/resourceNamespace in every apiVersion from v1beta1 on.
LEADER_ELECTION_FLAGS: dict[str, tuple[str, str]] = {
    "leader-elect": ("leaderElect", "bool"),
    "leader-elect-lease-duration": ("leaseDuration", "duration"),
    "leader-elect-renew-deadline": ("renewDeadline", "duration"),
    "leader-elect-retry-period": ("retryPeriod", "duration"),
    "leader-elect-resource-lock": ("resourceLock", "string"),
    "leader-elect-resource-name": ("resourceName", "string"),
    "leader-elect-resource-namespace": ("resourceNamespace", "string"),
}

# Image repositories that run upstream's kube-scheduler binary (and so only the in-tree registry).
UPSTREAM_IMAGES = ("kube-scheduler", "hyperkube", "hardened-kubernetes")
