"""The oracle's cases (issue 33): every config of the project's schedconfig tests, and generated ones.

Deterministic: the same repository gives the same list, in the same order, every case named by its content hash
(``Case.key``), so the recorded verdicts (tests/fixtures/schedconfig_oracle/) stay keyed to what was run.

- ``from-tests``: every KubeSchedulerConfiguration the schedconfig tests parse, recorded by
  ``tools/schedconfig_collect.py`` into ``tests/fixtures/schedconfig_oracle/from_tests.json`` (refresh with
  ``make config-oracle-collect``);
- generated, each rule at its boundary and mutations of valid configs: top-level ranges, leader election and
  the lock types, the manifest's ``--leader-elect*`` flags over the config, removed flags beside ``--config``,
  every in-tree plugin at every extension point of any minor's generated types (``POINTS``), an unknown plugin and
  everything disabled at each of them, profiles without queueSort or bind, plugin
  args at and past their limits, extenders, null and scalar entries in each list of structs, the spellings of a
  ``--feature-gates`` value, dropped fields and wrong types.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from patcher.core.schedconfig.schema import generated, registry
from tools.schedconfig_oracle import DATA, KUBEADM_FLAGS, Case

V1 = "kubescheduler.config.k8s.io/v1"
HEAD = f"apiVersion: {V1}\nkind: KubeSchedulerConfiguration\n"


def extension_points() -> tuple[str, ...]:
    """Every field of ``Plugins`` in any minor's generated v1 types (multiPoint included), oldest minor first: a
    point a minor gains reaches the cases with its types, no list to keep."""
    found: dict[str, None] = {}
    for api_versions in generated().values():
        if V1 in api_versions:
            found.update(dict.fromkeys(api_versions[V1].types["Plugins"].fields))
    return tuple(found)


POINTS = extension_points()
_LISTED = ("PrioritySort", "DefaultBinder", "DefaultPreemption", "ImageLocality", "TaintToleration", "NodeName",
           "NodePorts", "NodeAffinity", "PodTopologySpread", "NodeUnschedulable", "NodeResourcesFit",
           "NodeResourcesBalancedAllocation", "VolumeBinding", "VolumeRestrictions", "VolumeZone",
           "NodeVolumeLimits", "InterPodAffinity", "SchedulingGates", "DynamicResources", "EBSLimits",
           "SelectorSpread", "NodeLabel", "NodeDeclaredFeatures", "GangScheduling", "TopologyAware",
           "PodGroupPodsCount")
#: and every name a generated registry has that the list above lacks (1.36 TopologyPlacementGenerator, 1.37
#: DeferredPodScheduling …): the list keeps the gone and foreign names, the registries bring the new ones
PLUGINS = _LISTED + tuple(sorted(set().union(*(registry(m) or () for m in generated())) - set(_LISTED)))


def doc(body: str = "") -> str:
    return HEAD + body


def profile(plugins: str = "", config: str = "", name: str = "default-scheduler") -> str:
    out = f"profiles:\n- schedulerName: {name}\n"
    if plugins:
        out += "  plugins:\n" + "".join(f"    {line}\n" for line in plugins.splitlines())
    if config:
        out += "  pluginConfig:\n" + "".join(f"  {line}\n" for line in config.splitlines())
    return doc(out)


def args(plugin: str, body: str) -> str:
    """A profile whose pluginConfig gives ``plugin`` these args (YAML lines under ``args:``)."""
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    return profile(config=f"- name: {plugin}\n  args:\n{lines}")


def with_flags(*extra: str, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    kept = tuple(f for f in KUBEADM_FLAGS if f.split("=", 1)[0] not in drop)
    return kept + extra


def from_tests() -> Iterator[Case]:
    path = DATA / "from_tests.json"
    if path.is_file():
        for text in json.loads(path.read_text()):
            yield Case(text, origin="from-tests")


def top_level() -> Iterator[Case]:
    for field, values in {
        "parallelism": ("-1", "0", "1", "16", "'16'", "1.5"),
        "percentageOfNodesToScore": ("-1", "0", "50", "100", "101"),
        "podInitialBackoffSeconds": ("-1", "0", "1", "10", "11"),
        "podMaxBackoffSeconds": ("0", "1", "9", "10"),
        "delayCacheUntilActive": ("true", "false", "'yes'"),
        "enableProfiling": ("true", "false"),
        "enableContentionProfiling": ("true",),
    }.items():
        for value in values:
            yield Case(doc(f"{field}: {value}\n"), origin=f"range.{field}={value}")
    yield Case(doc("podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 4\n"), origin="range.backoff max<initial")
    yield Case(doc("podInitialBackoffSeconds: 5\npodMaxBackoffSeconds: 5\n"), origin="range.backoff max=initial")
    for burst in ("-1", "0", "100"):
        yield Case(doc(f"clientConnection:\n  burst: {burst}\n"), origin=f"range.clientConnection.burst={burst}")
    for qps in ("-1", "0", "50.5"):
        yield Case(doc(f"clientConnection:\n  qps: {qps}\n"), origin=f"range.clientConnection.qps={qps}")
    yield Case(doc("clientConnection:\n  contentType: application/json\n"), origin="clientConnection.contentType")
    yield Case(doc("clientConnection:\n  kubeconfig: scheduler.conf\n"), origin="clientConnection.relative")
    yield Case(doc("profiles:\n- schedulerName: default-scheduler\n  percentageOfNodesToScore: 101\n"),
               origin="range.profile.percentageOfNodesToScore=101")
    yield Case(doc("profiles:\n- schedulerName: default-scheduler\n  percentageOfNodesToScore: 100\n"),
               origin="range.profile.percentageOfNodesToScore=100")
    yield Case(doc("profiles:\n- schedulerName: default-scheduler\n  percentageOfNodesToScore: -1\n"),
               origin="range.profile.percentageOfNodesToScore=-1")


LEASE = ("leaseDuration", "renewDeadline", "retryPeriod")


def leader_election() -> Iterator[Case]:
    for elect in ("true", "false"):
        for lock in ("leases", "endpoints", "configmaps", "endpointsleases", "configmapsleases", "bogus", "''"):
            yield Case(doc(f"leaderElection:\n  leaderElect: {elect}\n  resourceLock: {lock}\n"),
                       origin=f"lock.{lock} leaderElect={elect}")
    durations = [("15s", "10s", "2s"), ("10s", "10s", "2s"), ("9s", "10s", "2s"), ("15s", "12s", "10s"),
                 ("15s", "13s", "10s"), ("15s", "12s", "11s"), ("0s", "10s", "2s"), ("15s", "0s", "2s"),
                 ("15s", "10s", "0s"), ("15s", "10s", "-1s"), ("-15s", "10s", "2s"), ("1m", "50s", "5s")]
    for lease, renew, retry in durations:
        for elect in ("true", "false"):
            yield Case(doc(f"leaderElection:\n  leaderElect: {elect}\n  leaseDuration: {lease}\n"
                           f"  renewDeadline: {renew}\n  retryPeriod: {retry}\n"),
                       origin=f"lease {lease}/{renew}/{retry} leaderElect={elect}")
    for field in LEASE:
        yield Case(doc(f"leaderElection:\n  {field}: 5\n"), origin=f"lease.{field} integer")
        yield Case(doc(f"leaderElection:\n  {field}: five\n"), origin=f"lease.{field} not a duration")
    yield Case(doc("leaderElection:\n  resourceName: other\n  resourceNamespace: default\n"), origin="lease names")
    yield Case(doc("leaderElection:\n  resourceName: ''\n"), origin="lease empty name")
    yield Case(doc("leaderElection:\n  resourceNamespace: ''\n"), origin="lease empty namespace")


def leader_flags() -> Iterator[Case]:
    """The manifest's --leader-elect* flags over the config (applied from 1.23) and the lock types as flags."""
    plain = doc()
    endpoints = doc("leaderElection:\n  resourceLock: endpoints\n")
    short = doc("leaderElection:\n  leaseDuration: 15s\n  renewDeadline: 10s\n  retryPeriod: 2s\n")
    off = doc("leaderElection:\n  leaderElect: false\n  resourceLock: endpoints\n")
    flag_sets = [
        ("--leader-elect=false",), ("--leader-elect-resource-lock=endpoints",),
        ("--leader-elect-resource-lock=leases",), ("--leader-elect-resource-lock=configmapsleases",),
        ("--leader-elect-resource-lock=bogus",), ("--leader-elect-lease-duration=5s",),
        ("--leader-elect-lease-duration=30s",), ("--leader-elect-renew-deadline=20s",),
        ("--leader-elect-retry-period=9s",), ("--leader-elect-retry-period=8s",),
        ("--leader-elect-resource-name=other",), ("--leader-elect-resource-namespace=default",),
        ("--leader-elect-lease-duration=0s",),
    ]
    for config, label in ((plain, "plain"), (endpoints, "endpoints"), (short, "durations"), (off, "off")):
        for flags in flag_sets:
            drop = ("--leader-elect",) if flags[0].startswith("--leader-elect=") else ()
            yield Case(config, with_flags(*flags, drop=drop), origin=f"flags {' '.join(flags)} over {label}")
        yield Case(config, with_flags(drop=("--leader-elect",)), origin=f"flags no --leader-elect over {label}")
    # the flags --config silences, or that later minors removed
    extra: tuple[tuple[str, ...], ...] = (
        ("--port=0",), ("--port=10251",), ("--address=127.0.0.1",), ("--address=0.0.0.0", "--port=0"),
        ("--profiling=false",), ("--kube-api-qps=100",), ("--kube-api-burst=200",),
        ("--kube-api-content-type=application/json",), ("--lock-object-name=other",),
        ("--lock-object-namespace=default",), ("--scheduler-name=other",), ("--policy-config-file=/p",),
        ("--algorithm-provider=DefaultProvider",), ("--hard-pod-affinity-symmetric-weight=1",),
        ("--use-legacy-policy-config=true",), ("--contention-profiling=true",),
        ("--feature-gates=DRASchedulerFilterTimeout=false",), ("--feature-gates=NoSuchGate=true",),
        ("--bind-address=0.0.0.0",), ("--v=2",))
    for given in extra:
        yield Case(plain, with_flags(*given), origin=f"flag {' '.join(given)} beside --config")


def plugins() -> Iterator[Case]:
    """Every in-tree plugin of any minor (and some gone or foreign) enabled at every extension point, and
    disabled."""
    for name in PLUGINS:
        for point in POINTS:
            yield Case(profile(f"{point}:\n  enabled:\n  - name: {name}"), origin=f"plugin {name} at {point}")
        yield Case(profile(f"multiPoint:\n  disabled:\n  - name: {name}"), origin=f"plugin {name} disabled")
        yield Case(profile(config=f"- name: {name}\n  args: {{}}"), origin=f"plugin {name} empty args")
    for unknown in ("NodeNmae", "Coscheduling", "nodename"):
        for point in ("filter", "multiPoint", "score"):
            yield Case(profile(f"{point}:\n  enabled:\n  - name: {unknown}"), origin=f"unknown {unknown} at {point}")
    yield Case(profile(config="- name: NodeNmae\n  args: {}"), origin="unknown plugin in pluginConfig")
    # per extension point: an unknown plugin, and every plugin disabled (a known one at each point is above: every
    # in-tree plugin at every point); run on every minor, so a point a minor lacks is its strict decoding's case
    for point in POINTS:
        yield Case(profile(f"{point}:\n  enabled:\n  - name: NoSuchPlugin"), origin=f"unknown NoSuchPlugin at {point}")
        yield Case(profile(f"{point}:\n  disabled:\n  - name: '*'"), origin=f"all disabled at {point}")
    yield Case(profile("filter:\n  enabled:\n  - name: NodeName\n  - name: NodeName"), origin="duplicate at filter")
    yield Case(profile("multiPoint:\n  enabled:\n  - name: NodeName\n  - name: NodeName"),
               origin="duplicate in multiPoint")
    yield Case(profile("multiPoint:\n  enabled:\n  - name: ImageLocality\n  - name: ImageLocality\n"
                       "score:\n  enabled:\n  - name: ImageLocality"), origin="multiPoint duplicate, explicit score")
    yield Case(profile("score:\n  enabled:\n  - name: ImageLocality\n    weight: 0"), origin="score weight 0")
    yield Case(profile("score:\n  enabled:\n  - name: ImageLocality\n    weight: -1"), origin="score weight -1")
    yield Case(profile("score:\n  enabled:\n  - name: ImageLocality\n    weight: 100"), origin="score weight 100")
    yield Case(profile("score:\n  enabled:\n  - name: ImageLocality\n    weight: 101"), origin="score weight 101")
    for weight in ("-1", "0", "101"):  # placementScore weighs its plugins like score (getValidScoreWeights)
        yield Case(profile(f"placementScore:\n  enabled:\n  - name: NodeResourcesFit\n    weight: {weight}"),
                   origin=f"placementScore weight {weight}")
    yield Case(profile("score:\n  disabled:\n  - name: '*'"), origin="score all disabled")
    yield Case(profile("filter:\n  disabled:\n  - name: '*'"), origin="filter all disabled")
    yield Case(profile("multiPoint:\n  disabled:\n  - name: '*'"), origin="multiPoint all disabled")
    # queueSort and bind
    yield Case(profile("queueSort:\n  disabled:\n  - name: '*'"), origin="no queueSort")
    yield Case(profile("queueSort:\n  disabled:\n  - name: PrioritySort"), origin="no queueSort (by name)")
    yield Case(profile("bind:\n  disabled:\n  - name: '*'"), origin="no bind")
    yield Case(profile("bind:\n  disabled:\n  - name: DefaultBinder"), origin="no bind (by name)")
    yield Case(profile("multiPoint:\n  disabled:\n  - name: DefaultBinder"), origin="no bind (multiPoint)")
    yield Case(profile("multiPoint:\n  disabled:\n  - name: '*'\nbind:\n  enabled:\n  - name: DefaultBinder"),
               origin="only bind")
    yield Case(profile("multiPoint:\n  disabled:\n  - name: '*'\nqueueSort:\n  enabled:\n  - name: PrioritySort\n"
                       "bind:\n  enabled:\n  - name: DefaultBinder"), origin="only queueSort and bind")
    yield Case(profile("queueSort:\n  enabled:\n  - name: PrioritySort"), origin="queueSort twice")
    yield Case(profile("bind:\n  enabled:\n  - name: DefaultBinder"), origin="bind twice")
    yield Case(profile("multiPoint:\n  enabled:\n  - name: PrioritySort"), origin="queueSort twice (multiPoint)")


def profiles() -> Iterator[Case]:
    two = "profiles:\n- schedulerName: a\n- schedulerName: b\n"
    yield Case(doc(two), origin="two profiles")
    yield Case(doc("profiles:\n- schedulerName: a\n- schedulerName: a\n"), origin="two profiles, same name")
    yield Case(doc("profiles:\n- schedulerName: a\n- {}\n"), origin="two profiles, one unnamed")
    yield Case(doc("profiles:\n- {}\n"), origin="one unnamed profile")
    yield Case(doc("profiles: []\n"), origin="empty profiles")
    yield Case(doc("profiles:\n- schedulerName: ''\n"), origin="empty scheduler name")
    yield Case(doc("profiles:\n- schedulerName: a\n- schedulerName: b\n  plugins:\n    queueSort:\n      disabled:\n"
                   "      - name: '*'\n      enabled:\n      - name: Own\n"), origin="two profiles, other queueSort")
    yield Case(doc("profiles:\n- schedulerName: a\n- schedulerName: b\n  plugins:\n    queueSort:\n      disabled:\n"
                   "      - name: '*'\n      enabled:\n      - name: PrioritySort\n"),
               origin="two profiles, same queueSort re-enabled")
    yield Case(doc("profiles:\n- schedulerName: a\n- schedulerName: b\n  pluginConfig:\n  - name: PrioritySort\n"
                   "    args: {}\n"), origin="two profiles, queueSort args in one")
    yield Case(doc("profiles:\n- schedulerName: a\n  pluginConfig:\n  - name: NodeResourcesFit\n    args: {}\n"
                   "  - name: NodeResourcesFit\n    args: {}\n"), origin="duplicate pluginConfig")
    yield Case(doc("profiles:\n- schedulerName: a\n  pluginConfig:\n  - name: NodeResourcesFit\n"),
               origin="pluginConfig without args")
    yield Case(doc("profiles:\n- schedulerName: a\n  pluginConfig:\n  - args: {}\n"), origin="pluginConfig no name")
    yield Case(doc("profiles:\n- schedulerName: a\n  pluginConfig:\n  - name: NodeResourcesFit\n    args: []\n"),
               origin="pluginConfig args a list")


def plugin_args() -> Iterator[Case]:
    dp = "DefaultPreemption"
    for pct, absolute in (("-1", "100"), ("0", "100"), ("0", "0"), ("100", "0"), ("101", "100"), ("10", "-1"),
                          ("1", "1"), ("100", "100")):
        yield Case(args(dp, f"minCandidateNodesPercentage: {pct}\nminCandidateNodesAbsolute: {absolute}"),
                   origin=f"args {dp} {pct}%/{absolute}")
    for weight in ("-1", "0", "1", "100", "101"):
        yield Case(args("InterPodAffinity", f"hardPodAffinityWeight: {weight}"),
                   origin=f"args InterPodAffinity hardPodAffinityWeight={weight}")
    yield Case(args("InterPodAffinity", "ignorePreferredTermsOfExistingPods: true"),
               origin="args InterPodAffinity ignorePreferred")
    fit = "NodeResourcesFit"
    for kind in ("LeastAllocated", "MostAllocated", "Bogus", "''"):
        yield Case(args(fit, f"scoringStrategy:\n  type: {kind}"), origin=f"args {fit} type={kind}")
    for weight in ("-1", "0", "1", "100", "101"):
        yield Case(args(fit, f"scoringStrategy:\n  type: LeastAllocated\n  resources:\n  - name: cpu\n"
                             f"    weight: {weight}"), origin=f"args {fit} weight={weight}")
    yield Case(args(fit, "scoringStrategy:\n  type: LeastAllocated\n  resources:\n  - name: cpu\n    weight: 1\n"
                         "  - name: cpu\n    weight: 1"), origin=f"args {fit} duplicate resource")
    yield Case(args(fit, "scoringStrategy:\n  type: LeastAllocated\n  resources: []"), origin=f"args {fit} no res")
    yield Case(args(fit, "scoringStrategy:\n  type: RequestedToCapacityRatio"), origin=f"args {fit} rtcr missing")
    yield Case(args(fit, "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n"
                         "    shape: []"), origin=f"args {fit} rtcr empty shape")
    for util, score in (("0", "0"), ("100", "10"), ("101", "10"), ("50", "11"), ("-1", "0"), ("0", "-1")):
        yield Case(args(fit, "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n"
                             f"    shape:\n    - utilization: {util}\n      score: {score}"),
                   origin=f"args {fit} rtcr point {util}/{score}")
    yield Case(args(fit, "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n"
                         "    shape:\n    - {utilization: 50, score: 5}\n    - {utilization: 10, score: 1}"),
               origin=f"args {fit} rtcr decreasing")
    yield Case(args(fit, "scoringStrategy:\n  type: LeastAllocated\n  requestedToCapacityRatio:\n"
                         "    shape:\n    - {utilization: 0, score: 0}"), origin=f"args {fit} rtcr with other type")
    yield Case(args(fit, "ignoredResources: [example.com/foo]\nignoredResourceGroups: [example.com]"),
               origin=f"args {fit} ignored")
    yield Case(args(fit, "ignoredResourceGroups: [example.com/foo]"), origin=f"args {fit} group with slash")
    ba = "NodeResourcesBalancedAllocation"
    for weight in ("0", "1", "2", "100", "101"):
        yield Case(args(ba, f"resources:\n- name: cpu\n  weight: {weight}"), origin=f"args {ba} weight={weight}")
    yield Case(args(ba, "resources:\n- name: cpu\n  weight: 1\n- name: cpu\n  weight: 1"), origin=f"args {ba} dup")
    pts = "PodTopologySpread"
    for kind in ("List", "System", "Other"):
        yield Case(args(pts, f"defaultingType: {kind}"), origin=f"args {pts} defaultingType={kind}")
    constraint = "defaultConstraints:\n- maxSkew: {skew}\n  topologyKey: zone\n  whenUnsatisfiable: {how}"
    for kind in ("List", "System"):
        for skew in ("0", "1"):
            for how in ("ScheduleAnyway", "DoNotSchedule", "Bogus"):
                yield Case(args(pts, f"defaultingType: {kind}\n" + constraint.format(skew=skew, how=how)),
                           origin=f"args {pts} {kind} maxSkew={skew} {how}")
    yield Case(args(pts, "defaultingType: List\ndefaultConstraints:\n- maxSkew: 1\n  topologyKey: zone\n"
                         "  whenUnsatisfiable: ScheduleAnyway\n  labelSelector:\n    matchLabels: {a: b}"),
               origin=f"args {pts} constraint with selector")
    yield Case(args(pts, "defaultingType: List\ndefaultConstraints:\n- maxSkew: 1\n  topologyKey: ''\n"
                         "  whenUnsatisfiable: ScheduleAnyway"), origin=f"args {pts} empty topologyKey")
    for seconds in ("-1", "0", "1", "600"):
        yield Case(args("VolumeBinding", f"bindTimeoutSeconds: {seconds}"),
                   origin=f"args VolumeBinding bindTimeoutSeconds={seconds}")
    yield Case(args("VolumeBinding", "shape:\n- utilization: 0\n  score: 0\n- utilization: 100\n  score: 10"),
               origin="args VolumeBinding shape without gate")
    term = "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n{terms}"
    for label, terms in (
        ("In", "    - matchExpressions:\n      - {key: zone, operator: In, values: [a]}"),
        ("In no values", "    - matchExpressions:\n      - {key: zone, operator: In, values: []}"),
        ("Exists with values", "    - matchExpressions:\n      - {key: zone, operator: Exists, values: [a]}"),
        ("Bogus operator", "    - matchExpressions:\n      - {key: zone, operator: Near, values: [a]}"),
        ("Gt two values", "    - matchExpressions:\n      - {key: n, operator: Gt, values: ['1', '2']}"),
        ("Gt not a number", "    - matchExpressions:\n      - {key: n, operator: Gt, values: [x]}"),
        ("bad key", "    - matchExpressions:\n      - {key: 'a b', operator: Exists}"),
        ("matchFields name", "    - matchFields:\n      - {key: metadata.name, operator: In, values: [n1]}"),
        ("matchFields other", "    - matchFields:\n      - {key: metadata.uid, operator: In, values: [n1]}"),
        ("empty terms", "    []"),
    ):
        yield Case(args("NodeAffinity", term.format(terms=terms)), origin=f"args NodeAffinity {label}")
    yield Case(args("NodeAffinity", "addedAffinity:\n  preferredDuringSchedulingIgnoredDuringExecution:\n"
                                    "  - weight: 0\n    preference:\n      matchExpressions:\n"
                                    "      - {key: zone, operator: Exists}"),
               origin="args NodeAffinity preferred weight 0")
    dra = "DynamicResources"
    for field in ("filterTimeout", "bindingTimeout"):
        for value in ("0s", "500ms", "1s", "10s", "-1s", "10"):
            yield Case(args(dra, f"{field}: {value}"), origin=f"args {dra} {field}={value}")
            if value in ("1s", "0s"):
                for gate in ("DRASchedulerFilterTimeout", "DRADeviceBindingConditions",
                             "DRAResourceClaimDeviceStatus"):
                    for state in ("true", "false"):
                        yield Case(args(dra, f"{field}: {value}"), with_flags(f"--feature-gates={gate}={state}"),
                                   origin=f"args {dra} {field}={value} {gate}={state}")
    yield Case(profile("multiPoint:\n  disabled:\n  - name: DynamicResources",
                       f"- name: {dra}\n  args:\n    bindingTimeout: 1s"), origin=f"args {dra} disabled, binding 1s")
    yield Case(args("NodeResourcesFit", "kind: InterPodAffinityArgs"), origin="args wrong kind")
    yield Case(args("NodeResourcesFit", "apiVersion: kubescheduler.config.k8s.io/v1\nkind: NodeResourcesFitArgs"),
               origin="args own kind")
    yield Case(args("NodeResourcesFit", "noSuchField: 1"), origin="args unknown field")
    yield Case(args("DefaultPreemption", "minCandidateNodesPercentage: '10'"), origin="args wrong type")


def extenders() -> Iterator[Case]:
    ext = "extenders:\n- urlPrefix: http://127.0.0.1:8888\n  filterVerb: filter\n"
    yield Case(doc(ext), origin="extender filter")
    yield Case(doc(ext + "  weight: 1\n  prioritizeVerb: prioritize\n"), origin="extender prioritize weight 1")
    yield Case(doc(ext + "  weight: 0\n  prioritizeVerb: prioritize\n"), origin="extender prioritize weight 0")
    yield Case(doc(ext + "  weight: -1\n  prioritizeVerb: prioritize\n"), origin="extender prioritize weight -1")
    yield Case(doc(ext + "  bindVerb: bind\n- urlPrefix: http://127.0.0.1:8889\n  bindVerb: bind\n"),
               origin="extender two binders")
    for res in ("example.com/gpu", "gpu", "kubernetes.io/gpu", "requests.example.com/gpu", "example.com/a b"):
        yield Case(doc(ext + f"  managedResources:\n  - name: {res}\n"), origin=f"extender managed {res}")
    yield Case(doc(ext + "  managedResources:\n  - name: example.com/a\n  - name: example.com/a\n"),
               origin="extender managed twice")
    yield Case(doc("extenders:\n- filterVerb: filter\n"), origin="extender without urlPrefix")
    yield Case(doc(ext + "  httpTimeout: -1s\n"), origin="extender negative timeout")
    yield Case(doc(ext + "  httpTimeout: 0s\n"), origin="extender zero timeout")
    yield Case(doc(ext + "  tlsConfig:\n    certFile: /nonexistent.crt\n"), origin="extender cert without key")
    yield Case(doc(ext + "  enableHTTPS: true\n"), origin="extender https")
    yield Case(doc(ext.replace("http://127.0.0.1:8888", "http://[::1")), origin="extender bad url")
    yield Case(doc(ext.replace("http://", "ftp://")), origin="extender ftp url")
    yield Case(doc(ext + "  nodeCacheCapable: 'yes'\n"), origin="extender wrong type")


#: a gate of every built minor that no other gate depends on and none locks, and that kube-scheduler does not read
SPELLED_GATE = "ContainerCheckpoint"


def feature_gate_values() -> Iterator[Case]:
    """--feature-gates values as component-base reads them: each spelling Go's strconv.ParseBool takes, some it
    refuses, no value, no '=', no gate name, and a blank entry."""
    for value in ("1", "t", "T", "TRUE", "True", "true", "0", "f", "F", "FALSE", "False", "false", "tRuE", "yes", ""):
        yield Case(doc(), with_flags(f"--feature-gates={SPELLED_GATE}={value}"), origin=f"gate value {value!r}")
    yield Case(doc(), with_flags(f"--feature-gates={SPELLED_GATE}"), origin="gate without '='")
    yield Case(doc(), with_flags("--feature-gates==true"), origin="gate without a name")
    yield Case(doc(), with_flags(f"--feature-gates={SPELLED_GATE}=true, ,"), origin="gate list with a blank entry")


def null_entries() -> Iterator[Case]:
    """A null entry (Go decodes it as the element's zero value) and a scalar entry in each list of structs."""
    ext = "extenders:\n- urlPrefix: http://127.0.0.1:8888\n  filterVerb: filter\n"
    for label, body in (("extenders", "extenders:\n- null\n"),
                        ("profiles", "profiles:\n- null\n"),
                        ("managedResources", ext + "  managedResources:\n  - null\n")):
        yield Case(doc(body), origin=f"null entry in {label}")
        for scalar in ("3", "x"):
            yield Case(doc(body.replace("- null", f"- {scalar}")), origin=f"{scalar} entry in {label}")
    yield Case(profile(config="- null"), origin="null entry in pluginConfig")
    yield Case(profile(config="- x"), origin="x entry in pluginConfig")
    for point, kind in (("filter", "enabled"), ("score", "enabled"), ("multiPoint", "enabled"),
                        ("filter", "disabled"), ("multiPoint", "disabled")):
        yield Case(profile(f"{point}:\n  {kind}:\n  - null"), origin=f"null entry in {point}.{kind}")
    yield Case(profile("filter:\n  enabled:\n  - 3"), origin="3 entry in filter.enabled")
    fit = "NodeResourcesFit"
    for label, plugin, body in (
        ("BalancedAllocation resources", "NodeResourcesBalancedAllocation", "resources:\n- null"),
        ("Fit resources", fit, "scoringStrategy:\n  type: LeastAllocated\n  resources:\n  - null"),
        ("Fit shape", fit, "scoringStrategy:\n  type: RequestedToCapacityRatio\n  requestedToCapacityRatio:\n"
                           "    shape:\n    - null"),
        ("Fit ignoredResources", fit, "ignoredResources:\n- null"),
        ("PodTopologySpread defaultConstraints", "PodTopologySpread",
         "defaultingType: List\ndefaultConstraints:\n- null"),
        ("NodeAffinity nodeSelectorTerms", "NodeAffinity",
         "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n    - null"),
        ("NodeAffinity matchExpressions", "NodeAffinity",
         "addedAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n    nodeSelectorTerms:\n"
         "    - matchExpressions:\n      - null"),
        ("NodeAffinity preferred", "NodeAffinity",
         "addedAffinity:\n  preferredDuringSchedulingIgnoredDuringExecution:\n  - null"),
    ):
        yield Case(args(plugin, body), origin=f"null entry in args {label}")


def mutations() -> Iterator[Case]:
    """A valid config with one thing wrong: a field dropped, a wrong type, an unknown field, another version."""
    yield Case(doc(), origin="minimal v1")
    yield Case("kind: KubeSchedulerConfiguration\n", origin="no apiVersion")
    yield Case(f"apiVersion: {V1}\n", origin="no kind")
    yield Case(f"apiVersion: {V1}\nkind: Policy\n", origin="wrong kind")
    for api in ("v1beta3", "v1beta2", "v1beta1", "v1alpha1", "v2"):
        yield Case(doc().replace("/v1\n", f"/{api}\n"), origin=f"apiVersion {api}")
    yield Case(doc("parallelism: 16\nparallelism: 8\n"), origin="duplicate key")
    yield Case(doc("paralelism: 16\n"), origin="unknown field")
    yield Case(doc("Parallelism: 16\n"), origin="field case")
    yield Case(doc("profiles: {}\n"), origin="profiles a mapping")
    yield Case(doc("profiles:\n- schedulerName: 1\n"), origin="scheduler name a number")
    yield Case(doc("leaderElection: true\n"), origin="leaderElection a bool")
    yield Case(doc("leaderElection:\n  leaderElect: 'true'\n"), origin="leaderElect a string")
    yield Case(doc("extenders: {}\n"), origin="extenders a mapping")
    yield Case(doc("healthzBindAddress: 0.0.0.0:10251\n"), origin="removed healthzBindAddress")
    yield Case(doc("metricsBindAddress: 0.0.0.0:10251\n"), origin="removed metricsBindAddress")
    yield Case(doc("clientConnection: {}\n"), origin="clientConnection flow")
    yield Case(doc("featureGates: {}\n"), origin="featureGates in config")
    yield Case(json.dumps({"apiVersion": V1, "kind": "KubeSchedulerConfiguration", "parallelism": 8}) + "\n",
               origin="JSON")
    yield Case(doc("---\n" + doc("parallelism: 0\n")), origin="two documents, second invalid")
    yield Case(doc("percentageOfNodesToScore: 1.5\n"), origin="percentage a float")
    yield Case(doc("parallelism: 1e2\n"), origin="parallelism exponent")
    yield Case(doc("parallelism: 0x10\n"), origin="parallelism hex")
    yield Case(doc("parallelism: null\n"), origin="parallelism null")
    yield Case(doc("profiles:\n- schedulerName: a\n  plugins:\n    filter:\n      enabled:\n      - NodeName\n"),
               origin="plugin a string")
    yield Case(doc("profiles:\n- schedulerName: a\n  plugins:\n    filters:\n      enabled: []\n"),
               origin="unknown extension point")


def generate() -> list[Case]:
    """Every case, deduplicated by content hash, in a stable order (the first origin wins)."""
    seen: dict[str, Case] = {}
    for source in (from_tests, top_level, leader_election, leader_flags, plugins, profiles, plugin_args, extenders,
                   feature_gate_values, null_entries, mutations):
        for case in source():
            seen.setdefault(case.key, case)
    return list(seen.values())


if __name__ == "__main__":
    cases = generate()
    print(len(cases))
    print(Path(DATA).relative_to(Path(__file__).resolve().parents[1]))
