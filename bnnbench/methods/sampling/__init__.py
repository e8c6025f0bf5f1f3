"""Sampling: Hamiltonian Monte Carlo over the network's weights and the noise precision, the reference posterior of
the noisy natural gradient paper's Table 4."""
