"""The configuration tree (``configs/``, installed as ``bnnbench.configs``): composing a run's configuration,
the names each config group offers, and the errors a configuration can raise.

Every command and the CI check read configurations through this module; the command line only parses
arguments.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path

from bnnbench.core.errors import ConfigError  # noqa: F401 - raised by every layer, named here as before

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
GROUPS = ("data", "method", "protocol", "hpo", "experiment", "model")
# Version of the resolved configuration a record stores and hashes: 2 = typed method configs (every setting with its
# default in the method's Config); 3 = defaults as values, not None read as a default in code (noisy K-FAC's
# momentum_type, the inducing families' arch); 4 = factorised's ``marginal_var_unscaled`` (false before it existed).
# Older records are re-keyed by ``python -m bnnbench.run.migrate``.
CONFIG_SCHEMA = 4


def config_dir() -> str:
    """The Hydra config tree: ``configs/`` of the source tree, installed as ``bnnbench.configs``."""
    try:
        import importlib.resources as ir
        p = Path(str(ir.files("bnnbench.configs")))
        if (p / "config.yaml").exists():
            return str(p)
    except Exception:  # pragma: no cover
        pass
    return CONFIG_DIR


def register_resolvers() -> None:
    """The ``slug`` resolver of ``config.yaml``, and each registered method's typed ``Config`` as the option
    ``method=<name>`` (the methods' settings and defaults live in their modules, nowhere else)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from bnnbench.methods import METHODS
    if not OmegaConf.has_resolver("slug"):
        OmegaConf.register_new_resolver("slug", slug)
    store = ConfigStore.instance()
    registered = tuple(METHODS.items())
    if _stored_methods.get(id(store)) == registered:
        return   # the store already holds exactly these methods (a structured config per method: ~0.2 s a call)
    for name, cls in METHODS.items():
        node = OmegaConf.structured(cls.Config)
        OmegaConf.set_readonly(node, False)   # frozen in the method; the command line still sets its values
        store.store(group="method", name=name, node=node)
    # a method no longer registered leaves the store too: the store travels, pickled, into a launcher's jobs, where a
    # class of a module they cannot import (a test's, a notebook's) would stop them before they start
    stored = store.repo.get("method", {})
    for key in [k for k in stored if k.endswith(".yaml") and k[:-len(".yaml")] not in METHODS]:
        del stored[key]
    _stored_methods[id(store)] = registered


_stored_methods: dict[int, tuple] = {}   # the ConfigStore -> the (name, class) pairs it was last given


def cache_config_files() -> None:
    """Parse each config file once per process: Hydra's file source reads and parses a YAML file (in pure Python)
    every time a composition needs it, a few times per ``compose`` and thousands of times in a check of the committed
    records. The parsed document (plain lists and dicts) is kept per (path, mtime, size) and each load builds its own
    ``OmegaConf`` tree from it as ``OmegaConf.load`` does, so an edited file is read again and no composition sees
    another's changes. Patched into the class Hydra's source registry resolves ``file://`` to (Hydra's plugin scan
    imports its module anew, so the class a plain import gives is not always the one in use)."""
    from hydra._internal.sources_registry import SourcesRegistry
    FileConfigSource = SourcesRegistry.instance().resolve("file")
    if getattr(FileConfigSource.load_config, "cached_parse", False):
        return
    import os

    import yaml
    from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    parsed: dict = {}

    def load_config(self, config_path: str) -> ConfigResult:
        full = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
        try:
            st = os.stat(full)
        except OSError:
            raise ConfigLoadError(f"Config not found : {full}") from None
        key = (full, st.st_mtime_ns, st.st_size)
        if key not in parsed:
            with open(full, encoding="utf-8") as f:
                text = f.read()
            parsed[key] = (ConfigSource._get_header_dict(text[:512]), yaml.load(text, Loader=get_yaml_loader()))
        header, doc = parsed[key]
        if doc is not None and not isinstance(doc, (list, dict, str)):
            raise OSError(f"Invalid loaded object type: {type(doc).__name__}")
        return ConfigResult(config=OmegaConf.create() if doc is None else OmegaConf.create(doc),
                            path=f"{self.scheme()}://{self.path}", provider=self.provider, header=dict(header))

    load_config.cached_parse, load_config.uncached = True, FileConfigSource.load_config
    FileConfigSource.load_config = load_config


def slug(name) -> str:
    """A data set name as one path component: ``uci/boston`` -> ``uci__boston``."""
    return str(name).replace("/", "__")


def compose(overrides: list[str]):
    """The configuration of ``config.yaml`` with Hydra ``overrides`` applied (no run directory, no logging).

    Hydra composes the config groups' choices (``method=slang``, ``data=uci/boston``) into one tree and then applies
    the key overrides (``method.rank=8``) to it with ``ConfigLoaderImpl._apply_overrides_to_config``. Here the tree
    of each set of choices is composed by Hydra once per process and kept pickled (a run, a ``reproduce`` of many
    cells and the check of every committed record compose the same few choices again and again: unpickling takes
    milliseconds, composing a third of a second and more), and the key overrides are applied to a fresh copy by that
    same Hydra function. Overrides of Hydra's own node or with a package, and trees that cannot be pickled (a method
    class defined inside a function), go through Hydra whole."""
    import pickle

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    register_resolvers()
    signature = _config_signature()
    overrides = check_overrides(list(overrides), signature)
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = tuple(o for o, p in zip(overrides, parsed) if _is_choice(p))
    keys = [p for p in parsed if not _is_choice(p)]
    if any(p.key_or_group.split(".")[0] == "hydra" or p.package is not None or p.is_sweep_override()
           for p in keys):
        return _hydra_compose(overrides)
    tree = _choices_tree(choices, signature)
    if tree is None:
        return _hydra_compose(overrides)
    cfg = pickle.loads(tree)
    ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)
    return cfg


def _is_choice(p) -> bool:
    """A config-group override (``data=uci/boston``, ``~hpo``, ``hydra/launcher=joblib``), not a key's."""
    key = p.key_or_group
    return "." not in key and (key.split("/")[0] in GROUPS or key.startswith("hydra/"))


def _hydra_compose(overrides: list[str]):
    from hydra import compose as hcompose, initialize_config_dir
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cache_config_files()
        return hcompose(config_name="config", overrides=overrides)


@functools.lru_cache(maxsize=64)
def _choices_tree(choices: tuple[str, ...], signature: tuple) -> bytes | None:
    """What Hydra composes these group choices to, pickled (None where it cannot be); ``signature`` keys it to the
    registered methods and the config files' times and sizes."""
    import pickle
    cfg = _hydra_compose(list(choices))
    try:
        return pickle.dumps(cfg)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


def _config_signature() -> tuple:
    """The registered method classes and every config file's (path, mtime, size): a change to either composes anew."""
    import os

    from bnnbench.methods import METHODS
    files = []
    for root, _, names in os.walk(config_dir()):
        for n in names:
            if n.endswith(".yaml"):
                st = os.stat(os.path.join(root, n))
                files.append((root, n, st.st_mtime_ns, st.st_size))
    return tuple(METHODS.items()), tuple(sorted(files))


def experiment_spec(name: str) -> dict:
    """An experiment file (``configs/experiment/<name>.yaml``) as a plain dict: its cells, table and figures."""
    from omegaconf import OmegaConf
    cfg = compose([f"experiment={name}"])
    return OmegaConf.to_container(cfg.experiment, resolve=True)


def list_names(group: str) -> list[str]:
    """The options of a config group (``method`` -> ``bbb``, ``map``, ...; ``data`` -> ``uci/boston``, ...)."""
    if group == "method":
        from bnnbench.methods import METHODS
        return sorted(METHODS)
    root = Path(config_dir()) / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def check_choices(overrides: list[str]) -> str | None:
    """An error message for a config-group choice that does not exist (all valid ones listed;
    Hydra itself lists only the top level of nested groups such as ``data/uci``)."""
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key not in GROUPS or not value or value == "null":
            continue
        valid = list_names(key)
        for v in value.split(","):
            if v not in valid:
                close = difflib.get_close_matches(v, valid, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                return f"unknown {key} {v!r}{hint}; valid: {', '.join(valid)}"
    return None


@dataclass(frozen=True)
class CommandLine:
    """What a command line set explicitly, as Hydra's own override parser reads it: the config groups it chose
    (``hpo=bo``) and, per group, the top-level keys it gave (``method.lr=0.1`` -> ``{"method": {"lr"}}``). A protocol's
    per-size or per-data-set value never overrides these (``protocol.resolve``)."""
    chosen: frozenset = frozenset()
    keys: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, overrides: list[str]) -> CommandLine:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        chosen, keys = set(), {}
        for o in OverridesParser.create().parse_overrides(list(overrides)):
            group, _, sub = o.key_or_group.partition(".")
            if not sub:
                chosen.add(group)
            elif not o.is_delete():
                keys.setdefault(group, set()).add(sub.split(".")[0])
        return cls(frozenset(chosen), {g: frozenset(k) for g, k in keys.items()})

    def sets(self, group: str) -> frozenset:
        """The keys of ``group`` given on the command line."""
        return self.keys.get(group, frozenset())


def cell_own_overrides(cell: dict, runs_root) -> list[str]:
    """An experiment cell's overrides, with ``{runs_root}`` (another cell's record, e.g. Vprop with Vadam's
    optimum) pointing into ``runs_root``."""
    return [o.replace("{runs_root}", str(runs_root)) for o in cell.get("overrides", [])]


def cell_label(cell: dict) -> str:
    """The column (and run directory) of an experiment cell: its ``label``, else its method."""
    return cell.get("label") or cell["method"]


def cell_overrides(experiment: str, cell: dict, runs_root) -> list[str]:
    """The overrides that run an experiment cell: its experiment, method, data set, label and own overrides."""
    return [f"experiment={experiment}", f"method={cell['method']}", f"data={cell['data']}",
            f"label={cell_label(cell)}", *cell_own_overrides(cell, runs_root)]


def cells_in(experiment: str, label: str, slug: str) -> list[dict]:
    """The cells of ``experiment`` whose run directory is ``<label>/<slug>``."""
    return [c for c in experiment_spec(experiment)["runs"]
            if cell_label(c) == label and c["data"].replace("/", "__") == slug]


def compose_checked(overrides: list[str]):
    """``compose`` after ``check_overrides``, with every way an override can be wrong turned into a ``ConfigError``
    that says what is valid."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    try:
        return compose(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        said = [str(x).splitlines()[0] for x in (e, e.__cause__) if x is not None and str(x)]
        raise ConfigError(": ".join(said) or type(e).__name__) from None


def check_overrides(overrides: list[str], signature: tuple | None = None) -> list[str]:
    """Check every ``key=value`` override against what its config group can hold, and return the overrides as
    Hydra must apply them.

    A key of a typed group (``schema.SCHEMAS``: protocol, hpo) may be set whether or not the chosen file sets it,
    with or without ``+``, and its value must have the schema's type; a key of a method, the model or the top level
    must be one that the chosen file has (``+`` cannot add a key nothing reads). An unknown key is an error listing
    the valid keys of its group. ``signature``: :func:`_config_signature`, where the caller has computed it."""
    from dataclasses import fields

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from bnnbench.run.schema import SCHEMAS
    parsed = OverridesParser.create().parse_overrides(overrides)
    # the keys a sweep's groups offer are checked against its first choice of each
    choices = [f"{p.key_or_group}={list(p.sweep_string_iterator())[0]}" if p.is_sweep_override() else o
               for o, p in zip(overrides, parsed) if p.key_or_group in GROUPS]
    base = None
    out = []
    for text, p in zip(overrides, parsed):
        key = p.key_or_group
        group, _, sub = key.partition(".")
        if key in GROUPS or group == "hydra" or p.is_delete():
            out.append(text)
            continue
        if group in SCHEMAS and sub:
            schema = SCHEMAS[group]
            name = sub.split(".")[0]
            valid = [f.name for f in fields(schema)]
            if name not in valid:
                raise ConfigError(_unknown(key, valid, group))
            if "." not in sub and not p.is_sweep_override():
                try:
                    OmegaConf.merge(OmegaConf.structured(schema), {name: p.value()})
                except OmegaConfBaseException as e:
                    raise ConfigError(f"{key}={p.get_value_element_as_str()}: {str(e).splitlines()[0]}") from None
            out.append(f"++{key}={p.get_value_element_as_str()}")
            continue
        name = (sub or group).split(".")[0]
        if base is None:
            base = _composed(tuple(choices), signature or _config_signature())
        node = _node_of(base, group, sub)
        if not _holds(node, name):
            valid = sorted(node.keys()) if node is not None and OmegaConf.is_dict(node) else []
            raise ConfigError(_unknown(key, [str(k) for k in valid], group if sub else "the top level"))
        out.append(text.lstrip("+") if p.is_add() else text)
    return out


def _node_of(cfg, group: str, sub: str):
    return cfg if not sub else cfg.get(group)


def _holds(node, name: str) -> bool:
    from omegaconf import OmegaConf
    return node is not None and OmegaConf.is_dict(node) and name in node


@functools.lru_cache(maxsize=128)
def _composed(choices: tuple[str, ...], signature: tuple):
    """The configuration the group choices alone compose to, which ``check_overrides`` reads (never writes): one
    copy per set of choices and ``signature`` (:func:`_config_signature`: an edited config file is read again)."""
    return compose(list(choices))


def _unknown(key: str, valid: list[str], where: str) -> str:
    close = difflib.get_close_matches(key.split(".")[-1], valid, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key {key!r}{hint}; valid keys of {where}: {', '.join(valid)}"
