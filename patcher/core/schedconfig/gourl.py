"""An extender's ``urlPrefix`` checked as the scheduler will use it: Go's ``net/url.Parse`` and ``net/http``.

kube-scheduler does not validate ``urlPrefix`` at start-up; every call builds ``urlPrefix + "/" + verb`` for
``http.NewRequest``, so a prefix Go cannot parse starts fine and fails every call (no pod is scheduled through a
non-ignorable extender). Python's ``urllib`` is both more lenient and stricter, so this ports the parts of
``net/url`` that matter (``Parse``, ``parseAuthority``, ``parseHost``, ``validOptionalPort``, ``unescape``) plus the
client's own refusals (no host, a scheme other than http/https, a port that cannot be dialled).
"""

from __future__ import annotations

import string

_ABSOLUTE = "must be an http:// or https:// URL with a host"
_HEX = frozenset(string.hexdigits)
_SCHEME_FIRST = frozenset(string.ascii_letters)
_SCHEME_REST = frozenset(string.ascii_letters + string.digits + "+-.")
# net/url shouldEscape(c, encodeHost) is false for these (besides alphanumerics): RFC 3986 sub-delims, ':',
# brackets for IPv6 literals, '%' (escapes are checked separately) and '_' , '-', '.', '~'.
_HOST_OK = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:[]<>\"%")
# validUserinfo in net/url.
_USERINFO_OK = frozenset(string.ascii_letters + string.digits + "-._:~!$&'()*+,;=%@")


def _bad_escape(text: str) -> str | None:
    """The first malformed ``%`` escape, as net/url's unescape reports it."""
    index = 0
    while index < len(text):
        if text[index] == "%":
            escape = text[index : index + 3]
            if len(escape) < 3 or escape[1] not in _HEX or escape[2] not in _HEX:
                return escape
            index += 3
        else:
            index += 1
    return None


def _ascii_escape_in_host(name: str) -> str | None:
    """Go allows ``%XX`` in a host name only for non-ASCII bytes (and ``%25``): an escaped ASCII character is an
    error there, so ``http://a%41/`` fails although the escape itself is well formed."""
    index = name.find("%")
    while index >= 0:
        escape = name[index : index + 3]
        if escape != "%25" and int(escape[1], 16) < 8:
            return escape
        index = name.find("%", index + 3)
    return None


def _port_problem(port: str) -> str | None:
    """validOptionalPort (digits only), then what the dialler needs (1–65535)."""
    if not port:
        return None
    if not port.isascii() or not port.isdigit():
        return f"invalid port {':' + port!r} after host"
    if not 0 < int(port) <= 65535:
        return f"port {port} is out of range (1–65535): every connection attempt would fail"
    return None


def _host_problem(host: str) -> str | None:
    """parseHost plus the host-mode unescape: brackets, port, and characters that a host cannot hold."""
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return "missing ']' in host"
        rest = host[end + 1 :]
        if rest and not rest.startswith(":"):
            return f"invalid port {rest!r} after host"
        name = host[1:end]
        port = rest[1:]
    else:
        name, colon, port = host.rpartition(":")
        if not colon:
            name, port = host, ""
    problem = _port_problem(port)  # none for an empty port: Go accepts "host:"
    if problem:
        return problem
    escape = _bad_escape(host)
    if escape is None and not host.startswith("["):
        escape = _ascii_escape_in_host(name)  # unescape(host, encodeHost): %XX of an ASCII byte, except %25
    if escape is not None:
        return f"invalid URL escape {escape!r}"
    for char in name:
        if ord(char) < 0x80 and char not in _HOST_OK:
            return f"invalid character {char!r} in host name"
    return None


def url_problem(url: str) -> str | None:
    """Why Go's HTTP client cannot call ``url`` + ``/verb``, or None when it can."""
    char = next((c for c in url if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if char is not None:
        return f"invalid control character {char!r} in URL (Go's url.Parse refuses it)"
    scheme, colon, rest = url.partition(":")
    if not colon or not scheme or scheme[0] not in _SCHEME_FIRST or any(c not in _SCHEME_REST for c in scheme):
        return f"{_ABSOLUTE} (missing protocol scheme)"
    if scheme.lower() not in ("http", "https"):
        return f"unsupported protocol scheme {scheme!r} (the scheduler's HTTP client speaks http and https)"
    if "#" in rest or "?" in rest:
        return (
            "must not contain '?' or '#': the scheduler appends '/<verb>' to urlPrefix, which would end up in "
            "the query or fragment and every verb would call the same URL"
        )
    if not rest.startswith("//"):
        return f"{_ABSOLUTE} (no '//' after the scheme)"
    authority, _, path = rest[2:].partition("/")
    userinfo, at, host = authority.rpartition("@")
    if at and any(c not in _USERINFO_OK for c in userinfo):
        return "invalid userinfo"
    if not host or host.startswith(":"):
        return f"{_ABSOLUTE} (no host)"
    problem = _host_problem(host)
    if problem:
        return problem
    escape = _bad_escape(path)
    if escape is not None:
        return f"invalid URL escape {escape!r}"
    return None
