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
(H / sigma^2 + delta I)^{-1/2} from laplace-torch's decomposed Kronecker factors, is kept in the state as a dense
matrix over the approximated parameters, so that a replica is sliced and evaluated like any other state: a prediction
draws delta = root z and pushes it through the network's Jacobian in one forward-mode pass (``torch.func.jvp``), the
GLM predictive by Monte Carlo as every other method's predictive. The dense root bounds the approximated parameters
(``MAX_DENSE``): a large network takes ``laplace_ll``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.methods.base import Problem, hyper_state
from bnnbench.methods.point.map import MAP, MAPConfig, MAPState
from bnnbench.methods.state import state_class

MAX_DENSE = 4000   # approximated parameters whose dense covariance root a replica keeps (128 MB in float64)


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
class LaplaceState(MAPState):
    """MAP's state, the covariance root ``root [R, Q, Q]`` over the Q approximated parameters (zero until
    ``posthoc``: the predictive is then MAP's) and the prior precision delta ``[R]`` laplace-torch settled on."""
    root: torch.Tensor
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
        if len(self.index) > MAX_DENSE:
            raise ValueError(f"{self.name}: {len(self.index)} approximated parameters exceed the dense covariance "
                             f"root's bound of {MAX_DENSE}; take laplace_ll (the last layer)")

    def init(self, problem: Problem, generator: torch.Generator) -> LaplaceState:
        theta = self.init_params(problem, generator)
        R, Q = theta.shape[0], len(self.index)
        z = torch.zeros_like(theta)
        return self.State(**hyper_state(problem), theta=theta, m=z, v=z.clone(),
                          t=torch.zeros(R, dtype=torch.long, device=theta.device), root=theta.new_zeros(R, Q, Q),
                          delta=problem.prior_prec.mean(1))

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
        """laplace-torch's posterior for one replica (float64): the ``Laplace`` object, fitted and tuned."""
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
        perm = self.torch_order().to(state.theta.device)
        inv = torch.argsort(perm)
        roots, deltas = [], []
        for r in range(state.theta.shape[0]):
            if not bool(torch.isfinite(state.theta[r]).all()):   # a diverged replica stays diverged (NaN), unfitted
                roots.append(torch.full_like(state.root[r], float("nan"), dtype=torch.float64))
                deltas.append(torch.tensor(float("nan"), dtype=torch.float64))
                continue
            u = int(data.data_index[r])
            n = int(data.n_train[u])
            la = self.fit_replica(state.theta[r], data.x_train[u, :n], data.y_train[u, :n], state.noise_prec[r]
                                  if state.noise_prec is not None else None, state.prior_prec[r].mean())
            root = covariance_root(la.posterior_precision)                  # laplace-torch's parameter order
            roots.append(root[inv][:, inv])
            deltas.append(la.prior_precision.reshape(-1)[0])
        return state.replace(root=torch.stack(roots).to(state.theta.dtype),
                             delta=torch.stack(deltas).to(state.delta.dtype))

    def sample_offsets(self, state, n_samples: int, generator: torch.Generator) -> torch.Tensor:
        """theta_s - theta_MAP ``[R, S, P]``: root z over the approximated parameters, zero elsewhere."""
        R, P = state.theta.shape
        Q = state.root.shape[1]
        z = torch.randn(R, n_samples, Q, generator=generator, device=state.theta.device, dtype=state.theta.dtype)
        out = state.theta.new_zeros(R, n_samples, P)
        return out.index_copy(-1, self.index.to(out.device), z @ state.root)

    def predict(self, state, x, n_samples, generator):
        theta = state.theta[:, None].expand(-1, n_samples, -1).contiguous()
        f, jd = torch.func.jvp(lambda th: self.model.forward(th, x), (theta,),
                               (self.sample_offsets(state, n_samples, generator),))
        return self._predictive(state, f + jd)

    def diagnostics(self, state, data) -> dict:
        return {"prior_precision": state.delta.tolist(),
                "summary": f"prior precision (marginal likelihood) {state.delta.min():.3g} .. {state.delta.max():.3g}"}


class LastLayerLaplace(Laplace):
    name = "laplace_ll"
    Config = LastLayerLaplaceConfig


def covariance_root(prec) -> torch.Tensor:
    """The symmetric P^{-1/2} ``[Q, Q]`` of laplace-torch's posterior precision: decomposed Kronecker factors
    (``KronDecomposed.bmm`` of the identity: its blocks' (Q_1 (x) Q_2) (L_1 (x) L_2 + delta)^{-1/2} (Q_1 (x) Q_2)^T),
    a dense matrix or a diagonal."""
    if isinstance(prec, torch.Tensor):
        if prec.dim() == 1:
            return torch.diag(prec.rsqrt())
        evals, evecs = torch.linalg.eigh(prec)
        return (evecs * evals.rsqrt()) @ evecs.T
    eye = torch.eye(_kron_dim(prec), dtype=torch.float64, device=prec.eigenvalues[0][0].device)
    root = prec.bmm(eye, exponent=-0.5)
    return 0.5 * (root + root.T)


def _kron_dim(prec) -> int:
    """The number of parameters a ``KronDecomposed`` spans: per block, the product of its factors' sizes."""
    n = 0
    for evals in prec.eigenvalues:
        k = 1
        for e in evals:
            k *= e.numel()
        n += k
    return n
