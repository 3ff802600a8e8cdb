"""Render a kustomization for the tests: the real tool when one is on PATH, else a small loader of our own.

The loader supports exactly what ``manifests/`` uses and refuses everything else, so a new feature in a
kustomization makes the tests fail instead of being silently ignored:

- ``resources``: YAML files (several documents each) and directories holding a kustomization;
- ``patches``: from a file (``path``) or inline (``patch``); a strategic-merge patch (a mapping) finds its
  resource from its own apiVersion, kind, name and namespace unless a ``target`` is given; a JSON 6902 patch
  (a list of ``add``/``remove``/``replace``/``test`` operations) needs a ``target``;
- ``images``: ``name`` with ``newName``/``newTag``/``digest``, applied to every container and init container.

It follows the kustomize rules that decide whether ``kubectl apply -k`` accepts a folder: files are read only
inside the kustomization's folder (the default load restrictor), a directory resource must not contain a
kustomization that is being built (kustomize's cycle check), resource ids are unique, and YAML mappings have
no duplicate keys. It is stricter in one way: a patch that matches no resource is an error.

Strategic merge uses the merge keys of the Pod template's lists (containers and env by ``name``, volumeMounts by
``mountPath``, ...) and puts the patch's items first, lists without a merge key are replaced, and ``null``
deletes a key: what kustomize 5 does for the workloads we patch. ``$patch`` directives are not supported.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KUSTOMIZATION_KEYS = frozenset({"apiVersion", "kind", "resources", "patches", "images"})
PATCH_KEYS = frozenset({"path", "patch", "target"})
TARGET_KEYS = frozenset({"group", "version", "kind", "name", "namespace"})
IMAGE_KEYS = frozenset({"name", "newName", "newTag", "digest"})

#: Merge keys of the Pod template lists we patch (k8s.io/api core/v1 ``patchMergeKey``); other lists are replaced.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}


class KustomizeError(Exception):
    """A kustomization that kustomize would refuse, or that uses a feature this loader does not support."""


# -- YAML ---------------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys, as kubectl's YAML decoder does."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise KustomizeError(f"duplicate key {key!r} at {key_node.start_mark}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_documents(text: str, where: str) -> list[Any]:
    """Every non-empty YAML document of ``text``."""
    try:
        return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]
    except yaml.YAMLError as exc:
        raise KustomizeError(f"{where}: invalid YAML: {exc}") from None


# -- rendering ----------------------------------------------------------------------------------------------


def external_command() -> list[str] | None:
    """``kubectl kustomize`` or ``kustomize build`` when either binary is on PATH."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        return [kubectl, "kustomize"]
    kustomize = shutil.which("kustomize")
    if kustomize:
        return [kustomize, "build"]
    return None


def render_external(folder: Path, command: list[str]) -> list[Resource]:
    """Render with the real tool (``command`` from ``external_command``)."""
    proc = subprocess.run([*command, str(folder)], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise KustomizeError(f"{' '.join(command)} {folder}: {proc.stderr.strip()}")
    return [doc for doc in load_documents(proc.stdout, str(folder)) if isinstance(doc, dict)]


def render(folder: Path, *, engine: str = "auto") -> list[Resource]:
    """Render ``folder``: ``engine`` is ``auto`` (real tool if present), ``builtin`` or ``external``."""
    command = external_command() if engine in ("auto", "external") else None
    if engine == "external" and command is None:
        raise KustomizeError("neither kubectl nor kustomize is on PATH")
    if command is not None:
        return render_external(folder, command)
    return build(folder)


def build(folder: Path) -> list[Resource]:
    """Render ``folder`` with the built-in loader."""
    return _build(folder.resolve(), ())


def _kustomization_file(folder: Path) -> Path:
    found = [folder / name for name in KUSTOMIZATION_FILES if (folder / name).is_file()]
    if not found:
        raise KustomizeError(f"{folder}: no kustomization file ({', '.join(KUSTOMIZATION_FILES)})")
    if len(found) > 1:
        raise KustomizeError(f"{folder}: more than one kustomization file")
    return found[0]


def _inside(root: Path, relative: str, what: str) -> Path:
    """A file named by a kustomization, which kustomize reads only below the kustomization's folder."""
    path = (root / relative).resolve()
    if root != path and root not in path.parents:
        raise KustomizeError(f"{root}: {what} {relative!r} is outside the kustomization's folder (load restrictor)")
    if not path.is_file():
        raise KustomizeError(f"{root}: {what} {relative!r} not found")
    return path


def _build(root: Path, referrers: tuple[Path, ...]) -> list[Resource]:
    for visited in (*referrers, root):
        if root != visited and root in visited.parents:
            raise KustomizeError(f"cycle detected: candidate root {root} contains visited root {visited}")
    if root in referrers:
        raise KustomizeError(f"cycle detected: {root} is already being built")
    kfile = _kustomization_file(root)
    docs = load_documents(kfile.read_text("utf-8"), str(kfile))
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise KustomizeError(f"{kfile}: expected one mapping")
    spec: dict[str, Any] = docs[0]
    unknown = set(spec) - KUSTOMIZATION_KEYS
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported fields {sorted(unknown)} (extend tests/kustomize.py)")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{kfile}: kind {spec.get('kind')!r} is not supported")
    if spec.get("apiVersion", "kustomize.config.k8s.io/v1beta1") != "kustomize.config.k8s.io/v1beta1":
        raise KustomizeError(f"{kfile}: apiVersion {spec.get('apiVersion')!r} is not supported")

    resources: list[Resource] = []
    for entry in _list(spec, "resources", kfile):
        if not isinstance(entry, str):
            raise KustomizeError(f"{kfile}: resource entries must be strings, got {entry!r}")
        candidate = (root / entry).resolve()
        if candidate.is_dir():
            loaded = _build(candidate, (*referrers, root))
        else:
            path = _inside(root, entry, "resource")
            loaded = _objects(load_documents(path.read_text("utf-8"), str(path)), str(path))
        for obj in loaded:
            _add(resources, obj, kfile)
    for entry in _list(spec, "patches", kfile):
        _patch(resources, entry, root, kfile)
    for entry in _list(spec, "images", kfile):
        _images(resources, entry, kfile)
    return resources


def _list(spec: dict[str, Any], key: str, kfile: Path) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise KustomizeError(f"{kfile}: {key} must be a list")
    return value


def _objects(docs: Iterable[Any], where: str) -> list[Resource]:
    out = []
    for doc in docs:
        if not isinstance(doc, dict):
            raise KustomizeError(f"{where}: a document is not a mapping")
        meta = doc.get("metadata")
        if not doc.get("apiVersion") or not doc.get("kind") or not isinstance(meta, dict) or not meta.get("name"):
            raise KustomizeError(f"{where}: every object needs apiVersion, kind and metadata.name")
        out.append(doc)
    return out


def resource_id(obj: Resource) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name); kustomize treats no namespace and ``default`` alike."""
    group = str(obj["apiVersion"]).rpartition("/")[0]
    namespace = obj["metadata"].get("namespace") or "default"
    return group, str(obj["kind"]), namespace, str(obj["metadata"]["name"])


def _add(resources: list[Resource], obj: Resource, kfile: Path) -> None:
    rid = resource_id(obj)
    if any(resource_id(other) == rid for other in resources):
        raise KustomizeError(f"{kfile}: may not add resource with an already registered id {rid}")
    resources.append(obj)


# -- patches ------------------------------------------------------------------------------------------------


def _patch(resources: list[Resource], entry: Any, root: Path, kfile: Path) -> None:
    if not isinstance(entry, dict) or set(entry) - PATCH_KEYS or ("path" in entry) == ("patch" in entry):
        raise KustomizeError(f"{kfile}: a patch needs exactly one of path/patch (and an optional target): {entry!r}")
    if "path" in entry:
        path = _inside(root, entry["path"], "patch")
        where, text = str(path), path.read_text("utf-8")
    else:
        where, text = f"{kfile} (inline patch)", str(entry["patch"])
    docs = load_documents(text, where)
    target = entry.get("target")
    if target is not None and (not isinstance(target, dict) or set(target) - TARGET_KEYS):
        raise KustomizeError(f"{where}: unsupported target {target!r} (supported: {sorted(TARGET_KEYS)})")
    if len(docs) == 1 and isinstance(docs[0], list):
        if target is None:
            raise KustomizeError(f"{where}: a JSON 6902 patch needs a target")
        for obj in _select(resources, target, where):
            apply_json6902(obj, docs[0], where)
        return
    if not docs or not all(isinstance(doc, dict) for doc in docs):
        raise KustomizeError(f"{where}: neither a strategic-merge patch nor a JSON 6902 operation list")
    for doc in docs:
        if target is not None:
            matches = _select(resources, target, where)
        else:
            matches = _select(resources, _target_of(doc, where), where)
        for obj in matches:
            merged = strategic_merge(obj, doc)
            obj.clear()
            obj.update(merged)


def _target_of(patch: Resource, where: str) -> dict[str, str]:
    meta = patch.get("metadata") or {}
    if not patch.get("apiVersion") or not patch.get("kind") or not meta.get("name"):
        raise KustomizeError(f"{where}: a strategic-merge patch without target needs apiVersion, kind and name")
    group, _, version = str(patch["apiVersion"]).rpartition("/")
    target = {"group": group, "version": version, "kind": patch["kind"], "name": meta["name"]}
    if meta.get("namespace"):
        target["namespace"] = meta["namespace"]
    return target


def _select(resources: list[Resource], target: dict[str, Any], where: str) -> list[Resource]:
    name = target.get("name")
    if name is not None and not re.fullmatch(r"[A-Za-z0-9.-]+", str(name)):
        raise KustomizeError(f"{where}: target name {name!r} is a regular expression; only exact names are supported")
    out = []
    for obj in resources:
        group, _, version = str(obj["apiVersion"]).rpartition("/")
        rid = resource_id(obj)
        checks = {
            "group": group,
            "version": version,
            "kind": obj["kind"],
            "name": obj["metadata"]["name"],
            "namespace": rid[2],
        }
        wanted = {k: ("default" if k == "namespace" and not v else v) for k, v in target.items()}
        if all(str(checks[k]) == str(v) for k, v in wanted.items()):
            out.append(obj)
    if not out:
        raise KustomizeError(f"{where}: the patch matches no resource (target {target})")
    return out


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """``patch`` merged into a copy of ``base``: maps merge, ``null`` deletes, keyed lists merge by key."""
    if isinstance(patch, dict):
        out = copy.deepcopy(base) if isinstance(base, dict) else {}
        for key, value in patch.items():
            if str(key).startswith("$"):
                raise KustomizeError(f"strategic-merge directive {key!r} is not supported")
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(out.get(key), value, str(key))
        return out
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(base, list):
        # kustomize merges with ListIncreaseDirection=Prepend: the patch's items come first (merged with the
        # base item of the same key), then the base items the patch does not name, in their order.
        key = MERGE_KEYS[field]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise KustomizeError(f"strategic merge: every {field} item needs its merge key {key!r}: {item!r}")
        patched = [item[key] for item in patch]
        by_key = {old.get(key): old for old in base if isinstance(old, dict)}
        merged = [strategic_merge(by_key.get(item[key]), item, None) for item in patch]
        rest = [copy.deepcopy(old) for old in base if not (isinstance(old, dict) and old.get(key) in patched)]
        return merged + rest
    if isinstance(patch, list):
        return [strategic_merge(None, item, None) for item in patch]
    return copy.deepcopy(patch)


def _pointer(path: str, where: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KustomizeError(f"{where}: JSON pointer {path!r} must start with '/'")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _index(container: list[Any], token: str, where: str, *, append: bool = False) -> int:
    if append and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise KustomizeError(f"{where}: {token!r} is not a list index")
    index = int(token)
    if index > len(container) or (index == len(container) and not append):
        raise KustomizeError(f"{where}: index {index} out of range")
    return index


def _walk(doc: Any, tokens: list[str], where: str) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise KustomizeError(f"{where}: path element {token!r} not found")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, where)]
        else:
            raise KustomizeError(f"{where}: cannot descend into a scalar at {token!r}")
    return node


def apply_json6902(obj: Resource, ops: list[Any], where: str) -> None:
    """Apply RFC 6902 ``add``/``remove``/``replace``/``test`` operations to ``obj`` in place."""
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise KustomizeError(f"{where}: not a JSON patch operation: {op!r}")
        kind, tokens = op["op"], _pointer(str(op["path"]), where)
        if kind not in ("add", "remove", "replace", "test"):
            raise KustomizeError(f"{where}: JSON patch operation {kind!r} is not supported")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise KustomizeError(f"{where}: {kind} at {op['path']} needs a value")
        if kind == "test":
            found = _walk(obj, tokens, where)
            if found != op["value"]:
                raise KustomizeError(f"{where}: test failed at {op['path']}: found {found!r}, expected {op['value']!r}")
            continue
        if not tokens:
            raise KustomizeError(f"{where}: operations on the whole document are not supported")
        parent, last = _walk(obj, tokens[:-1], where), tokens[-1]
        value = copy.deepcopy(op.get("value"))
        if isinstance(parent, dict):
            if kind != "add" and last not in parent:
                raise KustomizeError(f"{where}: {kind} at {op['path']}: no such key")
            if kind == "remove":
                del parent[last]
            else:
                parent[last] = value
        elif isinstance(parent, list):
            index = _index(parent, last, where, append=kind == "add")
            if kind == "add":
                parent.insert(index, value)
            elif kind == "remove":
                del parent[index]
            else:
                parent[index] = value
        else:
            raise KustomizeError(f"{where}: {kind} at {op['path']}: the parent is a scalar")


# -- images -------------------------------------------------------------------------------------------------


def split_image(image: str) -> tuple[str, str | None, str | None]:
    """(name, tag, digest) of an image reference; a registry port is not a tag."""
    name, _, digest = image.partition("@")
    tag = None
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest or None


def _images(resources: list[Resource], entry: Any, kfile: Path) -> None:
    if not isinstance(entry, dict) or "name" not in entry or set(entry) - IMAGE_KEYS:
        raise KustomizeError(f"{kfile}: unsupported images entry {entry!r}")
    for key in ("newName", "newTag", "digest"):
        if key in entry and not isinstance(entry[key], str):
            raise KustomizeError(f"{kfile}: images {key} must be a string (quote it): {entry[key]!r}")
    for obj in resources:
        for container in _containers(obj):
            image = container.get("image")
            if not isinstance(image, str):
                continue
            name, tag, digest = split_image(image)
            if name != entry["name"]:
                continue
            name = entry.get("newName", name)
            if "newTag" in entry:
                tag, digest = entry["newTag"], None
            if "digest" in entry:
                tag, digest = None, entry["digest"]
            container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


def _containers(node: Any) -> Iterable[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)
