"""bnnbench: reproduction and benchmark suite for variational Bayesian deep learning."""

__version__ = "0.1.0"

from bnnbench.core.linalg import mkl_vendor as _mkl_vendor

if _mkl_vendor.requested():   # before torch: MKL's kernels by instruction set alone (core/linalg/mkl_vendor)
    _mkl_vendor.enable()
