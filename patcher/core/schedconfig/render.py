"""Render the files the scheduler reads, for its apiVersion, as exact and reproducible bytes.

From version-neutral extenders we write the whole config; a complete config the user wrote is used as is, with
only the deprecated-flag settings it leaves unset filled in. Either way the result gets a header naming its
source and the scheduler version, is validated again from its own bytes, and is named by its content.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from patcher.core.schedconfig.extenders import Extender, from_canonical
from patcher.core.schedconfig.flags import Carried
from patcher.core.schedconfig.rules import LEADER_ELECTION_FLAGS, flags_apply, override_notes
from patcher.core.schedconfig.schema import CONFIG_KIND, Schema
from patcher.core.schedconfig.source import SourceFile
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import (
    HEADER_PREFIX,
    dump,
    load_single,
    redump,
    strip_header,
    to_commented,
    to_plain,
)


@dataclass
class Output:
    """Files for the host config folder; ``main`` is the one ``--config`` points at."""

    files: dict[str, bytes]
    main: str
    api_version: str
    notes: list[str]


def header(source: str, version: KubeVersion, api_version: str) -> str:
    """The first line of every file we render: where it came from and for which scheduler."""
    return f"{HEADER_PREFIX} from {source} for kube-scheduler {version.short} ({api_version}); do not edit.\n"


def set_path(
    doc: CommentedMap, carried: Carried, *, fill_only: bool, notes: list[str], source: str, added: list[Any],
    flag_wins: bool = False,
) -> bool:
    """Write one carried flag value into ``doc``; with ``fill_only`` only where the config leaves it unset.

    ``added``: the lists (``profiles``) that this render's earlier flags put in ``doc``; a later flag goes into
    them, never into a new one in their place. ``flag_wins``: the scheduler applies this flag over the config
    itself (``--leader-elect*`` from 1.23), so a differing config value is reported by the output check as
    overridden, not as the flag being unused."""
    node: Any = doc
    parts = carried.path
    for depth, part in enumerate(parts[:-1]):
        following = parts[depth + 1]
        if isinstance(part, int):
            node = node[part]
            continue
        current = node.get(part)
        if isinstance(following, int) and not any(current is seq for seq in added):
            if current and fill_only:  # an existing list (profiles) is the user's: never reshape it
                notes.append(f"{source} has its own {part}; {carried.flag} is not carried into them")
                return False
            node[part] = CommentedSeq([CommentedMap()])
            added.append(node[part])
        elif current is None:  # a config's mapping here is already validated as one
            node[part] = CommentedMap()
        node = node[part]
    leaf = parts[-1]
    existing = node.get(leaf)
    if existing is not None and fill_only:
        if to_plain(existing) != carried.value and not flag_wins:
            notes.append(
                f"{source} sets {carried.field_text}={to_plain(existing)!r}; the manifest's "
                f"{carried.flag}={carried.value!r} is not used"
            )
        return False
    node[leaf] = to_commented(carried.value)
    notes.append(f"carried {carried.flag} into {carried.field_text}")
    return True


def finish(text: str, version: KubeVersion, notes: list[str]) -> Output:
    """Name the file by its content and validate its own bytes once more, as the scheduler will read them; the
    notes gain the manifest flags the scheduler applies over it."""
    main_bytes = text.encode("utf-8")
    name = f"config-{hashlib.sha256(main_bytes).hexdigest()[:12]}.yaml"
    data = load_single(text, name)
    schema = validate_document(data, name, version=version)
    notes = notes + override_notes(to_plain(data), version.key, version.launch)
    return Output(files={name: main_bytes}, main=name, api_version=schema.api_version, notes=notes)


def render_extenders(
    extenders: list[Extender],
    *,
    schema: Schema,
    version: KubeVersion,
    carried: list[Carried],
    source: str,
) -> Output:
    """The whole config for ``schema`` from version-neutral extenders and the carried flag values."""
    doc = CommentedMap()
    doc["apiVersion"] = schema.api_version
    doc["kind"] = CONFIG_KIND
    notes: list[str] = []
    added: list[Any] = []
    for item in carried:
        set_path(doc, item, fill_only=False, notes=notes, source=source, added=added)
    doc["extenders"] = to_commented([from_canonical(e, schema) for e in extenders])
    text = header(source, version, schema.api_version) + dump(doc)
    return finish(text, version, notes)


def render_complete(
    source: SourceFile,
    *,
    version: KubeVersion,
    carry: Callable[[Schema], tuple[list[Carried], list[str]]],
) -> Output:
    """A user-written KubeSchedulerConfiguration, used as is once validated and served-checked.

    Flag settings (``carry``: the carried values for the config's own schema, and notes on what was skipped)
    fill only the fields it leaves unset; the config is parsed once for both.
    """
    text = strip_header(source.text)
    data = load_single(text, source.path)
    schema = validate_document(data, source.path, version=version)
    carried, notes = carry(schema)
    changed = False
    added: list[Any] = []
    for item in carried:
        wins = item.flag[2:] in LEADER_ELECTION_FLAGS and flags_apply(version.key)
        changed |= set_path(data, item, fill_only=True, notes=notes, source=source.name, added=added, flag_wins=wins)
    body = text  # nothing to add: the user's bytes, untouched
    if changed:
        body = redump(data, text)
    newline = "\r\n" if "\r\n" in body else "\n"
    out = header(source.name, version, schema.api_version).replace("\n", newline) + body
    return finish(out, version, notes)

