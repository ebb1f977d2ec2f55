"""Secrets out of everything written or printed: one policy for run.json, reports, the
recorder's metadata and logs, trace content and error texts.

* A field is a credential by its name (``is_secret_key``): ``authorization``, ``cookie``,
  ``bearer``, and any name whose last word is ``key``, ``token``, ``secret``, ``password``
  or ``credentials`` (``api_key``, ``x-api-key``, ``private_key``, ``auth_token``,
  ``aws_secret_access_key``, ``clientSecret``). ``max_tokens`` or ``token_ids`` are not.
* A URL loses its user-info (``http://user:PASS@host`` -> ``http://host``).
* A text (an upstream's error message) loses every occurrence of the secrets its request
  carried (``scrub``), in the forms a server may echo them in (``secret_forms``: the
  token of ``Bearer TOKEN``, base64 and its decoding for ``Basic``, percent- and
  JSON-escaped).
* A header's value is written only when its name is on a short list of names that never
  carry credentials (``SAFE_HEADERS``): a header a user adds (``X-Auth``, ``X-Trace``) may
  be a credential whatever its name, so every other value is written as ``REDACTED``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

REDACTED = "<redacted>"
_LAST_WORDS = frozenset(
    {
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "credentials",
        "authorization",
        "cookie",
        "bearer",
    }
)
_WHOLE = frozenset(
    {
        "apikey",
        "accesstoken",
        "privatekey",
        "clientsecret",
        "setcookie",
        "proxyauthorization",
        "bearer",
        "secret",
        "password",
        "token",
    }
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[^a-z0-9]+")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")
_MIN_SECRET = 6
"""Shorter values are not scrubbed out of texts (they would eat ordinary words)."""
SAFE_HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "anthropic-beta",
        "anthropic-version",
        "cache-control",
        "connection",
        "content-length",
        "content-type",
        "host",
        "openai-beta",
        "transfer-encoding",
        "user-agent",
        "x-request-id",
        "x-session-id",
    }
)
"""Header names whose values are written (run.json, sweep.json) and not treated as secrets;
the values of all others are."""


def is_secret_key(name: str) -> bool:
    """Whether a field (header, JSON key, option) named ``name`` holds a credential."""
    words = [w for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", name).lower()) if w]
    if not words:
        return False
    return words[-1] in _LAST_WORDS or "".join(words) in _WHOLE or "".join(words).endswith("apikey")


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


def _shown_header(name: Any, value: Any) -> bool:
    """Whether a header's value is written as it is: a safe name, or nothing to hide."""
    return str(name).lower() in SAFE_HEADERS or value in (None, "")


def _redact_header_pair(pair: Any) -> Any:
    if isinstance(pair, (list, tuple)) and len(pair) == 2:
        name, value = pair
        return [name, redact(value) if _shown_header(name, value) else REDACTED]
    return REDACTED


def redact_headers(headers: Any) -> Any:
    """Headers (a mapping or ``(name, value)`` pairs) to write: the value of every name not
    in ``SAFE_HEADERS`` replaced by ``REDACTED``."""
    if isinstance(headers, Mapping):
        return {k: v if _shown_header(k, v) else REDACTED for k, v in headers.items()}
    if isinstance(headers, (list, tuple)):
        return [_redact_header_pair(pair) for pair in headers]
    return REDACTED if headers not in (None, "") else headers


def _redact_field(key: Any, value: Any) -> Any:
    if is_secret_key(str(key)) and value not in (None, ""):
        return REDACTED
    if str(key).lower().endswith("headers"):
        return redact_headers(value)
    return redact(value)


def _is_secret_pair(obj: list[Any] | tuple[Any, ...]) -> bool:
    """A ``(name, value)`` pair of strings whose name is a credential's."""
    return (
        len(obj) == 2
        and isinstance(obj[0], str)
        and isinstance(obj[1], str)
        and is_secret_key(obj[0])
    )


def redact(obj: Any) -> Any:
    """A copy of ``obj`` to write or show: credential-named fields' values replaced by
    ``REDACTED`` (also in ``(name, value)`` pairs, the shape of ``--header`` options), the
    values of a field named ``headers`` (or ``*_headers``) kept only for ``SAFE_HEADERS``,
    URL user-info removed from every string."""
    if isinstance(obj, Mapping):
        return {k: _redact_field(k, v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [obj[0], REDACTED] if _is_secret_pair(obj) else [redact(v) for v in obj]
    if isinstance(obj, str) and "@" in obj and "://" in obj:
        return _USERINFO.sub(r"\1", obj)
    return obj


def header_secrets(headers: Iterable[tuple[str, str]]) -> list[str]:
    """The values among ``headers`` that may be credentials (every name not in
    ``SAFE_HEADERS``), in every form ``secret_forms`` lists, for ``scrub``."""
    return secret_forms(v for k, v in headers if k.lower() not in SAFE_HEADERS and v)


def _basic_parts(token: str) -> list[str]:
    """The decoded ``user:pass`` of a ``Basic`` token and its parts (none when it does not
    decode)."""
    try:
        pair = base64.b64decode(token, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return []
    if not pair:
        return []
    user, _, password = pair.partition(":")
    return [pair, user, password]


def _plain_forms(value: str) -> list[str]:
    """A header value, the token of its ``SCHEME TOKEN`` and, for ``Basic``, its parts."""
    value = value.strip()
    if not value:
        return []
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if not token:
        return [value]
    return [value, token, *(_basic_parts(token) if scheme.lower() == "basic" else [])]


def _encoded_forms(s: str) -> list[str]:
    """``s`` base64-encoded (with and without padding, standard and URL-safe),
    percent-encoded and JSON-escaped."""
    raw = s.encode()
    out: list[str] = []
    for enc in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        out += [enc.decode(), enc.decode().rstrip("=")]
    return out + [quote(s, safe=""), quote_plus(s), json.dumps(s)[1:-1]]


def secret_forms(values: Iterable[str]) -> list[str]:
    """Each value as a server may echo it: itself, the token of ``Bearer TOKEN`` (any
    ``SCHEME TOKEN``), for ``Basic`` the decoded ``user:pass`` and its parts; and each of
    those base64-encoded (with and without padding, standard and URL-safe), percent-encoded
    and JSON-escaped."""
    plain = [form for value in values for form in _plain_forms(value)]
    out = set(plain)
    for s in plain:
        if len(s) >= _MIN_SECRET:
            out.update(_encoded_forms(s))
    return sorted((s for s in out if len(s) >= _MIN_SECRET), key=len, reverse=True)


def userinfo_secrets(url: str) -> list[str]:
    """The user-info of ``url`` (``user:pass``, and each part), in every form
    ``secret_forms`` lists."""
    try:
        u = urlsplit(url)
    except ValueError:
        return []
    if u.username is None:
        return []
    pair = f"{unquote(u.username)}:{unquote(u.password or '')}"
    return secret_forms(
        ["Basic " + base64.b64encode(pair.encode()).decode(), u.username, u.password or ""]
    )


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``REDACTED``, and URL
    user-info removed."""
    if not text:
        return text
    for s in sorted(set(secrets), key=len, reverse=True):
        if len(s) >= _MIN_SECRET and s in text and s != REDACTED:
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


def _hidden(word: str) -> str:
    return REDACTED


def _secret_assignment(word: str) -> str:
    """A ``NAME=VALUE`` or ``NAME: VALUE`` word with its value redacted when the name is a
    credential's."""
    for sep in ("=", ":"):
        name, found, value = word.partition(sep)
        if found and value and is_secret_key(name.strip()):
            return f"{name}{sep}{' ' if value.startswith(' ') else ''}{REDACTED}"
    return word


def _argv_word(word: str) -> tuple[str, Callable[[str], str] | None]:
    """(a word of a command line to record, how to record the word after it when this one
    decides that: hidden after a credential option, as a header after ``--header``)."""
    if word.startswith("--header="):
        return "--header=" + _header_word(word[len("--header=") :]), None
    if word in ("--header", "-H"):
        return word, _header_word
    if word.startswith("--"):
        name, eq, _ = word[2:].partition("=")
        if is_secret_key(name):
            return (f"--{name}={REDACTED}", None) if eq else (word, _hidden)
    return redact(_secret_assignment(word)), None


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line to record: the value of every credential-named option (``--api-key
    KEY``, ``--api-key=KEY``), of a ``NAME=VALUE`` or ``NAME: VALUE`` word whose name is a
    credential (``--header Authorization=...``) replaced by ``REDACTED``; URL user-info
    removed."""
    out: list[str] = []
    next_word: Callable[[str], str] | None = None
    for word in argv:
        if next_word is not None:
            out.append(next_word(word))
            next_word = None
        else:
            shown, next_word = _argv_word(word)
            out.append(shown)
    return out


def _header_word(item: str) -> str:
    """A ``NAME=VALUE`` (or ``NAME: VALUE``) header option, its value redacted unless the
    name is in ``SAFE_HEADERS``."""
    for sep in ("=", ":"):
        name, found, _ = item.partition(sep)
        if found:
            return item if name.strip().lower() in SAFE_HEADERS else f"{name}{sep}{REDACTED}"
    return REDACTED


class Scrubber:
    """``scrub`` for the texts of a run's requests: the secrets are the ``header_secrets``
    of each request's headers (found once per distinct set of values) and ``extra``."""

    __slots__ = ("_cache", "_extra")

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self._extra = list(extra)
        self._cache: dict[tuple[str, ...], list[str]] = {}

    def __call__(self, text: str, headers: Mapping[str, str]) -> str:
        key = tuple(v for k, v in headers.items() if k.lower() not in SAFE_HEADERS)
        forms = self._cache.get(key)
        if forms is None:
            if len(self._cache) >= 64:
                self._cache.clear()
            forms = self._cache[key] = header_secrets(headers.items()) + self._extra
        return scrub(text, forms)
