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
S M P^2 (``_linear_curvature``).

``momentum: rho > 0`` replaces the gradient by m_hat = m / (1 - rho^t), m <- rho m + (1 - rho)(N/(MS) sum g + lambda mu),
as the VOGN of Khan et al.'s MATLAB logistic-regression code (``my_methods.m``, rho = 0.9); rho = 0 is the update above.

``covariance: diag`` is the mean-field version (the "Mean-Field EF / Hessian" columns of SLANG Table 1):
prec is a vector and C is replaced by its diagonal, so the mean step divides by prec elementwise.
"""

from __future__ import annotations

import torch

from bnnbench.linalg.per_example import forward_cache, materialise
from bnnbench.methods.base import Method, Problem, State, hyper_state, likelihood_of
from bnnbench.methods.natural import as_leaves, per_example_stats
from bnnbench.methods.slang import decayed


class FullGaussian(Method):
    name = "full_gaussian"

    @property
    def diagonal(self) -> bool:
        cov = self.cfg.get("covariance", "full")
        if cov not in ("full", "diag"):
            raise ValueError(f"unknown covariance {cov!r}; valid: full, diag")
        return cov == "diag"

    def init(self, problem: Problem, generator: torch.Generator) -> State:
        R, P = problem.prior_prec.shape
        mean = self.model.init(R, generator, self.cfg.init_mean, device=problem.prior_prec.device,
                               dtype=problem.prior_prec.dtype)
        prec = torch.full_like(mean, float(self.cfg.prec_init))
        state = {**hyper_state(problem), "mean": mean, "m": torch.zeros_like(mean),
                 "t": torch.zeros(R, dtype=torch.long, device=mean.device)}
        if self.diagonal:
            return {**state, "prec": prec}
        return {**state, "prec": torch.diag_embed(prec), "prec_chol": torch.diag_embed(prec.sqrt())}

    def noise(self, state, batch, generator):
        R, P = state["mean"].shape
        return torch.randn(R, int(self.cfg.train_samples), P, generator=generator, dtype=state["mean"].dtype,
                           device=state["mean"].device)

    def sample(self, state, eps):
        """theta = mu + L^-T eps with prec = L L^T, so Cov theta = prec^-1."""
        if self.diagonal:
            return state["mean"].unsqueeze(1) + eps * state["prec"].rsqrt().unsqueeze(1)
        L = state["prec_chol"] if "prec_chol" in state else torch.linalg.cholesky(state["prec"])
        z = torch.linalg.solve_triangular(L.transpose(-1, -2), eps.transpose(-1, -2), upper=True)
        return state["mean"].unsqueeze(1) + z.transpose(-1, -2)

    def curvature_and_grad(self, state, theta, batch):
        """Sums over (sample, example) of the NLL gradients [R, P] and curvatures [R, P, P], and the NLL."""
        kind = self.cfg.curvature
        if kind in ("ef", "ggn") and self.model.is_linear:
            return self._linear_curvature(state, theta, batch, kind)
        layers = as_leaves(self.model.layers(theta))
        with torch.enable_grad():
            f, acts, zs = forward_cache(self.model, layers, batch.x)
            nll_i = -likelihood_of(state, self.likelihood).log_prob(f, batch.y)
            gs = torch.autograd.grad(nll_i.sum(), zs, retain_graph=kind == "ggn")
            G = materialise(self.model, [a.detach() for a in acts], gs)            # [R, P, S*M]
            if kind == "ef":
                C = G @ G.transpose(1, 2)
            elif kind == "ggn":
                if self.likelihood == "gaussian":
                    w = state["noise_prec"].sqrt().reshape(-1, 1, 1, 1)
                elif self.likelihood == "bernoulli":
                    p = torch.sigmoid(f.detach())
                    w = (p * (1 - p)).sqrt()
                else:
                    raise ValueError("curvature=ggn supports gaussian and bernoulli likelihoods")
                J = materialise(self.model, [a.detach() for a in acts], torch.autograd.grad((f * w).sum(), zs))
                C = J @ J.transpose(1, 2)
            elif kind == "hessian":
                C = self._hessian(state, theta, batch)
            else:
                raise ValueError(f"unknown curvature {kind!r}; valid: ef, ggn, hessian")
        return G.sum(-1), C, nll_i.detach().mean(dim=(1, 2))

    def _linear_curvature(self, state, theta, batch, kind, diagonal=False):
        """``curvature_and_grad`` of a linear model f = phi^T theta, phi = [x, 1]: with r_is = dNLL_is/df and
        h_is = d^2NLL_is/df^2 (tau: Gaussian, p(1 - p): Bernoulli), sum_{i,s} g_is = Phi^T sum_s r_s and
        sum_{i,s} C_is = Phi^T diag(w) Phi, w = sum_s r_s^2 (ef) or sum_s h_s (ggn); ``diagonal``: its diagonal
        (Phi * Phi)^T w only."""
        x = batch.x
        phi = torch.cat([x, torch.ones_like(x[..., :1])], -1)                      # [R, M, P]
        with torch.enable_grad():
            f = self.model.forward(theta.detach(), x).requires_grad_(True)   # [R, S, M, 1]
            nll_i = -likelihood_of(state, self.likelihood).log_prob(f, batch.y)
            r = torch.autograd.grad(nll_i.sum(), f)[0][..., 0]                  # [R, S, M]
        if kind == "ef":
            w = (r * r).sum(1)
        elif self.likelihood == "gaussian":
            w = theta.shape[1] * state["noise_prec"][:, None].expand(r.shape[0], r.shape[2])
        elif self.likelihood == "bernoulli":
            p = torch.sigmoid(f.detach()[..., 0])
            w = (p * (1 - p)).sum(1)
        else:
            raise ValueError("curvature=ggn supports gaussian and bernoulli likelihoods")
        g_sum = (phi * r.sum(1).unsqueeze(-1)).sum(1)
        C = (phi * phi * w.unsqueeze(-1)).sum(1) if diagonal else phi.transpose(1, 2) @ (phi * w.unsqueeze(-1))
        return g_sum, C, nll_i.detach().mean(dim=(1, 2))

    def _hessian(self, state, theta, batch):
        from torch.func import hessian
        R, S, P = theta.shape
        out = torch.zeros(R, P, P, dtype=theta.dtype, device=theta.device)
        for r in range(R):
            sub = {k: v[r:r + 1] for k, v in state.items()}

            def total_nll(th, r=r, sub=sub):
                f = self.model.forward(th[None, None], batch.x[r:r + 1])
                return -likelihood_of(sub, self.likelihood).log_prob(f, batch.y[r:r + 1]).sum()
            for s in range(S):
                out[r] += hessian(total_nll)(theta[r, s])
        return out

    def step(self, state, batch, noise):
        mean, prec, lam = state["mean"], state["prec"], state["prior_prec"]
        t = state["t"] + 1
        alpha = self.lr_scale * decayed(float(self.cfg.lr), float(self.cfg.get("decay_lr", 0)), t).to(mean.dtype)
        beta = decayed(float(self.cfg.beta), float(self.cfg.get("decay_beta", 0)), t).to(mean.dtype)
        theta = self.sample(state, noise)
        if self.model.is_linear and self.cfg.curvature in ("ef", "ggn"):
            g_sum, C_sum, nll = self._linear_curvature(state, theta, batch, self.cfg.curvature, self.diagonal)
        elif self.diagonal and self.cfg.curvature in ("ef", "ggn"):   # diagonals without forming G (natural.py)
            g_s, c_s, nll = per_example_stats(self, state, as_leaves(self.model.layers(theta)), batch,
                                              self.cfg.curvature)
            g_sum, C_sum = g_s.sum(1), c_s.sum(1)
        else:
            g_sum, C_sum, nll = self.curvature_and_grad(state, theta, batch)
            C_sum = C_sum.diagonal(dim1=-2, dim2=-1) if self.diagonal else C_sum
        scale = state["n_data"].to(mean.dtype) / noise.shape[1] / batch.x.shape[1]          # N / (MS)
        rhs = scale[:, None] * g_sum + lam * mean
        new = {**state, "t": t}
        rho = float(self.cfg.get("momentum", 0.0))
        if rho > 0:
            m = rho * state["m"] + (1 - rho) * rhs
            rhs = m / (1 - rho ** t.to(mean.dtype))[:, None]
            new["m"] = m
        if self.diagonal:
            new_prec = (1 - beta[:, None]) * prec + beta[:, None] * (scale[:, None] * C_sum + lam)
            new_mean = mean - alpha[:, None] * rhs / new_prec
            return {**new, "mean": new_mean, "prec": new_prec}, {"objective": nll, "nll": nll}
        b = beta[:, None, None]
        new_prec = (1 - b) * prec + b * (scale[:, None, None] * C_sum + torch.diag_embed(lam))
        new_prec = 0.5 * (new_prec + new_prec.transpose(-1, -2))
        L = torch.linalg.cholesky(new_prec)
        new_mean = mean - alpha[:, None] * torch.cholesky_solve(rhs.unsqueeze(-1), L)[..., 0]
        return {**new, "mean": new_mean, "prec": new_prec, "prec_chol": L}, {"objective": nll, "nll": nll}

    def kl(self, state):
        """KL(N(mu, prec^-1) || N(0, diag(lambda)^-1)) with dense linear algebra."""
        lam, mean, prec = state["prior_prec"], state["mean"], state["prec"]
        if self.diagonal:
            cov_diag, logdet = 1 / prec, prec.log().sum(-1)
        else:
            cov_diag, logdet = torch.linalg.inv(prec).diagonal(dim1=-2, dim2=-1), torch.logdet(prec)
        return 0.5 * ((lam * cov_diag).sum(-1) + (lam * mean * mean).sum(-1) - mean.shape[-1]
                      + logdet - torch.log(lam).sum(-1))

    def gaussian(self, state):
        prec = state["prec"]
        return state["mean"], torch.diag_embed(1 / prec) if self.diagonal else torch.linalg.inv(prec)

    def predict(self, state, x, n_samples, generator):
        R, P = state["mean"].shape
        eps = torch.randn(R, n_samples, P, generator=generator, dtype=state["mean"].dtype, device=state["mean"].device)
        return self._predictive(state, self.model.forward(self.sample(state, eps), x))
