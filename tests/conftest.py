from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Under load (2 cores, a CPU hog, two xdist workers) one example can take seconds: a per-example deadline or the
# too-slow health check would then fail a test that proves nothing wrong. Example counts stay where each test
# sets them; a test's own @settings inherits this profile for everything it does not set.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def fixture_manifests() -> dict[str, str]:
    """Our own manifests, plus CRLF and missing-final-newline variants made from them."""
    out: dict[str, str] = {}
    for path in sorted((FIXTURES / "manifests").glob("*.yaml")):
        text = path.read_bytes().decode("utf-8")
        out[path.name] = text
        out[f"crlf-{path.name}"] = text.replace("\n", "\r\n")
        out[f"no-eol-{path.name}"] = text.rstrip("\n")
    return out


def corpus_manifests() -> list[Path]:
    folder = CORPUS / "manifests"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


def write_configmap(folder: Path, files: dict[str, str]) -> None:
    """What the kubelet does on a ConfigMap update: a new timestamped folder, the ``..data`` symlink swapped
    by rename, and the visible names as symlinks through ``..data`` (no event on the visible files)."""
    gen = folder / f"..{time.monotonic_ns()}"
    gen.mkdir()
    for name, text in files.items():
        (gen / name).write_text(text)
    tmp = folder / "..data_tmp"
    tmp.symlink_to(gen.name)
    os.replace(tmp, folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")


# API fixtures: each test module defines its own ``emu`` (a tests.kubeemu.KubeEmulator set up for it).


@pytest.fixture
def kubeconfig(emu: Any, tmp_path: Path) -> Path:
    path: Path = emu.write_kubeconfig(tmp_path / "kubeconfig")
    return path


@pytest.fixture
def api(emu: Any, tmp_path: Path) -> Iterator[Any]:
    from patcher.adapters.kube.client import ClientSettings, build_api_client

    client = build_api_client(ClientSettings(kubeconfig=str(emu.write_kubeconfig(tmp_path / "kc")),
                                             timeout=(0.5, 1.0)))
    yield client
    client.close()


@pytest.fixture
def kubeadm_text() -> str:
    return (FIXTURES / "manifests" / "kubeadm.yaml").read_text()
