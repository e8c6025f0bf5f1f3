"""Mean-field Gaussian posteriors q(theta) = N(mu, diag(sigma^2)), one per replica: what BBB, VOGN, Vadam, Vprop, the
MATLAB Vadam and noisy Adam share.

Each keeps the mean in ``state.mean`` (a ``MeanFieldState``) and its own parameterisation of sigma (``std``):
softplus(rho) (BBB), 1 / sqrt(prec) (``DiagonalPrecision``: VOGN, Vadam, Vprop), sqrt(lambda / (N (f + gamma_in)))
(noisy Adam). A step's draws and a prediction's samples are theta_s = mu + sigma * eps_s, eps_s ~ N(0, I), formed
layer by layer (``MLP.sampled_layers``).
"""

from __future__ import annotations

import torch

from bnnbench.core.linalg import mlp_relu
from bnnbench.methods.base import Method, standard_normal
from bnnbench.methods.state import State, state_class
from bnnbench.core.metrics import kl_diag_gaussians


@state_class
class MeanFieldState(State):
    """The mean mu ``[R, P]`` of q(theta) = N(mu, diag(sigma^2)); a method's state class adds its sigma's
    parameterisation and its optimiser's tensors."""
    mean: torch.Tensor


class MeanField(Method):
    """q(theta) = N(mean, diag(std^2)); subclasses define ``init``, ``std`` and ``step``."""

    def std(self, state) -> torch.Tensor:
        """sigma ``[R, P]``."""
        raise NotImplementedError

    def var(self, state) -> torch.Tensor:
        """sigma^2 ``[R, P]``."""
        return self.std(state) ** 2

    def noise(self, state, batch, generator):
        """eps ``[R, S, P]`` of the step's ``train_samples`` weight samples."""
        return standard_normal(state.mean, self.cfg.train_samples, generator)

    def sample_layers(self, state, n_samples, generator):
        """Per-layer weights of ``n_samples`` draws theta_s = mu + sigma * eps_s."""
        eps = standard_normal(state.mean, n_samples, generator)
        return self.model.sampled_layers(state.mean, self.std(state), eps)

    def predict(self, state, x, n_samples, generator):
        return self._predictive(state, self.model.forward_layers(self.sample_layers(state, n_samples, generator), x))

    def compiled_predict(self):
        """``predict`` with a ReLU MLP's sampled networks in float32 on a CPU computed by the fused kernel
        (``core/linalg/mlp_relu``), from the same draws: the Bayesian optimisation's validation of 100 replicas x 100
        samples spent half a round of Vadam's selection on power in eager forward passes, once its steps were fused."""
        if (type(self).predict is not MeanField.predict or type(self).sample_layers is not MeanField.sample_layers
                or not mlp_relu.available()):   # a subclass that predicts otherwise keeps its own
            return self.predict

        def predict(state, x, n_samples, generator):
            if not mlp_relu.applies(self.model, x, state.mean.dtype):
                return self.predict(state, x, n_samples, generator)
            eps = standard_normal(state.mean, n_samples, generator)
            theta = state.mean.unsqueeze(1) + self.std(state).unsqueeze(1) * eps
            return self._predictive(state, mlp_relu.forward(x, theta, self.model.sizes))
        return predict

    def gaussian(self, state):
        return state.mean, torch.diag_embed(self.var(state))


class DiagonalPrecision(MeanField):
    """q(theta) = N(mu, diag(1 / prec)) with the precision ``prec`` ``[R, P]`` of the natural-gradient methods."""

    def prec(self, state) -> torch.Tensor:
        return state.prec

    def std(self, state):
        return self.prec(state).rsqrt()

    def var(self, state):
        return 1 / self.prec(state)

    def kl(self, state):
        """KL(N(mu, diag(1/prec)) || N(0, diag(1/lambda))) per replica."""
        mean = state.mean
        return kl_diag_gaussians(mean, self.var(state), torch.zeros_like(mean), 1.0 / state.prior_prec)
