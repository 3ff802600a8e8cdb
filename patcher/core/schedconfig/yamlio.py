"""Reading and writing scheduler configuration YAML without losing what people wrote.

ruamel.yaml's round-trip mode: a foreign config we merge into keeps its comments, key order and quoting, and a
config we render comes out in one fixed layout, so the same input gives the same bytes (and the same content
hash, which is what restarts the scheduler).
"""

from __future__ import annotations

import io
import re
from itertools import dropwhile, pairwise
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from patcher.core.errors import ConfigError
from patcher.core.yamltext import YamlTextError, load_plain_all, yaml11_ambiguous

HEADER_PREFIX = "# Rendered by scheduler-patcher"
_KEY_ONLY = re.compile(r"(?P<indent> *(?:- +)?)[^\s#-][^:#]*:[ \t]*(?:#.*)?$")

# Any text parsed here: a source file is capped at 256 KiB when read (source.py); this also bounds a foreign
# --config read from the node for a merge, and leaves room for the header and carried flags of our output. The
# limits on what a document may hold are yamltext's, the same for every YAML input.
MAX_DOCUMENT_CHARS = 512 * 1024


def _yaml() -> YAML:
    yaml = YAML(typ="rt", pure=True)
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold long strings: a folded URL is still valid but no longer greppable
    return yaml


def load_documents(text: str, path: str) -> list[Any]:
    """Every YAML document in ``text``, round-trip, within the limits (``yamltext``'s, plus a tag JSON cannot hold or
    a number no field can: a Kubernetes decoder reads the config as JSON) and ``MAX_DOCUMENT_CHARS``; anything
    else one ``ConfigError`` line naming ``path``."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise ConfigError(path, f"too large ({len(text)} characters; the limit for a YAML document is "
                          f"{MAX_DOCUMENT_CHARS})")
    try:
        return load_plain_all(text, _yaml(), json_only=True)
    except YamlTextError as exc:
        raise ConfigError(path, str(exc)) from None


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
    return "".join(dropwhile(lambda line: line.startswith(HEADER_PREFIX), text.splitlines(keepends=True)))


def layout(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the author wrote the file, for ruamel to follow.

    ruamel writes one style for the whole file; taking the first nested mapping and the first block list
    under a key keeps a merged file looking like the original (kubeadm's ``2, 2, 0`` when nothing says else).
    """
    mapping: int | None = None
    offset: int | None = None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for line, following in pairwise(lines):
        key = _KEY_ONLY.match(line)
        if key is None:
            continue
        indent = len(key.group("indent"))
        deeper = len(following) - len(following.lstrip(" "))
        if following.lstrip().startswith("- "):
            offset = deeper - indent if offset is None and deeper >= indent else offset
        elif mapping is None and deeper > indent:
            mapping = deeper - indent
        if mapping is not None and offset is not None:
            break
    mapping = mapping or 2
    offset = offset or 0
    return mapping, max(mapping, offset + 2), offset


def dump(data: Any, *, style: tuple[int, int, int] = (2, 2, 0)) -> str:
    """Serialize one document in block style with LF line ends; ``style`` is what ``layout`` returns."""
    yaml = _yaml()
    yaml.indent(mapping=style[0], sequence=style[1], offset=style[2])
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    return buffer.getvalue()


def redump(data: Any, text: str) -> str:
    """``data``, read from ``text`` and edited, serialized in the author's layout; a JSON document (no comments to
    lose) comes out in block style, without JSON's quotes on every key and string."""
    if text.lstrip().startswith("{"):
        data = to_commented(data, plain_strings=True)
    return dump(data, style=layout(text))


def safe_scalar(value: Any) -> Any:
    """Quote strings that an older YAML reader would take for a bool or null."""
    if isinstance(value, str) and yaml11_ambiguous(value):
        return DoubleQuotedScalarString(value)
    return value


def to_commented(value: Any, *, plain_strings: bool = False) -> Any:
    """Build round-trip nodes from data (dicts keep their order), quoting YAML 1.1 look-alikes; with
    ``plain_strings`` keys and strings lose the quoting style they were read with."""
    if isinstance(value, dict):
        node = CommentedMap()
        for key, item in value.items():
            node[str(key) if plain_strings else key] = to_commented(item, plain_strings=plain_strings)
        return node
    if isinstance(value, list):
        return CommentedSeq(to_commented(item, plain_strings=plain_strings) for item in value)
    return safe_scalar(str(value) if plain_strings and isinstance(value, str) else value)


def to_plain(value: Any) -> Any:
    """Plain dicts/lists/scalars from round-trip nodes, for JSON output and comparisons."""
    if isinstance(value, dict):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_plain(item) for item in value]
    kind = next((kind for kind in (bool, int, float, str) if isinstance(value, kind)), None)
    return value if kind is None else kind(value)  # ruamel's ScalarFloat, DoubleQuotedScalarString … as plain
