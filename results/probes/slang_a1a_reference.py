"""SLANG Table 1, a1a: why its KL cells differ from the paper's (results/README, misses).

Every KL cell of Table 1 is the symmetric KL 1/2 [KL(q || q*) + KL(q* || q)] of a column's Gaussian q to the
Full-Gaussian Exact solution q* of the same split. This script takes the authors' stored posteriors of a1a (the
``.mat`` files behind their Table 1 CSV, in their repository) and, for each column, sets the four combinations of
{their q, our q} x {their q*, our q*} side by side, so that the part of a difference due to the reference q* and the
part due to the column's own q are apart; then it fits our Full-Gaussian Exact q* again, stopped at a series of
gradient tolerances, to show how the KL of Mean-Field Exact moves with the reference's convergence.

    git clone https://github.com/aaronpmishkin/SLANG /tmp/SLANG      # the code read: @ 2563276
    BNNBENCH_MIRROR=... python results/probes/slang_a1a_reference.py /tmp/SLANG

Our q of each column is the committed run's ``results/runs/slang_table1/<column>/libsvm__a1a/posterior.npz``.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import scipy.io as sio

from bnnbench.core.data import load_dataset
from bnnbench.methods.exact import exact_vi
from bnnbench.methods.exact.logreg import exact_solution, prior_vector, split_arrays
from bnnbench.run.config import CommandLine, compose
from bnnbench.run.protocol import resolve

REPO = Path(__file__).resolve().parents[2]
STORED = "code/matlab/experiments/paper_experiment_data/final_log_reg_table/a1a"
COLUMNS = {  # our column: the authors' file under STORED
    "exact_mf": "mf-exact/a1a_mf-exact_M_1_L_0_K_0_beta_0_alpha_0_decay_0_restart_1.mat",
    "mf_ef": "mf-EF/a1a_mf-EF_M_128_L_0_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "mf_hessian": "mf-Hessian/a1a_mf-Hessian_M_128_L_0_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "slang_L1": "SLANG/a1a_SLANG_M_128_L_1_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "slang_L2": "SLANG/a1a_SLANG_M_128_L_2_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "slang_L5": "SLANG/a1a_SLANG_M_128_L_5_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "slang_L10": "SLANG/a1a_SLANG_M_128_L_10_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "full_ef": "EF/a1a_EF_M_128_L_0_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
    "full_hessian": "Hessian/a1a_Hessian_M_128_L_0_K_0_beta_0.05_alpha_0.05_decay_0.51_restart_1.mat",
}


def authors_q(repo: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    raw = subprocess.run(["git", "-C", repo, "show", f"HEAD:{STORED}/{path}"], check=True, capture_output=True).stdout
    m = sio.loadmat(io.BytesIO(raw))
    return m["mu"].ravel(), m["Sigma"]


def _committed_q(col: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(REPO / f"results/runs/slang_table1/{col}/libsvm__a1a/posterior.npz")
    return z["mean"], z["cov"]


def main(repo: str) -> None:
    ds = load_dataset("libsvm/a1a")
    ov = ["experiment=slang_table1", "method=exact_full", "data=libsvm/a1a"]
    spec = resolve(compose(ov), CommandLine.parse(ov), meta=ds.meta)   # the prior and tolerance a run resolves
    X, y, _, _ = split_arrays(ds, ds.splits[0])
    lam = prior_vector(X.shape[1] - 1, spec.fixed["prior_prec"], spec.bias_prior_prec)
    kl = exact_vi.sym_kl
    ours = exact_solution(X, y, lam, "full", gtol=spec.exact_gtol)
    ours_ref = (ours.mean, ours.cov)
    theirs_ref = authors_q(repo, "exact/a1a_exact_M_1_L_0_K_0_beta_0_alpha_0_decay_0_restart_1.mat")
    g = np.abs(exact_vi.neg_elbo(exact_vi.pack_params(*theirs_ref, "full"), X, y, lam, "full")[1]).max()
    print(f"Full-Gaussian Exact q*: max |d(-ELBO)/d theta| the authors' {g:.2e}, ours {ours.grad_norm:.1e}; "
          f"-ELBO/N {exact_vi.neg_elbo_per_point(*theirs_ref, X, y, lam):.8f} / {ours.neg_elbo_per_point:.8f}; "
          f"bias variance {theirs_ref[1][0, 0]:.3f} / {ours.cov[0, 0]:.3f}; sym KL between them "
          f"{kl(*theirs_ref, *ours_ref):.4f}")
    print(f"{'column':<13s} {'their q, their q*':>17s} {'their q, our q*':>15s} {'our q, their q*':>15s} "
          f"{'our q, our q*':>13s} {'our q, their q':>14s}")
    for col, path in COLUMNS.items():
        tq, oq = authors_q(repo, path), _committed_q(col)
        print(f"{col:<13s} {kl(*tq, *theirs_ref):17.3f} {kl(*tq, *ours_ref):15.3f} {kl(*oq, *theirs_ref):15.3f} "
              f"{kl(*oq, *ours_ref):13.3f} {kl(*oq, *tq):14.3f}")
    mf = _committed_q("exact_mf")
    print("our Full-Gaussian Exact stopped at max |gradient| <= gtol (L-BFGS from m = 0, S = I, no polish):")
    for gtol in (1e-1, 3e-2, 1e-2, 1e-3, 1e-5):
        try:
            r = exact_vi.fit_exact(X, y, lam, "full", gtol=gtol, polish=False)
        except exact_vi.NotConvergedError as e:
            r = e.result
        print(f"  gtol {gtol:g}: {r.n_iter} iterations, -ELBO/N {r.neg_elbo_per_point:.8f}, bias variance "
              f"{r.cov[0, 0]:.4f}, sym KL of Mean-Field Exact {kl(*mf, r.mean, r.cov):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
