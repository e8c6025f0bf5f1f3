"""The sufficient statistics of convolutional Bayesian linear regression as autocorrelations (Ober & Aitchison,
2020, App. A; the library's ``conv_mm``).

A k x k convolution (k odd, stride 1) is a linear map of image patches: output pixel x of image i is
sum_{c, a} W[(c, a), o] X_i[c, x + a - h] (a in {0..k-1}^2, h = (k - 1) / 2). The regression of the pseudo-outputs
Y_i[o, x] on the patches, with pseudo-precision lambda_i per inducing image, needs

    (U^T Lambda U)[(c, a), (c', b)] = sum_{i, x} lambda_i X_i[c, x + a - h] X_i[c', x + b - h]
                                     = sum_{i, y} lambda_i X_i[c, y + a - b] X_i[c', y],
    (U^T Lambda V)[(c, a), o]       = sum_{i, x} lambda_i X_i[c, x + a - h] Y_i[o, x],

where the patches are cut with circular boundaries (the posterior only: the network itself pads with zeros) so
that the first sum depends on a - b alone. Both are then convolutions of the feature maps with themselves and
with the pseudo-outputs (the maps as the "weights", the offsets as the output pixels): (2k - 1)^2 and k^2 output
pixels instead of the C k^2 x C k^2 patch products per pixel of an explicit patch matrix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kernel_offsets(k: int, device) -> torch.Tensor:
    """a - b + k - 1 ``[k, k]``: the autocorrelation pixel of each pair of kernel offsets."""
    a = torch.arange(k, device=device)
    return a[:, None] - a[None, :] + k - 1


def circular_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x [..., H, W]`` extended by ``n`` pixels on every side with x[i mod H, j mod W] (wrapping more than once
    where n exceeds the image, as after pooling to 1 x 1)."""
    rows = torch.arange(-n, x.shape[-2] + n, device=x.device) % x.shape[-2]
    cols = torch.arange(-n, x.shape[-1] + n, device=x.device) % x.shape[-1]
    return x[..., rows, :][..., cols]


def autocorrelation(X: torch.Tensor, Y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U^T Lambda U ``[..., C k^2, C k^2]`` and U^T Lambda V ``[..., C k^2, O]`` for the inducing feature maps
    ``X = lambda^(1/2) U [..., P, C, H, W]`` and pseudo-outputs ``Y = lambda^(1/2) V`` (broadcasting to
    ``[..., P, O, H, W]``), the leading axes (replica, sample) batched as the groups of one convolution."""
    if k % 2 != 1:
        raise ValueError(f"convolutional regression needs an odd kernel size, got {k}")
    lead, (P, C, H, W_) = X.shape[:-4], X.shape[-4:]
    Y = Y.expand(*lead, *Y.shape[-4:])
    O = Y.shape[-3]
    G = lead.numel()
    X, Y = X.reshape(G, P, C, H, W_), Y.reshape(G, P, O, H, W_)
    inputs = X.permute(2, 0, 1, 3, 4).reshape(C, G * P, H, W_)
    padded = circular_pad(inputs, k - 1)
    # offsets d1 >= 0 only (k of the 2k - 1 rows): the others are XX_{c c'}(-d) = XX_{c' c}(d)
    XX = F.conv2d(padded[..., k - 1:, :], X.transpose(1, 2).reshape(G * C, P, H, W_), groups=G)  # [C, G C, k, 2k-1]
    XX = XX.reshape(C, G, C, k, 2 * k - 1).transpose(0, 1)                                       # [G, C, C, k, 2k-1]
    XX = torch.cat([XX.transpose(1, 2)[..., 1:, :].flip(-2, -1), XX], dim=-2)                  # [G, C, C, 2k-1, 2k-1]
    h = (k - 1) // 2
    cut = padded[..., h:h + H + k - 1, h:h + W_ + k - 1]
    XY = F.conv2d(cut, Y.transpose(1, 2).reshape(G * O, P, H, W_), groups=G)      # [C, G O, k, k]
    d = kernel_offsets(k, X.device)
    XX = XX[..., d, :][..., d]                                                     # [G, C, C, k, k, k, k]
    ULU = XX.permute(0, 1, 3, 5, 2, 4, 6).reshape(G, C * k * k, C * k * k)
    ULV = XY.reshape(C, G, O, k, k).permute(1, 0, 3, 4, 2).reshape(G, C * k * k, O)
    return ULU.reshape(*lead, C * k * k, C * k * k), ULV.reshape(*lead, C * k * k, O)

