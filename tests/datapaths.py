"""Where the tests find the repository and the raw-data mirror: ``$BNNBENCH_TEST_MIRROR``, else ``$BNNBENCH_MIRROR``
(the README's setting), else ``../shared/data`` beside the clone. Tests that need the mirror skip, saying so, without
it."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# absolute (a relative setting, ``BNNBENCH_MIRROR=../shared/data``, is the caller's directory's), links kept as given
MIRROR = Path(os.environ.get("BNNBENCH_TEST_MIRROR") or os.environ.get("BNNBENCH_MIRROR")
              or REPO.parent / "shared" / "data").absolute()
