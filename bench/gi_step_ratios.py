"""Step time of local inducing, fac -> gi and global inducing relative to the factorised family on the MNIST-500 CNN
(``arch=mnist500_cnn``: 2 x (conv 3x3 - ReLU - maxpool 2) + conv 3x3 - ReLU - linear, 64 channels), minibatch 500 of
28 x 28 images, one MC sample per step, 500 inducing points, ScalePrior (Ober & Aitchison, 2020, Table 1's timing
column: "time per epoch, MNIST, ScalePrior"), categorical likelihood, one replica, float32.

The paper's own times per MNIST epoch (60 000 images, 120 steps of 500) on a GPU: fac 19 s, li 33 s, fac -> gi 25 s,
gi 65 s, i.e. li / fac 1.7, fac_gi / fac 1.3, gi / fac 3.4. Here the families are timed in interleaved rounds (every
family once per round, the median over rounds kept) so that the load of the shared host drifts alike for all.

With ``--arch resnet8 --image 3,32,32 --train 50000`` the same for Table 1's CIFAR-10 network (the cost of the
experiment gi_table1).

    python bench/gi_step_ratios.py [--rounds 3] [--steps 2] [--threads 2] [--device cpu] [--families fac,li,fac_gi,gi]
                                   [--prior scale] [--arch mnist500_cnn --image 1,28,28 --train 60000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from bnnbench.run.execute import device_of
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models import MLP

PAPER_EPOCH_S = {"fac": 19.0, "li": 33.0, "fac_gi": 25.0, "gi": 65.0}


def make(name: str, device, batch: int, inducing: int, prior: str, arch: str, image: list[int]):
    torch.manual_seed(0)
    d = image[0] * image[1] * image[2]
    model = MLP([d, 10])
    cfg = OmegaConf.merge(OmegaConf.structured(METHODS[name].Config),
                          dict(arch=arch, image_shape=image, prior=prior, train_samples=1))
    if "inducing" in cfg:
        cfg.update(inducing=inducing, inducing_init="batch", out_log_prec_init=0.0, log_prec_lr=3.0)
    if "local_reparam" in cfg:
        cfg.local_reparam = False
    method = METHODS[name](cfg, model, "categorical")
    prob = Problem("categorical", torch.full((1,), 60000, device=device), torch.ones(1, 1, device=device))
    g = torch.Generator(device=device).manual_seed(0)
    state = method.init(prob, g)
    x = torch.rand(1, batch, d, device=device)
    y = torch.randint(0, 10, (1, batch), device=device)
    return method, state, Batch(x, y, prob.n_data), g


def time_steps(method, state, batch, g, steps, device) -> tuple[float, dict]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        state, _ = method.update(state, batch, g)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps, state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--inducing", type=int, default=500)
    ap.add_argument("--prior", default="scale")
    ap.add_argument("--families", default="fac,li,fac_gi,gi")
    ap.add_argument("--arch", default="mnist500_cnn")
    ap.add_argument("--image", default="1,28,28")
    ap.add_argument("--train", type=int, default=60000, help="training images per epoch")
    a = ap.parse_args()
    image = [int(s) for s in a.image.split(",")]
    steps_per_epoch = a.train // a.batch
    torch.set_num_threads(a.threads)
    device = device_of({"device": a.device})  # full float32 on CUDA, as the runs
    families = a.families.split(",")
    runs = {f: make(f, device, a.batch, a.inducing, a.prior, a.arch, image) for f in families}
    for f, (m, s, b, g) in runs.items():   # warm-up step (and the inducing points set from the batch)
        _, s = time_steps(m, s, b, g, 1, device)
        runs[f] = (m, s, b, g)
    times = {f: [] for f in families}
    for _ in range(a.rounds):
        for f, (m, s, b, g) in runs.items():
            t, s = time_steps(m, s, b, g, a.steps, device)
            runs[f] = (m, s, b, g)
            times[f].append(t)
    base = statistics.median(times["fac"]) if "fac" in times else None
    print(f"{a.arch} on {a.image} images, batch {a.batch}, S = 1, {a.inducing} inducing points, prior {a.prior}, "
          f"{a.threads} threads, {a.device}; median of {a.rounds} rounds x {a.steps} steps; epoch = {steps_per_epoch}"
          " steps")
    print(f"{'family':8} {'step s':>8} {'epoch s':>8} {'/ fac':>6} {'paper / fac':>11}   rounds (s/step)")
    for f in families:
        t = statistics.median(times[f])
        ratio = f"{t / base:6.2f}" if base else "     -"
        paper = f"{PAPER_EPOCH_S[f] / PAPER_EPOCH_S['fac']:11.2f}" if f in PAPER_EPOCH_S else " " * 11
        print(f"{f:8} {t:8.3f} {t * steps_per_epoch:8.1f} {ratio} {paper}   "
              + " ".join(f"{x:.3f}" for x in times[f]))


if __name__ == "__main__":
    main()
