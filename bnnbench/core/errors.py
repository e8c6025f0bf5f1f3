"""The errors every layer raises and the command line turns into one ``error:`` line (exit 2): a configuration value
that cannot work (``ConfigError``); the data set errors live beside the loaders (``bnnbench.core.data.errors``)."""


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says which and what is valid."""
