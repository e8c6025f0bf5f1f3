"""The errors every layer raises and the command line turns into one ``error:`` line (exit 2): a configuration value
that cannot work (``ConfigError``); the data set errors live beside the loaders (``bnnbench.core.data.errors``)."""

import sys


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says which and what is valid."""


def say_error(msg: str) -> None:
    """The one ``error: <msg>`` line on standard error that a command prints for an expected failure."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
