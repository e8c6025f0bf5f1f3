"""A numerics class (what, besides the code, decides the bits of a seeded CPU run) is read off the CPU, and a class's
baseline stands in for a record's numbers only for a record of another class and only while the committed numbers
it was made against stand."""

import json

import pandas as pd
import pytest
import torch

from bnnbench.judge.baselines import Baseline, record_sha
from bnnbench.run.numerics import UNRECORDED, class_id, cpu_isa, cpu_model, numerics_class, record_class

KEYS = ["dataset", "method", "setting", "metric"]
INTEL = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse4_2 avx2 fma avx512f avx512_fp16 amx_tile\n\n" \
        "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse4_2 avx2 fma avx512f avx512_fp16 amx_tile\n"
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx2 fma avx512f\n"


def test_the_class_names_the_wheel_the_vector_kernels_and_the_instruction_sets():
    assert cpu_isa(INTEL) == ("GenuineIntel", ("sse4_2", "fma", "avx2", "avx512f", "avx512_fp16", "amx_tile"))
    cls = numerics_class(INTEL)
    assert cls.startswith(f"torch {torch.__version__}; aten {torch.backends.cpu.get_cpu_capability()}; ")
    assert cls.endswith("GenuineIntel: sse4_2 fma avx2 avx512f avx512_fp16 amx_tile")
    assert numerics_class(AMD) != cls and numerics_class(INTEL) == cls
    assert len(class_id(cls)) == 12 and class_id(cls) != class_id(numerics_class(AMD))
    assert numerics_class() == numerics_class()   # this machine's, read from /proc/cpuinfo where there is one
    assert record_class({"versions": {"numerics": cls}}) == cls and record_class({"versions": {}}) == UNRECORDED


def test_a_baseline_names_the_processor_model_it_holds_on(tmp_path):
    """Two processor models with the same instruction sets are one class but may pick other MKL and oneDNN kernels:
    a baseline records the model it was written on and holds on that model only (one older than the field, on
    any)."""
    assert cpu_model(INTEL.replace("vendor_id", "cpu family\t: 6\nmodel\t\t: 143\nvendor_id")) \
        == "GenuineIntel family 6 model 143"
    assert cpu_model("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n") == "0x41 part 0xd4f"
    assert cpu_model() == cpu_model() and cpu_model()   # this machine's
    here = numerics_class(INTEL)
    base = Baseline.load(tmp_path, here)
    assert base.cpu is None and base.holds_on("GenuineIntel family 6 model 143")
    base.cpu = "GenuineIntel family 6 model 143"
    base.save()
    again = Baseline.load(tmp_path, here)
    assert again.cpu == base.cpu and again.holds_on(base.cpu) and not again.holds_on("GenuineIntel family 6 model 207")


def _record(mean, splits, numerics=None):
    return {"summary": {"rmse": {"mean": mean, "stderr": 0.1, "n": len(splits)}},
            "metrics": [{"split": str(i), "rmse": v} for i, v in enumerate(splits)],
            "versions": {"numerics": numerics} if numerics else {"torch": "2.13.0+cpu"}}


def test_a_baseline_stands_in_only_for_a_record_of_another_class_it_was_made_against(tmp_path):
    here = numerics_class(INTEL)
    base = Baseline.load(tmp_path, here)
    assert base.cells == {} and base.path == tmp_path / "regression" / f"{class_id(here)}.json"
    legacy, now = _record(1.5, [1.0, 2.0]), _record(1.5 + 1e-9, [1.0, 2.0 + 2e-9], here)
    base.add_cell("t/bbb/uci/yacht", legacy, now, "this CPU's rounding")
    expected, used = base.expected_record("t/bbb/uci/yacht", legacy)
    assert used and expected["summary"] == now["summary"] and expected["metrics"] == now["metrics"]
    assert base.expected_record("t/vadam/uci/yacht", legacy) == (legacy, False)       # no entry for that cell
    rerecorded = _record(1.6, [1.0, 2.2])                                              # a deliberate change since
    assert base.expected_record("t/bbb/uci/yacht", rerecorded) == (rerecorded, False)
    own = {**legacy, "versions": {"numerics": here}}                                   # made in this class: exact
    assert record_sha(own) == record_sha(legacy) and base.expected_record("t/bbb/uci/yacht", own) == (own, False)
    base.save()
    again = Baseline.load(tmp_path, here)
    assert again.expected_record("t/bbb/uci/yacht", legacy)[1] and again.cells["t/bbb/uci/yacht"]["reason"]
    with pytest.raises(ValueError, match="holds the baseline of"):
        json_path = tmp_path / "regression" / f"{class_id(numerics_class(AMD))}.json"
        json_path.write_text(json.dumps({"numerics": here, "cells": {}}))
        Baseline.load(tmp_path, numerics_class(AMD))


def _rows(*rows):
    return pd.DataFrame([{"dataset": d, "method": m, "setting": "", "metric": "test_rmse", "ours": o, "ours_se": se,
                          "verdict": v} for d, m, o, se, v in rows])


def test_a_table_row_of_the_baseline_replaces_only_the_committed_numbers_it_was_made_against(tmp_path):
    base = Baseline.load(tmp_path, numerics_class(INTEL))
    committed = _rows(("yacht", "PBP", 1.0, 0.1, "reproduced"), ("boston", "PBP", 3.0, 0.2, "worse"))
    here = _rows(("yacht", "PBP", 1.0 + 1e-12, 0.1, "reproduced"), ("boston", "PBP", 3.0, 0.2, "worse"))
    base.add_table_rows("t", committed, here, KEYS)
    assert list(base.tables["t"]) == ["yacht|PBP||test_rmse"]                          # only the row that differs
    expected, replaced = base.expected_table("t", committed, KEYS)
    assert replaced.tolist() == [True, False] and expected["ours"].tolist() == [1.0 + 1e-12, 3.0]
    assert committed["ours"].tolist() == [1.0, 3.0]
    moved_since = _rows(("yacht", "PBP", 1.2, 0.1, "reproduced"), ("boston", "PBP", 3.0, 0.2, "worse"))
    expected, replaced = base.expected_table("t", moved_since, KEYS)
    assert not replaced.any() and expected.equals(moved_since)
    assert not base.expected_table("other", committed, KEYS)[1].any()
