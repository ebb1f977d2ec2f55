"""What the recorder does with requests it cannot forward as they are: a path whose dot
segments would climb out of the upstream's base (``/../../admin``, also percent-encoded)
is resolved within it (``upstream_path``), and a request line aiohttp cannot parse is
answered 400 by aiohttp and counted here instead of printed as a traceback
(``MalformedRequests``)."""

from __future__ import annotations

import logging
from urllib.parse import unquote

from aiohttp.http_exceptions import HttpProcessingError

_DOTS = frozenset({".", ".."})


def upstream_path(raw_path: str) -> str | None:
    """``raw_path`` (path and query, as sent) with its dot segments resolved, never above
    the root: appended to the upstream's base it stays under that base. None for a
    segment that decodes to a path of its own with dot segments (``..%2f..``): refused."""
    path, q, query = raw_path.partition("?")
    if "." not in path and "%" not in path:  # the common case: nothing to resolve
        return raw_path
    out: list[str] = []
    for seg in path.split("/")[1:]:
        plain = unquote(seg)
        if plain in _DOTS:
            if plain == ".." and out:
                out.pop()
            continue
        if _DOTS.intersection(plain.replace("\\", "/").split("/")):
            return None
        out.append(seg)
    return "/" + "/".join(out) + (q + query)


class MalformedRequests(logging.Filter):
    """On aiohttp's server logger: a request aiohttp could not parse (it has answered it
    400) is counted in ``count``, and its traceback is not logged."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            self.count += 1
            return False
        return True
