"""Step time of the global-inducing families relative to the factorised one on the UCI MLP, measured in one run.

App. G's setting (protocol gi_uci): 13-50-50-1 ReLU (Boston's inputs), 20 replicas (the splits), minibatch 100,
P = 100 global inducing points, one MC sample per step (and 10, the toy's), Gaussian likelihood with a learned noise
scale, Neal prior. Steps of the four families are interleaved and timed ``--rounds`` times; the ratios are of the
medians. The paper's anchors (its Table 1 times per epoch of the CIFAR-10 ResNet measured on MNIST: factorised 19 s,
local inducing 33 s, fac -> gi 25 s, global inducing 65 s) are ratios 1.74, 1.32 and 3.42.

Floor: every inducing family runs the P inducing rows through the network beside the B data rows (li: its own P = 51
rows per layer), so with P = B the matrix products of a step double against factorised's; gi adds per layer the
(D x D) Cholesky factor and two triangular solves of each replica and sample (D = 51).

    python bench/gi_uci_step_ratios.py [--rounds 15] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models import MLP

FAMILIES = ("fac", "li", "fac_gi", "gi")
PAPER = {"li": 33 / 19, "fac_gi": 25 / 19, "gi": 65 / 19}


def stepper(name, samples, R=20, B=100, N=455, D=13, hidden=(50, 50)):
    torch.manual_seed(0)
    model = MLP([D, *hidden, 1])
    cfg = {"train_samples": samples, **({"inducing": 100} if name in ("gi", "fac_gi") else {})}
    method = METHODS[name](cfg, model, "gaussian")
    problem = Problem("gaussian", n_data=torch.full((R,), N), prior_prec=torch.ones(R, model.n_params),
                      noise_prec=torch.ones(R), y_scale=torch.ones(R))
    g = torch.Generator().manual_seed(0)
    state = method.init(problem, g)
    batch = Batch(x=torch.randn(R, B, D, generator=g), y=torch.randn(R, B, generator=g), n_data=torch.full((R,), N))

    def run(steps):
        nonlocal state
        for _ in range(steps):
            state, _ = method.update(state, batch, g)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for samples in (1, 10):
        runs = {f: stepper(f, samples) for f in FAMILIES}
        for r in runs.values():
            r(3)
        times = {f: [] for f in FAMILIES}
        for _ in range(args.rounds):
            for f, r in runs.items():
                t0 = time.perf_counter()
                r(args.steps)
                times[f].append((time.perf_counter() - t0) / args.steps)
        med = {f: statistics.median(v) for f, v in times.items()}
        print(f"S = {samples}: factorised step {1e3 * med['fac']:.2f} ms (20 replicas)")
        for f in FAMILIES[1:]:
            print(f"  {f:7s} / fac = {med[f] / med['fac']:.2f}   (paper's anchor {PAPER[f]:.2f})")


if __name__ == "__main__":
    main()
