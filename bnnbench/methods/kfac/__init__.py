"""The noisy natural gradient family (Zhang et al., 2018): noisy Adam, noisy K-FAC (Kronecker-factored precision),
K-FAC without noise, and noisy K-FAC with the block-tridiagonal inverse (NNG-BlkTri)."""
