"""``python -m agent_replay``: the ``agent-replay`` command line."""

from __future__ import annotations

import signal
import sys

# Started with SIGINT ignored (a script's ``cmd &``, without job control): a Ctrl-C or a
# SIGINT to the process is still a stop, from the first moment on, as it is within a run
# (replay.lifeline.sigterm_as_sigint).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

try:
    from agent_replay.replay.cli import entry
except KeyboardInterrupt:  # Ctrl-C while the interpreter imports: one line, not a traceback
    print("agent-replay: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

entry()
