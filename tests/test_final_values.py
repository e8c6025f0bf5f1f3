"""The final-values table of a figure-only experiment (``figure.final_table``): every number is the mean (and standard
error) over the record's splits of the metric it names; -ELBO/N is the negated recorded ELBO; missing runs say so."""

import numpy as np

from bnnbench.plots import final_values_table
from bnnbench.results import run_dir, write_record

SPEC = {"name": "toyexp", "title": "Toy", "datasets": ["uci/yacht"],
        "methods": {"a": {"paper_method": "A"}, "b": {"paper_method": "B", "setting": "S"}},
        "figure": {"metrics": ["train_objective", "accuracy"], "metric_labels": {"accuracy": "acc"}}}


def test_final_values_are_the_records_means_and_standard_errors(tmp_path):
    acc, elbo = [0.5, 0.7, 0.9], [-1.0, -2.0, -4.0]
    write_record(run_dir(tmp_path, "toyexp", "a", "uci/yacht"),
                 {"status": "ok", "device": "cpu", "wall_time_s": 12.3,
                  "metrics": [{"split": str(i), "accuracy": a, "elbo": e} for i, (a, e) in enumerate(zip(acc, elbo))]})
    out = final_values_table(SPEC, tmp_path, tmp_path / "t.md")
    rows = [r for r in out.read_text().splitlines() if r.startswith("| uci/yacht")]
    a_row, b_row = rows
    cells = [c.strip() for c in a_row.split("|")[1:-1]]
    assert cells[:2] == ["uci/yacht", "A"] and cells[4:] == ["cpu", "12"]
    for cell, v in ((cells[2], -np.array(elbo)), (cells[3], np.array(acc))):
        mean, se = cell.split(" ± ")
        assert float(mean) == float(f"{v.mean():.4g}") and float(se) == float(f"{v.std() / np.sqrt(3):.2g}")
    assert b_row.count("not run") == 2 and "B (S)" in b_row
    assert "acc" in out.read_text()


def test_no_records_no_table(tmp_path):
    assert final_values_table(SPEC, tmp_path, tmp_path / "t.md") is None and not (tmp_path / "t.md").exists()
