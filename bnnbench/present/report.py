"""``bnnbench report``: a self-contained static site of the results (``results/site/``), rendered from the records.

Pages: the front page (the leaderboard, every table with its count line and the count of all tables together, and
every figure); one page per paper table, its count line (reproduced N of M first, then better, worse, ...), its cells
coloured by verdict with the published number beside ours (the frame ``bnnbench table`` builds, recomputed from the
records); one page per figure; one page per run (each table cell links to the run behind it): per-split metrics,
the chosen hyper-parameters, the selection trace (best score so far per split, a plot), the convergence curves of
``history.json`` (a plot), wall time, versions, commit; and the report's notes (``results/README.md``: protocols,
deviations and misses), linked from every table page. Plots are matplotlib PNGs; no JavaScript, no network: the site
opens from the file system. Nothing on a page is typed by hand.
"""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

from bnnbench.run.results import load_history, load_record

CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #bbb;padding:3px 6px;text-align:right}th{background:#eee}td.l,th.l{text-align:left}
.reproduced{background:#d9f2d9}.better{background:#b3e6ff}.worse{background:#f7c6c6}.inconclusive{background:#fff0b3}
td:first-child{text-align:left}.not_run{background:#eee;color:#777}.unattributed{background:#f4f4f4;color:#777}pre{white-space:pre-wrap}
nav a{margin-right:1em}"""


def _page(title: str, body: str, depth: int, notes: bool = True) -> str:
    """A page of the site ``depth`` folders below its root; its navigation links the notes page where there is one."""
    up = "../" * depth
    notes_link = f"<a href=\"{up}notes.html\">notes (protocols, deviations, misses)</a>" if notes else ""
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><nav><a href=\"{up}index.html\">index</a>{notes_link}</nav>"
            f"<h1>{html.escape(title)}</h1>{body}</body></html>")


def _listing(heading: str, links: list[tuple]) -> list[str]:
    """A section of the front page: ``heading`` and a list of ``(href, text[, html after the link])`` links; nothing
    where there is none."""
    if not links:
        return []
    return [f"<h2>{_esc(heading)}</h2><ul>",
            *(f"<li><a href=\"{h}\">{_esc(t)}</a>{rest[0] if rest else ''}</li>" for h, t, *rest in links), "</ul>"]


def _esc(x) -> str:
    return html.escape(str(x))


def _fmt(x, se=None) -> str:
    try:
        if x != x:   # NaN
            return ""
        s = f"{float(x):.4g}"
        return s + (f" ± {float(se):.2g}" if se is not None and se == se else "")
    except (TypeError, ValueError):
        return _esc(x)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


class _Plots:
    """One matplotlib figure reused for every small plot (a new figure per run page would take most of the time)."""

    def __init__(self):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        self.plt = plt
        self.fig = plt.figure(figsize=(6.4, 2.6), dpi=72)
        self.fig.subplots_adjust(left=0.12, right=0.98, bottom=0.2, top=0.88)   # fixed: tight_layout costs 30%

    def lines(self, out: Path, series: list[tuple[str, list, list]], xlabel: str, ylabel: str, title: str) -> Path:
        self.fig.clf()
        ax = self.fig.add_subplot(111)
        for _, x, y in series:
            ax.plot(x, y, lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.fig.savefig(out, format="png")
        return out


def _run_page(site: Path, rel: str, rec: dict, hist: dict | None, plots: _Plots, notes: bool) -> None:
    path = site / "runs" / f"{rel}.html"
    depth = rel.count("/") + 1
    keys = [k for k in rec.get("metrics", [{}])[0] if k != "split"]
    body = [f"<p>method <b>{_esc(rec.get('method'))}</b>, data set <b>{_esc(rec.get('dataset'))}</b>, protocol "
            f"<b>{_esc(rec.get('protocol'))}</b>, seed {_esc(rec.get('seed'))}, device {_esc(rec.get('device'))}; "
            f"wall time {_fmt(rec.get('wall_time_s'))} s (selection {_fmt(rec.get('hpo_time_s'))} s); commit "
            f"{_esc(rec.get('git_commit'))}; versions {_esc(json.dumps(rec.get('versions', {})))}</p>",
            "<h2>Per-split metrics</h2><table><tr><th class=l>split</th>"
            + "".join(f"<th>{_esc(k)}</th>" for k in keys) + "</tr>"]
    for m in rec.get("metrics", []):
        body.append(f"<tr><td class=l>{_esc(m.get('split'))}</td>" + "".join(f"<td>{_fmt(m.get(k))}</td>"
                                                                           for k in keys) + "</tr>")
    body.append("<tr><th class=l>mean ± se</th>" + "".join(
        f"<th>{_fmt(rec['summary'][k]['mean'], rec['summary'][k]['stderr'])}</th>" if k in rec.get("summary", {})
        else "<th></th>" for k in keys) + "</tr></table>")
    hp = rec.get("hparams") or []
    if hp:
        hk = [k for k in hp[0] if k != "split"]
        body.append("<h2>Chosen hyper-parameters</h2><table><tr><th class=l>split</th>"
                    + "".join(f"<th>{_esc(k)}</th>" for k in hk) + "</tr>"
                    + "".join(f"<tr><td class=l>{_esc(h.get('split'))}</td>"
                              + "".join(f"<td>{_fmt(h.get(k))}</td>" for k in hk) + "</tr>" for h in hp) + "</table>")
    trace = rec.get("hpo_trace") or []
    if trace and isinstance(trace[0], list) and trace[0] and "score" in trace[0][0]:
        series = []
        for i, pts in enumerate(trace):
            best, ys = float("-inf"), []
            for p in pts:
                best = max(best, p["score"] if p["score"] == p["score"] else float("-inf"))
                ys.append(best)
            series.append((str(i), list(range(1, len(ys) + 1)), ys))
        img = plots.lines(site / "runs" / f"{rel}_selection.png", series, "candidate", "best score so far",
                          "hyper-parameter selection, one line per split")
        body.append(f"<h2>Selection trace</h2><img src=\"{img.name}\" alt=\"selection trace\">")
    if hist and hist.get("epochs"):
        for key in [k for k in hist["metrics"][0] if k in ("rmse", "accuracy", "nll", "train_objective")][:1]:
            series = [(str(s), hist["epochs"], [e[key][s] for e in hist["metrics"]])
                      for s in range(len(hist["metrics"][0][key]))]
            img = plots.lines(site / "runs" / f"{rel}_{key}.png", series, "epoch", key,
                              f"{key} during training, one line per split")
            body.append(f"<h2>Convergence: {_esc(key)}</h2><img src=\"{img.name}\" alt=\"{_esc(key)}\">")
    _write(path, _page(f"{rec.get('method')} on {rec.get('dataset')} ({rel})", "\n".join(body), depth, notes))


def readme_text(results: Path) -> str:
    p = Path(results) / "README.md"
    return p.read_text(encoding="utf-8") if p.exists() else ""


def _misses(readme: str) -> list[tuple[str, str]]:
    """``(anchor, title)`` of each miss or deviation bullet (``* **title**``) of results/README.md, in order."""
    return [(f"note-{i}", t.lower()) for i, t in enumerate(_bullet_titles(readme))]


def _bullet_titles(readme: str) -> list[str]:
    import re
    return [" ".join(m.group(1).split()) for m in re.finditer(r"^\* \*\*(.+?)\*\*", readme, flags=re.M | re.S)]


def _notes_html(readme: str) -> str:
    """results/README.md as preformatted text, each ``* **title**`` bullet an anchor the table cells link to."""
    out, i = [], 0
    for line in readme.splitlines():
        if line.startswith("* **"):   # as _bullet_titles counts them: a title may close on a later line
            out.append(f'<span id="note-{i}"></span>')
            i += 1
        out.append(_esc(line))
    return "<pre>" + "\n".join(out) + "</pre>"


def _note_of(spec: dict, row: dict, misses: list[tuple[str, str]]) -> str | None:
    """The README bullet about a cell: its title names the paper's table, the data set and the method."""
    paper = {"slang": "slang", "vadam": "vadam", "nng": "nng", "gi": "app. g"}.get(str(spec.get("paper")), "")
    table = str(spec.get("table") or "").split(" (")[0].lower()
    where = f"{paper} {table}".strip()
    ds, method = str(row["dataset"]).replace("_", " ").lower(), str(row["method"]).lower()
    methods = {str(m.get("paper_method", k)).lower() for k, m in (spec.get("methods") or {}).items()
               if isinstance(m, dict)}
    for anchor, title in misses:
        if not (where and where in title and ds in title):
            continue
        rest = title.replace(where, " ")
        named = {m for m in methods if m in rest}
        if method in named or not named:   # a bullet that names no column concerns the whole data set
            return anchor
    return None


def _table_page(site: Path, exp: str, spec: dict, df, runs_root: Path, misses: list[tuple[str, str]],
                notes: bool) -> dict:
    """Write the table's page; returns its counts (:func:`bnnbench.judge.counts.tally`)."""
    from bnnbench.judge.counts import count_line, method_line, tally
    from bnnbench.present.render import COUNT_NOTE
    from bnnbench.run.results import run_dir
    counts = tally(df)
    line = count_line(counts)
    see = " Verdict rule, protocols, deviations and misses: <a href=\"../notes.html\">notes</a>." if notes else ""
    rows = [f"<p class=counts><b>{_esc(line)}</b><br>{_esc(method_line(df))}<br>{_esc(COUNT_NOTE)}</p>",
            "<p>Generated from the run records by the code of <code>bnnbench table</code>. "
            f"{_esc(spec.get('title', exp))}.{see}</p><table><tr><th class=l>data set</th><th class=l>metric</th>"
            "<th class=l>method</th><th>ours</th><th>paper</th><th>verdict</th><th class=l>run</th></tr>"]
    for r in df.to_dict("records"):
        label, ds = r.get("selected") or r.get("our_method"), r.get("our_dataset")
        column = (spec.get("methods") or {}).get(r.get("our_method")) or {}
        rec_dir = run_dir(runs_root, column.get("runs_of", exp) if isinstance(column, dict) else exp, str(label),
                          str(ds))
        rel = str(rec_dir.relative_to(runs_root))
        link = f"<a href=\"../runs/{_esc(rel)}.html\">{_esc(rel)}</a>" if (rec_dir / "record.json").exists() else ""
        paper = r.get("paper_printed") if r.get("paper_printed") == r.get("paper_printed") else r.get("paper")
        err = r.get("paper_err_printed")
        paper_s = f"{_esc(paper)}" + (f" ± {_esc(err)}" if err == err and err not in (None, "") else "")
        note = _note_of(spec, r, misses)
        verdict = _esc(r["verdict"]) + (f" (<a href=\"../notes.html#{note}\">why</a>)" if note else "")
        rows.append(f"<tr class=\"{_esc(r['verdict'])}\"><td class=l>{_esc(r['dataset'])}</td>"
                    f"<td class=l>{_esc(r['metric'])}</td><td class=l>{_esc(r['method'])} {_esc(r['setting'])}</td>"
                    f"<td>{_fmt(r['ours'], r['ours_se'])}</td><td>{paper_s}</td><td>{verdict}</td>"
                    f"<td class=l>{link}</td></tr>")
    rows.append("</table>")
    _write(site / "tables" / f"{exp}.html", _page(spec.get("title", exp), "\n".join(rows), 1, notes))
    return counts


def build_site(results: Path, out: Path) -> list[Path]:
    """Render ``results/`` (tables/, figures/, runs/, README.md) into the static site ``out``; returns its pages."""
    from bnnbench.run.config import experiment_spec, list_names
    from bnnbench.judge.leaderboard import build_leaderboard, render_leaderboard
    from bnnbench.judge.tables import build_table
    results, out = Path(results), Path(out)
    runs_root = results / "runs"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    plots = _Plots()
    readme = readme_text(results)
    misses = _misses(readme)
    notes = bool(readme.strip())
    tables, front = [], ""
    for exp in list_names("experiment"):
        if not (results / "tables" / f"{exp}.csv").exists():
            continue
        spec = experiment_spec(exp)
        if spec.get("leaderboard"):   # the one marked ``front`` (the UCI board) is the front page; others have a page
            html = _md_table_to_html(render_leaderboard(build_leaderboard(spec, runs_root), spec))
            if spec["leaderboard"].get("front"):   # with its critical-difference diagram (bnnbench plot)
                cd = results / "figures" / f"{exp}_cd.png"
                front = html + (f"\n<p><img src=\"figures/{cd.name}\" alt=\"critical-difference diagram\"></p>"
                                if cd.exists() else "")
            else:
                _write(tmp / "tables" / f"{exp}.html", _page(spec.get("title", exp), html, 1, notes))
                tables.append((exp, spec.get("title", exp), None))
            continue
        counts = _table_page(tmp, exp, spec, build_table(spec, runs_root), runs_root, misses, notes)
        tables.append((exp, spec.get("title", exp), counts))
    for rec_path in sorted(runs_root.glob("*/*/*/record.json")):
        rec = load_record(rec_path.parent)
        if rec is not None:
            _run_page(tmp, str(rec_path.parent.relative_to(runs_root)), rec, load_history(rec_path.parent), plots,
                      notes)
    figures = []
    for png in sorted((results / "figures").glob("*.png")):
        (tmp / "figures").mkdir(exist_ok=True)
        shutil.copy(png, tmp / "figures" / png.name)
        _write(tmp / "figures" / f"{png.stem}.html",
               _page(png.stem, f"<img src=\"{png.name}\" alt=\"{png.stem}\">", 1, notes))
        figures.append(png.stem)
    if notes:
        _write(tmp / "notes.html", _page("Notes: protocols, deviations, misses (results/README.md)",
                                         _notes_html(readme), 0))
    from bnnbench.judge.counts import FAR_Z, add_tallies, count_line
    body = [front or "<p>No leaderboard records yet.</p>"]
    judged = [c for _, _, c in tables if c]
    if judged:
        see = " (a cell better by |z| &gt; {:g} is a discrepancy{})".format(
            FAR_Z, ", explained in the <a href=\"notes.html\">notes</a>" if notes else "")
        body.append(f"<p><b>All tables: {_esc(count_line(add_tallies(judged), percent=True))}</b>. Reproduced is the "
                    f"headline: the cells better than the paper are beside it, not in it{see}.</p>")
    body += [*_listing("Paper tables", [(f"tables/{e}.html", t, f": <b>{_esc(count_line(c))}</b>" if c else "")
                                        for e, t, c in tables]),
             *_listing("Figures", [(f"figures/{f}.html", f) for f in figures])]
    if not (tables or figures):
        body.append(f"<p>No tables or figures yet under {_esc(results)}: <code>bnnbench reproduce &lt;experiment&gt;"
                    "</code> runs an experiment's cells and writes them, then <code>bnnbench report</code> again.</p>")
    _write(tmp / "index.html", _page("bnnbench results", "\n".join(body), 0, notes))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return sorted(out.rglob("*.html"))


def _md_table_to_html(md: str) -> str:
    """The leaderboard's Markdown (headings, paragraphs, pipe tables, **bold**, *italics*, `code`) as HTML."""
    import re
    out, in_table = [], False
    for line in md.splitlines():
        bold = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", _esc(line))
        bold = re.sub(r"`(.+?)`", r"<code>\1</code>", re.sub(r"\*(.+?)\*", r"<i>\1</i>", bold))
        if line.startswith("|"):
            cells = [c.strip() for c in bold.strip("|").split("|")]
            if set("".join(cells)) <= set("-: "):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("## "):
            out.append(f"<h2>{bold[3:]}</h2>")
        elif line.startswith("# "):
            out.append(f"<h2>{bold[2:]}</h2>")
        elif line.strip():
            out.append(f"<p>{bold}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)
