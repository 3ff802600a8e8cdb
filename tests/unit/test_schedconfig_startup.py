"""What kube-scheduler refuses at start-up outside validation.go, per minor.

For every start-up rule in ``startup.RULES`` (``schemas/rules.json``): at the minor where it starts (and, when that
is after 1.19, at the minor before) one config the scheduler refuses and one it accepts, written from the upstream
source the rule names. Then the whole path: ``build_config`` with the manifest's flags and image, and ``plan``
exiting 1 with one line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patcher.commands.cli import main
from patcher.core.errors import ConfigError
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.core.schedconfig.rules import PLUGINS, RULE_BY_KEY, RULES, point_interface
from patcher.core.schedconfig.schema import generated
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.version import KubeVersion, Launch
from patcher.core.schedconfig.yamlio import load_single
from tests.conftest import FIXTURES
from tools.gen_startup_rules_doc import rules_table

ROOT = Path(__file__).resolve().parents[2]
GROUP = "kubescheduler.config.k8s.io"
UPSTREAM = Launch(upstream_image=True)


def doc(api: str, body: str = "") -> str:
    return f"apiVersion: {GROUP}/{api}\nkind: KubeSchedulerConfiguration\n{body}"


def profile(api: str, plugins: str) -> str:
    indented = "".join(f"    {line}\n" for line in plugins.splitlines())
    return doc(api, f"profiles:\n- schedulerName: s\n  plugins:\n{indented}")


def fit_args(api: str, strategy: str) -> str:
    indented = "".join(f"        {line}\n" for line in strategy.splitlines())
    return doc(api, "profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n"
               + indented)


def problem(text: str, minor: int, launch: Launch | None = None) -> str | None:
    version = KubeVersion(1, minor, launch=launch)
    try:
        validate_document(load_single(text, "/src/c.yaml"), "/src/c.yaml", version=version)
    except ConfigError as err:
        return err.problem
    return None


def flags(*items: str) -> Launch:
    pairs = tuple((name, value or None) for name, _, value in (item.partition("=") for item in items))
    return Launch(leader_election=pairs)


def dra(args: str, *, disable: bool = False) -> str:
    plugins = "  plugins:\n    multiPoint:\n      disabled:\n      - name: DynamicResources\n" if disable else ""
    return doc("v1", f"profiles:\n- pluginConfig:\n  - name: DynamicResources\n    args:\n      {args}\n{plugins}")


def gates_off(*names: str) -> Launch:
    return Launch(gates_off=frozenset(names))


RTCR = "type: RequestedToCapacityRatio\nrequestedToCapacityRatio:\n  shape:\n  - {utilization: 0, score: 0}\n"

# (rule, minor, config, launch, refused?) — refused cases must name the rule and the minor.
CASES: list[tuple[str, int, str, Launch | None, bool]] = [
    # framework.unknownPlugin: a typo with upstream's image; the same name is another image's own plugin
    ("framework.unknownPlugin", 19, profile("v1beta1", "filter:\n  enabled:\n  - name: NodeNmae"), UPSTREAM, True),
    ("framework.unknownPlugin", 19, profile("v1beta1", "filter:\n  enabled:\n  - name: NodeNmae"), Launch(), False),
    ("framework.unknownPlugin", 36, profile("v1", "multiPoint:\n  enabled:\n  - name: Coscheduling"), UPSTREAM,
     True),
    ("framework.unknownPlugin", 36, profile("v1", "multiPoint:\n  enabled:\n  - name: Coscheduling"), None, False),
    # EBSLimits left the registry in 1.32 (multiPoint is not checked by validation.go)
    ("framework.unknownPlugin", 31, profile("v1", "multiPoint:\n  enabled:\n  - name: EBSLimits"), UPSTREAM, False),
    ("framework.unknownPlugin", 32, profile("v1", "multiPoint:\n  enabled:\n  - name: EBSLimits"), UPSTREAM, True),
    # SchedulingGates arrived in 1.26
    ("framework.unknownPlugin", 25, profile("v1", "multiPoint:\n  enabled:\n  - name: SchedulingGates"), UPSTREAM,
     True),
    ("framework.unknownPlugin", 26, profile("v1", "multiPoint:\n  enabled:\n  - name: SchedulingGates"), UPSTREAM,
     False),
    # SelectorSpread left the registry in 1.29 (kubernetes#117720), NodeLabel in 1.23 (kubernetes#105906)
    ("framework.unknownPlugin", 28, profile("v1beta3", "multiPoint:\n  enabled:\n  - name: SelectorSpread"),
     UPSTREAM, False),
    ("framework.unknownPlugin", 29, profile("v1", "multiPoint:\n  enabled:\n  - name: SelectorSpread"), UPSTREAM,
     True),
    ("framework.unknownPlugin", 22, profile("v1beta1", "filter:\n  enabled:\n  - name: NodeLabel"), UPSTREAM,
     False),
    ("framework.unknownPlugin", 23, profile("v1beta3", "multiPoint:\n  enabled:\n  - name: NodeLabel"), UPSTREAM,
     True),
    # framework.extensionPoint: NodeName is a filter plugin
    ("framework.extensionPoint", 19, profile("v1beta1", "score:\n  enabled:\n  - name: NodeName"), None, True),
    ("framework.extensionPoint", 19, profile("v1beta1", "filter:\n  enabled:\n  - name: NodeName"), None, False),
    ("framework.extensionPoint", 36, profile("v1", "score:\n  enabled:\n  - name: NodeUnschedulable"), None, True),
    ("framework.extensionPoint", 36, profile("v1", "filter:\n  enabled:\n  - name: NodeUnschedulable"), None, False),
    # framework.duplicate
    ("framework.duplicate", 19,
     profile("v1beta1", "filter:\n  enabled:\n  - name: NodeName\n  - name: NodeName"), None, True),
    ("framework.duplicate", 36, profile("v1", "filter:\n  enabled:\n  - name: NodeName\n  - name: NodeName"),
     None, True),
    ("framework.duplicate", 36, profile("v1", "filter:\n  enabled:\n  - name: NodeName"), None, False),
    # framework.multiPointDuplicate: multiPoint exists from v1beta3 (1.23)
    ("framework.multiPointDuplicate", 23,
     profile("v1beta3", "multiPoint:\n  enabled:\n  - name: ImageLocality\n  - name: ImageLocality"), None, True),
    ("framework.multiPointDuplicate", 23,
     profile("v1beta3", "multiPoint:\n  enabled:\n  - name: ImageLocality\n  - name: ImageLocality\n"
             "score:\n  enabled:\n  - name: ImageLocality"), None, False),  # explicit at its only point: override
    ("framework.multiPointDuplicate", 36,
     profile("v1", "multiPoint:\n  enabled:\n  - name: NodeName\n  - name: NodeName"), None, True),
    ("framework.multiPointDuplicate", 36,
     profile("v1", "multiPoint:\n  enabled:\n  - name: NodeName\n  - name: NodeName\nfilter:\n  disabled:\n"
             "  - name: NodeName"), None, False),  # disabled at the only point it implements
    # framework.queueSort: after defaults, disables and multiPoint there must be exactly one
    ("framework.queueSort", 19, profile("v1beta1", "queueSort:\n  disabled:\n  - name: '*'"), None, True),
    ("framework.queueSort", 19,
     profile("v1beta1", "queueSort:\n  enabled:\n  - name: Own\n  disabled:\n  - name: '*'"), None, False),
    ("framework.queueSort", 36, profile("v1", "queueSort:\n  enabled:\n  - name: Own"), None, True),
    ("framework.queueSort", 36,
     profile("v1", "queueSort:\n  enabled:\n  - name: Own\n  disabled:\n  - name: PrioritySort"), None, False),
    ("framework.queueSort", 36, profile("v1", "multiPoint:\n  disabled:\n  - name: '*'\n"
                                        "bind:\n  enabled:\n  - name: DefaultBinder"), None, True),
    # framework.bind
    ("framework.bind", 19, profile("v1beta1", "bind:\n  disabled:\n  - name: DefaultBinder"), None, True),
    ("framework.bind", 19, profile("v1beta1", "bind:\n  disabled:\n  - name: '*'\n  enabled:\n  - name: Own"),
     None, False),
    ("framework.bind", 36, profile("v1", "multiPoint:\n  disabled:\n  - name: DefaultBinder"), None, True),
    ("framework.bind", 36, profile("v1", "multiPoint:\n  disabled:\n  - name: DefaultBinder\n"
                                   "bind:\n  enabled:\n  - name: Own"), None, False),
    # framework.invalidSelectorSpread: v1 only, from 1.25
    ("framework.invalidSelectorSpread", 24,
     profile("v1beta3", "score:\n  enabled:\n  - name: SelectorSpread"), None, False),
    ("framework.invalidSelectorSpread", 25, profile("v1", "score:\n  enabled:\n  - name: SelectorSpread"), None,
     True),
    ("framework.invalidSelectorSpread", 25,
     profile("v1beta3", "score:\n  enabled:\n  - name: SelectorSpread"), None, False),
    # framework.invalidVolumeLimits: v1, from 1.31
    ("framework.invalidVolumeLimits", 30, profile("v1", "filter:\n  enabled:\n  - name: EBSLimits"), None, False),
    ("framework.invalidVolumeLimits", 31, profile("v1", "filter:\n  enabled:\n  - name: EBSLimits"), None, True),
    # resourceLock.*: client-go's New
    ("resourceLock.endpoints", 23, doc("v1beta3", "leaderElection:\n  resourceLock: endpoints\n"), None, False),
    ("resourceLock.endpoints", 24, doc("v1beta3", "leaderElection:\n  resourceLock: endpoints\n"), None, True),
    ("resourceLock.endpoints", 24,
     doc("v1beta3", "leaderElection:\n  leaderElect: false\n  resourceLock: endpoints\n"), None, False),
    ("resourceLock.migration", 26, doc("v1", "leaderElection:\n  resourceLock: configmapsleases\n"), None, False),
    ("resourceLock.migration", 28, doc("v1", "leaderElection:\n  resourceLock: configmapsleases\n"), None, True),
    ("resourceLock.unknown", 19, doc("v1beta1", "leaderElection:\n  resourceLock: etcd\n"), None, True),
    ("resourceLock.unknown", 19, doc("v1beta1", "leaderElection:\n  resourceLock: leases\n"), None, False),
    # pluginArgs.*: ValidateNodeResourcesFitArgs per minor
    ("pluginArgs.rtcrEmptyShape", 22,
     fit_args("v1beta2", "type: RequestedToCapacityRatio\nrequestedToCapacityRatio:\n  shape: []"), None, False),
    ("pluginArgs.rtcrEmptyShape", 23,
     fit_args("v1beta3", "type: RequestedToCapacityRatio\nrequestedToCapacityRatio:\n  shape: []"), None, True),
    ("pluginArgs.rtcrRequired", 22, fit_args("v1beta2", "type: RequestedToCapacityRatio"), None, True),
    ("pluginArgs.rtcrRequired", 22, fit_args("v1beta2", RTCR), None, False),
    ("pluginArgs.rtcrOnlyWithType", 35,
     fit_args("v1", "type: LeastAllocated\nrequestedToCapacityRatio:\n  shape:\n  - {utilization: 0, score: 0}"),
     None, False),
    ("pluginArgs.rtcrOnlyWithType", 36,
     fit_args("v1", "type: LeastAllocated\nrequestedToCapacityRatio:\n  shape:\n  - {utilization: 0, score: 0}"),
     None, True),
    # pluginArgs.dra*: ValidateDynamicResourcesArgs, only what holds whatever the gates' defaults
    ("pluginArgs.draFilterTimeout", 34, dra("filterTimeout: 5s"), gates_off("DRASchedulerFilterTimeout"), True),
    ("pluginArgs.draFilterTimeout", 34, dra("filterTimeout: 5s"), Launch(), False),
    ("pluginArgs.draFilterTimeout", 34,  # validation checks the args of a disabled plugin too (the 1.34 binary)
     dra("filterTimeout: 5s", disable=True), gates_off("DRASchedulerFilterTimeout"), True),
    ("pluginArgs.draBindingTimeout", 35, dra("bindingTimeout: 500ms"), None, True),
    ("pluginArgs.draBindingTimeout", 35, dra("bindingTimeout: 1s"), None, False),
    ("pluginArgs.draBindingTimeout", 35, dra("bindingTimeout: 1s"), gates_off("DRADeviceBindingConditions"), True),
    # flags.leaderElection: from 1.23 the flags override the config, and the result is validated
    ("flags.leaderElection", 22, doc("v1beta2"), flags("leader-elect-lease-duration=5s"), False),
    ("flags.leaderElection", 23, doc("v1beta3"), flags("leader-elect-lease-duration=5s"), True),
    ("flags.leaderElection", 23,
     doc("v1beta3", "leaderElection:\n  leaderElect: false\n"),
     flags("leader-elect=true", "leader-elect-resource-lock=x"), True),
    ("flags.leaderElection", 23, doc("v1beta3", "leaderElection:\n  leaderElect: true\n"),
     flags("leader-elect=false", "leader-elect-resource-lock=x"), False),
    ("flags.leaderElection", 36, doc("v1", "leaderElection:\n  resourceLock: leases\n"),
     flags("leader-elect-resource-lock=endpoints"), True),
    # proven by the binaries: a negative score weight; a zero leader-election duration flag
    ("framework.scoreWeight", 33, profile("v1", "score:\n  enabled:\n  - name: ImageLocality\n    weight: -1"),
     None, False),
    ("framework.scoreWeight", 34, profile("v1", "score:\n  enabled:\n  - name: ImageLocality\n    weight: -1"),
     None, True),
    ("framework.scoreWeight", 34, profile("v1", "score:\n  enabled:\n  - name: ImageLocality\n    weight: 0"),
     None, False),
    ("flags.leaderElectionZero", 22, doc("v1beta2"), flags("leader-elect-lease-duration=0s"), False),
    ("flags.leaderElectionZero", 23, doc("v1beta3"), flags("leader-elect-lease-duration=0s"), True),
    ("flags.leaderElectionZero", 36, doc("v1"), flags("leader-elect-lease-duration=20s"), False),
    ("flags.leaderElectionZero", 36, doc("v1", "leaderElection:\n  leaderElect: false\n"),
     flags("leader-elect-lease-duration=0s"), False),
]

# Rules of the manifest's flags, checked against the facts of each built binary before the config is read.
FLAG_CASES: list[tuple[str, int, tuple[str, ...], bool]] = [
    ("flags.unknown", 33, ("--port=0",), False),  # no binary of 1.33 here: not checked
    ("flags.unknown", 34, ("--port=0",), True),
    ("flags.unknown", 34, ("--address=127.0.0.1",), True),
    ("flags.unknown", 36, ("--lock-object-name=x",), True),
    ("flags.unknown", 36, ("--leader-elect-resource-name=x", "--bind-address=127.0.0.1"), False),
    ("featureGates.value", 33, ("--feature-gates=APIServingWithRoutine=yes",), False),  # 1.33: not checked
    ("featureGates.value", 34, ("--feature-gates=APIServingWithRoutine=yes",), True),
    ("featureGates.value", 37, ("--feature-gates=APIServingWithRoutine",), True),  # 'missing bool value'
    ("featureGates.value", 37, ("--feature-gates=APIServingWithRoutine=tRuE",), True),  # ParseBool is not lower()
    ("featureGates.value", 37, ("--feature-gates=APIServingWithRoutine=",), True),
    ("featureGates.value", 37, ("--feature-gates= APIServingWithRoutine = 1 ,DRAAdminAccess=T,",), False),
    ("featureGates.locked", 37, ("--feature-gates=DRAAdminAccess=0",), True),  # probed: 'locked to true'
    ("featureGates.unknown", 34, ("--feature-gates=NoSuchGate=true",), True),
    ("featureGates.unknown", 34, ("--feature-gates=DRASchedulerFilterTimeout=false",), False),
    ("featureGates.unknown", 37, ("--feature-gates==true",), True),  # probed: 'unrecognized feature gate: '
    ("featureGates.unknown", 37, ("--feature-gates= =false",), True),
    ("featureGates.unknown", 37, ("--feature-gates=DRAAdminAccess=true, ,",), False),  # a blank entry is skipped
    ("featureGates.locked", 35, ("--feature-gates=DynamicResourceAllocation=false",), True),
    ("featureGates.locked", 37, ("--feature-gates=DRAResourceClaimDeviceStatus=false",), True),
    ("featureGates.locked", 37, ("--feature-gates=DRAResourceClaimDeviceStatus=true",), False),
    ("featureGates.dependency", 35, ("--feature-gates=DRADeviceTaintRules=true",), True),
    ("featureGates.dependency", 35, ("--feature-gates=DRADeviceTaintRules=true,DRADeviceTaints=true",), False),
    ("featureGates.dependency", 36, ("--feature-gates=DRAResourceClaimDeviceStatus=false",), True),
    ("featureGates.dependency", 36,
     ("--feature-gates=DRAResourceClaimDeviceStatus=false,DRADeviceBindingConditions=false,"
      "DRAResourceClaimGranularStatusAuthorization=false",), False),
]


@pytest.mark.parametrize(("rule", "minor", "items", "refused"), FLAG_CASES)
def test_flag_rule_at_its_boundary(rule: str, minor: int, items: tuple[str, ...], refused: bool) -> None:
    from patcher.core.schedconfig.binary import flag_problems
    from patcher.core.schedconfig.flags import parse_flags

    found = flag_problems(parse_flags(items), minor)
    assert bool(found) == refused, found
    if refused:
        assert all(f"rule {rule}" in p and f"kube-scheduler 1.{minor} " in p for p in found), found


def test_a_feature_gate_without_a_name_is_refused_in_plain_words() -> None:
    from patcher.core.schedconfig.binary import flag_problems
    from patcher.core.schedconfig.flags import parse_flags

    assert flag_problems(parse_flags(["--feature-gates==true"]), 37) == [
        "--feature-gates: an entry gives a value but no gate name, as in =true (write Name=true) "
        "(kube-scheduler 1.37 exits at start-up; rule featureGates.unknown)"]


@pytest.mark.parametrize(("rule", "minor", "text", "launch", "refused"), CASES)
def test_rule_at_its_boundary(rule: str, minor: int, text: str, launch: Launch | None, refused: bool) -> None:
    found = problem(text, minor, launch)
    if not refused:
        assert found is None
        return
    assert found is not None
    assert "\n" not in found
    assert rule in found or rule.startswith(("flags.", "framework.invalid", "pluginArgs.rtcrEmptyShape",
                                             "pluginArgs.rtcrRequired", "resourceLock.migration")), found
    if rule.startswith("framework.") and not rule.startswith("framework.invalid"):
        assert f"kube-scheduler 1.{minor} " in found, found


def test_every_rule_has_boundary_cases() -> None:
    """A refused and an accepted case for each rule, at its first minor or the one before it (validation.go's
    rules: tests/unit/test_schedconfig_upstream.py)."""
    for rule in (r for r in RULES if r.cls != "validation"):
        cases = [c for c in CASES if c[0] == rule.key] + [(k, m, "", None, r) for k, m, _, r in FLAG_CASES
                                                          if k == rule.key]
        assert any(c[4] for c in cases) and any(not c[4] for c in cases), rule.key
        minors = {c[1] for c in cases}
        assert rule.first[1] in minors or rule.first[1] - 1 in minors, rule.key


def test_rules_carry_their_minors_and_source() -> None:
    for rule in RULES:
        assert rule.first >= (1, 19) and rule.source and rule.what
        assert rule.last is None or rule.last >= rule.first
        assert RULE_BY_KEY[rule.key] is rule
    every_point = {point for api_versions in generated().values() for entry in api_versions.values()
                   for point in entry.types["Plugins"].fields} - {"multiPoint"}
    for name, plugin in PLUGINS.items():
        assert plugin.points is None or plugin.points <= every_point, name
        assert not plugin.always or (plugin.points is not None and plugin.always <= plugin.points), name


def _points(minor: int) -> list[str]:
    return [p for p in generated()[(1, minor)][f"{GROUP}/v1"].types["Plugins"].fields if p != "multiPoint"]


@pytest.mark.parametrize("minor", [34, 35, 36, 37])
def test_an_unknown_plugin_is_refused_at_every_extension_point_of_the_minor(minor: int) -> None:
    """The points come from the minor's generated types, not a list: the points new in 1.36 (placementGenerate,
    placementScore) and 1.37 (podGroupPostFilter) are checked like the others ("... does not exist")."""
    for point in _points(minor):
        found = problem(profile("v1", f"{point}:\n  enabled:\n  - name: NoSuchPlugin"), minor, UPSTREAM)
        assert found is not None and f"{point_interface(point)} 'NoSuchPlugin' does not exist" in found, point
        assert f"kube-scheduler 1.{minor} exits at start-up; rule framework.unknownPlugin" in found
        if point not in ("queueSort", "bind"):  # without them the profile has no queue sort or no binder
            assert problem(profile("v1", f"{point}:\n  disabled:\n  - name: '*'"), minor, UPSTREAM) is None, point


def test_each_minor_has_its_own_points() -> None:
    assert {"placementGenerate", "placementScore"} <= set(_points(36)) - set(_points(35))
    assert set(_points(37)) - set(_points(36)) == {"podGroupPostFilter"}
    text = profile("v1", "podGroupPostFilter:\n  disabled:\n  - name: '*'")
    assert problem(text, 37, UPSTREAM) is None
    found = problem(text, 36, UPSTREAM)
    assert found == "profiles[0].plugins.podGroupPostFilter: not known to kube-scheduler 1.36 (added in 1.37)"


def test_docs_table_is_generated_from_the_data() -> None:
    doc_text = (ROOT / "docs" / "scheduler-config.md").read_text(encoding="utf-8")
    assert rules_table() in doc_text
    result = subprocess.run([sys.executable, "tools/gen_startup_rules_doc.py", "check"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_docs_check_fails_on_a_stale_table() -> None:
    from tools import gen_startup_rules_doc as gen

    current = (ROOT / "docs" / "scheduler-config.md").read_text(encoding="utf-8")
    stale = current.replace("| `framework.bind` | framework | 1.19 |", "| `framework.bind` | framework | 1.20 |")
    assert stale != current
    assert gen.rendered(stale) == current


# ---- the whole path: manifest flags and image, then plan ------------------------------------------------------


def _source(tmp_path: Path, text: str) -> Path:
    source = tmp_path / "src"
    source.mkdir(parents=True)
    (source / "config.yaml").write_text(text, encoding="utf-8")
    return source


def test_build_config_validates_config_plus_flags_and_notes_the_override(tmp_path: Path) -> None:
    text = doc("v1", "leaderElection:\n  leaderElect: true\n  resourceLock: leases\n  leaseDuration: 20s\n")
    source = _source(tmp_path, text)
    ok = build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/kubernetes/sp",
                                    image="registry.k8s.io/kube-scheduler:v1.30.4",
                                    scheduler_flags=("kube-scheduler", "--leader-elect-lease-duration=30s")))
    assert any("--leader-elect-lease-duration=30s overrides leaderElection.leaseDuration='20s'" in n for n in ok.notes)
    with pytest.raises(ConfigError) as refused:
        build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/kubernetes/sp",
                                   image="registry.k8s.io/kube-scheduler:v1.30.4",
                                   scheduler_flags=("kube-scheduler", "--leader-elect-resource-lock=endpoints")))
    assert "leaderElection.resourceLock" in refused.value.problem
    # 1.22: --config silences the flag, the config is what runs
    old = _source(tmp_path / "old", doc("v1beta2", "leaderElection:\n  resourceLock: leases\n"))
    built = build_config(ConfigRequest(source_dir=old, host_config_dir="/etc/kubernetes/sp",
                                       image="registry.k8s.io/kube-scheduler:v1.22.4",
                                       scheduler_flags=("kube-scheduler", "--leader-elect-resource-lock=x")))
    assert not any("overrides" in note for note in built.notes)


def test_unknown_plugin_only_with_the_upstream_image(tmp_path: Path) -> None:
    source = _source(tmp_path, profile("v1", "multiPoint:\n  enabled:\n  - name: Coscheduling"))
    request = ConfigRequest(source_dir=source, host_config_dir="/etc/kubernetes/sp", kube_version="1.30",
                            image="registry.k8s.io/scheduler-plugins/kube-scheduler:v0.30.6")
    with pytest.raises(ConfigError, match="'Coscheduling' does not exist"):
        build_config(request)
    other = ConfigRequest(source_dir=source, host_config_dir="/etc/kubernetes/sp", kube_version="1.30",
                          image="registry.k8s.io/scheduler-plugins/sp-scheduler:v0.30.6")
    assert build_config(other).kube_version == "1.30"


def _plan_node(tmp_path: Path, config: str) -> list[str]:
    node = tmp_path / "node"
    (node / "etc/kubernetes/manifests").mkdir(parents=True)
    shutil.copy(FIXTURES / "manifests/kubeadm.yaml", node / "etc/kubernetes/manifests/kube-scheduler.yaml")
    source = _source(tmp_path, config)
    return ["plan", "--host-root", str(node), "--source", str(source)]


def test_plan_refuses_with_one_line_naming_rule_and_minor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _plan_node(tmp_path, profile("v1", "score:\n  enabled:\n  - name: NodeName"))
    assert main([*argv, "--kube-version", "1.30"]) == 1
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert "does not extend ScorePlugin" in line and "kube-scheduler 1.30" in line
    assert "framework.extensionPoint" in line and "Traceback" not in captured.err


def test_plan_still_plans_what_that_minor_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _plan_node(tmp_path, profile("v1", "score:\n  enabled:\n  - name: ImageLocality\n    weight: 3"))
    assert main([*argv, "--kube-version", "1.30"]) == 2
    assert capsys.readouterr().err == ""


def test_launch_reads_flags_image_and_switched_off_gates() -> None:
    from patcher.core.schedconfig.flags import parse_flags
    from patcher.core.schedconfig.rules import launch_for

    flags = parse_flags(["kube-scheduler", "--leader-elect=false", "--feature-gates=A=true,B=false,C=False",
                         "--leader-elect-resource-lock", "leases"])
    launch = launch_for(flags, "registry.k8s.io/kube-scheduler:v1.33.1@sha256:" + "0" * 64)
    assert launch.upstream_image and launch.gates_off == {"B", "C"}
    assert launch.leader_election == (("leader-elect", "false"), ("leader-elect-resource-lock", "leases"))
    assert not launch_for({}, "registry.k8s.io/scheduler-plugins/kube-scheduler-custom:v0.33.1").upstream_image
    assert launch_for({}, "docker.io/rancher/hardened-kubernetes:v1.30.4-rke2r1").upstream_image
    assert not launch_for({}, None).upstream_image


def test_a_typo_names_the_plugin_it_probably_meant() -> None:
    found = problem(profile("v1", "multiPoint:\n  enabled:\n  - name: NodeResourceFit"), 31, UPSTREAM)
    assert found is not None and "did you mean 'NodeResourcesFit'?" in found
    found = problem(profile("v1", "multiPoint:\n  enabled:\n  - name: EBSLimits"), 32, UPSTREAM)
    assert found is not None and "did you mean" not in found  # left the registry: no hint at itself
