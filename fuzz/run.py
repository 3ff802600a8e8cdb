"""Coverage-guided fuzzing of ``fuzz/targets.py`` with atheris (issue 32): ``make fuzz``, and a short pass in CI.

    python fuzz/run.py [--seconds N] [--ci] [TARGET ...]

Each target runs in a process of its own (atheris instruments and fuzzes once per process) for ``--seconds``,
starting from its seeds and the inputs found so far in ``fuzz/corpus/<target>/`` (with the libFuzzer
dictionary ``fuzz/dicts/<target>.dict`` when there is one). ``make fuzz`` adds the new
inputs libFuzzer keeps to that folder (commit the ones worth keeping); ``--ci`` keeps them in a temporary
folder instead, so a CI run changes nothing in the checkout. An input that fails is written to
``fuzz/crashes/<target>/`` and the run exits 1: fix the code, then move the input to
``tests/fuzz_found/<target>/``, where ``tests/unit/test_fuzz_found.py`` replays it in every ``make test``.

The closing table gives per target the executions per second, the coverage (libFuzzer's ``cov``: edges of the
instrumented code reached; ``ft``: features) and the corpus size.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "fuzz"
STATS = re.compile(rb"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/\S+ .*?exec/s: (\d+)")


def child(name: str, args: list[str]) -> None:
    """Fuzz one target in this process (never returns: libFuzzer exits)."""
    import hashlib

    import atheris

    with atheris.instrument_imports(include=["patcher"]):
        sys.path.insert(0, str(ROOT))
        from fuzz.targets import TARGETS
    fn, crashes = TARGETS[name], FUZZ / "crashes" / name

    def kept(data: bytes) -> None:
        """The target; a failing input is written here first: libFuzzer's own artifact was once lost (the
        process ended by SIGALRM while the traceback was printed) and the input with it."""
        try:
            fn(data)
        except BaseException:
            (crashes / f"input-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
            raise

    atheris.Setup([sys.argv[0], *args], kept)
    atheris.Fuzz()


def run(name: str, seconds: int, ci: bool) -> tuple[int, dict[str, int]]:
    """Fuzz ``name`` in a child process; (exit code, last stats)."""
    corpus = FUZZ / "corpus" / name
    corpus.mkdir(parents=True, exist_ok=True)
    crashes = FUZZ / "crashes" / name
    crashes.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    dirs = [str(scratch), str(corpus)] if ci else [str(corpus)]
    args = [f"-max_total_time={seconds}", f"-artifact_prefix={crashes}/", "-print_final_stats=1",
            "-timeout=10", "-rss_limit_mb=1024", "-max_len=65536", *dirs]
    words = FUZZ / "dicts" / f"{name}.dict"  # tokens a mutation would rarely spell by chance
    if words.exists():
        args.insert(0, f"-dict={words}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    shutil.rmtree(scratch, ignore_errors=True)
    out = proc.stdout
    stats: dict[str, int] = {}
    for m in STATS.finditer(out):
        stats = {"runs": int(m[1]), "cov": int(m[2]), "ft": int(m[3]), "corpus": int(m[4]), "exec_s": int(m[5])}
    if proc.returncode != 0:
        sys.stdout.buffer.write(out[-6000:])
    if not any(crashes.iterdir()):
        crashes.rmdir()
    return proc.returncode, stats


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        name, _, rest = sys.argv[2], sys.argv[3], sys.argv[4:]
        child(name, rest)
        return 0
    sys.path.insert(0, str(ROOT))
    from fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", choices=[[], *TARGETS], help="default: every target")
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--ci", action="store_true", help="keep new corpus entries out of the checkout")
    args = parser.parse_args()
    failed = []
    print(f"{'target':<18} {'exec/s':>8} {'cov':>6} {'ft':>6} {'corpus':>7} {'runs':>9}  result", flush=True)
    for name in args.targets or list(TARGETS):
        code, s = run(name, args.seconds, args.ci)
        result = "ok" if code == 0 else f"FAILED (exit {code}; input in fuzz/crashes/{name}/)"
        print(f"{name:<18} {s.get('exec_s', 0):>8} {s.get('cov', 0):>6} {s.get('ft', 0):>6} {s.get('corpus', 0):>7} "
              f"{s.get('runs', 0):>9}  {result}", flush=True)
        if code != 0:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
