"""What a new user meets first on the command line (issue #32): help and version, refused filters and runs that leave
nothing behind, data that is not finite, an estimate before long work, empty tables and sites, and interruptions."""

import os
import subprocess
import sys

import pytest

from bnnbench import __version__
from bnnbench.cli import main

from datapaths import REPO


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bnnbench.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_help_prints_the_override_syntax_and_exits_0(capsys, flag):
    assert main(["run", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bnnbench run") and "method=bbb data=uci/boston" in out
    assert "protocol.epochs=" in out and "bnnbench list" in out


def test_run_help_in_a_real_process_has_no_hydra_error():
    p = _cli("run", "--help")
    assert p.returncode == 0 and "usage: bnnbench run" in p.stdout and "error" not in p.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"bnnbench {__version__}"
