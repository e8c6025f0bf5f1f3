"""Time of one HMC leapfrog step relative to its floor, measured in one run.

200 chains of the Boston MLP (13-50-1, P = 751) on N = 455 rows, full batch, one replica: a leapfrog step
(position and momentum updates and the gradient of the potential: ``HMC.leapfrog`` of 10 steps, / 10) against one
full-batch forward and autograd backward pass of the same 200 networks' Gaussian negative log joint (the floor:
any leapfrog step needs that gradient). Target: <= 1.5x. Medians of interleaved repeated timings, one thread.

    OMP_NUM_THREADS=1 python bench/hmc_leapfrog.py [--chains 200] [--repeats 15] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from bnnbench.methods import Batch, Problem
from bnnbench.methods.sampling.hmc import HMC, full_batch
from bnnbench.core.models import MLP


def timed_ms(fn, inner: int = 1) -> float:
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t) / inner * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, default=200)
    ap.add_argument("--n", type=int, default=455)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    model = MLP([13, 50, 1])
    C, N, P = args.chains, args.n, model.n_params
    method = HMC(OmegaConf.create({"chains": C}), model, "gaussian")
    prob = Problem("gaussian", torch.tensor([N]), torch.ones(1, P, dtype=dt), noise_prec=torch.ones(1, dtype=dt),
                   y_scale=torch.ones(1, dtype=dt))
    state = method.init(prob, g)
    batch = Batch(torch.randn(1, N, 13, generator=g, dtype=dt), torch.randn(1, N, generator=g, dtype=dt),
                  torch.tensor([N]))
    mask = full_batch(batch)
    q = method.position(state)
    p = torch.randn(q.shape, generator=g, dtype=dt)
    eps = torch.full((1, C, 1), 1e-3, dtype=dt)
    L = 10
    steps = torch.full((1, C), L)

    with torch.inference_mode():
        _, grad = method.potential(state, q, batch, mask)

    def leapfrog():
        with torch.inference_mode():
            method.leapfrog(state, q, p, grad, eps, steps, batch, mask, state.inv_mass.unsqueeze(1))

    lam, tau = state.prior_prec, state.noise_prec

    def forward_backward():
        theta = q.detach().requires_grad_(True)
        f = model.forward(theta, batch.x)[..., 0]
        U = 0.5 * tau * (f - batch.y[:, None]).square().sum(-1) + 0.5 * (lam[:, None] * theta * theta).sum(-1)
        torch.autograd.grad(U.sum(), theta)

    leapfrog(), forward_backward()
    floor, leap = [], []
    for _ in range(args.repeats):  # interleaved: a change of load on a shared machine hits both alike
        floor.append(timed_ms(forward_backward, inner=L))
        leap.append(timed_ms(leapfrog) / L)
    t_floor, t_leap = statistics.median(floor), statistics.median(leap)
    ratio = statistics.median(b / a for a, b in zip(floor, leap))
    print(f"HMC leapfrog step, {C} chains of MLP 13-50-1 (P = {P}), N = {N}, {args.dtype}, 1 thread")
    print(f"  forward + autograd backward (floor): {t_floor:8.2f} ms")
    print(f"  leapfrog step (closed-form gradient): {t_leap:8.2f} ms   ratio {ratio:.2f}x (target <= 1.5x; median of "
          f"{args.repeats} interleaved repeats)")


if __name__ == "__main__":
    main()
