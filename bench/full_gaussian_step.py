"""SLANG Table 1's full-Gaussian step (Full-Gaussian EF / Hessian columns, issue 31): the precision update in place
(``full_gaussian.mixed_prec``) against the plain expression it replaced, in one run.

The case is a run's own: ``experiment=slang_table1`` on a data set (default USPS 3vs5: [20, 257, 257] precisions,
float32, its 20 splits on the replica axis), the engine's minibatches and ``update`` (draws, curvature, Cholesky and
mean step included), eager as every record of the table was made, one thread. Each round times the step with the
plain expression (patched in) and with this code's, in turns, so a change of load on this shared machine hits both
alike; it prints the medians, their ratio, and the update alone on the case's shapes. Both forms round alike (tested:
tests/methods/test_full_gaussian.py), so the states stay bitwise equal; the script checks that too.

    PYTHONPATH=. taskset -c 0 python bench/full_gaussian_step.py [--data usps/3vs5] [--curvature ef] [--rounds 7]

Needs the data mirror (``BNNBENCH_MIRROR``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core.data import load_dataset
from bnnbench.methods.gaussian import full_gaussian
from bnnbench.run.config import CommandLine, compose
from bnnbench.run.engine import epoch_batches, make_batch
from bnnbench.run.fit import FitOptions, program
from bnnbench.run.protocol import resolve

from step_ab import Timed  # bench/ is the script's folder, so it heads sys.path


def plain_prec(prec, C_sum, scale, lam, beta):
    """The precision update as the code before ``mixed_prec`` wrote it."""
    b = beta[:, None, None]
    new_prec = (1 - b) * prec + b * (scale[:, None, None] * C_sum + torch.diag_embed(lam))
    return 0.5 * (new_prec + new_prec.transpose(-1, -2))


class Case(Timed):
    def __init__(self, data: str, curvature: str):
        ds = load_dataset(data)
        ov = ["experiment=slang_table1", "method=full_gaussian", f"data={data}", f"method.curvature={curvature}"]
        spec = resolve(compose(ov), CommandLine.parse(ov), meta=ds.meta)
        pairs = [(s.train, s.test) for s in ds.splits]
        R = len(pairs)
        opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32)
        self.method, data_, problem = program(spec, ds, pairs, list(range(R)), [dict(spec.fixed)] * R, opts)
        self.g = torch.Generator().manual_seed(0)
        self.state = self.method.init(problem, self.g)
        self.batches = [make_batch(data_, rows) for rows in epoch_batches(data_, spec.batch_size, self.g)]
        self.update = self.method.update   # looks up full_gaussian.mixed_prec at each step: patched per side
        self.k = 0


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="usps/3vs5")
    ap.add_argument("--curvature", default="ef", help="ef | ggn (the Hessian column)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20, help="steps per round and side")
    args = ap.parse_args()
    torch.set_num_threads(1)
    mixed = full_gaussian.mixed_prec
    sides = {"plain": Case(args.data, args.curvature), "in place": Case(args.data, args.curvature)}
    forms = {"plain": plain_prec, "in place": mixed}
    for name, case in sides.items():   # warm up, and both forms from one state give the same bits
        full_gaussian.mixed_prec = forms[name]
        for _ in range(5):
            case.step()
    full_gaussian.mixed_prec = mixed
    a, b = sides["plain"].state, sides["in place"].state
    assert same_bits(a.prec, b.prec) and same_bits(a.mean, b.mean), "the two forms' states differ"
    times = {k: [] for k in sides}
    for _ in range(args.rounds):
        for name, case in sides.items():
            full_gaussian.mixed_prec = forms[name]
            times[name].append(case.time_ms(args.steps))
    full_gaussian.mixed_prec = mixed
    a, b = sides["plain"].state, sides["in place"].state
    print(f"{args.data}, curvature {args.curvature}, prec {tuple(a.prec.shape)}, float32, 1 thread; medians of "
          f"{args.rounds} interleaved rounds of {args.steps} steps; states bitwise equal after "
          f"{sides['plain'].k} steps: {same_bits(a.prec, b.prec) and same_bits(a.mean, b.mean)}")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"step: plain {med['plain']:.2f} ms, in place {med['in place']:.2f} ms "
          f"({med['plain'] / med['in place']:.2f}x)")
    R, P = a.mean.shape
    g = torch.Generator().manual_seed(1)
    X = torch.randn(R, P, 64, generator=g)
    C = X @ X.transpose(1, 2)
    prec, scale, lam, beta = a.prec, torch.full((R,), 30.0), torch.rand(R, P, generator=g), torch.full((R,), 0.05)
    alone = {k: [] for k in forms}
    for _ in range(args.rounds):
        for name, f in forms.items():
            bufs = [C.clone() for _ in range(args.steps)]
            t = time.perf_counter()
            for buf in bufs:
                f(prec, buf, scale, lam, beta)
            alone[name].append((time.perf_counter() - t) / args.steps * 1e3)
    med = {k: statistics.median(v) for k, v in alone.items()}
    print(f"update alone: plain {med['plain']:.2f} ms, in place {med['in place']:.2f} ms "
          f"({med['plain'] / med['in place']:.2f}x)")


if __name__ == "__main__":
    main()
