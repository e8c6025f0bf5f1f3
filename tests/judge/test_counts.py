"""Counts of verdicts (bnnbench.judge.counts): the count line's form, and the committed text against the committed
tables: the generated summaries of README.md and results/README.md, each table's count line, and the list of cells
better than the paper by |z| > 4 in results/README.md's misses. Fast: no training, no records."""

import math
import re

import pandas as pd
import pytest

from bnnbench.judge.counts import (BEGIN, END, FAR_Z, cell_key, count_line, far_better, method_line, stale_summaries,
                             summary_markdown, table_frames, tally, update_summaries)
from bnnbench.present.render import render_latex, render_markdown
from datapaths import REPO

TABLES = REPO / "results" / "tables"
NOTES = REPO / "results" / "README.md"


def _frame(rows):
    return pd.DataFrame(rows, columns=["dataset", "method", "setting", "metric", "verdict", "z"])


def test_count_line_puts_reproduced_first_and_better_beside_it():
    df = _frame([("a", "M", "", "ll", "reproduced", 0.5), ("b", "M", "", "ll", "reproduced", float("nan")),
                 ("c", "M", "", "ll", "better", 2.5), ("d", "M", "", "ll", "better", -7.0),
                 ("e", "N", "L=1", "ll", "better", float("nan")), ("f", "N", "L=1", "ll", "worse", -3.0)])
    assert count_line(df) == "reproduced 2 of 6; better 3 (|z| > 4: 1); worse 1"
    t = tally(df)
    assert (t["reproduced"], t["better"], t["far"], t["judged"]) == (2, 3, 1, 6)
    assert method_line(df) == ("Reproduced per method: M 2 of 4: better 2 (|z| > 4: 1); "
                               "N (L=1) 0 of 2: better 1, worse 1.")
    assert list(far_better(df)["dataset"]) == ["d"]                           # a better cell without z is not far
    assert FAR_Z == 4.0


def test_count_line_adds_inconclusive_not_run_and_unattributed_only_where_a_table_has_them():
    df = _frame([("a", "M", "", "ll", "reproduced", 0.1), ("b", "M", "", "ll", "inconclusive", 1.0),
                 ("c", "M", "", "ll", "not_run", float("nan")), ("d", "M", "", "ll", None, float("nan")),
                 ("e", "M", "", "ll", "unattributed", float("nan"))])
    # judged: every cell but the unattributed one; a missing verdict is not run
    assert count_line(df) == ("reproduced 1 of 4; better 0 (|z| > 4: 0); worse 0; inconclusive 1; not run 2; "
                              "unattributed 1")
    assert count_line(tally(df), percent=True).startswith("reproduced 1 of 4 (25%); ")


def test_rendered_tables_headline_reproduced_and_never_add_better_to_it():
    spec = {"name": "t", "title": "T", "metrics": {}}
    df = _frame([("a", "M", "", "ll", "reproduced", 0.5), ("b", "M", "", "ll", "better", 9.0)]).assign(
        ours=1.0, ours_se=0.1, paper=1.0, paper_err=0.1, paper_printed="1.0", paper_err_printed="0.1")
    md = render_markdown(df, spec)
    assert "**reproduced 1 of 2; better 1 (|z| > 4: 1); worse 0**" in md and "or better" not in md
    assert "% reproduced 1 of 2; better 1 (|z| > 4: 1); worse 0\n" in render_latex(df, spec)


def _committed():
    frames = table_frames(TABLES)
    assert {name for name, _, _ in frames} >= {"slang_table1", "slang_table2", "vadam_table1", "nng_table1",
                                                "nng_table3", "nng_table4", "gi_tableG", "slang_table3"}
    return frames


def test_committed_table_files_carry_the_count_line_of_their_csv():
    for name, _, df in _committed():
        line = count_line(df)
        assert f"**{line}**" in (TABLES / f"{name}.md").read_text(encoding="utf-8"), name
        assert method_line(df) in (TABLES / f"{name}.md").read_text(encoding="utf-8"), name
        tex = TABLES / f"{name}.tex"
        if tex.exists():
            assert f"% {line}\n" in tex.read_text(encoding="utf-8"), name


def test_the_readmes_generated_counts_are_what_the_tables_give():
    """The text between the counts markers of README.md and results/README.md is ``summary_markdown`` of the
    committed CSVs: typed counts cannot drift (``make tables`` rewrites it)."""
    for readme in (NOTES, REPO / "README.md"):
        text = readme.read_text(encoding="utf-8")
        assert text.count(BEGIN) == 1 and text.count(END) == 1, readme
    assert stale_summaries(TABLES) == [], "run `make tables` (or bnnbench table ...) to regenerate the counts"
    for stale in ("reproduced or better", "of 48 reproduced", "k / n cells"):
        assert stale not in (REPO / "README.md").read_text(encoding="utf-8")
        assert stale not in NOTES.read_text(encoding="utf-8")


def test_update_summaries_rewrites_only_between_the_markers(tmp_path):
    tables = tmp_path / "results" / "tables"
    tables.mkdir(parents=True)
    for ext in ("csv", "md"):
        (tables / f"slang_table2.{ext}").write_bytes((TABLES / f"slang_table2.{ext}").read_bytes())
    notes = tmp_path / "results" / "README.md"
    notes.write_text(f"before\n<!-- counts:begin -->\ntyped: 39 of 48\n{END}\nafter\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("no markers\n", encoding="utf-8")
    assert stale_summaries(tables) == [notes]
    assert update_summaries(tables) == [notes] and stale_summaries(tables) == []
    text = notes.read_text(encoding="utf-8")
    assert text.startswith("before\n" + BEGIN + "\n") and text.endswith(END + "\nafter\n") and "39 of 48" not in text
    n = int((pd.read_csv(TABLES / "slang_table2.csv")["verdict"] == "reproduced").sum())   # the committed table's
    assert "[slang_table2](tables/slang_table2.md)" in text and f"reproduced {n} of 48" in text
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "no markers\n"
    assert update_summaries(tables) == []                                     # nothing left to change
    assert "| [slang_table2](results/tables/slang_table2.md)" in summary_markdown(tables, "results/tables")


def _far_better_section() -> str:
    text = NOTES.read_text(encoding="utf-8")
    start = text.index("### Better than the paper by |z| > 4")
    return text[start:text.index("\n## ", start)]


def test_every_cell_better_by_more_than_four_z_is_explained_in_the_misses():
    """Each cell of the committed tables better than the paper by |z| > 4 has a line in results/README.md's misses,
    named ``experiment / data set / method (setting) / metric``, with the table's z; no line names another cell."""
    want = {cell_key(name, r): float(r["z"]) for name, _, df in _committed() for _, r in far_better(df).iterrows()}
    assert want, "no cell better by |z| > 4: drop this section"
    named = {}
    for line in _far_better_section().splitlines():
        m = re.match(r"\s+- `([^`]+)`: .*z = (-?[0-9.]+)\.$", line.replace("\u2212", "-"))
        if m:
            assert m.group(1) not in named, f"named twice: {m.group(1)}"
            named[m.group(1)] = float(m.group(2))
    assert sorted(set(want) - set(named)) == [], "better by |z| > 4 but not in results/README.md's misses"
    assert sorted(set(named) - set(want)) == [], "named in the misses but not better by |z| > 4 in the tables"
    for key, z in want.items():
        assert named[key] == pytest.approx(round(z, 1), abs=0.051), key
        assert math.isfinite(z) and abs(z) > FAR_Z


def test_bnnbench_table_rewrites_the_counts_of_the_checkouts_readmes(tmp_path, monkeypatch):
    """``bnnbench table X`` (``make tables``) into the checkout's results/tables rewrites both READMEs' counts from
    every table there; into another directory it leaves them alone."""
    from bnnbench.cli import main
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "runs").symlink_to(REPO / "results" / "runs")
    for f in TABLES.glob("*.csv"):
        for ext in ("csv", "md"):
            (tmp_path / "results" / "tables" / f"{f.stem}.{ext}").write_bytes(f.with_suffix(f".{ext}").read_bytes())
    typed = f"{BEGIN}\n39 of 48 reproduced or better\n{END}\n"
    for readme in (tmp_path / "README.md", tmp_path / "results" / "README.md"):
        readme.write_text("text\n" + typed, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert main(["table", "slang_table2", "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "text\n" + typed
    assert main(["table", "slang_table2"]) == 0
    for readme, link in ((tmp_path / "README.md", "results/tables"), (tmp_path / "results" / "README.md", "tables")):
        text = readme.read_text(encoding="utf-8")
        assert "39 of 48" not in text and f"| [slang_table2]({link}/slang_table2.md)" in text
        assert "**All tables: reproduced " in text
    assert stale_summaries(tmp_path / "results" / "tables") == []


def test_tables_and_figures_of_other_records_go_beside_them_not_over_the_committed_report(tmp_path, monkeypatch):
    """``bnnbench table X --runs-root R`` (and ``plot``, ``reproduce``) without ``--out`` writes into R/tables
    (R/figures): a run of one cell into a scratch root must not replace the committed table with "not run" cells
    nor rewrite the READMEs' counts."""
    import shutil
    from bnnbench.cli import main
    (tmp_path / "results" / "tables").mkdir(parents=True)
    (tmp_path / "results" / "runs").symlink_to(REPO / "results" / "runs")
    committed = {}
    for ext in ("csv", "md"):
        p = tmp_path / "results" / "tables" / f"slang_table2.{ext}"
        p.write_bytes((TABLES / f"slang_table2.{ext}").read_bytes())
        committed[p] = p.read_bytes()
    readme = tmp_path / "README.md"
    readme.write_text(f"text\n{BEGIN}\nas committed\n{END}\n", encoding="utf-8")
    committed[readme] = readme.read_bytes()
    mine = tmp_path / "mine"
    shutil.copytree(REPO / "results" / "runs" / "slang_table2" / "bbb" / "uci__yacht",
                    mine / "slang_table2" / "bbb" / "uci__yacht")
    monkeypatch.chdir(tmp_path)
    assert main(["table", "slang_table2", "--runs-root", str(mine)]) == 0
    assert main(["plot", "slang_table2", "--runs-root", str(mine)]) == 0
    assert {p: p.read_bytes() for p in committed} == committed
    import bnnbench.cli as cli
    monkeypatch.setattr(cli, "_reproduce_cell", lambda exp, root, ov, cores=None: "ok")   # no training here
    (mine / "tables" / "slang_table2.csv").unlink()
    assert main(["reproduce", "slang_table2", "--data", "uci/yacht", "--label", "bbb", "--runs-root", str(mine)]) == 0
    assert {p: p.read_bytes() for p in committed} == committed
    mine_table = (mine / "tables" / "slang_table2.csv").read_text(encoding="utf-8")
    assert mine_table != (TABLES / "slang_table2.csv").read_text(encoding="utf-8") and "not_run" in mine_table
    assert (mine / "figures" / "slang_table2_convergence.png").is_file()
    assert main(["table", "slang_table2"]) == 0             # the committed records still render into results/tables
    assert (tmp_path / "results" / "tables" / "slang_table2.csv").read_bytes() == committed[
        tmp_path / "results" / "tables" / "slang_table2.csv"]
