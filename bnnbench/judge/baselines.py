"""A numerics class's own baseline for the regression check: what the short cells re-run to on machines that round
differently from the ones their records were made on.

A seeded CPU run repeats bit for bit only within a numerics class (bnnbench.run.numerics). Where the machine checking
is of another class than a record, the check compares the re-run exactly against this class's baseline,
``results/regression/<class id>.json``, written once by ``bnnbench regression --baseline --reason "..."`` on a machine
of that class:

    {"numerics": "<class>", "cpu": "<the processor model it was written on>",
     "cells": {"<experiment>/<label>/<data>": {"record": <sha of the record's numbers>, "summary": ..., "metrics": ...,
                                              "git_commit": ..., "reason": ...}},
     "tables": {"<experiment>": {"<dataset>|<method>|<setting>|<metric>":
                                 {"recorded": [ours, ours_se], "ours": ..., "ours_se": ..., "verdict": ...}}}}

An entry holds only while the committed numbers it was made against stand: a re-recorded cell (a deliberate change)
changes its record's hash and its table's ``ours``, and the check then compares against the record again. The check
stays exact: a baseline never widens a tolerance, it names the other class's numbers. It holds only on the processor
model it was written on (``cpu``, bnnbench.run.numerics.cpu_model; baselines written before the field name none): one
class's models may pick other MKL and oneDNN kernels, so another model checks across classes, as with no baseline.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bnnbench.core.files import atomic_write_json, jsonable
from bnnbench.run.numerics import class_id, record_class

BASELINES = "regression"
"""The folder of ``results/`` that holds the baselines."""


def record_sha(record: dict) -> str:
    """SHA-256 of a record's numbers (its summary and per-split metrics)."""
    numbers = {"summary": record.get("summary"), "metrics": record.get("metrics")}
    return hashlib.sha256(json.dumps(numbers, sort_keys=True, default=jsonable).encode()).hexdigest()


def _key(row, keys) -> str:
    return "|".join(str(row[k]) for k in keys)


def same(a, b, rtol: float = 0.0) -> bool:
    """``a`` and ``b`` equal (NaN equals NaN), or within ``rtol`` relative where a tolerance is stated."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))


@dataclass
class Baseline:
    """One class's baseline (module docstring); empty where none is committed."""
    path: Path
    numerics: str
    cells: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    cpu: str | None = None

    @classmethod
    def load(cls, results: Path, numerics: str) -> "Baseline":
        path = Path(results) / BASELINES / f"{class_id(numerics)}.json"
        if not path.is_file():
            return cls(path, numerics)
        data = json.loads(path.read_text())
        if data.get("numerics") != numerics:
            raise ValueError(f"{path} holds the baseline of {data.get('numerics')!r}, not of {numerics!r}")
        return cls(path, numerics, data.get("cells") or {}, data.get("tables") or {}, data.get("cpu"))

    def holds_on(self, cpu: str) -> bool:
        """Whether this baseline applies on a processor of model ``cpu``: one written on it, or on a model unknown."""
        return self.cpu is None or self.cpu == cpu

    def expected_record(self, name: str, recorded: dict) -> tuple[dict, bool]:
        """The numbers a re-run of the cell ``name`` must repeat on this class: its baseline's where the record was
        made in another class and the baseline was made against this record; the record's own otherwise. Also
        whether they are the baseline's."""
        entry = self.cells.get(name)
        if record_class(recorded) == self.numerics or not entry or entry["record"] != record_sha(recorded):
            return recorded, False
        return {"summary": entry["summary"], "metrics": entry["metrics"]}, True

    def expected_table(self, exp: str, old, keys: list[str]):
        """The committed table rows ``old`` with ``ours``, ``ours_se`` and ``verdict`` replaced by this class's where
        its baseline was made against the same committed ``ours`` and ``ours_se``; which rows were replaced (a
        boolean Series on ``old``'s index)."""
        rows = self.tables.get(exp) or {}
        out, replaced = old.copy(), pd.Series(False, index=old.index)
        for i, r in old.iterrows():
            entry = rows.get(_key(r, keys))
            if entry and all(same(a, b) for a, b in zip(entry["recorded"], (r["ours"], r["ours_se"]))):
                out.loc[i, ["ours", "ours_se", "verdict"]] = [entry["ours"], entry["ours_se"], entry["verdict"]]
                replaced[i] = True
        return out, replaced

    def add_cell(self, name: str, recorded: dict, now: dict, reason: str) -> None:
        self.cells[name] = {"record": record_sha(recorded), "summary": now.get("summary"),
                            "metrics": now.get("metrics"), "git_commit": now.get("git_commit"), "reason": reason}

    def add_table_rows(self, exp: str, old, new, keys: list[str]) -> None:
        """This class's rebuilt ``new`` rows that differ from the committed rows of ``old``, each stored against the
        committed numbers it replaces."""
        new_by_key = {_key(r, keys): r for _, r in new.iterrows()}
        rows = self.tables.setdefault(exp, {})
        for _, r in old.iterrows():
            n = new_by_key.get(_key(r, keys))
            if n is not None and not (same(n["ours"], r["ours"]) and same(n["ours_se"], r["ours_se"])
                                      and n["verdict"] == r["verdict"]):
                rows[_key(r, keys)] = {"recorded": [float(r["ours"]), float(r["ours_se"])], "ours": float(n["ours"]),
                                       "ours_se": float(n["ours_se"]), "verdict": str(n["verdict"])}

    def save(self) -> Path:
        atomic_write_json(self.path, {"numerics": self.numerics, **({"cpu": self.cpu} if self.cpu else {}),
                                      "cells": dict(sorted(self.cells.items())),
                                      "tables": {e: dict(sorted(t.items())) for e, t in sorted(self.tables.items())}})
        return self.path
