"""bnnbench's HMC transition against NumPyro's (JAX on the CPU), on the same log density, chains, step size and
leapfrog count: the sampler a user would pick instead.

The setting of NNG Table 4 (protocol ``nng_small``): one trial of N = 20 training rows with D = 13 inputs (Boston's
width; synthetic rows, so no data is needed), one hidden layer of H ReLUs (10: the paper's; 50: the UCI nets), prior
precision 1, the noise precision learned (z = log tau, Gamma(6, 6) prior), 20 chains, L = 50 leapfrog steps of a
fixed size, unit diagonal mass, every 10th draw kept (the protocol's thinning), no jitter, no adaptation. NumPyro's
kernel is ``numpyro.infer.hmc.hmc`` (algo HMC, ``num_steps`` = L, ``trajectory_length`` None: otherwise NumPyro
rescales the step to 2 pi / L), vectorised over the chains by ``jax.vmap`` and jitted; bnnbench's is ``HMC.update``
(eager, or with its proposal compiled: ``--compile``, the ``compile`` setting). Both are called once per transition
from Python, one CPU thread each (XLA's intra-op threads pinned to one). Before timing, the script checks that the
two potentials agree (float64, at the chains' start and after some transitions) to 1e-10 relative.

    pip install -e '.[bench]'        # numpyro and jax[cpu]: a bench-only extra
    python bench/hmc_numpyro.py [--hidden 10,50] [--transitions 200] [--repeats 5] [--dtype float32] [--compile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# one thread for XLA, set before jax is imported
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("JAX_ENABLE_X64", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from bnnbench.core.models import MLP  # noqa: E402
from bnnbench.methods import Batch, Problem  # noqa: E402
from bnnbench.methods.sampling.hmc import HMC, full_batch  # noqa: E402

N, D, CHAINS, L, STEP, A0, B0, LAM = 20, 13, 20, 50, 0.01, 6.0, 6.0, 1.0


def jax_potential(model: MLP, x: np.ndarray, y: np.ndarray):
    """U(q) of bnnbench's HMC (``HMC.potential``) in JAX for one trial, q = (theta in the MLP's flat layout, z = log
    tau): 0.5 tau sum_n (f(x_n) - y_n)^2 + 0.5 lambda |theta|^2 - (N / 2 + a0) z + b0 tau."""
    import jax.numpy as jnp
    slices = model.slices
    P = model.n_params

    def U(q):
        theta, z = q[:P], q[P]
        h = jnp.asarray(x)
        for l, (w, b, d_in, d_out) in enumerate(slices):
            h = h @ theta[w].reshape(d_in, d_out) + theta[b]
            if l < len(slices) - 1:
                h = jnp.maximum(h, 0.0)
        tau = jnp.exp(z)
        r = h[:, 0] - jnp.asarray(y)
        return 0.5 * tau * (r * r).sum() + 0.5 * LAM * (theta * theta).sum() - (0.5 * len(y) + A0) * z + B0 * tau
    return U


def bnnbench_sampler(model: MLP, x: torch.Tensor, y: torch.Tensor, dtype, compile: bool):
    cfg = OmegaConf.create(dict(chains=CHAINS, warmup=0, thin=10, keep=50, leapfrog_steps=L, leapfrog_jitter=0.0,
                                step_size=STEP, learn_noise=True, noise_prior_shape=A0, noise_prior_rate=B0))
    method = HMC(cfg, model, "gaussian")
    problem = Problem("gaussian", torch.tensor([N]), torch.full((1, model.n_params), LAM, dtype=dtype),
                      noise_prec=torch.ones(1, dtype=dtype), y_scale=torch.ones(1, dtype=dtype))
    g = torch.Generator().manual_seed(0)
    state = method.init(problem, g)
    batch = Batch(x[None].to(dtype), y[None].to(dtype), torch.tensor([N]))
    update = method.update
    if compile:
        from bnnbench.run.compiled import compiled_update
        update = compiled_update(method)
    return method, state, batch, update, g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", default="10,50")
    ap.add_argument("--transitions", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--compile", action="store_true", help="time bnnbench's compiled step instead of the eager one")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    from numpyro.infer.hmc import hmc

    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    jdt = jnp.float32 if args.dtype == "float32" else jnp.float64
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(N, D)), rng.normal(size=N)
    for H in [int(h) for h in args.hidden.split(",")]:
        model = MLP([D, H, 1])
        P = model.n_params
        # the two potentials agree (float64) at the chains' start and after a few transitions
        method, state, batch, update, g = bnnbench_sampler(model, torch.tensor(x), torch.tensor(y), torch.float64,
                                                           False)
        jax.config.update("jax_enable_x64", True)
        U_jax = jax.jit(jax.vmap(jax_potential(model, x, y)))
        for _ in range(2):
            q = method.position(state)
            U_ours, _ = method.potential(state, q, batch, full_batch(batch))
            U_ref = np.asarray(U_jax(jnp.asarray(q[0].numpy())))
            err = float(np.max(np.abs(U_ours[0].numpy() - U_ref) / np.abs(U_ref)))
            assert err < 1e-10, f"the potentials differ: max relative difference {err:.1e}"
            for _ in range(5):
                state, _ = update(state, batch, g)

        # timing, in the run's dtype: interleaved repeats of `transitions` transitions each
        jax.config.update("jax_enable_x64", args.dtype == "float64")
        method, state, batch, update, g = bnnbench_sampler(model, torch.tensor(x), torch.tensor(y), dt, args.compile)
        init_kernel, sample_kernel = hmc(potential_fn=jax_potential(model, x.astype(jdt), y.astype(jdt)),
                                         algo="HMC")
        q0 = jnp.asarray(method.position(state)[0].numpy(), dtype=jdt)
        hstate = jax.vmap(lambda q, k: init_kernel(q, num_warmup=0, step_size=STEP, num_steps=L, trajectory_length=None,
                                                   adapt_step_size=False, adapt_mass_matrix=False, rng_key=k))(
            q0, jax.random.split(jax.random.PRNGKey(0), CHAINS))
        sample = jax.jit(jax.vmap(sample_kernel))
        hstate = sample(hstate)                        # compiles
        t0 = time.perf_counter()
        state, _ = update(state, batch, g)             # (compiles where --compile)
        first = time.perf_counter() - t0
        jax.block_until_ready(hstate)
        ours, theirs = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for _ in range(args.transitions):
                state, _ = update(state, batch, g)
            ours.append((time.perf_counter() - t) / args.transitions * 1e3)
            t = time.perf_counter()
            for _ in range(args.transitions):
                hstate = sample(hstate)
            jax.block_until_ready(hstate)
            theirs.append((time.perf_counter() - t) / args.transitions * 1e3)
        acc_ours = float(state.accept_sum.mean() / int(state.t[0]))
        acc_theirs = float(jnp.mean(hstate.mean_accept_prob))
        t_o, t_t = statistics.median(ours), statistics.median(theirs)
        print(f"H = {H} (P = {P}), {CHAINS} chains, L = {L}, N = {N}, {args.dtype}, 1 thread"
              f"{', compiled' if args.compile else ''}: bnnbench {t_o:.2f} ms / transition (first {first:.1f} s), "
              f"NumPyro {t_t:.2f} ms: ratio {t_o / t_t:.2f}x (median of {args.repeats} x {args.transitions}; "
              f"acceptance {acc_ours:.2f} / {acc_theirs:.2f}; potentials agree to {err:.0e})")


if __name__ == "__main__":
    main()
