"""The final-values table of a figure-only experiment (``figure.final_table``): every number is the mean (and standard
error) over the record's splits of the metric it names; -ELBO/N is the negated recorded ELBO; missing runs say so."""

import matplotlib.colors
import numpy as np

from bnnbench.present.plots import final_values_table
from bnnbench.run.results import run_dir, write_record

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


def test_a_column_per_setting_draws_each_family_in_one_colour(tmp_path, monkeypatch):
    """``figure.columns: setting`` (App. F's Fig. 7: a column per prior): each setting's runs in its own column, each
    line the mean over splits of the recorded history, a paper method in the same colour in every column."""
    import bnnbench.present.plots as plots
    spec = {"name": "toyexp", "datasets": ["mnist"],
            "methods": {f"{f}_{p}": {"paper_method": f.upper(), "setting": p}
                        for p in ("p1", "p2") for f in ("a", "b")},
            "figure": {"metrics": ["accuracy"], "columns": "setting", "ylim": {"accuracy": [0, 1]}}}
    curves = {}
    for k, m in enumerate(spec["methods"]):
        acc = np.arange(6).reshape(3, 2) / 10 + k / 100   # [evaluations, splits]
        curves[m] = acc.mean(1)
        write_record(run_dir(tmp_path, "toyexp", m, "mnist"), {"status": "ok", "metrics": []},
                     history={"epochs": [1, 2, 3], "metrics": [{"accuracy": list(r)} for r in acc]})
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out: figs.append(fig) or out)
    plots.convergence_figure(spec, tmp_path, tmp_path / "f.png")
    axes = figs[0].axes
    assert [ax.get_title() for ax in axes] == ["mnist, p1", "mnist, p2"]
    colours = {}
    for ax, p in zip(axes, ("p1", "p2")):
        assert ax.get_ylim() == (0, 1)
        for line in ax.get_lines():
            family = line.get_label()
            assert np.allclose(line.get_ydata(), curves[f"{family.lower()}_{p}"])
            assert colours.setdefault(family, line.get_color()) == line.get_color()
    assert sorted(colours) == ["A", "B"] and len(set(colours.values())) == 2


def test_a_figure_may_draw_runs_outside_the_table(tmp_path, monkeypatch):
    """``figure.methods`` may name a run the table does not list (Vadam's Figure 3 draws Vprop): it is drawn under its
    label, its band in its line's colour."""
    import bnnbench.present.plots as plots
    spec = {**SPEC, "figure": {"metrics": ["accuracy"], "methods": ["a", "extra"], "labels": {"extra": "Extra"}}}
    for m in ("a", "extra"):
        write_record(run_dir(tmp_path, "toyexp", m, "uci/yacht"), {"status": "ok", "metrics": []},
                     history={"epochs": [1, 2], "metrics": [{"accuracy": [0.1, 0.3]}, {"accuracy": [0.5, 0.7]}]})
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out: figs.append(fig) or out)
    plots.convergence_figure(spec, tmp_path, tmp_path / "f.png")
    (ax,) = figs[0].axes
    assert [line.get_label() for line in ax.get_lines()] == ["A", "Extra"]
    assert [tuple(c.get_facecolor()[0][:3]) for c in ax.collections] == [
        matplotlib.colors.to_rgb(line.get_color()) for line in ax.get_lines()]
    assert np.allclose(ax.get_lines()[1].get_ydata(), [0.2, 0.6])
