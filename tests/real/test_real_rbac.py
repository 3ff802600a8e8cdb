"""Least privilege, proven on kube-apiserver: remove each verb of each rule in turn, see what fails.

tests/real/test_real_nodes.py runs the whole story under the manifests' RBAC and finds no request refused and every
granted verb used. This is the other half: for every verb of every rule of the agent's Roles and ClusterRole
(manifests/base, which the chart renders alike: tests/deploy/test_helm_chart.py), an agent runs with exactly the
manifests' RBAC minus that verb, and the API server must refuse it a request that the verb would have allowed;
the step that request belongs to is named below. A verb whose removal nothing notices is a rule nothing needs.

All cases run at once, each in a namespace of its own (`sp-<n>`: its ServiceAccount, namespaced Roles,
DaemonSet, rollout Lease and status ConfigMaps) with its own Node and mirror pod, and the Roles outside that
namespace (Node events in `default`, the mirror pod in `kube-system`, the Node ClusterRole) copied under
`<name>-<n>`: one control plane, one wait, instead of one run per verb. Case 0 keeps every verb: it must end
Ready without a single refusal. Each agent starts, runs until the refusal shows (or until Ready), and is stopped
with SIGTERM, so the stop's own requests (the DaemonSet read again, the restore's turn) are part of it.
"""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from patcher.adapters.kube.cluster import DEFAULT_STATUS_NAME
from tests.component.test_webhook_server import admit
from tests.deploy.test_deploy_manifests import objects
from tests.harness import admission_samples as samples
from tests.harness.helpers import P
from tests.harness.real.controlplane import (
    ControlPlane,
    built_releases,
    control_plane,
    issue,
    listening_port,
    missing_reason,
    wait_until,
)
from tests.harness.real.simnodes import Agents, Grant, audit_events, audit_flags, describe, grants
from tests.real.test_real_install import apply_k
from tests.real.test_real_nodes import APPS, gated_pod, gatekeeper, hold_policy, release_hold

pytestmark = pytest.mark.real_cluster

NS = "scheduler-patcher"
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
BASE = objects("base")
GRANTS: list[Grant] = sorted(grants(BASE))
#: The step of the agent each verb serves: what stops working without it.
STEPS: dict[tuple[str, str], str] = {
    ("nodes", "get"): "read its Node (does the DaemonSet still select it?)",
    ("nodes", "list"): "list the control-plane Nodes for the published verdict",
    ("nodes", "patch"): "annotate its Node with its state",
    ("nodes", "watch"): "watch its Node for an operator's hold",
    ("events", "create"): "record a Node event per state change",
    ("pods", "list"): "list its mirror pod (and kube-system's schedulers for the verdict)",
    ("pods", "watch"): "watch its mirror pod for the scheduler's restart",
    ("pods", "get"): "read its own pod for the DaemonSet that owns it",
    ("leases", "create"): "create the rollout Lease",
    ("leases", "get"): "read the rollout Lease for its turn",
    ("leases", "update"): "take, renew and give back its turn",
    ("leases", "list"): "list kube-scheduler's leader-election Lease by name (the leader-aware order)",
    ("leases", "watch"): "watch kube-scheduler's leader-election Lease (the leader-aware order)",
    ("configmaps", "create"): "create the status ConfigMap",
    ("configmaps", "get"): "read the status ConfigMap before replacing it",
    ("configmaps", "update"): "publish the verdict into the status ConfigMap",
    ("daemonsets", "get"): "read its DaemonSet again at the stop",
    ("daemonsets", "list"): "list its DaemonSet",
    ("daemonsets", "watch"): "watch its DaemonSet",
}


def case_id(grant: Grant) -> str:
    _, _, name, rule, verb = grant
    return f"{name.removeprefix('scheduler-patcher-')}-{rule}-{verb}"


def case_objects(number: int, drop: Grant | None, base: list[dict[str, Any]] = BASE,
                 prefix: str = "sp") -> list[dict[str, Any]]:
    """The manifests' objects for case `number`, in its own namespace, without the verb `drop`."""
    ns = f"{prefix}-{number}"
    out = []
    for obj in copy.deepcopy(base):
        meta, kind = obj["metadata"], obj["kind"]
        key = (kind, meta.get("namespace", ""), meta["name"])
        if kind == "Namespace":
            meta["name"] = ns
        elif meta.get("namespace") == NS:
            meta["namespace"] = ns
        elif kind in RBAC_KINDS:  # in default, kube-system or cluster-wide: one copy a case
            meta["name"] += f"-{number}"
            if "roleRef" in obj:
                obj["roleRef"]["name"] += f"-{number}"
        for subject in obj.get("subjects", []):
            subject["namespace"] = ns
        if drop is not None and key == drop[:3]:
            rule = obj["rules"][drop[3]]
            rule["verbs"].remove(drop[4])
            if not rule["verbs"]:
                del obj["rules"][drop[3]]
        out.append(obj)
    return out


@dataclass
class Case:
    number: int
    drop: Grant | None
    agents: Agents
    refusals: list[str] = field(default_factory=list)

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.agents.namespace}:scheduler-patcher"

    @property
    def node(self) -> str:
        return f"n-{self.number}"

    def ready(self, cluster: Cluster, before: str | None = None) -> bool:
        """Ready on a config other than `before`, and that config in the published verdict (the publisher
        follows the state a moment later)."""
        ann = cluster.annotations.get(self.node, {})
        config = ann.get("config-hash", "")
        return (ann.get("state") == "Ready" and config != before
                and config[:12] in json.dumps(cluster.verdicts.get(self.agents.namespace, {})))


@dataclass
class Cluster:
    """Every case's Node annotations and published verdict, read in two requests (a settle check polls them)."""

    annotations: dict[str, dict[str, str]]
    verdicts: dict[str, dict[str, str]]  # namespace -> the status ConfigMap's data

    @classmethod
    def read(cls, cp: ControlPlane) -> Cluster:
        nodes = cp.ok("GET", "/api/v1/nodes")["items"]
        maps = cp.ok("GET", f"/api/v1/configmaps?fieldSelector=metadata.name={DEFAULT_STATUS_NAME}")["items"]
        return cls({n["metadata"]["name"]: {k[len(P):]: v for k, v in (n["metadata"].get("annotations") or {}).items()
                                            if k.startswith(P)} for n in nodes},
                   {m["metadata"]["namespace"]: dict(m.get("data") or {}) for m in maps})


def refusals_by_user(cp: ControlPlane) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for event in audit_events(cp, contains='"code":403'):
        if event.get("responseStatus", {}).get("code") == 403:
            out.setdefault(event["user"]["username"], []).append(describe(event))
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Grant | None, Case]]:
    """Every case run to its end: all agents at once, on one control plane of the newest release."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("rbac")
    with control_plane(built_releases()[0], tmp / "cp", audit_flags(tmp / "cp" / "audit")) as cp:
        drops: list[Grant | None] = [None, *GRANTS]
        listing = {"apiVersion": "v1", "kind": "List",
                   "items": [o for n, drop in enumerate(drops) for o in case_objects(n, drop)]}
        (tmp / "rbac.json").write_text(json.dumps(listing))
        proc = cp.kubectl("apply", "--server-side", "-f", str(tmp / "rbac.json"))
        assert proc.returncode == 0, proc.stderr
        run: dict[Grant | None, Case] = {}
        try:
            for n, drop in enumerate(drops):
                ns = f"sp-{n}"
                kubeconfig = cp.token_kubeconfig(ns, "scheduler-patcher", tmp / f"{ns}.kubeconfig")
                (tmp / ns).mkdir()
                agents = Agents(cp, tmp / ns, ns, kubeconfig, extra_args=("--grace-period", "5s"))
                case = Case(n, drop, agents)
                agents.add_node(case.node)
                run[drop] = case
            for case in run.values():
                case.agents.start_agent(case.agents.sims[case.node])

            def settled(before: dict[str, str]) -> bool:
                return not unsettled(before)

            def unsettled(before: dict[str, str]) -> list[Case]:
                refused, cluster = refusals_by_user(cp), Cluster.read(cp)
                return [c for c in run.values() if not (c.user in refused or c.ready(cluster, before.get(c.node)))]

            def which(before: dict[str, str]) -> Callable[[], str]:
                """At a timeout: each case not settled, what its Node says and its agent's last lines."""
                return lambda: "\n".join(
                    f"case {c.number} (without {c.drop}): {c.agents.annotations(c.node)}\n"
                    f"{c.agents.sims[c.node].log[-3000:]}" for c in unsettled(before))

            wait_until(lambda: settled({}), 180, lambda: f"every agent refused something or Ready\n{which({})()}")
            # A config change: the node is patched again, and the published verdict replaced (not created).
            first = {c.node: c.agents.annotations(c.node).get("config-hash", "") for c in run.values()}
            for case in run.values():
                case.agents.sims[case.node].configmap(5)
            wait_until(lambda: settled(first), 180,
                       lambda: f"every agent refused something or Ready on the new config\n{which(first)()}")
            for case in run.values():
                sim = case.agents.sims[case.node]
                assert sim.proc is not None
                sim.proc.send_signal(signal.SIGTERM)
            for case in run.values():
                sim = case.agents.sims[case.node]
                assert sim.proc is not None
                try:
                    sim.proc.wait(30)
                except subprocess.TimeoutExpired:  # a stop that cannot take its turn: its refusal is recorded
                    sim.proc.kill()
            refused = refusals_by_user(cp)
            for case in run.values():
                case.refusals = sorted(set(refused.get(case.user, [])))
            yield run
        finally:
            for case in run.values():
                case.agents.kill_all()


def test_every_verb_of_every_rule_has_a_step() -> None:
    """The table of steps covers the manifests' grants exactly (a new rule needs its line, and its case)."""
    assert {(rule["resources"][0], verb) for (*_, verb), (rule, _) in grants(BASE).items()} == set(STEPS)


def test_with_every_rule_the_agent_is_ready_and_never_refused(cases: dict[Grant | None, Case]) -> None:
    control = cases[None]
    assert control.refusals == []
    sim = control.agents.sims[control.node]
    assert "keeping the patch" in sim.log or control.agents.annotations(control.node).get("state") in (
        "Ready", "Restored"), sim.log


@pytest.mark.parametrize("grant", GRANTS, ids=case_id)
def test_without_the_verb_that_step_fails(cases: dict[Grant | None, Case], grant: Grant) -> None:
    case = cases[grant]
    rule, _ = grants(BASE)[grant]
    step = STEPS[(rule["resources"][0], grant[4])]
    # The server refused what the verb grants (the same request, from this case's namespace); other refusals
    # may follow from it (without `list`, the verdict falls back to a GET per mirror pod, which is not granted).
    assert case.refusals, f"nothing failed without {grant}: a rule nothing needs ({step})"
    assert refused_by(grant, rule, case.number, case.refusals), (step, case.refusals)
    said = case.agents.sims[case.node].log
    if (rule["resources"][0], grant[4]) == ("daemonsets", "get") and "no fresh answer about DaemonSet" in said:
        # The stop's one read has lifecycle.OWNER_LOOKUP (0.15 s) to answer: on a busy machine the server's refusal
        # (recorded above) can come after it, and the agent then says it had no answer and goes on with its view.
        return
    assert "403" in said, f"the agent did not say that {step} was refused"


def refused_by(grant: Grant, rule: dict[str, Any], number: int, refusals: list[str], prefix: str = "sp") -> bool:
    """Whether one of `refusals` is a request the grant allows (a ClusterRole's: in any namespace)."""
    keys = {refusal_key(r) for r in refusals}
    if grant[0] == "ClusterRole":
        keys = {k.split(" in ")[0] for k in keys}
    return describe_grant(grant, rule, number, prefix) in keys


def refusal_key(line: str) -> str:
    """`user: verb group/resource [name] [in ns]` without the user and the object's name."""
    _, _, request = line.partition(": ")
    verb, what, *rest = request.split(" ")
    where = " ".join(rest[rest.index("in"):]) if "in" in rest else ""
    return f"{verb} {what} {where}".strip()


def describe_grant(grant: Grant, rule: dict[str, Any], number: int, prefix: str = "sp") -> str:
    group = rule["apiGroups"][0]
    what = f"{group}/{rule['resources'][0]}" if group else rule["resources"][0]
    ns = grant[1] if grant[0] == "Role" else ""
    ns = f"{prefix}-{number}" if ns == NS else ns
    return f"{grant[4]} {what} {'in ' + ns if ns else ''}".strip()


# -- the gatekeeper ---------------------------------------------------------------------------------------------

#: The gatekeeper with its admission webhook (the overlay's RBAC: the webhook's Role too), every case serving it.
GATEKEEPER = [o for o in objects("overlays/gatekeeper-webhook") if o["kind"] in ("ServiceAccount", *RBAC_KINDS)]
GK_GRANTS: list[Grant] = sorted(grants(GATEKEEPER))
GK_STEPS: dict[tuple[str, str], str] = {
    ("pods", "get"): "read a pod again after its release was refused (422: it changed meanwhile)",
    ("pods", "list"): "list the pending pods (and kube-system's schedulers for the verdict)",
    ("pods", "watch"): "watch the pending pods",
    ("pods", "patch"): "release the gate",
    ("nodes", "list"): "list the control-plane Nodes for the verdict",
    ("nodes", "watch"): "watch the control-plane Nodes",
    ("leases", "create"): "create the leader Lease",
    ("leases", "get"): "read the leader Lease",
    ("leases", "update"): "take, renew and give back the leadership",
    ("leases", "list"): "list the leader Lease by name before watching it",
    ("leases", "watch"): "watch the leader Lease (a standby reads it only when it is free or due)",
    ("configmaps", "list"): "the webhook lists its verdict, the status ConfigMap, by name",
    ("configmaps", "watch"): "the webhook watches the status ConfigMap (a changed verdict)",
}


@dataclass
class GateCase:
    number: int
    proc: subprocess.Popen[bytes]
    log: Path
    refusals: list[str] = field(default_factory=list)
    webhook: list[list[str] | None] = field(default_factory=list)  # its gates for a new pod: Ready, then not

    @property
    def user(self) -> str:
        return f"system:serviceaccount:gk-{self.number}:scheduler-patcher-gatekeeper"

    @property
    def pod(self) -> str:
        return f"pod-{self.number}"


def pod_reads(cp: ControlPlane) -> set[tuple[str, str]]:
    """(user, pod) of every GET of a pod in `apps` (a gatekeeper reading a pod again after a refused release)."""
    return {(e["user"]["username"], e["objectRef"]["name"]) for e in audit_events(cp, contains='"verb":"get"')
            if e["verb"] == "get" and (e.get("objectRef") or {}).get("namespace") == APPS}


def webhook_answers(cp: ControlPlane, case: GateCase, gate: str) -> list[list[str] | None]:
    """The gates the case's webhook gives a new pod while its status ConfigMap says Ready (none, once listed),
    then after it turned not Ready (the gate, once the watch brought the change); the answer at each timeout."""
    port = listening_port(case.proc, case.log, server="webhook server")

    def answer_until(want: list[str] | None) -> list[str] | None:
        deadline = time.monotonic() + 60
        while (got := samples.gates(admit(port, cp.pki / "ca.crt", samples.new_pod())[1])) != want:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return got

    ready = answer_until(None)
    cp.ok("PATCH", f"/api/v1/namespaces/gk-{case.number}/configmaps/{DEFAULT_STATUS_NAME}",
          {"data": {"ready": "false"}}, "application/merge-patch+json")
    return [ready, answer_until([gate])]


def settled(cases: Iterable[GateCase], done: Callable[[], Callable[[GateCase], bool]]) -> bool:
    """Whether every case is done (`done()` reads the cluster once and answers per case); raises, naming them,
    with their logs, for gatekeepers that exited before they were: nothing would count for them any more, and
    the wait would only run out its time."""
    cases = list(cases)
    exited = [c for c in cases if c.proc.poll() is not None]
    ok = done()  # read after the poll: all that an exited gatekeeper did is in it
    if dead := [c for c in exited if not ok(c)]:
        raise AssertionError("\n".join(f"gatekeeper gk-{c.number} exited with {c.proc.returncode}:\n"
                                       f"{c.log.read_text(errors='replace')[-2000:]}" for c in dead))
    return all(ok(c) for c in cases)


@pytest.fixture(scope="module")
def gate_cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Grant | None, GateCase]]:
    """A cluster whose verdict is Ready (one node, its agent), and a gatekeeper per case, each with its own gate
    on its own pod, which the admission policy first holds (so every gatekeeper meets a refused release and reads
    the pod again), then lets go. Each also serves the webhook, reading a Ready status ConfigMap in its namespace;
    with every rule, the webhook answers from it, and follows it when it turns not Ready."""
    if (why := missing_reason()) is not None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("rbac-gatekeeper")
    with control_plane(built_releases()[0], tmp / "cp", audit_flags(tmp / "cp" / "audit")) as cp:
        apply_k(cp, "base")
        agents = Agents(cp, tmp, NS, cp.token_kubeconfig(NS, "scheduler-patcher", tmp / "agent.kubeconfig"))
        run: dict[Grant | None, GateCase] = {}
        try:
            sim = agents.add_node("cp-1")
            agents.start_agent(sim)
            wait_until(lambda: agents.configmap_data("scheduler-patcher-status").get("ready") == "true", 120,
                       "the verdict Ready")
            cp.ensure_namespace(APPS)
            hold_policy(cp)
            drops: list[Grant | None] = [None, *GK_GRANTS]
            cert, key = issue(cp.pki, "webhook", "/CN=gatekeeper-webhook", server_names=("127.0.0.1",))
            for n in range(len(drops)):
                cp.ensure_namespace(f"gk-{n}")
                verdict = samples.configmap(samples.READY)
                assert verdict is not None
                verdict["metadata"]["namespace"] = f"gk-{n}"
                cp.ok("POST", f"/api/v1/namespaces/gk-{n}/configmaps", verdict)
            listing = {"apiVersion": "v1", "kind": "List", "items": [
                o for n, drop in enumerate(drops) for o in case_objects(n, drop, GATEKEEPER, "gk")]}
            (tmp / "gk.json").write_text(json.dumps(listing))
            proc = cp.kubectl("apply", "--server-side", "-f", str(tmp / "gk.json"))
            assert proc.returncode == 0, proc.stderr
            for n, drop in enumerate(drops):
                gate = f"example.com/case-{n}"
                gated_pod(cp, f"pod-{n}", gate, held=True)
                keeper, log = gatekeeper(cp, tmp, f"gk-{n}", gate, f"gk-{n}", "--webhook-listen", "127.0.0.1:0",
                                         "--webhook-cert", str(cert), "--webhook-key", str(key))
                run[drop] = GateCase(n, keeper, log)

            def met_hold() -> Callable[[GateCase], bool]:
                refused, reads = refusals_by_user(cp), pod_reads(cp)
                return lambda c: c.user in refused or (c.user, c.pod) in reads

            def released() -> Callable[[GateCase], bool]:
                refused = refusals_by_user(cp)
                gated = {p["metadata"]["name"] for p in cp.ok("GET", f"/api/v1/namespaces/{APPS}/pods")["items"]
                         if p["spec"].get("schedulingGates")}
                return lambda c: c.user in refused or c.pod not in gated

            wait_until(lambda: settled(run.values(), met_hold), 180, "every gatekeeper refused or meeting the hold")
            for case in run.values():
                release_hold(cp, case.pod)
            wait_until(lambda: settled(run.values(), released), 180, "every gatekeeper refused or its pod released")
            run[None].webhook = webhook_answers(cp, run[None], "example.com/case-0")
            for case in run.values():
                case.proc.send_signal(signal.SIGTERM)
            for case in run.values():
                try:
                    case.proc.wait(30)
                except subprocess.TimeoutExpired:
                    case.proc.kill()
            refused = refusals_by_user(cp)
            for case in run.values():
                case.refusals = sorted(set(refused.get(case.user, [])))
            yield run
        finally:
            agents.kill_all()
            for case in run.values():
                if case.proc.poll() is None:
                    case.proc.kill()
                    case.proc.wait(10)


def test_every_verb_of_the_gatekeepers_rules_has_a_step() -> None:
    assert {(rule["resources"][0], verb) for (*_, verb), (rule, _) in grants(GATEKEEPER).items()} == set(GK_STEPS)


def test_with_every_rule_the_gatekeeper_releases_and_is_never_refused(
        gate_cases: dict[Grant | None, GateCase]) -> None:
    control = gate_cases[None]
    assert control.refusals == []
    assert control.proc.returncode == 0, control.log.read_text()
    assert control.webhook == [None, ["example.com/case-0"]], "the webhook did not answer from its verdict"


@pytest.mark.parametrize("grant", GK_GRANTS, ids=case_id)
def test_without_the_verb_that_gatekeeper_step_fails(gate_cases: dict[Grant | None, GateCase],
                                                      grant: Grant) -> None:
    case = gate_cases[grant]
    rule, _ = grants(GATEKEEPER)[grant]
    step = GK_STEPS[(rule["resources"][0], grant[4])]
    assert case.refusals, f"nothing failed without {grant}: a rule nothing needs ({step})"
    assert refused_by(grant, rule, case.number, case.refusals, "gk"), (step, case.refusals)
    assert "403" in case.log.read_text(), f"the gatekeeper did not say that {step} was refused"
