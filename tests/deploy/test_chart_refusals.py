"""The chart refuses at install what the agent would refuse at start, with the agent's message.

The agent is the judge: each row of the table is rendered twice with the real helm, once as the chart is and once
without its guards (``templates/validate.yaml`` removed, the values schema skipped): what would reach the nodes.
The unguarded render's containers (their environment and arguments, read by the CLI's own parser and
``run_settings``) and its ConfigMap (read by the agent's ``build_config``) say whether the agent starts. Whatever
it refuses, the chart must refuse, and helm's error must carry the agent's message; whatever it accepts, the chart
must install.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from patcher.commands.cli import CLUSTER_COMMANDS, RunFlagError, build_parser, run_settings
from patcher.core.errors import PatcherError
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.core.schedconfig.version import SUPPORTED_MINORS
from tests.deploy.test_chart_values import ALL_VALUES
from tests.deploy.test_deploy_manifests import DOWNWARD, all_containers, configmap_folder, env_of, pod_spec
from tests.harness.real.helmtool import CHART, NAMESPACE, RELEASE, find_helm, run_helm

Obj = dict[str, Any]

HELM, WHY_NOT = find_helm()
if HELM is None:
    pytest.skip(f"real helm unavailable ({WHY_NOT})", allow_module_level=True)

KSC = ("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders:\n"
       "- urlPrefix: http://127.0.0.1:8889\n  filterVerb: filter\n")


def extender(**fields: Any) -> Obj:
    return {"extenders": [{"urlPrefix": "http://127.0.0.1:8889", "filterVerb": "filter", **fields}]}


#: Each switch, and each value the agent refuses (None: the agent starts with it).
CASES: list[tuple[str, Obj]] = [
    ("defaults", {}),
    ("every value changed", ALL_VALUES),
    ("rke2", {"platform": "rke2"}),
    ("csi-baremetal", {"csiBaremetal": {"enabled": True}}),
    ("local check", {"agent": {"localCheck": True}}),
    ("no pre-flight", {"agent": {"checkExtenders": False}}),
    ("restore never", {"agent": {"restoreOnExit": "never"}}),
    ("independent", {"agent": {"rollout": "independent"}}),
    ("no probe", {"agent": {"extenderProbeInterval": "0"}}),
    ("settle just under the timeout", {"agent": {"restartTimeout": "30", "restartSettle": "29.5s"}}),
    ("grace just under the termination", {"agent": {"gracePeriod": "134s"}}),
    ("gatekeeper", {"gatekeeper": {"enabled": True, "admission": {"enabled": True}}}),
    ("gatekeeper webhook", {"gatekeeper": {"enabled": True, "webhook": {"enabled": True}}}),
    ("config.yaml", {"extenders": [], "schedulerConfig": KSC}),
    ("https extender with weight", extender(urlPrefix="HTTPS://ext.example:8443/x", prioritizeVerb="p", weight=2)),
    ("extra args", {"extraArgs": ["--resync-interval=10m"]}),
    # refused by the agent
    ("settle over the timeout", {"agent": {"restartSettle": "20m"}}),
    ("settle equal to the timeout", {"agent": {"restartSettle": "10m"}}),
    ("timeout under the default settle", {"agent": {"restartTimeout": "5s"}}),
    ("grace over the termination", {"agent": {"gracePeriod": "150s"}}),
    ("grace equal to the termination", {"agent": {"gracePeriod": "135s"}}),
    ("termination under the grace", {"agent": {"terminationGracePeriodSeconds": 30}}),
    ("timeout in Go syntax", {"agent": {"restartTimeout": "1h30m"}}),
    ("grace in words", {"agent": {"gracePeriod": "45 seconds"}}),
    ("probe interval in words", {"agent": {"extenderProbeInterval": "1 minute"}}),
    ("settle in words", {"agent": {"restartSettle": "ten seconds"}}),
    ("the scheduler's port", {"agent": {"port": 10259}}),
    ("the old scheduler's port", {"agent": {"port": 10251}}),
    ("urlPrefix without a scheme", extender(urlPrefix="127.0.0.1:8889")),
    ("urlPrefix host:port", extender(urlPrefix="localhost:8889")),
    ("urlPrefix ftp", extender(urlPrefix="ftp://127.0.0.1:8889")),
    ("urlPrefix without //", extender(urlPrefix="http:127.0.0.1:8889")),
    ("urlPrefix without a host", extender(urlPrefix="http://:8889")),
    ("urlPrefix with a query", extender(urlPrefix="http://127.0.0.1:8889/?x=1")),
    ("prioritizeVerb without weight", extender(prioritizeVerb="prioritize")),
    ("prioritizeVerb with weight 0", extender(prioritizeVerb="prioritize", weight=0)),
    ("extra arg mistyped", {"extraArgs": ["--resync-intreval=10m"]}),
    ("extra arg of another command", {"extraArgs": ["--check-extender", "true"]}),
    ("httpTimeout in words", extender(httpTimeout="5 seconds")),
    ("restore Job timeout in Go syntax", {"restoreJob": {"timeout": "1h30m"}}),
    ("release concurrency 0", {"gatekeeper": {"enabled": True, "release": {"concurrency": 0}}}),
    ("release qps 0", {"gatekeeper": {"enabled": True, "release": {"kubeApiQps": 0}}}),
]


@pytest.fixture(scope="module")
def charts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the chart, a copy without its guards)."""
    bare = tmp_path_factory.mktemp("bare") / "chart"
    shutil.copytree(CHART, bare)
    (bare / "templates/validate.yaml").unlink()
    yield CHART, bare


def helm_template(chart: Path, values: Obj, tmp: Path, *extra: str) -> tuple[int, str, list[Obj]]:
    assert HELM is not None
    proc = run_helm(HELM, "template", RELEASE, str(chart), "--namespace", NAMESPACE, *extra, values=values, tmp=tmp)
    objs = [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)] if proc.returncode == 0 else []
    return proc.returncode, proc.stderr, objs


@contextlib.contextmanager
def container_env(container: Obj) -> Iterator[None]:
    """The process environment of ``container`` (its ``PATCHER_*`` and downward-API variables), for the parser."""
    saved = {k: v for k, v in os.environ.items()
             if k.startswith("PATCHER_") or k in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE", "KUBECONFIG")}
    for key in saved:
        del os.environ[key]
    for name, entry in env_of(container).items():
        os.environ[name] = entry["value"] if "value" in entry else DOWNWARD[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    try:
        yield
    finally:
        for name in env_of(container):
            os.environ.pop(name, None)
        os.environ.update(saved)


def flag_refusal(container: Obj) -> str | None:
    """What the CLI says when this container starts (None: it starts): the parser's, then ``run_settings``'."""
    argv = list(container.get("args", []))
    with container_env(container):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                args = build_parser(load=[argv[0]] if argv[0] in CLUSTER_COMMANDS else []).parse_args(argv)
            except SystemExit:
                line = err.getvalue().strip().splitlines()[-1]
                problem = line.split(": error: ", 1)[1]
                return problem.split(": ", 1)[1] if problem.startswith("argument ") else problem
        if argv[0] == "run":
            try:
                run_settings(args)
            except RunFlagError as exc:
                return str(exc)
        if argv[0] == "gatekeeper":
            from patcher.commands.gatekeeper import usage_problems

            return next(iter(usage_problems(args)), None)
    return None


def agent_refusal(objs: list[Obj], tmp: Path) -> str | None:
    """What the agent (and the restore Job, the gatekeeper) would refuse in this render, in their words."""
    specs = [o["template"]["spec"] if o["kind"] == "PodTemplate" else pod_spec(o)
             for o in objs if o["kind"] in ("DaemonSet", "Job", "Deployment", "PodTemplate")]
    ours = [c for spec in specs for c in all_containers(spec) if c.get("args")]
    assert any(c["args"][0] == "run" for c in ours)
    for container in ours:
        refusal = flag_refusal(container)
        if refusal is not None:
            return refusal
    [cm] = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scheduler-patcher-source"]
    newest = "{}.{}".format(*SUPPORTED_MINORS[1])
    try:
        source = configmap_folder(Path(tempfile.mkdtemp(dir=tmp)) / "source", cm["data"])
        build_config(ConfigRequest(source_dir=source, host_config_dir="/etc/x", kube_version=newest))
    except PatcherError as exc:
        return exc.problem
    return None


@pytest.mark.parametrize(("values",), [pytest.param(v, id=name) for name, v in CASES])
def test_the_chart_refuses_what_the_agent_refuses_in_its_words(charts: tuple[Path, Path], values: Obj,
                                                              tmp_path: Path) -> None:
    chart, bare = charts
    code, _, unguarded = helm_template(bare, values, tmp_path, "--skip-schema-validation")
    assert code == 0, "the unguarded chart must render, for the agent to judge it"
    verdict = agent_refusal(unguarded, tmp_path)
    code, err, _ = helm_template(chart, values, tmp_path)
    if verdict is None:
        assert code == 0, f"the agent starts with {values}, the chart refuses it: {err}"
    else:
        assert code != 0, f"the agent refuses {values} ({verdict}), the chart installs it"
        [line] = [x for x in err.splitlines() if x.startswith("Error:")]
        said = verdict.split("; did you mean")[0]  # the agent's hint needs its flag list; the chart names --help
        assert said in line, f"helm does not say the agent's message {said!r}: {line}"


def test_the_table_has_both_verdicts(charts: tuple[Path, Path], tmp_path: Path) -> None:
    """Each refusal kind is in the table: a flag the parser refuses, one run_settings refuses, a config one."""
    names = dict(CASES)
    _, bare = charts
    kinds = []
    for name in ("timeout in Go syntax", "settle over the timeout", "grace over the termination",
                 "urlPrefix without a scheme", "prioritizeVerb without weight", "defaults"):
        _, _, objs = helm_template(bare, names[name], tmp_path, "--skip-schema-validation")
        kinds.append(agent_refusal(objs, tmp_path))
    assert kinds == [
        "not a duration: '1h30m' (examples: 30, 30s, 500ms, 5m, 1h)",
        "--restart-settle 1200s: must be shorter than --restart-timeout (600s), or no restart could ever count as "
        "Ready",
        "--grace-period 150s: must be shorter than --termination-grace-period (135s, the pod's "
        "terminationGracePeriodSeconds), or the kubelet kills the agent inside its restore",
        "extenders[0].urlPrefix: must be an http:// or https:// URL with a host (missing protocol scheme), got "
        "'127.0.0.1:8889'",
        "extenders[0].weight: must be > 0 when prioritizeVerb is set (got None)",
        None,
    ]


def test_the_pods_termination_grace_reaches_the_agent(charts: tuple[Path, Path], tmp_path: Path) -> None:
    chart, _ = charts
    for values in ({}, {"agent": {"terminationGracePeriodSeconds": 75, "gracePeriod": "70s"}}):
        _, _, objs = helm_template(chart, values, tmp_path)
        [ds] = [o for o in objs if o["kind"] == "DaemonSet"]
        spec = pod_spec(ds)
        env = env_of(spec["containers"][0])
        assert env["PATCHER_TERMINATION_GRACE_PERIOD"]["value"] == f"{spec['terminationGracePeriodSeconds']}s"


def test_helm_install_refuses_too(charts: tuple[Path, Path], tmp_path: Path) -> None:
    """``helm install`` runs the same guards as ``helm template`` (before anything reaches the cluster)."""
    assert HELM is not None
    chart, _ = charts
    proc = run_helm(HELM, "install", "--dry-run=client", RELEASE, str(chart), "--namespace", NAMESPACE,
                    values={"agent": {"restartSettle": "20m"}}, tmp=tmp_path)
    assert proc.returncode != 0
    assert ("agent.restartSettle: --restart-settle 1200s: must be shorter than --restart-timeout (600s), or no "
            "restart could ever count as Ready") in proc.stderr


@pytest.mark.parametrize(("version", "installs"), [
    ("{}.{}.0".format(*SUPPORTED_MINORS[0]), True), ("{}.{}.9".format(*SUPPORTED_MINORS[1]), True),
    (f"{SUPPORTED_MINORS[0][0]}.{SUPPORTED_MINORS[0][1] - 1}.5", False),
    (f"{SUPPORTED_MINORS[1][0]}.{SUPPORTED_MINORS[1][1] + 1}.0", False),
])
def test_the_charts_kube_version_is_the_supported_range(charts: tuple[Path, Path], tmp_path: Path, version: str,
                                                        installs: bool) -> None:
    chart, _ = charts
    code, err, _ = helm_template(chart, {}, tmp_path, "--kube-version", version)
    assert (code == 0) == installs, err
    if not installs:
        assert "incompatible with Kubernetes" in err


# -- every value check reads as a sentence --------------------------------------------------------------------

#: One bad value per check that values.schema.json would say in JSON-schema wording (a pattern, a range, a length,
#: a list of choices, a duplicate): (the value's path, as the error must name it; the values).
SENTENCES: list[tuple[str, Obj]] = [
    ("platform", {"platform": "k3s"}),
    ("image.repository", {"image": {"repository": ""}}),
    ("image.digest", {"image": {"digest": "abc"}}),
    ("image.pullPolicy", {"image": {"pullPolicy": "always"}}),
    ("imagePullSecrets[0].name", {"imagePullSecrets": [{"name": ""}]}),
    ("extenders[0].urlPrefix", extender(urlPrefix="")),
    ("extenders[0].httpTimeout", extender(httpTimeout="5 seconds")),
    ("extenders[0].managedResources[0].name", extender(managedResources=[{"name": ""}])),
    ("hostPaths.manifestDir", {"hostPaths": {"manifestDir": "etc/kubernetes/manifests"}}),
    ("hostPaths.manifestName", {"hostPaths": {"manifestName": "manifests/kube-scheduler.yaml"}}),
    ("hostPaths.manifestName", {"hostPaths": {"manifestName": ""}}),
    ("hostPaths.configDir", {"hostPaths": {"configDir": "etc/sp"}}),
    ("hostPaths.stateDir", {"hostPaths": {"stateDir": "var/lib/x"}}),
    ("hostPaths.foreignConfigDirs[0]", {"hostPaths": {"foreignConfigDirs": ["/"]}}),
    ("hostPaths.foreignConfigDirs", {"hostPaths": {"foreignConfigDirs": ["/etc/a", "/etc/a"]}}),
    ("agent.annotationPrefix", {"agent": {"annotationPrefix": ""}}),
    ("agent.port", {"agent": {"port": 0}}),
    ("agent.port", {"agent": {"port": 65536}}),
    ("agent.restoreOnExit", {"agent": {"restoreOnExit": "sometimes"}}),
    ("agent.rollout", {"agent": {"rollout": "serial"}}),
    ("agent.rolloutLease", {"agent": {"rolloutLease": ""}}),
    ("agent.terminationGracePeriodSeconds", {"agent": {"terminationGracePeriodSeconds": 0}}),
    ("agent.logFormat", {"agent": {"logFormat": "xml"}}),
    ("agent.logLevel", {"agent": {"logLevel": "trace"}}),
    ("csiBaremetal.namespace", {"csiBaremetal": {"namespace": ""}}),
    ("dnsPolicy", {"dnsPolicy": "ClusterFirstWithHostnet"}),
    ("dnsConfig.nameservers[0]", {"dnsConfig": {"nameservers": [""]}}),
    ("dnsConfig.searches[0]", {"dnsConfig": {"searches": [""]}}),
    ("dnsConfig.options[0].name", {"dnsConfig": {"options": [{"name": ""}]}}),
    ("extraEnv[0].name", {"extraEnv": [{"name": ""}]}),
    ("stopAgentsJob.extraEnv[0].name", {"stopAgentsJob": {"extraEnv": [{"name": "", "value": "x"}]}}),
    ("restoreJob.extraEnv[1].name", {"restoreJob": {"extraEnv": [{"name": "A"}, {"name": ""}]}}),
    ("gatekeeper.replicas", {"gatekeeper": {"replicas": -1}}),
    ("gatekeeper.gateName", {"gatekeeper": {"gateName": "ready'"}}),
    ("gatekeeper.gateName", {"gatekeeper": {"gateName": "a" * 317}}),
    ("gatekeeper.port", {"gatekeeper": {"port": 70000}}),
    ("gatekeeper.logFormat", {"gatekeeper": {"logFormat": "xml"}}),
    ("gatekeeper.admission.apiVersion", {"gatekeeper": {"admission": {"apiVersion": "v1alpha1"}}}),
    ("gatekeeper.admission.namespaceSelector.matchExpressions[0].key",
     {"gatekeeper": {"admission": {"namespaceSelector": {"matchExpressions": [{"key": "", "operator": "Exists"}]}}}}),
    ("gatekeeper.admission.objectSelector.matchExpressions[0].operator",
     {"gatekeeper": {"admission": {"objectSelector": {"matchExpressions": [{"key": "a", "operator": "in"}]}}}}),
    ("gatekeeper.admission.schedulerNames[0]", {"gatekeeper": {"admission": {"schedulerNames": ["x') || true"]}}}),
    ("gatekeeper.admission.schedulerNames", {"gatekeeper": {"admission": {"schedulerNames": ["a", "a"]}}}),
    ("gatekeeper.admission.storageClasses[0]", {"gatekeeper": {"admission": {"storageClasses": ["Fast"]}}}),
    ("gatekeeper.admission.storageClasses", {"gatekeeper": {"admission": {"storageClasses": ["a", "a"]}}}),
    ("gatekeeper.admission.csiDrivers[0]", {"gatekeeper": {"admission": {"csiDrivers": ["csi'x"]}}}),
    ("gatekeeper.admission.csiDrivers[0]", {"gatekeeper": {"admission": {"csiDrivers": ["c" * 64]}}}),
    ("gatekeeper.admission.csiDrivers", {"gatekeeper": {"admission": {"csiDrivers": ["a", "a"]}}}),
    ("gatekeeper.release.concurrency", {"gatekeeper": {"release": {"concurrency": 0}}}),
    ("gatekeeper.release.batch", {"gatekeeper": {"release": {"batch": 0}}}),
    ("gatekeeper.release.kubeApiQps", {"gatekeeper": {"release": {"kubeApiQps": 0}}}),
    ("gatekeeper.release.kubeApiBurst", {"gatekeeper": {"release": {"kubeApiBurst": 0}}}),
    ("gatekeeper.webhook.port", {"gatekeeper": {"webhook": {"port": 0}}}),
    ("gatekeeper.webhook.timeoutSeconds", {"gatekeeper": {"webhook": {"timeoutSeconds": 31}}}),
    ("gatekeeper.webhook.certValidityDays", {"gatekeeper": {"webhook": {"certValidityDays": 0}}}),
    ("restoreJob.timeout", {"restoreJob": {"timeout": "4 minutes"}}),
    ("restoreJob.activeDeadlineSeconds", {"restoreJob": {"activeDeadlineSeconds": 0}}),
    ("restoreJob.ttlSecondsAfterFinished", {"restoreJob": {"ttlSecondsAfterFinished": -1}}),
    ("monitoring.podMonitor.interval", {"monitoring": {"podMonitor": {"interval": "1 minute"}}}),
    ("monitoring.podMonitor.scrapeTimeout", {"monitoring": {"podMonitor": {"scrapeTimeout": "10"}}}),
    ("monitoring.prometheusRule.for", {"monitoring": {"prometheusRule": {"for": {"Foo": "5m"}}}}),
    ("monitoring.prometheusRule.for.SchedulerPatcherVerdictNotReady",
     {"monitoring": {"prometheusRule": {"for": {"SchedulerPatcherVerdictNotReady": "five minutes"}}}}),
    ("monitoring.prometheusRule.disabled[0]", {"monitoring": {"prometheusRule": {"disabled": ["foo"]}}}),
]

#: What helm's JSON-schema errors say instead of a sentence.
JARGON = ("does not match pattern", "'not' failed", "minimum:", "maximum:", "exclusiveMinimum", "minLength:",
          "maxLength:", ", want ", "value must be one of", "are equal", "invalid propertyName",
          "don't meet the specifications")


@pytest.mark.parametrize(("path", "values"), [pytest.param(p, v, id=f"{p}={v}"[:90]) for p, v in SENTENCES])
def test_every_value_error_is_a_sentence_naming_the_value(charts: tuple[Path, Path], path: str, values: Obj,
                                                           tmp_path: Path) -> None:
    chart, _ = charts
    code, err, _ = helm_template(chart, values, tmp_path)
    assert code != 0, f"the chart installs {values}"
    [line] = [x for x in err.splitlines() if x.startswith("Error:")]
    said = line.split("): ", 1)[1] if line.startswith("Error: execution error at (") else line
    assert said.startswith(f"{path}: "), f"the error does not start with the value's path {path}: {line}"
    assert not [j for j in JARGON if j in said], f"JSON-schema wording in {line}"
    assert [w for w in ("must", "is not one of", "(examples:") if w in said], f"not what {path} must be: {line}"


#: The schema's keywords that stay: types, nesting, required keys and the refusal of unknown keys (a typo).
KEPT_KEYWORDS = {"$schema", "title", "type", "properties", "additionalProperties", "items", "required",
                 "description"}


def test_the_schema_keeps_only_types_and_keys() -> None:
    """A pattern, range, length or enum added to values.schema.json would be said in JSON-schema wording: such a
    check belongs in templates/validate.yaml, with a sentence, and a row in SENTENCES."""
    import json

    def keywords(node: Any, inside_properties: bool = False) -> set[str]:
        if isinstance(node, list):
            return {k for x in node for k in keywords(x)}
        if not isinstance(node, dict):
            return set()
        if inside_properties:  # value names, not keywords
            return {k for x in node.values() for k in keywords(x)}
        return set(node) | {k for key, x in node.items() for k in keywords(x, key == "properties")}

    schema = json.loads((CHART / "values.schema.json").read_text("utf-8"))
    assert keywords(schema) - KEPT_KEYWORDS == set()
    assert schema["additionalProperties"] is False


def test_the_sentence_table_has_every_guarded_path() -> None:
    """Each value path templates/validate.yaml names in a failure has a row (or a row in CASES, the agent's)."""
    import re

    guards = (CHART / "templates/validate.yaml").read_text("utf-8")
    tested = " ".join([p for p, _ in SENTENCES] + [repr(v) for _, v in CASES])
    literals = set(re.findall(r'"((?:[a-z][A-Za-z]*\.)+[a-z][A-Za-z]*)"', guards))
    for literal in sorted(x for x in literals if not x.startswith("sp.")):
        leaf = literal.rsplit(".", 1)[1]
        assert literal in tested or f"'{leaf}'" in tested, f"{literal}: no bad value in SENTENCES or CASES"
