"""Plan, apply, restore and status: the file-level work, shared by the CLI and the agent.

A plan is computed without writing anything (every refusal happens here), then applied in an order that
keeps the node consistent at every instant: config files first (the restarted scheduler must find them),
the saved original next, the manifest last. A failure before the manifest write removes the files this
run created, so a refused or failed apply leaves the disk as it was.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import posixpath
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from patcher.adapters import fsio
from patcher.core import fileread, manifestedit, schedconfig, timefmt
from patcher.core.errors import ConfigError, ManifestError, PatcherError, StateFolderError
from patcher.core.schedconfig import ConfigRequest, ForeignConfig, RenderedConfig
from patcher.core.schedconfig.flags import config_flag
from patcher.core.schedconfig.source import MAX_SOURCE_BYTES
from patcher.core.settings import Files
from patcher.core.state import LastGood, State
from patcher.services.record import (
    ORIGINAL_FILE,
    remove_stale_temp_files_locked,
    state_store,
    writer_lock,
)


class KnownBadConfig(ConfigError):
    """This exact config failed on this node before (rolled back): it is not tried again until it changes."""


MAX_MANIFEST_BYTES = manifestedit.MAX_MANIFEST_BYTES
#: A config file we render is a source file (``MAX_SOURCE_BYTES``) with a few lines added: twice that bounds
#: every read of one in the host config folder (a larger file there is not one we wrote, and differs).
MAX_CONFIG_BYTES = 2 * MAX_SOURCE_BYTES


class PartialWrite(PatcherError):
    """A step failed after others were already on disk: the message says exactly which were and which not."""


OUR_FILES = re.compile(r"^(config-[0-9a-f]{12}\.yaml|policy-[0-9a-f]{12}\.json)$")


def host_fs(files: Files) -> fsio.HostFS:
    """The node's file system as ``files`` says where it is mounted (``--host-root``)."""
    return fsio.HostFS(files.host_root)


def manifest_local(files: Files) -> Path:
    """Where the manifest is on this machine, its symlinks resolved on the node (kubelet's view)."""
    fs = host_fs(files)
    return fs.local(fs.resolve(files.manifest_path))


@dataclass(frozen=True)
class FileChange:
    node_path: str
    local: Path
    old: bytes | None  # None: the file does not exist yet
    new: bytes | None  # None: the file is removed
    kind: Literal["manifest", "config"]

    def diff(self) -> str:
        old = (self.old or b"").decode("utf-8", "replace").splitlines(keepends=True)
        new = (self.new or b"").decode("utf-8", "replace").splitlines(keepends=True)
        a = self.node_path if self.old is not None else "/dev/null"
        b = self.node_path if self.new is not None else "/dev/null"
        lines = list(difflib.unified_diff(old, new, a, b))
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


@dataclass
class Plan:
    manifest_path: str  # node path, symlinks resolved
    manifest_local: Path
    current: bytes
    unpatched: bytes  # the manifest without our items: what restore would give
    config: RenderedConfig
    changes: list[FileChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source_hash: str = ""  # fingerprint of the source folder: the same on every node for one ConfigMap

    @property
    def pending(self) -> bool:
        return bool(self.changes)

    def manifest_change(self) -> FileChange | None:
        return next((c for c in self.changes if c.kind == "manifest"), None)


sha256 = schedconfig.sha256_hex


def _check_folders(opts: Files) -> None:
    """Our folders must not be (or be inside) the kubelet's manifest folder: it runs every file there."""
    manifests = posixpath.normpath(opts.manifest_dir)
    for flag, folder in (("--state-dir", opts.state_dir), ("--host-config-dir", opts.host_config_dir)):
        norm = posixpath.normpath(folder)
        if norm == manifests or norm.startswith(manifests.rstrip("/") + "/"):
            raise PatcherError(folder, f"{flag} is inside the manifest folder {manifests}; the kubelet would run "
                               "every file there as a pod")


@dataclass(frozen=True)
class NamedFiles:
    """What the static pods in the manifest folder name as a ``--config`` now (``manifestedit.config_names`` for
    each, symlinks followed on the node): every removal of a config file asks ``keeps`` first."""

    names: tuple[tuple[str, manifestedit.ConfigNames], ...]  # (manifest node path, what it names)
    resolved: tuple[tuple[str, str], ...] = ()  # (manifest node path, a named path's symlink target)
    unreadable: str = ""  # the manifest could not be read: nothing is removed

    def keeps(self, node_path: str) -> str | None:
        """Why ``node_path`` must stay (a phrase for the output line), or None when nothing names it."""
        if self.unreadable:
            return f"{self.unreadable}; nothing it may name is removed"
        for where, names in self.names:
            if names.names(node_path):
                return f"{where} names it in a --config"
        norm = posixpath.normpath(node_path)
        return next((f"{where} names it in a --config (through a symlink)" for where, target in self.resolved
                     if target == norm), None)


def named_files(opts: Files, *, planned: bytes | None = None, after: bytes | None = None) -> NamedFiles:
    """Read every static-pod manifest the kubelet runs from the manifest folder (and ours, wherever its symlink
    points) and collect the files they name. Ours unreadable (gone: ``kubeadm upgrade`` renames it away for a
    moment; too large; not a file): everything is kept, unless ``planned`` gives the manifest the caller
    planned from and checked under the writer lock (a failed apply takes back only files it created).
    ``after``: the manifest as a planned write would leave it, read in place of ours (a dry run's answer)."""
    fs = host_fs(opts)
    try:
        main = fs.resolve(opts.manifest_path)
        data = fileread.read_file(fs.local(main), "manifest", main, limit=MAX_MANIFEST_BYTES)
    except PatcherError as exc:
        if planned is None:
            return NamedFiles((), unreadable=f"the manifest cannot be read ({exc})")
        main, data = opts.manifest_path, planned
    texts = {main: (after if after is not None else data).decode("utf-8", "replace")}
    for _, target, other in _static_pods(opts):
        texts.setdefault(target, other.decode("utf-8", "replace"))
    names = tuple((where, manifestedit.config_names(text)) for where, text in texts.items())
    resolved = []
    for where, named in names:
        for path in named.paths:
            with contextlib.suppress(PatcherError, OSError):  # unresolvable: kept by its own path only
                target = fs.resolve(path) if path.startswith("/") else path
                if target != path:
                    resolved.append((where, target))
    return NamedFiles(names, tuple(resolved))


def remove_config_file(opts: Files, named: NamedFiles, node_path: str) -> str:
    """The one way a config file is removed: not when a manifest names it (``named``, read under the writer
    lock after the manifest's last write). Returns the output line: ``removed X``, ``kept X: why``, or ""
    when there was no file."""
    why = named.keeps(node_path)
    if why is not None:
        return f"kept {node_path}: {why}" if host_fs(opts).local(node_path).exists() else ""
    return f"removed {node_path}" if fsio.remove(host_fs(opts).local(node_path)) else ""


def read_manifest(opts: Files) -> tuple[str, Path, bytes, str]:
    """The manifest as (node path, local path, bytes, text), within every limit and refusal of this module."""
    _check_folders(opts)
    fs = host_fs(opts)
    if not fs.local(opts.manifest_dir).is_dir():
        raise PatcherError(opts.manifest_dir, "manifest folder not found")
    node_path = fs.resolve(opts.manifest_path)
    local = fs.local(node_path)
    data = fileread.read_file(local, "manifest", node_path, limit=MAX_MANIFEST_BYTES)
    text = fsio.decode_utf8(data, node_path)
    return node_path, local, data, text


def _static_pods(opts: Files) -> Iterator[tuple[str, str, bytes]]:
    """Every file the kubelet may run as a static pod from the manifest folder, as (node path, the node path its
    symlinks lead to, bytes); one that is not a file it could run (a folder, too large, a dangling link) is
    skipped."""
    fs = host_fs(opts)
    try:
        names = sorted(e.name for e in os.scandir(fs.local(opts.manifest_dir)) if not e.name.startswith("."))
    except OSError:
        return
    for name in names:
        path = posixpath.join(opts.manifest_dir, name)
        try:
            target = fs.resolve(path)
            data = fileread.read_file(fs.local(target), "manifest", target, limit=MAX_MANIFEST_BYTES)
        except PatcherError:
            continue
        yield path, target, data


def other_schedulers(opts: Files, node_path: str) -> list[str]:
    """Other files in the manifest folder that the kubelet runs as a kube-scheduler pod too (a backup copy
    left there, a second manifest): two schedulers fight over leader election and only one is patched."""
    found = []
    for other, target, data in _static_pods(opts):
        if target == node_path or b"kube-scheduler" not in data:
            continue
        with contextlib.suppress(PatcherError):  # refused by inspect: not taken for a kube-scheduler pod
            manifestedit.inspect_text(fsio.decode_utf8(data, other), other, opts.prefix, opts.container_name)
            found.append(other)
    return found


#: Where each way of installing the agent mounts another node folder for it (read only, below the host root).
FOREIGN_MOUNT_HINT = "Helm: hostPaths.foreignConfigDirs; kustomize: manifests/overlays/foreign-config"


def _foreign(opts: Files, sched: manifestedit.Scheduler, where: str) -> ForeignConfig | None:
    if sched.foreign_config is None or opts.on_foreign != "merge":
        return None
    node_path = manifestedit.map_to_node(sched.mounts, sched.volumes, sched.foreign_config)
    if node_path is None:
        raise ManifestError(where, f"--config={sched.foreign_config} is not on a hostPath volume; cannot read it "
                            "to merge (use --on-foreign-config=replace)")
    local = host_fs(opts).local(node_path)
    if not os.path.lexists(local) or (local.is_symlink() and not local.exists()):
        # The path it looked at and both ways out: in the DaemonSet only the manifest, config and state folders
        # are mounted, so a foreign config elsewhere is invisible until its folder is mounted too.
        looked = f"; looked at {local}" if str(local) != node_path else ""
        raise ManifestError(node_path, f"foreign scheduler config not found (kube-scheduler's --config="
                            f"{sched.foreign_config}{looked}): to merge it, mount {posixpath.dirname(node_path)} into "
                            f"the agent ({FOREIGN_MOUNT_HINT}); or replace it with --on-foreign-config=replace")
    data = fileread.read_file(local, "foreign scheduler config", node_path, limit=MAX_MANIFEST_BYTES)
    return ForeignConfig(sched.foreign_config, node_path, fsio.decode_utf8(data, node_path))


def plan_apply(opts: Files, *, fallback_version: str | None = None, bad_hashes: frozenset[str] = frozenset(),
               config: RenderedConfig | None = None) -> Plan:
    """Everything an apply would write, computed without writing. Raises PatcherError on any refusal.

    ``config`` skips rendering from the source folder: a rollback re-applies the last config that was Ready.
    """
    node_path, local, data, text = read_manifest(opts)
    # Inspected once as it is and, when patched, once as restore would leave it; both are handed on to patch.
    current = manifestedit.inspect_text(text, node_path, opts.prefix, opts.container_name)
    unpatched_text, unpatched = text, current
    if current[1].marker is None:
        manifestedit.check_prefix(current[0], opts.prefix, node_path)
    else:
        unpatched_text = manifestedit.restore(text, node_path, prefix=opts.prefix, container_name=opts.container_name,
                                              inspected=current)
        unpatched = manifestedit.inspect_text(unpatched_text, node_path, opts.prefix, opts.container_name)
    sched = unpatched[1]
    manifestedit.check_foreign(sched, opts.on_foreign, node_path)  # before rendering: the refusal is the news
    # Before the render: a change while it reads the folder differs from what is recorded, and is planned.
    last_good = config is not None and config.form == "last-good"
    source_hash = "" if last_good else fileread.folder_fingerprint(opts.source, limit=MAX_SOURCE_BYTES)
    if config is None:
        req = ConfigRequest(
            source_dir=opts.source, host_config_dir=opts.host_config_dir, image=sched.image,
            kube_version=opts.kube_version, fallback_version=fallback_version,
            scheduler_flags=tuple(sched.scheduler_flags()), foreign=_foreign(opts, sched, node_path),
            manifest=node_path,
        )
        config = schedconfig.build_config(req)
    if config.config_hash in bad_hashes:
        raise KnownBadConfig(str(opts.source), f"config {config.short_hash} failed before on this node and is not "
                          "retried until it changes")
    spec = manifestedit.PatchSpec(host_config_dir=opts.host_config_dir, config_file=config.main,
                                  config_hash=config.config_hash, prefix=opts.prefix,
                                  container_name=opts.container_name, on_foreign=opts.on_foreign)
    result = manifestedit.patch(text, spec, node_path, inspected=current, unpatched=unpatched)
    plan = Plan(node_path, local, data, unpatched_text.encode("utf-8"), config, notes=list(config.notes),
                source_hash=source_hash)
    for name, content in sorted(config.files.items()):
        cfg_node = posixpath.join(opts.host_config_dir, name)
        cfg_local = host_fs(opts).local(cfg_node)
        old = fileread.read_if_exists(cfg_local, "config file", cfg_node, limit=MAX_CONFIG_BYTES)
        if old != content:
            plan.changes.append(FileChange(cfg_node, cfg_local, old, content, "config"))
    if result.changed:
        patched = result.text.encode("utf-8")
        if len(patched) > MAX_MANIFEST_BYTES:  # it could not be read back to restore it
            raise ManifestError(node_path, f"patched, it would be {len(patched)} bytes, over the limit of "
                                f"{MAX_MANIFEST_BYTES} bytes")
        plan.changes.append(FileChange(node_path, local, data, patched, "manifest"))
    plan.notes.extend(f"{other} is another kube-scheduler static pod in {opts.manifest_dir}; the kubelet runs it "
                      f"too, unpatched" for other in other_schedulers(opts, node_path))
    return plan


def _check_writable(opts: Files, changes: list[FileChange], *, state: bool = True) -> None:
    """Refuse before writing anything when a folder this write needs is read-only: the manifest's (when it
    changes), the host config folder (when config files change) and the state folder (unless ``state`` is
    False: the lock and the record live there). Missing folders are created later, so their nearest existing
    parent counts."""
    needed: dict[str, Path] = {opts.state_dir: host_fs(opts).local(opts.state_dir)} if state else {}
    for change in changes:
        if change.kind == "manifest":
            needed[posixpath.dirname(change.node_path)] = change.local.parent
        else:
            needed[opts.host_config_dir] = host_fs(opts).local(opts.host_config_dir)
    for shown, local in needed.items():
        while not local.exists() and local != local.parent:
            local = local.parent
        if not os.access(local, os.W_OK | os.X_OK):
            error = StateFolderError if shown == opts.state_dir else PatcherError
            raise error(shown, "folder is not writable; nothing was written")


def _verify_unchanged(local: Path, planned: bytes | None, shown: str) -> None:
    """Under the writer lock: the file must still be what the plan was computed from."""
    if not fileread.holds(local, planned, shown, refuse=True):
        raise fsio.ChangedUnderneath(shown, "changed by someone else since it was planned; nothing written")


def apply(opts: Files, plan: Plan, state: State | None = None, *,
          ops: fsio.FileOps = fsio.REAL) -> tuple[list[str], State]:
    """Write a plan under the writer lock, after checking that every file is still what it was planned from.
    Returns one line per file changed and the new state record. Every write goes through ``ops``."""
    _check_writable(opts, plan.changes)  # before the lock, which creates the state folder: a refusal writes nothing
    with writer_lock(opts, ops):
        _verify_unchanged(plan.manifest_local, plan.current, plan.manifest_path)
        for change in plan.changes:
            if change.kind == "config":
                _verify_unchanged(change.local, change.old, change.node_path)
        return _apply_locked(opts, plan, state, ops)


def _apply_locked(opts: Files, plan: Plan, state: State | None, ops: fsio.FileOps) -> tuple[list[str], State]:
    store = state_store(opts, ops)
    state = state if state is not None else store.load()
    lines = [f"removed {path} (left by a writer that was killed mid-write)" for path in
             remove_stale_temp_files_locked(opts)]
    config = plan.config
    checkpoint = store.checkpoint()
    mchange = plan.manifest_change()
    config_changes = [c for c in plan.changes if c.kind == "config" and c.new is not None]
    created = [c for c in config_changes if c.old is None]
    config_dir = host_fs(opts).local(opts.host_config_dir)
    made_config_dir = False
    try:
        if config_changes and not config_dir.is_dir():
            fsio.ensure_dir(config_dir)
            made_config_dir = True
        configs = [fsio.Write(c.local, c.new, c.node_path, mode=0o644) for c in config_changes if c.new is not None]
        lines.extend(f"wrote {c.node_path}" for c in config_changes)
        new_state = replace(
            state, manifest=plan.manifest_path, config_hash=config.config_hash, config_file=config.main,
            api_version=config.api_version, files=tuple(sorted(config.files)),
            written=tuple(sorted(set(state.written) | set(config.files))),
            previous_files=(tuple(f for f in state.files if f not in config.files)
                            if config.config_hash != state.config_hash and state.files else state.previous_files))
        manifest_writes: list[fsio.Write] = []
        original = None
        if mchange is not None and mchange.new is not None:
            # The record is complete before the manifest is written (its mtime is set, not waited for): a
            # crash right after the write finds it, and one save is enough.
            new_state = replace(new_state, original_sha256=sha256(plan.unpatched), patched_sha256=sha256(mchange.new),
                                manifest_mtime_ns=time.time_ns())
            original = plan.unpatched if checkpoint.get(ORIGINAL_FILE) != plan.unpatched else None
            manifest_writes.append(fsio.Write(mchange.local, mchange.new, mchange.node_path, expect=plan.current,
                                              mtime_ns=new_state.manifest_mtime_ns))
        else:
            new_state = replace(new_state, patched_sha256=sha256(plan.current),
                                manifest_mtime_ns=fsio.mtime_ns(plan.manifest_local) or 0)
        # In this order, each durable before the next: config files, the record (and the saved original), the
        # manifest. Every file's temp copy is written and fsynced first,
        # so a state folder that cannot take the record (read-only, full, gone) fails the apply before any file
        # is in place: a write that could not be recorded is never made (it could not be undone). The record is
        # the last thing written in the state folder: nothing after the manifest depends on that folder.
        fsio.write_in_order(configs, store.writes(new_state, original), manifest_writes, ops=ops)
        if mchange is not None:
            lines.append(f"wrote {mchange.node_path}")
    except PatcherError as exc:
        if mchange is not None and mchange.new is not None and fileread.holds(mchange.local, mchange.new):
            # The manifest is in place (the failure came after its rename, e.g. its folder's fsync): the config
            # files it names and the record of it stay.
            done = [*lines, f"wrote {mchange.node_path}"]
            raise PartialWrite(exc.path, f"{exc.problem}; already done: {', '.join(done)}; not done: making it "
                               "durable (run apply again once this is fixed)") from None
        named = named_files(opts, planned=plan.current) if created else NamedFiles(())
        for change in created:
            with contextlib.suppress(PatcherError):
                remove_config_file(opts, named, change.node_path)
        if made_config_dir:
            with contextlib.suppress(OSError):
                config_dir.rmdir()  # only when empty: the disk is as it was
        store.rewind(checkpoint)
        raise
    # Config files no longer needed go only after the manifest no longer names them. The record on disk still
    # lists them (harmless: a missing file is skipped); the record returned does not, and is saved with the
    # next transition.
    try:
        pruned, new_state = _prune_locked(opts, new_state, keep_previous=True)
    except PatcherError as exc:
        raise PartialWrite(exc.path, f"{exc.problem}; already done: {', '.join(lines) or 'nothing'}; not done: "
                           "removing config files no longer needed (run apply again once this is fixed)") from None
    lines.extend(pruned)
    return lines, new_state


def prune(opts: Files, state: State, keep_previous: bool = True) -> tuple[list[str], State]:
    """Remove host config files we wrote and no longer need; files we did not write are never touched."""
    with writer_lock(opts):
        return _prune_locked(opts, state, keep_previous)


def _prune_locked(opts: Files, state: State, keep_previous: bool) -> tuple[list[str], State]:
    keep = set(state.files) | (set(state.previous_files) if keep_previous else set())
    keep |= set(state.last_good.files if state.last_good else ())
    lines = []
    candidates = [name for name in sorted(set(state.written) - keep) if OUR_FILES.match(name)]
    named = named_files(opts) if candidates else NamedFiles(())
    for name in candidates:
        line = remove_config_file(opts, named, posixpath.join(opts.host_config_dir, name))
        if line.startswith("kept "):
            keep.add(name)  # still ours to remove, once nothing names it
        if line:
            lines.append(line)
    return lines, replace(state, written=tuple(sorted(keep & set(state.written))),
                          previous_files=state.previous_files if keep_previous else ())


def saved_config(opts: Files, record: LastGood) -> RenderedConfig | None:
    """The config a state record names (e.g. the last one that was Ready), read back from the host folder."""
    main, files = record.config_file, record.files
    if not main or main not in files:
        return None
    contents: dict[str, bytes] = {}
    for name in files:
        try:  # missing or refused alike: nothing to roll back to
            contents[name] = fileread.read_file(host_fs(opts).local(posixpath.join(opts.host_config_dir, name)),
                                                "config file", limit=MAX_CONFIG_BYTES)
        except PatcherError:
            return None
    digest = sha256(contents[main])
    if digest != record.config_hash:
        return None  # changed on disk since: not the config that was Ready
    return RenderedConfig(files=contents, main=main, config_hash=digest, form="last-good",
                          api_version=record.api_version)


@dataclass
class RestorePlan:
    manifest_path: str
    manifest_local: Path
    changes: list[FileChange]
    notes: list[str]
    current: bytes  # the manifest as planned from: checked again under the lock
    state: State  # the state record as planned from: checked again under the lock


def plan_restore(opts: Files) -> RestorePlan:
    node_path, local, data, text = read_manifest(opts)
    store = state_store(opts)
    state = store.load()
    notes: list[str] = []
    doc = None  # stays None when the text is not YAML at all
    try:
        doc = manifestedit.parse_manifest(text, node_path)
        manifestedit.check_prefix(doc, opts.prefix, node_path)
        new_text = manifestedit.restore(text, node_path, prefix=opts.prefix, container_name=opts.container_name)
        new: bytes = new_text.encode("utf-8")
    except ManifestError as exc:
        saved = store.read(ORIGINAL_FILE)
        # The saved original is the last resort, for a file that no longer parses *and* still is the one we
        # wrote (our marker is in it, or it is byte for byte our last write). A valid manifest that is not
        # ours any more, or a broken one someone else wrote, is never overwritten with an old copy.
        ours = manifestedit.marker_key(opts.prefix) in text or sha256(data) == state.patched_sha256
        if saved is None or not state.patched or not ours or doc is not None:
            raise exc from None
        notes.append(f"{node_path} cannot be parsed; restoring the saved original from {opts.state_dir}")
        new = saved
    changes = [FileChange(node_path, local, data, new, "manifest")] if new != data else []
    for name in sorted(n for n in state.written if OUR_FILES.match(n)):
        cfg_node = posixpath.join(opts.host_config_dir, name)
        cfg_local = host_fs(opts).local(cfg_node)
        old = fileread.read_if_exists(cfg_local, "config file", cfg_node, limit=MAX_CONFIG_BYTES)
        if old is not None:
            changes.append(FileChange(cfg_node, cfg_local, old, None, "config"))
    return RestorePlan(node_path, local, changes, notes, current=data, state=state)


def restore_preview(opts: Files, plan: RestorePlan) -> tuple[list[FileChange], list[str]]:
    """What ``restore(opts, plan)`` would change, written nowhere: the manifest's change and the config files
    it would remove, and the ``kept X: why`` lines for those the removal guard would keep (a static pod still
    names them once the manifest is restored)."""
    mchange = next((c for c in plan.changes if c.kind == "manifest"), None)
    configs = [c for c in plan.changes if c.kind == "config"]
    named = named_files(opts, after=mchange.new if mchange is not None else None) if configs else NamedFiles(())
    why = {c.node_path: named.keeps(c.node_path) for c in configs}
    changes = ([mchange] if mchange is not None else []) + [c for c in configs if why[c.node_path] is None]
    return changes, [f"kept {path}: {reason}" for path, reason in why.items() if reason is not None]


def restore(opts: Files, plan: RestorePlan, *, keep_files: bool = False, ops: fsio.FileOps = fsio.REAL) -> list[str]:
    """Put the manifest back first (the scheduler must not restart onto a missing file), then clean up.

    ``keep_files`` keeps the host config files and the state record (a rollback to the original manifest
    must still remember which config failed). Every write goes through ``ops``.
    """
    # A manifest that carries our marker is put back even when the state folder is read-only, full or gone
    # (a SIGTERM during that fault must not leave the node patched): only the record's clearing needs it, and
    # a failure there is a PartialWrite after the manifest is restored. Without a manifest write the state
    # folder is checked up front when there is a record to clear (nothing would be gained by going ahead).
    mchange = next((c for c in plan.changes if c.kind == "manifest"), None)
    record_left = not keep_files and state_store(opts).present()
    _check_writable(opts, [c for c in plan.changes if c.kind == "manifest" or not keep_files],
                    state=record_left and mchange is None)
    with writer_lock(opts, ops):
        _verify_unchanged(plan.manifest_local, plan.current, plan.manifest_path)
        if state_store(opts).load() != plan.state:
            raise fsio.ChangedUnderneath(posixpath.join(opts.state_dir, "state.json"), "changed by another writer "
                                         "since the restore was planned; nothing written")
        lines = [f"removed {path} (left by a writer that was killed mid-write)" for path in
                 remove_stale_temp_files_locked(opts)]
        if mchange is not None and mchange.new is not None:
            fsio.atomic_write(mchange.local, mchange.new, shown=mchange.node_path, expect=mchange.old, ops=ops)
            lines.append(f"wrote {mchange.node_path}")
        return lines if keep_files else _clean_up_locked(opts, plan, lines, ops)


def _clean_up_locked(opts: Files, plan: RestorePlan, lines: list[str], ops: fsio.FileOps) -> list[str]:
    step = "removing the config files"
    try:
        configs = [c for c in plan.changes if c.kind == "config"]
        named = named_files(opts) if configs else NamedFiles(())
        kept = []
        for change in configs:
            line = remove_config_file(opts, named, change.node_path)
            if line:
                lines.append(line)
            if line.startswith("kept "):
                kept.append(posixpath.basename(change.node_path))
        step = "clearing the state record"
        state_store(opts, ops).clear()
        if kept:  # still ours: a later restore or prune removes them once nothing names them
            state_store(opts, ops).save(State(written=tuple(kept)))
    except PatcherError as exc:
        raise PartialWrite(exc.path, f"{exc.problem}; already done: {', '.join(lines) or 'nothing'}; not done: "
                           f"{step} (run restore again once this is fixed)") from None
    return lines


def status(opts: Files) -> dict[str, Any]:
    """What is on disk now, plus whether an apply would change anything."""
    node_path, local, _, text = read_manifest(opts)
    _, sched = manifestedit.inspect_text(text, node_path, opts.prefix, opts.container_name)
    state = state_store(opts).load()
    mtime = fsio.mtime_ns(local)
    marker = sched.marker
    full_hash = state.config_hash if marker and state.config_hash.startswith(marker.hash) else None
    out: dict[str, Any] = {
        "manifest": node_path,
        "patched": marker is not None,
        "config_hash": full_hash or (marker.hash if marker else None),
        "config_file": marker.flag.split("=", 1)[-1] if marker else None,
        "manifest_mtime": timefmt.rfc3339(mtime) if mtime is not None else None,
        "foreign_config": sched.foreign_config,
        "container": sched.container_name,
        "image": sched.image,
        "phase": state.phase or None,
        "message": state.message or None,
        "extender_warning": state.extender_warning or None,
        "other_schedulers": other_schedulers(opts, node_path) or None,
    }
    try:
        plan = plan_apply(opts)
        out["up_to_date"] = not plan.pending
        out["form"] = plan.config.form
        out["api_version"] = plan.config.api_version
    except PatcherError as exc:
        out["up_to_date"] = None
        out["error"] = str(exc)
    missing = missing_config(opts, sched)
    if missing is not None:  # the most urgent news: the scheduler's next start fails
        out["error"] = missing + (f"; also: {out['error']}" if out.get("error") else "")
    return out


def missing_config(opts: Files, sched: manifestedit.Scheduler, *, seen_folders_only: bool = False) -> str | None:
    """The one-line error when the ``--config`` kube-scheduler starts with names a file that is not on the node
    (or None): its next start fails, whatever the marker says. ``seen_folders_only``: say so only when the
    file's folder is there (the agent in its pod sees only the folders mounted into it: a foreign config
    elsewhere is unseen, not missing, and the plan's refusal says where it looked)."""
    item = config_flag(sched.flags[manifestedit.own_start(sched.flags, sched.flags_key):])
    if item is None:
        return None
    node_path = manifestedit.map_to_node(sched.mounts, sched.volumes, item.value)
    if node_path is None:
        return None  # not on a hostPath volume: the image's own file, not ours to check
    local = host_fs(opts).local(node_path)
    if local.exists() or (seen_folders_only and not local.parent.is_dir()):
        return None
    return (f"{node_path}: kube-scheduler's --config={item.value} {manifestedit.MISSING_FILE}; its next start fails "
            "(run apply to write it back, or restore)")


def named_missing_fingerprint(opts: Files) -> str:
    """What the agent's watch of the host config folder compares: the files there that the manifest names as a
    ``--config`` (``manifestedit.config_names``) and that are not there. A deletion of a named file, or its
    return, changes it; the agent's own writes do not (a config file is written before the manifest names
    it, a manifest is put back before a file it named is removed, a prune removes only files nothing names),
    so they cost no second reconcile however slow the write."""
    try:
        _, _, _, text = read_manifest(opts)
    except PatcherError:
        return "unreadable"  # the manifest's own watch and the plan's refusal cover it
    folder, fs = posixpath.normpath(opts.host_config_dir), host_fs(opts)
    return "\n".join(sorted(p for p in manifestedit.config_names(text).paths
                            if posixpath.dirname(p) == folder and not fs.local(p).exists()))


def missing_named_config(opts: Files) -> str:
    """``missing_config`` for the manifest as it is now, as the agent sees the node (its mounted folders);
    empty when none is missing, or when the manifest cannot be read (the plan's refusal says why)."""
    try:
        node_path, _, _, text = read_manifest(opts)
        _, sched = manifestedit.inspect_text(text, node_path, opts.prefix, opts.container_name)
    except PatcherError:
        return ""
    return missing_config(opts, sched, seen_folders_only=True) or ""
