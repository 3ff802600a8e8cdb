"""SIGKILL of ``apply``, ``restore`` and the agent at every step of their file work.

Each writer runs in a forked child that kills itself with SIGKILL at its k-th file-system step (open, write
of a temp file's fsync, rename, unlink): a hook in the child, not a sleep race, so every moment is reached and
the test is the same on an idle and a loaded machine. After each kill the node must be consistent: the manifest
is the original or the original plus exactly our patch (never torn), no stray non-dot file sits in the kubelet's
folder, and after the start-up clean-up an apply + restore gives back the original bytes.
"""

from __future__ import annotations

import os
import shutil
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from patcher.core.settings import Files
from patcher.services import nodefiles
from patcher.services.record import remove_stale_temp_files
from patcher.services.runner import build_agent
from tests.conftest import FIXTURES
from tests.harness.helpers import MANIFEST, node_folders
from tests.harness.settings import build_settings

STEPS = ("open", "fsync", "replace", "rename", "unlink", "fchmod")
VARIANTS = ["kubeadm.yaml", "args-rke2.yaml", "no-volumes.yaml"]  # ~90 kill points each: > 200 in total


def make_node(base: Path, original: bytes) -> Files:
    if base.exists():
        shutil.rmtree(base)
    root, src = node_folders(base, original)
    return Files(source=src, host_root=root)


def copy_node(template: Files, base: Path) -> Files:
    if base.exists():
        shutil.rmtree(base)
    shutil.copytree(template.host_root.parent, base, symlinks=True)
    return Files(source=base / "src", host_root=base / "node")


def do_apply(opts: Files) -> None:
    plan = nodefiles.plan_apply(opts)
    if plan.pending:
        nodefiles.apply(opts, plan)


def do_restore(opts: Files) -> None:
    nodefiles.restore(opts, nodefiles.plan_restore(opts))


def do_run(opts: Files) -> None:
    """The agent's own path: start (clean-up, reconcile: the patch), then the restore on exit."""
    settings = build_settings(files=opts, restore_on_exit="always", check_extenders=False, no_api=True)
    agent = build_agent(settings, None).agent
    agent.reconcile("start")
    agent.shutdown()


def killed_at(k: int, work: Callable[[Files], None], opts: Files) -> bool:
    """Run ``work`` in a forked child that SIGKILLs itself at its k-th file step; True when it was killed."""
    pid = os.fork()
    if pid == 0:  # the child: count the steps, die at the k-th
        try:
            count = [0]

            def hooked(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
                def step(*args: Any, **kwargs: Any) -> Any:
                    count[0] += 1
                    if count[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return step

            for name in STEPS:
                setattr(os, name, hooked(name, getattr(os, name)))
            work(opts)
            os._exit(0)
        except BaseException:  # report any failure through the exit code (and its traceback on stderr)
            traceback.print_exc()
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the writer failed at step {k} without being killed"
    return False


def check_consistent(opts: Files, original: bytes, patched: bytes, where: str) -> None:
    folder = opts.host_root / "etc/kubernetes/manifests"
    assert sorted(p for p in os.listdir(folder) if not p.startswith(".")) == ["kube-scheduler.yaml"], where
    assert (opts.host_root / MANIFEST).read_bytes() in (original, patched), where
    remove_stale_temp_files(opts)  # what the agent does first when it starts again
    assert sorted(os.listdir(folder)) == ["kube-scheduler.yaml"], where
    do_apply(opts)
    assert (opts.host_root / MANIFEST).read_bytes() == patched, where
    do_restore(opts)
    assert (opts.host_root / MANIFEST).read_bytes() == original, where


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("variant", VARIANTS)
def test_sigkill_at_every_file_step_of_apply_restore_and_run_leaves_a_consistent_node(
        tmp_path: Path, variant: str) -> None:
    original = (FIXTURES / "manifests" / variant).read_bytes()
    unpatched = make_node(tmp_path / "unpatched", original)
    reference = make_node(tmp_path / "patched", original)
    do_apply(reference)
    patched = (reference.host_root / MANIFEST).read_bytes()
    assert patched != original
    kills = 0
    for name, work, template in (("apply", do_apply, unpatched), ("restore", do_restore, reference),
                                 ("run", do_run, unpatched)):
        k = 1
        while True:
            opts = copy_node(template, tmp_path / "node")
            if not killed_at(k, work, opts):
                break  # the writer finished: every step of it was a kill point
            kills += 1
            check_consistent(opts, original, patched, f"{variant}: {name} killed at step {k}")
            k += 1
            assert k < 200, "runaway: the writer never finishes"
    assert kills >= 70
