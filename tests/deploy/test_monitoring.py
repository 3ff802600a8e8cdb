"""What an operator on a Prometheus stack gets, checked against the code and the real tools.

- The agents' and the gatekeeper's real ``/metrics`` pass ``promtool check metrics`` (naming, units, suffixes).
- The alert rules (charts/scheduler-patcher/files/alerts.yaml) pass ``promtool check rules``, and
  ``promtool test rules`` runs tests/monitoring/alerts.test.yaml, where every alert fires on its trouble and stays
  silent on look-alikes; the same tests fail against rules whose thresholds are gone.
- Every query of the rules and of the Grafana dashboard names a metric the code exports (and parses).
- The chart's monitoring objects and the kustomize component validate against the Prometheus Operator CRDs' schema
  (tests/harness/real/promcrds.py), agree with each other and select the pods and ports that serve ``/metrics``.

promtool comes from tools/get-promtool.sh, helm from ../shared/tools/get-helm.sh, the CRDs from the Go module
proxy; a test whose tool is missing skips with one line (fails under CI=true, tests/harness/needs.py).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from patcher.adapters.health import Health, HealthServer, Metrics, Renderable
from patcher.core.admission import Selection
from patcher.services.gatekeeper import GateMetrics
from patcher.services.webhook import AdmissionWebhook
from tests.deploy.test_deploy_manifests import K8S_SCHEMA, MANIFESTS, objects, pod_spec
from tests.harness.needs import missing
from tests.harness.real import promcrds
from tests.harness.real.helmtool import CHART, MONITORING_VALUES, find_helm, run_helm, template
from tests.harness.real.promtool import RULE_TESTS, RULES, find_promtool, promtool
from tools import sync_monitoring

Obj = dict[str, Any]
DASHBOARD = CHART / "files/dashboard.json"
ALERTS_DOC = Path(__file__).resolve().parents[2] / "docs/alerts.md"
#: Series the rules read that another exporter serves (kube-state-metrics).
EXTERNAL = {"kube_pod_info"}
#: Grafana's variables, as a query sends them to Prometheus.
GRAFANA_VARS = {"$__rate_interval": "1m", "$namespace": "scheduler-patcher"}


def rules() -> list[Obj]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    def walk(panels: list[Obj]) -> Iterator[str]:
        for p in panels:
            yield from (t["expr"] for t in p.get("targets", []))
            yield from walk(p.get("panels", []))

    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


# -- the tools ------------------------------------------------------------------------------------------------


def have(found: tuple[Any, str], what: str) -> Any:
    """The tool a finder found, or the one-line skip (a failure under CI=true) that says why not."""
    if found[0] is None:
        missing(f"{what} unavailable ({found[1]})")
    return found[0]


@pytest.fixture(scope="module")
def promtool_bin() -> str:
    return str(have(find_promtool(), "real promtool"))


@pytest.fixture(scope="module")
def helm() -> str:
    return str(have(find_helm(), "real helm"))


@pytest.fixture(scope="module")
def crds() -> None:
    have(promcrds.crd_folder(), "Prometheus Operator CRDs")


# -- /metrics ------------------------------------------------------------------------------------------------


def exercised_agent() -> Metrics:
    """The agent's metrics with every series present (an error counted, a config, a restart, a probe)."""
    m = Metrics()
    m.count("reconciled")
    m.error("extender")
    m.restart_seen(4.0)
    m.extenders_probed([0.01], unreachable=1, unreachable_ignorable=0)
    m.set_config("a" * 64, "b" * 64)
    return m


def exercised_gatekeeper() -> GateMetrics:
    """The gatekeeper's registry as `scheduler-patcher gatekeeper` builds it with the webhook on."""
    g = GateMetrics()
    g.released(3.0)
    AdmissionWebhook(Selection(), lambda: (False, None), g.registry)
    return g


def scrape(metrics: Renderable) -> str:
    """``GET /metrics`` from the real health server, as Prometheus scrapes it."""
    with HealthServer(Health(), metrics, "127.0.0.1:0") as server, \
            urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


@functools.cache
def exported() -> frozenset[str]:
    """Every sample name the agent and the gatekeeper serve (``_total``, ``_bucket``... included)."""
    return frozenset(s.name for metrics in (exercised_agent(), exercised_gatekeeper())
                     for f in text_string_to_metric_families(scrape(metrics)) for s in f.samples)


@pytest.mark.parametrize("make", [exercised_agent, exercised_gatekeeper], ids=["agent", "gatekeeper"])
def test_the_real_metrics_pass_promtool_check_metrics(promtool_bin: str, make: Any) -> None:
    code, out = promtool(promtool_bin, "check", "metrics", stdin=scrape(make()).encode())
    assert code == 0 and not out.strip(), out


def test_promtool_check_metrics_does_find_naming_problems(promtool_bin: str) -> None:
    """The check above can fail: a counter without ``_total`` and a gauge in milliseconds are reported."""
    bad = ("# HELP scheduler_patcher_writes Writes.\n# TYPE scheduler_patcher_writes counter\n"
           "scheduler_patcher_writes 1\n# HELP scheduler_patcher_delay_milliseconds Delay.\n"
           "# TYPE scheduler_patcher_delay_milliseconds gauge\nscheduler_patcher_delay_milliseconds 3\n")
    code, out = promtool(promtool_bin, "check", "metrics", stdin=bad.encode())
    assert code != 0 and "_total" in out and "milliseconds" in out, out


# -- the alert rules -------------------------------------------------------------------------------------------


def test_promtool_check_rules(promtool_bin: str) -> None:
    code, out = promtool(promtool_bin, "check", "rules", str(RULES))
    assert code == 0 and f"SUCCESS: {len(rules())} rules found" in out, out


def test_promtool_test_rules(promtool_bin: str) -> None:
    code, out = promtool(promtool_bin, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert code == 0 and "SUCCESS" in out, out


def test_the_rule_tests_fail_against_rules_without_their_thresholds(promtool_bin: str, tmp_path: Path) -> None:
    """The unit tests can fail: with every ``for:`` at 0 the alerts fire where the tests say they must not yet."""
    (tmp_path / "alerts.yaml").write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 0m", RULES.read_text()))
    tests = yaml.safe_load(RULE_TESTS.read_text())
    tests["rule_files"] = ["alerts.yaml"]
    (tmp_path / "alerts.test.yaml").write_text(yaml.safe_dump(tests))
    code, out = promtool(promtool_bin, "test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert code != 0 and "FAILED" in out, out


def test_every_alert_is_tested_firing_and_silent() -> None:
    cases: dict[str, set[bool]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    assert cases == {r["alert"]: {True, False} for r in rules()}


def test_every_alert_has_a_severity_and_a_runbook_entry() -> None:
    anchors = {re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"(?m)^#{2,3} (.+)$", ALERTS_DOC.read_text())}
    for rule in rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("https://github.com/scheduler-patcher/scheduler-patcher/blob/main/docs/alerts.md#")
        assert url.rpartition("#")[2] == rule["alert"].lower() in anchors, (rule["alert"], sorted(anchors))


# -- every query names an exported metric -------------------------------------------------------------------

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label matchers, ranges,
    grouping clauses, functions and operators are taken out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    return {m.group() for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", e)
            if not e[m.end():].lstrip().startswith("(") and m.group() not in _KEYWORDS}


def unknown_metrics(queries: list[str], allowed: frozenset[str]) -> dict[str, set[str]]:
    return {q: missing_names for q in queries if (missing_names := metric_names(q) - allowed)}


def test_metric_names_reads_promql() -> None:
    expr = ('histogram_quantile(0.9, sum by (node, le) (rate(a_bucket{x="y{z}", node=~"b.+"}[5m]))) '
            "and on (node) count by (node) (c_total offset 5m) unless max without (pod) (d) > bool 1")
    assert metric_names(expr) == {"a_bucket", "c_total", "d"}


def test_every_rule_queries_an_exported_metric() -> None:
    assert not unknown_metrics([r["expr"] for r in rules()], exported() | EXTERNAL)


def test_every_dashboard_query_names_an_exported_metric() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 10
    assert not unknown_metrics(queries, exported())
    # and the check fails on a panel that asks for a metric nobody exports
    assert unknown_metrics([*queries, "sum(rate(scheduler_patcher_restarts_total[5m]))"], exported()) == {
        "sum(rate(scheduler_patcher_restarts_total[5m]))": {"scheduler_patcher_restarts_total"}}


def test_every_dashboard_query_parses(promtool_bin: str, tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables filled in) as a recording rule's expression."""
    def filled(q: str) -> str:
        for var, value in GRAFANA_VARS.items():
            q = q.replace(var, value)
        return q

    group = {"name": "dashboard", "rules": [{"record": f"dashboard:query{i}", "expr": filled(q)}
                                            for i, q in enumerate(dashboard_queries())]}
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [group]}))
    code, out = promtool(promtool_bin, "check", "rules", str(tmp_path / "queries.yaml"))
    assert code == 0, out


# -- the kustomize component ----------------------------------------------------------------------------------


def test_the_components_rules_are_the_rules_file() -> None:
    assert (MANIFESTS / sync_monitoring.COPY.removeprefix("manifests/")).read_text() == sync_monitoring.render(), \
        "run: python3 tools/sync_monitoring.py"
    rule = next(o for o in objects("monitoring") if o["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


@pytest.mark.usefixtures("crds")
@pytest.mark.parametrize("name", ["monitoring", "overlays/monitoring"])
def test_the_component_validates_against_the_crds(name: str) -> None:
    found = [o for o in objects(name) if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert sorted(o["kind"] for o in found) == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    assert [e for o in found for e in promcrds.errors(o)] == []
    for obj in objects(name):
        if not obj["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)


@pytest.mark.usefixtures("crds")
def test_the_crd_check_refuses_what_the_api_server_would() -> None:
    pm = next(o for o in objects("monitoring") if o["kind"] == "PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    assert any("intervall" in e for e in promcrds.errors(pm))
    rule = next(o for o in objects("monitoring") if o["kind"] == "PrometheusRule")
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert any("expr" in e for e in promcrds.errors(rule))


# -- the chart -------------------------------------------------------------------------------------------------

#: Labels only helm's render carries (test_helm_chart.py strips the same ones).
HELM_ONLY = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}


def helm_monitoring(helm: str, tmp: Path, values: Obj = MONITORING_VALUES) -> list[Obj]:
    return [o for o in template(helm, values, tmp) if o["kind"] in {"PodMonitor", "PrometheusRule"}
            or o["metadata"]["name"] == "scheduler-patcher-dashboard"]


def without_helm_labels(obj: Obj) -> Obj:
    labels = {k: v for k, v in obj["metadata"]["labels"].items() if k not in HELM_ONLY}
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


@pytest.mark.usefixtures("crds")
def test_the_chart_renders_valid_monitoring_objects(helm: str, tmp_path: Path) -> None:
    objs = helm_monitoring(helm, tmp_path)
    assert sorted(o["kind"] for o in objs) == ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule"]
    assert [e for o in objs if o["kind"] != "ConfigMap" for e in promcrds.errors(o)] == []
    component = {o["metadata"]["name"]: o for o in objects("monitoring")}
    for obj in objs:
        if obj["kind"] == "ConfigMap":
            kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
            assert obj["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert json.loads(obj["data"]["scheduler-patcher.json"]) == json.loads(DASHBOARD.read_text())
        else:  # the chart and the kustomize component render the same objects
            assert without_helm_labels(obj) == component[obj["metadata"]["name"]]


def test_the_monitoring_objects_are_off_by_default(helm: str, tmp_path: Path) -> None:
    assert helm_monitoring(helm, tmp_path, {}) == []
    only_agents = {"monitoring": {"podMonitor": {"enabled": True}}}
    assert [o["metadata"]["name"] for o in helm_monitoring(helm, tmp_path, only_agents)] == ["scheduler-patcher-agent"]


def test_the_podmonitors_select_the_pods_and_ports_that_serve_metrics(helm: str, tmp_path: Path) -> None:
    objs = template(helm, MONITORING_VALUES, tmp_path)
    workloads = [o for o in objs if o["kind"] in {"DaemonSet", "Deployment"}]
    for pm in (o for o in objs if o["kind"] == "PodMonitor"):
        wanted = pm["spec"]["selector"]["matchLabels"]
        selected = [w for w in workloads if wanted.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, pm["metadata"]["name"]
        ports = {p["name"] for c in pod_spec(selected[0])["containers"] for p in c.get("ports", [])}
        (endpoint,) = pm["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node",
                "action": "replace"} in endpoint["relabelings"]


def test_the_rule_values_reach_the_rules(helm: str, tmp_path: Path) -> None:
    values = {"monitoring": {"prometheusRule": {
        "enabled": True, "labels": {"release": "kps"}, "for": {"SchedulerPatcherVerdictNotReady": "30m"},
        "disabled": ["SchedulerPatcherAgentMissing"], "additionalAlertLabels": {"team": "platform"}}}}
    (rule,) = helm_monitoring(helm, tmp_path, values)
    assert rule["metadata"]["labels"]["release"] == "kps"
    got = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(got) == {r["alert"] for r in rules()} - {"SchedulerPatcherAgentMissing"}
    for r in rules():
        if r["alert"] in got:
            expected = {**r, "labels": {**r["labels"], "team": "platform"}}
            if r["alert"] == "SchedulerPatcherVerdictNotReady":
                expected["for"] = "30m"
            assert got[r["alert"]] == expected


def test_an_unknown_alert_name_fails_the_render(helm: str, tmp_path: Path) -> None:
    values = {"monitoring": {"prometheusRule": {"enabled": True, "for": {"SchedulerPatcherRolledBak": "5m"}}}}
    proc = run_helm(helm, "template", "x", str(CHART), values=values, tmp=tmp_path)
    assert proc.returncode != 0 and "no alert is named SchedulerPatcherRolledBak" in proc.stderr
