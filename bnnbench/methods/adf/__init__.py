"""Assumed density filtering: probabilistic backpropagation (Hernandez-Lobato & Adams, 2015)."""
