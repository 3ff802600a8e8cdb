"""One writer at a time: races forced through the writers' file operations (``Hooked``), on a real
file system, with threads that hand over through events (no sleeps, no timing)."""

from __future__ import annotations

import hashlib
import os
import posixpath
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from patcher.adapters import fsio
from patcher.core import manifestedit
from patcher.core.settings import Files
from patcher.services import nodefiles
from patcher.services.record import state_store, writer_lock
from tests.harness.fileops import Hooked
from tests.harness.helpers import KUBEADM, MANIFEST

CONFIG = """apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
extenders:
- urlPrefix: http://127.0.0.1:8889
  filterVerb: filter
  weight: {weight}
"""
WAIT = 30.0  # upper bound only: every hand-over below is an event, the lock never waits this long


@pytest.fixture
def opts(tmp_path: Path) -> Files:
    node = tmp_path / "node"
    (node / "etc/kubernetes/manifests").mkdir(parents=True)
    (node / MANIFEST).write_bytes(KUBEADM)
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.yaml").write_text(CONFIG.format(weight=1))
    return Files(source=src, host_root=node, lock_wait=WAIT)


def consistent(opts: Files) -> None:
    """The node invariant the races used to break: the manifest's --config file exists, and the state record
    describes exactly the manifest on disk and files that exist."""
    local = nodefiles.host_fs(opts).local(opts.manifest_path)
    text = local.read_text()
    sched = manifestedit.inspect(manifestedit.parse_manifest(text, "m"), "m", prefix=opts.prefix)
    state = state_store(opts).load()
    if sched.marker is not None:
        path = sched.marker.flag.split("=", 1)[1]
        assert nodefiles.host_fs(opts).local(path).is_file(), f"manifest points at a missing {path}"
        assert state.patched_sha256 == hashlib.sha256(text.encode()).hexdigest()
        assert state.config_file == posixpath.basename(path)
    for name in state.files:
        assert nodefiles.host_fs(opts).local(os.path.join(opts.host_config_dir, name)).is_file()


def paused_at_manifest_rename(opts: Files, other: Callable[[fsio.FileOps], None]) -> Hooked:
    """File operations that, when the paused writer reaches its manifest rename, run ``other`` (handed them
    too) in a thread and let the paused writer go on only once ``other`` has found the lock busy (or
    finished)."""
    manifest_local = str(nodefiles.host_fs(opts).local(opts.manifest_path))
    busy = threading.Event()
    started: list[threading.Thread] = []

    def hook(point: str, path: Path) -> None:
        if point == "lock-busy":
            busy.set()
        elif point == "before-rename" and str(path) == manifest_local and not started:
            def run_other() -> None:
                other(ops)
                busy.set()

            t = threading.Thread(target=run_other)
            started.append(t)
            t.start()
            assert busy.wait(WAIT)

    ops = Hooked(hook)
    ops.threads = started  # type: ignore[attr-defined]
    return ops


def test_restore_during_an_apply_waits_and_never_deletes_the_config_the_manifest_points_at(
        opts: Files) -> None:
    plan = nodefiles.plan_apply(opts)
    outcome: list[object] = []

    def restore(ops: fsio.FileOps) -> None:
        try:
            rplan = nodefiles.plan_restore(opts)  # planned while the apply is paused: state names the new file
            outcome.append(nodefiles.restore(opts, rplan, ops=ops))
        except fsio.ChangedUnderneath as exc:
            outcome.append(exc)

    ops = paused_at_manifest_rename(opts, restore)
    lines, _ = nodefiles.apply(opts, plan, ops=ops)
    for t in ops.threads:  # type: ignore[attr-defined]
        t.join(WAIT)
    assert lines[-1].startswith("wrote ") and lines[-1].endswith("kube-scheduler.yaml")
    assert len(outcome) == 1 and isinstance(outcome[0], fsio.ChangedUnderneath), outcome
    consistent(opts)
    nodefiles.restore(opts, nodefiles.plan_restore(opts))  # planned again after the apply: it works
    assert nodefiles.host_fs(opts).local(opts.manifest_path).read_bytes() == KUBEADM
    assert not [p for p in nodefiles.host_fs(opts).local(opts.host_config_dir).iterdir() if not p.name.startswith(".")]


def test_two_applies_of_different_configs_end_with_one_consistent_record(opts: Files) -> None:
    first = nodefiles.plan_apply(opts)
    (opts.source / "config.yaml").write_text(CONFIG.format(weight=2))
    second = nodefiles.plan_apply(opts)
    assert first.config and second.config and first.config.config_hash != second.config.config_hash
    outcome: list[object] = []

    def apply_second(ops: fsio.FileOps) -> None:
        try:
            outcome.append(nodefiles.apply(opts, second, ops=ops))
        except fsio.ChangedUnderneath as exc:
            outcome.append(exc)

    ops = paused_at_manifest_rename(opts, apply_second)
    nodefiles.apply(opts, first, ops=ops)
    for t in ops.threads:  # type: ignore[attr-defined]
        t.join(WAIT)
    assert len(outcome) == 1 and isinstance(outcome[0], fsio.ChangedUnderneath), outcome
    consistent(opts)
    assert state_store(opts).load().config_hash == first.config.config_hash
    again = nodefiles.plan_apply(opts)  # the second writer plans again from the new bytes and wins cleanly
    nodefiles.apply(opts, again)
    consistent(opts)
    assert state_store(opts).load().config_hash == second.config.config_hash


def test_a_kubeadm_style_write_during_our_rename_is_never_lost(opts: Files) -> None:
    plan = nodefiles.plan_apply(opts)
    local = nodefiles.host_fs(opts).local(opts.manifest_path)
    upgraded = KUBEADM.replace(b"v1.31.2", b"v1.32.0")
    assert upgraded != KUBEADM

    def kubeadm_writes(point: str, path: Path) -> None:  # past our re-check, right before our rename
        if point == "before-rename" and path == local:
            tmp = local.parent.parent / "kube-scheduler.yaml.kubeadm-tmp"
            tmp.write_bytes(upgraded)
            os.replace(tmp, local)

    with pytest.raises(fsio.ChangedUnderneath):
        nodefiles.apply(opts, plan, ops=Hooked(kubeadm_writes))
    assert local.read_bytes() == upgraded
    assert os.listdir(local.parent) == ["kube-scheduler.yaml"]  # no temp file of ours left behind
    assert not state_store(opts).load().patched  # the record was rewound: it does not claim a patch
    consistent(opts)


def test_checked_write_swaps_in_place_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "m.yaml"
    target.write_bytes(b"old")
    fsio.atomic_write(target, b"new", expect=b"old")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["m.yaml"]
    with pytest.raises(fsio.ChangedUnderneath):
        fsio.atomic_write(target, b"newer", expect=b"old")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["m.yaml"]


def test_the_lock_is_reentrant_for_its_holder(opts: Files) -> None:
    quick = replace(opts, lock_wait=0.0)
    with writer_lock(quick):  # the agent holds it for its whole life and still applies
        lines, _ = nodefiles.apply(quick, nodefiles.plan_apply(quick))
    assert lines
    consistent(quick)


def test_a_second_writer_is_refused_in_one_line_naming_the_holder(opts: Files) -> None:
    state = nodefiles.host_fs(opts).local(opts.state_dir)
    code = (
        "import sys, pathlib\n"
        "from patcher.adapters import fsio\n"
        f"with fsio.writer_lock(pathlib.Path({str(state)!r}), 'x', wait=0):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        quick = replace(opts, lock_wait=0.0)
        plan = nodefiles.plan_apply(quick)
        with pytest.raises(fsio.LockBusy) as info:
            nodefiles.apply(quick, plan)
        assert str(info.value) == (f"{opts.state_dir}/.lock: another scheduler-patcher writer holds the lock "
                                   f"(pid {holder.pid}); gave up after 0 s")
        assert "\n" not in str(info.value)
        assert nodefiles.host_fs(opts).local(opts.manifest_path).read_bytes() == KUBEADM
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(WAIT)
    nodefiles.apply(opts, nodefiles.plan_apply(opts))  # released with the holder: the next writer goes ahead
    consistent(opts)


def test_another_thread_waits_like_another_process(opts: Files) -> None:
    """In-process writers are serialised too (the lock is reentrant only for the thread that holds it)."""
    got: list[object] = []
    with writer_lock(opts):
        def other() -> None:
            try:
                with writer_lock(replace(opts, lock_wait=0.0)):
                    got.append("entered")
            except fsio.LockBusy as exc:
                got.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join(WAIT)
    assert len(got) == 1 and isinstance(got[0], fsio.LockBusy) and f"pid {os.getpid()}" in str(got[0])
