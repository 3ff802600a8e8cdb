"""The source folder: ConfigMap-style symlinks work, links out of the folder and odd names are refused, and the
three source forms are recognised (and refused when they conflict)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.source import (
    FORM_CONFIG,
    FORM_CSI,
    FORM_EXTENDERS,
    csi_pick,
    detect_form,
    read_source_file,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "configs"


def make_configmap(folder: Path, files: dict[str, str]) -> Path:
    """Lay out ``files`` the way the kubelet mounts a ConfigMap: name -> ..data/name -> ..<timestamp>/name."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "..2024_07_17_10_00_00.000000001"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text, encoding="utf-8")
    os.symlink(stamp.name, folder / "..data")
    for name in files:
        os.symlink(f"..data/{name}", folder / name)
    return folder


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_configmap_symlinks_are_followed(tmp_path: Path) -> None:
    source = make_configmap(tmp_path / "cm", {"extenders.yaml": "extenders: []\n"})
    read = read_source_file(source, "extenders.yaml")
    assert read.text == "extenders: []\n"
    assert read.name == "extenders.yaml"
    assert detect_form(source).form == FORM_EXTENDERS


def test_link_outside_the_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.yaml"
    secret.write_text("extenders: []\n")
    source = tmp_path / "cm"
    source.mkdir()
    os.symlink(secret, source / "extenders.yaml")
    with pytest.raises(ConfigError, match="points outside the source folder"):
        read_source_file(source, "extenders.yaml")


def test_relative_link_escaping_through_dotdot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.yaml").write_text("kind: KubeSchedulerConfiguration\n")
    source = tmp_path / "cm"
    source.mkdir()
    os.symlink("../other/config.yaml", source / "config.yaml")
    with pytest.raises(ConfigError) as err:
        read_source_file(source, "config.yaml")
    assert err.value.path == str(source / "config.yaml")


def test_data_link_pointing_outside_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "extenders.yaml").write_text("extenders: []\n")
    source = tmp_path / "cm"
    source.mkdir()
    os.symlink(elsewhere, source / "..data")
    os.symlink("..data/extenders.yaml", source / "extenders.yaml")
    with pytest.raises(ConfigError, match="outside the source folder"):
        read_source_file(source, "extenders.yaml")


@pytest.mark.parametrize("name", ["../extenders.yaml", "sub/extenders.yaml", "..data", "a..b.yaml", "", ".hidden"])
def test_names_with_slash_or_dotdot_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="not a plain file name"):
        read_source_file(tmp_path, name)


def test_dangling_link_and_directory_are_refused(tmp_path: Path) -> None:
    os.symlink("..data/config.yaml", tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match="dangling link"):
        read_source_file(tmp_path, "config.yaml")
    (tmp_path / "extenders.yaml").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        read_source_file(tmp_path, "extenders.yaml")


def test_not_utf8_and_missing_folder(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_bytes(b"kind: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_source_file(tmp_path, "config.yaml")
    with pytest.raises(ConfigError, match="source folder not found"):
        detect_form(tmp_path / "missing")


def test_forms(tmp_path: Path) -> None:
    csi = make_configmap(
        tmp_path / "csi", {name: "x: 1\n" for name in ("config.yaml", "policy.yaml", "config-19.yaml")}
    )
    assert detect_form(csi).form == FORM_CSI
    only_config = make_configmap(tmp_path / "config", {"config.yaml": "x: 1\n", "README": "notes\n"})
    form = detect_form(only_config)
    assert form.form == FORM_CONFIG
    assert form.ignored == ("README",)


@pytest.mark.parametrize("other", ["config.yaml", "policy.yaml", "config-29.yaml"])
def test_conflicting_forms_are_refused(tmp_path: Path, other: str) -> None:
    source = make_configmap(tmp_path / "cm", {"extenders.yaml": "extenders: []\n", other: "x: 1\n"})
    with pytest.raises(ConfigError, match=f"conflicting source forms: extenders.yaml and {other}"):
        detect_form(source)


def test_empty_folder_names_what_it_expects(tmp_path: Path) -> None:
    (tmp_path / "extender.yaml").write_text("typo\n")
    with pytest.raises(ConfigError) as err:
        detect_form(tmp_path)
    assert "no source config" in err.value.problem and "found extender.yaml" in err.value.problem


@pytest.mark.parametrize(
    ("minor", "name"),
    [(19, "config-19.yaml"), (22, "config-19.yaml"),
     (23, "config-23.yaml"), (28, "config-23.yaml"), (29, "config-29.yaml"), (33, "config-29.yaml")],
)
def test_csi_pick_follows_the_operator(minor: int, name: str) -> None:
    assert csi_pick(minor) == name
