"""bnnbench: reproduction and benchmark suite for variational Bayesian deep learning."""

__version__ = "0.1.0"
