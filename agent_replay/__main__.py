"""``python -m agent_replay``: the ``agent-replay`` command line."""

from __future__ import annotations

import sys

try:
    from agent_replay.replay.cli import entry
except KeyboardInterrupt:  # Ctrl-C while the interpreter imports: one line, not a traceback
    print("agent-replay: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

entry()
