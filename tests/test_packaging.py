"""The wheel builds, carries its package data, and its entry point runs from a fresh venv.

No container engine runs here, so this is what can be tested of the Dockerfile's build stage: the final image
does exactly this (install the wheel, run the ``scheduler-patcher`` entry point).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import patcher

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "scheduler-patcher"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "build", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True)
    (found,) = out.glob("scheduler_patcher-*.whl")
    return found


def test_wheel_carries_the_code_and_the_schemas(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert f"scheduler_patcher-{patcher.__version__}.dist-info/entry_points.txt" in names
    assert "patcher/py.typed" in names
    schemas = [n for n in names if n.startswith("patcher/schedconfig/schemas/") and n.endswith(".json")]
    assert len(schemas) == len(list((ROOT / "patcher/schedconfig/schemas").glob("*.json"))) > 5
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
