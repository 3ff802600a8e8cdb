"""Print pip constraints that pin every runtime dependency of pyproject.toml to its declared lower bound.

``make test-min`` installs the project with these constraints and runs the suite, so a floor in pyproject.toml
is a version the tests have passed on, not a guess. A dependency without a ``>=`` floor is an error: an
unbounded dependency cannot be tested at its lowest version.

Usage: ``python tools/floor_constraints.py [pyproject.toml] > constraints-min.txt``; ``--check`` instead tells
which installed versions differ from the floors (exit 1).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

_REQ = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<spec>[^;]*?)\s*(?:;\s*(?P<marker>.+))?$")


def floor_constraints(pyproject: str) -> list[str]:
    """One ``name==floor[; marker]`` line per runtime dependency, in pyproject order."""
    deps: list[str] = tomllib.loads(pyproject)["project"]["dependencies"]
    lines = []
    for dep in deps:
        found = _REQ.match(dep)
        if found is None:
            raise ValueError(f"pyproject.toml: cannot read the dependency {dep!r}")
        floors = [part.strip()[2:].strip() for part in found["spec"].split(",") if part.strip().startswith(">=")]
        if len(floors) != 1:
            raise ValueError(f"pyproject.toml: dependency {dep!r} needs exactly one '>=' lower bound")
        marker = f"; {found['marker'].strip()}" if found["marker"] else ""
        lines.append(f"{found['name']}=={floors[0]}{marker}")
    return lines


def not_at_floor(lines: list[str]) -> list[str]:
    """The constraints the running interpreter does not satisfy: proof that the floor venv really has the floors."""
    wrong = []
    for line in lines:
        spec, _, marker = line.partition(";")
        name, _, floor = spec.strip().partition("==")
        if marker and "CPython" in marker and sys.implementation.name != "cpython":
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != floor:
            wrong.append(f"{name}: {installed}, expected {floor}")
    return wrong


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv[1:] if a != "--check"]
    path = Path(args[0] if args else Path(__file__).resolve().parents[1] / "pyproject.toml")
    try:
        lines = floor_constraints(path.read_text())
    except (OSError, ValueError, KeyError) as exc:
        print(f"floor_constraints: {path}: {exc}", file=sys.stderr)
        return 1
    if not check:
        print("\n".join(lines))
        return 0
    wrong = not_at_floor(lines)
    for problem in wrong:
        print(f"floor_constraints: not at the floor: {problem}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
