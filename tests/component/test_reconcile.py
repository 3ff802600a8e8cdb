"""The executor's observation before a rollback (``reconcile.check_last_good``): the step chooses the target
from what it reports, so each way a last Ready config stops fitting must be reported, never guessed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from patcher.core import lifecycle
from patcher.core.settings import Files
from patcher.core.state import LastGood
from patcher.services import nodefiles, reconcile
from patcher.services.record import state_store
from tests.harness import helpers


def patched(tmp_path: Path) -> tuple[Files, LastGood]:
    """A node patched with the example config, and that config as the last Ready one."""
    root, src = helpers.node_folders(tmp_path)
    files = Files(source=src, host_root=root)
    plan = nodefiles.plan_apply(files)
    assert plan.config is not None
    _, record = nodefiles.apply(files, plan, state_store(files).load())
    good = LastGood(config_hash=record.config_hash, config_file=record.config_file, files=record.files,
                    original_sha256=nodefiles.sha256(plan.unpatched), api_version=record.api_version)
    return files, good


def check(files: Files, good: LastGood) -> tuple[lifecycle.LastGoodChecked, nodefiles.Plan | None]:
    return reconcile.check_last_good(files, lifecycle.CheckLastGood("why", "s" * 64, good))


def test_a_last_ready_config_that_fits_is_reported_with_its_plan(tmp_path: Path) -> None:
    files, good = patched(tmp_path)
    answer, plan = check(files, good)
    assert answer.fits and plan is not None and plan.config is not None
    assert plan.config.config_hash == good.config_hash


def test_files_that_cannot_be_read_back_do_not_fit(tmp_path: Path) -> None:
    files, good = patched(tmp_path)
    (tmp_path / "node" / "etc/kubernetes/scheduler-patcher" / good.config_file).unlink()
    answer, plan = check(files, good)
    assert not answer.fits and plan is None and "cannot be read back" in answer.why


def test_a_manifest_upgraded_since_the_config_was_ready_does_not_fit(tmp_path: Path) -> None:
    """After a kubeadm upgrade the unpatched manifest is not the one the config ran with: only the original
    is safe (the config may use an apiVersion the new scheduler does not serve)."""
    files, good = patched(tmp_path)
    answer, plan = check(files, replace(good, original_sha256="0" * 64))
    assert not answer.fits and plan is None and "the manifest changed since config" in answer.why
