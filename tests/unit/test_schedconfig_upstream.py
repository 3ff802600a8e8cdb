"""kube-scheduler's validation, ported and applied after its defaulting. Each case names the upstream
function it mirrors (a ``validation`` row of ``RULES`` in patcher/core/schedconfig/schemas/rules.json); configs that
upstream accepts still pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.core.schedconfig.rules import RULES
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import load_single

V1 = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
V1BETA2 = "apiVersion: kubescheduler.config.k8s.io/v1beta2\nkind: KubeSchedulerConfiguration\n"
V1BETA3 = "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n"
V1BETA1 = "apiVersion: kubescheduler.config.k8s.io/v1beta1\nkind: KubeSchedulerConfiguration\n"
VALIDATION = {rule.key for rule in RULES if rule.cls == "validation"}


def problem(text: str, version: str = "1.30") -> str | None:
    major, minor = version.split(".")
    try:
        validate_document(load_single(text, "/src/c.yaml"), "/src/c.yaml", version=KubeVersion(int(major), int(minor)))
    except ConfigError as err:
        return err.problem
    return None


def args(name: str, body: str) -> str:
    indented = "".join(f"      {line}\n" for line in body.splitlines())
    return V1 + f"profiles:\n- pluginConfig:\n  - name: {name}\n    args:\n{indented}"


# (rule key, config, version, expected problem); the key must be a validation rule of RULES.
REFUSED = [
    ("clientConnection.burst", V1 + "clientConnection:\n  burst: -1\n", "1.30",
     "clientConnection.burst: must be non-negative"),
    ("leaderElection.resourceLock", V1 + "leaderElection:\n  resourceLock: endpointsleases\n", "1.27",
     "leaderElection.resourceLock: must be \"leases\", got 'endpointsleases'"),
    ("leaderElection", V1 + "leaderElection:\n  leaseDuration: 5s\n", "1.30",
     "leaderElection.leaseDuration: must be greater than renewDeadline (5s <= 10s, the default)"),
    ("leaderElection", V1 + "leaderElection:\n  renewDeadline: 16s\n", "1.30",
     "leaderElection.leaseDuration: must be greater than renewDeadline (15s, the default <= 16s)"),
    ("leaderElection", V1 + "leaderElection:\n  retryPeriod: 9s\n", "1.30",
     "leaderElection.renewDeadline: must be greater than retryPeriod*1.2 (10s, the default vs 9s)"),
    ("parallelism", V1 + "parallelism: 0\n", "1.30", "parallelism: should be an integer value greater than zero"),
    ("percentageOfNodesToScore", V1 + "percentageOfNodesToScore: 101\n", "1.30",
     "percentageOfNodesToScore: not in valid range [0-100]"),
    ("percentageOfNodesToScore", V1 + "profiles:\n- percentageOfNodesToScore: -1\n", "1.30",
     "profiles[0].percentageOfNodesToScore: not in valid range [0-100]"),
    ("backoff", V1 + "podInitialBackoffSeconds: 20\n", "1.30",
     "podMaxBackoffSeconds: must be greater than or equal to podInitialBackoffSeconds (10, the default < 20)"),
    ("backoff", V1 + "podInitialBackoffSeconds: 0\n", "1.30", "podInitialBackoffSeconds: must be greater than 0"),
    ("profiles.schedulerName", V1 + "profiles:\n- schedulerName: a\n- plugins: {}\n", "1.30",
     "profiles[1].schedulerName: required; with more than one profile each needs its own"),
    ("queueSort", V1 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled:\n      - name: A\n"
     "      - name: B\n", "1.30",
     "profiles[0].plugins.queueSort.enabled: only one queue sort plugin can be enabled, found 2"),
    ("queueSort", V1 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled:\n      - name: A\n"
     "- schedulerName: b\n", "1.30", "profiles[1].plugins.queueSort: must be the same for all profiles"),
    ("queueSort", V1BETA2 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      disabled:\n"
     "      - name: '*'\n      enabled:\n      - name: Mine\n- schedulerName: b\n", "1.25",
     "profiles[1].plugins.queueSort: must be the same for all profiles"),
    ("pluginConfig.duplicate", V1 + "profiles:\n- pluginConfig:\n  - name: X\n  - name: X\n", "1.30",
     "profiles[0].pluginConfig[1]: duplicate pluginConfig for X"),
    ("removedPlugins", V1 + "profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: EBSLimits\n", "1.32",
     "profiles[0].plugins.filter.enabled[0]: EBSLimits was invalid in version kubescheduler.config.k8s.io/v1 "
     "(KubeSchedulerConfiguration is version kubescheduler.config.k8s.io/v1): the plugin no longer exists"),
    ("removedPlugins", V1 + "profiles:\n- pluginConfig:\n  - name: GCEPDLimits\n", "1.36",
     "profiles[0].pluginConfig[0]: GCEPDLimits was invalid in version kubescheduler.config.k8s.io/v1 "
     "(KubeSchedulerConfiguration is version kubescheduler.config.k8s.io/v1)"),
    ("removedPlugins", V1BETA3 + "profiles:\n- plugins:\n    score:\n      enabled:\n"
     "      - name: NodeResourcesLeastAllocated\n", "1.25",
     "profiles[0].plugins.score.enabled[0]: NodeResourcesLeastAllocated was invalid in version "
     "kubescheduler.config.k8s.io/v1beta2 (KubeSchedulerConfiguration is version kubescheduler.config.k8s.io/v1beta3)"
     ": the plugin no longer exists"),
    ("extenders", V1 + "extenders:\n- urlPrefix: http://a/\n  managedResources:\n  - name: kubernetes.io/gpu\n",
     "1.30", "extenders[0].managedResources[0].name: 'kubernetes.io/gpu' must be a qualified extended resource name"),
    ("extenders", V1 + "extenders:\n- urlPrefix: http://a/\n  managedResources:\n  - name: requests.example.com/x\n",
     "1.30", "extenders[0].managedResources[0].name: 'requests.example.com/x' must be a qualified"),
    ("DefaultPreemption", args("DefaultPreemption", "minCandidateNodesPercentage: 0\nminCandidateNodesAbsolute: 0"),
     "1.30", "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage: cannot be zero at the same time as "
     "minCandidateNodesAbsolute"),
    ("DefaultPreemption", args("DefaultPreemption", "minCandidateNodesPercentage: 101"), "1.30",
     "profiles[0].pluginConfig[0].args.minCandidateNodesPercentage: not in valid range [0, 100]"),
    ("InterPodAffinity", args("InterPodAffinity", "hardPodAffinityWeight: 101"), "1.30",
     "profiles[0].pluginConfig[0].args.hardPodAffinityWeight: not in valid range [0, 100]"),
    ("NodeAffinity", args("NodeAffinity", "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n"
                          "    nodeSelectorTerms:\n    - matchExpressions:\n      - key: zone\n        operator: In\n"),
     "1.30", "profiles[0].pluginConfig[0].args.addedAffinity.requiredDuringSchedulingIgnoredDuringExecution."
     "nodeSelectorTerms[0].matchExpressions[0].values: must be specified when `operator` is 'In' or 'NotIn'"),
    ("NodeAffinity", args("NodeAffinity", "addedAffinity:\n  preferredDuringSchedulingIgnoredDuringExecution:\n"
                          "  - weight: 1\n    preference:\n      matchFields:\n      - key: metadata.labels\n"
                          "        operator: Exists\n"),
     "1.30", "profiles[0].pluginConfig[0].args.addedAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]."
     "preference.matchFields[0].operator: 'Exists' is not a valid field selector operator (In, NotIn)"),
    ("PodTopologySpread", args("PodTopologySpread", "defaultConstraints:\n- maxSkew: 1\n  topologyKey: zone\n"
                               "  whenUnsatisfiable: ScheduleAnyway\n"),
     "1.30", "profiles[0].pluginConfig[0].args.defaultingType: must be List when defaultConstraints are not empty"),
    ("PodTopologySpread", args("PodTopologySpread", "defaultingType: List\ndefaultConstraints:\n- maxSkew: 0\n"
                               "  topologyKey: zone\n  whenUnsatisfiable: Maybe\n"),
     "1.30", "profiles[0].pluginConfig[0].args.defaultConstraints[0].maxSkew: not in valid range (0, inf); "
     "profiles[0].pluginConfig[0].args.defaultConstraints[0].whenUnsatisfiable: Unsupported value: 'Maybe'"),
    ("NodeResourcesFit", args("NodeResourcesFit", "scoringStrategy:\n  type: Fancy\n"), "1.30",
     "profiles[0].pluginConfig[0].args.scoringStrategy.type: Unsupported value: 'Fancy'"),
    ("NodeResourcesFit", args("NodeResourcesFit", "scoringStrategy:\n  type: RequestedToCapacityRatio\n"), "1.30",
     "profiles[0].pluginConfig[0].args.scoringStrategy.requestedToCapacityRatio: must be specified when type is "
     "RequestedToCapacityRatio"),
    ("NodeResourcesFit", args("NodeResourcesFit", "scoringStrategy:\n  type: RequestedToCapacityRatio\n"
                              "  requestedToCapacityRatio:\n    shape:\n    - {utilization: 50, score: 11}\n"
                              "    - {utilization: 10, score: 1}\n"),
     "1.30", "profiles[0].pluginConfig[0].args.scoringStrategy.requestedToCapacityRatio.shape[1].utilization: values "
     "must be sorted in increasing order"),
    ("NodeResourcesFit", args("NodeResourcesFit", "ignoredResourceGroups: [example.com/x]\n"), "1.30",
     "profiles[0].pluginConfig[0].args.ignoredResourceGroups[0]: resource group name can't contain '/'"),
    ("NodeResourcesBalancedAllocation", args("NodeResourcesBalancedAllocation",
                                             "resources:\n- {name: cpu, weight: 2}\n- {name: cpu}\n"), "1.30",
     "profiles[0].pluginConfig[0].args.resources[0].weight: must be 1; "
     "profiles[0].pluginConfig[0].args.resources[1].name: duplicate resource 'cpu'"),
    ("VolumeBinding", args("VolumeBinding", "bindTimeoutSeconds: -1\n"), "1.30",
     "profiles[0].pluginConfig[0].args.bindTimeoutSeconds: invalid BindTimeoutSeconds, should not be a negative value"),
    ("extender.url", V1 + "extenders:\n- urlPrefix: 127.0.0.1:8889\n", "1.30", "extenders[0].urlPrefix: "),
    ("extender.tlsPEM", V1 + "extenders:\n- urlPrefix: http://a/\n  tlsConfig:\n    certFile: /c.crt\n", "1.30",
     "extenders[0].tlsConfig: a client certificate needs both cert and key; keyFile/keyData is missing"),
    ("kubeconfig", V1 + "clientConnection:\n  kubeconfig: scheduler.conf\n", "1.30",
     "clientConnection.kubeconfig: must be an absolute path inside the scheduler container, got 'scheduler.conf'"),
    # v1beta1 (1.19-1.22) is judged by the same rules, with the same messages
    ("leaderElection", V1BETA1 + "leaderElection:\n  leaseDuration: 5s\n", "1.21",
     "leaderElection.leaseDuration: must be greater than renewDeadline (5s <= 10s, the default)"),
    ("profiles.schedulerName", V1BETA1 + "profiles:\n- schedulerName: a\n- schedulerName: ''\n", "1.20",
     "profiles[1].schedulerName: required; with more than one profile each needs its own"),
    ("parallelism", V1BETA1 + "parallelism: 0\n", "1.20", "parallelism: should be an integer value greater than zero"),
]


@pytest.mark.parametrize(("rule", "text", "version", "expected"), REFUSED, ids=[f"{r[0]}-{i}" for i, r in
                                                                               enumerate(REFUSED)])
def test_upstream_rule_is_applied(rule: str, text: str, version: str, expected: str) -> None:
    assert rule in VALIDATION, f"{rule} must name its upstream function in RULES"
    found = problem(text, version)
    assert found is not None and found.startswith(expected), found


def test_every_ported_rule_has_a_test() -> None:
    assert {rule for rule, *_ in REFUSED} == VALIDATION


ACCEPTED = [
    (V1, "1.30"),
    (V1 + "leaderElection:\n  leaseDuration: 30s\n  renewDeadline: 20s\n  retryPeriod: 5s\n", "1.30"),
    (V1 + "leaderElection:\n  leaderElect: false\n  leaseDuration: 1s\n  resourceLock: endpoints\n", "1.30"),
    (V1BETA3 + "leaderElection:\n  resourceLock: endpointsleases\n", "1.25"),  # leases-only came in 1.27
    (V1 + "leaderElection:\n  leaseDuration: 0s\n", "1.30"),  # zero is defaulted (RecommendedDefault…)
    (V1 + "podInitialBackoffSeconds: 5\n", "1.30"),
    (V1 + "podInitialBackoffSeconds: 20\npodMaxBackoffSeconds: 20\n", "1.30"),
    (V1 + "profiles:\n- plugins: {}\n", "1.30"),  # a single profile gets default-scheduler
    # a custom queue sort must disable PrioritySort, which v1 enables through multiPoint (framework.queueSort)
    (V1 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled:\n      - name: A\n"
     "      disabled:\n      - name: PrioritySort\n"
     "- schedulerName: b\n  plugins:\n    queueSort:\n      enabled:\n      - name: A\n"
     "      disabled:\n      - name: PrioritySort\n", "1.30"),
    (V1BETA2 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled:\n      - name: PrioritySort\n"
     "- schedulerName: b\n", "1.25"),  # v1beta2 merges into the default PrioritySort
    (V1 + "profiles:\n- plugins:\n    filter:\n      enabled:\n      - name: EBSLimits\n", "1.30"),
    (V1 + "profiles:\n- plugins:\n    multiPoint:\n      enabled:\n      - name: EBSLimits\n", "1.31"),  # registered
    (args("DefaultPreemption", "minCandidateNodesPercentage: 0"), "1.30"),  # absolute stays 100
    (args("NodeResourcesFit", "scoringStrategy:\n  type: MostAllocated\n  resources:\n  - {name: cpu}\n"
          "  - {name: example.com/gpu, weight: 100}\n"), "1.30"),
    (args("NodeResourcesFit", "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n"
          "    shape:\n    - {utilization: 0, score: 0}\n    - {utilization: 100, score: 10}\n"), "1.30"),
    (args("PodTopologySpread", "defaultingType: List\ndefaultConstraints:\n- maxSkew: 1\n"
          "  topologyKey: topology.kubernetes.io/zone\n  whenUnsatisfiable: ScheduleAnyway\n"), "1.30"),
    (args("NodeAffinity", "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n"
          "    - matchExpressions:\n      - {key: node-role.kubernetes.io/worker, operator: Exists}\n"
          "      - {key: cpus, operator: Gt, values: ['4']}\n      matchFields:\n"
          "      - {key: metadata.name, operator: NotIn, values: [n1]}\n"), "1.30"),
    (args("NodeResourcesBalancedAllocation", "resources:\n- {name: cpu, weight: 1}\n- {name: memory}\n"), "1.30"),
    (args("VolumeBinding", "bindTimeoutSeconds: 0\n"), "1.30"),
    (V1 + "extenders:\n- urlPrefix: http://a/\n  managedResources:\n  - name: example.com/gpu\n", "1.30"),
    # v1beta1 still has the plugins v1beta2 refuses by name, and merges queueSort into the default PrioritySort
    (V1BETA1 + "profiles:\n- pluginConfig:\n  - name: NodeLabel\n    args: {}\n", "1.21"),
    (V1BETA1 + "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled:\n      - name: PrioritySort\n"
     "- schedulerName: b\n", "1.21"),
]


@pytest.mark.parametrize(("text", "version"), ACCEPTED)
def test_configs_upstream_accepts_still_pass(text: str, version: str) -> None:
    assert problem(text, version) is None


def test_extender_edge_cases_stay_refused_on_purpose() -> None:
    """Upstream's validation accepts both; each breaks every extender call, so refusing is the contract
    (docs/scheduler-config.md, "Stricter than upstream")."""
    missing = problem(V1 + "extenders:\n- filterVerb: filter\n")
    assert missing is not None and "extenders[0].urlPrefix: required field is missing or empty" in missing
    negative = problem(V1 + "extenders:\n- urlPrefix: http://a/\n  httpTimeout: -1s\n")
    assert negative == "extenders[0].httpTimeout: must not be negative"


def test_minor_dependent_rules_follow_the_node_without_generated_types() -> None:
    """1.22 serves v1beta2 but has no generated types: the leases-only rule (1.27+) must still not apply."""
    assert problem(V1BETA2 + "leaderElection:\n  resourceLock: endpointsleases\n", "1.22") is None
    assert problem(V1 + "leaderElection:\n  resourceLock: endpointsleases\n", "1.37") is not None


SHAPE = args("VolumeBinding", "shape:\n- {utilization: 0, score: 0}\n- {utilization: 100, score: 10}\n")


def gated(text: str, version: str, *gates: str) -> str | None:
    major, minor = version.split(".")
    target = KubeVersion(int(major), int(minor), feature_gates=frozenset(gates))
    try:
        validate_document(load_single(text, "/src/c.yaml"), "/src/c.yaml", version=target)
    except ConfigError as err:
        return err.problem
    return None


def test_volume_binding_shape_needs_its_feature_gate() -> None:
    """ValidateVolumeBindingArgs: shape is refused unless the alpha gate is on (VolumeCapacityPriority, renamed
    StorageCapacityScoring in 1.33); with the gate on, validateFunctionShape applies."""
    assert gated(SHAPE, "1.30") == (
        "profiles[0].pluginConfig[0].args.shape: unexpected field `shape`, remove it or turn on the feature gate "
        "VolumeCapacityPriority (--feature-gates in the scheduler's manifest)"
    )
    assert gated(SHAPE, "1.30", "VolumeCapacityPriority") is None
    assert gated(SHAPE, "1.33", "VolumeCapacityPriority") is not None
    assert gated(SHAPE, "1.33", "StorageCapacityScoring") is None
    bad = SHAPE.replace("score: 10", "score: 11")
    assert gated(bad, "1.33", "StorageCapacityScoring") == (
        "profiles[0].pluginConfig[0].args.shape[1].score: not in valid range [0, 10]"
    )


def test_the_manifest_feature_gates_reach_the_rules(tmp_path: Path) -> None:
    source = tmp_path / "cm"
    source.mkdir()
    (source / "config.yaml").write_text(SHAPE)

    def build(*flags: str) -> None:
        build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version="1.30",
                                   scheduler_flags=("kube-scheduler", *flags)))

    with pytest.raises(ConfigError, match="turn on the feature gate VolumeCapacityPriority"):
        build("--feature-gates=VolumeCapacityPriority=false")
    build("--feature-gates=SomethingElse=true,VolumeCapacityPriority=true")
