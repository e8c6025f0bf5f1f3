"""The noisy natural gradient family (Zhang et al., 2018): noisy Adam, noisy K-FAC (Kronecker-factored precision),
K-FAC without noise (``kfac.py``), and noisy K-FAC with the block-tridiagonal inverse (NNG-BlkTri); a layer's
Kronecker factors with their damping, roots, inverses and sampling are one object (``kronecker.Kronecker``)."""
