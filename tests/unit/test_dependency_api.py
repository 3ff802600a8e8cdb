"""patcher/ uses ``kubernetes``, ``urllib3`` and ``ruamel.yaml`` through their public names only: a private name
(one leading underscore) is a promise nobody made, so a new release may break it without notice, and the caps in
pyproject.toml would have to stay to protect it.

The scan is static (AST) and follows what a module can see: names bound by an import from those packages, and
whatever is assigned from them (``y = YAML()``, ``self.rest_client = RESTClientObject(...)``, a parameter
annotated with one of their classes). It flags an import of a private name, an attribute access ``x._y`` on such
a name, and ``getattr``/``setattr``/``hasattr``/``delattr`` with a private constant name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kubernetes", "urllib3", "ruamel")
REFLECTION = frozenset({"getattr", "setattr", "hasattr", "delattr"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in PACKAGES


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _root(node: ast.AST) -> ast.AST:
    """The expression a chain of attributes, calls and subscripts starts from."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


class _Scan:
    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.tracked: set[str] = set()
        self.findings: list[str] = []

    def derived(self, node: ast.AST | None) -> bool:
        """Whether ``node`` is (an attribute, call or item of) something that came from the packages."""
        if node is None:
            return False
        chain: ast.AST = node
        while True:
            name = _dotted(chain)
            if name is not None and name in self.tracked:
                return True
            if not isinstance(chain, ast.Attribute | ast.Call | ast.Subscript):
                return False
            chain = chain.func if isinstance(chain, ast.Call) else chain.value

    def annotation_derived(self, node: ast.AST | None) -> bool:
        return node is not None and any(self.derived(n) for n in ast.walk(node)
                                        if isinstance(n, ast.Name | ast.Attribute))

    def imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _ours(alias.name):
                        if any(_private(part) for part in alias.name.split(".")):
                            self.findings.append(f"line {node.lineno}: import {alias.name}")
                        self.tracked.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and _ours(node.module):
                assert node.module is not None
                if any(_private(part) for part in node.module.split(".")):
                    self.findings.append(f"line {node.lineno}: from {node.module} import ...")
                for alias in node.names:
                    if _private(alias.name):
                        self.findings.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                    self.tracked.add(alias.asname or alias.name)

    def bindings(self) -> None:
        """Names assigned from tracked expressions, and parameters annotated with tracked classes, to a fixpoint."""
        while True:
            before = len(self.tracked)
            for node in ast.walk(self.tree):
                targets: list[ast.AST] = []
                if isinstance(node, ast.Assign) and self.derived(node.value):
                    targets = list(node.targets)
                elif isinstance(node, ast.AnnAssign) and (self.derived(node.value)
                                                          or self.annotation_derived(node.annotation)):
                    targets = [node.target]
                elif isinstance(node, ast.withitem) and self.derived(node.context_expr) and node.optional_vars:
                    targets = [node.optional_vars]
                elif isinstance(node, ast.arg) and self.annotation_derived(node.annotation):
                    self.tracked.add(node.arg)
                for target in targets:
                    for sub in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                        name = _dotted(sub)
                        if name is not None:
                            self.tracked.add(name)
            if len(self.tracked) == before:
                return

    def accesses(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and self.derived(node.value):
                self.findings.append(f"line {node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Call) and self.reflects_private(node):
                self.findings.append(f"line {node.lineno}: {ast.unparse(node)}")

    def reflects_private(self, call: ast.Call) -> bool:
        """``getattr(obj, "_name")`` and its kin on a tracked object."""
        if not (isinstance(call.func, ast.Name) and call.func.id in REFLECTION and len(call.args) >= 2):
            return False
        name = call.args[1]
        return (isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value)
                and self.derived(call.args[0]))


def private_uses(source: str) -> list[str]:
    """Every use of a private name of the packages in ``source`` (see the module docstring)."""
    scan = _Scan(ast.parse(source))
    scan.imports()
    scan.bindings()
    scan.accesses()
    return scan.findings


@pytest.mark.parametrize("source", [
    "from kubernetes.client.rest import _helper\n",
    "from urllib3.util import _private_thing as ok\n",
    "import ruamel.yaml._internal\n",
    "from ruamel.yaml._sub import x\n",
    "import urllib3\nurllib3._collections.thing()\n",
    "from ruamel.yaml import YAML\ny = YAML(typ='safe')\ny._resolver = None\n",
    "from ruamel.yaml import YAML\nclass C:\n    def __init__(self) -> None:\n        self.y = YAML()\n"
    "    def f(self) -> None:\n        self.y.Resolver._table.clear()\n",
    "from kubernetes.client.rest import RESTClientObject\nc = RESTClientObject(None)\nm = c.pool_manager\n"
    "p = m.connection_from_url('x')\nif p._get_conn(): pass\n",
    "from ruamel.yaml.resolver import VersionedResolver\ndef f(r: VersionedResolver) -> None:\n"
    "    return getattr(r, '_version_implicit_resolver')\n",
    "import kubernetes.client as k\nwith k.ApiClient() as api:\n    api._pool = None\n",
])
def test_the_scan_finds_a_private_name_however_it_is_reached(source: str) -> None:
    assert private_uses(source), source


@pytest.mark.parametrize("source", [
    "from ruamel.yaml import YAML\ny = YAML()\ny.Parser.__name__\n",  # dunders are public
    "import urllib3\nclass A:\n    def __init__(self) -> None:\n        self._lock = 1\n"
    "        urllib3.PoolManager()\n",  # our own private attribute
    "import json\njson._default_encoder\n",  # another package's business
])
def test_the_scan_leaves_public_names_and_our_own_private_ones(source: str) -> None:
    assert private_uses(source) == []


def test_patcher_uses_kubernetes_urllib3_and_ruamel_through_public_names_only() -> None:
    found = {str(path.relative_to(ROOT)): uses for path in sorted((ROOT / "patcher").rglob("*.py"))
             if (uses := private_uses(path.read_text(encoding="utf-8")))}
    assert found == {}
