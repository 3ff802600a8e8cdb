"""No code path removes a config file a manifest still names: CLI restore, the agent's prune and stop, a failed
apply, whatever the annotation prefix (the removal guard, ``nodefiles.remove_config_file``)."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from patcher.core import manifestedit
from patcher.core import yamltext as yt
from patcher.core.errors import ManifestError, PatcherError
from patcher.core.settings import Files
from patcher.services import nodefiles
from patcher.services.record import state_store
from tests.conftest import FIXTURES
from tests.harness import helpers

KUBEADM = helpers.KUBEADM.decode()
PREFIXES = ("scheduler-patcher.io", "example.com")
CONFIG_DIR = "/etc/kubernetes/scheduler-patcher"
#: Every ``--config=PATH`` written anywhere in a manifest (its flags and the markers' JSON): the test's own
#: reading, independent of ``manifestedit.config_names``.
CONFIG_ITEM = re.compile(r"--config=([^\s'\",]+)")


def opts_for(root: Path, prefix: str, source: str = "src-a") -> Files:
    return Files(source=root / source, host_root=root, prefix=prefix)


def make_node(root: Path) -> None:
    (root / "etc/kubernetes/manifests").mkdir(parents=True)
    (root / helpers.MANIFEST).write_text(KUBEADM)
    for name, extra in (("src-a", ""), ("src-b", "percentageOfNodesToScore: 40\n")):
        (root / name).mkdir()
        (root / name / "config.yaml").write_text(helpers.SCHEDULER_CONFIG + extra)


def apply(opts: Files) -> list[str]:
    plan = nodefiles.plan_apply(opts)
    return nodefiles.apply(opts, plan)[0] if plan.pending else []


# -- the rule (core, pure) -----------------------------------------------------------------------------------


def test_config_names_reads_every_config_flag_mapped_to_the_node_and_every_markers_replaced_one() -> None:
    text = KUBEADM.replace("    - kube-scheduler\n", "    - kube-scheduler\n    - --config=/in/pod/sched.yaml\n")
    text = text.replace("  volumes:\n", "  volumes:\n  - hostPath:\n      path: /srv/sched\n    name: sched\n")
    text = text.replace("    volumeMounts:\n", "    volumeMounts:\n    - mountPath: /in/pod\n      name: sched\n")
    names = manifestedit.config_names(text)
    assert {"/in/pod/sched.yaml", "/srv/sched/sched.yaml"} <= names.paths
    assert names.names("/srv/sched/sched.yaml") and not names.names("/srv/sched/other.yaml")
    marker = manifestedit.Marker(hash="0" * 12, flag=f"--config={CONFIG_DIR}/config-000000000000.yaml",
                                 volume="v", mount=CONFIG_DIR, container="kube-scheduler",
                                 replaced="--config=/etc/old/sched.yaml")
    marked = KUBEADM.replace("metadata:\n", f"metadata:\n  annotations:\n    example.com/patch: '{marker.to_json()}'\n",
                             1)
    names = manifestedit.config_names(marked)
    assert names.names(f"{CONFIG_DIR}/config-000000000000.yaml") and names.names("/etc/old/sched.yaml")


def test_an_unparsable_manifest_keeps_every_file_whose_name_it_contains() -> None:
    names = manifestedit.config_names("a: [\n  --config=/x/config-aaaaaaaaaaaa.yaml")
    assert not names.parsed
    assert names.names("/elsewhere/config-aaaaaaaaaaaa.yaml") and not names.names("/x/config-bbbbbbbbbbbb.yaml")


def test_check_prefix_names_the_prefix_a_manifest_was_patched_with(tmp_path: Path) -> None:
    make_node(tmp_path)
    apply(opts_for(tmp_path, "scheduler-patcher.io"))
    patched = yt.parse((tmp_path / helpers.MANIFEST).read_text())
    manifestedit.check_prefix(patched, "scheduler-patcher.io", "m.yaml")
    with pytest.raises(ManifestError, match=r"m\.yaml.*prefix scheduler-patcher\.io .*--annotation-prefix "
                       r"scheduler-patcher\.io$"):
        manifestedit.check_prefix(patched, "other.example", "m.yaml")
    manifestedit.check_prefix(yt.parse(KUBEADM), "other.example", "m.yaml")  # no marker: any prefix is ours to write


# -- the admin's session: restore and apply with another prefix ----------------------------------------------


def test_restore_with_another_prefix_refuses_naming_the_prefix_and_removes_nothing(tmp_path: Path) -> None:
    make_node(tmp_path)
    apply(opts_for(tmp_path, "scheduler-patcher.io"))
    before = helpers.snapshot(str(tmp_path))
    for step in (nodefiles.plan_restore, nodefiles.plan_apply):
        with pytest.raises(ManifestError) as exc:
            step(opts_for(tmp_path, "example.com"))
        assert str(exc.value) == (
            "/etc/kubernetes/manifests/kube-scheduler.yaml: carries the scheduler-patcher marker of annotation "
            "prefix scheduler-patcher.io (scheduler-patcher.io/patch), not example.com; pass --annotation-prefix "
            "scheduler-patcher.io")
    assert helpers.snapshot(str(tmp_path)) == before


def test_a_restore_keeps_a_file_a_foreign_config_names_and_records_it_for_later(tmp_path: Path) -> None:
    make_node(tmp_path)
    opts = opts_for(tmp_path, "scheduler-patcher.io")
    lines = apply(opts)
    ours = next(line.split()[1] for line in lines if "/config-" in line)
    plan = nodefiles.plan_restore(opts)
    nodefiles.restore(opts, plan)
    assert not (tmp_path / ours.lstrip("/")).exists()
    # A hand edit points a second scheduler flag at a file we wrote: apply again, then restore keeps it.
    apply(opts)
    (tmp_path / "etc/kubernetes/manifests/extra.yaml").write_text(KUBEADM.replace(
        "    - kube-scheduler\n", f"    - kube-scheduler\n    - --config={ours}\n"))
    lines = nodefiles.restore(opts, nodefiles.plan_restore(opts))
    assert f"kept {ours}: /etc/kubernetes/manifests/extra.yaml names it in a --config" in lines
    assert (tmp_path / ours.lstrip("/")).exists()
    (tmp_path / "etc/kubernetes/manifests/extra.yaml").unlink()
    assert nodefiles.restore(opts, nodefiles.plan_restore(opts)) == [f"removed {ours}"]


def test_the_agents_prune_keeps_a_previous_config_the_manifest_was_pointed_back_at(tmp_path: Path) -> None:
    make_node(tmp_path)
    first = apply(opts_for(tmp_path, "scheduler-patcher.io"))
    old = next(line.split()[1] for line in first if "/config-" in line)
    apply(opts_for(tmp_path, "scheduler-patcher.io", "src-b"))
    # By hand, someone points the scheduler back at the previous file; the prune after Ready keeps it.
    path = tmp_path / helpers.MANIFEST
    text = path.read_text()
    current = re.search(r"- --config=(\S+)", text)
    assert current is not None
    path.write_text(text.replace(f"- --config={current.group(1)}", f"- --config={old}"))
    opts = opts_for(tmp_path, "scheduler-patcher.io")
    state = state_store(opts).load()
    lines, state = nodefiles.prune(opts, state, keep_previous=False)
    assert lines == [f"kept {old}: /etc/kubernetes/manifests/kube-scheduler.yaml names it in a --config"]
    assert (tmp_path / old.lstrip("/")).exists() and old.rsplit("/", 1)[1] in state.written


def test_every_removal_of_a_config_file_goes_through_the_guard() -> None:
    source = Path(nodefiles.__file__).read_text()
    assert source.count("fsio.remove(") == 1
    guard = source[source.index("def remove_config_file"):]
    assert "fsio.remove(" in guard[:guard.index("\ndef ")]


# -- the property: over apply / restore / prune / stop with mixed prefixes and hand edits ---------------------


class NamedFilesMachine(RuleBasedStateMachine):
    """After every step, every file a ``--config`` in the manifest names exists (hand edits only ever point a
    ``--config`` at a file that exists)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="named-files-"))
        make_node(self.root)
        self.manifest = self.root / helpers.MANIFEST

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def existing_configs(self) -> list[str]:
        folder = self.root / CONFIG_DIR.lstrip("/")
        return sorted(f"{CONFIG_DIR}/{p.name}" for p in folder.glob("config-*.yaml")) if folder.is_dir() else []

    @rule(prefix=st.sampled_from(PREFIXES), source=st.sampled_from(("src-a", "src-b")))
    def apply(self, prefix: str, source: str) -> None:
        with contextlib.suppress(PatcherError):  # a refusal is fine; a removal of a named file is not
            apply(opts_for(self.root, prefix, source))

    @rule(prefix=st.sampled_from(PREFIXES))
    def restore(self, prefix: str) -> None:
        opts = opts_for(self.root, prefix)
        with contextlib.suppress(PatcherError):
            nodefiles.restore(opts, nodefiles.plan_restore(opts))

    @rule(prefix=st.sampled_from(PREFIXES), keep_previous=st.booleans())
    def prune(self, prefix: str, keep_previous: bool) -> None:
        opts = opts_for(self.root, prefix)
        try:
            _, state = nodefiles.prune(opts, state_store(opts).load(), keep_previous=keep_previous)
            state_store(opts).save(state)
        except PatcherError:
            pass

    @rule(prefix=st.sampled_from(PREFIXES))
    def stop(self, prefix: str) -> None:
        """The agent's restore on SIGTERM: planned, written, cleaned up."""
        opts = opts_for(self.root, prefix)
        with contextlib.suppress(PatcherError):
            nodefiles.restore(opts, nodefiles.plan_restore(opts))

    @rule(data=st.data())
    def swap_prefix(self, data: st.DataObject) -> None:
        """An upgrade or a hand edit that renames the marker's annotation."""
        text = self.manifest.read_text()
        a, b = data.draw(st.permutations(PREFIXES))
        self.manifest.write_text(text.replace(f"{a}/patch", f"{b}/patch"))

    @precondition(lambda self: bool(self.existing_configs()))
    @rule(data=st.data())
    def point_flag_at(self, data: st.DataObject) -> None:
        """A hand edit: the scheduler's flag (ours or a new one) now names another existing config file."""
        target = data.draw(st.sampled_from(self.existing_configs()))
        text = self.manifest.read_text()
        if re.search(r"^    - --config=\S+$", text, re.M) and data.draw(st.booleans()):
            text = re.sub(r"^    - --config=\S+$", f"    - --config={target}", text, count=1, flags=re.M)
        else:
            text = text.replace("    - kube-scheduler\n", f"    - kube-scheduler\n    - --config={target}\n", 1)
        self.manifest.write_text(text)

    @precondition(lambda self: bool(self.existing_configs()))
    @rule(data=st.data())
    def second_static_pod(self, data: st.DataObject) -> None:
        """A copy left in the manifest folder (the kubelet runs it too) names one of the files."""
        target = data.draw(st.sampled_from(self.existing_configs()))
        (self.manifest.parent / "kube-scheduler-copy.yaml").write_text(
            KUBEADM.replace("    - kube-scheduler\n", f"    - kube-scheduler\n    - --config={target}\n", 1))

    @rule()
    def remove_second_static_pod(self) -> None:
        (self.manifest.parent / "kube-scheduler-copy.yaml").unlink(missing_ok=True)

    @invariant()
    def every_named_file_exists(self) -> None:
        for path in sorted(self.manifest.parent.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            for named in CONFIG_ITEM.findall(path.read_text()):
                assert (self.root / named.lstrip("/")).is_file(), f"{path.name} names {named}, which is gone"


TestNamedFiles = NamedFilesMachine.TestCase
TestNamedFiles.settings = settings(max_examples=30, stateful_step_count=12, deadline=None)


# -- a foreign --config the agent cannot read; a --config naming a missing file ------------------------------

FOREIGN = (FIXTURES / "manifests" / "foreign-config.yaml").read_text()


def test_a_foreign_config_out_of_reach_names_the_path_looked_at_and_both_ways_out(tmp_path: Path) -> None:
    make_node(tmp_path)
    (tmp_path / helpers.MANIFEST).write_text(FOREIGN)
    with pytest.raises(ManifestError) as exc:
        nodefiles.plan_apply(opts_for(tmp_path, "scheduler-patcher.io"))
    assert str(exc.value) == (
        "/srv/scheduler/scheduler-config.yaml: foreign scheduler config not found (kube-scheduler's "
        "--config=/etc/kubernetes/custom/scheduler-config.yaml; looked at "
        f"{tmp_path}/srv/scheduler/scheduler-config.yaml): "
        "to merge it, mount /srv/scheduler into the agent (Helm: hostPaths.foreignConfigDirs; kustomize: "
        "manifests/overlays/foreign-config); or replace it with --on-foreign-config=replace")


def test_status_reports_a_config_flag_that_names_a_missing_file_as_an_error(tmp_path: Path) -> None:
    make_node(tmp_path)
    opts = opts_for(tmp_path, "scheduler-patcher.io")
    ours = next(line.split()[1] for line in apply(opts) if "/config-" in line)
    assert "error" not in nodefiles.status(opts)
    (tmp_path / ours.lstrip("/")).unlink()
    info = nodefiles.status(opts)
    assert info["patched"] is True
    assert info["error"] == (f"{ours}: kube-scheduler's --config={ours} names a missing file; its next start fails "
                             "(run apply to write it back, or restore)")


def test_the_agent_says_when_it_writes_back_a_config_file_the_manifest_names(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from patcher.services import reconcile

    make_node(tmp_path)
    opts = opts_for(tmp_path, "scheduler-patcher.io")
    ours = next(line.split()[1] for line in apply(opts) if "/config-" in line)
    (tmp_path / ours.lstrip("/")).unlink()
    with caplog.at_level("WARNING", logger="patcher.services.agent"):
        planned, plan = reconcile.plan(opts, fallback_version=None, bad_hashes=frozenset())
    assert planned.kind == "pending" and plan is not None
    assert f"{ours} is named by the manifest's --config but missing; writing it back" in caplog.text
