"""Data augmentation of image minibatches with tensor ops (no torchvision): the random crop and horizontal flip of
the CIFAR-10 experiments (noisy natural gradient's [D]: crop 32 from the image zero-padded by 4, flip with
probability 1/2; the authors' misc/data_loader.py, torchvision's RandomCrop(32, padding=4) and
RandomHorizontalFlip()).

Inputs arrive flattened and standardised (``x [R, B, C H W]``), so the padding is 0 in standardised units: the
training mean of each pixel, where the authors pad raw pixels with 0 (black) before normalising (a stated
deviation, results/README.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def crop_flip(x: torch.Tensor, image_shape, crop_pad: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Each image of ``x [R, B, C H W]`` cropped at a uniform offset in [0, 2 p]^2 from its copy zero-padded by p,
    then mirrored left-right with probability 1/2, independently per image; the draws come from ``generator``."""
    C, H, W = (int(s) for s in image_shape)
    R, B = x.shape[:2]
    img = x.reshape(R * B, C, H, W)
    n, dev = img.shape[0], x.device
    if crop_pad > 0:
        p = int(crop_pad)
        padded = F.pad(img, (p, p, p, p))
        oy = torch.randint(0, 2 * p + 1, (n,), generator=generator, device=dev)
        ox = torch.randint(0, 2 * p + 1, (n,), generator=generator, device=dev)
        r = (oy[:, None] + torch.arange(H, device=dev))[:, :, None]                 # [n, H, 1]
        c = (ox[:, None] + torch.arange(W, device=dev))[:, None, :]                 # [n, 1, W]
        img = padded.permute(0, 2, 3, 1)[torch.arange(n, device=dev)[:, None, None], r, c].permute(0, 3, 1, 2)
    if flip:
        mirror = torch.rand(n, generator=generator, device=dev) < 0.5
        img = torch.where(mirror[:, None, None, None], img.flip(-1), img)
    return img.reshape(x.shape)
