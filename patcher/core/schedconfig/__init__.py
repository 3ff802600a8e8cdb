"""Scheduler configuration: from the source folder (a ConfigMap mount) to the files the scheduler reads.

The engine hands over what it learned from the manifest (image, flags, a foreign ``--config``) and gets back the
exact bytes to place in the host config folder; everything here is pure except reading the source folder. In
order: the scheduler's version (``version``), the source form (``source``), the manifest's flags (``flags``,
``binary``), then a render for the newest apiVersion the scheduler serves (``render``) or a merge into the config
it already runs with (``merge``); every file is validated strictly before it is returned (``validate``).
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.binary import effective_gates, facts_for, flag_problems, gates_set_to
from patcher.core.schedconfig.extenders import Extender, to_canonical
from patcher.core.schedconfig.flags import carried_settings, parse_flags
from patcher.core.schedconfig.merge import merge_foreign
from patcher.core.schedconfig.render import Output, render_complete, render_extenders
from patcher.core.schedconfig.rules import launch_for
from patcher.core.schedconfig.schema import Schema, target_schema
from patcher.core.schedconfig.source import (
    CONFIG_FILE,
    EXTENDERS_FILE,
    FORM_CONFIG,
    FORM_CSI,
    FORM_EXTENDERS,
    SourceFile,
    SourceForm,
    csi_pick,
    detect_form,
    read_source_file,
)
from patcher.core.schedconfig.validate import (
    raise_problems,
    validate_document,
    validate_extenders_file,
)
from patcher.core.schedconfig.version import KubeVersion, resolve_version
from patcher.core.schedconfig.yamlio import load_single, strip_header


@dataclass(frozen=True)
class ForeignConfig:
    """A ``--config`` that the manifest already carried and that we did not add."""

    container_path: str  # the flag value, a path inside the scheduler container
    node_path: str | None = None  # the same file on the node, mapped through hostPath volumes
    text: str | None = None  # its content, read by the engine under the host root


@dataclass(frozen=True)
class ConfigRequest:
    source_dir: Path  # the ConfigMap mount, local to the agent
    host_config_dir: str  # node path that the scheduler container sees at the same path
    image: str | None = None  # kube-scheduler image from the manifest (version detection)
    kube_version: str | None = None  # explicit override (--kube-version)
    fallback_version: str | None = None  # e.g. the API server's /version, when the image says nothing
    scheduler_flags: tuple[str, ...] = ()  # the scheduler's flags as written in the manifest
    foreign: ForeignConfig | None = None  # set in merge mode only
    manifest: str | None = None  # the manifest file, named in errors about its flags


@dataclass(frozen=True)
class RenderedConfig:
    files: dict[str, bytes]  # file name in the host config folder -> exact content
    main: str  # the file that --config points at
    config_hash: str  # sha256 hex of the main file (which names every other file by its hash)
    form: str  # which source form was used: extenders.yaml, config.yaml or csi-baremetal-operator
    api_version: str
    notes: tuple[str, ...] = field(default=())
    kube_version: str = ""  # the scheduler version rendered for, e.g. "1.29.4"

    @property
    def short_hash(self) -> str:
        return self.config_hash[:12]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Source:
    """What the source folder contributes: extenders (canonical), or without them a complete config to use as is."""

    file: SourceFile
    extenders: list[Extender] | None = None
    api_version: str | None = None  # of the complete config (for the merge's mismatch check)
    notes: list[str] = field(default_factory=list)


def _extenders_of(data: Any, schema: Schema) -> list[Extender]:
    return [to_canonical(item, schema) for item in data.get("extenders") or []]


def _read_source(source_dir: Path, form: SourceForm, version: KubeVersion, merge: bool) -> _Source:
    if form.form == FORM_EXTENDERS:
        file = read_source_file(source_dir, EXTENDERS_FILE)
        data = load_single(file.text, file.path)
        return _Source(file, extenders=_extenders_of(data, validate_extenders_file(data, file.path)))
    name = CONFIG_FILE if form.form == FORM_CONFIG else csi_pick(version.minor)
    if form.form == FORM_CSI and name not in form.present:
        has = ", ".join(sorted(form.present)) or "none of its files"
        raise ConfigError(
            str(source_dir / name),
            f"source file not found: the csi-baremetal-operator layout uses {name} for kube-scheduler {version} "
            f"({version.source}); the folder has {has}",
        )
    complete = read_source_file(source_dir, name)
    found = _Source(complete)
    if merge:  # only the extenders are merged; they must come from a config this scheduler can read
        data = load_single(strip_header(complete.text), complete.path)
        schema = validate_document(data, complete.path, version=version)
        found.api_version = schema.api_version
        found.extenders = _extenders_of(data, schema)
        if not found.extenders:
            raise ConfigError(complete.path, "extenders: nothing to merge, the source config lists no extenders")
        unused = [str(key) for key in data if key not in ("apiVersion", "kind", "extenders")]
        if unused:
            found.notes.append(f"merge takes only the extenders of {complete.name}; not merged: {', '.join(unused)}")
    return found


def build_config(req: ConfigRequest) -> RenderedConfig:
    """Read the source folder and produce the host files for this node's scheduler.

    Every failure is a ``ConfigError`` naming a file and the problem: the agent turns it into ``Failed`` and
    keeps running. The specific checks (limits before parsing, strict types, upstream's rules) give the useful
    messages; the net below exists because a source is written by people and one unforeseen input must never
    crash-loop the agent on every control-plane node at once.
    """
    try:
        return _build(req)
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError) as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise ConfigError(
            str(req.source_dir),
            f"cannot use this source ({type(exc).__name__}: {reason}); nothing was changed — please report this "
            "input to the scheduler-patcher maintainers",
        ) from exc


def _with_flags(version: KubeVersion, flags: dict[str, str | None], req: ConfigRequest) -> KubeVersion:
    """The version with what the manifest's flags add: its gates and leader-election flags. Where the minor's
    binary was built (``binary``), its flags and gates are checked first, as pflag and component-base do before
    the config is read, and the gates are the binary's defaults with the manifest's over them, so a rule gated
    by a default (DynamicResources' timeouts, VolumeBinding's shape) follows that minor."""
    minor = version.minor  # resolve_version takes only 1.x
    raise_problems(req.manifest or "the scheduler's flags", flag_problems(flags, minor))
    launch = launch_for(flags, req.image)
    gates = effective_gates(flags, minor)
    facts = facts_for(minor)
    if gates is None or facts is None:
        # the gates the manifest switches on (``AllAlpha`` names no single gate: gated rules stay on the safe side)
        return replace(version, feature_gates=gates_set_to(flags, True), launch=launch)
    return replace(version, feature_gates=gates, launch=replace(launch, gates_off=frozenset(facts.gates) - gates))


def _build(req: ConfigRequest) -> RenderedConfig:
    if not posixpath.isabs(req.host_config_dir):
        raise ConfigError(req.host_config_dir, "the host config folder must be an absolute node path")
    version = resolve_version(req.image, req.kube_version, req.fallback_version, where=req.manifest)
    flags = parse_flags(req.scheduler_flags)
    version = _with_flags(version, flags, req)
    form = detect_form(req.source_dir)
    foreign = req.foreign if req.foreign is not None and req.foreign.text is not None else None
    source = _read_source(req.source_dir, form, version, merge=foreign is not None)
    notes = [f"kube-scheduler {version} from {version.source}", f"source form: {form.form}"]
    if form.ignored:
        notes.append(f"ignored in the source folder: {', '.join(form.ignored)}")
    notes += source.notes
    out: Output
    if foreign is not None:
        assert foreign.text is not None and source.extenders is not None
        # for its refusal of a legacy Policy flag, in every mode
        carried_settings(flags, target_schema(version), where=req.manifest)
        notes.append(
            "deprecated flags are not carried: the scheduler already ignored them with the existing --config "
            "(--leader-elect* excepted from 1.23: the scheduler applies them over it)"
        )
        out = merge_foreign(
            foreign_path=foreign.node_path or foreign.container_path,
            foreign_text=foreign.text,
            extenders=source.extenders,
            source=source.file.name,
            source_api_version=source.api_version,
            version=version,
        )
    elif source.extenders is not None:
        schema = target_schema(version)
        carried, skipped = carried_settings(flags, schema, where=req.manifest)
        notes += skipped
        out = render_extenders(
            source.extenders,
            schema=schema,
            version=version,
            carried=carried,
            source=source.file.name,
        )
    else:
        out = render_complete(
            source.file,
            version=version,
            carry=lambda schema: carried_settings(flags, schema, where=req.manifest),
        )
    notes += out.notes
    main_bytes = out.files[out.main]
    return RenderedConfig(
        files=dict(sorted(out.files.items())),
        main=out.main,
        config_hash=sha256_hex(main_bytes),
        form=form.form,
        api_version=out.api_version,
        notes=tuple(notes),
        kube_version=str(version),
    )
