"""The pure manifest edit: patch, restore, idempotence, fidelity and refusals."""

from __future__ import annotations

import difflib

import pytest

from patcher.core import manifestedit as m
from patcher.core.errors import ManifestError
from tests.conftest import fixture_manifests

PREFIX = "scheduler-patcher.io"
SPEC = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-0123456789ab.yaml",
                   config_hash="0123456789ab" + "0" * 52)
SPEC2 = m.PatchSpec(host_config_dir="/etc/kubernetes/scheduler-patcher", config_file="config-fedcba987654.yaml",
                    config_hash="fedcba987654" + "0" * 52)
REPLACE = m.PatchSpec(host_config_dir=SPEC.host_config_dir, config_file=SPEC.config_file,
                      config_hash=SPEC.config_hash, on_foreign="replace")
FIXTURES = fixture_manifests()
PATCHABLE = {k: v for k, v in FIXTURES.items() if "foreign" not in k}


def written(text: str) -> m.Marker:
    """The marker a patch wrote into the manifest."""
    marker = m.inspect(m.parse_manifest(text, "x"), "x", prefix=PREFIX).marker
    assert marker is not None
    return marker


def added_only(old: str, new: str) -> list[str]:
    """The lines a diff adds, asserting that it removes none but a ``uid:`` line, which it then changes."""
    diff = list(difflib.ndiff(old.splitlines(keepends=True), new.splitlines(keepends=True)))
    removed = [line for line in diff if line.startswith("- ")]
    assert all(line.lstrip("- ").startswith("uid: ") for line in removed) and len(removed) <= 1, removed
    added = [line[2:] for line in diff if line.startswith("+ ")]
    assert len([a for a in added if a.lstrip().startswith("uid: ")]) == len(removed), added
    return added


@pytest.mark.parametrize("name", sorted(PATCHABLE))
def test_patch_adds_lines_and_restore_gives_original_bytes(name: str) -> None:
    text = PATCHABLE[name]
    result = m.patch(text, SPEC, name)
    assert result.changed
    if "flow-style" not in name and "quoted-long" not in name:
        added = added_only(text.replace("\r\n", "\n").rstrip("\n") + "\n",
                           result.text.replace("\r\n", "\n").rstrip("\n") + "\n")
        assert any("--config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml" in a for a in added)
    assert m.restore(result.text, name, prefix=PREFIX) == text
    again = m.patch(result.text, SPEC, name)
    assert not again.changed and again.text == result.text


def test_a_manifest_uid_is_ours_while_patched_and_the_original_on_restore() -> None:
    """RKE2 sets metadata.uid (a hash of the pod); the kubelet restarts a static pod only for a new UID (seen on the
    real 1.37 kubelet). Each config gets its UID, the same config the same one; restore puts back the original's
    text; a UID someone set since is left alone."""
    text = FIXTURES["args-rke2.yaml"]
    original = "1f3d2c4e-0000-4000-8000-000000000001"
    assert f"  uid: {original}\n" in text
    first, second = m.patch(text, SPEC, "rke2"), m.patch(text, SPEC2, "rke2")
    uid1, uid2 = m.patched_uid(original, SPEC.short_hash), m.patched_uid(original, SPEC2.short_hash)
    assert uid1 != uid2 and uid1 != original and len(uid1) == 36
    assert f"  uid: {uid1}\n" in first.text and f"  uid: {uid2}\n" in second.text
    assert written(first.text).uid == original
    assert m.patch(first.text, SPEC2, "rke2").text == second.text  # re-patched from the original's UID
    assert not m.patch(first.text, SPEC, "rke2").changed
    assert m.restore(first.text, "rke2", prefix=PREFIX) == text
    # Quoting is kept both ways; a UID changed since the patch stays as it is on restore.
    quoted = text.replace(f"uid: {original}", f"uid: '{original}'")
    patched = m.patch(quoted, SPEC, "rke2").text
    assert f"  uid: '{uid1}'\n" in patched and m.restore(patched, "rke2", prefix=PREFIX) == quoted
    since = first.text.replace(uid1, "0a0a0a0a-0000-4000-8000-000000000002")
    assert "uid: 0a0a0a0a-0000-4000-8000-000000000002" in m.restore(since, "rke2", prefix=PREFIX)
    # A patch from before the UID was ours (no uid in its marker) is not current: it is patched again.
    legacy = first.text.replace(uid1, original).replace(',"uid":"' + original + '"', "")
    assert '"uid"' not in legacy
    again = m.patch(legacy, SPEC, "rke2")
    assert again.changed and again.text == first.text


def test_a_manifest_without_a_uid_gets_none() -> None:
    for name, text in PATCHABLE.items():
        if "\n  uid:" in text.replace("\r\n", "\n"):
            continue
        result = m.patch(text, SPEC, name)
        assert written(result.text).uid is None and "uid" not in m.parse_manifest(result.text, name).data["metadata"]


@pytest.mark.parametrize("name", sorted(PATCHABLE))
def test_patched_object_has_exactly_our_items(name: str) -> None:
    result = m.patch(PATCHABLE[name], SPEC, name)
    doc = m.parse_manifest(result.text, name)
    sched = m.inspect(doc, name, prefix=PREFIX)
    assert sched.marker is not None and sched.marker.hash == "0123456789ab"
    assert sched.flags[-1] == "--config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml"
    assert sched.mounts[-1] == {"mountPath": "/etc/kubernetes/scheduler-patcher", "name": m.VOLUME_NAME,
                                "readOnly": True}
    assert sched.volumes[-1] == {"name": m.VOLUME_NAME, "hostPath": {"path": "/etc/kubernetes/scheduler-patcher",
                                                                     "type": "DirectoryOrCreate"}}
    assert sched.container_name == "kube-scheduler"


def test_crlf_and_missing_final_newline_survive() -> None:
    text = FIXTURES["crlf-kubeadm.yaml"]
    patched = m.patch(text, SPEC, "x").text
    assert "\n" not in patched.replace("\r\n", "")
    no_eol = FIXTURES["no-eol-kubeadm.yaml"]
    patched = m.patch(no_eol, SPEC, "x").text
    assert not patched.endswith("\n")


def test_styles_follow_the_siblings() -> None:
    text = FIXTURES["quoted-long-trailing.yaml"]
    patched = m.patch(text, SPEC, "x").text
    assert "    - '--config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml'\n" in patched
    assert '      path: "/etc/kubernetes/scheduler-patcher"\n' in patched
    assert "  annotations: {scheduler-patcher.io/patch: '{" in patched
    flow = m.patch(FIXTURES["flow-style.yaml"], SPEC, "x").text
    assert '"--leader-elect=true", "--config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml"]' in flow
    assert "readOnly: true}, {name: scheduler-patcher-config, mountPath:" in flow
    indented = m.patch(FIXTURES["indented-commented.yaml"], SPEC, "x").text
    assert "                - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n" \
           "                # - --v=4\n" in indented
    assert "        -   name: scheduler-patcher-config\n            hostPath:\n" \
           "                path: /etc/kubernetes/scheduler-patcher\n" in indented


def test_missing_keys_are_created_at_the_end_of_their_parent() -> None:
    text = FIXTURES["no-volumes.yaml"]
    patched = m.patch(text, SPEC, "x").text
    assert patched.endswith(
        "    - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n"
        "    volumeMounts:\n"
        "    - name: scheduler-patcher-config\n"
        "      mountPath: /etc/kubernetes/scheduler-patcher\n"
        "      readOnly: true\n"
        "  volumes:\n"
        "  - name: scheduler-patcher-config\n"
        "    hostPath:\n"
        "      path: /etc/kubernetes/scheduler-patcher\n"
        "      type: DirectoryOrCreate\n")  # name first, like the container this file starts with
    assert "  namespace: kube-system\n  annotations:\n    scheduler-patcher.io/patch: '{" in patched
    assert m.restore(patched, "x", prefix=PREFIX) == text


def test_sidecar_before_scheduler_is_left_alone() -> None:
    text = FIXTURES["sidecar-first.yaml"]
    patched = m.patch(text, SPEC, "x").text
    sidecar = text[text.index("  containers:\n"):text.index("  - command:")]
    assert sidecar in patched


def test_args_list_is_used_when_the_manifest_uses_args() -> None:
    patched = m.patch(FIXTURES["args-rke2.yaml"], SPEC, "x").text
    assert "    - --secure-port=10259\n    - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n" \
           "    command:\n" in patched


def test_config_change_rewrites_only_our_lines(kubeadm_text: str) -> None:
    first = m.patch(kubeadm_text, SPEC, "x").text
    second = m.patch(first, SPEC2, "x")
    assert second.changed
    diff = [d for d in difflib.ndiff(first.splitlines(), second.text.splitlines()) if d[:1] in "+-"]
    assert len(diff) == 4  # the --config line and the marker line, each replaced
    assert m.restore(second.text, "x", prefix=PREFIX) == kubeadm_text


def test_foreign_config_is_refused_by_default() -> None:
    with pytest.raises(ManifestError, match="already runs with --config=/etc/kubernetes/custom/scheduler-config"):
        m.patch(FIXTURES["foreign-config.yaml"], SPEC, "f.yaml")


def test_foreign_config_replace_and_restore_puts_it_back() -> None:
    text = FIXTURES["foreign-config.yaml"]
    result = m.patch(text, REPLACE, "f.yaml")
    assert "    - --config=/etc/kubernetes/custom/scheduler-config.yaml" not in result.text
    assert written(result.text).replaced == "--config=/etc/kubernetes/custom/scheduler-config.yaml"
    sched = m.inspect(m.parse_manifest(result.text, "f"), "f", prefix=PREFIX)
    assert sched.foreign_config == "/etc/kubernetes/custom/scheduler-config.yaml"
    assert m.patch(result.text, REPLACE, "f").changed is False
    assert m.restore(result.text, "f", prefix=PREFIX) == text


def test_split_config_flag_is_replaced_in_place() -> None:
    text = FIXTURES["foreign-config.yaml"].replace(
        "    - --config=/etc/kubernetes/custom/scheduler-config.yaml\n",
        "    - --config\n    - \"/etc/kubernetes/custom/scheduler-config.yaml\"\n")
    result = m.patch(text, REPLACE, "f")
    assert '    - --config\n    - "/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml"\n' in result.text
    assert m.restore(result.text, "f", prefix=PREFIX) == text


def test_restore_works_on_an_upgraded_manifest(kubeadm_text: str) -> None:
    patched = m.patch(kubeadm_text, SPEC, "x").text
    upgraded = patched.replace("v1.31.2", "v1.32.0").replace("    - --leader-elect=true\n",
                                                             "    - --leader-elect=true\n    - --v=2\n")
    expected = kubeadm_text.replace("v1.31.2", "v1.32.0").replace("    - --leader-elect=true\n",
                                                                  "    - --leader-elect=true\n    - --v=2\n")
    assert m.restore(upgraded, "x", prefix=PREFIX) == expected


def test_restore_without_marker_is_a_no_op(kubeadm_text: str) -> None:
    assert m.restore(kubeadm_text, "x", prefix=PREFIX) == kubeadm_text


def test_restore_when_someone_removed_some_of_our_items(kubeadm_text: str) -> None:
    patched = m.patch(kubeadm_text, SPEC, "x").text
    without_flag = patched.replace(
        "    - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n", "")
    assert m.restore(without_flag, "x", prefix=PREFIX) == kubeadm_text


def test_a_partially_removed_patch_is_redone(kubeadm_text: str) -> None:
    patched = m.patch(kubeadm_text, SPEC, "x").text
    damaged = patched.replace("    - --config=/etc/kubernetes/scheduler-patcher/config-0123456789ab.yaml\n", "")
    redone = m.patch(damaged, SPEC, "x")
    assert redone.changed and redone.text == patched


BAD = {
    "tabs": ("apiVersion: v1\nkind: Pod\nmetadata:\n\tname: x\n", "invalid YAML at line 4"),
    "bad indentation": ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n    namespace: y\n", "invalid YAML"),
    "duplicate keys": ("apiVersion: v1\nkind: Pod\nkind: Pod\n", "invalid YAML"),
    "two documents": ("kind: Pod\n---\nkind: Pod\n", "2 YAML documents"),
    "empty": ("# nothing\n", "no YAML document"),
    "not a mapping": ("- a\n- b\n", "not a YAML mapping"),
    "deployment": ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n", "expected Pod"),
    "no scheduler": ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: web\n"
                     "    image: nginx\n    command: [nginx]\n", "no kube-scheduler container"),
    "shell": ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: kube-scheduler\n"
              "    image: k\n    command:\n    - /bin/sh\n    - -c\n    - kube-scheduler --leader-elect=true\n",
              "shell string"),
    "shell, unnamed": ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: s\n"
                       "    image: k\n    command: [/bin/sh, -c, exec /usr/local/bin/kube-scheduler --v=2]\n",
                       "shell string"),
    "no flags": ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: kube-scheduler\n"
                 "    image: k\n", "no command or args"),
    "foreign volume name": (FIXTURES["kubeadm.yaml"].replace("name: kubeconfig\nstatus",
                                                             "name: scheduler-patcher-config\nstatus"),
                            "exists but carries no scheduler-patcher marker"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_with_the_file_name(case: str) -> None:
    text, message = BAD[case]
    with pytest.raises(ManifestError) as info:
        m.patch(text, SPEC, "/etc/kubernetes/manifests/kube-scheduler.yaml")
    assert info.value.path == "/etc/kubernetes/manifests/kube-scheduler.yaml"
    assert message in info.value.problem
    assert str(info.value).startswith("/etc/kubernetes/manifests/kube-scheduler.yaml: ")


def test_container_name_override_and_ambiguity() -> None:
    text = FIXTURES["sidecar-first.yaml"].replace("name: kube-scheduler\n    volumeMounts",
                                                  "name: scheduler\n    volumeMounts")
    patched = m.parse_manifest(m.patch(text, SPEC, "x").text, "x").data["spec"]["containers"]
    assert [c["name"] for c in patched if SPEC.config_path in str(c)] == ["scheduler"]
    with pytest.raises(ManifestError, match="no container named 'nope'"):
        m.patch(text, m.PatchSpec(SPEC.host_config_dir, SPEC.config_file, SPEC.config_hash,
                                  container_name="nope"), "x")


def test_scheduler_flags_skip_a_go_runner_prefix() -> None:
    text = FIXTURES["args-rke2.yaml"]
    sched = m.inspect(m.parse_manifest(text, "x"), "x", prefix=PREFIX)
    assert sched.scheduler_flags()[0] == "--permit-port-sharing=true"
    wrapped = text.replace("    - --permit-port-sharing=true\n",
                           "    - --log-file=/var/log/s.log\n    - /usr/local/bin/kube-scheduler\n"
                           "    - --permit-port-sharing=true\n")
    sched = m.inspect(m.parse_manifest(wrapped, "x"), "x", prefix=PREFIX)
    assert sched.scheduler_flags()[0] == "--permit-port-sharing=true"


def test_marker_round_trips() -> None:
    marker = m.Marker(hash="0123456789ab", flag="--config=/a", volume="v", mount="/m", container="c",
                      replaced="'--config=/x'", created=("volumes",))
    assert m.Marker.from_json(marker.to_json()) == marker
    with pytest.raises(ValueError):
        m.Marker.from_json('{"v": 99}')


def test_empty_flow_collections_get_our_items_and_lose_them_again(kubeadm_text: str) -> None:
    text = kubeadm_text.replace("  volumes:\n  - hostPath:\n      path: /etc/kubernetes/scheduler.conf\n"
                                "      type: FileOrCreate\n    name: kubeconfig\n", "  volumes: []\n")
    text = text.replace("  namespace: kube-system\n", "  namespace: kube-system\n  annotations: {}\n")
    text = text.replace("    volumeMounts:\n    - mountPath: /etc/kubernetes/scheduler.conf\n"
                        "      name: kubeconfig\n      readOnly: true\n", "")
    patched = m.patch(text, SPEC, "x").text
    assert "  volumes: [{hostPath: {path: /etc/kubernetes/scheduler-patcher, type: DirectoryOrCreate}, " \
           "name: scheduler-patcher-config}]\n" in patched
    assert "  annotations: {scheduler-patcher.io/patch: '{" in patched
    assert m.restore(patched, "x", prefix=PREFIX) == text


def test_a_null_volume_list_is_refused_not_guessed(kubeadm_text: str) -> None:
    text = kubeadm_text.replace("    volumeMounts:\n    - mountPath: /etc/kubernetes/scheduler.conf\n"
                                "      name: kubeconfig\n      readOnly: true\n", "    volumeMounts:\n")
    with pytest.raises(ManifestError, match="volumeMounts is not a non-empty sequence"):
        m.patch(text, SPEC, "x")


def test_an_aliased_list_is_refused_rather_than_patched_in_two_places() -> None:
    text = FIXTURES["sidecar-first.yaml"]
    text = text.replace("    volumeMounts:\n    - mountPath: /var/log\n", "    volumeMounts: &mounts\n"
                        "    - mountPath: /var/log\n")
    text = text.replace("    volumeMounts:\n    - mountPath: /etc/kubernetes/scheduler.conf\n      name: kubeconfig\n"
                        "      readOnly: true\n", "    volumeMounts: *mounts\n")
    assert "*mounts" in text
    with pytest.raises(ManifestError, match="does not parse to the intended object"):
        m.patch(text, SPEC, "x")
