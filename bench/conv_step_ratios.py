"""Step time of the convolutional methods relative to an SGD step on the same network, measured in one run, with the
flop floor of noisy K-FAC's and K-FAC's extra work.

Networks: the small VGG-style MNIST network (model=vgg_mnist, 28x28x1) and noisy natural gradient's halved VGG16
(model=vgg16_half) on CIFAR-shaped 32x32x3 images; minibatch 128, one replica, one training particle (the CIFAR-10
protocol's), random inputs. A step's time is the mean over ``--steps`` steps (every tenth one updates the Kronecker
factors and refreshes the covariance factors, T_stats = 10) plus the refresh of the damped inverses amortised over
T_inv = 200 steps (timed once).

Floor (multiply-adds per step, F = sum_l rows_l d_in d_out the forward pass, rows_l = B T_l examples x positions,
a_l = d_in + 1, b_l = d_out): SGD ~ 3 F (forward, input and weight gradients). Noisy K-FAC: SGD's 3 F, the
preconditioned step and the weight draw (2 sum_l (a^2 b + a b^2)), and every T_stats steps a second backward pass
(the sampled targets' cotangent, F), the factor statistics (sum_l rows (a^2 + b^2)) and the covariance factors'
Cholesky and triangular inverses (sum_l 2 (a^3 + b^3) / 3), and the inverses every T_inv (sum_l (a^3 + b^3)):

    noisy K-FAC / SGD >= [3 F + 2 sum (a^2 b + a b^2) + (F + sum rows (a^2 + b^2) + 2/3 sum (a^3 + b^3)) / T_stats
                          + sum (a^3 + b^3) / T_inv] / 3 F

K-FAC: the same with one GEMM pair a step (no weight draw) and no covariance factors.

    python bench/conv_step_ratios.py [--steps 10] [--device cpu] [--nets mnist,cifar] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bnnbench.run.execute import device_of
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models.convnet import VGG16_HALF, ConvNet, flops_per_example

NETS = {"mnist": ((1, 28, 28), [16, 16, "M", 32, 32, "M"]), "cifar": ((3, 32, 32), VGG16_HALF)}
SETTINGS = {   # the CIFAR-10 protocol's (configs/protocol/nng_cifar10.yaml)
    "sgd": dict(lr=0.01, momentum=0.9),
    "bbb": dict(lr=1e-3, init_std=1e-5, train_samples=1),
    "noisy_adam": dict(lr=0.01, betas=[0.9, 0.997], kl_weight=0.5, kl_clip=1e-4, train_samples=1, learn_noise=False),
    "kfac": dict(lr=0.01, beta=0.01, T_stats=10, T_inv=200, damping_ex=1e-3, momentum=0.9, momentum_type="heavy_ball",
                 kl_clip=1e-3),
    "noisy_kfac": dict(lr=0.01, beta=0.01, T_stats=10, T_inv=200, damping_ex=1e-3, momentum=0.9,
                       momentum_type="heavy_ball", kl_weight=0.5, kl_clip=1e-3, train_samples=1, learn_noise=False),
}
B, N = 128, 50000


def floors(model: ConvNet, T_stats=10, T_inv=200) -> dict:
    F = B * flops_per_example(model)
    ab = [(d_in + 1, d_out, B * t) for (_, _, d_in, d_out), t in zip(model.slices, model.positions)]
    prec = sum(a * a * b + a * b * b for a, b, _ in ab)
    stats = sum(rows * (a * a + b * b) for a, b, rows in ab)
    cubes = sum(a ** 3 + b ** 3 for a, b, _ in ab)
    sgd = 3 * F
    return {"noisy_kfac": (3 * F + 2 * prec + (F + stats + 2 * cubes / 3) / T_stats + cubes / T_inv) / sgd,
            "kfac": (3 * F + prec + (F + stats) / T_stats + cubes / T_inv) / sgd}


def time_method(name, model, device, steps, warm=2):
    torch.manual_seed(0)
    method = METHODS[name]({**SETTINGS[name], "init_mean": "xavier_uniform"}, model, "categorical")
    prob = Problem("categorical", torch.full((1,), N, device=device), torch.full((1, model.n_params), 10.0,
                                                                                 device=device))
    g = torch.Generator(device=device).manual_seed(0)
    state = method.init(prob, g)
    x = torch.randn(1, B, model.sizes[0], device=device)
    batch = Batch(x, torch.randint(0, 10, (1, B), device=device), torch.full((1,), N, device=device))
    for _ in range(warm):
        state, _ = method.update(state, batch, g)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        state, _ = method.update(state, batch, g)
    sync()
    ms = (time.perf_counter() - t) / steps * 1e3
    inv_ms = 0.0
    if name in ("kfac", "noisy_kfac"):   # the damped inverses, every T_inv steps
        t = time.perf_counter()
        method._refresh(state, covariance=False, inverses=True)
        sync()
        inv_ms = (time.perf_counter() - t) * 1e3 / int(method.cfg.T_inv)
    return ms + inv_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--nets", default="mnist,cifar")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    dev = device_of({"device": args.device})
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {dev}, minibatch {B}, "
          f"{args.steps} steps (T_stats = 10 inside them; the T_inv = 200 inverses timed once and amortised)")
    out = {"device": str(dev), "torch": torch.__version__, "threads": torch.get_num_threads(), "nets": {}}
    for net in args.nets.split(","):
        shape, arch = NETS[net]
        model = ConvNet(shape, arch, 10)
        ms = {m: time_method(m, model, dev, args.steps) for m in SETTINGS}
        fl = floors(model)
        out["nets"][net] = {"ms_per_step": ms, "ratio_to_sgd": {m: v / ms["sgd"] for m, v in ms.items()},
                            "floor": fl, "params": model.n_params, "macs_per_example": flops_per_example(model)}
        print(f"\n{net}: {model.describe()}, {model.n_params} parameters, "
              f"{flops_per_example(model) / 1e6:.1f} M multiply-adds per example")
        for m, v in ms.items():
            floor = f"   (flop floor {fl[m]:.2f}x)" if m in fl else ""
            print(f"  {m:11s} {v:9.1f} ms a step   {v / ms['sgd']:5.2f}x SGD{floor}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
