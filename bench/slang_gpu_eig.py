"""SLANG Table 3's eigensolver on a GPU: what the step's top-L eigendecomposition costs by each solver at hand.

Issue 31, section 3: a cell of the whole protocol (115 000 steps) under 8 minutes needs a step of at most 4.2 ms;
compiled as CUDA graphs the SLANG step was 10.5-10.8 ms whatever L (H200, 2026-11-27), which points at the exact
eigendecomposition of the (SM + L)-square Gram matrix (801-832 rows), run by cuSOLVER eagerly between the graphs.

1. The Gram matrices of real steps (``eig: gram``, 784-400-400-10, M = 200, S = 4, after a few steps), captured at
   ``top_eigh``, decomposed by every exact solver here: torch's ``linalg.eigh`` (cuSOLVER's syevd), the same with
   MAGMA as torch's backend, CuPy's ``cupyx.cusolver.syevj`` (Jacobi) and ``cupy.linalg.eigh``, float64, and on the
   host's cores (the copies included: torch's eigh, LAPACK's ``?syevr`` for the top L alone). Accuracy against
   float64: the top L eigenvalues' largest relative error and the residual ``||A V - V diag(e)|| / ||A||``.
2. The compiled step (``compile=true``, CUDA graphs) per L with ``eig: gram`` as configured, with the eigensolvers
   that win in 1 swapped in, and with SLANG's randomised solvers (``eig: nystrom``, the authors' code's
   ``fastpca.eigsh_func``; ``eig: randomized``, the paper's ``fast_eig``), which run inside the graphs.
3. A profile of 10 compiled ``eig: gram`` steps at L = 8 (torch.profiler, the top operators by device time).

    python bench/slang_gpu_eig.py [--device cuda] [--reps 20] [--steps 40] [--ranks 1,8,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core.linalg import low_rank
from bnnbench.methods.gaussian import slang as slang_mod
from bnnbench.run.execute import device_of

from step_ratios import CFG, device_name, time_steps, write_json

MN = dict(sizes=[784, 400, 400, 10], lik="categorical", R=1, M=200)
STEPS_PROTOCOL = 100 * (50000 // 200) + 300 * (60000 // 200)


def capture_grams(dev, L: int, warm: int = 3) -> torch.Tensor:
    """The Gram matrix ``B^T B`` of an eager ``eig: gram`` step after ``warm`` steps (``[1, 800 + L, 800 + L]``)."""
    seen = []
    real = slang_mod.top_eigh

    def spy(A, k, kernel="lapack"):
        seen.append(A.detach().clone())
        return real(A, k, kernel)
    slang_mod.top_eigh = spy
    try:
        time_steps("slang", {**CFG["slang"], "rank": L, "train_samples": 4}, **MN, steps=1, device=dev, warm=warm)
    finally:
        slang_mod.top_eigh = real
    return seen[-1]


def solvers(dev):
    """name -> f(A [n, n] on dev) -> (ascending values, vectors), each as exact as LAPACK's."""
    out = {"torch (cuSOLVER syevd)": torch.linalg.eigh}

    def magma(A):
        prev = torch.backends.cuda.preferred_linalg_library()
        torch.backends.cuda.preferred_linalg_library("magma")
        try:
            return torch.linalg.eigh(A)
        finally:
            torch.backends.cuda.preferred_linalg_library(prev)
    out["torch (MAGMA)"] = magma
    out["torch float64"] = lambda A: tuple(x.float() for x in torch.linalg.eigh(A.double()))
    try:
        import cupy
        import cupyx.cusolver

        def syevj(A):
            w, v = cupyx.cusolver.syevj(cupy.from_dlpack(A.contiguous()), "L", True)
            return torch.from_dlpack(w), torch.from_dlpack(v)

        def cupy_eigh(A):
            w, v = cupy.linalg.eigh(cupy.from_dlpack(A.contiguous()))
            return torch.from_dlpack(w), torch.from_dlpack(v)
        out["cupy syevj (Jacobi)"] = syevj
        out["cupy eigh"] = cupy_eigh
    except Exception as e:   # CuPy is on the lent machine's image, not a dependency
        print(f"  (no CuPy: {type(e).__name__}: {e})")

    def host_torch(A):
        w, v = torch.linalg.eigh(A.cpu())
        return w.to(dev), v.to(dev)
    out[f"host torch ({torch.get_num_threads()} threads)"] = host_torch
    return out


def host_syevr(L):
    from scipy.linalg import lapack

    def f(A):
        a = A.cpu().numpy()
        n = a.shape[0]
        w, z, m, _, info = lapack.ssyevr(a, compute_v=1, range="I", lower=1, il=n - L + 1, iu=n)
        return torch.from_numpy(w[:L].copy()).to(A.device), torch.from_numpy(z[:, :L].copy()).to(A.device)
    return f


def timed(f, A, reps):
    ts = []
    for _ in range(reps + 2):
        torch.cuda.synchronize() if A.is_cuda else None
        t = time.perf_counter()
        f(A)
        torch.cuda.synchronize() if A.is_cuda else None
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[2:]) * 1e3


def accuracy(A, w, V, L):
    """Top-L relative eigenvalue error against float64 and the residual of the top-L pairs."""
    ref = torch.linalg.eigvalsh(A.double())[-L:]
    w, V = w[-L:].double(), V[:, -L:].double()
    order = torch.argsort(w)
    w, V = w[order], V[:, order]
    err = float(((w - ref).abs() / ref.abs().clamp_min(1e-30)).max())
    res = float(torch.linalg.norm(A.double() @ V - V * w) / torch.linalg.norm(A.double()))
    return err, res


def swapped_eigh(f):
    """``low_rank.eigh`` replaced by ``f`` (run eagerly between a compiled step's graphs, as the original)."""
    @torch.compiler.disable
    def eigh(A):
        if A.dim() == 2:
            return f(A)
        pairs = [f(a) for a in A.reshape(-1, *A.shape[-2:])]
        return (torch.stack([p[0] for p in pairs]).reshape(A.shape[:-1]),
                torch.stack([p[1] for p in pairs]).reshape(A.shape))
    return eigh


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ranks", default="1,8,32")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = device_of({"device": args.device})
    ranks = [int(x) for x in args.ranks.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {dev} ({device_name(dev)})")
    out = {"bench": "slang_gpu_eig", "device": str(dev), "device_name": device_name(dev), "torch": torch.__version__,
           "solvers": [], "steps": [], "profile": None}
    fs = solvers(dev)
    print("\n1. The Gram matrix's eigendecomposition (ms, median of", args.reps, "; top-L eigenvalue error, residual)")
    fastest = {}
    for L in ranks:
        A = capture_grams(dev, L)[0]
        A = 0.5 * (A + A.T)
        n = A.shape[-1]
        for name, f in [*fs.items(), (f"host ?syevr top {L}", host_syevr(L))]:
            try:
                ms = timed(f, A, args.reps)
                err, res = accuracy(A, *f(A), L)
            except Exception as e:
                print(f"  L={L:2d} n={n} {name:<28s} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            print(f"  L={L:2d} n={n} {name:<28s} {ms:8.3f} ms   err {err:.1e}   residual {res:.1e}")
            out["solvers"].append({"rank": L, "n": n, "solver": name, "ms": ms, "err": err, "residual": res})
            if err < 1e-4 and not name.startswith("torch (cuSOLVER") and name in fs:
                fastest[name] = fastest.get(name, 0.0) + ms

    print("\n2. The compiled step (CUDA graphs), ms a step, and the whole protocol (115 000 steps) in minutes")
    swaps = sorted(fastest, key=fastest.get)[:2]
    variants = [("gram (cuSOLVER)", {}, None), *[(f"gram, {s}", {}, s) for s in swaps],
                ("nystrom (authors' code)", {"eig": "nystrom"}, None),
                ("randomized (paper)", {"eig": "randomized"}, None)]
    for L in ranks:
        for label, over, swap in variants:
            real = low_rank.eigh
            if swap:
                low_rank.eigh = swapped_eigh(fs[swap])
            try:
                ms = time_steps("slang", {**CFG["slang"], "rank": L, "train_samples": 4, **over}, **MN,
                                steps=args.steps, device=dev, warm=5, compile=True)
                print(f"  L={L:2d} {label:<34s} {ms:7.2f} ms   protocol {ms * STEPS_PROTOCOL / 6e4:6.1f} min")
                out["steps"].append({"rank": L, "variant": label, "ms_step": ms,
                                     "protocol_min": ms * STEPS_PROTOCOL / 6e4})
            except Exception as e:
                print(f"  L={L:2d} {label:<34s} failed: {type(e).__name__}: {str(e)[:300]}")
            finally:
                low_rank.eigh = real
                torch._dynamo.reset()

    print("\n3. Profile of 10 compiled eig: gram steps at L = 8")
    try:
        from torch.profiler import ProfilerActivity, profile
        from bnnbench.run.compiled import compiled_update
        from bnnbench.methods import METHODS, Batch, Problem
        from bnnbench.core.models import MLP
        from omegaconf import OmegaConf
        torch.manual_seed(0)
        model = MLP(MN["sizes"])
        method = METHODS["slang"](OmegaConf.create({**CFG["slang"], "rank": 8, "train_samples": 4}), model,
                                  "categorical")
        N = 50000
        prob = Problem("categorical", torch.full((1,), N, device=dev), torch.ones(1, model.n_params, device=dev))
        g = torch.Generator(device=dev).manual_seed(0)
        state = method.init(prob, g)
        batch = Batch(torch.rand(1, 200, 784, device=dev), torch.randint(0, 10, (1, 200), device=dev),
                      torch.full((1,), N, device=dev))
        update = compiled_update(method, dev)
        for _ in range(5):
            state, _ = update(state, batch, g)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                state, _ = update(state, batch, g)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60)
        print(table)
        out["profile"] = table
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
    except Exception as e:
        print(f"  profile failed: {type(e).__name__}: {e}")
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
