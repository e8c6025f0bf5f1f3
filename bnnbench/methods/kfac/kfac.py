"""K-FAC (Martens & Grosse, 2015; Grosse & Martens, 2016 for convolutions), the deterministic column of noisy natural
gradient's CIFAR-10 table (Zhang et al., 2018, Table 2): noisy K-FAC's mean update at the mean weights,

    M <- M + alpha [A^g]^-1 V [S^g]^-1,  V = grad log p - (lambda / N) M,  gamma = lambda / N + damping_ex,

weight decay of the prior's magnitude (the paper's control "K-FAC with weight decay of noisy K-FAC's intrinsic decay"
at kl_weight 1); the factors from targets sampled at the mean (the true Fisher). A point estimate: predictions use
the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from bnnbench.methods.kfac.noisy import KroneckerFactored, NoisyKFACConfig


@dataclass(frozen=True)
class KFACConfig(NoisyKFACConfig):
    name: str = "kfac"
    damping_ex: float = 1e-3            # the preconditioner's damping (the CIFAR-10 code's K-FAC: 1e-3)
    train_samples: int = 1              # the mean: no weight draws
    learn_noise: bool = False


class KFAC(KroneckerFactored):
    """The K-FAC family's step at the mean weights; each layer's ``Kronecker`` keeps its damped inverses."""

    name = "kfac"
    Config = KFACConfig

    @classmethod
    def check_settings(cls, cfg) -> None:
        super().check_settings(cfg)
        if cfg.train_samples != 1:
            raise ValueError("kfac steps at the mean weights: train_samples must be 1")

    def _refresh(self, state, covariance: bool, inverses: bool):
        if not inverses:
            return state
        _, g = self._gammas(state)
        return state.replace(layers=tuple(layer.with_inverse(g) for layer in state.layers))

    def noise(self, state, batch, generator):
        return None, self._target_noise(state, batch, generator, n_samples=1)

    def _weights(self, state, eps):
        return [self._hom(state.mean, l).unsqueeze(1) for l in range(len(self.model.slices))]

    def sample_layers(self, state, n_samples, generator):
        return self._layers_from_hom(self._weights(state, None))
