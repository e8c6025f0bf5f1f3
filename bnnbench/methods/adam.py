"""The Adam step (Kingma & Ba 2015) on tensors with a leading replica axis."""

from __future__ import annotations


def adam(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):
    """One Adam step (Kingma & Ba 2015) with bias correction; ``t`` is the step count ``[R]`` after
    increment. Elementwise, so each replica's step is exactly its own Adam step."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    tt = t.to(param.dtype).reshape(-1, *([1] * (param.dim() - 1)))
    m_hat = m / (1 - b1 ** tt)
    v_hat = v / (1 - b2 ** tt)
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v
