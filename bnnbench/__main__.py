"""``python -m bnnbench ...``: the same command line as ``bnnbench ...``."""

import sys

from bnnbench.cli import main

sys.exit(main())
