"""The chart's values and version, checked without helm: the schema against the code, the version against its source.

tests/deploy/test_helm_chart.py renders the chart with the real helm; what needs no helm is here, so it runs (and the
chart's values stay tied to the CLI and to patcher's scheduler-config schema) even where helm cannot be had.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

import patcher
from patcher.commands.cli import SCHEDULER_PORTS
from patcher.commands.conventions import duration
from tests.deploy.test_deploy_manifests import ROOT, subparser
from tools import sync_version

CHART = ROOT / "charts/scheduler-patcher"
Obj = dict[str, Any]


#: Every value the chart has, set to something other than its default (test_every_value_is_exercised keeps it so).
ALL_VALUES: Obj = {
    "global": {},
    "platform": "rke2",
    "image": {"repository": "registry.example.com/ops/scheduler-patcher", "tag": "9.9.9",
              "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "namespace": {"create": True},
    "extenders": [{"urlPrefix": "https://127.0.0.1:8443/csi", "filterVerb": "filter", "prioritizeVerb": "prioritize",
                   "weight": 5, "bindVerb": "", "preemptVerb": "", "enableHTTPS": True,
                   "tlsConfig": {"insecure": False, "serverName": "extender.local", "caFile": "/etc/ca.crt",
                                 "certFile": "", "keyFile": "", "certData": "", "keyData": "", "caData": ""},
                   "httpTimeout": "30s", "nodeCacheCapable": True,
                   "managedResources": [{"name": "example.com/disk", "ignoredByScheduler": True}],
                   "ignorable": False}],
    "schedulerConfig": "",
    "hostPaths": {"manifestDir": "/opt/k8s/manifests", "manifestName": "scheduler.yaml",
                  "configDir": "/opt/k8s/sp-config", "stateDir": "/opt/k8s/sp-state",
                  "foreignConfigDirs": ["/etc/kubernetes/scheduler"]},
    "agent": {"annotationPrefix": "sp.example.com", "port": 9900, "checkExtenders": False,
              "extenderProbeInterval": "2m", "restartTimeout": "15m", "restartSettle": "20s",
              "rollbackOnFailure": False,
              "restoreOnExit": "never", "rollout": "coordinated", "rolloutLease": "sp-rollout", "gracePeriod": "30s",
              "terminationGracePeriodSeconds": 50, "logFormat": "json", "logLevel": "debug", "localCheck": True},
    "csiBaremetal": {"enabled": True, "namespace": "csi"},
    "nodeSelector": {"kubernetes.io/os": "linux", "example.com/role": "cp"},
    "tolerations": [{"operator": "Exists"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "example.com/role", "operator": "In", "values": ["cp"]}]}]}}},
    "priorityClassName": "cp-critical",
    "hostNetwork": False,
    "dnsPolicy": "None",
    "dnsConfig": {"nameservers": ["10.0.0.10"], "searches": ["cluster.example"],
                  "options": [{"name": "ndots", "value": "2"}]},
    "resources": {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "256Mi"}},
    "podAnnotations": {"example.com/team": "platform"},
    "extraArgs": ["--resync-interval=10m"],
    "extraEnv": [{"name": "PATCHER_ON_FOREIGN_CONFIG", "value": "replace"}],
    "gatekeeper": {"enabled": True, "replicas": 3, "gateName": "example.com/ready", "port": 9910, "logFormat": "text",
                   "priorityClassName": "gk-critical",
                   "resources": {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                   "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [{"key": "a", "operator": "Exists"}],
                   "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                       {"weight": 1, "preference": {"matchExpressions": [
                           {"key": "example.com/role", "operator": "In", "values": ["infra"]}]}}]}},
                   "podAnnotations": {"example.com/gk": "yes"},
                   "admission": {"enabled": True, "apiVersion": "v1beta1",
                                 "namespaceSelector": {"matchLabels": {"scheduler-patcher.io/gate": None, "team": "a"},
                                                       "matchExpressions": [
                                     {"key": "tier", "operator": "In", "values": ["gold"]}]},
                                 "objectSelector": {"matchLabels": {"app": "db"}, "matchExpressions": [
                                     {"key": "example.com/skip", "operator": "DoesNotExist"}]},
                                 "schedulerNames": ["default-scheduler", "my-scheduler"],
                                 "storageClasses": ["csi-baremetal-sc-hddlvg"],
                                 "csiDrivers": ["csi-baremetal.dell.com"]},
                   "webhook": {"enabled": True, "port": 9443, "timeoutSeconds": 3, "certManager": False,
                               "certValidityDays": 30},
                   "release": {"concurrency": 8, "batch": 64, "kubeApiQps": 500.5, "kubeApiBurst": 16}},
    "stopAgentsJob": {"enabled": True, "timeout": "150s", "activeDeadlineSeconds": 300,
                      "ttlSecondsAfterFinished": 7200,
                      "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.10"}]},
    "restoreJob": {"enabled": True, "timeout": "3m", "activeDeadlineSeconds": 600,
                   "ttlSecondsAfterFinished": 3600, "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]},
    "monitoring": {"podMonitor": {"enabled": True, "interval": "1m", "scrapeTimeout": "20s",
                                  "labels": {"release": "kps"}},
                   "prometheusRule": {"enabled": True, "labels": {"release": "kps"},
                                      "for": {"SchedulerPatcherVerdictNotReady": "30m"},
                                      "disabled": ["SchedulerPatcherAgentMissing"],
                                      "additionalAlertLabels": {"team": "platform"}},
                   "dashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"},
                                 "annotations": {"grafana_folder": "Kubernetes"}, "namespace": "monitoring"}},
}


def leaf_paths(schema: Obj, prefix: str = "") -> set[str]:
    props = schema.get("properties")
    if not props or schema.get("type") != "object":
        return {prefix}
    return {p for key, sub in props.items() for p in leaf_paths(sub, f"{prefix}.{key}" if prefix else key)}


def value_paths(values: Any, schema: Obj, prefix: str = "") -> set[str]:
    if not isinstance(values, dict) or not schema.get("properties") or schema.get("type") != "object":
        return {prefix}
    return {p for key, v in values.items()
            for p in value_paths(v, schema["properties"][key], f"{prefix}.{key}" if prefix else key)}


def values_schema() -> Obj:
    schema: Obj = json.loads((CHART / "values.schema.json").read_text())
    return schema


def test_every_value_is_exercised() -> None:
    """ALL_VALUES sets every leaf of the values schema, and the schema describes every key of values.yaml."""
    schema = values_schema()
    assert value_paths(ALL_VALUES, schema) == leaf_paths(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert value_paths({"global": {}, **defaults}, schema) == leaf_paths(schema)
    assert schema["additionalProperties"] is False


def test_the_extender_schema_is_the_projects_v1_extender() -> None:
    """The chart's extender fields are exactly those of kubescheduler.config.k8s.io/v1 in patcher's schema data."""
    types = json.loads((ROOT / "patcher/core/schedconfig/schemas/kubescheduler.config.k8s.io-v1.json").read_text())[
        "types"]
    item = values_schema()["properties"]["extenders"]["items"]
    assert set(item["properties"]) == set(types["Extender"]["fields"])
    assert item["required"] == types["Extender"]["required"]
    assert set(item["properties"]["tlsConfig"]["properties"]) == set(types["ExtenderTLSConfig"]["fields"])
    managed = item["properties"]["managedResources"]["items"]
    assert set(managed["properties"]) == set(types["ExtenderManagedResource"]["fields"])


def chart_choices() -> dict[str, list[str]]:
    """The choices templates/validate.yaml allows each value (its ``sp.oneOf`` checks), by value path."""
    guards = (CHART / "templates/validate.yaml").read_text("utf-8")
    found = re.findall(r'include "sp.oneOf" \(list "([^"]+)" \S+ \(list ((?:"[^"]*" ?)+)\)\)', guards)
    return {path: json.loads("[" + words.strip().replace('" "', '", "') + "]") for path, words in found}


def test_the_charts_choices_are_the_clis_choices() -> None:
    """The chart refuses a choice the agent would not start with, and allows each one it has."""
    choices = chart_choices()
    run = {a.dest: a for a in subparser("run")._actions}
    for value, dest in [("restoreOnExit", "restore_on_exit"), ("rollout", "rollout"), ("logFormat", "log_format"),
                        ("logLevel", "log_level")]:
        assert choices[f"agent.{value}"] == list(run[dest].choices or []), value
    assert choices["gatekeeper.logFormat"] == list(run["log_format"].choices or [])
    assert "platform" in choices and "dnsPolicy" in choices


def test_the_chart_accepts_exactly_the_durations_and_ports_the_agent_accepts() -> None:
    """A value the chart lets through but `run` refuses would crash-loop the agent on every control-plane node.
    (The chart may be stricter: the agent also reads "5 m" or "1e3s", which nobody should write.) The check is
    templates/validate.yaml's, which says the agent's message (tests/deploy/test_chart_refusals.py renders it)."""
    guards = (CHART / "templates/validate.yaml").read_text("utf-8")
    [quoted] = re.findall(r'regexMatch ("\^\[0-9\][^"]*")', guards)
    pattern = json.loads(quoted)  # a Go string literal: its escapes are JSON's
    documented = ["30", "30s", "500ms", "5m", "1h", "1.5m", "0", "0s"]
    samples = [*documented, "1h30m", "10us", "5 m", "-1s", "m", "1d", "1e3s", "inf", "nan"]
    for sample in samples:
        try:
            duration(sample)
            accepted = True
        except argparse.ArgumentTypeError:
            accepted = False
        chart_accepts = bool(re.search(pattern, sample))
        assert accepted or not chart_accepts, (sample, "the chart accepts what the agent refuses")
        assert chart_accepts or sample not in documented, (sample, "the chart refuses a documented form")
    for key in ("restartTimeout", "restartSettle", "gracePeriod", "extenderProbeInterval"):
        assert f'"agent.{key}"' in guards, f"agent.{key} is not checked"
    [ports] = re.findall(r"\$schedulerPorts := dict (.*) \}\}", guards)
    words = json.loads("[" + ports.replace('" "', '", "') + "]")
    assert dict(zip(words[::2], words[1::2], strict=True)) == SCHEDULER_PORTS


def test_the_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == patcher.__version__, "run `make version-sync`"
    assert sync_version.sync(write=False) == []


def test_sync_version_rewrites_every_copy(tmp_path: Path) -> None:
    for rel in ["patcher/__init__.py", sync_version.CHART, *sync_version.KUSTOMIZATIONS]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    init = tmp_path / "patcher/__init__.py"
    init.write_text(re.sub(r'__version__ = ".*"', '__version__ = "7.8.9"', init.read_text()))
    assert len(sync_version.sync(tmp_path, write=False)) == 5
    assert len(sync_version.sync(tmp_path, write=True)) == 5
    assert sync_version.sync(tmp_path, write=False) == []
    chart = yaml.safe_load((tmp_path / sync_version.CHART).read_text())
    assert chart["version"] == chart["appVersion"] == "7.8.9"
    for rel in sync_version.KUSTOMIZATIONS:
        assert yaml.safe_load((tmp_path / rel).read_text())["images"][0]["newTag"] == "7.8.9"


def test_the_charts_list_of_run_flags_is_the_clis() -> None:
    """templates/validate.yaml refuses an ``extraArgs`` flag ``run`` does not have (the agent would exit 64)."""
    guards = (CHART / "templates/validate.yaml").read_text("utf-8")
    [listed] = re.findall(r"\$runFlags := list (.*) \}\}", guards)
    flags = {o for a in subparser("run")._actions for o in a.option_strings if o.startswith("--")}
    assert set(json.loads("[" + listed.replace('" "', '", "') + "]")) == flags, "add the new flag to the list"
