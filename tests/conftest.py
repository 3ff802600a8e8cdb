from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.fixture
def kubeadm_text() -> str:
    return (FIXTURES / "manifests" / "kubeadm.yaml").read_text()
