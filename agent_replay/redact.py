"""Secrets out of everything written or printed: one policy for run.json, reports, the
recorder's metadata and logs, trace content and error texts.

* A field is a credential by its name (``is_secret_key``): ``authorization``, ``cookie``,
  ``bearer``, and any name whose last word is ``key``, ``token``, ``secret``, ``password``
  or ``credentials`` (``api_key``, ``x-api-key``, ``private_key``, ``auth_token``,
  ``aws_secret_access_key``, ``clientSecret``). ``max_tokens`` or ``token_ids`` are not.
* A URL loses its user-info (``http://user:PASS@host`` -> ``http://host``).
* A text (an upstream's error message) loses every occurrence of the secrets its request
  carried (``scrub``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "<redacted>"
_LAST_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "credentials",
                         "authorization", "cookie", "bearer"})
_WHOLE = frozenset({"apikey", "accesstoken", "privatekey", "clientsecret", "setcookie",
                    "proxyauthorization", "bearer", "secret", "password", "token"})
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")
_MIN_SECRET = 6
"""Shorter values are not scrubbed out of texts (they would eat ordinary words)."""


def is_secret_key(name: str) -> bool:
    """Whether a field (header, JSON key, option) named ``name`` holds a credential."""
    words = [w for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", name).lower()) if w]
    if not words:
        return False
    return words[-1] in _LAST_WORDS or "".join(words) in _WHOLE or \
        "".join(words).endswith("apikey")


def strip_secrets(obj: Any) -> Any:
    """A copy of ``obj`` without any credential-named field, at any depth."""
    if isinstance(obj, Mapping):
        return {k: strip_secrets(v) for k, v in obj.items() if not is_secret_key(str(k))}
    if isinstance(obj, list):
        return [strip_secrets(v) for v in obj]
    return obj


def redact_url(url: str) -> str:
    """``url`` without user-info (anything else unchanged)."""
    try:
        u = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(r"\1", url)
    if u.username is None and u.password is None:
        return url
    host = u.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{u.port}" if u.port is not None else "")
    return urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))


def redact(obj: Any) -> Any:
    """A copy of ``obj`` to write or show: credential-named fields' values replaced by
    ``REDACTED`` (also in ``(name, value)`` pairs, the shape of ``--header`` options), URL
    user-info removed from every string."""
    if isinstance(obj, Mapping):
        return {k: REDACTED if is_secret_key(str(k)) and v not in (None, "") else redact(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], str) \
                and is_secret_key(obj[0]):
            return [obj[0], REDACTED]
        return [redact(v) for v in obj]
    if isinstance(obj, str) and "@" in obj and "://" in obj:
        return _USERINFO.sub(r"\1", obj)
    return obj


def header_secrets(headers: Iterable[tuple[str, str]]) -> list[str]:
    """The credential values among ``headers`` (the token of ``Bearer TOKEN`` too), for
    ``scrub``."""
    out = []
    for name, value in headers:
        if not is_secret_key(name) or not value:
            continue
        out.append(value)
        scheme, _, token = value.partition(" ")
        if token and scheme.lower() in ("bearer", "basic", "token"):
            out.append(token.strip())
    return out


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``REDACTED``, and URL
    user-info removed."""
    if not text:
        return text
    for s in sorted(set(secrets), key=len, reverse=True):
        if len(s) >= _MIN_SECRET and s in text:
            text = text.replace(s, REDACTED)
    if "@" in text and "://" in text:
        text = _USERINFO.sub(r"\1", text)
    return text


def secret_values(obj: Any) -> list[str]:
    """The string values of credential-named fields in ``obj``, at any depth, for
    ``scrub``."""
    out: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if is_secret_key(str(k)) and isinstance(v, str):
                out.append(v)
            else:
                out.extend(secret_values(v))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(secret_values(v))
    return out


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without user-info, and that user-info as an ``Authorization: Basic`` value
    (None when the URL has none)."""
    u = urlsplit(url)
    if u.username is None:
        return url, None
    pair = f"{unquote(u.username)}:{unquote(u.password or '')}"
    return redact_url(url), "Basic " + base64.b64encode(pair.encode()).decode()


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line to record: the value of every credential-named option (``--api-key
    KEY``, ``--api-key=KEY``), of a ``NAME=VALUE`` or ``NAME: VALUE`` word whose name is a
    credential (``--header Authorization=...``) replaced by ``REDACTED``; URL user-info
    removed."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if word.startswith("--"):
            name, eq, _ = word[2:].partition("=")
            if is_secret_key(name):
                out.append(f"--{name}={REDACTED}" if eq else word)
                hide_next = not eq
                continue
        for sep in ("=", ":"):
            name, found, value = word.partition(sep)
            if found and value and is_secret_key(name.strip()):
                word = f"{name}{sep}{' ' if value.startswith(' ') else ''}{REDACTED}"
                break
        out.append(redact(word))
    return out
