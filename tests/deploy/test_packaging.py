"""The sdist and the wheel build, carry what they must, and the wheel's entry point runs from a fresh venv.

No container engine runs here, so this is what can be tested of the Dockerfile's build stage: the final image
does exactly this (install the wheel, run the ``scheduler-patcher`` entry point).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import patcher

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel) as `python -m build` makes them for a release: the wheel is built from the unpacked sdist,
    so a file the sdist lacks breaks the wheel here rather than for a user."""
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "scheduler-patcher"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv*", ".git", "*.egg-info", "build", "dist", "__pycache__", ".*_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)], check=True,
                   capture_output=True)
    (sdist,) = out.glob("scheduler_patcher-*.tar.gz")
    (found,) = out.glob("scheduler_patcher-*.whl")
    return sdist, found


@pytest.fixture(scope="module")
def wheel(dist: tuple[Path, Path]) -> Path:
    return dist[1]


SDIST_FOLDERS = ("tests", "docs", "manifests", "charts", "examples", "tools", "bench", "patcher", ".ci")


def test_the_sdist_holds_what_the_tests_and_docs_need(dist: tuple[Path, Path]) -> None:
    """Every tracked file of the test suite, docs, deploy manifests, chart, examples, tools and benches, and the
    files the Makefile and the Dockerfile use: `make test` and `make image` work from an unpacked sdist."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    with tarfile.open(dist[0]) as tar:
        top = f"scheduler_patcher-{patcher.__version__}/"
        names = {n.removeprefix(top) for n in tar.getnames()}
        info = tar.extractfile(top + "PKG-INFO")
        assert info is not None and f"Version: {patcher.__version__}" in info.read().decode()
    wanted = {f for f in listed.stdout.splitlines() if f.split("/")[0] in SDIST_FOLDERS or "/" not in f}
    wanted -= {".gitignore"}
    assert wanted and not wanted - names, sorted(wanted - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_carries_the_code_and_the_schemas(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert f"scheduler_patcher-{patcher.__version__}.dist-info/entry_points.txt" in names
    assert "patcher/py.typed" in names
    schemas = [n for n in names if n.startswith("patcher/core/schedconfig/schemas/") and n.endswith(".json")]
    assert len(schemas) == len(list((ROOT / "patcher/core/schedconfig/schemas").glob("*.json"))) > 5
    assert not [n for n in names if n.startswith("tests/")]


def test_entry_point_runs_from_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    target = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    # The dependencies come from the test venv (installing them again would download them); the code, its
    # data and the console script come from the wheel only.
    deps = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": deps}
    script = target / "bin" / "scheduler-patcher"
    python = env_dir / "bin" / "python"
    out = subprocess.run([str(python), str(script), "--version"], env=env, capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == f"scheduler-patcher {patcher.__version__}"
    node = tmp_path / "node"
    shutil.copytree(ROOT / "examples/manifests", node / "etc/kubernetes/manifests")
    plan = subprocess.run([str(python), str(script), "plan", "--host-root", str(node), "--source",
                           str(ROOT / "examples/scheduler-config")], env=env, capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert plan.returncode == 2, plan.stderr  # needs the schemas from the wheel to validate the config
    assert "+    - --config=/etc/kubernetes/scheduler-patcher/config-" in plan.stdout
    where = subprocess.run([str(python), "-c", "import patcher; print(patcher.__file__)"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(target))


# -- dependency floors, metadata, the image context ----------------------------------------------------------


def test_floor_constraints_pin_every_runtime_dependency_to_its_lower_bound() -> None:
    from tools.floor_constraints import floor_constraints

    pyproject = (ROOT / "pyproject.toml").read_text()
    lines = floor_constraints(pyproject)
    deps = tomllib.loads(pyproject)["project"]["dependencies"]
    assert len(lines) == len(deps)
    assert "kubernetes==37.0.0" in lines  # the 37 client: pydantic models (model_validate) and _content_type
    for dep, line in zip(deps, lines, strict=True):
        name, _, floor = line.partition(";")[0].partition("==")
        assert dep.startswith(name) and f">={floor}" in dep.replace(" ", "")


@pytest.mark.parametrize("dep", ["psutil", "psutil<8", "psutil>=5,>=6", "psutil==5.9"])
def test_a_dependency_without_one_floor_is_refused(dep: str) -> None:
    from tools.floor_constraints import floor_constraints

    with pytest.raises(ValueError, match="psutil"):
        floor_constraints(f'[project]\ndependencies = ["{dep}"]\n')


def test_markers_are_kept() -> None:
    from tools.floor_constraints import floor_constraints

    text = "[project]\ndependencies = [\"ruamel.yaml.clib>=0.2.8,<0.3; platform_python_implementation == 'CPython'\"]\n"
    assert floor_constraints(text) == ["ruamel.yaml.clib==0.2.8; platform_python_implementation == 'CPython'"]


def test_project_metadata() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert {"Homepage", "Source", "Issues", "Changelog"} <= set(project["urls"])
    assert "version" not in project and project["dynamic"] == ["version"]  # patcher.__version__ only
    test_deps = " ".join(project["optional-dependencies"]["test"])
    for unused in ("kmock", "pytest-asyncio", "pytest-httpserver"):
        assert unused not in test_deps
    assert f"## [{patcher.__version__}]" in (ROOT / "CHANGELOG.md").read_text()


def test_the_version_is_written_once() -> None:
    """Outside patcher/__init__.py the version appears only where a tool needs a literal: the kustomize image
    tags and the chart's version/appVersion (tools/sync_version.py writes them, tests check them against
    __version__) and the changelog's headings."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    found = []
    for rel in listed.stdout.splitlines():
        path = ROOT / rel
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", "") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if re.search(rf"(?<![\d.]){re.escape(patcher.__version__)}(?![\d.])", text):
            found.append(rel)
    allowed = {"patcher/__init__.py", "CHANGELOG.md", "charts/scheduler-patcher/Chart.yaml",
               "manifests/base/kustomization.yaml", "manifests/gatekeeper/kustomization.yaml",
               "manifests/uninstall/base/kustomization.yaml"}
    assert set(found) <= allowed, sorted(set(found) - allowed)


def test_the_docker_context_holds_what_the_dockerfile_copies() -> None:
    """.dockerignore admits only what the build stage copies; a new COPY source must be admitted there too."""
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied |= {w.rstrip("/") for w in words[1:-1]}
    admitted = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.startswith("!")}
    assert copied and copied == admitted
    assert "*" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_dockerfile_builds_offline_from_a_pinned_base() -> None:
    """No `# syntax=` line (a BuildKit builder would fetch that frontend image from a registry); the base is one
    build argument pinned by tag and digest, used by both stages; the labels carry the version and revision."""
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", base)
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    for label in ("version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{label}=" in text
    assert 'org.opencontainers.image.version="${VERSION}"' in text
