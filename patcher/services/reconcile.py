"""The agent's file work, each reduced to the one ``lifecycle`` event it produces: plan the source against
the manifest (``Planned``), write the plan (``Wrote``/``WriteFailed``/``StateFolderFailed``), roll back
(``RollbackDone``), prune the previous config (``Pruned``). The agent's queue feeds the
event to the step; nothing here decides what comes next."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from patcher.adapters import fsio
from patcher.core import lifecycle, manifestedit
from patcher.core.errors import ConfigError, PatcherError, StateFolderError
from patcher.core.settings import Files
from patcher.core.state import State
from patcher.services import nodefiles
from patcher.services.record import state_folder_message

log = logging.getLogger("patcher.services.agent")


def plan(files: Files, *, fallback_version: str | None,
         bad_hashes: frozenset[str]) -> tuple[lifecycle.Planned, nodefiles.Plan | None]:
    """Plan the source against the manifest: what was found, and the plan an ``Apply`` would write."""
    now = time.monotonic()
    try:
        p = nodefiles.plan_apply(files, fallback_version=fallback_version, bad_hashes=bad_hashes)
    except Exception as exc:  # a reconcile that fails is a refusal the agent reports, never a crash
        log.debug("refused", exc_info=True)
        missing = nodefiles.missing_named_config(files)
        if isinstance(exc, nodefiles.KnownBadConfig):
            return lifecycle.Planned(now, "known-bad", message=str(exc), missing=missing), None
        if isinstance(exc, PatcherError):
            return lifecycle.Planned(now, "refused", message=str(exc), missing=missing,
                                     error_kind="config" if isinstance(exc, ConfigError) else "manifest"), None
        return lifecycle.Planned(now, "refused", message=f"{files.source}: {type(exc).__name__}: {exc}",
                                 error_kind="config", missing=missing), None
    config = p.config
    if not p.pending:
        return lifecycle.Planned(
            now, "up-to-date", config_hash=config.config_hash, config_file=config.main,
            api_version=config.api_version, files=tuple(sorted(config.files)), source_hash=p.source_hash,
            current_sha256=nodefiles.sha256(p.current), unpatched_sha256=nodefiles.sha256(p.unpatched),
            mtime_ns=fsio.mtime_ns(p.manifest_local) or 0), p
    named = manifestedit.config_names(p.current.decode("utf-8", "replace"))
    written_back = False
    for change in p.changes:
        if change.kind == "config" and change.old is None and named.names(change.node_path):
            # The scheduler's next start would fail on it: said before the write that puts it back.
            log.warning("%s is named by the manifest's --config but missing; writing it back", change.node_path)
            written_back = True
    manifest_change = p.manifest_change() is not None
    # A write of the manifest replaces the --config it names; a write of the named file puts it back. Else a
    # missing file stays missing (e.g. only another of our files is rewritten): said as an error.
    missing = "" if manifest_change or written_back else nodefiles.missing_named_config(files)
    return lifecycle.Planned(now, "pending", config_hash=config.config_hash, config_file=config.main,
                             api_version=config.api_version, files=tuple(sorted(config.files)),
                             source_hash=p.source_hash, manifest_change=manifest_change, missing=missing), p


def apply(files: Files, plan: nodefiles.Plan, record: State, *, why: str, expect: Callable[[], None],
          log_extra: dict[str, str], ops: fsio.FileOps = fsio.REAL) -> lifecycle.Event:
    """Write ``plan`` through ``ops`` (``expect``: the folder watch is told the manifest event that follows is
    ours)."""
    try:
        lines, record = nodefiles.apply(files, plan, record, ops=ops)
    except fsio.ChangedUnderneath as exc:
        return lifecycle.WriteFailed(str(exc), changed_underneath=True)
    except StateFolderError as exc:  # nothing was written: the write waits for the folder
        return lifecycle.StateFolderFailed(state_folder_message(exc))
    except PatcherError as exc:
        return lifecycle.WriteFailed(str(exc), changed_underneath=False)
    expect()
    for note in plan.notes:
        log.info("%s", note, extra=log_extra)
    for line in lines:
        log.info("%s (%s)", line, why, extra={**log_extra, "hash": plan.config.short_hash})
    record = replace(record, source_hash=plan.source_hash)
    return lifecycle.Wrote(time.monotonic(), record, manifest_change=plan.manifest_change() is not None)


def check_last_good(files: Files, action: lifecycle.CheckLastGood) -> tuple[lifecycle.LastGoodChecked,
                                                                            nodefiles.Plan | None]:
    """Observe whether ``action.last_good`` can be rolled back to: its files read back and planned against the
    manifest as it is now, from the same unpatched manifest it ran with. Returns the answer and the plan."""
    good_record = action.last_good
    short = good_record.config_hash[:12]
    good = nodefiles.saved_config(files, good_record)
    if good is None:
        return lifecycle.LastGoodChecked(action, False, f"the files of config {short} cannot be read back"), None
    try:
        p = nodefiles.plan_apply(files, config=good)
    except PatcherError as exc:
        return lifecycle.LastGoodChecked(action, False, f"config {short} does not fit the manifest: {exc}"), None
    if nodefiles.sha256(p.unpatched) != good_record.original_sha256:
        return lifecycle.LastGoodChecked(action, False, f"the manifest changed since config {short} was Ready"), None
    return lifecycle.LastGoodChecked(action, True), p


def roll_back(files: Files, action: lifecycle.RollBack, plan: nodefiles.Plan | None, record: State, *,
              expect: Callable[[], None],
              ops: fsio.FileOps = fsio.REAL) -> lifecycle.RollbackDone:
    """Execute the rollback the step chose: to the last Ready config (``plan``, from ``check_last_good``) or to
    the original manifest (our changes removed from the manifest as it is now, the config files kept)."""
    try:
        if action.target == "last-good":
            good = action.last_good
            if plan is None or good is None:
                raise PatcherError(None, "the rollback to the last Ready config has no plan")
            if plan.pending:
                _, record = nodefiles.apply(files, plan, record, ops=ops)
            target = f"the last Ready config {plan.config.short_hash}"
            record = replace(record, source_hash=good.source_hash)
        else:
            nodefiles.restore(files, nodefiles.plan_restore(files), keep_files=True, ops=ops)
            record = replace(record, patched_sha256="", config_hash="", source_hash="")
            target = "the original manifest"
    except PatcherError as exc:
        return lifecycle.RollbackDone(action.reason, action.bad_source, error=str(exc))
    expect()
    mtime = fsio.mtime_ns(nodefiles.manifest_local(files))
    record = replace(record, manifest_mtime_ns=mtime or record.manifest_mtime_ns)
    return lifecycle.RollbackDone(action.reason, action.bad_source, record, target)


def prune(files: Files, record: State, *, log_extra: dict[str, str]) -> lifecycle.Pruned | None:
    """The new config is live: remove the previous one from the host folder (a failure leaves it for the
    next prune: the record still lists it)."""
    try:
        lines, record = nodefiles.prune(files, record, keep_previous=False)
    except PatcherError as exc:
        log.warning("cannot remove the previous config yet: %s", exc, extra=log_extra)
        return None
    for line in lines:
        log.info("%s (config %s is live)", line, record.config_hash[:12], extra=log_extra)
    return lifecycle.Pruned(record)
