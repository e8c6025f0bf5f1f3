"""Linear-algebra building blocks: per-example gradient statistics, low-rank operations."""
