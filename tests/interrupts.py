"""Ctrl-C at a chosen point of a run, for the tests of checkpoints and resumption."""

import bnnbench.run.engine as engine


def ctrl_c_at_evaluation(monkeypatch, n: int):
    """Make the ``n``-th call of ``engine.evaluate`` raise ``KeyboardInterrupt`` (with ``protocol.eval_every=1``,
    ``n = 3`` is epoch 3, after an epoch-2 checkpoint); returns a function that restores ``evaluate``."""
    real, calls = engine.evaluate, {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(engine, "evaluate", interrupted)
    return lambda: monkeypatch.setattr(engine, "evaluate", real)
