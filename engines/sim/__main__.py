from __future__ import annotations

import sys

from engines.sim.cli import main

sys.exit(main())
