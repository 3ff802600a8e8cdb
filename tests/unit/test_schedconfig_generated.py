"""Per-minor schemas: generated from the upstream Go types, reproducible from the committed facts, and
used so that a field the node's minor does not know is refused with the version that added it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from patcher.commands.cli import main
from patcher.core.errors import ConfigError
from patcher.core.schedconfig.schema import CONFIG_KIND, all_schemas, generated
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import load_single
from tests.conftest import FIXTURES
from tests.harness.helpers import MANIFEST

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_schedconfig_schemas", ROOT / "tools/gen_schedconfig_schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_the_committed_schemas_are_what_the_committed_facts_generate() -> None:
    facts = json.loads(gen.FACTS.read_text(encoding="utf-8"))
    files = gen.generate(facts)
    assert sorted(files) == sorted(f"kube-scheduler-1.{m}.json" for m in range(19, 38))
    assert gen.differences(files, gen.OUT_DIR) == []
    assert gen.main(["check"]) == 0


def test_check_notices_a_hand_edit(tmp_path: Path) -> None:
    facts = json.loads(gen.FACTS.read_text(encoding="utf-8"))
    files = gen.generate(facts)
    gen.write_generated(files, tmp_path)
    assert gen.differences(files, tmp_path) == []
    edited = tmp_path / "kube-scheduler-1.30.json"
    edited.write_text(edited.read_text().replace('"delayCacheUntilActive"', '"delayCacheUntilActiv"'))
    (tmp_path / "kube-scheduler-1.99.json").write_text("{}")
    assert gen.differences(files, tmp_path) == ["kube-scheduler-1.30.json", "kube-scheduler-1.99.json"]


# ---- the extractor on a small Go input of our own ---------------------------------------------------------------

GO_TYPES = """package v1

import (
\tcorev1 "k8s.io/api/core/v1"
\tmetav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
\t"k8s.io/apimachinery/pkg/runtime"
\tcomponentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
)

// KubeSchedulerConfiguration configures a scheduler
type KubeSchedulerConfiguration struct {
\t// TypeMeta contains the API version and kind.
\tmetav1.TypeMeta `json:",inline"`
\tParallelism *int32 `json:"parallelism,omitempty"`
\tLeaderElection componentbaseconfigv1alpha1.LeaderElectionConfiguration `json:"leaderElection"`
\tcomponentbaseconfigv1alpha1.DebuggingConfiguration `json:",inline"`
\tProfiles []KubeSchedulerProfile `json:"profiles,omitempty"`
\tinternal string `json:"-"`
}

type KubeSchedulerProfile struct {
\tSchedulerName *string `json:"schedulerName,omitempty"` // trailing comment
\tPluginConfig []PluginConfig `json:"pluginConfig,omitempty"`
\tLabels map[string]string `json:"labels,omitempty"`
}

type PluginConfig struct {
\tName string `json:"name"`
\tArgs runtime.RawExtension `json:"args,omitempty"`
}

/* A block comment
type Ignored struct {
\tX int `json:"x"`
}
*/
type Mode string

type NodeAffinityArgs struct {
\tmetav1.TypeMeta `json:",inline"`
\tAddedAffinity *corev1.NodeAffinity `json:"addedAffinity,omitempty"`
\tMode Mode `json:"mode"`
\tData []byte `json:"data"`
\tTimeout metav1.Duration `json:"timeout"`
}

func addKnownTypes(scheme *runtime.Scheme) error {
\tscheme.AddKnownTypes(SchemeGroupVersion,
\t\t&KubeSchedulerConfiguration{},
\t\t&NodeAffinityArgs{},
\t)
\treturn nil
}
"""
COMPONENT_BASE = """package v1alpha1
type LeaderElectionConfiguration struct {
\tLeaderElect *bool `json:"leaderElect"`
\tLeaseDuration metav1.Duration `json:"leaseDuration"`
}
type DebuggingConfiguration struct {
\tEnableProfiling *bool `json:"enableProfiling,omitempty"`
}
"""
CORE = """package v1
type NodeAffinity struct {
\tRequired *NodeSelector `json:"required,omitempty"`
\tWeird []interface{} `json:"weird"`
}
type NodeSelector struct {
\tTerms []string `json:"terms"`
}
type Unreached struct {
\tCells []interface{} `json:"cells"`
}
"""


def _reader(files: dict[tuple[str, str], str]) -> Any:
    def read(repo: str, branch: str, path: str) -> str | None:
        assert branch == "release-1.30"
        return files.get((repo, path))

    return read


def test_extract_reads_go_types_into_our_vocabulary() -> None:
    read = _reader({
        ("kubernetes+kube-scheduler", "config/v1/types.go"): GO_TYPES,
        ("kubernetes+component-base", "config/v1alpha1/types.go"): COMPONENT_BASE,
        ("kubernetes+api", "core/v1/types.go"): CORE.replace("\tWeird []interface{} `json:\"weird\"`\n", ""),
    })
    found = gen.extract_minor("1.30", read)
    assert list(found) == ["kubescheduler.config.k8s.io/v1"]
    entry = found["kubescheduler.config.k8s.io/v1"]
    assert entry["kinds"] == ["NodeAffinityArgs"]
    types = entry["types"]
    assert types["KubeSchedulerConfiguration"] == {
        "apiVersion": "string",
        "kind": "string",
        "parallelism": "int32",
        "leaderElection": "LeaderElectionConfiguration",
        "enableProfiling": "bool",
        "profiles": "[]KubeSchedulerProfile",
    }
    assert types["KubeSchedulerProfile"] == {
        "schedulerName": "string",
        "pluginConfig": "[]PluginConfig",
        "labels": "map[string]string",
    }
    assert types["PluginConfig"] == {"name": "string", "args": "object"}
    assert types["NodeAffinityArgs"] == {
        "apiVersion": "string",
        "kind": "string",
        "addedAffinity": "NodeAffinity",
        "mode": "string",
        "data": "bytes",
        "timeout": "duration",
    }
    assert types["NodeAffinity"] == {"required": "NodeSelector"}
    assert types["LeaderElectionConfiguration"] == {"leaderElect": "bool", "leaseDuration": "duration"}
    assert "Ignored" not in types and "Unreached" not in types


def test_extract_refuses_a_reached_type_it_cannot_read() -> None:
    read = _reader({
        ("kubernetes+kube-scheduler", "config/v1/types.go"): GO_TYPES,
        ("kubernetes+component-base", "config/v1alpha1/types.go"): COMPONENT_BASE,
        ("kubernetes+api", "core/v1/types.go"): CORE,
    })
    with pytest.raises(ValueError, match="NodeAffinity: cannot read Go field line"):
        gen.extract_minor("1.30", read)


def test_facts_fold_minors_into_runs() -> None:
    per_minor = {
        "1.25": {"g/v1": {"kinds": ["AArgs"], "types": {"T": {"a": "int32", "b": "string"}}}},
        "1.26": {"g/v1": {"kinds": ["AArgs"], "types": {"T": {"a": "int64", "b": "string", "c": "bool"}}}},
        "1.27": {"g/v1": {"kinds": [], "types": {"T": {"a": "int64", "c": "bool"}}}},
    }
    facts = gen.to_facts(per_minor)
    entry = facts["apiVersions"]["g/v1"]
    assert entry["minors"] == [["1.25", "1.27"]]
    assert entry["kinds"] == {"AArgs": [["1.25", "1.26"]]}
    assert entry["types"]["T"] == {
        "a": [["int32", "1.25", "1.25"], ["int64", "1.26", "1.27"]],
        "b": [["string", "1.25", "1.26"]],
        "c": [["bool", "1.26", "1.27"]],
    }
    files = gen.generate({**facts, "minors": ["1.25", "1.26", "1.27"]})
    at_127 = json.loads(files["kube-scheduler-1.27.json"])["apiVersions"]["g/v1"]
    assert at_127["types"]["T"]["fields"] == {"a": "int64", "c": "bool"} and at_127["pluginArgs"] == {}


def test_unfolding_the_committed_facts_gives_them_back() -> None:
    """``extract --minor`` re-reads some minors and keeps the others: unfolding and folding again changes nothing."""
    facts = json.loads(gen.FACTS.read_text(encoding="utf-8"))
    assert gen.to_facts(*gen.from_facts(facts)) == json.loads(json.dumps(facts))


FRAMEWORK = """package runtime
type frameworkImpl struct {
\tpreFilterPlugins          []fwk.PreFilterPlugin
\tpodGroupPostFilterPlugins []fwk.PodGroupPostFilterPlugin
\tbatchablePlugins          []fwk.SignPlugin
}

func (f *frameworkImpl) getExtensionPoints(plugins *config.Plugins) []extensionPoint {
\treturn []extensionPoint{
\t\t{&plugins.PreFilter, &f.preFilterPlugins},
\t\t{&plugins.PodGroupPostFilter, &f.podGroupPostFilterPlugins},
\t}
}
"""
PLUGINS_GO = """package v1
type Plugins struct {
\tPreFilter PluginSet `json:"preFilter,omitempty"`
\tMultiPoint PluginSet `json:"multiPoint,omitempty"`
\tPodGroupPostFilter PluginSet `json:"podGroupPostFilter,omitempty"`
}
"""


def test_the_extension_points_are_checked_against_the_framework_of_the_minor() -> None:
    assert gen.framework_points(FRAMEWORK) == [("PreFilter", "PreFilterPlugin"),
                                               ("PodGroupPostFilter", "PodGroupPostFilterPlugin")]
    read = _reader({("kubernetes+kubernetes", gen.FRAMEWORK): FRAMEWORK,
                    ("kubernetes+kube-scheduler", "config/v1/types.go"): PLUGINS_GO})
    fields = {"preFilter": "PluginSet", "multiPoint": "PluginSet", "podGroupPostFilter": "PluginSet"}
    extracted = {"kubescheduler.config.k8s.io/v1": {"types": {"Plugins": fields}}}
    gen.check_points("1.30", read, extracted)  # the points are the fields but multiPoint: nothing to say
    fields["placementScore"] = "PluginSet"  # a field the framework does not build: refused
    with pytest.raises(ValueError, match="the framework builds"):
        gen.check_points("1.30", read, extracted)
    gen.check_points("1.30", _reader({}), extracted)  # no k8s.io/kubernetes (git mirrors): not checked


REGISTRY_GO = """package plugins
import (
\t"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
\tsort "k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
)
func NewInTreeRegistry() runtime.Registry {
\tfts := plfeature.NewSchedulerFeaturesFromGates(feature.DefaultFeatureGate)
\tregistry := runtime.Registry{
\t\tnoderesources.BalancedAllocationName: runtime.FactoryAdapter(fts, noderesources.NewBalancedAllocation),
\t\tsort.Name:                            queuesort.New,
\t}
\treturn registry
}
"""


def test_the_registry_is_read_through_each_plugin_package_constant() -> None:
    plugins = "pkg/scheduler/framework/plugins"
    files = {
        gen.REGISTRY_GO: REGISTRY_GO,
        gen.NAMES_GO: 'package names\nconst (\n\tPrioritySort = "PrioritySort"\n'
                      '\tNodeResourcesBalancedAllocation = "NodeResourcesBalancedAllocation"\n)\n',
        f"{plugins}/noderesources/balanced_allocation.go": "const (\n\tBalancedAllocationName = "
                                                           "names.NodeResourcesBalancedAllocation\n)\n",
        f"{plugins}/queuesort/priority_sort.go": 'const Name = "PrioritySort"\n',
    }
    read = _reader({("kubernetes+kubernetes", path): text for path, text in files.items()})

    def listing(repo: str, branch: str, folder: str) -> list[str]:
        return [path.rsplit("/", 1)[1] for path in files if path.rsplit("/", 1)[0] == folder]

    assert gen.registry_names("1.30", read, listing) == ["NodeResourcesBalancedAllocation", "PrioritySort"]
    assert gen.registry_names("1.30", _reader({}), listing) is None
    del files[f"{plugins}/queuesort/priority_sort.go"]
    with pytest.raises(ValueError, match=r"registry key sort\.Name: no constant"):
        gen.registry_names("1.30", read, listing)


def test_each_pinned_release_gives_its_minor(tmp_path: Path) -> None:
    for version in ("v1.36.1", "v1.36.3", "v1.37.2", "v1.38.0"):
        (tmp_path / version).mkdir()
        if version != "v1.38.0":
            (tmp_path / version / "go.mod").write_text("module x\n")
    assert gen.pinned_releases(tmp_path) == {"1.36": tmp_path / "v1.36.3", "1.37": tmp_path / "v1.37.2"}


# ---- the generated schemas against what upstream serves ---------------------------------------------------------


def test_every_minor_from_1_19_to_1_37_has_exactly_the_apiversions_it_serves() -> None:
    for minor, api_versions in generated().items():
        version = KubeVersion(*minor)
        served = {s.api_version for s in all_schemas() if s.kind == CONFIG_KIND and s.serves(version)}
        assert set(api_versions) == served, minor
    assert list(generated()) == [(1, m) for m in range(19, 38)]


V1 = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
V1BETA3 = "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n"
PRE_ENQUEUE = "profiles:\n- plugins:\n    preEnqueue:\n      enabled:\n      - name: SchedulingGates\n"


def check(text: str, version: str) -> str | None:
    try:
        validate_document(load_single(text, "/src/config.yaml"), "/src/config.yaml", version=_v(version))
    except ConfigError as err:
        return err.problem
    return None


def _v(text: str) -> KubeVersion:
    major, minor = text.split(".")[:2]
    return KubeVersion(int(major), int(minor))


@pytest.mark.parametrize(
    ("text", "refused_in", "accepted_in", "problem"),
    [
        (V1 + PRE_ENQUEUE, ["1.25"], ["1.26", "1.36"], "profiles[0].plugins.preEnqueue: not known to "
         "kube-scheduler {v} (added in 1.26)"),
        (V1BETA3 + PRE_ENQUEUE, ["1.23", "1.24", "1.25"], ["1.26", "1.28"], "profiles[0].plugins.preEnqueue: not "
         "known to kube-scheduler {v} (added in 1.26)"),
        (V1 + "delayCacheUntilActive: true\n", ["1.25", "1.26", "1.27"], ["1.28", "1.36"],
         "delayCacheUntilActive: not known to kube-scheduler {v} (added in 1.28)"),
        (V1 + "profiles:\n- plugins:\n    placementGenerate: {}\n", ["1.25", "1.30", "1.35"], ["1.36"],
         "profiles[0].plugins.placementGenerate: not known to kube-scheduler {v} (added in 1.36)"),
        (V1 + "profiles:\n- plugins:\n    placementScore: {}\n", ["1.35"], ["1.36"],
         "profiles[0].plugins.placementScore: not known to kube-scheduler {v} (added in 1.36)"),
        (V1 + "profiles:\n- plugins:\n    podGroupPostFilter: {}\n", ["1.25", "1.36"], ["1.37"],
         "profiles[0].plugins.podGroupPostFilter: not known to kube-scheduler {v} (added in 1.37)"),
        (V1 + "profiles:\n- percentageOfNodesToScore: 50\n", ["1.25"], ["1.26"],
         "profiles[0].percentageOfNodesToScore: not known to kube-scheduler {v} (added in 1.26)"),
        (V1BETA3.replace("v1beta3", "v1beta1") + "parallelism: 8\n", ["1.19"], ["1.20", "1.22"],
         "parallelism: not known to kube-scheduler {v} (added in 1.20)"),
        (V1BETA3.replace("v1beta3", "v1beta2") + "profiles:\n- plugins:\n    multiPoint: {}\n", ["1.22"], ["1.23"],
         "profiles[0].plugins.multiPoint: not known to kube-scheduler {v} (added in 1.23)"),
    ],
)
def test_a_field_newer_than_the_node_names_the_version_that_added_it(
    text: str, refused_in: list[str], accepted_in: list[str], problem: str
) -> None:
    for version in refused_in:
        assert check(text, version) == problem.format(v=version)
    for version in accepted_in:
        assert check(text, version) is None, version


@pytest.mark.parametrize(
    "text",
    [
        PRE_ENQUEUE.replace("preEnqueue", "placementFeasible"),
        "percentageOfPlacementsToScore: 50\n",
        "profiles:\n- percentageOfPlacementsToScore: 50\n",
    ],
)
def test_fields_in_no_released_branch_are_unknown_everywhere(text: str) -> None:
    for minor in (25, 30, 36, 40):
        problem = check(V1 + text, f"1.{minor}")
        assert problem is not None and "unknown field (strict decoding" in problem and "added in" not in problem


def test_plugin_args_must_be_a_mapping() -> None:
    """An in-tree plugin's args decode into its kind; another plugin's are kept raw (runtime.Unknown), and
    kube-scheduler 1.34-1.37 start with a string there."""
    text = V1 + "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args: just a string\n"
    assert check(text, "1.30") == "profiles[0].pluginConfig[0].args: must be a mapping, got string 'just a string'"
    assert check(text.replace("NodeResourcesFit", "MyOutOfTreePlugin"), "1.30") is None


def test_in_tree_plugin_args_decode_strictly_into_their_kind() -> None:
    text = V1 + (
        "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n"
        "        type: MostAllocated\n        resourcess: []\n"
        "  - name: InterPodAffinity\n    args:\n      kind: NodeAffinityArgs\n      hardPodAffinityWeight: 1\n"
    )
    problem = check(text, "1.30")
    assert problem is not None
    assert "profiles[0].pluginConfig[0].args.scoringStrategy.resourcess: unknown field" in problem
    assert "did you mean 'resources'" in problem
    assert (
        "profiles[0].pluginConfig[1].args.kind: args for plugin InterPodAffinity must be of kind "
        "InterPodAffinityArgs, got 'NodeAffinityArgs'" in problem
    )


def test_plugin_args_added_later_are_refused_on_the_older_minor() -> None:
    text = V1 + (
        "profiles:\n- pluginConfig:\n  - name: InterPodAffinity\n    args:\n"
        "      ignorePreferredTermsOfExistingPods: true\n"
    )
    assert check(text, "1.26") == (
        "profiles[0].pluginConfig[0].args.ignorePreferredTermsOfExistingPods: not known to kube-scheduler 1.26 "
        "(added in 1.27)"
    )
    assert check(text, "1.27") is None


def test_a_scheduler_newer_than_the_generated_minors_uses_the_newest() -> None:
    text = V1 + "delayCacheUntilActive: true\nprofiles:\n- plugins:\n    podGroupPostFilter: {}\n"
    assert check(text, "1.38") is None
    problem = check(V1 + "sometimesNew: 1\n", "1.38")
    assert problem is not None and "KubeSchedulerConfiguration of kube-scheduler 1.37 has no such field" in problem


def test_an_apiversion_the_node_does_not_serve_is_refused_before_the_types() -> None:
    problem = check(V1BETA3 + "delayCacheUntilActive: true\n", "1.29")
    assert problem is not None and problem.startswith("apiVersion: kubescheduler.config.k8s.io/v1beta3 is not served")


# ---- plan refuses them in one line with exit 1 ------------------------------------------------------------------


V1BETA3_BODY = "__v1beta3__"
PLAN_CASES = [
    ("1.25", PRE_ENQUEUE, "profiles[0].plugins.preEnqueue: not known to kube-scheduler 1.25 (added in 1.26)"),
    ("1.24", V1BETA3_BODY + PRE_ENQUEUE, "profiles[0].plugins.preEnqueue: not known to kube-scheduler 1.24 "
     "(added in 1.26)"),
    ("1.27", "delayCacheUntilActive: true\n",
     "delayCacheUntilActive: not known to kube-scheduler 1.27 (added in 1.28)"),
    ("1.35", "profiles:\n- plugins:\n    placementGenerate: {}\n", "profiles[0].plugins.placementGenerate: not known "
     "to kube-scheduler 1.35 (added in 1.36)"),
    ("1.36", PRE_ENQUEUE.replace("preEnqueue", "podGroupPostFilter"),
     "profiles[0].plugins.podGroupPostFilter: not known to kube-scheduler 1.36 (added in 1.37)"),
    ("1.36", "percentageOfPlacementsToScore: 5\n", "percentageOfPlacementsToScore: unknown field"),
    ("1.30", "profiles:\n- pluginConfig:\n  - name: NodeAffinity\n    args: str\n", "args: must be a mapping"),
    ("1.30", "leaderElection:\n  resourceLock: endpointsleases\n", 'resourceLock: must be "leases"'),
    ("1.30", "leaderElection:\n  leaseDuration: 5s\n", "leaseDuration: must be greater than renewDeadline"),
    ("1.30", "podInitialBackoffSeconds: 11\n", "podMaxBackoffSeconds: must be greater than or equal to"),
    ("1.30", "profiles:\n- percentageOfNodesToScore: 101\n", "profiles[0].percentageOfNodesToScore: not in valid"),
    ("1.30", "profiles:\n- schedulerName: a\n- {}\n", "profiles[1].schedulerName: required"),
    ("1.30", "profiles:\n- schedulerName: a\n  plugins:\n    queueSort:\n      enabled: [{name: A}]\n"
     "- schedulerName: b\n", "profiles[1].plugins.queueSort: must be the same for all profiles"),
    ("1.30", "profiles:\n- pluginConfig:\n  - name: A\n  - name: A\n", "duplicate pluginConfig for A"),
    ("1.32", "profiles:\n- plugins:\n    filter:\n      enabled: [{name: AzureDiskLimits}]\n",
     "AzureDiskLimits was invalid in version"),
    ("1.30", "clientConnection:\n  burst: -5\n", "clientConnection.burst: must be non-negative"),
    ("1.30", "extenders:\n- urlPrefix: http://a/\n  managedResources: [{name: kubernetes.io/x}]\n",
     "must be a qualified extended resource name"),
    ("1.30", "profiles:\n- pluginConfig:\n  - name: InterPodAffinity\n    args: {hardPodAffinityWeight: 200}\n",
     "hardPodAffinityWeight: not in valid range"),
    ("1.30", "extenders:\n- urlPrefix: \"http://a\\nb/\"\n", "invalid control character"),
]


@pytest.mark.parametrize(("version", "body", "problem"), PLAN_CASES)
def test_plan_refuses_with_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, body: str, problem: str
) -> None:
    (tmp_path / "node/etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(FIXTURES / "manifests/kubeadm.yaml", tmp_path / "node" / MANIFEST)
    (tmp_path / "src").mkdir()
    head = V1BETA3 if body.startswith(V1BETA3_BODY) else V1
    (tmp_path / "src/config.yaml").write_text(head + body.removeprefix(V1BETA3_BODY))
    argv = ["plan", "--host-root", str(tmp_path / "node"), "--source", str(tmp_path / "src"), "--kube-version", version]
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and problem in lines[0] and str(tmp_path / "src/config.yaml") in lines[0]


def test_plan_accepts_the_same_fields_on_the_minor_that_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "node/etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(FIXTURES / "manifests/kubeadm.yaml", tmp_path / "node" / MANIFEST)
    (tmp_path / "src").mkdir()
    (tmp_path / "src/config.yaml").write_text(V1 + "delayCacheUntilActive: true\n" + PRE_ENQUEUE)
    argv = ["plan", "--host-root", str(tmp_path / "node"), "--source", str(tmp_path / "src"), "--kube-version", "1.28"]
    assert main(argv) == 2  # changes pending: the patch would go ahead
