"""yamltext reads what ruamel.yaml reads: the data of its safe loader by YAML 1.2, and node marks that index the
text by code point for every character (the edits splice at them)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from patcher.core import manifestedit, yamltext
from patcher.core.errors import ManifestError
from patcher.core.schedconfig.yamlio import load_single
from tests.conftest import CORPUS, corpus_manifests, fixture_manifests

SPEC = manifestedit.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher",
                              config_file="config-0123456789ab.yaml", config_hash="0123456789ab" * 5,
                              on_foreign="replace")


def shape(node: Node) -> Any:
    """Everything the text edits read from a node; plain style is None in one composer and "" in the other."""
    out: list[Any] = [type(node).__name__, str(node.tag), node.start_mark.index, node.end_mark.index,
                      node.start_mark.line, node.start_mark.column, getattr(node, "style", None) or None,
                      getattr(node, "flow_style", None)]
    if isinstance(node, ScalarNode):
        out.append(node.value)
    elif isinstance(node, MappingNode):
        out.append([(shape(k), shape(v)) for k, v in node.value])
    else:
        out.append([shape(x) for x in node.value])
    return out


def texts() -> list[str]:
    out = list(fixture_manifests().values()) + [p.read_text() for p in corpus_manifests()]
    for text in list(out):
        with contextlib.suppress(ManifestError):  # shell-wrapped schedulers are refused
            out.append(manifestedit.patch(text, SPEC, "m").text)
    return out


def configs() -> list[str]:
    folder = CORPUS / "configs"
    return [p.read_text() for p in sorted(folder.glob("*"))] if folder.is_dir() else []


def pure_root(text: str) -> Node:
    nodes: list[Node] = [n for n in YAML(typ="safe", pure=True).compose_all(text) if n is not None]
    assert len(nodes) == 1
    return nodes[0]


UNICODE = ["\u00e9", "\u65e5\u672c\u8a9e", "\U0001f600", "\u00a0", "\u200b", "\U0001d4b3", "\u03a9\u2248"]


def unicode_variants() -> list[str]:
    """Non-ASCII in a comment and in a quoted value of every text: where code points and bytes part."""
    out = []
    for i, text in enumerate(texts()):
        s = UNICODE[i % len(UNICODE)]
        lines = text.split("\n")
        for variant in ("\n".join([lines[0], f"# {s} {s}", *lines[1:]]), text.replace("kube-system", f'"kube-{s}"', 1)):
            if one_document(variant):
                out.append(variant)
    return out


def one_document(text: str) -> bool:
    """Whether ``text`` is one YAML document. libyaml asks first (4x faster, and this runs at collection in
    every xdist worker); the pure composer decides what libyaml refuses. A text that libyaml reads and the pure
    composer refuses is kept: the test then fails on it, as it should on any difference between the two."""
    with contextlib.suppress(Exception):
        if len([n for n in YAML(typ="safe", pure=False).compose_all(text) if n is not None]) == 1:
            return True
    try:  # a replacement inside a longer scalar may not be YAML
        pure_root(text)
    except Exception:
        return False
    return True


def plain_one_line_scalars(node: Node) -> list[ScalarNode]:
    if isinstance(node, ScalarNode):
        one_line = node.start_mark.line == node.end_mark.line
        return [node] if not node.style and one_line and node.value else []
    children = [x for kv in node.value for x in kv] if isinstance(node, MappingNode) else node.value
    return [s for child in children for s in plain_one_line_scalars(child)]


ODD = [("\ufeff" if odd == "\ufeff" else "") + f"a: b  # {odd if odd != chr(0xfeff) else ''}\nc: [d]\n"
       for odd in ["\ufeff", "\x85", "\u2028", "\u2029"]]


@pytest.mark.sweep
@pytest.mark.parametrize("text", texts() + unicode_variants() + ODD)
def test_node_marks_index_the_text_by_code_point(text: str) -> None:
    try:
        root = yamltext.parse(text).root
    except yamltext.YamlTextError:  # some of the odd ones are not YAML to the pure parser: then not to us either
        assert text in ODD
        with pytest.raises(Exception):  # noqa: B017 - whatever the pure composer raises
            pure_root(text)
        return
    assert shape(root) == shape(pure_root(text))
    scalars = plain_one_line_scalars(root)
    assert scalars
    for node in scalars:
        assert text[node.start_mark.index : node.end_mark.index] == node.value


@pytest.mark.sweep
@pytest.mark.parametrize("text", texts() + configs())
def test_the_data_loader_loads_the_same_data_as_ruamel_safe(text: str) -> None:
    plain = YAML(typ="safe")
    try:
        expected = list(plain.load_all(text))
    except Exception:  # not a text any loader reads; nothing to compare
        return
    assert list(yamltext._data_loader().load_all(text)) == expected


def test_plain_scalars_resolve_by_yaml_1_2_as_manifests_always_have() -> None:
    # What the kubelet then reads is the file's bytes; these are the values the re-parse proof compares.
    plain = ["yes", "on", "No", "017", "0o17", "0x1F", "1_000", "1:20", ".inf", "null", "~", "True"]
    text = "a:\n" + "".join(f"- {v}\n" for v in plain)
    data = yamltext.load_data(text)
    assert data["a"] == ["yes", "on", "No", 17, 15, 31, 1000, "1:20", float("inf"), None, None, True]
    assert yamltext.parse(text).data == data
    assert yamltext.parse("%YAML 1.2\n---\n" + text).data == data


def test_a_float_without_a_dot_loads_by_yaml_1_2_without_a_warning() -> None:
    # ruamel's float constructor warns (on stderr, in the agent's log) on `1e3` unless its resolver says 1.2.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert yamltext.load_data("a: 1e3\nb: 2E-2\n") == {"a": 1000.0, "b": 0.02}
        assert load_single("apiVersion: v1\nx: 1e3\n", "c.yaml")["x"] == 1000.0


scalars = st.sampled_from(["1", "0x1F", "0o17", "017", "1_000", "1.5", ".inf", "-.Inf", ".nan", "true", "True",
                           "yes", "no", "on", "off", "null", "~", "", "2001-12-14", "2001-12-14t21:59:43.10-05:00",
                           "1:20", "+12", "-0", "a b", "'q'", '"d"', "=", "<<"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=3), scalars), min_size=1, max_size=8,
                unique_by=lambda kv: kv[0]))
def test_resolution_of_every_kind_of_plain_scalar_is_unchanged(pairs: list[tuple[str, str]]) -> None:
    text = "".join(f"{k}: {v}\n" for k, v in pairs)
    try:
        expected = YAML(typ="safe").load(text)
    except Exception:
        return
    assert yamltext._data_loader().load(text) == expected


@pytest.mark.sweep
@pytest.mark.parametrize("text", texts() + configs())
def test_parse_gives_ruamels_data_and_the_pure_composers_nodes(text: str) -> None:
    try:
        expected = [d for d in YAML(typ="safe").load_all(text) if d is not None]
    except Exception:  # not a text any loader reads; nothing to compare
        return
    if len(expected) != 1:
        return
    doc = yamltext.parse(text)
    assert doc.data == expected[0]
    assert shape(doc.root) == shape(pure_root(text))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text("abcdef", min_size=1, max_size=3), scalars), min_size=1, max_size=8))
def test_load_data_gives_ruamels_data_or_a_one_line_refusal(pairs: list[tuple[str, str]]) -> None:
    text = "m:\n" + "".join(f"  {k}: {v}\n" for k, v in pairs) + "l: [" + ", ".join(v or "''" for _, v in pairs) + "]\n"
    try:
        expected = YAML(typ="safe").load(text)
    except Exception:  # duplicate keys among others: the same refusal, in one line
        with pytest.raises(yamltext.YamlTextError):
            yamltext.load_data(text)
        return
    assert yamltext.load_data(text) == expected


@pytest.mark.parametrize("text", [
    "a: &x {k: [1, 2]}\nb: *x\n",  # aliases: one shared object, as ruamel gives
    "s: !!set {a, b}\n",  # another collection tag: ruamel's constructor
    "t: 2001-12-14t21:59:43.10-05:00\nb: !!binary aGVsbG8=\n",
    "? [a, b]\n: c\n",  # a key ruamel refuses (unhashable)
    "a: 1\na: 2\n",  # duplicate key: ruamel's error
])
def test_unusual_documents_load_as_ruamel_loads_them(text: str) -> None:
    try:
        expected = YAML(typ="safe").load(text)
    except Exception as exc:  # the same refusal
        with pytest.raises(yamltext.YamlTextError):
            yamltext.load_data(text)
        assert type(exc).__name__.endswith("Error")
        return
    got = yamltext.load_data(text)
    assert got == expected
    if "*x" in text:
        assert got["a"] is got["b"]
