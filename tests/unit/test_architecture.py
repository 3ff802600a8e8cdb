"""The layers stated by the folders hold: an import never points up a layer, and no module imports itself back.

patcher/core is pure (text, data, verdicts, the lifecycle), patcher/adapters touch one outside thing each (files,
inotify, processes, HTTP, the Kubernetes API), patcher/services composes them into the node's protocol, and
patcher/commands is what a user runs. A newcomer reads the tree as the architecture; this test keeps it true.

Every import counts, nested and ``TYPE_CHECKING`` ones included: a cycle or an upward reference hidden behind a
lazy import (like cli -> runner -> statuspub -> readiness -> cli once was) still ties the modules into one knot
that can only be read, tested and changed together. (This file replaces tests/test_imports.py.)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "patcher"
LAYERS = ("core", "adapters", "services", "commands")
# What the pure core may not touch: the network, processes, threads, signals, inotify, the process table.
IMPURE = frozenset({"kubernetes", "urllib3", "watchdog", "psutil", "prometheus_client", "socket", "subprocess",
                    "signal", "http", "fcntl", "select", "ssl", "asyncio", "ctypes"})


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str) -> Iterator[tuple[str, bool]]:
    """(imported module, at import time?) for every import in the module, nested ones included."""
    path = MODULES[name]
    tree = ast.parse(path.read_text("utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        eager = id(node) in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, eager
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), eager


def layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "patcher":
        return None
    if len(parts) == 1:
        return -1  # the package root holds only the version: anyone may read it
    if parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


def test_every_module_lives_in_a_layer() -> None:
    homeless = [m for m in MODULES if layer(m) is None]
    assert homeless == [], "each module belongs to core/, adapters/, services/ or commands/"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_import_points_up_a_layer(name: str) -> None:
    mine = layer(name)
    assert mine is not None
    upward = [target for target, _ in imports(name) if (lt := layer(target)) is not None and lt > mine]
    assert upward == [], f"{name} (layer {mine}) imports from a higher layer"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if layer(m) == 0))
def test_the_core_stays_pure(name: str) -> None:
    impure = sorted({target for target, _ in imports(name) if target.split(".")[0] in IMPURE})
    assert impure == [], f"{name} is in core/ but imports {impure}"


#: Calls that change the file system. The core may read (a ConfigMap mount, packaged schemas) but every write
#: goes through ``patcher.adapters.fsio`` (temp file, fsync, rename, fsync dir), which the core cannot import.
WRITERS = frozenset({"write_text", "write_bytes", "replace", "rename", "renames", "unlink", "remove", "rmdir",
                     "removedirs", "rmtree", "mkdir", "makedirs", "chmod", "chown", "fsync", "symlink", "link",
                     "touch", "mkstemp", "NamedTemporaryFile", "copyfile", "copy2", "move"})


def writes(name: str) -> Iterator[str]:
    """File-system changes a module's code makes: calls to ``WRITERS`` on a module or path, ``open`` to write."""
    for node in ast.walk(ast.parse(MODULES[name].read_text("utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        on_os = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os"
        if called in WRITERS and isinstance(func, ast.Attribute) and (called != "replace" or on_os):
            yield f"line {node.lineno}: .{called}()"  # str.replace is text, os.replace a rename
        elif called == "open" and _os_call(func):
            if _os_open_writes(node):
                yield f"line {node.lineno}: os.open() to write"
        elif called == "open":
            modes = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
            if any(not isinstance(m, ast.Constant) or set(str(m.value)) & set("wax+") for m in modes):
                yield f"line {node.lineno}: open() to write"


def _os_call(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os"


def _os_open_flags(node: ast.Call) -> set[str]:
    """The ``os.O_*`` names in an ``os.open`` call's flags (``os.O_RDONLY | os.O_NONBLOCK`` -> both)."""
    flags = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "flags")]
    return {n.attr for f in flags for n in ast.walk(f) if isinstance(n, ast.Attribute) and n.attr.startswith("O_")}


def _os_open_writes(node: ast.Call) -> bool:
    """An ``os.open`` that may change a file: a write flag, or flags this test cannot see (not spelled out)."""
    names = _os_open_flags(node)
    return not names or bool(names & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"})


@pytest.mark.parametrize("name", sorted(m for m in MODULES if layer(m) == 0))
def test_the_core_writes_no_files(name: str) -> None:
    assert list(writes(name)) == [], f"{name} is in core/ but changes files; that belongs in an adapter"


#: The one reader of files: bounded, ``O_NONBLOCK``, ``fstat`` before a byte is read, a one-line
#: refusal. A read beside it is how a speed-up (the render cache's fingerprint) once hung on a FIFO.
READER = "patcher.core.fileread"
#: Calls that read a file by themselves, whatever they are called on.
READ_CALLS = frozenset({"read_bytes", "read_text", "FileIO", "mmap"})
#: Reads outside the reader that are not of a file of the node or the source, by (module, function): why.
NOT_CONTENT_READS = {
    ("patcher.adapters.fsio", "_open_lock"): "opens the writer lock (O_NONBLOCK, O_NOFOLLOW) to flock it",
    ("patcher.adapters.fsio", "_flock"): "the lock holder's pid (at most 32 bytes), for the refusal",
}


def reads(source: str) -> Iterator[tuple[str, str]]:
    """(enclosing function, what) for every call in ``source`` that reads a file: ``read_bytes``/``read_text``
    and the like, ``os.read``, an ``os.open`` that is neither write-only nor of a folder, any other ``open``
    (``open``, ``io.open``, ``Path.open``, ``gzip.open``...) unless its mode only writes."""
    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            where = f"line {node.lineno}: "
            if called in READ_CALLS:
                yield function, where + f"{called}()"
            elif called == "read" and _os_call(func):
                yield function, where + "os.read()"
            elif called == "open" and _os_call(func):
                if not _os_open_flags(node) & {"O_WRONLY", "O_DIRECTORY"}:
                    yield function, where + "os.open() to read"
            elif called in ("open", "fdopen"):  # unless its mode only writes
                modes = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
                if not modes or any(not isinstance(m, ast.Constant) or set(str(m.value)) & set("r+") or
                                    not set(str(m.value)) & set("wax") for m in modes):
                    yield function, where + f"{called}() to read"
        for child in ast.iter_child_nodes(node):
            yield from visit(child, function)

    yield from visit(ast.parse(source), "<module>")


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != READER))
def test_every_file_read_goes_through_the_one_reader(name: str) -> None:
    """A fingerprint added for speed read the source folder with ``Path.read_bytes``, and a FIFO hung
    ``plan``, ``apply`` and the agent. Files are read by ``patcher.core.fileread``;
    the few reads of the writer lock's own pid are named in ``NOT_CONTENT_READS``, with why."""
    found = [what for function, what in reads(MODULES[name].read_text("utf-8"))
             if (name, function) not in NOT_CONTENT_READS]
    assert found == [], f"{name} reads a file beside patcher.core.fileread"


@pytest.mark.parametrize(("code", "is_read"), [
    ("Path(p).read_bytes()", True), ("p.read_text('utf-8')", True), ("open(p)", True), ("open(p, 'rb')", True),
    ("io.open(p, mode='r+')", True), ("p.open()", True), ("gzip.open(p)", True), ("os.read(fd, 10)", True),
    ("os.open(p, os.O_RDONLY)", True), ("os.open(p, os.O_RDWR | os.O_CREAT)", True), ("os.open(p, flags)", True),
    ("os.fdopen(fd)", True), ("mmap.mmap(fd, 0)", True),
    ("open(p, 'w')", False), ("os.fdopen(fd, 'wb')", False), ("open(p, 'ab')", False),
    ("os.open(p, os.O_WRONLY | os.O_CREAT)", False),
    ("os.open(p, os.O_RDONLY | os.O_DIRECTORY)", False), ("sock.recv(1)", False), ("text.replace('a', 'b')", False),
])
def test_the_read_check_tells_reads_from_the_rest(code: str, is_read: bool) -> None:
    """The check above can fail: each spelling of a read is caught, writes and non-file calls are not."""
    assert bool(list(reads(f"def f():\n    {code}\n"))) == is_read


def test_the_reads_allowed_beside_the_reader_still_exist() -> None:
    """An entry of ``NOT_CONTENT_READS`` whose read is gone would silently allow the next one there."""
    for module, function in NOT_CONTENT_READS:
        assert function in {f for f, _ in reads(MODULES[module].read_text("utf-8"))}, (module, function)


def runtime_imports(name: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import outside an ``if TYPE_CHECKING:`` block, nested ones included."""
    tree = ast.parse(MODULES[name].read_text("utf-8"))
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module


@pytest.mark.parametrize("name", sorted(m for m in MODULES if (layer(m) or 0) >= LAYERS.index("services")))
def test_services_and_commands_reach_the_api_only_through_the_kube_adapters(name: str) -> None:
    """Above adapters/, the Kubernetes client is a type name only: every request goes through
    ``patcher.adapters.kube``, where errors are translated, calls bounded and the RBAC scan sees them."""
    direct = [f"line {line}: {mod}" for line, mod in runtime_imports(name) if mod.split(".")[0] == "kubernetes"]
    assert direct == [], f"{name} imports the Kubernetes client outside TYPE_CHECKING"


def test_no_import_cycles() -> None:
    graph = {m: sorted({t for t, _ in imports(m) if t in MODULES and t != m}) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # A package importing its own submodules is how packages work, not a cycle.
            if len(component) > 1 and not all(c.startswith(min(component, key=len) + ".") or c ==
                                               min(component, key=len) for c in component):
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert cycles == [], "import cycles (lazy imports count): move the shared part down a layer"


def _listed_modules(page: str) -> dict[str, set[str]]:
    """The modules the layer diagram of docs/architecture.md lists, by layer: its right-hand column (after a
    run of 3+ spaces on each line), ``kube/{a, b}`` read as ``kube/a, kube/b``, ``schedconfig/`` as one entry."""
    block = page.split("```", 2)[1]
    text: dict[str, list[str]] = {}
    layer = ""
    for line in block.splitlines():
        if found := re.match(r"^ (\w+)/ ", line):
            layer = found.group(1)
        pieces = re.split(r"\s{3,}", line.rstrip())
        if layer and len(pieces) > 1 and re.fullmatch(r"[\w{}/, ]+", pieces[-1]):
            text.setdefault(layer, []).append(pieces[-1])
    listed: dict[str, set[str]] = {}
    for name, lines in text.items():
        joined = re.sub(r"(\w+)/\{([^}]*)\}",
                        lambda m: ", ".join(f"{m.group(1)}/{n.strip()}" for n in m.group(2).split(",")),
                        " ".join(lines))
        listed[name] = {n.strip().removesuffix("/") for n in joined.split(",") if n.strip()}
    return listed


def _modules_by_layer() -> dict[str, set[str]]:
    """Each layer's modules as the diagram names them: ``state``, ``kube/publish``, ``schedconfig`` (a package,
    one entry, with a page of its own)."""
    out: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for name in MODULES:
        parts = name.split(".")[1:]
        if len(parts) < 2 or parts[0] not in out:
            continue  # patcher, patcher.__main__, the layer packages themselves
        if parts[1] == "kube" and len(parts) == 3:
            out[parts[0]].add(f"kube/{parts[2]}")
        elif len(parts) == 2 and parts[1] != "kube":
            out[parts[0]].add(parts[1])
    return out


def test_the_architecture_page_lists_every_module_and_only_modules_that_exist() -> None:
    """docs/architecture.md is the newcomer's map: a module its layer diagram does not list is one they will not
    find, and a listed one that is gone (a removed service) sends them looking for nothing. Both directions, in
    the right layer."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text("utf-8")
    listed, actual = _listed_modules(page), _modules_by_layer()
    assert set(listed) == set(LAYERS), f"the diagram's layers: {sorted(listed)}"
    for layer in LAYERS:
        assert sorted(actual[layer] - listed[layer]) == [], f"{layer}/: modules the diagram does not list"
        assert sorted(listed[layer] - actual[layer]) == [], f"{layer}/: the diagram lists modules that do not exist"


def test_the_diagram_reader_sees_a_missing_and_a_stale_module() -> None:
    """The check above can fail: a diagram without ``nodefiles`` and with a removed ``config`` is read as such."""
    page = """x\n```\n services/   the protocol      agent, config,\n    │                  kube/{a, b}\n```\n"""
    assert _listed_modules(page) == {"services": {"agent", "config", "kube/a", "kube/b"}}
    assert "config" not in _modules_by_layer()["services"]
    assert "nodefiles" in _modules_by_layer()["services"]


def _executor_branches() -> list[str]:
    """The action classes ``Agent._execute`` has a ``case`` for, one entry per pattern (``A() | B()`` is two)."""
    tree = ast.parse(MODULES["patcher.services.agent"].read_text("utf-8"))
    (execute,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_execute"]
    (match,) = [n for n in ast.walk(execute) if isinstance(n, ast.Match)]
    names: list[str] = []
    for case in match.cases:
        patterns = case.pattern.patterns if isinstance(case.pattern, ast.MatchOr) else [case.pattern]
        for pattern in patterns:
            assert isinstance(pattern, ast.MatchClass), f"line {pattern.lineno}: a branch that is not an action"
            names.append(ast.unparse(pattern.cls).removeprefix("lifecycle."))
    return names


def test_every_lifecycle_action_has_exactly_one_executor_branch() -> None:
    """The agent only executes what ``lifecycle.step`` returns, and a ``match`` without a branch for an action
    falls through silently: a new action the executor does not know would be dropped, not refused. One branch
    per action (a second one is dead code), and no branch for something that is not an action any more."""
    from typing import get_args

    from patcher.core import lifecycle

    actions = sorted(cls.__name__ for cls in get_args(lifecycle.Action))
    branches = _executor_branches()
    assert sorted(set(branches)) == sorted(branches), "an action with two executor branches"
    assert sorted(branches) == actions


def test_the_executor_does_no_io_of_its_own() -> None:
    """``services/agent`` is the executor only: files, processes, signals, the API and the folder watch are
    reached through the services beside it (``reconcile``, ``observations``, ``record``, ``stopping``; the
    process around it is ``process``). Of the adapters it imports only ``health``, the probes' state its
    ``node`` setter keeps."""
    adapters = sorted({t for t, _ in imports("patcher.services.agent") if layer(t) == LAYERS.index("adapters")})
    assert adapters == ["patcher.adapters.health"]
