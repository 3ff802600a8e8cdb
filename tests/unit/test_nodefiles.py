"""``nodefiles`` on a fake node file system (pyfakefs): what apply/restore write, and what they never touch."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem, set_uid

from patcher.adapters import fsio
from patcher.core.errors import PatcherError
from patcher.core.settings import Files
from patcher.services import nodefiles
from tests.conftest import FIXTURES
from tests.harness import helpers
from tests.harness.fileops import Hooked
from tests.harness.helpers import fake_node, snapshot

MANIFEST = "/" + helpers.MANIFEST
KUBEADM = helpers.KUBEADM.decode()
FOREIGN = (FIXTURES / "manifests" / "foreign-config.yaml").read_text()
CONFIG = helpers.SCHEDULER_CONFIG


@pytest.fixture
def fs_with_schemas(fs: FakeFilesystem) -> FakeFilesystem:
    fs.add_real_directory(helpers.SCHEMAS, read_only=True)  # package data the validator reads
    return fs


@pytest.fixture
def node(fs: FakeFilesystem) -> Iterator[FakeFilesystem]:
    fake_node(fs)
    yield fs
    set_uid(0)


OPTS = Files(source=Path("/src"))


def apply(opts: Files = OPTS) -> list[str]:
    plan = nodefiles.plan_apply(opts)
    return nodefiles.apply(opts, plan)[0] if plan.pending else []


def test_apply_writes_config_then_manifest_and_nothing_else_in_the_manifest_folder(node: FakeFilesystem) -> None:
    lines = apply()
    cfg = [p for p in os.listdir("/etc/kubernetes/scheduler-patcher")]
    assert len(cfg) == 1 and cfg[0].startswith("config-") and cfg[0].endswith(".yaml")
    assert lines == [f"wrote /etc/kubernetes/scheduler-patcher/{cfg[0]}", f"wrote {MANIFEST}"]
    assert os.listdir("/etc/kubernetes/manifests") == ["kube-scheduler.yaml"]
    written = Path("/etc/kubernetes/scheduler-patcher", cfg[0]).read_text()
    assert written.startswith("# Rendered by scheduler-patcher from config.yaml")
    assert "- urlPrefix: http://127.0.0.1:8889\n" in written
    assert os.stat(f"/etc/kubernetes/scheduler-patcher/{cfg[0]}").st_mode & 0o777 == 0o644
    assert f"--config=/etc/kubernetes/scheduler-patcher/{cfg[0]}" in Path(MANIFEST).read_text()
    assert sorted(os.listdir("/var/lib/scheduler-patcher")) == [".lock", "original-manifest.yaml", "state.json"]
    assert Path("/var/lib/scheduler-patcher/original-manifest.yaml").read_text() == KUBEADM


def test_second_apply_does_not_touch_the_manifest(node: FakeFilesystem) -> None:
    apply()
    os.utime(MANIFEST, ns=(1_000_000_000, 1_000_000_123))
    before = snapshot()
    assert apply() == []
    assert os.stat(MANIFEST).st_mtime_ns == 1_000_000_123
    assert snapshot() == before


def test_config_change_keeps_current_and_previous_files(node: FakeFilesystem) -> None:
    names = []
    for n in range(3):
        Path("/src/config.yaml").write_text(CONFIG + f"percentageOfNodesToScore: {10 + n}\n")
        apply()
        names.append(json.loads(Path("/var/lib/scheduler-patcher/state.json").read_text())["config_file"])
    assert sorted(os.listdir("/etc/kubernetes/scheduler-patcher")) == sorted(names[1:])
    assert f"--config=/etc/kubernetes/scheduler-patcher/{names[2]}" in Path(MANIFEST).read_text()
    assert Path("/var/lib/scheduler-patcher/original-manifest.yaml").read_text() == KUBEADM


def test_restore_gives_back_the_original_and_removes_our_files(node: FakeFilesystem) -> None:
    before = snapshot()
    apply()
    plan = nodefiles.plan_restore(OPTS)
    lines = nodefiles.restore(OPTS, plan)
    assert lines[0] == f"wrote {MANIFEST}" and lines[1].startswith("removed /etc/kubernetes/scheduler-patcher/")
    assert Path(MANIFEST).read_text() == KUBEADM
    after = snapshot()
    created_dirs = {k for k in after if k not in before}
    assert created_dirs == {"/etc/kubernetes/scheduler-patcher/", "/var/", "/var/lib/", "/var/lib/scheduler-patcher/",
                            "/var/lib/scheduler-patcher/.lock"}  # the writer lock stays (empty of meaning when free)
    assert {k: v for k, v in after.items() if k in before} == before


def test_restore_keeps_an_upgrade_made_since(node: FakeFilesystem) -> None:
    apply()
    upgraded = Path(MANIFEST).read_text().replace("v1.31.2", "v1.32.0")
    Path(MANIFEST).write_text(upgraded)
    nodefiles.restore(OPTS, nodefiles.plan_restore(OPTS))
    assert Path(MANIFEST).read_text() == KUBEADM.replace("v1.31.2", "v1.32.0")


def test_restore_falls_back_to_the_saved_original_when_the_manifest_is_broken(node: FakeFilesystem) -> None:
    apply()
    ours = Path(MANIFEST).read_text()
    Path(MANIFEST).write_text(ours.replace("spec:\n", "spec:\n\tbroken: [\n"))  # still ours, no longer YAML
    plan = nodefiles.plan_restore(OPTS)
    assert "cannot be parsed" in plan.notes[0]
    nodefiles.restore(OPTS, plan)
    assert Path(MANIFEST).read_text() == KUBEADM


def test_restore_never_writes_the_saved_original_over_a_manifest_that_is_not_ours(node: FakeFilesystem) -> None:
    apply()
    upgraded = KUBEADM.replace("v1.31.2", "v1.32.0")
    Path(MANIFEST).write_text(upgraded)  # rewritten by someone else: nothing of ours left to remove
    assert [c.kind for c in nodefiles.plan_restore(OPTS).changes] == ["config"]
    odd = upgraded.replace("    - kube-scheduler\n", "    - /usr/local/bin/scheduler-wrapper\n").replace(
        "name: kube-scheduler\n    resources", "name: sched\n    resources")
    Path(MANIFEST).write_text(odd)  # valid YAML, but we cannot find the scheduler in it: refuse, no fallback
    before = snapshot()
    with pytest.raises(PatcherError, match="no kube-scheduler container"):
        nodefiles.plan_restore(OPTS)
    Path(MANIFEST).write_text("kind: Pod\n\tbroken by an admin, not by us")
    with pytest.raises(PatcherError, match="invalid YAML"):
        nodefiles.plan_restore(OPTS)
    Path(MANIFEST).write_text(odd)
    assert snapshot() == before


def test_apply_does_not_overwrite_a_manifest_rewritten_after_the_plan(node: FakeFilesystem) -> None:
    plan = nodefiles.plan_apply(OPTS)
    upgraded = KUBEADM.replace("v1.31.2", "v1.32.0")
    Path(MANIFEST).write_text(upgraded)  # kubeadm upgrade lands between plan and write
    with pytest.raises(PatcherError, match="changed by someone else"):
        nodefiles.apply(OPTS, plan)
    assert Path(MANIFEST).read_text() == upgraded
    assert not os.path.exists("/etc/kubernetes/scheduler-patcher")  # checked before writing anything
    lines = apply()  # a new plan from the new file works
    assert lines[-1] == f"wrote {MANIFEST}" and "v1.32.0" in Path(MANIFEST).read_text()


@pytest.mark.parametrize("flag", ["state_dir", "host_config_dir"])
def test_our_folders_inside_the_manifest_folder_are_refused(node: FakeFilesystem, flag: str) -> None:
    opts = Files(source=Path("/src"), **{flag: "/etc/kubernetes/manifests/backup"})  # type: ignore[arg-type]
    before = snapshot()
    with pytest.raises(PatcherError, match="inside the manifest folder"):
        apply(opts)
    assert snapshot() == before


def test_restore_of_an_unparsable_manifest_we_never_patched_is_refused(node: FakeFilesystem) -> None:
    Path(MANIFEST).write_text("kind: Pod\n\tbroken")
    with pytest.raises(PatcherError, match="invalid YAML"):
        nodefiles.plan_restore(OPTS)


def test_symlinked_manifest_is_edited_at_its_target(node: FakeFilesystem) -> None:
    os.remove(MANIFEST)
    node.create_file("/etc/kubernetes/real/kube-scheduler.yaml", contents=KUBEADM)
    os.symlink("/etc/kubernetes/real/kube-scheduler.yaml", MANIFEST)
    apply()
    assert os.path.islink(MANIFEST)
    assert "--config=" in Path("/etc/kubernetes/real/kube-scheduler.yaml").read_text()
    assert os.listdir("/etc/kubernetes/manifests") == ["kube-scheduler.yaml"]


def test_host_root_maps_every_node_path(fs_with_schemas: FakeFilesystem) -> None:
    fs = fs_with_schemas
    fs.create_file("/host" + MANIFEST, contents=KUBEADM)
    fs.create_file("/src/config.yaml", contents=CONFIG)
    opts = Files(source=Path("/src"), host_root=Path("/host"))
    lines = apply(opts)
    assert lines[-1] == f"wrote {MANIFEST}"
    text = Path("/host" + MANIFEST).read_text()
    assert "path: /etc/kubernetes/scheduler-patcher\n" in text and "/host" not in text
    assert os.path.isdir("/host/etc/kubernetes/scheduler-patcher") and os.path.isdir("/host/var/lib/scheduler-patcher")
    assert not os.path.exists("/etc/kubernetes/scheduler-patcher")


def test_status_reports_the_contract_fields(node: FakeFilesystem) -> None:
    assert nodefiles.status(OPTS)["patched"] is False
    apply()
    info = nodefiles.status(OPTS)
    state = json.loads(Path("/var/lib/scheduler-patcher/state.json").read_text())
    assert info["patched"] is True and info["up_to_date"] is True
    assert info["config_hash"] == state["config_hash"] and len(info["config_hash"]) == 64
    assert info["foreign_config"] is None
    assert info["manifest_mtime"].endswith("Z") and len(info["manifest_mtime"].split(".")[1]) == 10


BAD_CASES: dict[str, tuple[Callable[[FakeFilesystem], object], str]] = {
    "missing manifest": (lambda fs: os.remove(MANIFEST), f"{MANIFEST}: manifest not found"),
    "missing folder": (lambda fs: fs.remove_object("/etc/kubernetes/manifests"), "manifest folder not found"),
    "missing source": (lambda fs: os.remove("/src/config.yaml"), "/src: no source config"),
    "source not a config": (lambda fs: Path("/src/config.yaml").write_text("kind: Policy\n"),
                            "not a KubeSchedulerConfiguration"),
    "not utf-8": (lambda fs: Path(MANIFEST).write_bytes(KUBEADM.encode("utf-16")), "not UTF-8"),
    "invalid yaml": (lambda fs: Path(MANIFEST).write_text(KUBEADM.replace("  name: kube-scheduler\n",
                                                                          "\tname: kube-scheduler\n")),
                     "invalid YAML"),
    "foreign config missing": (lambda fs: Path(MANIFEST).write_text(FOREIGN),
                               "/srv/scheduler/scheduler-config.yaml: foreign scheduler config not found"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_changes_nothing_on_disk(node: FakeFilesystem, case: str) -> None:
    breaker, message = BAD_CASES[case]
    breaker(node)
    before = snapshot()
    with pytest.raises(PatcherError) as info:
        apply()
    assert message in str(info.value)
    assert snapshot() == before


def test_unwritable_manifest_folder_is_refused_before_any_write(node: FakeFilesystem) -> None:
    os.chmod("/etc/kubernetes/manifests", 0o555)
    before = snapshot()
    set_uid(1000)
    with pytest.raises(PatcherError, match="not writable"):
        apply()
    set_uid(0)
    assert snapshot() == before


def test_failed_manifest_write_removes_the_config_files_it_created(node: FakeFilesystem) -> None:
    plan = nodefiles.plan_apply(OPTS)
    before = snapshot()

    def replace_by_folder(point: str, path: Path) -> None:  # after the re-check under the lock
        if point == "before-rename" and str(path) == MANIFEST:
            os.remove(MANIFEST)
            os.mkdir(MANIFEST)  # the checked rename refuses a directory in place of the manifest

    with pytest.raises(PatcherError, match="is a directory"):
        nodefiles.apply(OPTS, plan, ops=Hooked(replace_by_folder))
    assert not os.path.exists("/etc/kubernetes/scheduler-patcher")  # the folder it made goes too
    assert os.listdir("/etc/kubernetes/manifests") == ["kube-scheduler.yaml"]
    assert set(snapshot()) - set(before) == {"/var/", "/var/lib/",
                                             "/var/lib/scheduler-patcher/", "/var/lib/scheduler-patcher/.lock",
                                             MANIFEST + "/"}


def test_foreign_config_path_maps_through_hostpath_volumes() -> None:
    from patcher.core import manifestedit as m

    sched = m.inspect(m.parse_manifest(FOREIGN, "x"), "x", prefix="scheduler-patcher.io")
    assert m.map_to_node(sched.mounts, sched.volumes, "/etc/kubernetes/custom/scheduler-config.yaml") == \
        "/srv/scheduler/scheduler-config.yaml"
    assert m.map_to_node(sched.mounts, sched.volumes, "/elsewhere/x.yaml") is None


FOREIGN_CONFIG = """# the platform team's own scheduler config
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
profiles:
- schedulerName: default-scheduler
extenders:
- urlPrefix: http://127.0.0.1:7777  # gpu extender
  filterVerb: filter
"""


def test_foreign_config_fail_mode_refuses(node: FakeFilesystem) -> None:
    Path(MANIFEST).write_text(FOREIGN)
    opts = Files(source=Path("/src"), on_foreign="fail")
    before = snapshot()
    with pytest.raises(PatcherError, match="already runs with --config=/etc/kubernetes/custom/scheduler-config"):
        apply(opts)
    assert snapshot() == before


def test_foreign_config_is_merged_from_the_node_and_restore_puts_it_back(node: FakeFilesystem) -> None:
    Path(MANIFEST).write_text(FOREIGN)
    node.create_file("/srv/scheduler/scheduler-config.yaml", contents=FOREIGN_CONFIG)
    apply()
    text = Path(MANIFEST).read_text()
    assert "--config=/etc/kubernetes/custom/scheduler-config.yaml" not in text.split("annotations")[-1]
    name = json.loads(Path("/var/lib/scheduler-patcher/state.json").read_text())["config_file"]
    merged = Path("/etc/kubernetes/scheduler-patcher", name).read_text()
    assert "http://127.0.0.1:7777  # gpu extender" in merged and "http://127.0.0.1:8889" in merged
    assert merged.index("7777") < merged.index("8889")  # theirs first, ours appended
    assert Path("/srv/scheduler/scheduler-config.yaml").read_text() == FOREIGN_CONFIG  # never modified
    info = nodefiles.status(OPTS)
    assert info["foreign_config"] == "/etc/kubernetes/custom/scheduler-config.yaml"
    nodefiles.restore(OPTS, nodefiles.plan_restore(OPTS))
    assert Path(MANIFEST).read_text() == FOREIGN


def test_plan_apply_inspects_the_manifest_once_and_hands_it_on(node: FakeFilesystem,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """It inspected 3-5 times. Once as it is; once more only when patched (as restore leaves it)."""
    from patcher.core import manifestedit

    seen: list[str] = []
    real = manifestedit.inspect

    def counting(doc: Any, where: str, **kw: Any) -> manifestedit.Scheduler:
        seen.append(doc.text)
        return real(doc, where, **kw)

    monkeypatch.setattr(manifestedit, "inspect", counting)
    apply()
    assert seen == [KUBEADM]
    seen.clear()
    patched = Path(MANIFEST).read_text()
    Path("/src/config.yaml").write_text(CONFIG.replace("filterVerb: filter", "filterVerb: filter\n  weight: 2"))
    assert apply()[-1] == f"wrote {MANIFEST}"
    assert seen == [patched, KUBEADM]


def test_a_restore_writes_nothing_over_a_manifest_changed_since_it_was_planned(node: FakeFilesystem) -> None:
    apply()
    plan = nodefiles.plan_restore(OPTS)
    upgraded = Path(MANIFEST).read_text().replace("v1.31.2", "v1.32.0")  # a kubeadm upgrade keeps our items
    Path(MANIFEST).write_text(upgraded)
    before = snapshot()
    with pytest.raises(fsio.ChangedUnderneath, match="changed by someone else"):
        nodefiles.restore(OPTS, plan)
    assert snapshot() == before
    nodefiles.restore(OPTS, nodefiles.plan_restore(OPTS))  # the stop's fallback: planned from what is there now
    assert Path(MANIFEST).read_text() == KUBEADM.replace("v1.31.2", "v1.32.0")
