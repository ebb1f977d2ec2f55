"""Text that came from a trace, a results folder or a server, made safe to show: it is
data, never rich markup and never terminal control.

* ``visible``: every control character (C0, DEL, C1; escape sequences start with one) as
  its Python escape (``\\x1b``, ``\\n``), so a terminal shows a name such as ``\\x1b[2J``
  instead of obeying it;
* ``text``: ``visible`` as a rich ``Text``, which rich never parses as markup (a session
  named ``[/x]`` is shown, not taken for a closing tag);
* ``markup``: ``visible`` with rich markup escaped, for a string that goes into markup;
* ``plain``: for files (Markdown, CSV): escape sequences (CSI, OSC, two-character) and
  every other control character removed (tabs and line ends become spaces).
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC: titles, hyperlinks
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]"
)  # two-character escapes
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or f"\\x{ord(c):02x}"


def visible(value: object) -> str:
    """``value`` as a string whose control characters are shown as escapes."""
    return _CONTROL.sub(_escape, str(value))


def text(value: object, style: str = "") -> Text:
    """``value`` for a rich renderable: shown as it is, never read as markup."""
    return Text(visible(value), style=style)


def markup(value: object) -> str:
    """``value`` for a rich markup string: its own brackets escaped."""
    return escape(visible(value))


def plain(value: object) -> str:
    """``value`` for a file: escape sequences and control characters removed."""
    return _CONTROL.sub(lambda m: " " if m.group() in _NAMED else "", _SEQUENCE.sub("", str(value)))
