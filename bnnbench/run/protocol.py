"""Resolve a composed Hydra config into the settings of one run (``RunSpec``).

A protocol file (``configs/protocol/*.yaml``) describes how a paper ran its experiments: global
settings, per-size settings (the papers use one setting for small and one for large UCI data sets),
per-dataset settings (learning rates, hyper-parameter search boxes) and per-method overrides.
Values are resolved from the least to the most specific, and a value given explicitly on the
command line always wins:

    method yaml < protocol.method < protocol.methods[m] < sizes[s].method < sizes[s].methods[m]
                < datasets[d].method < datasets[d].methods[m] < CLI ``method.k=v``

(``method`` applies to every method, ``methods[m]`` to method ``m`` only.)
    protocol.k  < sizes[s].k < datasets[d].k < CLI ``protocol.k=v``
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, ListConfig, OmegaConf

from bnnbench.run.config import CommandLine, ConfigError
from bnnbench.run.schema import ProtocolSettings

PROTOCOL_KEYS = ("epochs", "steps", "batch_size", "eval_samples", "eval_every")


@dataclass(kw_only=True)
class RunSpec(ProtocolSettings):
    """The settings of one run: the protocol's ``ProtocolSettings`` as resolved, and what ``resolve`` derives per
    method, size and data set."""
    method: DictConfig
    model_hidden: list[int]
    activation: str
    likelihood: str
    epochs: int
    batch_size: int
    eval_samples: int
    eval_every: int | None
    space: dict = field(default_factory=dict)   # hyper-parameter -> {"log_range": [lo, hi]} | {"values": [...]}
    fixed: dict = field(default_factory=dict)   # hyper-parameter values used without selection
    hpo: dict = field(default_factory=dict)
    steps: int | None = None          # gradient steps in place of ``epochs`` (``epochs_for``)
    conv: dict | None = None          # a convolutional network (model=vgg_*): {"arch", "fc", "batch_norm", "kernel"}

    def epochs_for(self, n_train_max: int) -> int:
        """The epochs of a run whose largest training set has ``n_train_max`` rows: ``epochs``, or with ``steps`` set
        the fewest epochs of ceil(n_train_max / batch_size) steps each that make at least ``steps`` steps."""
        if self.steps is None:
            return self.epochs
        return -(-self.steps // -(-int(n_train_max) // self.batch_size))

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["method"] = OmegaConf.to_container(self.method, resolve=True)
        return d


def _get(node, *path, default=None):
    for p in path:
        if node is None or p not in node:
            return default
        node = node[p]
    return node


def _typed_method(node, method: dict, protocol: str) -> dict:
    """``method`` checked against the method's typed config (``node``'s schema): a protocol's value of the wrong
    type is an error naming the protocol."""
    from omegaconf.errors import OmegaConfBaseException
    try:
        return OmegaConf.to_container(OmegaConf.merge(node, method), resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"protocol {protocol!r}, method.{e.full_key}: {str(e).splitlines()[0]}") from None


def _prior_scaling(value) -> str | None:
    if value not in (None, "fan_in"):
        raise ConfigError(f"protocol.prior_scaling must be fan_in or null, got {value!r}")
    return value


def _conv(model) -> dict | None:
    """The convolutional network of ``model=convnet``-style files (``name: convnet``); None for the MLP."""
    if model.get("name") != "convnet":
        return None
    arch = [a if a == "M" else int(a) for a in model.arch]
    if any(a != "M" and a <= 0 for a in arch):
        raise ConfigError(f"model.arch: conv widths must be positive integers or M, got {arch}")
    return {"arch": arch, "fc": [int(h) for h in (model.get("fc") or [])],
            "batch_norm": bool(model.get("batch_norm", False)), "kernel": int(model.get("kernel", 3))}


def _augment(value) -> dict | None:
    if not value:
        return None
    out = OmegaConf.to_container(value) if not isinstance(value, dict) else dict(value)
    unknown = set(out) - {"crop_pad", "flip"}
    if unknown:
        raise ConfigError(f"protocol.augment: unknown keys {sorted(unknown)}; valid: crop_pad, flip")
    return {"crop_pad": int(out.get("crop_pad", 0)), "flip": bool(out.get("flip", False))}


def _stages(stages) -> list | None:
    if not stages:
        return None
    out = [{"split": str(s["split"]), "epochs": int(s["epochs"])} for s in OmegaConf.to_container(stages)]
    if any(s["epochs"] <= 0 for s in out):
        raise ConfigError(f"protocol.stages: every stage needs epochs > 0, got {out}")
    return out


def _plain(value):
    """A protocol value as plain Python (mappings and lists out of OmegaConf)."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _positive_or_none(value) -> int | None:
    return int(value) if value else None


# how a ``ProtocolSettings`` key's value reaches the RunSpec (the others: as plain Python)
_SETTING = {"restarts": _positive_or_none, "eval_samples_final": _positive_or_none, "stages": _stages,
            "augment": _augment, "prior_scaling": _prior_scaling, "normalize_x": bool, "normalize_y": bool,
            "save_predictive": lambda v: True if v else None,
            "exact_gtol": lambda v: float(v) if v is not None else None,
            "subset": lambda v: _plain(v) or None, "split_scheme": lambda v: _plain(v) or None,
            "lr_drop": lambda v: _plain(v) or None, "active_learning": lambda v: _plain(v) or None}


def _method_settings(cfg: DictConfig, proto, size, ds, given: CommandLine) -> dict:
    """The method's settings: its config, then each protocol layer's ``method`` (settings the method has) and
    ``methods.<name>`` (which must all be the method's), the command line's kept over both; typed."""
    mname = cfg.method.name
    explicit = given.sets("method")
    method = OmegaConf.to_container(cfg.method, resolve=True)
    for node in (proto, size, ds):
        for layer, own in ((_get(node, "method"), False), (_get(node, "methods", mname), True)):
            for k, v in (OmegaConf.to_container(layer, resolve=True) if layer else {}).items():
                if k not in method:
                    if own:
                        raise ConfigError(f"protocol {proto.name!r} sets {k!r} for method {mname}, which has no such "
                                          f"setting; valid: {', '.join(method)}")
                elif k not in explicit and v is not None:
                    method[k] = v
    return _typed_method(cfg.method, method, proto.name)


def _protocol_values(proto, size, ds, given: CommandLine, mname: str) -> tuple[dict, int | None]:
    """``PROTOCOL_KEYS``' values (the protocol's, then its size's and data set's, the command line's kept), each
    either one value or one per method, ``{default: v, <method>: v}`` (App. G's ``steps``; a size's ``batch_size``),
    and the step budget of this method (``steps``), checked."""
    explicit = given.sets("protocol")
    vals = {}
    for k in PROTOCOL_KEYS:
        v = proto.get(k)
        if k not in explicit:
            for layer in (size, ds):
                if layer and layer.get(k) is not None:
                    v = layer.get(k)
        vals[k] = v.get(mname, v.get("default")) if isinstance(v, DictConfig) else v   # {default: v, <method>: v}
    steps = vals.pop("steps")
    if steps is not None:
        if int(steps) <= 0:
            raise ConfigError(f"protocol.steps must be a positive integer, got {steps!r}")
        vals["epochs"] = vals["epochs"] or 1
    for k in ("epochs", "batch_size", "eval_samples"):
        if vals[k] is None or int(vals[k]) <= 0:
            raise ConfigError(f"protocol.{k} must be a positive integer, got {vals[k]!r}")
    return vals, int(steps) if steps is not None else None


def _hidden(cfg: DictConfig, proto, ds, given: CommandLine, meta: dict | None) -> list[int]:
    """The hidden widths: the command line's, else the data set's, the protocol's or the model's (``meta:<key>``:
    the data set's own value, e.g. PBP's per-data-set width)."""
    hidden = cfg.model.get("hidden")
    if hidden is None or "hidden" not in given.sets("model"):
        hidden = next((h for h in (ds.get("hidden"), proto.get("hidden"), hidden) if h is not None), [50])
        if isinstance(hidden, str) and hidden.startswith("meta:"):
            hidden = [int(float(meta[hidden[5:]]))] if meta else [50]
    return [int(h) for h in hidden]


def _search_space(cfg: DictConfig, proto, ds, meta: dict | None) -> tuple[dict, dict]:
    """The data set's search space (``{name: {"log_range": [lo, hi]} | {"values": [...]}}``; ``meta:<key>``: the data
    set's own grid), with the method's own axes of the protocol's ``method_space`` in place of (null: without) the
    data set's, and the fixed values: the axis' own ``fixed`` (``{values: [...], fixed: v}``: what ``hpo=fixed``
    uses), else the box's centre in log space or the grid's median, then the data set's ``fixed``, then the command
    line's ``hparams.<name>``."""
    axes = dict(ds.get("space") or {})
    own = _get(proto, "method_space", cfg.method.name, default=None)
    for name, rng in (own.items() if own is not None else ()):
        if rng is None:
            axes.pop(name, None)
        else:
            axes[name] = rng
    space, fixed = {}, {}
    for name, rng in axes.items():
        rng = OmegaConf.to_container(rng, resolve=True) if not isinstance(rng, (list, str)) else rng
        if isinstance(rng, str) and rng.startswith("meta:"):
            space[name] = {"values": [float(v) for v in (meta or {})[rng[5:]]]}
        elif isinstance(rng, dict):
            space[name] = {k: v for k, v in rng.items() if k != "fixed"}
            if rng.get("fixed") is not None:
                fixed[name] = float(rng["fixed"])
        elif len(rng) != 2:
            raise ConfigError(f"protocol {proto.name!r}: space {name}: {list(rng)} is neither a box [lo, hi] (natural "
                              f"logarithms) nor a grid; a grid of values is {{values: {list(rng)}}}")
        else:
            space[name] = {"log_range": [float(rng[0]), float(rng[1])]}
    for name, s in space.items():
        if name in fixed:
            continue
        if "log_range" in s:
            fixed[name] = math.exp(sum(s["log_range"]) / 2)  # centre of the box in log space
        else:
            values = sorted(s["values"])
            fixed[name] = values[len(values) // 2]
    for name, v in (ds.get("fixed") or {}).items():
        fixed[name] = float(v)
    for name, v in (cfg.get("hparams") or {}).items():  # explicit hparams.noise_prec=... from the CLI
        if v is not None:
            fixed[name] = float(v)
    return space, fixed


def _hpo_settings(cfg: DictConfig, proto, ds, given: CommandLine) -> dict:
    """The search's settings (``schema.SEARCHES[kind]``, its defaults filled in): ``hpo=<kind>``'s, then the protocol's
    (``default_kind`` must be the one chosen) and the data set's GP length scales, the command line's kept. Keys of
    other kinds of search, from the protocol or the command line, are not this one's: a ``reproduce`` gives its
    overrides to every cell, and a cell that reuses another's selection (``hpo=recorded``) or has none ignores them."""
    from dataclasses import asdict, fields

    from omegaconf.errors import OmegaConfBaseException

    from bnnbench.run.schema import SEARCHES
    hpo = OmegaConf.to_container(cfg.hpo, resolve=True)
    kind = hpo.get("kind")
    if kind not in SEARCHES:
        raise ConfigError(f"unknown hpo.kind {kind!r}; valid: {', '.join(SEARCHES)}")
    search = SEARCHES[kind]
    own = {f.name for f in fields(search)}
    proto_hpo = OmegaConf.to_container(proto.hpo, resolve=True) if proto.get("hpo") else {}
    for k, v in proto_hpo.items():
        if k == "default_kind":
            if "hpo" not in given.chosen and v != kind:
                raise ConfigError(f"protocol {proto.name!r} selects hyper-parameters with hpo={v}; "
                                  f"add hpo={v} (or hpo=fixed to use fixed values)")
        elif k not in given.sets("hpo"):
            hpo[k] = v
    if ds.get("length_scales") is not None and "length_scales" not in given.sets("hpo"):
        hpo["length_scales"] = list(ds.length_scales)
    if kind == "recorded" and not hpo.get("record"):
        raise ConfigError("hpo=recorded needs hpo.record=<the run directory whose hyper-parameters it reuses>")
    given_values = {k: v for k, v in hpo.items() if k in own and v is not None}
    try:
        typed = OmegaConf.merge(OmegaConf.structured(search), given_values)
    except OmegaConfBaseException as e:
        raise ConfigError(f"protocol {proto.name!r}, hpo.{e.full_key}: {str(e).splitlines()[0]}") from None
    return asdict(OmegaConf.to_object(typed))


def resolve(cfg: DictConfig, given: CommandLine | None = None, meta: dict | None = None) -> RunSpec:
    """The settings of one run: ``cfg`` composed, the protocol's layers applied in the order of the module docstring,
    and what the command line ``given`` set kept over every protocol layer."""
    given = given or CommandLine()
    proto, data = cfg.protocol, cfg.data
    key = data.key
    if "datasets" in proto and proto.datasets is not None and key not in proto.datasets:
        raise ConfigError(f"protocol {proto.name!r} does not define data set {data.name!r}; it defines: "
                          + ", ".join(str(k) for k in proto.datasets)
                          + " (another protocol: protocol=<name>; `bnnbench list protocols`)")
    ds = _get(proto, "datasets", key, default=OmegaConf.create({}))
    size = _get(proto, "sizes", ds.get("size", None), default=OmegaConf.create({})) if ds.get("size") else {}
    method = _method_settings(cfg, proto, size, ds, given)
    vals, steps = _protocol_values(proto, size, ds, given, cfg.method.name)
    hidden = _hidden(cfg, proto, ds, given, meta)
    space, fixed = _search_space(cfg, proto, ds, meta)
    hpo = _hpo_settings(cfg, proto, ds, given)

    settings = {f.name: _SETTING.get(f.name, _plain)(proto.get(f.name, f.default)) for f in fields(ProtocolSettings)}
    likelihood = {"regression": "gaussian", "binary": "bernoulli", "multiclass": "categorical"}[settings["task"]]
    return RunSpec(**settings, method=OmegaConf.create(method), model_hidden=hidden,
                   activation=cfg.model.get("activation", "relu"), likelihood=likelihood,
                   epochs=int(vals["epochs"]), batch_size=int(vals["batch_size"]),
                   eval_samples=int(vals["eval_samples"]),
                   eval_every=int(vals["eval_every"]) if vals["eval_every"] else None,
                   space=space, fixed=fixed, hpo=hpo, steps=steps, conv=_conv(cfg.model))
