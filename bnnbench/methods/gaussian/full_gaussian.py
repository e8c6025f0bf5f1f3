"""Full-covariance Gaussian natural-gradient VI for small models (SLANG eqs. 2, 12, 13; the "Full-Gaussian
EF" and "Full-Gaussian Hessian" columns of SLANG Table 1).

q(theta) = N(mu, Sigma), Sigma^-1 = prec [P, P]. With theta_s ~ q, s = 1..S, and a minibatch of M:

    prec <- (1 - beta) prec + beta (N/(MS) sum_{i,s} C_{i,s} + diag(lambda)),
    mu   <- mu - alpha prec^-1 (N/(MS) sum_{i,s} g_{i,s} + lambda * mu),

with g the per-example NLL gradients and C = g g^T (``curvature: ef``), the Gauss-Newton
J^T Lambda J (``ggn``), or the exact Hessian of the per-example NLL (``hessian``, by ``torch.func``).
Step sizes decay as alpha_0 / (1 + t^kappa) (kappa = 0: constant). O(P^2) memory, O(P^3) per step: one Cholesky
factor of the new prec per step, used for the mean step and kept for the next step's samples.

For a linear model with one output (logistic regression), every per-example gradient is r_is phi_i with
phi_i = [x_i, 1] and every Gauss-Newton factor sqrt(h_is) phi_i, so the curvature sums over samples first:
sum_{i,s} C_{i,s} = Phi^T diag(w) Phi with w_i = sum_s r_is^2 (ef) or sum_s h_is (ggn): M P^2 flops instead of
S M P^2 (``per_example.collapse_samples``).

``momentum: rho > 0`` replaces the gradient by m_hat = m / (1 - rho^t),
m <- rho m + (1 - rho)(N/(MS) sum g + lambda mu), as the VOGN of Khan et al.'s MATLAB logistic-regression code
(``my_methods.m``, rho = 0.9); rho = 0 is the update above.

``covariance: diag`` is the mean-field version (the "Mean-Field EF / Hessian" columns of SLANG Table 1):
prec is a vector and C is replaced by its diagonal, so the mean step divides by prec elementwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.core.linalg.per_example import collapse_samples, forward_cache, materialise, sum_grads, sum_sq_grads
from bnnbench.methods.base import Method, Problem, hyper_state, likelihood_of, standard_normal
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.gaussian.natural import as_leaves, per_example_stats
from bnnbench.methods.gaussian.slang import decayed
from bnnbench.methods.state import State, state_class


def mixed_prec(prec: torch.Tensor, C_sum: torch.Tensor, scale: torch.Tensor, lam: torch.Tensor,
               beta: torch.Tensor) -> torch.Tensor:
    """The precision update (SLANG eq. 12) symmetrised: ``sym((1 - b) prec + b (scale C + diag lam))`` with
    ``sym(X) = (X + X^T) / 2``, for ``prec, C_sum [R, P, P]``, ``scale, beta [R]``, ``lam [R, P]``.

    Each element is rounded as in that expression, operation by operation in the same order (a multiply or an add
    rounds the same wherever it runs), so a run's bits do not depend on which form computes it; but in place, in
    ``C_sum``'s buffer (the caller's scratch, overwritten) and one new one: the diagonal added on the diagonal only
    instead of a dense ``diag_embed``, and no temporaries. At SLANG Table 1's USPS size ([20, 257, 257], float32, one
    thread) 2.7 against 4.6 ms, the step 1.22-1.32x faster (bench/full_gaussian_step.py)."""
    b = beta[:, None, None]
    x = C_sum.mul_(scale[:, None, None])
    x.diagonal(dim1=-2, dim2=-1).add_(lam)
    x.mul_(b)
    z = prec * (1 - b)
    z.add_(x)
    return torch.add(z, z.transpose(-1, -2), out=x).mul_(0.5)


@dataclass(frozen=True)
class FullGaussianConfig(MethodConfig):
    name: str = "full_gaussian"
    curvature: str = "ef"               # ef (empirical Fisher) | ggn (Gauss-Newton) | hessian (exact, torch.func)
    covariance: str = "full"            # full | diag (mean-field natural gradient with the curvature's diagonal)
    lr: float = 0.05                    # alpha_0
    beta: float = 0.05                  # beta_0
    decay_lr: float = 0.0               # kappa: alpha_t = alpha_0 / (1 + t^kappa)
    decay_beta: float = 0.0
    momentum: float = 0.0               # rho of a gradient momentum as SLANG's code (0: none)
    train_samples: int = 1
    prec_init: float = 1.0              # initial precision prec_init * I
    init_mean: str = "zero"


@state_class
class FullGaussianState(State):
    """q(theta) = N(mean, prec^-1): mean ``[R, P]``, prec ``[R, P, P]`` (``covariance: diag``: its diagonal
    ``[R, P]``) and, full, its Cholesky factor prec_chol = L, prec = L L^T (None with ``covariance: diag``); the
    gradient momentum m after t steps."""
    mean: torch.Tensor
    prec: torch.Tensor
    m: torch.Tensor
    t: torch.Tensor
    prec_chol: torch.Tensor | None = None


class FullGaussian(Method):
    name = "full_gaussian"
    Config = FullGaussianConfig

    @property
    def diagonal(self) -> bool:
        cov = self.cfg.covariance
        if cov not in ("full", "diag"):
            raise ValueError(f"unknown covariance {cov!r}; valid: full, diag")
        return cov == "diag"

    def init(self, problem: Problem, generator: torch.Generator) -> FullGaussianState:
        mean = self.init_params(problem, generator)
        prec = torch.full_like(mean, self.cfg.prec_init)
        fields = dict(**hyper_state(problem), mean=mean, m=torch.zeros_like(mean),
                      t=torch.zeros(problem.n_replicas, dtype=torch.long, device=mean.device))
        if self.diagonal:
            return FullGaussianState(**fields, prec=prec)
        return FullGaussianState(**fields, prec=torch.diag_embed(prec), prec_chol=torch.diag_embed(prec.sqrt()))

    def noise(self, state, batch, generator):
        return standard_normal(state.mean, self.cfg.train_samples, generator)

    def sample(self, state, eps):
        """theta = mu + L^-T eps with prec = L L^T, so Cov theta = prec^-1."""
        if self.diagonal:
            return state.mean.unsqueeze(1) + eps * state.prec.rsqrt().unsqueeze(1)
        L = state.prec_chol if state.prec_chol is not None else torch.linalg.cholesky(state.prec)
        z = torch.linalg.solve_triangular(L.transpose(-1, -2), eps.transpose(-1, -2), upper=True)
        return state.mean.unsqueeze(1) + z.transpose(-1, -2)

    def curvature_and_grad(self, state, theta, batch, diagonal: bool = False):
        """Sums over (sample, example) of the NLL gradients [R, P] and curvatures [R, P, P] (``diagonal``: their
        diagonals [R, P]), and the NLL. The EF and Gauss-Newton curvatures are G G^T of per-example factors formed
        from activations and back-propagated gradients; a linear model's factors are summed over samples first
        (``collapse_samples``)."""
        kind = self.cfg.curvature
        if kind not in ("ef", "ggn", "hessian"):
            raise ValueError(f"unknown curvature {kind!r}; valid: ef, ggn, hessian")
        layers = as_leaves(self.model.layers(theta))
        with torch.enable_grad():
            f, acts, zs = forward_cache(self.model, layers, batch.x)
            lik = likelihood_of(state, self.likelihood)
            nll_i = -lik.log_prob(f, batch.y)
            gs = torch.autograd.grad(nll_i.sum(), zs, retain_graph=kind == "ggn")
            acts = [a.detach() for a in acts]
            g_sum = sum_grads(self.model, *collapse_samples(self.model, acts, gs, how="sum")).sum(1)
            if kind == "hessian":
                C = self._hessian(state, theta, batch)
                return g_sum, C.diagonal(dim1=-2, dim2=-1) if diagonal else C, nll_i.detach().mean(dim=(1, 2))
            if kind == "ef":
                factors = gs
            else:   # Gauss-Newton factors sqrt(Lambda) J: back-propagated sqrt(Lambda) f
                if f.shape[-1] != 1:  # K outputs: Lambda is K x K, its square root a Monte Carlo one
                    raise ValueError("curvature=ggn supports gaussian and bernoulli likelihoods")
                factors = torch.autograd.grad(lik.ggn_sqrt_output(f).sum(), zs)
        acts_c, factors_c = collapse_samples(self.model, acts, factors, how="rss")
        if diagonal:
            C = sum_sq_grads(self.model, acts_c, factors_c).sum(1)
        else:
            G = materialise(self.model, acts_c, factors_c)                       # [R, P, S M] (M: linear model)
            C = G @ G.transpose(1, 2)
        return g_sum, C, nll_i.detach().mean(dim=(1, 2))

    def _hessian(self, state, theta, batch):
        # reverse over reverse: faster on these models than torch.func.hessian (forward over reverse), whose first
        # forward-mode use makes torch compile its JVP decompositions with the deprecated torch.jit.script
        from torch.func import jacrev
        R, S, P = theta.shape
        out = torch.zeros(R, P, P, dtype=theta.dtype, device=theta.device)
        for r in range(R):
            sub = state[r]

            def total_nll(th, r=r, sub=sub):
                f = self.model.forward(th[None, None], batch.x[r:r + 1])
                return -likelihood_of(sub, self.likelihood).log_prob(f, batch.y[r:r + 1]).sum()
            for s in range(S):
                out[r] += jacrev(jacrev(total_nll))(theta[r, s])
        return out

    def step(self, state, batch, noise, lr_scale=1.0):
        mean, prec, lam = state.mean, state.prec, state.prior_prec
        t = state.t + 1
        alpha = lr_scale * decayed(self.cfg.lr, self.cfg.decay_lr, t).to(mean.dtype)
        beta = decayed(self.cfg.beta, self.cfg.decay_beta, t).to(mean.dtype)
        theta = self.sample(state, noise)
        if self.diagonal and not self.model.is_linear and self.cfg.curvature in ("ef", "ggn"):
            g_s, c_s, nll = per_example_stats(self, state, as_leaves(self.model.layers(theta)), batch,
                                              self.cfg.curvature)                # diagonals without forming G
            g_sum, C_sum = g_s.sum(1), c_s.sum(1)
        else:
            g_sum, C_sum, nll = self.curvature_and_grad(state, theta, batch, self.diagonal)
        scale = state.n_data.to(mean.dtype) / noise.shape[1] / batch.x.shape[1]          # N / (MS)
        rhs = scale[:, None] * g_sum + lam * mean
        m = state.m
        rho = self.cfg.momentum
        if rho > 0:
            m = rho * state.m + (1 - rho) * rhs
            rhs = m / (1 - rho ** t.to(mean.dtype))[:, None]
        if self.diagonal:
            new_prec = (1 - beta[:, None]) * prec + beta[:, None] * (scale[:, None] * C_sum + lam)
            new_mean = mean - alpha[:, None] * rhs / new_prec
            return state.replace(mean=new_mean, prec=new_prec, m=m, t=t), {"objective": nll, "nll": nll}
        new_prec = mixed_prec(prec, C_sum, scale, lam, beta)
        L = torch.linalg.cholesky(new_prec)
        new_mean = mean - alpha[:, None] * torch.cholesky_solve(rhs.unsqueeze(-1), L)[..., 0]
        return state.replace(mean=new_mean, prec=new_prec, prec_chol=L, m=m, t=t), {"objective": nll, "nll": nll}

    def kl(self, state):
        """KL(N(mu, prec^-1) || N(0, diag(lambda)^-1)) with dense linear algebra."""
        lam, mean, prec = state.prior_prec, state.mean, state.prec
        if self.diagonal:
            cov_diag, logdet = 1 / prec, prec.log().sum(-1)
        else:
            cov_diag, logdet = torch.linalg.inv(prec).diagonal(dim1=-2, dim2=-1), torch.logdet(prec)
        return 0.5 * ((lam * cov_diag).sum(-1) + (lam * mean * mean).sum(-1) - mean.shape[-1]
                      + logdet - torch.log(lam).sum(-1))

    def gaussian(self, state):
        prec = state.prec
        return state.mean, torch.diag_embed(1 / prec) if self.diagonal else torch.linalg.inv(prec)

    def predict(self, state, x, n_samples, generator):
        eps = standard_normal(state.mean, n_samples, generator)
        return self._predictive(state, self.model.forward(self.sample(state, eps), x))
