from __future__ import annotations

import sys

from replay.cli import main

sys.exit(main())
