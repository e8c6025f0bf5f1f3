"""Inference methods, all behind the interface of ``bnnbench.methods.base``.

Add a method by writing one module with a ``Method`` subclass (a mean-field Gaussian posterior: a ``MeanField``
subclass, ``methods/mean_field.py``) and its typed ``Config`` (a ``MethodConfig`` dataclass: every setting with its
default), and registering it here. Per-replica hyper-parameters other than the prior and noise precisions are
declared in ``replica_hparams``.
"""

from __future__ import annotations

from bnnbench.methods.base import Batch, Method, Predictive, Problem, slice_state
from bnnbench.methods.bbb import BBB
from bnnbench.methods.exact_gaussian import ExactFullGaussian, ExactMeanField
from bnnbench.methods.full_gaussian import FullGaussian
from bnnbench.methods.hmc import HMC
from bnnbench.methods.inducing import (FactorisedGlobalInducing, Factorised, GlobalInducing, LocalInducing,
                                       RandomGlobalInducing)
from bnnbench.methods.map import MAP
from bnnbench.methods.mc_dropout import MCDropout
from bnnbench.methods.vadam import Vadam, Vprop
from bnnbench.methods.vadam_matlab import VadamMatlab
from bnnbench.methods.noisy import NoisyAdam, NoisyKFAC
from bnnbench.methods.pbp import PBP
from bnnbench.methods.slang import SLANG
from bnnbench.methods.vogn import VOGN

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (MAP, BBB, MCDropout, VOGN, Vadam, Vprop, SLANG, NoisyAdam,
                                                                NoisyKFAC, FullGaussian, VadamMatlab, ExactFullGaussian,
                                                                ExactMeanField, Factorised, LocalInducing,
                                                                GlobalInducing, FactorisedGlobalInducing,
                                                                RandomGlobalInducing, HMC, PBP)}


class UnknownMethodError(KeyError):
    def __str__(self):
        return self.args[0]


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


__all__ = ["Batch", "Method", "Predictive", "Problem", "slice_state", "METHODS", "method_class",
           "UnknownMethodError"]
