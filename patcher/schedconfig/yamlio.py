"""Reading and writing scheduler configuration YAML without losing what people wrote.

Everything goes through ruamel.yaml's round-trip mode: a foreign config that we merge into keeps its comments,
key order and quoting, and a config we render ourselves comes out in one fixed layout, so the same input always
gives the same bytes (and therefore the same content hash, which is what restarts the scheduler).
"""

from __future__ import annotations

import io
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from patcher.errors import ConfigError

HEADER_PREFIX = "# Rendered by scheduler-patcher"
# Strings that YAML 1.1 (the go-yaml behind kube-scheduler) reads as booleans or null; ruamel (YAML 1.2) would
# write them unquoted, so a string we emit could reach the scheduler as a bool.
_YAML11_SPECIAL = re.compile(r"(?i)(y|yes|n|no|true|false|on|off|null|~)")
_SEQ_UNDER_KEY = re.compile(r"^(?P<key> *)[^\s#-][^:#]*:[ \t]*(?:#.*)?\r?\n(?P<dash> *)- ", re.MULTILINE)


def _yaml() -> YAML:
    yaml = YAML(typ="rt", pure=True)
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold long strings: a folded URL is still valid but no longer greppable
    yaml.indent(mapping=2, sequence=2, offset=0)
    return yaml


def load_documents(text: str, path: str) -> list[Any]:
    """Parse every YAML document in ``text``; errors name ``path`` and the first line of the parser's reason."""
    try:
        return [doc for doc in _yaml().load_all(text)]
    except YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(path, f"invalid YAML{where}: {first}") from None


def load_single(text: str, path: str) -> Any:
    """Parse a file that must hold exactly one document, as kube-scheduler reads only the first one."""
    docs = [doc for doc in load_documents(text, path) if doc is not None]
    if not docs:
        raise ConfigError(path, "empty file: no YAML document")
    if len(docs) > 1:
        raise ConfigError(
            path,
            f"{len(docs)} YAML documents: kube-scheduler reads only the first and silently ignores the rest; "
            "keep one document per file",
        )
    return docs[0]


def strip_header(text: str) -> str:
    """Drop our own header lines at the top of a file, so re-rendering our output does not stack headers."""
    lines = text.splitlines(keepends=True)
    index = 0
    while index < len(lines) and lines[index].startswith(HEADER_PREFIX):
        index += 1
    return "".join(lines[index:])


def sequence_style(text: str) -> tuple[int, int]:
    """(sequence indent, dash offset) of the first block list under a key: kubeadm style (2, 0) or (4, 2).

    ruamel writes one style for the whole file; picking the one the author used first keeps a merged file
    looking like the original.
    """
    match = _SEQ_UNDER_KEY.search(text)
    if match and len(match.group("dash")) > len(match.group("key")):
        offset = len(match.group("dash")) - len(match.group("key"))
        return (offset + 2, offset)
    return (2, 0)


def dump(data: Any, *, sequence: tuple[int, int] = (2, 0)) -> str:
    """Serialize one document in block style with LF line ends."""
    yaml = _yaml()
    yaml.indent(mapping=2, sequence=sequence[0], offset=sequence[1])
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    return buffer.getvalue()


def to_block_style(node: Any) -> None:
    """Turn flow collections (a JSON file read as YAML) into block style, recursively."""
    if isinstance(node, CommentedMap):
        node.fa.set_block_style()
        for value in node.values():
            to_block_style(value)
    elif isinstance(node, CommentedSeq):
        node.fa.set_block_style()
        for item in node:
            to_block_style(item)


def safe_scalar(value: Any) -> Any:
    """Quote strings that an older YAML reader would take for a bool or null."""
    if isinstance(value, str) and _YAML11_SPECIAL.fullmatch(value):
        return DoubleQuotedScalarString(value)
    return value


def to_commented(value: Any) -> Any:
    """Build round-trip nodes from plain data (dicts keep their order), quoting YAML 1.1 look-alikes."""
    if isinstance(value, dict):
        node = CommentedMap()
        for key, item in value.items():
            node[key] = to_commented(item)
        return node
    if isinstance(value, list):
        return CommentedSeq(to_commented(item) for item in value)
    return safe_scalar(value)


def to_plain(value: Any) -> Any:
    """Plain dicts/lists/scalars from round-trip nodes, for JSON output and comparisons."""
    if isinstance(value, dict):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value
