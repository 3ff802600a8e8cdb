"""The kube-scheduler static-pod manifest: find the scheduler, add our three items, take them out again.

Pure functions on text. The marker annotation records what we added, so that restore can remove exactly
that from whatever the manifest has become since (a ``kubeadm upgrade`` rewrites it), instead of copying
back an old file. The kubelet copies the static pod's annotations onto the mirror pod, which makes the
marker visible through the API as proof that the kubelet runs the patched manifest.

A manifest that sets ``metadata.uid`` (RKE2 writes a hash of the pod there) gets a UID of ours while patched:
the kubelet keys a static pod by its UID and does not restart one whose UID stays the same across an edit
(seen on the real 1.37 kubelet: the edit is a "SyncLoop UPDATE" and the old container keeps running), so
the patch would never reach the scheduler. The marker keeps the original UID's text to put back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any, Literal

from ruamel.yaml.nodes import Node, ScalarNode

from patcher.core import yamltext as yt
from patcher.core.errors import ManifestError
from patcher.core.schedconfig.flags import CONFIG_FLAG, config_flags

VOLUME_NAME = "scheduler-patcher-config"
# Real kube-scheduler manifests are 1-10 KB; the limit keeps a hostile or broken file from costing the
# agent seconds and hundreds of MB: it is refused before parsing. See docs/operator-contract.md.
# Here, not in services/nodefiles, so that the state store bounds the saved original by it too.
MAX_MANIFEST_BYTES = 128 * 1024
MARKER_VERSION = 1
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "busybox"}
ForeignMode = Literal["fail", "replace", "merge"]
CONFIG_FLAG_EQ = CONFIG_FLAG + "="


@dataclass(frozen=True)
class Marker:
    """What one patch added; stored as short JSON in ``<prefix>/patch`` on the static pod."""

    hash: str  # first 12 hex digits of the config sha256
    flag: str  # the flag-list item we wrote (e.g. ``--config=/etc/.../config-<hash>.yaml``)
    volume: str  # name of our volume and volumeMount
    mount: str  # mountPath (= hostPath) of our config folder
    container: str  # the container we edited
    replaced: str | None = None  # YAML source text of the ``--config`` item we replaced, put back on restore
    created: tuple[str, ...] = ()  # keys that did not exist before: volumes, volumeMounts, annotations
    uid: str | None = None  # YAML source text of the ``metadata.uid`` we replaced (``patched_uid``), put back

    def to_json(self) -> str:
        kept = {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != ()}
        return json.dumps({"v": MARKER_VERSION, **kept}, separators=(",", ":"), ensure_ascii=False)

    @staticmethod
    def from_json(raw: str) -> Marker:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != MARKER_VERSION:
            raise ValueError("unknown marker version")
        return Marker(hash=str(data["hash"]), flag=str(data["flag"]), volume=str(data["volume"]),
                      mount=str(data["mount"]), container=str(data["container"]),
                      replaced=data.get("replaced"), created=tuple(data.get("created", ())),
                      uid=None if data.get("uid") is None else str(data["uid"]))


@dataclass(frozen=True)
class Scheduler:
    """Where the kube-scheduler sits in a parsed manifest."""

    pod_name: str
    namespace: str
    container_index: int
    container_name: str
    flags_key: str  # "command" or "args": the list that carries the flags
    flags: list[Any]
    image: str | None
    marker: Marker | None
    foreign_config: str | None  # a --config value that is not ours (ours replaced it, or it is still there)
    foreign_index: int | None  # index in ``flags`` of the item that carries the foreign value, if present
    mounts: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    uid: str | None = None  # ``metadata.uid`` as the kubelet reads it, when the manifest sets one

    @property
    def flags_path(self) -> yt.Path:
        return ("spec", "containers", self.container_index, self.flags_key)

    def scheduler_flags(self) -> list[str]:
        """Flags meant for kube-scheduler itself, as written (after the binary when a wrapper such as go-runner
        runs it); split values (``--kubeconfig /x``) stay in place."""
        return [str(x) for x in self.flags][own_start(self.flags, self.flags_key):]


def own_start(flags: list[Any], flags_key: str) -> int:
    """Where kube-scheduler's own arguments start in ``flags``: after the binary, or after the leading words
    of a ``command`` (the binary and a wrapper's words before the first flag)."""
    items = [str(x) for x in flags]
    for i, item in enumerate(items):
        value_of_flag = i > 0 and items[i - 1].startswith("--") and "=" not in items[i - 1] and items[i - 1] != "--"
        if posixpath.basename(item) in ("kube-scheduler", "scheduler") and not item.startswith("-") \
                and not value_of_flag:  # `--config /etc/kube-scheduler` names a file, not the binary
            return i + 1
    if flags_key != "command":
        return 0
    return next((i for i, item in enumerate(items) if item.startswith("-")), len(items))


def marker_key(prefix: str) -> str:
    return f"{prefix}/patch"


def patched_uid(original: str, short_hash: str) -> str:
    """The static pod's UID while our patch is in, in a UID's usual form: from the original UID and our config's
    hash, so the same config gives the same UID (a patch found in place is current) and another config another
    UID (the kubelet restarts the scheduler for it)."""
    h = hashlib.sha256(f"{original}\0{short_hash}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _written(raw: str, what: str | None = None, where: str = "") -> Any:
    """The value of YAML source text the marker keeps (a flag item or a UID as written): None when unreadable, or
    with ``what`` (a restore that puts it back) a refusal."""
    try:
        return yt.load_data(raw)
    except yt.YamlTextError as exc:
        if what is None:
            return None
        raise ManifestError(where, f"marker holds an unreadable {what} ({exc})") from None


def _names_scheduler(container: dict[str, Any]) -> bool:
    words = [str(x) for key in ("command", "args") for x in (container.get(key) or []) if isinstance(x, str)]
    bases = [posixpath.basename(w) for w in words]
    if "kube-scheduler" in bases:
        return True
    return any(b == "hyperkube" for b in bases) and "scheduler" in bases


_IN_SHELL = "kube-scheduler is started through a shell string (sh -c); refusing to edit inside a shell command"


def _runs_in_shell(container: dict[str, Any]) -> bool:
    command = [str(x) for x in (container.get("command") or [])]
    if not command or posixpath.basename(command[0]) not in SHELLS:
        return False
    words = command + [str(x) for x in (container.get("args") or [])]
    return any("kube-scheduler" in w or "scheduler" in w.split() for w in words[1:])


def _container_index(containers: list[Any], wanted: str | None, where: str) -> int:
    dicts = [c if isinstance(c, dict) else {} for c in containers]
    if wanted:
        hits = [i for i, c in enumerate(dicts) if c.get("name") == wanted]
        if not hits:
            raise ManifestError(where, f"no container named {wanted!r}")
        return hits[0]
    hits = [i for i, c in enumerate(dicts) if c.get("name") == "kube-scheduler"]
    if not hits:
        hits = [i for i, c in enumerate(dicts) if _names_scheduler(c)]
    if not hits:
        if any(_runs_in_shell(c) for c in dicts):
            raise ManifestError(where, _IN_SHELL)
        raise ManifestError(where, "no kube-scheduler container (no container named kube-scheduler and none "
                            "whose command or args run kube-scheduler); use --container-name")
    if len(hits) > 1:
        names = ", ".join(str(dicts[i].get("name")) for i in hits)
        raise ManifestError(where, f"several containers look like kube-scheduler ({names}); use --container-name")
    return hits[0]


def _pod(doc: yt.Document, where: str) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """The document as a Pod: its metadata, its spec and its non-empty container list."""
    data = doc.data
    if not isinstance(data, dict):
        raise ManifestError(where, "not a YAML mapping")
    if data.get("kind") != "Pod":
        raise ManifestError(where, f"kind is {data.get('kind')!r}, expected Pod")
    metadata = data.get("metadata")
    spec = data.get("spec")
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise ManifestError(where, "a Pod needs metadata and spec mappings")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ManifestError(where, "spec.containers is missing or empty")
    return metadata, spec, containers


def _marker(metadata: dict[str, Any], prefix: str, where: str) -> Marker | None:
    """Our marker annotation, if the manifest carries one; a value that is not ours is a refusal."""
    annotations = metadata.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        raise ManifestError(where, "metadata.annotations is not a mapping")
    raw = (annotations or {}).get(marker_key(prefix))
    if raw is None:
        return None
    try:
        return Marker.from_json(str(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(where, f"annotation {marker_key(prefix)} is not a scheduler-patcher marker "
                            f"({exc})") from None


def _foreign_config(flags: list[Any], start: int, marker: Marker | None) -> tuple[str | None, int | None]:
    """The ``--config`` value we did not add and the index of its item: still in the flags (the scheduler's
    own, from ``start``), or (when ours replaced it) the one the marker keeps to put back."""
    foreign, foreign_index = None, None
    for found in config_flags(flags[start:]):
        # Ours is the item the marker names: ``--config=<path>``, or the path after a split ``--config``.
        if not (marker and marker.flag in (flags[start + found.index], found.value)):
            foreign, foreign_index = found.value, start + found.index
    if foreign is not None or marker is None or marker.replaced is None:
        return foreign, foreign_index
    replaced = _written(marker.replaced)
    return (replaced.removeprefix(CONFIG_FLAG_EQ), None) if isinstance(replaced, str) else (None, None)


def inspect(doc: yt.Document, where: str, *, prefix: str, container_name: str | None = None) -> Scheduler:
    """Check the manifest's shape and find the scheduler container, its flag list and our marker."""
    metadata, spec, containers = _pod(doc, where)
    idx = _container_index(containers, container_name, where)
    container = containers[idx]
    if _runs_in_shell(container):
        raise ManifestError(where, _IN_SHELL)
    flags_key = next((k for k in ("args", "command") if isinstance(container.get(k), list) and container[k]), "")
    if not flags_key:
        raise ManifestError(where, f"container {container.get('name')!r} has no command or args list")
    flags = container[flags_key]
    marker = _marker(metadata, prefix, where)
    foreign, foreign_index = _foreign_config(flags, own_start(flags, flags_key), marker)
    for key, holder in (("volumes", spec), ("volumeMounts", container)):
        value = holder.get(key)
        if value is not None and not isinstance(value, list):
            raise ManifestError(where, f"{key} is not a list")
    uid = metadata.get("uid")
    if isinstance(uid, (dict, list)):
        raise ManifestError(where, "metadata.uid is not a scalar")
    return Scheduler(
        pod_name=str(metadata.get("name", "")), namespace=str(metadata.get("namespace", "") or "kube-system"),
        container_index=idx, container_name=str(container.get("name", "")), flags_key=flags_key, flags=flags,
        image=container.get("image") if isinstance(container.get("image"), str) else None, marker=marker,
        foreign_config=foreign, foreign_index=foreign_index,
        mounts=[m for m in container.get("volumeMounts") or [] if isinstance(m, dict)],
        volumes=[v for v in spec.get("volumes") or [] if isinstance(v, dict)],
        uid=None if uid is None or uid == "" else str(uid),
    )


@dataclass(frozen=True)
class PatchSpec:
    """What to add: the config file path (same path on the node and in the container) and its hash."""

    host_config_dir: str
    config_file: str  # file name inside host_config_dir
    config_hash: str  # full or short sha256 hex; the marker keeps 12 digits
    prefix: str = "scheduler-patcher.io"
    container_name: str | None = None
    on_foreign: ForeignMode = "fail"

    @property
    def config_path(self) -> str:
        return posixpath.join(self.host_config_dir, self.config_file)

    @property
    def short_hash(self) -> str:
        return self.config_hash[:12]


@dataclass(frozen=True)
class PatchResult:
    text: str
    changed: bool


def check_foreign(sched: Scheduler, mode: ForeignMode, where: str) -> None:
    """In ``fail`` mode, a ``--config`` we did not add is a refusal."""
    if sched.foreign_config is not None and mode == "fail":
        raise ManifestError(where, f"kube-scheduler already runs with --config={sched.foreign_config}, which "
                            "scheduler-patcher did not add; use --on-foreign-config=merge or replace")


def parse_manifest(text: str, where: str) -> yt.Document:
    try:
        return yt.parse(text)
    except yt.YamlTextError as exc:
        raise ManifestError(where, str(exc)) from None


def _name_first(sched: Scheduler, doc: yt.Document) -> bool:
    """Hand-written manifests put ``name:`` first in list items; kubeadm sorts keys. Follow the file."""
    for items in (sched.mounts, sched.volumes):
        if items:
            return next(iter(items[0])) == "name"
    container = doc.data["spec"]["containers"][sched.container_index]
    return bool(next(iter(container)) == "name")


def _is_current(sched: Scheduler, spec: PatchSpec) -> bool:
    m = sched.marker
    if m is None or m.hash != spec.short_hash:
        return False
    flag_ok = m.flag in sched.flags and m.flag in (f"--config={spec.config_path}", spec.config_path)
    mount_ok = any(x.get("name") == m.volume and x.get("mountPath") == spec.host_config_dir for x in sched.mounts)
    vol_ok = any(v.get("name") == m.volume and (v.get("hostPath") or {}).get("path") == spec.host_config_dir
                 for v in sched.volumes)
    uid_ok = sched.uid is None or _our_uid(sched, m) is not None
    return flag_ok and mount_ok and vol_ok and uid_ok


def _our_uid(sched: Scheduler, m: Marker) -> str | None:
    """The source text of the UID the marker keeps, while the manifest still carries the UID the patch wrote in
    its place (one someone set since is not ours); else None."""
    if m.uid is None:
        return None
    value = _written(m.uid)
    return m.uid if sched.uid == patched_uid("" if value is None else str(value), m.hash) else None


Inspected = tuple[yt.Document, Scheduler]


def patch(text: str, spec: PatchSpec, where: str, *, inspected: Inspected | None = None,
          unpatched: Inspected | None = None) -> PatchResult:
    """Add ``--config``, the config folder volume and mount, and the marker. Idempotent; verified.

    ``inspected``: ``text`` already parsed and inspected; ``unpatched``: the same for ``restore(text)``. A
    caller that has them (``nodefiles.plan_apply``) hands them on instead of having them computed again.
    """
    doc, sched = inspected or inspect_text(text, where, spec.prefix, spec.container_name)
    if sched.marker is not None:
        if _is_current(sched, spec):
            return PatchResult(text, False)
        doc, sched = unpatched or inspect_text(restore(text, where, prefix=spec.prefix,
                                                       container_name=spec.container_name, inspected=(doc, sched)),
                                               where, spec.prefix, spec.container_name)
    check_foreign(sched, spec.on_foreign, where)
    # Our volume name and our mount path must be free in the unpatched manifest.
    if any(v.get("name") == VOLUME_NAME for v in sched.volumes):
        raise ManifestError(where, f"a volume named {VOLUME_NAME} exists but carries no scheduler-patcher marker")
    if any(str(m.get("mountPath", "")).rstrip("/") == spec.host_config_dir.rstrip("/") for m in sched.mounts):
        raise ManifestError(where, f"something is already mounted at {spec.host_config_dir}")

    try:
        root = doc.root  # the composer is stricter than the C parser (a tab inside a key): refuse, one line
    except yt.YamlTextError as exc:
        raise ManifestError(where, f"cannot patch: {exc}") from None
    cpath: yt.Path = ("spec", "containers", sched.container_index)
    nested = yt.nested_indent(root)
    name_first = _name_first(sched, doc)
    created: list[str] = []

    # 1. --config in the flag list (replacing a foreign one in replace/merge mode).
    flag_op, flag, replaced = _config_flag(doc, sched, spec)
    ops: list[yt.Op] = [flag_op]

    # 2. the volume for the whole config folder (never a single file: a file bind mount pins the old inode).
    volume = {"hostPath": {"path": spec.host_config_dir, "type": "DirectoryOrCreate"}, "name": VOLUME_NAME}
    mount = {"mountPath": spec.host_config_dir, "name": VOLUME_NAME, "readOnly": True}
    order = yt.Hints(
        key_order={(): ["name", "hostPath", "mountPath", "readOnly"] if name_first else
                   ["hostPath", "mountPath", "name", "readOnly"], ("hostPath",): ["path", "type"]},
        quotes={}, nested_indent=nested)
    if not sched.volumes and yt.node_at(root, ("spec", "volumes")) is None:
        created.append("volumes")
    if not sched.mounts and yt.node_at(root, (*cpath, "volumeMounts")) is None:
        created.append("volumeMounts")
    containers_style = _style_of(doc, yt.node_at(root, ("spec",)), "containers")
    flags_style = _style_of(doc, yt.node_at(root, cpath), sched.flags_key) or containers_style
    ops.append(yt.Append(("spec", "volumes"), volume, order if "volumes" in created else None, containers_style))
    ops.append(yt.Append((*cpath, "volumeMounts"), mount, order if "volumeMounts" in created else None,
                         flags_style))

    # 3. a UID of ours where the manifest sets one: the kubelet restarts a static pod only for a new UID.
    uid_node, uid_text = yt.node_at(root, ("metadata", "uid")), None
    if sched.uid is not None and isinstance(uid_node, ScalarNode):
        uid_text = yt.source(doc.text, uid_node)
        new_uid = patched_uid(sched.uid, spec.short_hash)
        ops.append(yt.Replace(("metadata", "uid"), new_uid, yt.render_scalar(new_uid, yt.quote_style(uid_node))))

    # 4. the marker, last: it describes the items above.
    if yt.node_at(root, ("metadata", "annotations")) is None:
        created.append("annotations")
    marker = Marker(hash=spec.short_hash, flag=flag, volume=VOLUME_NAME, mount=spec.host_config_dir,
                    container=sched.container_name, replaced=replaced, created=tuple(created), uid=uid_text)
    ops.append(yt.SetKey(("metadata", "annotations"), marker_key(spec.prefix), marker.to_json(),
                         yt.Hints(quotes={(): "'"}, nested_indent=nested)))
    try:
        new_text, _ = yt.edit(doc, ops)
    except yt.YamlTextError as exc:
        raise ManifestError(where, f"cannot patch: {exc}") from None
    return PatchResult(new_text, True)


def _config_flag(doc: yt.Document, sched: Scheduler, spec: PatchSpec) -> tuple[yt.Op, str, str | None]:
    """How our ``--config`` goes into the flags: appended, or in place of a foreign one (in its quoting, and
    as a bare path after a split ``--config``). Returns the edit, the item written, the source text replaced."""
    if sched.foreign_index is None:
        flag = f"--config={spec.config_path}"
        return yt.Append(sched.flags_path, flag), flag, None
    split = sched.flags[sched.foreign_index] == "--config"
    idx = sched.foreign_index + 1 if split else sched.foreign_index
    item_node = yt.node_at(doc.root, (*sched.flags_path, idx))
    assert isinstance(item_node, ScalarNode)
    flag = spec.config_path if split else f"--config={spec.config_path}"
    op = yt.Replace((*sched.flags_path, idx), flag, yt.render_scalar(flag, yt.quote_style(item_node)))
    return op, flag, yt.source(doc.text, item_node)


def _style_of(doc: yt.Document, parent: Node | None, key: str) -> yt.SeqStyle | None:
    if parent is None:
        return None
    found = yt.map_lookup(parent, key)
    if not found:
        return None
    try:
        return yt.learn_seq_style(doc.text, found[0], found[1])
    except yt.YamlTextError:
        return None


def inspect_text(text: str, where: str, prefix: str, container_name: str | None) -> Inspected:
    """``text`` parsed and inspected (``inspect``), both handed on to ``patch`` and ``restore``."""
    doc = parse_manifest(text, where)
    return doc, inspect(doc, where, prefix=prefix, container_name=container_name)


def restore(text: str, where: str, *, prefix: str, container_name: str | None = None,
            inspected: Inspected | None = None) -> str:
    """Remove exactly what the marker says we added from the current text; unchanged when there is no marker."""
    doc, sched = inspected or inspect_text(text, where, prefix, container_name)
    m = sched.marker
    if m is None:
        return text
    data = doc.data
    ops: list[yt.Op] = []
    if m.flag in sched.flags:
        flag_path = (*sched.flags_path, sched.flags.index(m.flag))
        if m.replaced is None:
            ops.append(yt.Remove(flag_path))
        else:
            ops.append(yt.Replace(flag_path, _written(m.replaced, "replaced flag", where), m.replaced))
    cpath: yt.Path = ("spec", "containers", sched.container_index)
    container = data["spec"]["containers"][sched.container_index]
    _remove_item(ops, data["spec"], ("spec",), "volumes", lambda v: v.get("name") == m.volume, "volumes" in m.created)
    _remove_item(ops, container, cpath, "volumeMounts",
                 lambda v: v.get("name") == m.volume and v.get("mountPath") == m.mount, "volumeMounts" in m.created)
    if (ours := _our_uid(sched, m)) is not None:
        # Ours is still there: the original back, as it was written. A UID someone set since stays.
        ops.append(yt.Replace(("metadata", "uid"), _written(ours, "uid", where), ours))
    annotations = data["metadata"]["annotations"]
    if "annotations" in m.created and list(annotations) == [marker_key(prefix)]:
        ops.append(yt.Remove(("metadata", "annotations")))
    else:
        ops.append(yt.Remove(("metadata", "annotations", marker_key(prefix))))
    try:
        new_text, _ = yt.edit(doc, ops)
    except yt.YamlTextError as exc:
        raise ManifestError(where, f"cannot restore: {exc}") from None
    return new_text


def _remove_item(ops: list[yt.Op], holder: dict[str, Any], path: yt.Path, key: str, ours: Any,
                 created: bool) -> None:
    items = holder.get(key)
    if not isinstance(items, list):
        return
    hits = [i for i, v in enumerate(items) if isinstance(v, dict) and ours(v)]
    if not hits:
        return
    if created and len(items) == len(hits) == 1:
        ops.append(yt.Remove((*path, key)))
    else:
        ops.append(yt.Remove((*path, key, hits[0])))


def map_to_node(mounts: list[dict[str, Any]], volumes: list[dict[str, Any]], path: str) -> str | None:
    """Map a path inside a container to the node, through its volumeMounts and hostPath volumes (the longest
    mountPath wins, as in the kubelet); None when no hostPath volume holds it."""
    best: tuple[int, str] | None = None
    for mount in mounts:
        mp = str(mount.get("mountPath", "")).rstrip("/") or "/"
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            volume = next((v for v in volumes if v.get("name") == mount.get("name")), None)
            host = (volume or {}).get("hostPath") or {}
            if isinstance(host, dict) and host.get("path") and (best is None or len(mp) > best[0]):
                sub = str(mount.get("subPath") or "")
                base = posixpath.join(str(host["path"]), sub) if sub else str(host["path"])
                best = (len(mp), posixpath.normpath(base + path[len(mp.rstrip("/")):]))
    return best[1] if best else None


#: The words of the one-line error for a ``--config`` that names a file not on the node (``nodefiles.missing_config``):
#: the agent's lifecycle recognises its own earlier report by them in a record it loads after a restart.
MISSING_FILE = "names a missing file"


@dataclass(frozen=True)
class ConfigNames:
    """The files a static-pod manifest names as a ``--config``: the one rule every removal of a file obeys.

    Why so wide: a file the kubelet's next start of kube-scheduler reads must never be removed, whoever added
    the flag and whatever annotation prefix a command was given. ``paths`` holds every ``--config`` value of
    every container (as written and mapped to the node through the container's hostPath mounts), and the
    ``--config`` each scheduler-patcher marker of any prefix replaced (a restore puts it back). ``text`` is the
    manifest itself: a path written anywhere in it (a shell string, a comment) is kept too, and a manifest that
    cannot be parsed keeps every file whose name it contains. Erring this way only ever leaves a file behind.
    """

    paths: frozenset[str]
    text: str
    parsed: bool = True

    def names(self, node_path: str) -> bool:
        norm = posixpath.normpath(node_path)
        if norm in self.paths or norm in self.text:
            return True
        return not self.parsed and posixpath.basename(norm) in self.text


def _marker_prefixes(metadata: dict[str, Any]) -> dict[str, Marker]:
    """Every scheduler-patcher marker on the manifest, by the annotation prefix it was written with."""
    annotations = metadata.get("annotations")
    found: dict[str, Marker] = {}
    if not isinstance(annotations, dict):
        return found
    for key, raw in annotations.items():
        if not isinstance(key, str) or not key.endswith("/patch"):
            continue
        try:
            found[key[: -len("/patch")]] = Marker.from_json(str(raw))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def config_names(text: str) -> ConfigNames:
    """Which files ``text`` (a static-pod manifest) names as a ``--config`` (see ``ConfigNames``)."""
    try:
        data = yt.load_data(text)
    except yt.YamlTextError:
        return ConfigNames(frozenset(), text, parsed=False)
    pod: dict[str, Any] = data if isinstance(data, dict) else {}  # not a pod: the kubelet runs nothing from it
    spec: dict[str, Any] = pod["spec"] if isinstance(pod.get("spec"), dict) else {}
    metadata: dict[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)] \
        if isinstance(spec.get("volumes"), list) else []
    containers = [c for key in ("containers", "initContainers") if isinstance(spec.get(key), list)
                  for c in spec[key] if isinstance(c, dict)]
    paths: set[str] = set()

    def add(container: dict[str, Any], value: str) -> None:
        mounts = container.get("volumeMounts")
        mounts = [m for m in mounts if isinstance(m, dict)] if isinstance(mounts, list) else []
        if value:
            paths.add(posixpath.normpath(value))
            node = map_to_node(mounts, volumes, posixpath.normpath(value))
            if node is not None:
                paths.add(node)

    for container in containers:
        items = [x for key in ("command", "args") if isinstance(container.get(key), list) for x in container[key]]
        for found in config_flags(items):
            add(container, found.value)
    by_name = {str(c.get("name")): c for c in containers}
    for m in _marker_prefixes(metadata).values():
        container = by_name.get(m.container, containers[0] if containers else {})
        add(container, m.flag.removeprefix(CONFIG_FLAG_EQ))
        replaced = None if m.replaced is None else _written(m.replaced)
        if isinstance(replaced, str):
            add(container, replaced.removeprefix(CONFIG_FLAG_EQ))
    return ConfigNames(frozenset(paths), text)


def check_prefix(doc: yt.Document, prefix: str, where: str) -> None:
    """A manifest patched under another annotation prefix is refused, naming the prefix to pass: read without
    it, our items look foreign (a restore would find nothing to undo and an apply would patch twice)."""
    data = doc.data
    metadata = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(metadata, dict):
        return
    found = _marker_prefixes(metadata)
    if prefix in found or not found:
        return
    others = sorted(found)
    raise ManifestError(where, f"carries the scheduler-patcher marker of annotation prefix {others[0]} "
                        f"({marker_key(others[0])}), not {prefix}; pass --annotation-prefix {others[0]}")
