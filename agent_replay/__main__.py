"""``python -m agent_replay``: the ``agent-replay`` command line."""

from __future__ import annotations

import sys

from agent_replay.replay.cli import main

sys.exit(main())
