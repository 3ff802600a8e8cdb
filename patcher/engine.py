"""Plan, apply, restore and status: the file-level work, shared by the CLI and the agent.

A plan is computed without writing anything (every refusal happens here), then applied in an order that
keeps the node consistent at every instant: config files first (the restarted scheduler must find them),
the saved original next, the manifest last. A failure before the manifest write removes the files this
run created, so a refused or failed apply leaves the disk as it was.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from patcher import fsio, manifest, schedconfig, timefmt, yamltext
from patcher.errors import ConfigError, ManifestError, PatcherError
from patcher.schedconfig import ConfigRequest, ForeignConfig, RenderedConfig
from patcher.state import LastGood, State, StateStore


class KnownBadConfig(ConfigError):
    """This exact config failed on this node before (rolled back): it is not tried again until it changes."""


OUR_FILES = re.compile(r"^(config-[0-9a-f]{12}\.yaml|policy-[0-9a-f]{12}\.json)$")


@dataclass(frozen=True)
class Options:
    manifest_dir: str = "/etc/kubernetes/manifests"
    manifest_name: str = "kube-scheduler.yaml"
    source: Path = Path("/etc/scheduler-patcher/source")
    host_config_dir: str = "/etc/kubernetes/scheduler-patcher"
    state_dir: str = "/var/lib/scheduler-patcher"
    host_root: Path = Path("/")
    prefix: str = "scheduler-patcher.io"
    container_name: str | None = None
    on_foreign: manifest.ForeignMode = "merge"
    kube_version: str | None = None

    @property
    def fs(self) -> fsio.HostFS:
        return fsio.HostFS(self.host_root)

    @property
    def manifest_path(self) -> str:
        return posixpath.join(self.manifest_dir, self.manifest_name)

    def store(self) -> StateStore:
        return StateStore(self.fs.local(self.state_dir), self.state_dir)


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
    config: RenderedConfig | None = None
    changes: list[FileChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source_hash: str = ""  # fingerprint of the source folder: the same on every node for one ConfigMap

    @property
    def pending(self) -> bool:
        return bool(self.changes)

    def manifest_change(self) -> FileChange | None:
        return next((c for c in self.changes if c.kind == "manifest"), None)


sha256 = schedconfig.sha256_hex


def _check_folders(opts: Options) -> None:
    """Our folders must not be (or be inside) the kubelet's manifest folder: it runs every file there."""
    manifests = posixpath.normpath(opts.manifest_dir)
    for flag, folder in (("--state-dir", opts.state_dir), ("--host-config-dir", opts.host_config_dir)):
        norm = posixpath.normpath(folder)
        if norm == manifests or norm.startswith(manifests.rstrip("/") + "/"):
            raise PatcherError(folder, f"{flag} is inside the manifest folder {manifests}; the kubelet would run "
                               "every file there as a pod")


def _read_manifest(opts: Options) -> tuple[str, Path, bytes, str]:
    _check_folders(opts)
    fs = opts.fs
    if not fs.local(opts.manifest_dir).is_dir():
        raise PatcherError(opts.manifest_dir, "manifest folder not found")
    node_path = fs.resolve(opts.manifest_path)
    local = fs.local(node_path)
    data = fsio.read_bytes(local, "manifest", node_path)
    text = fsio.decode_utf8(data, node_path)
    return node_path, local, data, text


def container_to_node_path(sched: manifest.Scheduler, path: str) -> str | None:
    """Map a path inside the scheduler container to the node, through volumeMounts and hostPath volumes."""
    best: tuple[int, str] | None = None
    for mount in sched.mounts:
        mp = str(mount.get("mountPath", "")).rstrip("/") or "/"
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            volume = next((v for v in sched.volumes if v.get("name") == mount.get("name")), None)
            host = (volume or {}).get("hostPath") or {}
            if isinstance(host, dict) and host.get("path") and (best is None or len(mp) > best[0]):
                sub = str(mount.get("subPath") or "")
                base = posixpath.join(str(host["path"]), sub) if sub else str(host["path"])
                best = (len(mp), posixpath.normpath(base + path[len(mp.rstrip("/")):]))
    return best[1] if best else None


def _foreign(opts: Options, sched: manifest.Scheduler, where: str) -> ForeignConfig | None:
    if sched.foreign_config is None or opts.on_foreign != "merge":
        return None
    node_path = container_to_node_path(sched, sched.foreign_config)
    if node_path is None:
        raise ManifestError(where, f"--config={sched.foreign_config} is not on a hostPath volume; cannot read it "
                            "to merge (use --on-foreign-config=replace)")
    data = fsio.read_bytes(opts.fs.local(node_path), "foreign scheduler config", node_path)
    return ForeignConfig(sched.foreign_config, node_path, fsio.decode_utf8(data, node_path))


def plan_apply(opts: Options, *, fallback_version: str | None = None, bad_hashes: frozenset[str] = frozenset(),
               config: RenderedConfig | None = None) -> Plan:
    """Everything an apply would write, computed without writing. Raises PatcherError on any refusal.

    ``config`` skips rendering from the source folder: a rollback re-applies the last config that was Ready.
    """
    node_path, local, data, text = _read_manifest(opts)
    unpatched_text = manifest.restore(text, node_path, prefix=opts.prefix, container_name=opts.container_name)
    doc = manifest.parse_manifest(unpatched_text, node_path)
    sched = manifest.inspect(doc, node_path, prefix=opts.prefix, container_name=opts.container_name)
    manifest.check_foreign(sched, opts.on_foreign, node_path)  # before rendering: the refusal is the news
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
    spec = manifest.PatchSpec(host_config_dir=opts.host_config_dir, config_file=config.main,
                              config_hash=config.config_hash, prefix=opts.prefix,
                              container_name=opts.container_name, on_foreign=opts.on_foreign)
    result = manifest.patch(text, spec, node_path)
    plan = Plan(node_path, local, data, unpatched_text.encode("utf-8"), config, notes=list(config.notes),
                source_hash=fsio.folder_fingerprint(opts.source) if config.form != "last-good" else "")
    for name, content in sorted(config.files.items()):
        cfg_node = posixpath.join(opts.host_config_dir, name)
        cfg_local = opts.fs.local(cfg_node)
        try:
            old: bytes | None = cfg_local.read_bytes()
        except FileNotFoundError:
            old = None
        except OSError as exc:
            raise PatcherError(cfg_node, f"cannot read: {exc.strerror}") from None
        if old != content:
            plan.changes.append(FileChange(cfg_node, cfg_local, old, content, "config"))
    if result.changed:
        plan.changes.append(FileChange(node_path, local, data, result.text.encode("utf-8"), "manifest"))
    return plan


def _check_writable(opts: Options, plan: Plan) -> None:
    """Refuse before writing anything when a target folder is missing or read-only."""
    folders = {c.local.parent for c in plan.changes if c.kind == "manifest"}
    for folder in folders:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PatcherError(str(folder), "folder is not writable")
    config_folder = opts.fs.local(opts.host_config_dir)
    probe = config_folder if config_folder.exists() else config_folder.parent
    while not probe.exists():
        probe = probe.parent
    if any(c.kind == "config" for c in plan.changes) and not os.access(probe, os.W_OK | os.X_OK):
        raise PatcherError(opts.host_config_dir, "folder is not writable")


def apply(opts: Options, plan: Plan, state: State | None = None) -> tuple[list[str], State]:
    """Write a plan. Returns one line per file changed and the new state record."""
    store = opts.store()
    state = state if state is not None else store.load()
    lines: list[str] = []
    created: list[FileChange] = []
    config = plan.config
    assert config is not None
    _check_writable(opts, plan)
    checkpoint = store.checkpoint()
    try:
        if any(c.kind == "config" for c in plan.changes):
            fsio.ensure_dir(opts.fs.local(opts.host_config_dir))
        for change in plan.changes:
            if change.kind == "config" and change.new is not None:
                fsio.atomic_write(change.local, change.new, mode=0o644, shown=change.node_path)
                if change.old is None:
                    created.append(change)
                lines.append(f"wrote {change.node_path}")
        mchange = plan.manifest_change()
        new_state = replace(
            state, manifest=plan.manifest_path, config_hash=config.config_hash, config_file=config.main,
            api_version=config.api_version, files=tuple(sorted(config.files)),
            written=tuple(sorted(set(state.written) | set(config.files))),
            previous_files=(tuple(f for f in state.files if f not in config.files)
                            if config.config_hash != state.config_hash and state.files else state.previous_files))
        if mchange is not None and mchange.new is not None:
            new_state = replace(new_state, original_sha256=sha256(plan.unpatched))
            store.save_original(plan.unpatched)
            store.save(new_state)  # before the manifest: a crash right after the write must find the record
            fsio.atomic_write(mchange.local, mchange.new, shown=mchange.node_path, expect=plan.current)
            new_state = replace(new_state, patched_sha256=sha256(mchange.new))
            lines.append(f"wrote {mchange.node_path}")
        else:
            new_state = replace(new_state, patched_sha256=sha256(plan.current))
        new_state = replace(new_state, manifest_mtime_ns=fsio.mtime_ns(plan.manifest_local) or 0)
    except PatcherError:
        for change in created:
            fsio.remove(change.local)
        store.rewind(checkpoint)
        raise
    pruned, new_state = prune(opts, new_state)
    lines.extend(pruned)
    store.save(new_state)
    return lines, new_state


def prune(opts: Options, state: State, keep_previous: bool = True) -> tuple[list[str], State]:
    """Remove host config files we wrote and no longer need; files we did not write are never touched."""
    keep = set(state.files) | (set(state.previous_files) if keep_previous else set())
    keep |= set(state.last_good.files if state.last_good else ())
    lines = []
    for name in sorted(set(state.written) - keep):
        if OUR_FILES.match(name):
            node = posixpath.join(opts.host_config_dir, name)
            if fsio.remove(opts.fs.local(node)):
                lines.append(f"removed {node}")
    return lines, replace(state, written=tuple(sorted(keep & set(state.written))),
                          previous_files=state.previous_files if keep_previous else ())


def saved_config(opts: Options, record: LastGood) -> RenderedConfig | None:
    """The config a state record names (e.g. the last one that was Ready), read back from the host folder."""
    main, files = record.config_file, record.files
    if not main or main not in files:
        return None
    contents: dict[str, bytes] = {}
    for name in files:
        try:
            contents[name] = opts.fs.local(posixpath.join(opts.host_config_dir, name)).read_bytes()
        except OSError:
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


def plan_restore(opts: Options) -> RestorePlan:
    node_path, local, data, text = _read_manifest(opts)
    store = opts.store()
    state = store.load()
    notes: list[str] = []
    try:
        new_text = manifest.restore(text, node_path, prefix=opts.prefix, container_name=opts.container_name)
        new: bytes = new_text.encode("utf-8")
    except ManifestError as exc:
        saved = store.load_original()
        # The saved original is the last resort, for a file that no longer parses *and* still is the one we
        # wrote (our marker is in it, or it is byte for byte our last write). A valid manifest that is not
        # ours any more, or a broken one someone else wrote, is never overwritten with an old copy.
        ours = manifest.marker_key(opts.prefix) in text or sha256(data) == state.patched_sha256
        if saved is None or not state.patched or not ours or not _unparsable(text):
            raise exc from None
        notes.append(f"{node_path} cannot be parsed; restoring the saved original from {opts.state_dir}")
        new = saved
    changes = []
    if new != data:
        changes.append(FileChange(node_path, local, data, new, "manifest"))
    for name in sorted(state.written):
        cfg_node = posixpath.join(opts.host_config_dir, name)
        cfg_local = opts.fs.local(cfg_node)
        if OUR_FILES.match(name) and cfg_local.exists():
            changes.append(FileChange(cfg_node, cfg_local, cfg_local.read_bytes(), None, "config"))
    return RestorePlan(node_path, local, changes, notes)


def remove_stale_temp_files(opts: Options) -> list[str]:
    """Dot-named temp files of ours that a killed writer left between create and rename (node paths)."""
    fs = opts.fs
    removed = []
    manifest_path = fs.resolve(opts.manifest_path)
    targets = [(posixpath.dirname(manifest_path), posixpath.basename(manifest_path)),
               (opts.host_config_dir, "*"), (opts.state_dir, "*")]
    for folder, name in targets:
        for path in fsio.remove_stale_temp_files(fs.local(folder), name):
            removed.append(posixpath.join(folder, path.name))
    return removed


def _unparsable(text: str) -> bool:
    try:
        yamltext.parse(text)
    except yamltext.YamlTextError:
        return True
    return False


def restore(opts: Options, plan: RestorePlan, *, keep_files: bool = False) -> list[str]:
    """Put the manifest back first (the scheduler must not restart onto a missing file), then clean up.

    ``keep_files`` keeps the host config files and the state record (a rollback to the original manifest
    must still remember which config failed).
    """
    lines = []
    for change in plan.changes:
        if change.kind == "manifest" and change.new is not None:
            fsio.atomic_write(change.local, change.new, shown=change.node_path, expect=change.old)
            lines.append(f"wrote {change.node_path}")
    if keep_files:
        return lines
    for change in plan.changes:
        if change.kind == "config" and fsio.remove(change.local):
            lines.append(f"removed {change.node_path}")
    opts.store().clear()
    return lines


def status(opts: Options) -> dict[str, Any]:
    """What is on disk now, plus whether an apply would change anything."""
    node_path, local, _, text = _read_manifest(opts)
    doc = manifest.parse_manifest(text, node_path)
    sched = manifest.inspect(doc, node_path, prefix=opts.prefix, container_name=opts.container_name)
    state = opts.store().load()
    mtime = fsio.mtime_ns(local)
    marker = sched.marker
    full_hash = state.config_hash if marker and state.config_hash.startswith(marker.hash) else None
    out: dict[str, Any] = {
        "manifest": node_path,
        "patched": marker is not None,
        "config_hash": full_hash or (marker.hash if marker else None),
        "config_file": marker.flag.split("=", 1)[-1] if marker else None,
        "manifest_mtime": timefmt.rfc3339_ns(mtime) if mtime is not None else None,
        "foreign_config": sched.foreign_config,
        "container": sched.container_name,
        "image": sched.image,
        "phase": state.phase or None,
    }
    try:
        plan = plan_apply(opts)
        out["up_to_date"] = not plan.pending
        out["form"] = plan.config.form if plan.config else None
        out["api_version"] = plan.config.api_version if plan.config else None
    except PatcherError as exc:
        out["up_to_date"] = None
        out["error"] = str(exc)
    return out
