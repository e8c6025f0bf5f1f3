"""Noisy K-FAC with the block-tridiagonal inverse Fisher (NNG-BlkTri; Zhang, Sun, Duvenaud & Grosse, ICML 2018, Sec.
3.5 and Table 4), the approximation of Martens & Grosse (2015, "Optimizing neural networks with Kronecker-factored
approximate curvature", Sec. 4.3, App. B, Sec. 6.3) in noisy K-FAC's update (``noisy.NoisyKFAC``).

Statistics, per layer l = 1..L with homogeneous inputs a_l (a 1 appended) and the sampled targets' back-propagated
gradients g_l, all EMAs of the same rows (one per weight sample and example) with the rate beta~:

    A_l = E[a_l a_l^T],  G_l = E[g_l g_l^T]              (noisy K-FAC's A, S)
    A_{l,l+1} = E[a_l a_{l+1}^T],  G_{l,l+1} = E[g_l g_{l+1}^T]   (the cross-layer factors, Sec. 4.3)

and the Fisher's blocks F_{l,m} ~ A_{l,m} (x) G_{l,m} in the flat layout of ``[W; b]`` (row-major ``[d_in + 1,
d_out]``: vec(a g^T) = a (x) g). Damping (M&G Sec. 6.3): the diagonal blocks only, by noisy K-FAC's factored Tikhonov
terms (eq. 13 of the NNG paper), F_ll = A^g_l (x) G^g_l; the cross blocks undamped.

F^ is the matrix that agrees with F on the tridiagonal blocks and whose inverse is block tridiagonal (the Gaussian
graphical model of a chain: w_l | w_{l+1} ~ N(Psi_{l,l+1} w_{l+1}, Sigma_{l|l+1}), Sec. 4.3). Its inverse is

    F^-1 = Xi^T Lambda Xi,  Xi = I - (Psi_{l,l+1} on the block super-diagonal),
    Lambda = diag(Sigma_{1|2}^-1, ..., Sigma_{L-1|L}^-1, F_LL^-1),
    Psi_{l,l+1} = F_{l,l+1} F_{l+1,l+1}^-1 = (A_{l,l+1} [A^g_{l+1}]^-1) (x) (G_{l,l+1} [G^g_{l+1}]^-1)
                = P^A_l (x) P^G_l,
    Sigma_{l|l+1} = F_ll - Psi F_{l+1,l+1} Psi^T = A^g_l (x) G^g_l - B_l (x) C_l,
    B_l = P^A_l A_{l,l+1}^T,  C_l = P^G_l G_{l,l+1}^T.

Sigma_{l|l+1} is not a Kronecker product; it is inverted by the generalised eigen-decompositions of (B_l, A^g_l) and
(C_l, G^g_l) (App. B): with U_A = chol(A^g)^-T Q_A, Q_A diag(s) Q_A^T the eigen-decomposition of chol(A^g)^-1 B
chol(A^g)^-T (so U_A^T A^g U_A = I and U_A^T B U_A = diag(s)), and U_G, t alike,

    Sigma_{l|l+1}^-1 = (U_A (x) U_G) diag(1 / (1 - s_i t_j)) (U_A (x) U_G)^T;

the last layer's Lambda_L = [A^g_L]^-1 (x) [G^g_L]^-1 is the same form with s = t = 0. 1 - s t > 0: the damped joint
factors are positive definite and the block matrix [A_lm (x) G_lm] is a principal sub-matrix of their Kronecker
product, so each Sigma_{l|l+1}, a Schur complement of it, is positive definite (floored at the dtype's epsilon).

The noisy natural gradient (NNG Sec. 3.5: "completely analogous to the block diagonal version"):

    posterior  q(w) = N(mu, (lambda / N) F^(gamma_in)^-1)     -- block-tridiagonal covariance
    mean step  mu <- mu + alpha F^(gamma)^-1 V,  V = grad log p(y|x,w) - gamma_in w (with noisy K-FAC's momentum)

gamma_in = lambda / (N eta), gamma = gamma_in + gamma_ex, as ``NoisyKFAC``. F^-1 V = Xi^T Lambda Xi V layer by
layer: Y_l = V_l - P^A_l V_{l+1} P^G_l^T, Z_l = U_A ((U_A^T Y_l U_G) * D_l) U_G^T with D_l = 1 / (1 - s t), X_l = Z_l -
P^A_{l-1}^T Z_{l-1} P^G_{l-1}. A draw is w = mu + sqrt(lambda / N) Xi^T T eps with T T^T = Lambda, per layer
w_l = mu_l + sqrt(lambda / N) (u_l - Psi_{l-1,l}^T u_{l-1}), u_l = T_l eps_l, whose covariance is (lambda / N) Xi^T
Lambda Xi; T_l = (C_A (x) C_G) (I - M_A (x) M_G)^-1/2 with C C^T = [A^g]^-1 (Cholesky) and M_A = C_A^T B C_A, i.e.
u_l = C_A [Q_A ((Q_A^T E_l Q_G) * D_l^1/2) Q_G^T] C_G^T: a function of the factors, not of the eigenvector basis
(which is not unique where eigenvalues coincide, as they do structurally: M_A has rank <= min(a_l, a_{l+1})).

Neither the authors' code (gd-zhang/noisy-K-FAC: block-diagonal fully connected and convolutional blocks only) nor
tf.contrib.kfac has a block-tridiagonal block; this follows the equations of M&G Sec. 4.3 above. Everything else
(factor EMAs and their initialisation at factor_init x I, the cross factors at 0, the intrinsic damping and pi of eq.
13, momentum, KL clipping, the learned Gamma noise q(tau)) is ``NoisyKFAC``'s. MLPs only (no convolutions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.core.linalg.low_rank import eigh
from bnnbench.methods.kfac.kronecker import Kronecker, ema_gram, kron_times
from bnnbench.methods.kfac.noisy import KFACState, NoisyKFAC, NoisyKFACConfig
from bnnbench.methods.state import Node, state_class


@dataclass(frozen=True)
class NoisyKFACBlkTriConfig(NoisyKFACConfig):
    name: str = "noisy_kfac_blktri"


@state_class
class ChainLink(Node):
    """What Lambda_l and Psi_{l,l+1} of F^(gamma)^-1 = Xi^T Lambda Xi are built from, every entry a function of the
    factors alone (no eigenvector basis, which is not unique: rounding would rotate it between a replica's batched and
    lone steps): ``CA``, ``CS`` with C C^T = X^-1 and C^T X C = I for X = A^g_l, G^g_l; for l < L, ``PA`` = A_{l,l+1}
    [A^g_{l+1}]^-1, ``PG`` alike, and the whitened cross factors ``KA = CA_l^T A_{l,l+1} CA_{l+1}``, ``KG`` alike
    (C^T B C = K K^T)."""
    CA: torch.Tensor
    CS: torch.Tensor
    PA: torch.Tensor | None = None
    PG: torch.Tensor | None = None
    KA: torch.Tensor | None = None
    KG: torch.Tensor | None = None


@state_class
class BlkTriState(KFACState):
    """Noisy K-FAC's state, the cross-layer factors ``cross[l]`` (``A`` = A_{l,l+1}, ``S`` = G_{l,l+1}, l < L) and
    the chain of F^(gamma_in)^-1 (``chain_cov``: the posterior's and, without another damping or refresh, the mean
    update's) and of F^(gamma)^-1 (``chain_inv``: the mean update's where it differs)."""
    cross: tuple[Kronecker, ...]
    chain_cov: tuple[ChainLink, ...] | None = None
    chain_inv: tuple[ChainLink, ...] | None = None


def _eigh(M: torch.Tensor):
    """``torch.linalg.eigh`` of symmetric ``M [R, n, n]`` (``low_rank.eigh``: eager between a compiled step's CUDA
    graphs); a replica whose M is not finite (a diverging one's) gets NaN eigenvalues and vectors instead of stopping
    the batch (LAPACK does not converge on NaN)."""
    ok = torch.isfinite(M).flatten(1).all(1)
    if bool(ok.all()):
        return eigh(M)
    e, Q = eigh(torch.where(ok[:, None, None], M, torch.zeros_like(M)))
    return e.masked_fill(~ok[:, None], float("nan")), Q.masked_fill(~ok[:, None, None], float("nan"))


def _psi_t_times(PA: torch.Tensor, U: torch.Tensor, PG: torch.Tensor) -> torch.Tensor:
    """``Psi^T u = P^A^T U P^G`` for ``U [R, S, a_{l-1}, g_{l-1}]`` (a layer's draws), ``P^A [R, a_{l-1}, a_l]``,
    ``P^G [R, g_{l-1}, g_l]``."""
    return kron_times(PA.transpose(-1, -2), U, PG.transpose(-1, -2))


class NoisyKFACBlkTri(NoisyKFAC):
    """Noisy K-FAC whose posterior covariance and preconditioner are the block-tridiagonal inverse of M&G Sec. 4.3
    (``BlkTriState``); the eigen-decompositions are made where used (``_chain``)."""

    name = "noisy_kfac_blktri"
    Config = NoisyKFACBlkTriConfig
    State = BlkTriState
    conv = False

    def _init_extra_factors(self, mean) -> dict:
        R, sl = mean.shape[0], self.model.slices
        def zeros(a: int, b: int):
            return torch.zeros(R, a, b, dtype=mean.dtype, device=mean.device)
        return {"cross": tuple(Kronecker(A=zeros(sl[l][2] + 1, sl[l + 1][2] + 1), S=zeros(sl[l][3], sl[l + 1][3]))
                               for l in range(len(sl) - 1))}

    def _update_extra_factors(self, state, rows, beta, n_samples, n_ex) -> dict:
        """A_{l,l+1} <- (1 - b) A_{l,l+1} + b E[a_l a_{l+1}^T], G_{l,l+1} likewise, over the rows of A_l's and G_l's
        updates (one per weight sample and example); where a layer's inputs are shared by the samples (the first
        layer's, ``_homogeneous_rows``), the other layer's are summed over the samples first."""
        cross = []
        for l in range(len(rows) - 1):
            (a, a_shared, d), (a_next, next_shared, d_next) = rows[l], rows[l + 1]
            if a_shared != next_shared:
                if a_shared:
                    a_next = a_next.unflatten(1, (n_samples, n_ex)).sum(1)
                else:
                    a = a.unflatten(1, (n_samples, n_ex)).sum(1)
            n_rows = n_ex if a_shared and next_shared else n_samples * n_ex
            old = state.cross[l]
            cross.append(Kronecker(
                A=ema_gram(old.A, a, a_next, beta, n_rows), S=ema_gram(old.S, d, d_next, beta, n_samples * n_ex)))
        return {"cross": tuple(cross)}

    def _factorise(self, state, gamma: torch.Tensor) -> tuple[ChainLink, ...]:
        """The ``ChainLink`` of every layer for F^(gamma)^-1 = Xi^T Lambda Xi."""
        L = len(self.model.slices)
        roots = [layer.roots(gamma) for layer in state.layers]
        links = []
        for l, (cA, cS) in enumerate(roots):
            if l == L - 1:
                links.append(ChainLink(CA=cA, CS=cS))
                continue
            nA, nS = roots[l + 1]
            Ax, Sx = state.cross[l].A, state.cross[l].S
            links.append(ChainLink(CA=cA, CS=cS, PA=Ax @ nA @ nA.transpose(-1, -2), PG=Sx @ nS @ nS.transpose(-1, -2),
                                   KA=cA.transpose(-1, -2) @ Ax @ nA, KG=cS.transpose(-1, -2) @ Sx @ nS))
        return tuple(links)

    def _chain(self, links: tuple[ChainLink, ...]):
        """Per layer ``(UA, QA, UG, QG, D, PA, PG)`` (PA, PG None for the last layer) of the chain ``links``: Q diag(s)
        Q^T = K K^T, U = C Q, D = 1 / (1 - s t) (floored at the dtype's epsilon), so that Lambda_l = (UA (x) UG)
        diag(D) (UA (x) UG)^T. Recomputed from the basis-free links where used; the last call's result is kept while
        it is asked for the same links (a step's draws and its mean update share it)."""
        cached = getattr(self, "_chain_cache", None)
        if cached is not None and cached[0] is links:
            return cached[1]
        out = []
        for link in links:
            cA, cS = link.CA, link.CS
            if link.KA is None:
                eye = torch.ones(cA.shape[0], cA.shape[-1], cS.shape[-1], dtype=cA.dtype, device=cA.device)
                out.append((cA, None, cS, None, eye, None, None))
                continue
            s, QA = _eigh(link.KA @ link.KA.transpose(-1, -2))
            t, QG = _eigh(link.KG @ link.KG.transpose(-1, -2))
            one_minus = 1 - s.unsqueeze(-1) * t.unsqueeze(-2)
            D = 1 / one_minus.clamp_min(torch.finfo(one_minus.dtype).eps)
            out.append((cA @ QA, QA, cS @ QG, QG, D, link.PA, link.PG))
        self._chain_cache = (links, out)
        return out

    def _refresh(self, state, covariance: bool, inverses: bool):
        g_in, g = self._gammas(state)
        if covariance:
            state = state.replace(chain_cov=self._factorise(state, g_in))
        if inverses and not self._inverses_from_covariance:
            state = state.replace(chain_inv=self._factorise(state, g))
        return state

    def _precondition_all(self, state, Vs):
        """F^(gamma)^-1 V = Xi^T Lambda Xi V for the layers' ``Vs [R, d_in + 1, d_out]``."""
        chain = self._chain(state.chain_cov if self._inverses_from_covariance else state.chain_inv)
        L = len(Vs)
        Y = [V - chain[l][5] @ Vs[l + 1] @ chain[l][6].transpose(-1, -2) if l < L - 1 else V for l, V in enumerate(Vs)]
        Z = [UA @ ((UA.transpose(-1, -2) @ y @ UG) * D) @ UG.transpose(-1, -2)
             for y, (UA, _, UG, _, D, _, _) in zip(Y, chain)]
        return [z - chain[l - 1][5].transpose(-1, -2) @ Z[l - 1] @ chain[l - 1][6] if l > 0 else z
                for l, z in enumerate(Z)]

    def _weights(self, state, eps):
        """w_l = mu_l + sqrt(lambda / N) (u_l - Psi_{l-1,l}^T u_{l-1}): covariance (lambda / N) Xi^T Lambda Xi. The
        square root of Lambda_l that draws u_l is the basis-free (C_A (x) C_G) (I - M_A (x) M_G)^-1/2, M = K K^T
        (a function of the factors: u_l = C_A [Q_A ((Q_A^T E Q_G) * D^1/2) Q_G^T] C_G^T), so that a replica's draws
        from the same eps do not depend on the eigenvector basis rounding picks. With eps = identity columns, tests
        read the covariance off this map."""
        scale = torch.sqrt(self.lam(state.kl_weight) / state.n_data.to(state.mean.dtype))[:, None, None, None]
        links = state.chain_cov
        hom, u_prev = [], None
        for l, (_, QA, _, QG, D, _, _) in enumerate(self._chain(links)):
            E = eps[l] if QA is None else kron_times(QA, kron_times(QA.transpose(-1, -2), eps[l], QG.transpose(
                -1, -2)) * D.sqrt().unsqueeze(1), QG)
            u = kron_times(links[l].CA, E, links[l].CS)
            w = u if l == 0 else u - _psi_t_times(links[l - 1].PA, u_prev, links[l - 1].PG)
            u_prev = u
            hom.append(self._hom(state.mean, l).unsqueeze(1) + scale * w)
        return hom

    def kl(self, state):
        """lambda KL(N(mu, Sigma) || N(0, eta I)), Sigma = c Xi^T Lambda Xi, c = lambda / N, k parameters:
        0.5 [tr(Sigma) / eta + ||mu||^2 / eta - k + k log eta - log|Sigma|], with |Xi| = 1,
        log|Sigma| = k log c + sum_l [2 g_l log|U_A| + 2 a_l log|U_G| + sum log D_l] and
        tr(Sigma) = c sum_l [tr Lambda_l + tr(Psi_{l-1,l}^T Lambda_{l-1} Psi_{l-1,l})], each
        sum_ij D_ij |row i of U_A^T X|^2 |row j of U_G^T Y|^2 (X, Y = I, or P^A, P^G)."""
        mean = state.mean
        eta = 1.0 / state.prior_prec[:, 0]
        c = self.lam(state.kl_weight) / state.n_data.to(mean.dtype)
        k = mean.shape[-1]
        logdet, trace = k * torch.log(c), 0
        for l, ((_, _, d_in, d_out), (UA, _, UG, _, D, PA, PG)) in enumerate(zip(self.model.slices,
                                                                                 self._chain(state.chain_cov))):
            logdet = logdet + (2 * d_out * torch.linalg.slogdet(UA)[1] + 2 * (d_in + 1) * torch.linalg.slogdet(UG)[1]
                               + torch.log(D).sum((-2, -1)))
            trace = trace + ((UA * UA).sum(-2).unsqueeze(-1) * D * (UG * UG).sum(-2).unsqueeze(-2)).sum((-2, -1))
            if PA is not None:
                XA, XG = UA.transpose(-1, -2) @ PA, UG.transpose(-1, -2) @ PG
                trace = trace + ((XA * XA).sum(-1).unsqueeze(-1) * D * (XG * XG).sum(-1).unsqueeze(-2)).sum((-2, -1))
        total = 0.5 * (c * trace / eta + (mean * mean).sum(-1) / eta - k + k * torch.log(eta) - logdet)
        return self.lam(state.kl_weight) * total
