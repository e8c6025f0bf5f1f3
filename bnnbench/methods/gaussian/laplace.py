"""Laplace approximations at the MAP estimate, fitted by ``laplace-torch`` (Daxberger, Kristiadi, Immer, Eschenhagen,
Bauer & Hennig, 2021, "Laplace Redux"):

    q(theta) = N(theta_MAP, (H / sigma^2 + delta I)^{-1})   over all weights (``laplace``) or the last layer's
                                                             (``laplace_ll``; the others fixed at theta_MAP),

H the generalised Gauss-Newton matrix of the training set in Kronecker-factored form (K-FAC: Martens & Grosse 2015;
Ritter, Botev & Barber 2018; ``hessian_structure``), sigma the likelihood's noise scale, delta the prior precision
that maximises the Laplace approximation of the marginal likelihood (``optimize_prior_precision(method="marglik")``,
one scalar), and the GLM (linearised) predictive f(x; theta) = f(x; theta_MAP) + J(x) (theta - theta_MAP).

Training is MAP's Adam (``point/map.py``) under the protocol's prior. After the last epoch (``posthoc``) each
replica's network goes to laplace-torch as a ``torch.nn.Sequential``, which fits the curvature on the replica's
whole training set and tunes delta, as its authors intend. The symmetric square root of the covariance,
(H / sigma^2 + delta I)^{-1/2}, is kept in the state as laplace-torch's decomposition of it, block by block
(``RootBlock``: per layer's weights, (U_1 (x) U_2) diag(s) (U_1 (x) U_2)^T with U_1, U_2 the eigenvectors of the
Kronecker factors and s = (l_1 l_2^T + delta)^{-1/2}; per bias, one factor), so that a replica is sliced and evaluated
like any other state and its memory is that of the factors: a prediction draws delta = root z and pushes it through
the network's Jacobian in one forward-mode pass (``torch.func.jvp``), the GLM predictive by Monte Carlo as every other
method's predictive. ``hessian_structure`` full or diag is one block of the approximated parameters' eigenvectors
(dense: at most ``MAX_DENSE`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.core import prng
from bnnbench.methods.point.map import MAP, MAPConfig, MAPState
from bnnbench.methods.state import Node, state_class

MAX_DENSE = 4000   # approximated parameters of a full or diag Laplace, whose eigenvectors a replica keeps densely


@dataclass(frozen=True)
class LaplaceConfig(MAPConfig):
    name: str = "laplace"
    subset_of_weights: str = "all"       # all | last_layer
    hessian_structure: str = "kron"      # kron | full | diag (laplace-torch's)
    prior_tuning: str = "marglik"        # marglik (delta maximising the marginal likelihood) | none (the protocol's)


@dataclass(frozen=True)
class LastLayerLaplaceConfig(LaplaceConfig):
    name: str = "laplace_ll"
    subset_of_weights: str = "last_layer"


@state_class
class RootBlock(Node):
    """One block of the covariance root, over d_1 d_2 parameters in laplace-torch's order (row-major [d_1, d_2]):
    root = (U_1 (x) U_2) diag(vec s) (U_1 (x) U_2)^T, i.e. Z -> U_1 ((U_1^T Z U_2) * s) U_2^T on a [d_1, d_2] draw. A
    layer's weights: U_1, U_2 the eigenvectors of its output and input factors; a bias (or a full or diagonal
    precision): d_2 = 1, U_2 = [[1]]."""
    U1: torch.Tensor   # [R, d_1, d_1]
    U2: torch.Tensor   # [R, d_2, d_2]
    s: torch.Tensor    # [R, d_1, d_2]


@state_class
class LaplaceState(MAPState):
    """MAP's state, the blocks of the covariance root over the approximated parameters (zero until ``posthoc``: the
    predictive is then MAP's) and the prior precision delta ``[R]`` laplace-torch settled on."""
    root: tuple[RootBlock, ...]
    delta: torch.Tensor


class Laplace(MAP):
    name = "laplace"
    Config = LaplaceConfig
    State = LaplaceState
    conv = False

    @classmethod
    def check_settings(cls, cfg):
        for key, valid in (("subset_of_weights", ("all", "last_layer")),
                           ("hessian_structure", ("kron", "full", "diag")), ("prior_tuning", ("marglik", "none"))):
            if getattr(cfg, key) not in valid:
                raise ValueError(f"{cfg.name}: {key}={getattr(cfg, key)!r}; valid: {', '.join(valid)}")

    def __init__(self, cfg, model, likelihood):
        super().__init__(cfg, model, likelihood)
        self.check_settings(self.cfg)
        if likelihood == "bernoulli":
            raise ValueError(f"{self.name}: laplace-torch's classification takes one logit per class (a categorical "
                             "likelihood); a single-logit Bernoulli likelihood is not supported")
        w, b, _, _ = model.slices[-1]
        self.index = (torch.arange(model.n_params) if self.cfg.subset_of_weights == "all"
                      else torch.arange(w.start, b.stop))
        if self.cfg.hessian_structure != "kron" and len(self.index) > MAX_DENSE:
            raise ValueError(f"{self.name}: {len(self.index)} approximated parameters exceed the bound of {MAX_DENSE} "
                             f"of a {self.cfg.hessian_structure} Laplace's dense eigenvectors; take "
                             "hessian_structure=kron or laplace_ll (the last layer)")

    def block_shapes(self) -> list[tuple[int, int]]:
        """(d_1, d_2) of each root block, in laplace-torch's parameter order: per approximated layer its weights
        (d_out, d_in) and its bias (d_out, 1) for K-FAC; one (Q, 1) block for a full or diagonal precision."""
        if self.cfg.hessian_structure != "kron":
            return [(len(self.index), 1)]
        layers = self.model.slices if self.cfg.subset_of_weights == "all" else self.model.slices[-1:]
        return [shape for _, _, d_in, d_out in layers for shape in ((d_out, d_in), (d_out, 1))]

    def extra_state(self, theta, problem):
        R = theta.shape[0]
        root = tuple(RootBlock(U1=theta.new_zeros(R, d1, d1), U2=theta.new_zeros(R, d2, d2),
                               s=theta.new_zeros(R, d1, d2)) for d1, d2 in self.block_shapes())
        return dict(root=root, delta=problem.prior_prec.mean(1))

    def module(self, theta: torch.Tensor) -> torch.nn.Sequential:
        """The network with parameters ``theta [P]`` as ``torch.nn.Sequential`` (``nn.Linear`` holds W^T)."""
        act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}.get(self.model.activation)
        if act is None:
            raise ValueError(f"{self.name}: activation {self.model.activation!r} has no torch.nn module here")
        layers = []
        for k, (W, b) in enumerate(self.model.layers(theta)):
            lin = torch.nn.Linear(*W.shape, dtype=theta.dtype, device=theta.device)
            with torch.no_grad():
                lin.weight.copy_(W.T)
                lin.bias.copy_(b)
            layers += [lin] + ([act()] if k < len(self.model.slices) - 1 else [])
        return torch.nn.Sequential(*layers)

    def torch_order(self) -> torch.Tensor:
        """``perm [Q]``: the approximated parameters in ``nn.Module.parameters()`` order, as positions in ``index``
        (our W [d_in, d_out] row-major is nn.Linear's weight transposed)."""
        order = []
        for w, b, d_in, d_out in self.model.slices:
            order.append((w.start + torch.arange(d_in * d_out).reshape(d_in, d_out).T).reshape(-1))
            order.append(torch.arange(b.start, b.stop))
        order = torch.cat(order)
        order = order[torch.isin(order, self.index)]
        return torch.searchsorted(self.index, order)

    def fit_replica(self, theta, x, y, noise_prec, prior_prec):
        """laplace-torch's posterior for one replica (float64): the ``Laplace`` object, fitted and tuned from the
        scalar prior precision ``prior_prec`` (``posthoc``: the mean of the replica's per-parameter ones, which the
        leaderboard's protocols set alike on every parameter)."""
        from laplace import Laplace as LaplaceTorch   # the leaderboard extra (README: make install)
        net = self.module(theta.double())
        regression = self.likelihood == "gaussian"
        la = LaplaceTorch(net, "regression" if regression else "classification",
                          subset_of_weights=self.cfg.subset_of_weights, hessian_structure=self.cfg.hessian_structure,
                          sigma_noise=float(noise_prec) ** -0.5 if regression else 1.0,
                          prior_precision=float(prior_prec))
        targets = y.double()[:, None] if regression else y.long()
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.double(), targets),
                                             batch_size=len(x))
        la.fit(loader, progress_bar=False)
        if self.cfg.prior_tuning == "marglik":
            la.optimize_prior_precision(method="marglik", pred_type="glm")
        return la

    def posthoc(self, state: LaplaceState, data) -> LaplaceState:
        """Each replica's Laplace posterior on its training rows of ``data`` (``engine.ReplicaData``)."""
        shapes = self.block_shapes()
        blocks, deltas = [], []
        for r in range(state.theta.shape[0]):
            if not bool(torch.isfinite(state.theta[r]).all()):   # a diverged replica stays diverged (NaN), unfitted
                nan = lambda n, m: torch.full((n, m), float("nan"), dtype=torch.float64)   # noqa: E731
                blocks.append([(nan(d1, d1), nan(d2, d2), nan(d1, d2)) for d1, d2 in shapes])
                deltas.append(torch.tensor(float("nan"), dtype=torch.float64))
                continue
            u = int(data.data_index[r])
            n = int(data.n_train[u])
            la = self.fit_replica(state.theta[r], data.x_train[u, :n], data.y_train[u, :n], state.noise_prec[r]
                                  if state.noise_prec is not None else None, state.prior_prec[r].mean())
            got = root_blocks(la.posterior_precision)
            if [tuple(s.shape) for _, _, s in got] != shapes:
                raise RuntimeError(f"{self.name}: laplace-torch's posterior has blocks "
                                   f"{[tuple(s.shape) for _, _, s in got]}, expected {shapes}")
            blocks.append([tuple(t.cpu() for t in b) for b in got])
            deltas.append(la.prior_precision.reshape(-1)[0].cpu())
        like = state.theta
        root = tuple(RootBlock(**{k: torch.stack([b[i][j] for b in blocks]).to(like.device, like.dtype)
                                  for j, k in enumerate(("U1", "U2", "s"))}) for i in range(len(shapes)))
        return state.replace(root=root, delta=torch.stack(deltas).to(state.delta.device, state.delta.dtype))

    def sample_offsets(self, state, n_samples: int, generator: torch.Generator) -> torch.Tensor:
        """theta_s - theta_MAP ``[R, S, P]``: root z over the approximated parameters (z drawn in the flat layout's
        order, the root applied block by block in laplace-torch's), zero elsewhere."""
        R, P = state.theta.shape
        index = self.index.to(state.theta.device)
        z = prng.randn(R, n_samples, len(index), generator=generator, device=state.theta.device,
                        dtype=state.theta.dtype)
        perm = self.torch_order().to(z.device)
        z, out, lo = z[..., perm], [], 0
        for b in state.root:
            d1, d2 = b.s.shape[1:]
            Z = z[..., lo:lo + d1 * d2].reshape(R, n_samples, d1, d2)
            U1, U2 = b.U1[:, None], b.U2[:, None]
            out.append((U1 @ ((U1.transpose(-1, -2) @ Z @ U2) * b.s[:, None]) @ U2.transpose(-1, -2))
                       .reshape(R, n_samples, d1 * d2))
            lo += d1 * d2
        delta = torch.empty_like(z).index_copy_(-1, perm, torch.cat(out, -1))   # back to the flat layout's order
        return state.theta.new_zeros(R, n_samples, P).index_copy(-1, index, delta)

    def dense_root(self, state) -> torch.Tensor:
        """The root ``[R, Q, Q]`` in the flat layout's order, formed densely from the blocks (tests, small networks):
        per block (U_1 (x) U_2) diag(vec s) (U_1 (x) U_2)^T, block-diagonal in laplace-torch's order, then permuted."""
        R, parts = state.theta.shape[0], []
        for b in state.root:
            d1, d2 = b.s.shape[1:]
            U = (b.U1[:, :, None, :, None] * b.U2[:, None, :, None, :]).reshape(R, d1 * d2, d1 * d2)
            parts.append((U * b.s.reshape(R, 1, -1)) @ U.transpose(-1, -2))
        theirs = torch.stack([torch.block_diag(*(p[r] for p in parts)) for r in range(R)])
        perm = self.torch_order().to(theirs.device)
        ours = torch.empty_like(theirs)
        ours[:, perm[:, None], perm[None, :]] = theirs
        return ours

    def predict(self, state, x, n_samples, generator):
        theta = state.theta[:, None].expand(-1, n_samples, -1).contiguous()
        f, jd = torch.func.jvp(lambda th: self.model.forward(th, x), (theta,),
                               (self.sample_offsets(state, n_samples, generator),))
        return self._predictive(state, f + jd)

    def diagnostics(self, state, data) -> dict:
        how = "marginal likelihood" if self.cfg.prior_tuning == "marglik" else "the protocol's"
        return {"prior_precision": state.delta.tolist(),
                "summary": f"prior precision ({how}) {state.delta.min():.3g} .. {state.delta.max():.3g}"}


class LastLayerLaplace(Laplace):
    name = "laplace_ll"
    Config = LastLayerLaplaceConfig


def root_blocks(prec) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(U_1, U_2, s)`` per block of the root P^{-1/2} of laplace-torch's posterior precision P: from a
    ``KronDecomposed`` (per block, the eigenvectors and eigenvalues of its one or two factors and its delta:
    s = (l_1 l_2^T + delta)^{-1/2}, or with laplace-torch's ``damping`` ((l_1 + sqrt delta)(l_2 + sqrt delta)^T)^{-1/2},
    as ``KronDecomposed.bmm(exponent=-0.5)``), a dense precision (its eigendecomposition) or a diagonal one."""
    if isinstance(prec, torch.Tensor):
        if prec.dim() == 1:
            return [(torch.eye(len(prec), dtype=prec.dtype, device=prec.device), torch.ones_like(prec[:1, None]),
                     prec.rsqrt()[:, None])]
        evals, evecs = torch.linalg.eigh(prec)
        return [(evecs, torch.ones_like(evals[:1, None]), evals.rsqrt()[:, None])]
    out = []
    for ls, Us, delta in zip(prec.eigenvalues, prec.eigenvectors, prec.deltas):
        if len(ls) == 1:
            out.append((Us[0], torch.ones_like(ls[0][:1, None]), (ls[0] + delta).rsqrt()[:, None]))
        elif prec.damping:
            out.append((Us[0], Us[1], torch.outer(ls[0] + delta.sqrt(), ls[1] + delta.sqrt()).rsqrt()))
        else:
            out.append((Us[0], Us[1], (torch.outer(ls[0], ls[1]) + delta).rsqrt()))
    return out
