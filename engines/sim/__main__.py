from __future__ import annotations

import sys

from agent_replay.engines.sim.cli import main

sys.exit(main())
