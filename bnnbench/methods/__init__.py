"""Inference methods, all behind the interface of ``bnnbench.methods.base``.

Add a method by writing one module with a ``Method`` subclass (a mean-field Gaussian posterior: a ``MeanField``
subclass, ``methods/gaussian/mean_field.py``) and its typed ``Config`` (a ``MethodConfig`` dataclass: every setting with
its default), and registering it here. The modules sit in folders by family: ``point`` (MAP, SGD, MC dropout, deep
ensembles), ``gaussian`` (BBB, VOGN, Vadam, SLANG, full Gaussian, SWAG, Laplace), ``kfac`` (noisy Adam, noisy K-FAC,
BlkTri), ``sampling`` (HMC), ``adf`` (PBP), ``exact`` (exact Gaussian VI), ``inducing`` (global inducing points);
``base``, ``settings``, ``adam`` and ``gamma_noise`` are what they share. Per-replica hyper-parameters other than the
prior and noise precisions are declared in ``replica_hparams``.

A method of another package registers itself with an entry point in the group ``bnnbench.methods`` (its name: the
method's ``name``; its object: the ``Method`` subclass), e.g. in that package's pyproject.toml::

    [project.entry-points."bnnbench.methods"]
    my_method = "my_package.my_module:MyMethod"

and is then ``method=my_method`` like the built-in ones; ``bnnbench check-method my_method`` runs the suite's
contract checks on it (``bnnbench.run.contract``).
"""

from __future__ import annotations

from bnnbench.methods.adf.pbp import PBP
from bnnbench.methods.base import Batch, Method, Predictive, Problem
from bnnbench.methods.state import State, state_class
from bnnbench.methods.exact.exact_gaussian import ExactFullGaussian, ExactMeanField
from bnnbench.methods.gaussian.bbb import BBB
from bnnbench.methods.gaussian.full_gaussian import FullGaussian
from bnnbench.methods.gaussian.laplace import LastLayerLaplace, Laplace
from bnnbench.methods.gaussian.slang import SLANG
from bnnbench.methods.gaussian.swag import SWAG
from bnnbench.methods.gaussian.vadam import Vadam, Vprop
from bnnbench.methods.gaussian.vadam_matlab import VadamMatlab
from bnnbench.methods.gaussian.vogn import VOGN
from bnnbench.methods.inducing.method import (Factorised, FactorisedGlobalInducing, GlobalInducing, LocalInducing,
                                              RandomGlobalInducing)
from bnnbench.methods.kfac.kfac import KFAC
from bnnbench.methods.kfac.noisy import NoisyAdam, NoisyKFAC
from bnnbench.methods.kfac.noisy_blktri import NoisyKFACBlkTri
from bnnbench.methods.point.ensemble import DeepEnsemble
from bnnbench.methods.point.map import MAP
from bnnbench.methods.point.mc_dropout import MCDropout
from bnnbench.methods.point.sgd import SGD
from bnnbench.methods.sampling.hmc import HMC

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (MAP, BBB, MCDropout, VOGN, Vadam, Vprop, SLANG, NoisyAdam,
                                                                NoisyKFAC, FullGaussian, VadamMatlab, ExactFullGaussian,
                                                                ExactMeanField, Factorised, LocalInducing,
                                                                GlobalInducing, FactorisedGlobalInducing,
                                                                RandomGlobalInducing, HMC, PBP, SGD, KFAC,
                                                                NoisyKFACBlkTri, DeepEnsemble, SWAG, Laplace,
                                                                LastLayerLaplace)}


ENTRY_POINT_GROUP = "bnnbench.methods"
BUILT_IN = frozenset(METHODS)


class PluginError(RuntimeError):
    """A method entry point that cannot be used, with the reason and the package that declares it."""


def plugin_methods() -> dict[str, type[Method]]:
    """The ``Method`` subclasses other installed packages declare in the entry-point group ``bnnbench.methods``."""
    from importlib.metadata import entry_points
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r}" + (f" of {ep.dist.name}" if ep.dist else "")
        try:
            cls = ep.load()
        except Exception as e:   # the user's package: any import error, said with where it comes from
            raise PluginError(f"{where}: cannot be imported: {type(e).__name__}: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, Method)):
            raise PluginError(f"{where}: is not a subclass of bnnbench.methods.Method")
        if getattr(cls, "name", None) != ep.name:
            raise PluginError(f"{where}: the class's name attribute is {getattr(cls, 'name', None)!r}, "
                              f"it must equal the entry point's name {ep.name!r}")
        if ep.name in BUILT_IN:
            raise PluginError(f"{where}: {ep.name!r} is a built-in method; choose another name")
        from dataclasses import is_dataclass
        if not is_dataclass(getattr(cls, "Config", None)) or getattr(cls.Config, "name", None) != ep.name:
            raise PluginError(f"{where}: needs a dataclass Config (a MethodConfig subclass) whose name default is "
                              f"{ep.name!r}")
        found[ep.name] = cls
    return found


METHODS.update(plugin_methods())


class UnknownMethodError(KeyError):
    def __str__(self):
        return self.args[0]


def method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


__all__ = ["Batch", "Method", "Predictive", "Problem", "State", "state_class", "METHODS", "method_class",
           "UnknownMethodError", "PluginError", "plugin_methods", "ENTRY_POINT_GROUP"]
