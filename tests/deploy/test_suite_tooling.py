"""The test suite's own tooling keeps the promises make test relies on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_xdist_loadgroup_sends_a_group_to_one_worker(tmp_path: Path) -> None:
    # tests/conftest.py puts every real test in one group so that one worker runs them in turn; a pytest or
    # pytest-xdist release that stops honouring the group (pytest 9.2 with xdist 3.8 did) spreads them again.
    (tmp_path / "test_g.py").write_text(
        "import os\nfrom pathlib import Path\nimport pytest\n\n"
        "@pytest.mark.xdist_group('real')\n@pytest.mark.parametrize('i', range(8))\n"
        "def test_one(i):\n    Path(f'ran-{i}').write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "test_g.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = {(tmp_path / f"ran-{i}").read_text() for i in range(8)}
    assert len(workers) == 1, workers
