"""MKL's kernels by instruction set alone (core/linalg/mkl_vendor): in a fresh process with ``BNNBENCH_MKL_ANY_VENDOR``
set, MKL asks the override, the numerics class says so, and torch's GEMMs, Choleskys and eigendecompositions still
agree with float64 references to float32 rounding (MKL's other kernels run on this CPU); imported after torch, the
mode is refused with a warning and the class is left alone."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from bnnbench.core.linalg import mkl_vendor

MKL = torch.backends.mkl.is_available()

PROBE = textwrap.dedent("""
    import warnings
    warnings.simplefilter("error")           # the mode must come up without a warning
    import bnnbench
    import torch
    from bnnbench.core.linalg import mkl_vendor
    from bnnbench.run.numerics import numerics_class
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(20, 129, 51, generator=g), torch.randn(20, 51, 129, generator=g)
    gemm = (torch.bmm(a, b).double() - torch.bmm(a.double(), b.double())).abs().max() / 51 ** 0.5
    m = torch.randn(300, 257, generator=g)
    spd = m.T @ m / 300 + torch.eye(257)
    L = torch.linalg.cholesky(spd)
    chol = ((L @ L.T).double() - spd.double()).abs().max()
    e, V = torch.linalg.eigh(spd)
    eig = ((spd @ V - V * e).abs().max())
    print(mkl_vendor.active(), "mkl any vendor" in numerics_class(), float(gemm), float(chol), float(eig))
""")


def _probe(env_value: str | None) -> list[str]:
    env = dict(os.environ)
    env.pop(mkl_vendor.ENV, None)
    if env_value is not None:
        env[mkl_vendor.ENV] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not MKL, reason="torch's BLAS is not MKL here: no vendor dispatch to override")
def test_the_mode_is_taken_recorded_in_the_numerics_class_and_computes_alike():
    on, off = _probe("1"), _probe(None)
    assert on[:2] == ["True", "True"], "MKL did not ask the override, or the class does not say so"
    assert off[:2] == ["False", "False"]
    for out in (on, off):
        gemm, chol, eig = map(float, out[2:])
        assert gemm < 1e-5 and chol < 1e-4 and eig < 1e-3   # float32 rounding of sums of 51 and 257 terms


def test_after_torch_the_mode_is_refused_with_a_warning(monkeypatch):
    monkeypatch.setattr(mkl_vendor, "_lib", None)
    with pytest.warns(RuntimeWarning, match="imported before bnnbench"):
        assert mkl_vendor.enable() is False
    assert mkl_vendor.active() is False


def test_requested_reads_the_environment(monkeypatch):
    monkeypatch.delenv(mkl_vendor.ENV, raising=False)
    assert not mkl_vendor.requested()
    for value, want in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv(mkl_vendor.ENV, value)
        assert mkl_vendor.requested() is want
