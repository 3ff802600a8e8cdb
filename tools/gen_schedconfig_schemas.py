#!/usr/bin/env python3
"""Generate the per-minor kube-scheduler configuration schemas from the upstream Go types.

Two steps, so that the repository never holds upstream source files and the generated JSON can be reproduced
from what *is* committed:

``extract``  reads the Go types of each minor and writes the facts we need — for every apiVersion, type and
             JSON field, its type in our vocabulary and the minors that have it — to
             ``tools/schedconfig-upstream.json``. Either from git (``git show release-1.N:<path>`` in bare mirrors
             or clones of kubernetes/kube-scheduler, kubernetes/component-base, kubernetes/api and
             kubernetes/apimachinery), or with ``--modules`` from the published modules of the release each
             ``tools/realk8s/v1.N.P/`` folder pins (k8s.io/kube-scheduler v0.N.P …, through the Go module proxy
             with that folder's go.sum: the very sources the oracle's binaries are built from). ``--minor`` limits
             it to some minors and keeps the facts of the others. With k8s.io/kubernetes at hand (``--modules``)
             it also reads the extension points ``NewFramework`` builds (``getExtensionPoints`` in
             pkg/scheduler/framework/runtime/framework.go) and fails unless they are the fields of that minor's
             ``Plugins`` type but ``multiPoint``, each with the interface ``<Field>Plugin``: what the start-up
             checks derive from the generated types (``patcher/core/schedconfig/rules.py``).
``generate`` turns those facts into one schema per minor,
``patcher/core/schedconfig/schemas/kube-scheduler-1.N.json``.
``check``    regenerates in memory and exits 1 when the committed JSON differs (the test suite does the same).

    python tools/gen_schedconfig_schemas.py extract --mirror-root /work/.mirror   # needs the four mirrors
    python tools/gen_schedconfig_schemas.py extract --modules --minor 1.37       # the pinned release of 1.37
    python tools/gen_schedconfig_schemas.py generate
    python tools/gen_schedconfig_schemas.py check

Type vocabulary (what ``patcher/core/schedconfig/validate.py`` checks): ``string``, ``bool``, ``int32``, ``int64``,
``float32``, ``float64``, ``duration`` (metav1.Duration), ``bytes`` ([]byte, base64), ``object`` (a
runtime.RawExtension: any mapping), ``[]T``, ``map[string]T`` and the name of another type.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tools" / "schedconfig-upstream.json"
OUT_DIR = ROOT / "patcher" / "core" / "schedconfig" / "schemas"
OUT_PREFIX = "kube-scheduler-"  # beside the hand-written per-apiVersion files, which never start with it

MINORS = [f"1.{minor}" for minor in range(19, 38)]
GROUP = "kubescheduler.config.k8s.io"
ROOT_TYPE = "KubeSchedulerConfiguration"

# Go import path -> (mirror repository, folder with the Go files) for the packages the config types use.
PACKAGES = {
    "k8s.io/kube-scheduler/config/v1": ("kubernetes+kube-scheduler", "config/v1"),  # 1.19-1.22: the Policy API
    "k8s.io/component-base/config/v1alpha1": ("kubernetes+component-base", "config/v1alpha1"),
    "k8s.io/api/core/v1": ("kubernetes+api", "core/v1"),
    "k8s.io/apimachinery/pkg/apis/meta/v1": ("kubernetes+apimachinery", "pkg/apis/meta/v1"),
}
# Files to read per package: upstream spreads types over several files; these hold the ones we reach.
PACKAGE_FILES = {
    "k8s.io/kube-scheduler/config/v1": ["types.go"],
    "k8s.io/component-base/config/v1alpha1": ["types.go"],
    "k8s.io/api/core/v1": ["types.go"],
    "k8s.io/apimachinery/pkg/apis/meta/v1": ["types.go", "duration.go"],
}
SCHEDULER_REPO = "kubernetes+kube-scheduler"
KUBERNETES_REPO = "kubernetes+kubernetes"
FRAMEWORK = "pkg/scheduler/framework/runtime/framework.go"
#: mirror name -> the Go module that publishes the same folder (the staging repositories are published as modules)
MODULES = {
    "kubernetes+kube-scheduler": "k8s.io/kube-scheduler",
    "kubernetes+component-base": "k8s.io/component-base",
    "kubernetes+api": "k8s.io/api",
    "kubernetes+apimachinery": "k8s.io/apimachinery",
    KUBERNETES_REPO: "k8s.io/kubernetes",
}
REALK8S = ROOT / "tools" / "realk8s"
SCHEDULER_FILES = ["types.go", "types_pluginargs.go", "register.go"]

# Named Go types that are scalars on the wire.
WELL_KNOWN = {
    "metav1.Duration": "duration",
    "runtime.RawExtension": "object",
    "metav1.Time": "string",
    "types.UID": "string",
    "intstr.IntOrString": "object",
}
GO_SCALARS = {
    "string": "string",
    "bool": "bool",
    "int32": "int32",
    "int64": "int64",
    "int": "int64",
    "float32": "float32",
    "float64": "float64",
}

# Our contract on top of upstream (not upstream facts): fields that must be present and non-empty. Upstream
# decodes a missing name or urlPrefix as "" and fails later (a plugin "" does not exist; an extender without a
# URL fails every call), so refusing it at validation is the safer contract (docs/scheduler-config.md).
REQUIRED = {
    "Extender": ["urlPrefix"],
    "ExtenderManagedResource": ["name"],
    "Plugin": ["name"],
    "PluginConfig": ["name"],
}


# ---- reading Go -------------------------------------------------------------------------------------------------


@dataclass
class GoField:
    go_name: str  # empty for an embedded type
    go_type: str
    json_name: str | None  # None: not on the wire (json:"-"); "" with inline
    inline: bool = False


@dataclass
class GoPackage:
    structs: dict[str, list[GoField]] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)  # type X string -> {"X": "string"}
    imports: dict[str, str] = field(default_factory=dict)  # alias -> import path
    registered: list[str] = field(default_factory=list)  # kinds in AddKnownTypes
    unreadable: dict[str, str] = field(default_factory=dict)  # struct -> why our reader cannot take it


_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"(?m)^\s*//.*$|\s+//[^`\n]*$")
_STRUCT = re.compile(r"(?ms)^type\s+(\w+)\s+struct\s*\{\n(.*?)^\}")
_NAMED = re.compile(r"(?m)^type\s+(\w+)\s+(\*?[\w.\[\]]+)\s*$")
_IMPORT = re.compile(r'(?m)^\s*(?:(\w+)\s+)?"([\w./-]+)"\s*$')
_FIELD = re.compile(r"^(?:(\w+)\s+)?(\*?(?:\[\]|map\[\w+\])*\*?[\w.]+)\s*(?:`([^`]*)`)?$")
_JSON_TAG = re.compile(r'json:"([^"]*)"')
_REGISTERED = re.compile(r"&(\w+)\{\}")


def parse_go(text: str, package_path: str = "") -> GoPackage:
    """The struct and named types of one Go file, enough of the language for API type definitions."""
    text = _BLOCK_COMMENT.sub("", text)
    text = _LINE_COMMENT.sub("", text)
    pkg = GoPackage()
    import_block = re.search(r"(?ms)^import\s*\((.*?)^\)", text)
    lines = import_block.group(1) if import_block else ""
    single = re.findall(r'(?m)^import\s+((?:\w+\s+)?"[^"]+")\s*$', text)
    for match in _IMPORT.finditer(lines + "\n" + "\n".join(single)):
        alias, path = match.group(1), match.group(2)
        pkg.imports[alias or path.rsplit("/", 1)[-1]] = path
    for match in _STRUCT.finditer(text):
        try:
            pkg.structs[match.group(1)] = [f for f in (_field(line) for line in match.group(2).splitlines()) if f]
        except ValueError as exc:
            pkg.unreadable[match.group(1)] = str(exc)  # fails only if a config type reaches it
    for match in _NAMED.finditer(text):
        if match.group(2) != "struct":
            pkg.named[match.group(1)] = match.group(2)
    add_known = re.search(r"(?s)AddKnownTypes\((.*?)\)", text)
    if add_known:
        pkg.registered = _REGISTERED.findall(add_known.group(1))
    return pkg


def _field(line: str) -> GoField | None:
    line = line.strip()
    if not line:
        return None
    match = _FIELD.match(line)
    if match is None:
        raise ValueError(f"cannot read Go field line {line!r}")
    go_name, go_type, tag = match.group(1) or "", match.group(2), match.group(3) or ""
    json_tag = _JSON_TAG.search(tag)
    name = json_tag.group(1).split(",")[0] if json_tag else None
    options = json_tag.group(1).split(",")[1:] if json_tag else []
    if name == "-":
        return GoField(go_name, go_type, None)
    if not go_name:  # embedded
        return GoField("", go_type, "", inline=True)
    if json_tag is None:
        name = go_name  # encoding/json's default
    return GoField(go_name, go_type, name or go_name, inline="inline" in options)


# ---- resolving to our vocabulary --------------------------------------------------------------------------------

Reader = Callable[[str, str, str], str | None]  # (repository, branch, path) -> file text or None
Lister = Callable[[str, str, str], list[str]]  # (repository, branch, folder) -> the names of its files


class Resolver:
    """Turns the Go types reachable from the roots of one apiVersion into our type descriptions."""

    def __init__(self, local: GoPackage, load: Callable[[str], GoPackage]) -> None:
        self.local = local
        self.load = load
        self.types: dict[str, dict[str, str]] = {}

    def struct_fields(self, pkg: GoPackage, name: str) -> dict[str, str]:
        fields: dict[str, str] = {}
        for item in pkg.structs[name]:
            if item.json_name is None:
                continue
            if item.inline or not item.go_name:
                fields.update(self.inline_fields(pkg, item.go_type))
                continue
            fields[item.json_name] = self.expr(pkg, item.go_type)
        return fields

    def inline_fields(self, pkg: GoPackage, go_type: str) -> dict[str, str]:
        go_type = go_type.lstrip("*")
        if go_type == "metav1.TypeMeta":
            return {"apiVersion": "string", "kind": "string"}
        target, name = self.locate(pkg, go_type)
        return self.struct_fields(target, name)

    def locate(self, pkg: GoPackage, go_type: str) -> tuple[GoPackage, str]:
        if "." in go_type:
            alias, name = go_type.split(".", 1)
            return self.load(pkg.imports[alias]), name
        return pkg, go_type

    def expr(self, pkg: GoPackage, go_type: str) -> str:
        go_type = go_type.lstrip("*")
        if go_type == "[]byte":
            return "bytes"
        if go_type.startswith("[]"):
            return "[]" + self.expr(pkg, go_type[2:])
        if go_type.startswith("map["):
            key, _, value = go_type[4:].partition("]")
            return f"map[{self.expr(pkg, key)}]{self.expr(pkg, value)}"
        if go_type in GO_SCALARS:
            return GO_SCALARS[go_type]
        if go_type in WELL_KNOWN:
            return WELL_KNOWN[go_type]
        target, name = self.locate(pkg, go_type)
        if name in target.named:
            return self.expr(target, target.named[name])
        if name in target.unreadable:
            raise ValueError(f"Go type {go_type}: {target.unreadable[name]}")
        if name not in target.structs:
            raise KeyError(f"Go type {go_type} not found")
        if name not in self.types:
            self.types[name] = {}  # placeholder against cycles
            self.types[name] = self.struct_fields(target, name)
        return name


def extract_minor(minor: str, read: Reader) -> dict[str, Any]:
    """For one minor: {apiVersion: {"types": {type: {field: type}}, "kinds": [registered kinds]}}."""
    branch = f"release-{minor}"
    cache: dict[str, GoPackage] = {}

    def load(import_path: str) -> GoPackage:
        if import_path not in cache:
            repo, folder = PACKAGES[import_path]
            merged = GoPackage()
            for name in PACKAGE_FILES[import_path]:
                text = read(repo, branch, f"{folder}/{name}")
                if text is None:
                    continue
                part = parse_go(text, import_path)
                merged.structs.update(part.structs)
                merged.named.update(part.named)
                merged.imports.update(part.imports)
                merged.unreadable.update(part.unreadable)
            cache[import_path] = merged
        return cache[import_path]

    found: dict[str, Any] = {}
    for version in ("v1alpha1", "v1alpha2", "v1beta1", "v1beta2", "v1beta3", "v1"):
        local = GoPackage()
        for name in SCHEDULER_FILES:
            text = read(SCHEDULER_REPO, branch, f"config/{version}/{name}")
            if text is None:
                continue
            part = parse_go(text)
            local.structs.update(part.structs)
            local.named.update(part.named)
            local.imports.update(part.imports)
            local.registered += part.registered
        if ROOT_TYPE not in local.structs:
            continue
        resolver = Resolver(local, load)
        resolver.expr(local, ROOT_TYPE)
        kinds = [kind for kind in local.registered if kind != ROOT_TYPE]
        for kind in kinds:
            resolver.expr(local, kind)
        found[f"{GROUP}/{version}"] = {"types": resolver.types, "kinds": kinds}
    return found


def git_reader(mirror_root: Path) -> Reader:
    def read(repo: str, branch: str, path: str) -> str | None:
        git_dir = mirror_root / repo / "repo"
        done = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"refs/heads/{branch}:{path}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout if done.returncode == 0 else None

    return read


def pinned_releases(folder: Path = REALK8S) -> dict[str, Path]:
    """minor -> the ``tools/realk8s/v1.N.P`` module that builds its binaries (the newest patch when several)."""
    found: dict[str, tuple[tuple[int, ...], Path]] = {}
    for entry in folder.glob("v1.*"):
        if (entry / "go.mod").is_file():
            numbers = tuple(int(x) for x in entry.name[1:].split("."))
            minor = f"{numbers[0]}.{numbers[1]}"
            if minor not in found or found[minor][0] < numbers:
                found[minor] = (numbers, entry)
    return {minor: path for minor, (_, path) in sorted(found.items(), key=lambda kv: _key(kv[0]))}


def module_reader(pins: dict[str, Path]) -> tuple[Reader, Lister]:
    """Files of the modules a pinned release builds from, fetched by ``go mod download`` in its folder: the
    module proxy only, checked against the committed go.sum (the environment of tools/realk8s/build.py)."""
    env = dict(os.environ, GOPROXY="https://proxy.golang.org", GOSUMDB="off", GOTOOLCHAIN="local",
               GOFLAGS="-mod=readonly")
    folders: dict[tuple[str, str], Path] = {}

    def module_dir(branch: str, repo: str) -> Path | None:
        minor = branch.removeprefix("release-")
        if minor not in pins or repo not in MODULES:
            return None
        module = MODULES[repo]
        if (minor, module) not in folders:
            done = subprocess.run(["go", "mod", "download", "-json", module], cwd=pins[minor], env=env,
                                  capture_output=True, text=True, check=False)
            info = json.loads(done.stdout or "{}")
            if done.returncode != 0 or "Dir" not in info:
                raise RuntimeError(f"go mod download {module} in {pins[minor]}: {info.get('Error') or done.stderr}")
            folders[(minor, module)] = Path(info["Dir"])
        return folders[(minor, module)]

    def read(repo: str, branch: str, path: str) -> str | None:
        root = module_dir(branch, repo)
        file = root / path if root is not None else None
        return file.read_text(encoding="utf-8") if file is not None and file.is_file() else None

    def listing(repo: str, branch: str, folder: str) -> list[str]:
        root = module_dir(branch, repo)
        return sorted(p.name for p in (root / folder).iterdir() if p.is_file()) if root is not None else []

    return read, listing


def git_lister(mirror_root: Path) -> Lister:
    def listing(repo: str, branch: str, folder: str) -> list[str]:
        done = subprocess.run(["git", f"--git-dir={mirror_root / repo / 'repo'}", "ls-tree", "--name-only",
                               f"refs/heads/{branch}:{folder}"], capture_output=True, text=True, check=False)
        return done.stdout.split() if done.returncode == 0 else []

    return listing


REGISTRY_GO = "pkg/scheduler/framework/plugins/registry.go"
NAMES_GO = "pkg/scheduler/framework/plugins/names/names.go"
_REGISTRY_KEY = re.compile(r"(?m)^\s*(\w+)\.(\w+):")
_NAME_VIA_NAMES = re.compile(r"(?m)^\s*(?:const\s+)?(\w+)\s*=\s*names\.(\w+)\s*$")
_NAME_STRING = re.compile(r'(?m)^\s*(?:const\s+)?(\w+)\s*=\s*"(\w+)"\s*$')


def registry_names(minor: str, read: Reader, listing: Lister) -> list[str] | None:
    """The plugin names ``NewInTreeRegistry`` of this minor registers (what an upstream image can build: any other
    name "does not exist"), each key resolved through its package's constant; None without k8s.io/kubernetes."""
    branch = f"release-{minor}"
    text = read(KUBERNETES_REPO, branch, REGISTRY_GO)
    if text is None:
        return None
    body = re.search(r"(?s)func NewInTreeRegistry\(\).*?\n\}", text)
    if body is None:
        raise ValueError(f"{minor}: {REGISTRY_GO} has no NewInTreeRegistry")
    imports = parse_go(text).imports
    names = dict(_NAME_STRING.findall(read(KUBERNETES_REPO, branch, NAMES_GO) or ""))
    found = []
    for alias, const in _REGISTRY_KEY.findall(body.group(0)):
        folder = imports[alias].removeprefix("k8s.io/kubernetes/")
        consts: dict[str, str] = {}
        for name in listing(KUBERNETES_REPO, branch, folder):
            if name.endswith(".go") and not name.endswith("_test.go"):
                source = read(KUBERNETES_REPO, branch, f"{folder}/{name}") or ""
                consts.update(_NAME_STRING.findall(source))  # older packages spell the name out
                consts.update({key: names[value] for key, value in _NAME_VIA_NAMES.findall(source) if value in names})
        if const not in consts:
            raise ValueError(f"{minor}: registry key {alias}.{const}: no constant in {folder}")
        found.append(consts[const])
    return sorted(found)


_EXTENSION_POINT = re.compile(r"\{&plugins\.(\w+),\s*&f\.(\w+)\}")
_PLUGIN_LIST = re.compile(r"(?m)^\s*(\w+)\s+\[\](?:\w+\.)?(\w+)\s*$")


def framework_points(text: str) -> list[tuple[str, str]]:
    """(Go field of ``Plugins``, Go interface) for every extension point ``getExtensionPoints`` lists, in its
    order: the points ``NewFramework`` builds and checks every enabled plugin at ("%s %q does not exist")."""
    body = re.search(r"(?s)func \(f \*frameworkImpl\) getExtensionPoints\(.*?\n\}", text)
    if body is None:
        raise ValueError(f"{FRAMEWORK}: no getExtensionPoints")
    lists = dict(_PLUGIN_LIST.findall(text))
    return [(field, lists[target]) for field, target in _EXTENSION_POINT.findall(body.group(0))]


def check_points(minor: str, read: Reader, extracted: dict[str, Any]) -> None:
    """Fail unless the framework of this minor builds exactly the points of its generated ``Plugins`` type (but
    ``multiPoint``), each named ``<Field>Plugin``: the start-up checks derive the points from the types."""
    text = read(KUBERNETES_REPO, f"release-{minor}", FRAMEWORK)
    if text is None:
        return  # no k8s.io/kubernetes for this minor (git mirrors of the staging repositories only)
    newest = next(v for v in ("v1", "v1beta3", "v1beta2", "v1beta1") if f"{GROUP}/{v}" in extracted)
    go_names = {f.go_name: f.json_name for f in parse_go(read(SCHEDULER_REPO, f"release-{minor}",
                                                              f"config/{newest}/types.go") or "").structs["Plugins"]}
    built = {go_names[field]: interface for field, interface in framework_points(text)}
    plugins = extracted[f"{GROUP}/{newest}"]["types"]["Plugins"]
    expected = {name: name[0].upper() + name[1:] + "Plugin" for name in plugins if name != "multiPoint"}
    if built != expected:
        raise ValueError(f"{minor}: the framework builds {built}, the Plugins type gives {expected}")


# ---- facts: the extracted data, in ranges of minors -------------------------------------------------------------


def _ranges(present: Iterable[tuple[str, str]]) -> list[list[str]]:
    """[(minor, value)] in minor order -> [[value, first, last], ...] over runs of consecutive minors."""
    runs: list[list[str]] = []
    previous: str | None = None
    for minor, value in present:
        if runs and runs[-1][0] == value and previous is not None and _next(previous) == minor:
            runs[-1][2] = minor
        else:
            runs.append([value, minor, minor])
        previous = minor
    return runs


def _next(minor: str) -> str:
    major, number = minor.split(".")
    return f"{major}.{int(number) + 1}"


def _expand(first: str, last: str) -> list[str]:
    return [m for m in MINORS if _key(first) <= _key(m) <= _key(last)]


def _key(minor: str) -> tuple[int, int]:
    major, number = minor.split(".")
    return int(major), int(number)


def to_facts(per_minor: dict[str, dict[str, Any]], registries: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Fold per-minor extractions (and the in-tree registry of the minors it was read for) into ranges: small,
    diffable, and the only upstream-derived file we commit."""
    api_versions: dict[str, Any] = {}
    for minor in MINORS:
        for api_version, content in per_minor.get(minor, {}).items():
            entry = api_versions.setdefault(api_version, {"minors": [], "kinds": {}, "types": {}})
            entry["minors"].append(minor)
            for kind in content["kinds"]:
                entry["kinds"].setdefault(kind, []).append(minor)
            for type_name, fields in content["types"].items():
                type_entry = entry["types"].setdefault(type_name, {})
                for name, expr in fields.items():
                    type_entry.setdefault(name, []).append((minor, expr))
    facts: dict[str, Any] = {
        "about": "Facts extracted from the upstream Go types by tools/gen_schedconfig_schemas.py extract; "
        "each field lists [type, first minor, last minor] runs. Regenerate, do not edit.",
        "minors": MINORS,
        "apiVersions": {},
    }
    for api_version, entry in sorted(api_versions.items()):
        facts["apiVersions"][api_version] = {
            "minors": [[entry["minors"][0], entry["minors"][-1]]],
            "kinds": {k: [r[1:] for r in _ranges((m, "") for m in v)] for k, v in sorted(entry["kinds"].items())},
            "types": {
                type_name: {name: _ranges(runs) for name, runs in fields.items()}
                for type_name, fields in sorted(entry["types"].items())
            },
        }
    if registries:
        plugins: dict[str, list[str]] = {}
        for minor in MINORS:
            for name in registries.get(minor, ()):
                plugins.setdefault(name, []).append(minor)
        facts["registry"] = {
            "minors": [r[1:] for r in _ranges((m, "") for m in MINORS if m in registries)],
            "plugins": {name: [r[1:] for r in _ranges((m, "") for m in found)]
                        for name, found in sorted(plugins.items())},
        }
    return facts


def from_facts(facts: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The inverse of ``to_facts``: per minor what ``extract_minor`` and ``registry_names`` gave, so that some
    minors can be extracted again (``extract --minor``) and the others kept."""
    per_minor: dict[str, dict[str, Any]] = {}
    for minor in facts["minors"]:
        for api_version, entry in facts["apiVersions"].items():
            if not _in(entry["minors"], minor):
                continue
            types = {type_name: {name: expr for name, runs in fields.items() if (expr := _at(runs, minor)) is not None}
                     for type_name, fields in entry["types"].items()}
            kinds = [kind for kind, ranges in entry["kinds"].items() if _in(ranges, minor)]
            per_minor.setdefault(minor, {})[api_version] = {
                "types": {name: fields for name, fields in types.items() if fields}, "kinds": kinds}
    return per_minor, registries_at(facts)


def registries_at(facts: dict[str, Any]) -> dict[str, list[str]]:
    """minor -> its in-tree plugin names, for the minors whose registry was read."""
    registry = facts.get("registry", {"minors": [], "plugins": {}})
    return {minor: [name for name, ranges in registry["plugins"].items() if _in(ranges, minor)]
            for minor in facts["minors"] if _in(registry["minors"], minor)}


# ---- generate: one schema per minor -----------------------------------------------------------------------------


def _at(runs: list[list[str]], minor: str) -> str | None:
    for value, first, last in runs:
        if minor in _expand(first, last):
            return value
    return None


def _in(ranges: list[list[str]], minor: str) -> bool:
    return any(minor in _expand(first, last) for first, last in ranges)


def generate(facts: dict[str, Any]) -> dict[str, str]:
    """{file name: JSON text} for every minor in the facts."""
    out: dict[str, str] = {}
    registries = registries_at(facts)
    for minor in facts["minors"]:
        api_versions: dict[str, Any] = {}
        for api_version, entry in facts["apiVersions"].items():
            if not _in(entry["minors"], minor):
                continue
            types: dict[str, Any] = {}
            for type_name, fields in entry["types"].items():
                present = {name: _at(runs, minor) for name, runs in fields.items()}
                kept = {name: expr for name, expr in present.items() if expr is not None}
                if not kept:
                    continue
                spec: dict[str, Any] = {"fields": kept}
                required = [name for name in REQUIRED.get(type_name, []) if name in kept]
                if required:
                    spec["required"] = required
                types[type_name] = spec
            kinds = [kind for kind, ranges in entry["kinds"].items() if _in(ranges, minor)]
            api_versions[api_version] = {
                "root": ROOT_TYPE,
                "pluginArgs": {kind.removesuffix("Args"): kind for kind in kinds if kind.endswith("Args")},
                "types": types,
            }
        document = {
            "generatedBy": "tools/gen_schedconfig_schemas.py generate (from tools/schedconfig-upstream.json); "
            "do not edit",
            "kubeScheduler": minor,
            "apiVersions": api_versions,
        }
        if minor in registries:  # read from k8s.io/kubernetes (extract --modules): the in-tree plugin names
            document["registry"] = registries[minor]
        out[f"{OUT_PREFIX}{minor}.json"] = json.dumps(document, indent=1, sort_keys=False) + "\n"
    return out


def write_generated(files: dict[str, str], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out_dir / name).write_text(text, encoding="utf-8")


def differences(files: dict[str, str], out_dir: Path) -> list[str]:
    """Names that differ between ``files`` and ``out_dir`` (missing, changed or extra)."""
    found = {p.name: p.read_text(encoding="utf-8") for p in out_dir.glob(f"{OUT_PREFIX}*.json")}
    names = sorted(set(found) | set(files))
    return [name for name in names if found.get(name) != files.get(name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    extract = sub.add_parser("extract", help="read upstream Go types from git mirrors into the facts file")
    source = extract.add_mutually_exclusive_group(required=True)
    source.add_argument("--mirror-root", type=Path, help="folder with <owner>+<name>/repo git dirs")
    source.add_argument("--modules", action="store_true",
                        help="the modules of the releases pinned in tools/realk8s (Go module proxy)")
    extract.add_argument("--minor", action="append", help="only these minors (1.N); the others keep their facts")
    sub.add_parser("generate", help="write the per-minor schemas from the facts file")
    sub.add_parser("check", help="exit 1 when the committed schemas are not what the facts generate")
    args = parser.parse_args(argv)
    if args.command == "extract":
        pins = pinned_releases()
        read, listing = module_reader(pins) if args.modules else (git_reader(args.mirror_root),
                                                                   git_lister(args.mirror_root))
        minors = args.minor or (list(pins) if args.modules else MINORS)
        unknown = sorted(set(minors) - set(MINORS) | (set(minors) - set(pins) if args.modules else set()))
        if unknown:
            parser.error(f"no such minor (or none pinned in tools/realk8s): {', '.join(unknown)}")
        kept = json.loads(FACTS.read_text(encoding="utf-8")) if FACTS.is_file() else {"minors": [], "apiVersions": {}}
        per_minor, registries = from_facts(kept)
        for minor in minors:
            per_minor[minor] = extract_minor(minor, read)
            check_points(minor, read, per_minor[minor])
            if (names := registry_names(minor, read, listing)) is not None:
                registries[minor] = names
        FACTS.write_text(json.dumps(to_facts(per_minor, registries), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {FACTS.relative_to(ROOT)}")
        return 0
    files = generate(json.loads(FACTS.read_text(encoding="utf-8")))
    if args.command == "generate":
        write_generated(files, OUT_DIR)
        print(f"wrote {len(files)} files to {OUT_DIR.relative_to(ROOT)}")
        return 0
    changed = differences(files, OUT_DIR)
    for name in changed:
        print(f"{OUT_DIR.relative_to(ROOT)}/{name}: differs from what the facts generate", file=sys.stderr)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
