import pytest

from bnnbench.core import prng
from bnnbench.core.linalg import chol_root, mlp_relu, outer_times, top_eigpair


@pytest.fixture
def no_c_compiler(monkeypatch, tmp_path):
    """A machine without a C compiler and with an empty cache: the SIMD kernels (``core/linalg/c_kernels.py``) are
    built afresh, and fail; their loaded libraries are forgotten before and after."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path))
    libraries = (top_eigpair._library, chol_root._library, mlp_relu._library, outer_times._library,
                 prng._library)
    for lib in libraries:
        lib.cache_clear()
    yield
    for lib in libraries:
        lib.cache_clear()
