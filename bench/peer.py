"""Side by side with the peer, csi-baremetal's scheduler patcher (``../shared/peer``), in one run.

The peer runs in its own venv built from its pinned ``requirements.txt`` (cached in ``.bench-peer/``, ignored by
git), through ``bench/peer_side.py``; ours runs from this checkout. Both get the same manifests of
``../shared/corpus`` (those both patch and restore byte for byte), the same repeats and the same kind of process
per figure, interleaved so that the machine's noise falls on both alike. Ratios are ours / peer; they, not the
absolute times, are the targets.

What each side does, per figure:

* patch step, in-process (a long-lived worker process per side, one request per manifest, sides alternating):
  the unpatched manifest on disk, the config file(s) already in place. Ours: ``plan_apply`` with the rendered
  config + ``apply``: read, validate, splice, re-parse proof, state record and saved original (fsynced), the
  manifest by temp file + fsync + rename + fsync of the folder, under the writer lock. Peer: its loop body
  (five ``copy_not_equal`` that find the files equal, PyYAML load, patch, backup copy, ``remove`` and a plain
  ``open('w')`` + ``yaml.dump``: no fsync, no temp file, the manifest is absent between remove and dump);
* restore, in-process. Ours, prepared (as on SIGTERM): the restored bytes were planned while patched; check that
  the manifest is still what we wrote, then temp file + fsync + RENAME_EXCHANGE + fsync of the folder, under the
  lock (the clean-up after it, config files and state record, is its own row). Ours, cold: ``plan_restore`` +
  ``restore``, clean-up included. Peer: ``shutil.copy`` of its backup over the manifest (no fsync, in place);
* both sides run byte-compiled code, as ``pip install`` leaves it: the peer's venv is compiled by pip, and our
  package is compiled once before the figures (``compile_ours``; with ``PYTHONDONTWRITEBYTECODE`` set, as on
  these machines, a source tree run through ``PYTHONPATH`` would be compiled again at every start: ~0.1 s of
  ours per start that a deployed agent never pays). The peer's ``main.py`` is compiled at each start, as its
  own image runs it (a script);
* processes (each start gets a fresh node folder and its own API emulator over TLS, in-cluster style for the
  peer, a kubeconfig for ours; ours in ``--rollout=independent``, the peer with ``--restore --interval 60``):
  exec -> manifest patched, SIGTERM -> manifest restored (the signal sent and the restore seen by
  ``bench/observe.py``, a process of its own, on inotify), SIGTERM -> exit, and, both idle side by side over
  the same window, CPU and RSS; import: ``python -c 'import <the program>'``, exec to exit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import cputime, rows  # noqa: E402
from bench.rows import timed  # noqa: E402

PEER_DIR = ROOT.parent / "shared" / "peer"
CORPUS = ROOT.parent / "shared" / "corpus" / "manifests"
CACHE = ROOT / ".bench-peer"
SIDE = ROOT / "bench" / "peer_side.py"
OURS_INCLUSTER = ROOT / "bench" / "ours_incluster.py"
OBSERVE = ROOT / "bench" / "observe.py"
SOURCE = ROOT / "examples" / "scheduler-config" / "extenders.yaml"
KUBEADM = ROOT / "tests/fixtures/manifests/kubeadm.yaml"
MANIFEST = "etc/kubernetes/manifests/kube-scheduler.yaml"
#: What ``run --no-api`` imports, and what ``run`` adds with the API (in a background thread, after the patch).
OURS_IMPORTS_NO_API = "patcher.commands.cli, patcher.services.runner"
OURS_IMPORTS_API = ("patcher.adapters.kube.client, patcher.adapters.kube.publish, patcher.adapters.kube.mirrorpod, "
                    "patcher.adapters.kube.owner, patcher.services.rollout")

#: figure -> highest ratio ours / peer that meets its target (None: shown, no target).
TARGETS: dict[str, float | None] = {
    "patch step in-process": 0.8,
    "patch step in-process, config file(s) written too": 0.8,
    "restore in-process (plan + restore + clean-up, as on SIGTERM)": None,  # bound: SIGTERM -> restored, agent_bench
    "exec -> manifest patched": 1.0,
    "SIGTERM -> manifest restored": 1.0,
    "SIGTERM -> exit": 1.0,
    "idle CPU % of a core": 1.0,
    "idle RSS MiB": 1.0,
    "import of the program": 1.0,
}

Figures = dict[str, dict[str, list[float]]]  # figure -> side -> values (per-manifest medians in-process)


def compile_ours() -> None:
    """Byte-compile our package in place (``__pycache__``, ignored by git), as an install does; files already
    compiled and unchanged are left alone."""
    import compileall

    if not compileall.compile_dir(str(ROOT / "patcher"), quiet=1):
        raise SystemExit("bench/peer.py: our package does not compile")


def peer_python() -> Path:
    """The peer's venv, built once per requirements file and interpreter version."""
    req = PEER_DIR / "requirements.txt"
    key = hashlib.sha256(req.read_bytes() + sys.version.encode()).hexdigest()[:12]
    venv = CACHE / f"venv-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        print(f"# building the peer's venv in {venv} from {req} (once)", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                        str(req)], check=True)
        (venv / ".complete").touch()
    return python


class Worker:
    """A long-lived process answering one JSON line per JSON request line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        answer: dict[str, Any] = json.loads(stdout.readline())
        return answer

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(30)


# -- our worker (run as ``python bench/peer.py --worker``) ------------------------------------------------------

def our_worker(lines: IO[str]) -> None:
    from bench.run import Node

    nodes: dict[str, Node] = {}
    for line in lines:
        req = json.loads(line)
        if req["tmp"] not in nodes:
            Path(req["tmp"]).mkdir(parents=True, exist_ok=True)
            nodes[req["tmp"]] = Node(Path(req["tmp"]))
        try:
            answer: dict[str, Any] = our_timings(nodes[req["tmp"]], Path(req["manifest"]).read_bytes(), req["n"],
                                                 fresh=req.get("fresh_config", False))
        except Exception as exc:  # refused here: the manifest is left out of both sides
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


def _reset(node: Any, data: bytes, fresh: bool) -> None:
    """The unpatched manifest; our config file in place (as the peer's five are), or absent when ``fresh``."""
    from patcher.services import nodefiles

    node.reset(data)
    for name, content in node.config.files.items():
        target = nodefiles.host_fs(node.opts).local(f"{node.opts.host_config_dir}/{name}")
        if fresh:
            target.unlink(missing_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)


def our_timings(node: Any, data: bytes, n: int, *, fresh: bool) -> dict[str, list[float]]:
    from bench import baselines

    out: dict[str, list[float]] = {"patch": [], "restore": [], "floor": []}
    for _ in range(n):
        _reset(node, data, fresh)
        out["patch"].append(timed(node.patch))
        if fresh:
            node.restore()
            continue
        out["floor"].append(timed(functools.partial(baselines.floor, node.manifest)))  # the same bytes back
        out["restore"].append(timed(node.restore))  # as on SIGTERM: planned, written and cleaned up then
        if node.manifest.read_bytes() != data:
            raise AssertionError("restore(patch(m)) != m")
    return out


# -- in-process figures -----------------------------------------------------------------------------------------

#: in-process figure -> (key of our answer, key of the peer's answer or None: no counterpart, fresh config?)
IN_PROCESS = {
    "patch step in-process": ("patch", "patch", False),
    "patch step in-process, config file(s) written too": ("patch", "patch", True),
    "restore in-process (plan + restore + clean-up, as on SIGTERM)": ("restore", "restore", False),
    "floor: read + temp write + fsync + rename + fsync folder": ("floor", None, False),
}


def in_process(peer_py: Path, n: int, limit: int) -> Figures:
    """Per figure and side: the per-manifest medians. Every request is one repeat of one manifest, the sides
    alternating request by request, so that a burst of a neighbour's I/O falls on both."""
    files = sorted(CORPUS.glob("*.yaml"))[:limit]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ours = Worker([sys.executable, str(Path(__file__).resolve()), "--worker"], env)
    peer = Worker([str(peer_py), str(SIDE), "worker", str(PEER_DIR)])
    # (manifest, fresh config?, side) -> answer key -> values
    got: dict[tuple[Path, bool, str], dict[str, list[float]]] = {}
    left_out: dict[Path, str] = {}
    with tempfile.TemporaryDirectory() as t:
        try:
            for rep in range(n):
                for i, path in enumerate(files):
                    if path in left_out:
                        continue
                    for fresh in (False, True):
                        req = {"manifest": str(path), "n": 1, "tmp": f"{t}/ours", "fresh_config": fresh}
                        asks = [("ours", ours, req), ("peer", peer, {**req, "tmp": f"{t}/peer", "config": str(SOURCE)})]
                        for side, worker, request in asks if (rep + i) % 2 else asks[::-1]:
                            answer = worker.ask(request)
                            if "error" in answer:
                                left_out[path] = f"{side}: {answer['error']}"
                                break
                            for key, values in answer.items():
                                got.setdefault((path, fresh, side), {}).setdefault(key, []).extend(values)
        finally:
            ours.close()
            peer.close()
    figures: Figures = {figure: {"ours": [], "peer": []} for figure in IN_PROCESS}
    used = [p for p in files if p not in left_out]
    for path in used:
        for figure, (our_key, peer_key, fresh) in IN_PROCESS.items():
            figures[figure]["ours"].append(statistics.median(got[(path, fresh, "ours")][our_key]))
            if peer_key is not None:
                figures[figure]["peer"].append(statistics.median(got[(path, fresh, "peer")][peer_key]))
    print(f"# in-process: {len(used)} of {len(files)} corpus manifests, {n} repeats each; left out "
          f"({len(left_out)}): {'; '.join(f'{p.name} ({why})' for p, why in left_out.items()) or '-'}")
    return figures


# -- process figures --------------------------------------------------------------------------------------------

def wait(pred: Callable[[], bool], timeout: float = 30.0, step: float = 0.0002) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(step)


class Node:
    """One node folder, the emulator's credentials, and the command line of either side for it."""

    def __init__(self, tmp: Path, emu: Any) -> None:
        from tests.conftest import write_configmap

        self.tmp = tmp
        self.root = tmp / "node"
        self.manifest = self.root / MANIFEST
        self.manifest.parent.mkdir(parents=True)
        self.original = KUBEADM.read_bytes()
        self.manifest.write_bytes(self.original)
        self.src = tmp / "src"
        self.src.mkdir()
        write_configmap(self.src, {"extenders.yaml": SOURCE.read_text()})
        emu.add_node("cp-1")
        self.kubeconfig = emu.write_kubeconfig(tmp / "kc")
        self.incluster_env, self.token, self.ca = emu.incluster_files(tmp)

    def ours(self, api: bool) -> tuple[list[str], dict[str, str]]:
        """Ours without the API, or with it in-cluster as the DaemonSet runs it (and as the peer runs: the same
        token and CA files, ``bench/ours_incluster.py``); the kubeconfig path is the tests' (tests/harness/helpers)."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env |= {"PYTHONPATH": str(ROOT), "NODE_NAME": "cp-1"}
        # No settle time (default 10 s): the peer has none, and it is a fixed wait, not work to compare.
        run = ["run", "--host-root", str(self.root), "--source", str(self.src), "--listen", "127.0.0.1:0",
               "--restart-settle", "0s"]
        if not api:
            return [sys.executable, "-m", "patcher", *run, "--no-api"], env
        return [sys.executable, str(OURS_INCLUSTER), str(self.token), str(self.ca), "--", *run,
                "--rollout", "independent"], env | self.incluster_env

    def peer(self, peer_py: Path) -> tuple[list[str], dict[str, str]]:
        targets = self.tmp / "peer-targets"
        targets.mkdir(exist_ok=True)
        (self.tmp / "peer-backup").mkdir(exist_ok=True)
        src = self.src / "extenders.yaml"
        args = ["--platform", "vanilla", "--restore", "--interval", "60", "--loglevel", "info",
                "--backup-path", str(self.tmp / "peer-backup")]
        for flag, name in (("config-path", "config"), ("policy-path", "policy"), ("config_19_path", "config-19"),
                           ("config_23_path", "config-23"), ("config_29_path", "config-29")):
            sep = "-" if "-" in flag else "_"
            args += [f"--source{sep}{flag}", str(src), f"--target{sep}{flag}", str(targets / name)]
        env = {**os.environ, **self.incluster_env}
        return [str(peer_py), str(SIDE), "run", str(PEER_DIR), str(self.manifest), str(self.token), str(self.ca),
                "--", *args], env

    def patched(self) -> bool:
        try:
            return b"--config=" in self.manifest.read_bytes()
        except OSError:  # the peer removes the manifest before it writes it again
            return False

    def restored(self) -> bool:
        try:
            return self.manifest.read_bytes() == self.original
        except OSError:
            return False


#: The processes compared: ours without a cluster (the agent's file side alone), ours with the API (the same
#: kind of process as the peer, which cannot run without one), the peer.
SIDES = ("ours --no-api", "ours with the API", "peer")


def command(side: str, node: Node, peer_py: Path) -> tuple[list[str], dict[str, str]]:
    return node.peer(peer_py) if side == "peer" else node.ours(api=side == "ours with the API")


def settled(side: str, node: Node, emu: Any) -> None:
    """Patched, and done starting: ours with the API has attached it (the Node carries its state; until then a
    thread imports the client and builds it), the peer asked the API before it patched."""
    wait(node.patched)
    if side == "ours with the API":
        wait(lambda: any(k.endswith("/state") for k in
                         ((emu.get("nodes", "cp-1") or {}).get("metadata", {}).get("annotations") or {})))
    time.sleep(0.3)


def one_process(side: str, peer_py: Path) -> tuple[float, float, float]:
    """exec -> patched, SIGTERM -> restored, SIGTERM -> exit, for one fresh start of ``side``."""
    from tests.harness.emu.kubeemu import KubeEmulator

    with tempfile.TemporaryDirectory() as t, KubeEmulator(tls=True) as emu:
        node = Node(Path(t), emu)
        args, env = command(side, node, peer_py)
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait(node.patched)
            patched = (time.perf_counter() - t0) * 1000
            settled(side, node, emu)
            # SIGTERM sent, and the restore seen, by a process of its own, the same for every side (see
            # bench/observe.py: a thread here shared the GIL with the API emulator, and polled).
            seen = json.loads(subprocess.run([sys.executable, str(OBSERVE), str(proc.pid), str(node.manifest),
                                              str(KUBEADM)], check=True, capture_output=True, text=True).stdout)
            restored = (seen["seen"] - seen["sent"]) * 1000
            wait(lambda: proc.poll() is not None)
            exited = (time.monotonic() - seen["sent"]) * 1000
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
    return patched, restored, exited


def processes(peer_py: Path, n: int) -> Figures:
    figures: Figures = {f: {s: [] for s in SIDES} for f in
                        ("exec -> manifest patched", "SIGTERM -> manifest restored", "SIGTERM -> exit")}
    for i in range(n):
        for side in SIDES[i % 3:] + SIDES[:i % 3]:  # rotate who goes first
            for figure, value in zip(figures, one_process(side, peer_py), strict=True):
                figures[figure][side].append(value)
    return figures


def idle(peer_py: Path, seconds: float) -> Figures:
    """All three patched and idle at the same time, over the same window: CPU % of a core and RSS."""
    from tests.harness.emu.kubeemu import KubeEmulator

    with contextlib.ExitStack() as stack:
        t = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        emus = [stack.enter_context(KubeEmulator(tls=True)) for _ in SIDES]
        nodes = []
        for side, emu in zip(SIDES, emus, strict=True):
            (t / side).mkdir()
            nodes.append(Node(t / side, emu))
        procs = []
        for side, node in zip(SIDES, nodes, strict=True):
            args, env = command(side, node, peer_py)
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            for side, node, emu in zip(SIDES, nodes, emus, strict=True):
                settled(side, node, emu)
            time.sleep(2)
            ps = [psutil.Process(p.pid) for p in procs]
            ts = cputime.open_taskstats(procs[0].pid)  # exact, exited threads included; else the 10 ms ticks
            print(f"# idle CPU from {'taskstats (exact)' if ts else 'psutil, in 10 ms ticks (taskstats unavailable)'}")

            def used() -> list[float]:
                if ts is not None:
                    return [ts.cpu_ns(p.pid) / 1e9 for p in procs]
                return [(lambda t: t.user + t.system)(p.cpu_times()) for p in ps]

            c0 = used()
            t0 = time.monotonic()
            time.sleep(seconds)
            c1 = used()
            elapsed = time.monotonic() - t0
            rss = [p.memory_info().rss / 2**20 for p in ps]
            if ts is not None:
                ts.close()
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(30)
    cpu = [max(0.0, b - a) / elapsed * 100 for a, b in zip(c0, c1, strict=True)]
    return {"idle CPU % of a core": {s: [c] for s, c in zip(SIDES, cpu, strict=True)},
            "idle RSS MiB": {s: [r] for s, r in zip(SIDES, rss, strict=True)}}


def imports(peer_py: Path, n: int) -> Figures:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmds = {"ours --no-api": [sys.executable, "-c", f"import {OURS_IMPORTS_NO_API}"],
            "ours with the API": [sys.executable, "-c", f"import {OURS_IMPORTS_NO_API}, {OURS_IMPORTS_API}"],
            "peer": [str(peer_py), "-c", f"import sys; sys.path.insert(0, {str(PEER_DIR)!r}); import main"]}
    out: dict[str, list[float]] = {side: [] for side in cmds}
    for _ in range(n):
        for side, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, check=True)
            out[side].append((time.perf_counter() - t0) * 1000)
    return {"import of the program": out}


# -- the table --------------------------------------------------------------------------------------------------

def table(figures: Figures) -> None:
    print("\n== side by side with the peer (csi-baremetal patcher), one run; ms unless the figure says else")
    print(f"{'figure':<56} {'ours':<18} {'ours':>9} {'peer':>9} {'ratio':>7}  target")
    for figure, sides in figures.items():
        peer = sides.get("peer") or []
        b = statistics.median(peer) if peer else None
        if b is not None:
            rows.record(rows.Row(f"vs peer: {figure} (peer)", len(peer), b, max(peer)))
        for side, ours in sides.items():
            if side == "peer" or not ours:
                continue
            a = statistics.median(ours)
            rows.record(rows.Row(f"vs peer: {figure} ({side})", len(ours), a, max(ours)))
            if b is None:
                print(f"{figure:<56} {side:<18} {a:>9.3f} {'-':>9} {'-':>7}")
                continue
            ratio = a / b if b else (1.0 if a == 0 else float("inf"))  # 0 / 0: both below the clock's tick
            limit = TARGETS.get(figure)
            verdict = "" if limit is None else f"{'ok' if ratio <= limit else 'MISSED'} (ratio <= {limit:g})"
            print(f"{figure:<56} {side:<18} {a:>9.3f} {b:>9.3f} {ratio:>7.2f}  {verdict}")


def main() -> None:
    global PEER_DIR, CORPUS  # the functions above read these; --peer/--corpus point them elsewhere
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-n", type=int, default=15, help="repeats per manifest (in-process)")
    ap.add_argument("--manifests", type=int, default=1000, help="at most this many corpus manifests")
    ap.add_argument("--starts", type=int, default=10, help="process starts per side")
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--imports", type=int, default=10)
    ap.add_argument("--peer", type=Path, default=PEER_DIR, help="the peer's folder (main.py, requirements.txt)")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="the manifests both sides patch")
    args = ap.parse_args()
    if args.worker:
        our_worker(sys.stdin)
        return
    PEER_DIR, CORPUS = args.peer.resolve(), args.corpus.resolve()
    if not (args.peer / "main.py").is_file() or not args.corpus.is_dir():
        print(f"# side by side with the peer: skipped ({args.peer}/main.py or {args.corpus} not found)")
        return
    peer_py = peer_python()
    compile_ours()
    figures = in_process(peer_py, args.n, args.manifests)
    if args.starts > 0:
        figures |= processes(peer_py, args.starts)
    if args.idle_seconds > 0:
        figures |= idle(peer_py, args.idle_seconds)
    if args.imports > 0:
        figures |= imports(peer_py, args.imports)
    table(figures)


if __name__ == "__main__":
    main()
