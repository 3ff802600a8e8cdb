"""Deprecated scheduler flags that --config silences are carried into the config, per apiVersion."""

from __future__ import annotations

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.binary import gate_settings, gates_set_to
from patcher.core.schedconfig.flags import carried_settings, parse_flags
from patcher.core.schedconfig.schema import Schema, find_schema

G = "kubescheduler.config.k8s.io"


def schema(api: str) -> Schema:
    found = find_schema(api)
    assert found is not None
    return found


def carried(items: list[str], api: str = f"{G}/v1") -> dict[str, object]:
    values, _ = carried_settings(parse_flags(items), schema(api))
    return {c.field_text: c.value for c in values}


def test_parse_forms() -> None:
    flags = parse_flags(["--kubeconfig", "/etc/kubernetes/scheduler.conf", "--leader-elect", "--v=2", "--port=0"])
    assert flags == {"kubeconfig": "/etc/kubernetes/scheduler.conf", "leader-elect": None, "v": "2", "port": "0"}


def test_last_occurrence_wins() -> None:
    assert parse_flags(["--leader-elect=true", "--leader-elect=false"])["leader-elect"] == "false"


def test_only_flags_after_the_binary_count_for_go_runner_and_hyperkube() -> None:
    go_runner = ["/go-runner", "--log-file=/var/log/kube-scheduler.log", "--also-stdout",
                 "/usr/local/bin/kube-scheduler", "--kubeconfig=/var/lib/kube-scheduler/kubeconfig"]
    assert parse_flags(go_runner) == {"kubeconfig": "/var/lib/kube-scheduler/kubeconfig"}
    hyperkube = ["/hyperkube", "scheduler", "--master=http://127.0.0.1:8080", "--leader-elect=true"]
    assert parse_flags(hyperkube) == {"master": "http://127.0.0.1:8080", "leader-elect": "true"}


def test_a_flag_value_named_kube_scheduler_is_not_the_binary() -> None:
    flags = parse_flags(["--kubeconfig=/k", "--leader-elect-resource-name", "kube-scheduler", "--profiling=false"])
    assert flags == {"kubeconfig": "/k", "leader-elect-resource-name": "kube-scheduler", "profiling": "false"}


def test_kubeadm_flags_for_v1() -> None:
    values = carried(["--authentication-kubeconfig=/etc/kubernetes/scheduler.conf", "--bind-address=127.0.0.1",
                      "--kubeconfig=/etc/kubernetes/scheduler.conf", "--leader-elect=true", "--secure-port=10259"])
    assert values == {
        "leaderElection.leaderElect": True,
        "clientConnection.kubeconfig": "/etc/kubernetes/scheduler.conf",
    }


def test_every_deprecated_flag_with_a_field() -> None:
    values = carried(
        ["--kubeconfig=/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig", "--kube-api-qps=100",
         "--kube-api-burst=200", "--kube-api-content-type=application/json", "--leader-elect=false",
         "--leader-elect-lease-duration=30s", "--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=4s",
         "--leader-elect-resource-lock=leases", "--leader-elect-resource-name=sched",
         "--leader-elect-resource-namespace=sched-ns", "--profiling=false", "--contention-profiling=false"]
    )
    assert values == {
        "leaderElection.leaderElect": False,
        "leaderElection.leaseDuration": "30s",
        "leaderElection.renewDeadline": "20s",
        "leaderElection.retryPeriod": "4s",
        "leaderElection.resourceLock": "leases",
        "leaderElection.resourceName": "sched",
        "leaderElection.resourceNamespace": "sched-ns",
        "clientConnection.kubeconfig": "/var/lib/rancher/rke2/server/cred/scheduler.kubeconfig",
        "clientConnection.contentType": "application/json",
        "clientConnection.qps": 100,
        "clientConnection.burst": 200,
        "enableProfiling": False,
        "enableContentionProfiling": False,
    }


def test_lock_object_names_follow_the_api_version() -> None:
    flags = ["--lock-object-name=old", "--lock-object-namespace=kube-system"]
    assert carried(flags, f"{G}/v1beta1") == {
        "leaderElection.resourceName": "old", "leaderElection.resourceNamespace": "kube-system"}


def test_newer_lock_flag_wins_over_the_deprecated_one() -> None:
    flags = ["--leader-elect-resource-name=new", "--lock-object-name=old"]
    assert carried(flags)["leaderElection.resourceName"] == "new"


def test_scheduler_name_and_hard_pod_affinity() -> None:
    flags = ["--scheduler-name=golden-scheduler", "--hard-pod-affinity-symmetric-weight=10"]
    assert carried(flags) == carried(flags, f"{G}/v1beta1") == {
        "profiles[0].schedulerName": "golden-scheduler",
        "profiles[0].pluginConfig": [{"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": 10}}],
    }


def test_flag_without_a_field_in_this_version_is_noted() -> None:
    values, notes = carried_settings(parse_flags(["--failure-domains=kubernetes.io/hostname"]), schema(f"{G}/v1"))
    assert values == [] and "--failure-domains has no field" in notes[0]


def test_real_flags_are_not_carried() -> None:
    assert carried(["--bind-address=0.0.0.0", "--secure-port=10259", "--port=0", "--feature-gates=A=true",
                    "--authorization-kubeconfig=/k", "--v=2", "--master=https://127.0.0.1:6443"]) == {}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["--kube-api-qps=fast"], "--kube-api-qps=fast: not a number"),
        (["--kube-api-burst=1.5"], "--kube-api-burst=1.5: not an integer"),
        (["--leader-elect=maybe"], "--leader-elect=maybe: not a boolean"),
        (["--leader-elect-lease-duration=15"], "not a duration"),
        (["--kubeconfig=scheduler.conf"], "must be an absolute path"),
        (["--kubeconfig", "--leader-elect"], "--kubeconfig: the flag needs a value"),
    ],
)
def test_bad_flag_values_are_refused(items: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        carried_settings(parse_flags(items), schema(f"{G}/v1"), where="/etc/kubernetes/manifests/kube-scheduler.yaml")
    assert err.value.path == "/etc/kubernetes/manifests/kube-scheduler.yaml"


@pytest.mark.parametrize(
    "flag",
    ["--policy-config-file=/etc/kubernetes/scheduler-policy-config.json", "--policy-configmap=sched-policy",
     "--use-legacy-policy-config", "--algorithm-provider=ClusterAutoscalerProvider"],
)
def test_legacy_policy_flags_are_refused(flag: str) -> None:
    with pytest.raises(ConfigError, match=r"extenders\.yaml and remove the flag"):
        carried_settings(parse_flags([flag]), schema(f"{G}/v1beta1"))


@pytest.mark.parametrize(
    "flag", ["--policy-config-file=", "--algorithm-provider=DefaultProvider", "--use-legacy-policy-config=false",
             "--policy-configmap-namespace=kube-system"],
)
def test_harmless_legacy_policy_flags_pass(flag: str) -> None:
    assert carried_settings(parse_flags([flag]), schema(f"{G}/v1beta1")) == ([], [])


def test_enabled_feature_gates() -> None:
    flags = parse_flags(["kube-scheduler", "--feature-gates=A=true, B=false,C=TRUE,AllAlpha=false,D", "--v=2"])
    assert gates_set_to(flags, True) == frozenset({"A", "C"})
    assert gates_set_to(parse_flags(["kube-scheduler"]), True) == frozenset()


def test_feature_gate_values_are_what_go_strconv_parsebool_takes() -> None:
    """component-base reads each value with strconv.ParseBool (probed on kube-scheduler 1.37: 1, t, T, TRUE,
    True start it with the gate on; tRuE, yes, an empty value and no '=' make it exit)."""
    on = ["1", "t", "T", "TRUE", "true", "True"]
    off = ["0", "f", "F", "FALSE", "false", "False"]
    neither = ["tRuE", "yes", "on", "", "2"]
    items = [f"On{i}={v}" for i, v in enumerate(on)] + [f" Off{i} = {v} " for i, v in enumerate(off)]
    items += [f"Bad{i}={v}" for i, v in enumerate(neither)] + ["Bare", ""]
    assert gate_settings(",".join(items)) == {
        **{f"On{i}": True for i in range(len(on))},
        **{f"Off{i}": False for i in range(len(off))},
        **{f"Bad{i}": None for i in range(len(neither))},
        "Bare": None,
    }


def test_a_feature_gate_entry_without_a_name_is_the_gate_named_empty() -> None:
    """kube-scheduler 1.34-1.37 skip a blank entry and exit on ``=true`` ('unrecognized feature gate: ')."""
    assert gate_settings("A=1, ,") == {"A": True}
    assert gate_settings("A=1, =true") == {"A": True, "": True}
    assert gate_settings("kube:=false") == {"": False}
