"""The oracle of issue 33: the real kube-scheduler of a minor says whether it starts on a config.

`plan`'s verdicts (patcher/core/schedconfig) were written by reading upstream source; this runs the binary built
by `make real-k8s` instead. A case is a config text plus the manifest's flags, as the kubelet would pass them; the
oracle starts kube-scheduler with those flags and ``--config`` against one real API server per minor and records
"started" (its /healthz answered 200: every start-up step, options, lock, frameworks, has passed) or "exited"
(with the one meaningful line of its error). Several schedulers run at once, each on its own secure port.

Two things are mapped, as the kubelet's volume mounts would: the kubeadm kubeconfig path
(``/etc/kubernetes/scheduler.conf``) becomes a kubeconfig with a ``system:kube-scheduler`` certificate for this
API server, and a config that names no ``clientConnection.kubeconfig`` gets that one (what ``plan`` does when it
carries the manifest's ``--kubeconfig`` into the config). Nothing else of the case is changed.

    python tools/schedconfig_oracle.py run            # every case, every built minor: rewrites the data
    python tools/schedconfig_oracle.py run --minor 36 --limit 20 --print
    python tools/schedconfig_oracle.py run --new      # only the cases a minor has no verdict for, merged in
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.harness.real.controlplane import (  # noqa: E402
    Binaries,
    ControlPlane,
    built_releases,
    control_plane,
    die_with_parent,
    free_port,
    issue,
    kubeconfig_text,
)

DATA = ROOT / "tests/fixtures/schedconfig_oracle"
NODE_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
#: kubeadm's flags (examples/manifests/kube-scheduler.yaml): the manifest of most cases.
KUBEADM_FLAGS: tuple[str, ...] = (
    f"--authentication-kubeconfig={NODE_KUBECONFIG}",
    f"--authorization-kubeconfig={NODE_KUBECONFIG}",
    "--bind-address=127.0.0.1",
    f"--kubeconfig={NODE_KUBECONFIG}",
    "--leader-elect=true",
)
START_TIMEOUT = 40.0  # seconds: a valid config is healthy in ~1-3 s on 2 busy cores; past this it is "timeout"
WORKERS = 4
SETTLE = 3.0  # seconds a healthy scheduler without leader election must stay up to count as started
LEADING = b"attempting to acquire leader lease"


@dataclass(frozen=True)
class Case:
    """One config as a manifest would run it; ``origin`` says where it came from (not part of its identity)."""

    config: str
    flags: tuple[str, ...] = KUBEADM_FLAGS
    origin: str = ""

    @property
    def key(self) -> str:
        """The content hash: the same config and flags are the same case, whoever generated them."""
        blob = json.dumps({"config": self.config, "flags": list(self.flags)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "started", "exited" or "timeout"
    message: str = ""  # the meaningful line of the scheduler's error when it exited
    seconds: float = 0.0

    @property
    def started(self) -> bool:
        return self.outcome == "started"


_KLOG = re.compile(r'^[EF]\d{4} [\d:.]+\s+\d+ [\w./-]+:\d+\] ')
_NOISE = ("Flag --", "WARNING", "W1", "I1", "I0", "W0")


def error_line(log: str) -> str:
    """The line that says why the scheduler exited: cobra's ``Error: ...``, a panic, else its last klog error.

    The rest of the log is start-up chatter; a verdict keeps one line so the data stays readable and diffable."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    for prefix in ("Error: ", "panic: "):
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return _clip(found[-1])
    errors = [line for line in lines if _KLOG.match(line)]
    if errors:
        return _clip(_KLOG.sub("", errors[-1]))
    rest = [line for line in lines if not line.startswith(_NOISE)]
    return _clip(rest[-1] if rest else (lines[-1] if lines else ""))


def _clip(line: str, limit: int = 400) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


_NODE_FILE = re.compile(r"""^(\s*-?\s*(kubeconfig|caFile|certFile|keyFile)\s*:\s*)(['"]?)(/[^\s'"]+)\3""",
                        re.MULTILINE)


def map_node_files(config: str, files: dict[str, str]) -> str:
    """Node files the config names (a kubeconfig, an extender's CA or client cert) exist on a node, so here they
    are the oracle's own, as the kubelet's hostPath mounts would show them; a path under ``/nonexistent`` stays, to
    let a case ask what a missing file does."""
    def mapped(match: re.Match[str]) -> str:
        if match.group(4).startswith("/nonexistent"):
            return match.group(0)
        return f"{match.group(1)}{match.group(3)}{files[match.group(2)]}{match.group(3)}"

    return _NODE_FILE.sub(mapped, config)


def inject_kubeconfig(config: str, path: str) -> str:
    """Give a config without ``clientConnection.kubeconfig`` the oracle's kubeconfig, by text (so every other byte,
    duplicate keys and odd scalars included, reaches the scheduler as written); a config whose shape the text
    edit cannot follow (flow style, JSON) is left as is and the scheduler will say so."""
    text = config.replace(NODE_KUBECONFIG, path)
    if re.search(r"^\s*kubeconfig\s*:", text, re.MULTILINE):
        return text
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^clientConnection\s*:\s*$", line):
            indent = "  "
            for child in lines[index + 1:]:
                if child.strip() and not child.lstrip().startswith("#"):
                    indent = child[: len(child) - len(child.lstrip())] or "  "
                    break
            lines.insert(index + 1, f"{indent}kubeconfig: {path}")
            return "\n".join(lines) + "\n"
        if re.match(r"^clientConnection\s*:\s*\{\s*\}\s*$", line):
            lines[index] = f"clientConnection: {{kubeconfig: {path}}}"
            return "\n".join(lines) + "\n"
        if re.match(r"^clientConnection\s*:", line):
            return text  # a flow mapping or a scalar: as written
    if text.lstrip().startswith("{"):
        try:
            body = json.loads(text)
        except ValueError:
            return text
        if isinstance(body, dict) and "clientConnection" not in body:
            return json.dumps({**body, "clientConnection": {"kubeconfig": path}}) + "\n"
        return text
    if not text.lstrip().startswith(("{", "[")) and re.search(r"^apiVersion\s*:", text, re.MULTILINE):
        return text.rstrip("\n") + f"\nclientConnection:\n  kubeconfig: {path}\n"
    return text


class Oracle:
    """One API server of a release and the schedulers run against it."""

    def __init__(self, cp: ControlPlane, scratch: Path) -> None:
        self.cp, self.scratch = cp, scratch
        cert, key = issue(cp.pki, "scheduler", "/CN=system:kube-scheduler", client=True)
        self.kubeconfig = scratch / "scheduler.conf"
        self.kubeconfig.write_text(kubeconfig_text(cp.url, cp.pki / "ca.crt", {
            "client-certificate": str(cert), "client-key": str(key)}, "kubernetes"))
        self.files = {"kubeconfig": str(self.kubeconfig), "caFile": str(cp.pki / "ca.crt"),
                      "certFile": str(cp.pki / "admin.crt"), "keyFile": str(cp.pki / "admin.key")}
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE

    def argv(self, case: Case, config_path: Path) -> tuple[list[str], int | None]:
        """The manifest's flags as the kubelet passes them, node paths mapped; a secure port of our own unless
        the case sets one (schedulers run side by side)."""
        flags = [re.sub(r"^(--[\w-]*kubeconfig=)/.*", rf"\g<1>{self.kubeconfig}", flag) for flag in case.flags]
        names = {flag.split("=", 1)[0] for flag in flags}
        port: int | None = None
        if "--secure-port" not in names:
            port = free_port()
            flags.append(f"--secure-port={port}")
        else:
            value = next(f.split("=", 1)[1] for f in flags if f.startswith("--secure-port="))
            port = int(value) if value.isdigit() and int(value) > 0 else None
        return [str(self.cp.binaries.path("kube-scheduler")), *flags, f"--config={config_path}"], port

    def healthy(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=self.tls, timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    @staticmethod
    def settle(proc: subprocess.Popen[bytes], log_path: Path) -> str:
        """Healthy is not yet started: kube-scheduler serves /healthz before it syncs its informers and creates
        its leader elector, and client-go's ``NewLeaderElector`` checks renewDeadline > 1.2 x retryPeriod only
        then. So it must reach the leader-election loop (its "attempting to acquire" line), or, with leader
        election off, stay up for ``SETTLE`` seconds."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return "exited"
            if LEADING in log_path.read_bytes():
                return "started"
            time.sleep(0.05)
        return "started" if proc.poll() is None else "exited"

    def run(self, case: Case, timeout: float = START_TIMEOUT) -> Verdict:
        folder = Path(tempfile.mkdtemp(prefix=f"case-{case.key}-", dir=self.scratch))
        config = folder / "config.yaml"
        config.write_text(inject_kubeconfig(map_node_files(case.config, self.files), str(self.kubeconfig)))
        argv, port = self.argv(case, config)
        log_path = folder / "kube-scheduler.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=die_with_parent, cwd=folder)
        outcome = "timeout"
        try:
            while time.monotonic() - started < timeout:
                if proc.poll() is not None:
                    outcome = "exited"
                    break
                if port is not None and self.healthy(port):
                    outcome = self.settle(proc, log_path)
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        elapsed = round(time.monotonic() - started, 2)
        message = ""
        if outcome != "started":
            message = error_line(log_path.read_text(errors="replace")).replace(str(self.kubeconfig), NODE_KUBECONFIG)
            message = message.replace(str(config), "/config.yaml")
            message = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", message)
        return Verdict(outcome, message, elapsed)


def run_minor(binaries: Binaries, cases: Sequence[Case], workers: int = WORKERS,
              progress: bool = False) -> dict[str, Verdict]:
    """Every case on one release's scheduler, ``workers`` at a time against one API server."""
    with tempfile.TemporaryDirectory(prefix=f"oracle-{binaries.version}-") as tmp, \
            control_plane(binaries, Path(tmp) / "cp") as cp:
        oracle = Oracle(cp, Path(tmp))
        results: dict[str, Verdict] = {}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for index, (case, verdict) in enumerate(zip(cases, pool.map(oracle.run, cases), strict=True)):
                results[case.key] = verdict
                if progress and index % 50 == 0:
                    print(f"{binaries.version}: {index}/{len(cases)}", file=sys.stderr, flush=True)
        return results


# -- the data -------------------------------------------------------------------------------------------------


def data_path(minor: int) -> Path:
    return DATA / f"1.{minor}.json"


def write_cases(cases: Iterable[Case]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    body = {case.key: {"config": case.config, "flags": list(case.flags), "origin": case.origin}
            for case in sorted(cases, key=lambda c: c.key)}
    (DATA / "cases.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def read_cases() -> dict[str, Case]:
    body = json.loads((DATA / "cases.json").read_text())
    return {key: Case(item["config"], tuple(item["flags"]), item.get("origin", "")) for key, item in body.items()}


def write_results(binaries: Binaries, results: dict[str, Verdict], seconds: float) -> None:
    body = {"version": binaries.version, "seconds": round(seconds, 1),
            "verdicts": {key: {"outcome": v.outcome, "message": v.message}
                         for key, v in sorted(results.items())}}
    data_path(binaries.minor).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def read_results(minor: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(data_path(minor).read_text())
    return result


def recorded_minors() -> list[int]:
    return sorted(int(p.stem.split(".")[1]) for p in DATA.glob("1.*.json"))


# -- plan's side ----------------------------------------------------------------------------------------------

HOST_CONFIG_DIR = "/etc/kubernetes/scheduler-patcher"


def plan_verdict(case: Case, version: str, scratch: Path) -> str | None:
    """``plan``'s verdict on a case for a release: None when it would write the config, else its one-line problem.

    The same entry as ``scheduler-patcher plan`` (``build_config``): the config as ``config.yaml`` of a source
    folder, the image of that release and the manifest's flags."""
    from patcher.core.errors import ConfigError
    from patcher.core.schedconfig import ConfigRequest, build_config

    source = scratch / case.key
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.yaml").write_text(case.config)
    request = ConfigRequest(source_dir=source, host_config_dir=HOST_CONFIG_DIR,
                            image=f"registry.k8s.io/kube-scheduler:v{version}", scheduler_flags=case.flags)
    try:
        build_config(request)
    except ConfigError as err:
        return err.problem
    return None


def disagreements(minor: int, scratch: Path) -> list[tuple[str, Case, dict[str, str], str | None]]:
    """(key, case, recorded verdict, plan's problem) for every recorded case where plan and the binary differ."""
    cases = read_cases()
    data = read_results(minor)
    found = []
    for key, verdict in sorted(data["verdicts"].items()):
        case = cases[key]
        problem = plan_verdict(case, data["version"], scratch)
        if (problem is None) != (verdict["outcome"] == "started"):
            found.append((key, case, verdict, problem))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the cases on the built binaries and rewrite the data")
    run.add_argument("--minor", type=int, action="append", help="only these minors (default: every built one)")
    run.add_argument("--limit", type=int, default=0, help="only the first N cases (for a quick look)")
    run.add_argument("--workers", type=int, default=WORKERS)
    run.add_argument("--print", action="store_true", help="print the verdicts instead of writing the data")
    run.add_argument("--keys", help="only these cases (comma-separated hashes), merged into the recorded data")
    run.add_argument("--new", action="store_true",
                     help="only the cases each minor has no recorded verdict for, merged into the recorded data")
    compare = sub.add_parser("compare", help="list where plan and the recorded verdicts differ")
    compare.add_argument("--minor", type=int, action="append")
    args = parser.parse_args(argv)
    if args.command == "compare":
        total = known_total = 0
        known = json.loads((DATA / "known.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            for minor in args.minor or recorded_minors():
                found = disagreements(minor, Path(tmp))
                for key, case, verdict, problem in found:
                    if key in known:
                        known_total += 1
                        continue
                    total += 1
                    print(f"1.{minor} {key} {case.origin}\n  binary: {verdict['outcome']} {verdict['message']}\n"
                          f"  plan:   {problem or 'accepted'}")
        print(f"{total} disagreements ({known_total} more listed in known.json: plan stricter on purpose)")
        return 1 if total else 0
    from tools.schedconfig_cases import generate

    cases = generate()
    current = {case.key for case in cases}  # what the recorded data keeps when new verdicts are merged into it
    if args.keys or args.new:
        wanted = set(args.keys.split(",")) if args.keys else {case.key for case in cases}
        if not args.print:
            write_cases(cases)
        cases = [case for case in cases if case.key in wanted]
    elif not args.print and not args.limit:
        write_cases(cases)
    if args.limit:
        cases = cases[: args.limit]
    releases = [b for b in built_releases() if not args.minor or b.minor in args.minor]
    if not releases:
        print("no built releases: run `make real-k8s`", file=sys.stderr)
        return 1
    everything = cases
    for binaries in releases:
        known = read_results(binaries.minor) if data_path(binaries.minor).is_file() else {"verdicts": {}, "seconds": 0}
        if args.new:
            cases = [case for case in everything if case.key not in known["verdicts"]]
        began = time.monotonic()
        results = run_minor(binaries, cases, args.workers, progress=True)
        took = time.monotonic() - began
        counts = {o: sum(v.outcome == o for v in results.values()) for o in ("started", "exited", "timeout")}
        print(f"{binaries.version}: {len(cases)} cases in {took:.0f} s ({took / max(len(cases), 1):.2f} s a case,"
              f" {os.cpu_count()} cores): {counts}", flush=True)
        if args.print:
            for case in cases:
                v = results[case.key]
                print(f"  {case.key} {v.outcome:8} {v.seconds:5.1f}s {case.origin}: {v.message}")
        elif args.keys or args.new:  # merged into the recorded data, which keeps the cases the generator still makes
            merged = {key: Verdict(v["outcome"], v["message"]) for key, v in known["verdicts"].items()
                      if key in current}
            merged.update(results)
            write_results(binaries, merged, float(known["seconds"]))
        else:
            write_results(binaries, results, took)
    return 0


if __name__ == "__main__":
    sys.exit(main())
