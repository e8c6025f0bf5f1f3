"""The configuration tree (``configs/``, installed as ``bnnbench.configs``): composing a run's configuration,
the names each config group offers, and the errors a configuration can raise.

Every command and the CI check read configurations through this module; the command line only parses
arguments.
"""

from __future__ import annotations

import difflib
from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")
GROUPS = ("data", "method", "protocol", "hpo", "experiment", "model")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says which and what is valid."""


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
    from omegaconf import OmegaConf
    if not OmegaConf.has_resolver("slug"):
        OmegaConf.register_new_resolver("slug", slug)


def slug(name) -> str:
    """A data set name as one path component: ``uci/boston`` -> ``uci__boston``."""
    return str(name).replace("/", "__")


def compose(overrides: list[str]):
    """The configuration of ``config.yaml`` with Hydra ``overrides`` applied (no run directory, no logging)."""
    from hydra import compose as hcompose, initialize_config_dir
    register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return hcompose(config_name="config", overrides=overrides)


def experiment_spec(name: str) -> dict:
    """An experiment file (``configs/experiment/<name>.yaml``) as a plain dict: its cells, table and figures."""
    from omegaconf import OmegaConf
    cfg = compose([f"experiment={name}"])
    return OmegaConf.to_container(cfg.experiment, resolve=True)


def list_names(group: str) -> list[str]:
    """The options of a config group (``method`` -> ``bbb``, ``map``, ...; ``data`` -> ``uci/boston``, ...)."""
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


def cell_own_overrides(cell: dict, runs_root) -> list[str]:
    """An experiment cell's overrides, with ``{runs_root}`` (another cell's record, e.g. Vprop with Vadam's
    optimum) pointing into ``runs_root``."""
    return [o.replace("{runs_root}", str(runs_root)) for o in cell.get("overrides", [])]


def compose_checked(overrides: list[str]):
    """``compose``, with every way an override can be wrong turned into a ``ConfigError`` that says what is valid."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    try:
        return compose(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
