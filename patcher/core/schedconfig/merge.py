"""Merge our extenders into a config the scheduler already runs with (``--on-foreign-config=merge``).

The foreign file is someone else's: we write a copy that adds our extenders and keeps every other field, profile,
plugin and comment, and point ``--config`` at it. An extender with one of our ``urlPrefix`` values is a stale copy
of ours, replaced where it stood. A merge the scheduler would reject (two binders, a managed resource claimed
twice, an apiVersion it does not serve) is refused.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.extenders import Extender, from_canonical, url_of
from patcher.core.schedconfig.render import Output, finish, header
from patcher.core.schedconfig.rules import extender_problems
from patcher.core.schedconfig.validate import validate_document
from patcher.core.schedconfig.version import KubeVersion
from patcher.core.schedconfig.yamlio import load_single, redump, strip_header, to_commented


def _last_slot(node: Any) -> tuple[Any, Any] | None:
    """The innermost last (container, key) of a node: where ruamel keeps the comment lines that follow it."""
    slot = None
    while isinstance(node, CommentedMap | CommentedSeq) and len(node) > 0:
        key = list(node.keys())[-1] if isinstance(node, CommentedMap) else len(node) - 1
        slot = (node, key)
        node = node[key]
    return slot


def _move_trailing_comment(dropped: Any, onto: Any) -> None:
    """Keep the comment lines that followed a dropped entry: they now follow ``onto``."""
    source, target = _last_slot(dropped), _last_slot(onto)
    if source is None or target is None:
        return
    container, key = source
    slot = container.ca.items.get(key)
    position = 2 if isinstance(container, CommentedMap) else 0  # where ruamel keeps a trailing comment
    if not slot or len(slot) <= position or slot[position] is None:
        return
    token = slot[position]
    slot[position] = None
    t_container, t_key = target
    t_position = 2 if isinstance(t_container, CommentedMap) else 0
    t_slot = t_container.ca.items.setdefault(t_key, [None, None, None, None])
    if t_slot[t_position] is None:
        t_slot[t_position] = token
    else:
        t_slot[t_position].value += token.value.lstrip(" ")


def _merged_extenders(existing: Any, ours: list[dict[str, Any]]) -> tuple[CommentedSeq, list[str], list[str]]:
    """The new extenders list, where each entry came from ("this file"/"ours"), and the stale URLs replaced."""
    our_urls = {url_of(item) for item in ours}
    our_nodes = [to_commented(item) for item in ours]
    old: list[Any] = list(existing) if isinstance(existing, list) else []
    merged = CommentedSeq()
    origins: list[str] = []
    replaced: list[str] = []
    for index, item in enumerate(old):
        url = url_of(item) if isinstance(item, dict) else ""
        if url and url in our_urls:
            if not replaced:  # ours go where the first stale copy stood
                merged.extend(our_nodes)
                origins.extend("ours" for _ in our_nodes)
            replaced.append(url)
            _move_trailing_comment(item, merged[-1])
            continue
        if isinstance(existing, CommentedSeq) and index in existing.ca.items:
            merged.ca.items[len(merged)] = existing.ca.items[index]
        merged.append(item)
        origins.append("this file")
    if not replaced:
        merged.extend(our_nodes)
        origins.extend("ours" for _ in our_nodes)
    if isinstance(existing, CommentedSeq):
        merged.ca.comment = existing.ca.comment
        merged.ca.end = existing.ca.end
        if existing.fa.flow_style():
            merged.fa.set_flow_style()
    return merged, origins, replaced


def merge_foreign(
    *,
    foreign_path: str,
    foreign_text: str,
    extenders: list[Extender],
    source: str,
    source_api_version: str | None,
    version: KubeVersion,
) -> Output:
    """Our own config file: the foreign config plus our extenders."""
    text = strip_header(foreign_text)
    data = load_single(text, foreign_path)
    schema = validate_document(data, foreign_path, version=version)
    if source_api_version is not None and source_api_version != schema.api_version:
        raise ConfigError(
            foreign_path,
            f"apiVersion mismatch: this config is {schema.api_version} but the source {source} is "
            f"{source_api_version}; write the source as a version-neutral extenders.yaml, or use the same "
            "apiVersion",
        )
    notes = [f"merged {len(extenders)} extender(s) from {source} into {foreign_path}"]
    ours = [from_canonical(item, schema) for item in extenders]
    merged, origins, replaced = _merged_extenders(data.get("extenders"), ours)
    problems = extender_problems(merged)  # what the scheduler would refuse in the merged list
    if problems:
        legend = ", ".join(
            f"extenders[{i}] {'from ' + source if origin == 'ours' else 'from this file'}"
            for i, origin in enumerate(origins)
        )
        raise ConfigError(foreign_path, f"cannot merge {source} into this config: {'; '.join(problems)} ({legend})")
    data["extenders"] = merged
    if replaced:
        notes.append(f"replaced stale copies of our extenders: {', '.join(replaced)}")
    body = redump(data, text)
    label = f"{source} merged into {foreign_path}"
    return finish(header(label, version, schema.api_version) + body, version, notes)

