"""Models as pure functions of a flat parameter vector ``theta`` with leading replica/sample axes."""

from bnnbench.core.models.mlp import MLP

__all__ = ["MLP", "build_model"]


def build_model(cfg, input_dim: int, output_dim: int) -> MLP:
    """Build the model named by ``cfg.name`` (``mlp``) for the given input and output sizes."""
    if cfg.name != "mlp":
        raise ValueError(f"unknown model {cfg.name!r}; valid models: mlp")
    return MLP([input_dim, *cfg.hidden, output_dim], activation=cfg.get("activation", "relu"))
