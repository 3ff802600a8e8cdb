"""The one rule for kube-scheduler's ``--config`` in a flag list, as its pflag command line reads it: the manifest
patcher, the carried flags and the local process check must agree on which file is in use.

* ``--config=X`` and ``--config X`` (pflag gives a string flag the next argument, even one starting with ``-``);
  a bare ``--config`` at the end has no value; the last occurrence wins; ``--`` ends the flags;
* ``-config`` (pflag's shorthands ``-c -o -n …``: kube-scheduler refuses to start) and ``---config`` are not it.

Items that are not strings (a YAML flag list can hold a number or a mapping) are never a flag and never a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CONFIG_FLAG = "--config"


@dataclass(frozen=True)
class ConfigFlag:
    value: str
    index: int  # the item that names the flag: ``--config=X``, or a bare ``--config``
    split: bool  # the value is the item after ``index``


def config_flags(items: Sequence[object]) -> list[ConfigFlag]:
    """Every ``--config`` pflag would see in ``items`` (the scheduler's arguments), in order."""
    found: list[ConfigFlag] = []
    index = 0
    while index < len(items):
        item = items[index]
        if item == "--":
            break
        if isinstance(item, str) and item.startswith(CONFIG_FLAG + "="):
            found.append(ConfigFlag(item[len(CONFIG_FLAG) + 1:], index, split=False))
        elif item == CONFIG_FLAG and index + 1 < len(items):
            value = items[index + 1]
            if isinstance(value, str):
                found.append(ConfigFlag(value, index, split=True))
            index += 1  # the value is consumed, whatever it is: it cannot be a flag of its own
        index += 1
    return found


def config_flag(items: Sequence[object]) -> ConfigFlag | None:
    """The ``--config`` that takes effect (the last one), or None."""
    found = config_flags(items)
    return found[-1] if found else None
