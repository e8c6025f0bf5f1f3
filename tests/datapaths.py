"""Where the tests find the repository and the raw-data mirror: ``$BNNBENCH_TEST_MIRROR``, else ``$BNNBENCH_MIRROR``
(the README's setting), else ``../shared/data`` beside the clone. Tests that need the mirror skip, saying so, without
it."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# absolute (a relative setting, ``BNNBENCH_MIRROR=../shared/data``, is the caller's directory's), links kept as given
MIRROR = Path(os.environ.get("BNNBENCH_TEST_MIRROR") or os.environ.get("BNNBENCH_MIRROR")
              or REPO.parent / "shared" / "data").absolute()


def bench_module(name: str):
    """``bench/<name>.py`` imported as the module ``name`` (a script there imports its neighbours by name, as its own
    folder heads ``sys.path`` when it runs)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
