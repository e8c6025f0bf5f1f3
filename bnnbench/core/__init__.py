"""The bottom layer: what every method and every step of a run stands on, and that knows nothing of them.

Likelihoods, metrics (one mean / standard-error helper), sampler diagnostics (``mcmc``), dense and low-rank linear
algebra (``linalg``), the networks (``models``), data augmentation and the data sets (``data``: loaders, mirror,
cache, checksums), atomic file writes (``files``). Imports nothing of the layers above (import-linter contract in
pyproject.toml)."""
