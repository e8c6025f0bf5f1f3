"""A method's settings: its frozen ``Config`` dataclass, which holds their types and defaults and which the method
keeps as ``self.cfg`` (read by attribute, ``cfg.lr``; plain Python values, so a step at UCI scale reads dozens of
them in microseconds)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from bnnbench.core.errors import ConfigError


@dataclass(frozen=True)
class MethodConfig:
    """The settings of a method, with their defaults: each method's ``Config`` (a frozen subclass) is the one place its
    defaults are set; Hydra composes ``method=<name>`` from it and checks the types of command-line values. Numbers
    given from Python are converted to their field's type here (``lr=1`` is ``1.0``), so a method never casts."""
    name: str = "method"

    def __post_init__(self):
        for key, kind in _numeric_fields(type(self)).items():
            v = getattr(self, key)
            if v is None or isinstance(v, bool):
                continue
            if kind is float and isinstance(v, int):
                object.__setattr__(self, key, float(v))
            elif kind is int and isinstance(v, float) and v.is_integer():
                object.__setattr__(self, key, int(v))

    @classmethod
    def of(cls, cfg) -> "MethodConfig":
        """The typed settings of ``cfg`` (a mapping or a composed ``DictConfig``), its unset keys at their defaults;
        an unknown key is a ``ConfigError`` that lists the valid ones."""
        if isinstance(cfg, cls):
            return cfg
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        valid = {f.name for f in fields(cls)}
        if unknown := sorted(set(cfg) - valid):
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)} of method {cfg.get('name', cls.name)!r}; "
                              f"valid: {', '.join(sorted(valid))}")
        return cls(**cfg)


@lru_cache(maxsize=None)
def _numeric_fields(cls) -> dict[str, type]:
    """The fields of ``cls`` typed ``float`` or ``int`` (optional or not)."""
    out = {}
    for key, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is typing.Union \
            else [hint]
        if args in ([float], [int]):
            out[key] = args[0]
    return out
