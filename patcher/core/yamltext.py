"""Surgical edits of YAML text: ruamel.yaml tells where every node sits, we splice lines in and out.

Re-dumping a parsed document loses bytes that kubeadm, RKE2 and people wrote (bare ``-`` items, mixed
indentation, trailing spaces, multi-line scalars, an indented root), so this module never dumps a document.
It composes the text once to learn node positions, turns data-level operations into text edits in the style
of the neighbouring lines, and lets the caller verify the result by parsing it again: the text edit must give
exactly the data edit, or nothing is written.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    NodeEvent,
    ScalarEvent,
)
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.resolver import Resolver

Path: TypeAlias = tuple[str | int, ...]


class YamlTextError(Exception):
    """A problem with the YAML text itself; the caller adds the file name."""


# --------------------------------------------------------------------------------------------------------------
# Parsing


@dataclass(eq=False)
class Document:
    """One parsed YAML document: its text, its plain data and (composed on first use: most reads need only the
    data) its node tree."""

    text: str
    data: Any

    @functools.cached_property
    def root(self) -> Node:
        """The node tree, whose marks are the code-point indices into ``text`` that edits splice at: libyaml's,
        as it reads what the data loader reads (a tab inside a key, which the pure scanner refuses), except where
        its marks are wrong (``_MARKS_DIFFER``) or it is missing: there the pure-Python composer's."""
        composer = _data_loader()
        if composer.Parser.__name__ != "CParser" or _MARKS_DIFFER.search(self.text):
            composer = YAML(typ="safe", pure=True)
        try:
            nodes = [n for n in composer.compose_all(self.text) if n is not None]
        except YAMLError as exc:  # the data loader accepted it: a disagreement between parsers, refuse to edit
            raise YamlTextError(_describe(exc)) from None
        if len(nodes) != 1:
            raise YamlTextError(f"holds {len(nodes)} YAML documents, expected exactly one")
        root: Node = nodes[0]
        return root


# Where libyaml's marks and the pure parser's part: a BOM (libyaml does not count it) and the line breaks
# YAML 1.1 added (NEL, LS, PS), which libyaml and ruamel's scanner place differently.
_MARKS_DIFFER = re.compile("[\ufeff\x85\u2028\u2029]")


class _Resolver12(Resolver):
    """ruamel.yaml's public YAML 1.2 ``Resolver``, built the way ``YAML`` builds its resolver (it passes the
    version, which a YAML 1.2-only resolver has no use for). The C parser cannot read a ``%YAML`` directive,
    so every loader here resolves by 1.2, whichever parser ruamel.yaml picks."""

    def __init__(self, version: Any = None, loader: Any = None, loadumper: Any = None) -> None:
        super().__init__(loader if loader is not None else loadumper)

    @property
    def processing_version(self) -> tuple[int, int]:
        """1.2, the version it resolves by: the float constructor asks, and warns (YAML 1.1) on ``1e3`` otherwise."""
        return (1, 2)


def _data_loader() -> YAML:
    """The loader of plain data: ruamel.yaml's safe loader (libyaml when ruamel.yaml.clib is there), YAML 1.2,
    duplicate keys refused as the API server refuses them. Original and edited text both go through it."""
    y = YAML(typ="safe")
    y.Resolver = _Resolver12
    y.allow_duplicate_keys = False
    return y


def _describe(exc: YAMLError) -> str:
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is not None:
            return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return f"invalid YAML: {problem}"
    first = str(exc).strip().splitlines()
    return "invalid YAML: " + (first[0] if first else type(exc).__name__)


# The limits of every YAML text patcher reads (manifests, scheduler configs, kubeconfigs, the rendered files the
# extender probes read), checked here and only here, on the parser's event stream before any document is built:
# composing recurses (the C composer without a recursion check: deep enough nesting crashes the process), the
# pure-Python composer's time grows with every node, and every later step copies and compares the plain data. A
# manifest nests about 8 levels, a scheduler config about 10 (NodeAffinity args, the deepest upstream type, need
# 9); the largest real ones hold a few hundred nodes.
MAX_DEPTH = 64
MAX_NODES = 5_000  # scalars + collections, aliases counted as the nodes they stand for
MAX_NUMBER_CHARS = 64  # an unquoted number longer than this cannot fit any int64/float64 field
# The tags a Kubernetes YAML decoder knows (sigs.k8s.io/yaml turns YAML into JSON); ruamel would construct
# anything else (!!set, !!omap, !!timestamp, application tags) into objects that JSON has no form for.
JSON_TAGS = frozenset(
    {None, "!", "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
     "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
)
_NUMBERISH = re.compile(r"[-+]?(?:0[xXoObB])?[0-9a-fA-F_.:]+(?:[eE][-+]?[0-9_]+)?")


def check_limits(text: str, *, json_only: bool = False, y: YAML | None = None) -> None:
    """Refuse, in one line naming the line, text nested deeper than ``MAX_DEPTH`` or with more than ``MAX_NODES``
    nodes once aliases are expanded; with ``json_only`` (a config a Kubernetes decoder reads as JSON) also a tag
    JSON has no form for and an unquoted number no field can hold. Nothing is composed: the events come from the
    parser of the loader that builds the data (the data loader's, or for a config the pure round-trip one), so
    that the line and the wording of an error are that loader's.

    Raises ``YamlTextError`` for a limit and the parser's ``YAMLError`` for text that is not YAML, for the caller
    to word as its loader does.
    """
    depth = nodes = 0
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, node count when opened)
    sizes: dict[str, int] = {}  # anchor -> how many nodes it stands for
    y = y or _data_loader()
    with contextlib.closing(y.parse(text)) as events:
        for event in events:
            line = event.start_mark.line + 1 if event.start_mark is not None else 0
            if isinstance(event, DocumentStartEvent):
                depth, stack = 0, []
                continue
            if isinstance(event, AliasEvent):
                nodes += sizes.get(str(event.anchor), 1)
            elif isinstance(event, NodeEvent):
                nodes += 1
                if json_only:
                    _check_json(event, line)
                if isinstance(event, CollectionStartEvent):
                    depth += 1
                    if depth > MAX_DEPTH:
                        raise YamlTextError(f"line {line}: nested more than {MAX_DEPTH} levels deep (the limit)")
                    stack.append((event.anchor, nodes - 1))
                elif isinstance(event, ScalarEvent) and event.anchor is not None:
                    sizes[str(event.anchor)] = 1
            elif isinstance(event, CollectionEndEvent) and stack:
                depth -= 1
                anchor, start = stack.pop()
                if anchor is not None:
                    sizes[str(anchor)] = nodes - start
            if nodes > MAX_NODES:
                raise YamlTextError(
                    f"line {line}: more than {MAX_NODES} YAML nodes (the limit; aliases count as what they repeat)")


def _check_json(event: NodeEvent, line: int) -> None:
    tag = getattr(event, "tag", None)
    tag = None if tag is None else str(getattr(tag, "value", tag))  # a Tag or a string, depending on the event
    if tag not in JSON_TAGS:
        raise YamlTextError(f"line {line}: YAML tag {tag} is not allowed (a Kubernetes config is JSON-compatible "
                            "YAML)")
    if isinstance(event, ScalarEvent) and not event.style and len(event.value) > MAX_NUMBER_CHARS \
            and _NUMBERISH.fullmatch(event.value):
        raise YamlTextError(f"line {line}: number {event.value[:12]}… has {len(event.value)} characters; no "
                            "configuration field holds it")



def _load(text: str, load: Callable[[YAML], Any], y: YAML | None = None, json_only: bool = False) -> Any:
    """``load`` with ``y`` (the data loader unless given), within the limits: the one bounded YAML loader of every
    input. Whatever ruamel.yaml raises becomes one line."""
    y = y or _data_loader()
    try:
        check_limits(text, json_only=json_only, y=y)
        return load(y)
    except YAMLError as exc:
        raise YamlTextError(_describe(exc)) from None
    except TypeError as exc:
        # ruamel.yaml turns a sequence key into a tuple, which passes its hashability check, and hashing it fails
        # when it holds a mapping or a sequence (``? [{a: 1}]``): a TypeError, not its own error.
        raise YamlTextError(f"found unhashable key ({exc})") from None
    except (ValueError, OverflowError) as exc:
        raise YamlTextError(f"invalid YAML: {exc}".splitlines()[0][:200]) from None
    except RecursionError:
        raise YamlTextError(f"nested too deep (more than {MAX_DEPTH} levels)") from None


def load_plain_all(text: str, y: YAML | None = None, *, json_only: bool = False) -> list[Any]:
    """Every document of ``text`` by ``y`` (plain data by the data loader unless given), within the limits;
    ``YamlTextError`` with a one-line reason otherwise (the caller names the file)."""
    return list(_load(text, lambda y: list(y.load_all(text)), y, json_only))


def parse(text: str) -> Document:
    """Parse exactly one YAML document. Raises YamlTextError with a one-line reason.

    Callers must treat the returned data as read-only: an edit computes new data (``apply_data``)."""
    docs = [d for d in load_plain_all(text) if d is not None]
    if len(docs) > 1:
        raise YamlTextError(f"holds {len(docs)} YAML documents, expected exactly one")
    if not docs:
        raise YamlTextError("holds no YAML document")
    return Document(text=text, data=docs[0])


def load_data(text: str) -> Any:
    """Plain data of a single-document text (also used to verify an edit)."""
    return _load(text, lambda y: y.load(text))


# --------------------------------------------------------------------------------------------------------------
# Navigation


def map_lookup(node: Node, key: str) -> tuple[ScalarNode, Node] | None:
    entries = node.value if isinstance(node, MappingNode) else []
    return next(((k, v) for k, v in entries if isinstance(k, ScalarNode) and k.value == key), None)


def node_at(root: Node, path: Path) -> Node | None:
    node: Node | None = root
    for step in path:
        if node is None:
            return None
        if isinstance(step, int):
            if not isinstance(node, SequenceNode) or not 0 <= step < len(node.value):
                return None
            node = node.value[step]
        else:
            found = map_lookup(node, step)
            node = found[1] if found else None
    return node


def quote_style(node: Node) -> str | None:
    """The quotes of a scalar as written ('"' or "'"), None for plain or block style."""
    style = getattr(node, "style", None)
    return style if style in ('"', "'") else None


def source(text: str, node: Node) -> str:
    """The text of ``node`` as written."""
    return text[int(node.start_mark.index): int(node.end_mark.index)]


def _is_empty_scalar(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.value == "" and not node.style  # plain: None or "" (libyaml)


# --------------------------------------------------------------------------------------------------------------
# Positions in the text


def eol(text: str, pos: int) -> int:
    """Index of the line break that ends the line holding ``pos`` (``len(text)`` on a last line without one)."""
    nl = text.find("\n", pos)
    if nl < 0:
        return len(text)
    return nl - 1 if nl > 0 and text[nl - 1] == "\r" else nl


def line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def column(text: str, pos: int) -> int:
    return pos - line_start(text, pos)


def newline_at(text: str, pos: int) -> str:
    """The line break used where a new line is inserted at ``pos`` (a line end), or the file's dominant one."""
    if text.startswith("\r\n", pos):
        return "\r\n"
    if text.startswith("\n", pos):
        return "\n"
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf * 2 >= text.count("\n") else "\n"


def newline_before(text: str, pos: int) -> int:
    """Length of the line break just before ``pos`` (a line start)."""
    if pos >= 2 and text[pos - 2 : pos] == "\r\n":
        return 2
    return 1 if pos >= 1 and text[pos - 1] == "\n" else 0


def content_end(text: str, node: Node) -> int:
    """Index just past the last character that belongs to ``node`` (not past trailing comments or blanks)."""
    if isinstance(node, ScalarNode):
        end = int(node.end_mark.index)
        if node.style in ("|", ">"):
            start = int(node.start_mark.index)
            while end > start and text[end - 1] in " \t\r\n":
                end -= 1
        return end
    if getattr(node, "flow_style", False) or (isinstance(node, (MappingNode, SequenceNode)) and not node.value):
        return int(node.end_mark.index)
    if isinstance(node, MappingNode):
        key, value = node.value[-1]
        return content_end(text, key if _is_empty_scalar(value) else value)
    if isinstance(node, SequenceNode):
        last = node.value[-1]
        return dash_pos(text, last) + 1 if _is_empty_scalar(last) else content_end(text, last)
    raise YamlTextError(f"unexpected node {type(node).__name__}")


_DASH_PREFIX = re.compile(r"^[ \t]*-[ \t]+$")
_BARE_DASH = re.compile(r"^[ \t]*-[ \t]*(#.*)?$")


def dash_pos(text: str, item: Node) -> int:
    """Index of the ``-`` that introduces a block sequence item (on its line, or alone on an earlier line)."""
    start = int(item.start_mark.index)
    ls = line_start(text, start)
    prefix = text[ls:start]
    if _DASH_PREFIX.match(prefix) or (prefix.strip() == "-" and _is_empty_scalar(item)):
        return ls + prefix.rindex("-")
    if prefix.strip():
        raise YamlTextError(f"line {item.start_mark.line + 1}: unsupported sequence item layout")
    pos = ls
    while pos > 0:
        prev = line_start(text, pos - 1)
        line = text[prev : eol(text, prev)]
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            if _BARE_DASH.match(line):
                return prev + line.index("-")
            break
        pos = prev
    raise YamlTextError(f"line {item.start_mark.line + 1}: cannot find the dash of a sequence item")


# --------------------------------------------------------------------------------------------------------------
# Rendering scalars and collections in the style of their neighbours

_PLAIN_SAFE = re.compile(r"^(?:[A-Za-z0-9_./]|-(?=\S))[A-Za-z0-9_./=:@+,-]*$")
_AMBIGUOUS = re.compile(
    r"^(?:[-+]?0x[0-9a-fA-F_]+|[-+]?[0-9][0-9_.:eExXoObB+-]*|\.(?:inf|nan|Inf|NaN|INF|NAN)|~|null|Null|NULL|"
    r"y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"
)


def yaml11_ambiguous(text: str) -> bool:
    """True for a string that a YAML 1.1 reader (go-yaml, behind the kubelet and kube-scheduler) would take as a
    number, bool or null when written plain: such strings must be quoted. The one list, for manifests and
    rendered configs alike."""
    return bool(_AMBIGUOUS.match(text))


def render_scalar(value: Any, style: str | None = None) -> str:
    """A scalar as YAML flow text; ``style`` is the quote style of a sibling ('"', "'" or None for plain)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    s = str(value)
    if style == '"':
        return json.dumps(s, ensure_ascii=False)
    plain_ok = bool(_PLAIN_SAFE.match(s)) and not yaml11_ambiguous(s) and ": " not in s and not s.endswith(":")
    if style is None and plain_ok:
        return s
    return "'" + s.replace("'", "''") + "'"


@dataclass(frozen=True)
class Hints:
    """Style learnt from a sibling: key order and quote style per key path, nested mapping indentation."""

    key_order: dict[Path, list[str]] = field(default_factory=dict)
    quotes: dict[Path, str | None] = field(default_factory=dict)
    nested_indent: int = 2
    flow: bool = False


def learn_hints(node: Node) -> Hints:
    order: dict[Path, list[str]] = {}
    quotes: dict[Path, str | None] = {}

    def walk(n: Node, path: Path) -> None:
        if isinstance(n, MappingNode):
            order[path] = [str(k.value) for k, _ in n.value if isinstance(k, ScalarNode)]
            for k, v in n.value:
                if isinstance(k, ScalarNode):
                    walk(v, (*path, str(k.value)))
        elif isinstance(n, ScalarNode):
            quotes[path] = quote_style(n)

    walk(node, ())
    return Hints(key_order=order, quotes=quotes, nested_indent=nested_indent(node),
                 flow=bool(getattr(node, "flow_style", False)))


def _ordered_keys(mapping: dict[str, Any], hint: list[str] | None) -> list[str]:
    keys = list(mapping)
    if not hint:
        return keys
    rank = {k: i for i, k in enumerate(hint)}
    return sorted(keys, key=lambda k: (rank.get(k, len(rank)), keys.index(k)))


def render_flow(value: Any, hints: Hints, path: Path = ()) -> str:
    if isinstance(value, dict):
        keys = _ordered_keys(value, hints.key_order.get(path))
        inner = ", ".join(f"{render_scalar(k)}: {render_flow(value[k], hints, (*path, k))}" for k in keys)
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(render_flow(v, hints, path) for v in value) + "]"
    return render_scalar(value, hints.quotes.get(path))


def render_block_map(value: dict[str, Any], col: int, hints: Hints, path: Path = ()) -> list[str]:
    """Lines of a block mapping whose keys start at ``col``."""
    lines: list[str] = []
    for k in _ordered_keys(value, hints.key_order.get(path)):
        v = value[k]
        sub = (*path, k)
        if isinstance(v, dict) and v:
            lines.append(" " * col + f"{render_scalar(k)}:")
            lines.extend(render_block_map(v, col + hints.nested_indent, hints, sub))
        else:
            lines.append(" " * col + f"{render_scalar(k)}: {render_flow(v, hints, sub)}")
    return lines


@dataclass(frozen=True)
class SeqStyle:
    """How a block sequence is laid out: dash column offset from its key, gap after the dash, bare dashes."""

    offset: int = 0
    gap: int = 2
    bare: bool = False


def learn_seq_style(text: str, key: ScalarNode | None, seq: Node | None) -> SeqStyle | None:
    if key is None or not isinstance(seq, SequenceNode) or seq.flow_style or not seq.value:
        return None
    dash_col, style = _item_layout(text, seq.value[0])
    return SeqStyle(offset=dash_col - int(key.start_mark.column), gap=style.gap, bare=style.bare)


def render_block_item(value: Any, dash_col: int, style: SeqStyle, hints: Hints) -> list[str]:
    """Lines of one block sequence item whose dash sits at ``dash_col``."""
    dash = " " * dash_col + "-"
    content_col = dash_col + style.gap
    if isinstance(value, dict) and value and not hints.flow:
        body = render_block_map(value, content_col, hints)
        if style.bare:
            return [dash, *body]
        return [dash + " " * (style.gap - 1) + body[0][content_col:], *body[1:]]
    return [dash + " " * (style.gap - 1) + render_flow(value, hints)]


# --------------------------------------------------------------------------------------------------------------
# Operations: the same change expressed on data (for verification) and on text (for the write)


@dataclass(frozen=True)
class Append:
    """Append ``value`` to the sequence at ``path``; create it as ``path[-1]`` in its parent when absent."""

    path: Path
    value: Any
    hints: Hints | None = None  # style of a sibling item, when the sequence is new or empty
    seq_style: SeqStyle | None = None


@dataclass(frozen=True)
class SetKey:
    """Add ``key: value`` to the mapping at ``path``; create the mapping as ``path[-1]`` when absent."""

    path: Path
    key: str
    value: Any
    hints: Hints | None = None


@dataclass(frozen=True)
class Replace:
    """Replace the scalar at ``path`` by ``raw`` (YAML flow text) whose value is ``value``."""

    path: Path
    value: Any
    raw: str


@dataclass(frozen=True)
class Remove:
    """Remove the sequence item or mapping key that ``path`` names."""

    path: Path


Op: TypeAlias = Append | SetKey | Replace | Remove


def _unshared(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def apply_data(data: Any, ops: Sequence[Op]) -> Any:
    """The intended result of ``ops`` on plain data; the text edit must parse to exactly this.

    The copy shares nothing, unlike ``deepcopy``: with YAML aliases (``*ref``) one list can stand in two
    places, and an item appended through one of them must show up as a difference, not in both.
    """
    out = _unshared(data)

    def at(path: Path) -> Any:
        cur = out
        for step in path:
            cur = cur[step]
        return cur

    removals = [op for op in ops if isinstance(op, Remove)]
    for op in ops:
        if isinstance(op, Append):
            parent = at(op.path[:-1])
            if parent.get(op.path[-1]) is None:
                parent[op.path[-1]] = []
            parent[op.path[-1]].append(_unshared(op.value))
        elif isinstance(op, SetKey):
            parent = at(op.path[:-1])
            if parent.get(op.path[-1]) is None:
                parent[op.path[-1]] = {}
            parent[op.path[-1]][op.key] = _unshared(op.value)
        elif isinstance(op, Replace):
            at(op.path[:-1])[op.path[-1]] = _unshared(op.value)
    # Remove from the end so that earlier indices stay valid.
    def order(op: Remove) -> tuple[tuple[int, int, str], ...]:
        return tuple((1, s, "") if isinstance(s, int) else (0, 0, s) for s in op.path)

    for op in sorted(removals, key=order, reverse=True):
        del at(op.path[:-1])[op.path[-1]]
    return out


@dataclass(frozen=True)
class _Edit:
    start: int
    end: int
    new: str
    depth: int  # at one position, deeper edits come first in the text


def _insert_block_lines(text: str, after: int, lines: list[str], depth: int) -> _Edit:
    pos = eol(text, after)
    nl = newline_at(text, pos)
    return _Edit(pos, pos, "".join(nl + line for line in lines), depth)


def _flow_insert(text: str, coll: Node, rendered: str, depth: int) -> _Edit:
    items: list[Node] = [k for k, _ in coll.value] if isinstance(coll, MappingNode) else list(coll.value)
    values: list[Node] = [v for _, v in coll.value] if isinstance(coll, MappingNode) else items
    close = int(coll.end_mark.index) - 1
    if text[close] not in "]}":
        raise YamlTextError(f"line {coll.start_mark.line + 1}: cannot find the end of a flow collection")
    if not coll.value:
        opening = int(coll.start_mark.index)
        return _Edit(opening + 1, opening + 1, rendered, depth)
    last_end = content_end(text, values[-1])
    sep = ", "
    if len(items) >= 2:
        between = text[content_end(text, values[-2]) : int(items[-1].start_mark.index)]
        if "," in between and "#" not in between:
            sep = between
    return _Edit(last_end, last_end, sep + rendered, depth)


def _item_layout(text: str, item: Node) -> tuple[int, SeqStyle]:
    """Dash column and layout of an existing block sequence item, to copy for a new sibling."""
    dash = dash_pos(text, item)
    bare = line_start(text, dash) != line_start(text, int(item.start_mark.index))
    gap = 2 if bare else int(item.start_mark.column) - column(text, dash)
    return column(text, dash), SeqStyle(gap=max(gap, 1), bare=bare)


def _seq_append(text: str, seq: SequenceNode, op: Append, depth: int) -> _Edit:
    hints = learn_hints(seq.value[-1]) if seq.value else op.hints or Hints()
    if seq.flow_style:
        return _flow_insert(text, seq, render_flow(op.value, hints), depth)
    dash_col, style = _item_layout(text, seq.value[-1])
    lines = render_block_item(op.value, dash_col, style, hints)
    return _insert_block_lines(text, content_end(text, seq), lines, depth)


def _map_add(text: str, mapping: MappingNode, key: str, value: Any, lines_for_value: list[str] | None,
             hints: Hints, depth: int) -> _Edit:
    """Add ``key`` to an existing mapping; ``lines_for_value`` renders a block value (without the key line)."""
    if mapping.flow_style:
        rendered = f"{render_scalar(key)}: {render_flow(value, hints)}"
        return _flow_insert(text, mapping, rendered, depth)
    if not mapping.value:
        raise YamlTextError(f"line {mapping.start_mark.line + 1}: empty block mapping")
    col = int(mapping.value[0][0].start_mark.column)
    if lines_for_value is None:
        lines = [" " * col + f"{render_scalar(key)}: {render_flow(value, hints)}"]
    else:
        lines = [" " * col + f"{render_scalar(key)}:", *lines_for_value]
    return _insert_block_lines(text, content_end(text, mapping), lines, depth)


def nested_indent(mapping: Node) -> int:
    """How far this file indents a block mapping below its key (the first one found; 2 if none)."""
    if not isinstance(mapping, MappingNode):
        return 2
    for k, v in mapping.value:
        if isinstance(v, MappingNode) and not v.flow_style and v.value:
            return int(v.value[0][0].start_mark.column) - int(k.start_mark.column)
    return 2


def _removal(text: str, root: Node, path: Path) -> _Edit:
    """Take out a sequence item or a mapping entry, with its line (block) or its separator (flow)."""
    parent = node_at(root, path[:-1])
    step = path[-1]
    if isinstance(parent, SequenceNode) and isinstance(step, int):
        entries: list[tuple[Node, Node]] = [(item, item) for item in parent.value]
        idx = step
    elif isinstance(parent, MappingNode) and isinstance(step, str):
        entries = parent.value
        idx = next(i for i, (k, _) in enumerate(entries) if isinstance(k, ScalarNode) and k.value == step)
    else:
        raise YamlTextError(f"nothing to remove at {format_path(path)}")
    first, last = entries[idx]  # the item twice, or the key and its value
    start = int(first.start_mark.index)
    end = content_end(text, first if _is_empty_scalar(last) else last)
    if parent.flow_style:
        if idx > 0:
            return _Edit(content_end(text, entries[idx - 1][1]), end, "", len(path))
        return _Edit(start, int(entries[1][0].start_mark.index) if len(entries) > 1 else end, "", len(path))
    if isinstance(parent, SequenceNode):
        start = dash_pos(text, first)
    elif text[line_start(text, start) : start].strip():
        raise YamlTextError(f"line {first.start_mark.line + 1}: key {step!r} does not start its line")
    start = line_start(text, start)
    return _Edit(start - newline_before(text, start), eol(text, end), "", len(path))


def format_path(path: Iterable[str | int]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "<root>"


def _text_edit(doc: Document, op: Op) -> _Edit:
    text, root = doc.text, doc.root
    depth = len(op.path)
    if isinstance(op, Remove):
        return _removal(text, root, op.path)
    if isinstance(op, Replace):
        node = node_at(root, op.path)
        if not isinstance(node, ScalarNode):
            raise YamlTextError(f"{format_path(op.path)} is not a scalar")
        return _Edit(int(node.start_mark.index), int(node.end_mark.index), op.raw, depth)
    parent = node_at(root, op.path[:-1])
    if not isinstance(parent, MappingNode):
        raise YamlTextError(f"{format_path(op.path[:-1])} is not a mapping")
    key = str(op.path[-1])
    found = map_lookup(parent, key)
    hints = op.hints or Hints()
    if isinstance(op, Append):
        if found and isinstance(found[1], SequenceNode) and (found[1].value or found[1].flow_style):
            return _seq_append(text, found[1], op, depth)
        if found:
            raise YamlTextError(f"{format_path(op.path)} is not a non-empty sequence")
    elif found:
        if not isinstance(found[1], MappingNode):
            raise YamlTextError(f"{format_path(op.path)} is not a mapping")
        return _map_add(text, found[1], op.key, op.value, None, hints, depth)
    # the sequence or mapping is new: ``key`` of ``parent``
    if parent.flow_style:
        new = [op.value] if isinstance(op, Append) else {op.key: op.value}
        return _map_add(text, parent, key, new, None, hints, depth - 1)
    col = int(parent.value[0][0].start_mark.column) if parent.value else 0
    if isinstance(op, Append):
        style = op.seq_style or SeqStyle()
        lines = render_block_item(op.value, col + style.offset, style, hints)
    else:
        lines = [" " * (col + nested_indent(parent)) + f"{render_scalar(op.key)}: {render_flow(op.value, hints)}"]
    return _map_add(text, parent, key, None, lines, hints, depth - 1)


def edit(doc: Document, ops: Sequence[Op]) -> tuple[str, Any]:
    """Apply ``ops`` to text and data, and prove they agree by parsing the new text."""
    # Spliced into the text: positions come from the original parse, so edits must not overlap.
    edits = sorted((_text_edit(doc, op) for op in ops), key=lambda e: (e.start, -e.depth))
    out: list[str] = []
    pos = 0
    for e in edits:
        if e.start < pos:
            raise YamlTextError("overlapping edits")
        out.append(doc.text[pos : e.start])
        out.append(e.new)
        pos = e.end
    out.append(doc.text[pos:])
    new_text = "".join(out)
    intended = apply_data(doc.data, ops)
    try:
        actual = load_data(new_text)
    except YamlTextError as exc:
        raise YamlTextError(f"the edited text would not parse ({exc}); refusing to write") from None
    if actual != intended:
        raise YamlTextError("the edited text does not parse to the intended object; refusing to write")
    return new_text, actual
