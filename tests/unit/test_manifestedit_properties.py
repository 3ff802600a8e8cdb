"""Property tests: for generated manifests in many layouts, restore(patch(m)) == m and patch is idempotent."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from patcher.core import manifestedit as m

SPEC = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-0123456789ab.yaml",
                   config_hash="0123456789ab" * 5)
SPEC2 = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-aaaaaaaaaaaa.yaml",
                    config_hash="aaaaaaaaaaaa" * 5)


@dataclass(frozen=True)
class Layout:
    indent: int  # mapping indentation
    seq_offset: int  # dash column relative to its key
    gap: int  # spaces after the dash
    quote: str  # "", '"' or "'"
    flags_key: str
    flags: tuple[str, ...]
    with_volumes: bool
    with_mounts: bool
    with_annotations: bool
    name_first: bool
    comment: str
    trailing: str
    crlf: bool
    final_newline: bool
    bom: bool
    block_note: bool  # a literal block scalar as the last annotation (where our marker is added after it)
    uid: str = ""  # metadata.uid (RKE2 writes an md5 hex there), in the layout's quotes; "": none


flag_value = st.from_regex(r"--[a-z][a-z-]{0,20}(=[A-Za-z0-9/._:-]{1,30})?", fullmatch=True)
layouts = st.builds(
    Layout,
    indent=st.sampled_from([2, 4]),
    seq_offset=st.sampled_from([0, 2, 4]),
    gap=st.sampled_from([1, 3]),
    quote=st.sampled_from(["", '"', "'"]),
    flags_key=st.sampled_from(["command", "args"]),
    flags=st.lists(flag_value, min_size=0, max_size=6).map(tuple),
    with_volumes=st.booleans(),
    with_mounts=st.booleans(),
    with_annotations=st.booleans(),
    name_first=st.booleans(),
    comment=st.sampled_from(["", "  # note", "  # ノート"]),
    trailing=st.sampled_from(["", " ", "   "]),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    bom=st.booleans(),
    block_note=st.booleans(),
    uid=st.sampled_from(["", "", "d41d8cd98f00b204e9800998ecf8427e", "1f3d2c4e-0000-4000-8000-000000000001"]),
)


def render(lay: Layout) -> str:
    i = " " * lay.indent

    def q(s: str) -> str:
        return f"{lay.quote}{s}{lay.quote}"

    def seq(level: int, items: list[list[str]]) -> list[str]:
        """Block sequence items (each a list of 'key: value' or scalar lines) below a key at ``level``."""
        out = []
        dash_col = level + lay.seq_offset
        for item in items:
            first, *rest = item
            out.append(" " * dash_col + "-" + " " * lay.gap + first)
            out.extend(" " * (dash_col + 1 + lay.gap) + line for line in rest)
        return out

    lines = ["apiVersion: v1", "kind: Pod", "metadata:"]
    if lay.with_annotations:
        lines += [f"{i}annotations:", f"{i}{i}example.com/owner: platform{lay.comment}"]
        if lay.block_note:
            lines += [f"{i}{i}example.com/note: |", f"{i}{i}{i}first line", "", f"{i}{i}{i}third line"]
    lines += [f"{i}name: kube-scheduler{lay.trailing}", f"{i}namespace: kube-system"]
    lines += [f"{i}uid: {q(lay.uid)}{lay.comment}"] if lay.uid else []
    lines += ["spec:", f"{i}containers:"]
    flags = [q("kube-scheduler")] if lay.flags_key == "command" else []
    flags += [q(f) for f in lay.flags] or [q("--leader-elect=true")]
    body: list[str] = []
    c = lay.indent + lay.seq_offset + 1 + lay.gap  # container key column
    head = ["name: kube-scheduler"] if lay.name_first else []
    body += [f"image: registry.k8s.io/kube-scheduler:v1.30.1{lay.comment}"]
    body += [f"{lay.flags_key}:"] + [line[c:] for line in seq(c, [[f] for f in flags])]
    if lay.with_mounts:
        body += ["volumeMounts:"] + [line[c:] for line in seq(c, [["mountPath: /etc/kubernetes/scheduler.conf",
                                                                    "name: kubeconfig", "readOnly: true"]])]
    if not lay.name_first:
        body += ["name: kube-scheduler"]
    lines += seq(lay.indent, [head + body if head else body])
    lines += [f"{i}hostNetwork: true{lay.trailing}"]
    if lay.with_volumes:
        volume = ["hostPath:", f"{i}path: /etc/kubernetes/scheduler.conf", f"{i}type: FileOrCreate", "name: kubeconfig"]
        lines += [f"{i}volumes:", *seq(lay.indent, [volume])]
    nl = "\r\n" if lay.crlf else "\n"
    return ("\ufeff" if lay.bom else "") + nl.join(lines) + (nl if lay.final_newline else "")


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_restore_of_patch_is_identity_and_patch_is_idempotent(lay: Layout) -> None:
    text = render(lay)
    patched = m.patch(text, SPEC, "gen.yaml")
    assert patched.changed
    assert m.patch(patched.text, SPEC, "gen.yaml").text == patched.text
    assert m.restore(patched.text, "gen.yaml", prefix="scheduler-patcher.io") == text
    old = text.replace("\r\n", "\n").rstrip("\n").split("\n")
    new = patched.text.replace("\r\n", "\n").rstrip("\n").split("\n")
    removed = [d for d in difflib.ndiff(old, new) if d.startswith("- ")]
    # Only the UID's line changes (the kubelet restarts a static pod only for a new UID), in place, keeping its
    # quotes and comment.
    assert removed == ([f"- {line}" for line in old if line.lstrip().startswith("uid: ")] if lay.uid else [])
    if lay.uid:
        ours = m.patched_uid(lay.uid, SPEC.short_hash)
        assert [line for line in new if line.lstrip().startswith("uid: ")] == [
            line.replace(lay.uid, ours) for line in old if line.lstrip().startswith("uid: ")]


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_repatch_with_another_config_restores_to_the_same_original(lay: Layout) -> None:
    text = render(lay)
    first = m.patch(text, SPEC, "gen.yaml").text
    second = m.patch(first, SPEC2, "gen.yaml").text
    assert "config-aaaaaaaaaaaa.yaml" in second and "config-0123456789ab.yaml" not in second
    assert m.restore(second, "gen.yaml", prefix="scheduler-patcher.io") == text
