#!/bin/sh
# Prints the path of a real promtool (Prometheus's rule and metrics checker), fetching it once.
#
# Where it comes from: Debian's `prometheus` package (bookworm: 2.42), downloaded with `apt-get download` (no
# root, nothing installed, no Prometheus service started) and only usr/bin/promtool unpacked into a cache
# outside the clone. Why not a build from the Go module proxy: promtool's module pulls in Prometheus's service
# discovery (Kubernetes client, cloud SDKs): minutes of compiling on a 2-core machine and hundreds of MB of
# modules, against one 19 MB package here. Where the package lists are missing (a fresh container), they are
# fetched with `apt-get update` when running as root.
#
#   promtool="$(tools/get-promtool.sh)"
#
# $PROMTOOL, when set, is used as is. Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/scheduler-patcher/promtool/.
# Exit 2 with one line on stderr when promtool cannot be had (the tests then skip, or fail under CI=true).
set -eu

if [ -n "${PROMTOOL:-}" ]; then
    [ -x "$PROMTOOL" ] || { echo "get-promtool: PROMTOOL=$PROMTOOL is not executable" >&2; exit 2; }
    echo "$PROMTOOL"
    exit 0
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/scheduler-patcher/promtool"
bin="$cache/promtool"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

command -v apt-get >/dev/null || { echo "get-promtool: no apt-get here (set PROMTOOL=/path/to/promtool)" >&2; exit 2; }
candidate() { apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: *//p'; }
version="$(candidate)"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    [ "$(id -u)" = 0 ] || { echo "get-promtool: no apt package list knows prometheus (run apt-get update)" >&2; exit 2; }
    apt-get update -qq >/dev/null 2>&1 || { echo "get-promtool: apt-get update failed" >&2; exit 2; }
    version="$(candidate)"
    { [ -n "$version" ] && [ "$version" != "(none)" ]; } || { echo "get-promtool: no prometheus package" >&2; exit 2; }
fi

mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# apt drops root to _apt for downloads: the folder must be writable by it, or apt warns and downloads as root.
chmod 0777 "$work"
(cd "$work" && apt-get download -qq "prometheus=$version" >/dev/null 2>&1) \
    || { echo "get-promtool: apt-get download prometheus=$version failed" >&2; exit 2; }
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -xf - -C "$work" ./usr/bin/promtool \
    || { echo "get-promtool: no usr/bin/promtool in prometheus=$version" >&2; exit 2; }
"$work/usr/bin/promtool" --version >/dev/null 2>&1 || { echo "get-promtool: promtool from $version does not run" >&2; exit 2; }
mv -f "$work/usr/bin/promtool" "$bin"
echo "$version" > "$cache/version"
echo "$bin"
