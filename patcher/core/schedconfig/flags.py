"""The scheduler's flags: which ``--config`` it reads, and its deprecated flags carried into the rendered config.

``--config`` is found by one rule, pflag's, for the manifest patcher, the carried flags and the local process
check alike (they must agree on which file is in use): ``--config=X`` or ``--config X`` (pflag gives a string flag
the next argument, even one starting with ``-``; a bare ``--config`` at the end has no value), the last one wins,
``--`` ends the flags, and ``-config`` (pflag's shorthands ``-c -o -n …``) or ``---config`` is not it. Items that
are not strings (a YAML flag list can hold a number or a mapping) are never a flag and never a value.

With ``--config`` set, kube-scheduler ignores its deprecated flags, ``--kubeconfig`` among them: a config without
``clientConnection.kubeconfig`` makes a kubeadm scheduler fall back to in-cluster credentials it does not have,
and it exits. So every deprecated flag with a config field is copied into the config we render; flags that are
still real (``--bind-address``, ``--secure-port``, logging, feature gates …) keep working beside ``--config``.
The legacy Policy flags cannot be carried and are refused with a way out.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from patcher.core.errors import ConfigError
from patcher.core.schedconfig.duration import is_duration
from patcher.core.schedconfig.schema import Schema
from patcher.core.yamltext import format_path

CONFIG_FLAG = "--config"


@dataclass(frozen=True)
class ConfigFlag:
    value: str
    index: int  # the item that names the flag: ``--config=X``, or a bare ``--config`` (its value the next item)


def config_flags(items: Sequence[object]) -> list[ConfigFlag]:
    """Every ``--config`` pflag would see in ``items`` (the scheduler's arguments), in order."""
    found: list[ConfigFlag] = []
    index = 0
    while index < len(items):
        item = items[index]
        if item == "--":
            break
        if isinstance(item, str) and item.startswith(CONFIG_FLAG + "="):
            found.append(ConfigFlag(item[len(CONFIG_FLAG) + 1:], index))
        elif item == CONFIG_FLAG and index + 1 < len(items):
            value = items[index + 1]
            if isinstance(value, str):
                found.append(ConfigFlag(value, index))
            index += 1  # the value is consumed, whatever it is: it cannot be a flag of its own
        index += 1
    return found


def config_flag(items: Sequence[object]) -> ConfigFlag | None:
    """The ``--config`` that takes effect (the last one), or None."""
    found = config_flags(items)
    return found[-1] if found else None


# Flags that never take the next item as their value (pflag booleans), so "--leader-elect" alone means true.
BOOL_FLAGS = frozenset(
    {
        "leader-elect",
        "profiling",
        "contention-profiling",
        "use-legacy-policy-config",
        "also-stdout",
        "redirect-stderr",
        "alsologtostderr",
        "logtostderr",
        "add-dir-header",
        "skip-headers",
        "skip-log-headers",
        "one-output",
        "log-json-split-stream",
        "authentication-skip-lookup",
        "authentication-tolerate-lookup-failure",
        "permit-address-sharing",
        "permit-port-sharing",
        "help",
    }
)

# flag -> (where it lives in the config, value type); not carried where the apiVersion lacks the top-level field.
# In the order we write them (top-level keys as kube-scheduler writes them); a deprecated spelling comes before
# the newer one for the same field, which wins when both are given.
CARRIED: dict[str, tuple[tuple[str | int, ...], str]] = {
    "leader-elect": (("leaderElection", "leaderElect"), "bool"),
    "leader-elect-lease-duration": (("leaderElection", "leaseDuration"), "duration"),
    "leader-elect-renew-deadline": (("leaderElection", "renewDeadline"), "duration"),
    "leader-elect-retry-period": (("leaderElection", "retryPeriod"), "duration"),
    "leader-elect-resource-lock": (("leaderElection", "resourceLock"), "string"),
    "lock-object-name": (("leaderElection", "resourceName"), "string"),
    "lock-object-namespace": (("leaderElection", "resourceNamespace"), "string"),
    "leader-elect-resource-name": (("leaderElection", "resourceName"), "string"),
    "leader-elect-resource-namespace": (("leaderElection", "resourceNamespace"), "string"),
    "kubeconfig": (("clientConnection", "kubeconfig"), "path"),
    "kube-api-content-type": (("clientConnection", "contentType"), "string"),
    "kube-api-qps": (("clientConnection", "qps"), "float"),
    "kube-api-burst": (("clientConnection", "burst"), "int"),
    "profiling": (("enableProfiling",), "bool"),
    "contention-profiling": (("enableContentionProfiling",), "bool"),
    "scheduler-name": (("profiles", 0, "schedulerName"), "string"),
    "hard-pod-affinity-symmetric-weight": (("profiles", 0, "pluginConfig"), "int"),
    "failure-domains": (("failureDomains",), "string"),
}
_ALGORITHM_SOURCE = ("policy-config-file", "policy-configmap", "use-legacy-policy-config", "algorithm-provider")
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True)
class Carried:
    """One flag value to write into the config: ``path`` is a list of keys, an int indexes a list."""

    flag: str
    path: tuple[str | int, ...]
    value: Any

    @property
    def field_text(self) -> str:
        return format_path(self.path)


def _is_binary(item: str, previous: str | None) -> bool:
    name = posixpath.basename(item)
    if name == "kube-scheduler":
        return True
    return name == "scheduler" and previous is not None and posixpath.basename(previous).endswith("hyperkube")


def parse_flags(items: Sequence[str]) -> dict[str, str | None]:
    """The scheduler's own flags as name → value (None for a bare boolean), last occurrence winning like pflag.

    Items are as written in the manifest: ``--a=b``, ``--a`` ``b`` as two items, bare ``--flag``. When a wrapper
    (``/go-runner … /usr/local/bin/kube-scheduler …``, ``/hyperkube scheduler …``) precedes the binary, only
    the flags after the binary are the scheduler's.
    """
    flags: dict[str, str | None] = {}
    previous_positional: str | None = None
    own = 0  # where the scheduler's own arguments start
    index = 0
    while index < len(items):
        item = items[index]
        index += 1
        if not item.startswith("-") or item in ("-", "--"):
            if not own and _is_binary(item, previous_positional):  # the first one: a later word is an argument
                flags, own = {}, index  # everything before the binary belonged to the wrapper
            previous_positional = item
            continue
        name, sep, value = item.lstrip("-").partition("=")
        if sep:
            flags[name] = value
        elif name in BOOL_FLAGS or index >= len(items) or items[index].startswith("-"):
            flags[name] = None
        else:
            flags[name] = items[index]
            index += 1
    # --config by the one rule the manifest patcher and the process check use too
    flags.pop("config", None)
    config = config_flag(items[own:])
    if config is not None:
        flags["config"] = config.value
    return flags


def parse_bool(raw: str | None) -> bool | None:
    """A pflag boolean: the flag alone is true; None when the value is not one of strconv.ParseBool's."""
    if raw is None or raw in _TRUE:
        return True
    return False if raw in _FALSE else None


def _convert(flag: str, kind: str, raw: str | None, where: str | None) -> Any:
    shown = f"--{flag}" if raw is None else f"--{flag}={raw}"
    if kind == "bool":
        if (value := parse_bool(raw)) is None:
            raise ConfigError(where, f"{shown}: not a boolean (true or false)")
        return value
    if raw is None:
        raise ConfigError(where, f"--{flag}: the flag needs a value")
    if kind == "int":
        try:
            return int(raw, 10)
        except ValueError:
            raise ConfigError(where, f"{shown}: not an integer") from None
    if kind == "float":
        try:
            number = float(raw)
        except ValueError:
            raise ConfigError(where, f"{shown}: not a number") from None
        return int(number) if number.is_integer() else number
    if kind == "duration" and not is_duration(raw):
        raise ConfigError(where, f"{shown}: not a duration (e.g. 15s)")
    if kind == "path" and raw and not posixpath.isabs(raw):
        raise ConfigError(where, f"{shown}: must be an absolute path (the config does not resolve relative paths)")
    return raw


def _algorithm_source_flag(flags: dict[str, str | None]) -> str | None:
    """The first flag that makes the scheduler read a legacy Policy or a non-default provider, as written."""
    for flag in _ALGORITHM_SOURCE:
        if flag not in flags:
            continue
        value = flags[flag]
        shown = f"--{flag}" if value is None else f"--{flag}={value}"
        if flag == "use-legacy-policy-config":
            if parse_bool(value):
                return shown
        elif value and not (flag == "algorithm-provider" and value == "DefaultProvider"):
            return shown
    return None


def carried_settings(
    flags: dict[str, str | None], schema: Schema, *, where: str | None = None
) -> tuple[list[Carried], list[str]]:
    """The config values that the manifest's (``where``) deprecated flags stand for, and notes on what was skipped."""
    refused = _algorithm_source_flag(flags)
    if refused is not None:
        raise ConfigError(
            where,
            f"{refused}: the scheduler takes its algorithm and extenders from a legacy Policy, which cannot be "
            "combined with the config scheduler-patcher writes (with --config 1.19–1.22 replaces our extenders "
            "with the Policy's, 1.23+ exits on the unknown flag); "
            "move the Policy's extenders into the source folder's extenders.yaml and remove the flag",
        )
    notes: list[str] = []
    chosen: dict[tuple[str | int, ...], Carried] = {}
    for flag, (path, kind) in CARRIED.items():
        if flag not in flags:
            continue
        value = _convert(flag, kind, flags[flag], where)
        if path[0] not in schema.types[schema.root].fields:
            notes.append(f"--{flag} has no field in {schema.api_version}; not carried (the scheduler ignores it)")
            continue
        if flag == "hard-pod-affinity-symmetric-weight":
            value = [{"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": value}}]
        chosen[path] = Carried(flag=f"--{flag}", path=path, value=value)
    order = list(CARRIED)
    return sorted(chosen.values(), key=lambda c: order.index(c.flag[2:])), notes
