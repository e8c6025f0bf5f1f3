"""SLANG (Mishkin et al., NeurIPS 2018, Algorithm 1; the authors' Python optimiser, docs/protocols/slang.md 2).

q(theta) = N(mu, (U U^T + diag d)^-1), U [P, L]. One step with S samples and a minibatch of M:

1. theta_s = mu + fast_sample(U, d) (Algorithm 3);
2. per-example NLL gradients g_{i,s}; g_hat = (N / MS) sum g_{i,s}; G_hat = (N / MS) sum g g^T (implicit);
3. U <- top-L eigen-decomposition of (1 - beta) U U^T + beta G_hat (fast_eig), as U = V diag(sqrt(e));
4. d <- (1 - beta) d + beta lambda + max(0, diag[(1 - beta) U_old U_old^T + beta G_hat] - diag[U U^T]) (eqs. 8-10);
5. m <- rho m + (1 - rho) g_hat, m_hat = m / (1 - rho^t) (the code's momentum; rho = 0 is the paper's eq. 11);
6. mu <- mu - alpha (U U^T + diag d)^-1 (m_hat + lambda * mu) (fast_inverse, Algorithm 2);

with alpha_t = alpha_0 / (1 + t^kappa_alpha), beta_t = beta_0 / (1 + t^kappa_beta) (kappa = 0: constant).
Note: the authors' config key ``beta`` is 1 - beta_0; here ``beta`` is the paper's beta.

Step 3 is exact by default (``eig: gram``): (1 - beta) U U^T + beta G_hat = B B^T with
B = [sqrt(1 - beta) U, sqrt(beta N / MS) G], whose top eigenpairs follow from the small Gram matrix
B^T B = V diag(e) V^T as U = B V_L; G^T G comes from activations and back-propagated gradients
(``gradient_gram``) and G is never formed. Where P <= L + MS (logistic regression) the P x P matrix
B B^T is the smaller one and is decomposed directly. ``eig: randomized`` uses the paper's randomised
``fast_eig`` (Rayleigh-Ritz) on the same operator instead, ``eig: nystrom`` the authors' Python code's
(``fastpca.eigsh_func``: uniform probes, Nystrom step; ``linalg.low_rank.nystrom_eig``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.core import prng
from bnnbench.core.linalg import outer_times
from bnnbench.core.linalg.low_rank import (fast_eig, fast_inverse, fast_sample, kl_low_rank_to_diag, nystrom_eig,
                                      nystrom_top, top_eigh)
from bnnbench.core.linalg.per_example import (backprop, collapse_samples, forward_cache, gradient_gram,
                                              gradient_t_times, gradient_times, layer_factors, materialise, sum_grads,
                                              sum_sq_grads)
from bnnbench.core.models.mlp import MLP
from bnnbench.methods.base import Method, Problem, hyper_state, likelihood_of, standard_normal
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.gaussian.natural import as_leaves
from bnnbench.methods.state import State, state_class


def decayed(rate0: float, kappa: float, t: torch.Tensor) -> torch.Tensor:
    if kappa == 0:
        return torch.full(t.shape, rate0, dtype=torch.float64, device=t.device)
    return rate0 / (1 + t.to(torch.float64) ** kappa)


def resolved(e: torch.Tensor, n: int) -> torch.Tensor:
    """Eigenvalues ``e [R, k]`` of an n x n PSD matrix that its dtype resolves: e > n eps max(e). Below that an
    eigenpair is rounding (a null direction); an absolute cut-off instead would depend on the data's units."""
    return e > n * torch.finfo(e.dtype).eps * e.amax(-1, keepdim=True).clamp_min(0)


def _sq_vector_norm(U: torch.Tensor) -> torch.Tensor:
    """The rows' squared norms ``||U_i||^2``, as the eager step (and every record) computes them."""
    return torch.linalg.vector_norm(U, dim=-1) ** 2


def _sum_sq(U: torch.Tensor) -> torch.Tensor:
    """The same as a sum of squares, for the compiled step: torch 2.11's shape rule for ``vector_norm`` over a dim of
    size 1 (L = 1) keeps that dim, so the compiled step broadcast ``[R, P, 1]`` against ``[R, P]`` to ``[R, P, P]``
    (852 GiB at MNIST scale; the H200 lease of 2026-11-27)."""
    return (U * U).sum(-1)


@dataclass(frozen=True)
class SLANGConfig(MethodConfig):
    name: str = "slang"
    rank: int = 1                       # L
    lr: float = 0.01                    # alpha_0
    beta: float = 0.01                  # beta_0, the paper's beta (the authors' config key "beta" is 1 - beta_0)
    decay_lr: float = 0.0               # kappa_alpha: alpha_t = alpha_0 / (1 + t^kappa); 0 = constant
    decay_beta: float = 0.0             # kappa_beta
    momentum: float = 0.9               # rho of the code's gradient momentum; 0 = the paper's eq. 11
    train_samples: int = 1
    s_init: float = 1.0                 # initial diagonal d
    init_mean: str = "uniform_fan_in"
    eig: str = "gram"                   # gram (exact top-L of the Gram matrix) | randomized (the paper's fast_eig,
                                        # Rayleigh-Ritz) | nystrom (the code's fastpca.eigsh_func)
    n_iter: int = 4                     # randomized, nystrom: power iterations
    oversample: int = 2                 # randomized, nystrom: extra probes
    per_example: str = "fast"           # fast (activations x back-propagated gradients) | materialised (reference)


@state_class
class SLANGState(State):
    """q(theta) = N(mean, (U U^T + diag d)^-1): mean ``[R, P]``, U ``[R, P, L]``, d ``[R, P]``; the gradient
    momentum m after t steps."""
    mean: torch.Tensor
    U: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    t: torch.Tensor


class SLANG(Method):
    name = "slang"
    Config = SLANGConfig
    compilable = True   # bench/step_ab.py: 1.9-2.3x at UCI scale
    sign_free = ("U",)

    def init(self, problem: Problem, generator: torch.Generator) -> SLANGState:
        R, P = problem.prior_prec.shape
        mean = self.init_params(problem, generator)
        return SLANGState(**hyper_state(problem), mean=mean, U=mean.new_zeros(R, P, self.cfg.rank),
                          d=torch.full_like(mean, self.cfg.s_init), m=torch.zeros_like(mean),
                          t=torch.zeros(R, dtype=torch.long, device=mean.device))

    def noise(self, state, batch, generator):
        R, P = state.mean.shape
        eps = standard_normal(state.mean, self.cfg.train_samples, generator)
        how = self.cfg.eig
        if how == "gram":
            return eps, None
        k = min(P, self.cfg.rank + self.cfg.oversample)
        if how == "nystrom":   # the code's probes: uniform on [-1, 1]
            return eps, 2 * prng.rand(R, P, k, generator=generator, device=eps.device, dtype=eps.dtype) - 1
        return eps, prng.randn(R, P, k, generator=generator, device=eps.device, dtype=eps.dtype)

    def sample(self, state, eps):
        return state.mean.unsqueeze(1) + fast_sample(state.U, state.d, eps)

    def compiled_step(self, compile):
        """``step`` compiled, its per-example gradients back-propagated in closed form (``per_example.backprop`` of
        the likelihood's ``grad_f``) instead of by autograd. The Gram matrices' eigensolver on the CPU: for L = 1
        and matrices up to 64 x 64 (the small UCI sets'), or up to 144 x 144 for 8 or more replicas (the boards'
        129 x 129), the SIMD kernel of ``linalg.top_eigpair``, an operator inside the graph (the eager step's LAPACK
        eigenpairs to float rounding); else LAPACK, eagerly between the compiled parts (``top_eigh``). The randomised
        eigensolvers' products with the per-example gradients' outer products: on the CPU in float32, the kernel of
        ``linalg.outer_times``, an operator inside the graph; for ``eig: nystrom`` its whole subspace iteration
        (``outer_times.nystrom_range``), products and orthonormalisations, replica by replica."""
        outer = outer_times.available()
        return compile(lambda state, batch, noise, lr_scale=1.0: self.step(state, batch, noise, lr_scale,
                                                                          closed_form=True, outer=outer))

    def step(self, state, batch, noise, lr_scale=1.0, closed_form=False, outer=False):
        eps, probes = noise
        mean, U, d, lam = state.mean, state.U, state.d, state.prior_prec
        R, P, L = U.shape
        t = state.t + 1
        alpha = lr_scale * decayed(self.cfg.lr, self.cfg.decay_lr, t).to(mean.dtype)[:, None]
        beta = decayed(self.cfg.beta, self.cfg.decay_beta, t).to(mean.dtype)[:, None]

        theta = self.sample(state, eps)
        if closed_form:   # the compiled step's: no autograd graph, so nothing for the compiler to break on
            layers = list(self.model.layers(theta))
            f, acts, zs = forward_cache(self.model, layers, batch.x)
            lik = likelihood_of(state, self.likelihood)
            nll_i = -lik.log_prob(f, batch.y)
            gs = backprop(self.model, layers, acts, zs, -lik.grad_f(f, batch.y))   # d nll_i / d f = -d log p / d f
        else:
            layers = as_leaves(self.model.layers(theta))
            with torch.enable_grad():
                f, acts, zs = forward_cache(self.model, layers, batch.x)
                nll_i = -likelihood_of(state, self.likelihood).log_prob(f, batch.y)
                gs = torch.autograd.grad(nll_i.sum(), zs)
            acts = [a.detach() for a in acts]
        S, M = eps.shape[1], batch.x.shape[1]
        scale = state.n_data.to(mean.dtype)[:, None] / (S * M)          # N / (MS)
        if self.cfg.per_example == "materialised":
            g_hat = scale * sum_grads(self.model, acts, gs).sum(1)
        else:   # logistic regression: sums over samples first, M columns of G instead of S M
            g_hat = scale * sum_grads(self.model, *collapse_samples(self.model, acts, gs, "sum")).sum(1)
            acts, gs = collapse_samples(self.model, acts, gs, "rss")
        diag_G = scale * sum_sq_grads(self.model, acts, gs).sum(1)

        sq_norm = _sum_sq if closed_form else _sq_vector_norm
        old_diag = (1 - beta) * sq_norm(U) + beta * diag_G
        U_new = self.top_eig(U, acts, gs, beta, scale, probes, kernel="simd" if closed_form else "lapack", outer=outer)
        d_new = (1 - beta) * d + beta * lam + (old_diag - sq_norm(U_new)).clamp_min(0)

        rho = self.cfg.momentum
        if rho > 0:
            m = rho * state.m + (1 - rho) * g_hat
            m_hat = m / (1 - rho ** t.to(mean.dtype))[:, None]
        else:
            m = m_hat = g_hat
        new_mean = mean - alpha * fast_inverse(U_new, d_new, m_hat + lam * mean)
        nll = nll_i.detach().mean(dim=(1, 2))
        return (state.replace(mean=new_mean, U=U_new, d=d_new, m=m, t=t),
                {"objective": nll, "nll": nll})

    def gaussian(self, state):
        U, d = state.U, state.d
        return state.mean, torch.linalg.inv(U @ U.transpose(-1, -2) + torch.diag_embed(d))

    def kl(self, state):
        return kl_low_rank_to_diag(state.mean, state.U, state.d, state.prior_prec)

    def top_eig(self, U, acts, gs, beta, scale, probes, kernel="lapack", outer=False):
        """Top-L eigen-decomposition of (1 - beta) U U^T + beta G_hat, returned as V diag(sqrt(e)); ``kernel``: the
        Gram matrix's eigensolver on the CPU (``top_eigh``: LAPACK, or for the compiled step the SIMD kernel where it
        wins); ``outer``: the randomised eigensolvers' products with G_hat by ``outer_times``' kernel where it
        applies."""
        R, P, L = U.shape
        c = torch.sqrt(beta * scale)[:, :, None]                          # [R, 1, 1]
        a_U = torch.sqrt(1 - beta)[:, :, None]
        how = self.cfg.eig
        materialised = self.cfg.per_example == "materialised"
        n = acts[0].shape[1] * acts[0].shape[2]                              # S * M per-example gradients
        dense = how == "gram" and P <= n + L  # small models: eigh of the P x P matrix itself is the cheaper exact route
        fused = (outer and how in ("randomized", "nystrom") and not materialised and type(self.model) is MLP
                 and outer_times.applies(acts, gs))
        G = factors = None   # bound on every path: the closures below read them (and dynamo traces them)
        if materialised:
            G = materialise(self.model, acts, gs) * c                      # [R, P, n]
        elif not (dense or fused):
            factors = layer_factors(acts, gs)

        def Gt(V):
            return G.transpose(1, 2) @ V if materialised else c * gradient_t_times(self.model, factors, V)

        def Gx(W, out=None):
            """``out + G W`` (``out`` updated in place on the fast path)."""
            if materialised:
                return G @ W if out is None else out + G @ W
            return gradient_times(self.model, factors, c * W, out=out)

        if dense:
            G = G if materialised else materialise(self.model, acts, gs) * c
            A = (a_U ** 2 * (U @ U.transpose(1, 2)) + G @ G.transpose(1, 2)).double()
            # float64: in float32, LAPACK's eigh fails to converge on a1a's many exactly zero eigenvalues
            e, V = top_eigh(0.5 * (A + A.transpose(1, 2)), L)
            keep = resolved(e, P)
            e, V = e.to(U.dtype), V.to(U.dtype)
            return V * (e.clamp_min(0).sqrt() * keep.to(U.dtype)).unsqueeze(1)
        if how == "gram":
            UU = a_U ** 2 * (U.transpose(1, 2) @ U)
            UG = a_U * Gt(U).transpose(1, 2)                               # [R, L, n]
            GG = G.transpose(1, 2) @ G if materialised else c ** 2 * gradient_gram(factors)
            BtB = torch.cat([torch.cat([UU, UG], 2), torch.cat([UG.transpose(1, 2), GG], 2)], 1)
            e, V = top_eigh(BtB, L, kernel)
            V = V * resolved(e, BtB.shape[-1]).to(U.dtype).unsqueeze(1)   # drop null directions
            U_new = Gx(V[:, L:], out=U @ (a_U * V[:, :L]))                # B v_k, norm sqrt(e_k)
            if e.shape[-1] < L:  # fewer columns than the rank (tiny problems)
                U_new = torch.cat([U_new, U_new.new_zeros(R, P, L - e.shape[-1])], -1)
            return U_new
        if how not in ("randomized", "nystrom"):
            raise ValueError(f"unknown eig {how!r}; valid: gram, randomized, nystrom")

        if fused and how == "nystrom":   # the whole subspace iteration in the kernel, replica by replica
            e, V = nystrom_top(*outer_times.nystrom_range(acts, gs, U, (a_U * a_U).view(R), (c * c).view(R), probes,
                                                          self.cfg.n_iter), L)
        else:
            if fused:
                packed, layers, S, M = outer_times.pack(acts, gs)
                c2 = (c * c).view(R)

                def GGt(Y):
                    return outer_times.times(packed, layers, S, M, Y, c2)
            else:
                def GGt(Y):
                    return Gx(Gt(Y))

            def A(Y):
                return a_U ** 2 * (U @ (U.transpose(1, 2) @ Y)) + GGt(Y)

            eig = fast_eig if how == "randomized" else nystrom_eig
            e, V = eig(A, probes, L, n_iter=self.cfg.n_iter)
        e = torch.where(resolved(e, P), e, torch.zeros_like(e))
        return V * e.sqrt().unsqueeze(1)

    def predict(self, state, x, n_samples, generator):
        eps = standard_normal(state.mean, n_samples, generator)
        return self._predictive(state, self.model.forward(self.sample(state, eps), x))
