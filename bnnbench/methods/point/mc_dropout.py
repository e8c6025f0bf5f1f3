"""MC dropout (Gal & Ghahramani, 2016), as in ``yaringal/DropoutUncertaintyExps`` ``net.py``.

Inverted dropout with rate p on the input of every layer, trained with Adam on the mean squared
error of the normalised targets plus the weight decay of the dropout-as-VI derivation,

    L(theta) = (1/M) sum_i (y_i - f(x_i; theta, z))^2 + reg * sum_layers ||W||^2,
    reg = l^2 (1 - p) / (2 N tau),

(l = prior length-scale 1e-2, tau the model precision in original target units; biases are not
decayed). Prediction keeps dropout on: T stochastic passes, Gaussian noise precision tau.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch

from bnnbench.methods.base import Problem
from bnnbench.methods.point.map import MAP, MAPConfig, MAPState
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class MCDropoutConfig(MAPConfig):
    name: str = "mc_dropout"
    length_scale: float = 0.01          # l of the weight decay l^2 (1 - p) / (2 N tau) (Gal & Ghahramani, 2016)

@state_class
class MCDropoutState(MAPState):
    """MAP's state and each replica's dropout rate p ``[R]`` (a ``replica_hparams`` entry)."""
    dropout: torch.Tensor


class MCDropout(MAP):
    """MAP's Adam on theta with dropout masks as the noise of a step and Gal's objective."""
    name = "mc_dropout"
    Config = MCDropoutConfig
    State = MCDropoutState
    replica_hparams = MappingProxyType({"dropout": (0.0, 0.5)})   # the dropout rate p
    conv = False  # dropout masks of an MLP's layer inputs

    def init(self, problem: Problem, generator: torch.Generator) -> MCDropoutState:
        if "dropout" not in problem.hparams or self.likelihood != "gaussian":
            raise ValueError("mc_dropout needs a Gaussian likelihood and a dropout rate per replica")
        return super().init(problem, generator)

    def noise(self, state, batch, generator):
        """The uniform draws of the step's dropout masks (``MLP.dropout_uniforms``; the masks are made in the step)."""
        return self.model.dropout_uniforms(state.dropout.shape[0], 1, batch.x.shape[1], generator, batch.x.device,
                                           batch.x.dtype)

    def weight_decay(self, state) -> torch.Tensor:
        """reg = l^2 (1 - p) / (2 N tau) per replica, tau in original target units."""
        tau_orig = state.noise_prec / state.y_scale ** 2
        l2 = self.cfg.length_scale ** 2
        return l2 * (1 - state.dropout) / (2 * state.n_data.to(tau_orig.dtype) * tau_orig)

    def objective(self, state, theta, batch, noise):
        f = self.model.forward(theta.unsqueeze(1), batch.x, dropout_masks=self.model.masks_of(noise, state.dropout))
        mse = ((batch.y - f[:, 0, :, 0]) ** 2).mean(-1)
        # biases are not decayed: the weights' positions as an index built from the layout, not a boolean mask, so that
        # the step has no data-dependent shape (torch.compile traces it whole); the same entries in the same order
        weights = torch.cat([torch.arange(w.start, w.stop, device=theta.device) for w, _, _, _ in self.model.slices])
        return mse + self.weight_decay(state) * (theta * theta).index_select(-1, weights).sum(-1), {}

    def predict(self, state, x, n_samples, generator):
        theta = state.theta.unsqueeze(1).expand(-1, n_samples, -1)
        masks = self.model.dropout_masks(state.dropout, n_samples, x.shape[1], generator, x.dtype)
        return self._predictive(state, self.model.forward(theta, x, dropout_masks=masks))
