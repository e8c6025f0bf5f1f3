"""Exceptions raised by :mod:`bnnbench.core.data`."""
from __future__ import annotations


class DataError(Exception):
    """Base class of every data-layer error."""


class UnknownDatasetError(DataError, KeyError):
    """A dataset name that is not in the registry.

    Also a :class:`KeyError`, so ``except KeyError`` works; ``str()`` gives the
    plain message (``KeyError`` would otherwise quote it).
    """

    def __init__(self, message: str, name: str | None = None, suggestion: str | None = None):
        super().__init__(message)
        self.name = name
        self.suggestion = suggestion

    def __str__(self) -> str:  # KeyError.__str__ would repr() the message
        return str(self.args[0]) if self.args else ""


class DataMissingError(DataError):
    """A raw file is neither cached, nor in the mirror, nor downloadable."""


class NonFiniteDataError(DataError):
    """A data set whose inputs or targets hold NaN or infinite values: every method would "diverge" on it."""


class ChecksumError(DataError):
    """A fetched or cached file does not have the registered digest."""

    def __init__(self, message: str, path: str | None = None, algorithm: str | None = None,
                 expected: str | None = None, actual: str | None = None):
        super().__init__(message)
        self.path = path
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual
