"""``bnnbench report``: the static site from a few committed records, opened in headless Chromium: every page loads
without console errors or missing files, every link and image resolves, and a screenshot of the index shows its
table."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from bnnbench.present.report import build_site
from datapaths import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
RES = REPO / "results"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A results/ of NNG Table 4's committed records and one figure, with a two-method leaderboard of records and its
    critical-difference diagram."""
    root = tmp_path_factory.mktemp("results")
    shutil.copy(RES / "README.md", root / "README.md")
    (root / "tables").mkdir()
    for ext in ("csv", "md"):
        shutil.copy(RES / "tables" / f"nng_table4.{ext}", root / "tables" / f"nng_table4.{ext}")
    shutil.copytree(RES / "runs" / "nng_table4", root / "runs" / "nng_table4")
    (root / "figures").mkdir()
    shutil.copy(RES / "figures" / "gi_fig1_predictive.png", root / "figures")
    rng = np.random.default_rng(0)
    for m in ("map", "bbb"):
        for ds in ("boston", "concrete", "energy", "wine", "yacht"):
            d = root / "runs" / "uci_leaderboard" / m / f"uci__{ds}"
            d.mkdir(parents=True)
            rows = [{"split": str(i), "loglik_pointwise": float(v), "rmse": float(-v)}
                    for i, v in enumerate(rng.normal(size=20) + (m == "bbb"))]
            (d / "record.json").write_text(json.dumps({"status": "ok", "method": m, "dataset": f"uci/{ds}",
                                                       "metrics": rows, "summary": {}}))
    (root / "tables" / "uci_leaderboard.csv").write_text("metric\n")
    from bnnbench.present.plots import critical_difference_figure
    from bnnbench.run.config import experiment_spec
    assert critical_difference_figure(experiment_spec("uci_leaderboard"), root / "runs",
                                      root / "figures" / "uci_leaderboard_cd.png") is not None
    # a second leaderboard (not the open one): a page of its own, the front page stays the UCI one
    shutil.copytree(RES / "runs" / "nng_mnist_conv", root / "runs" / "nng_mnist_conv")
    (root / "tables" / "nng_mnist_conv.csv").write_text("metric\n")
    out = root / "site"
    pages = build_site(root, out)
    return out, pages


def test_every_link_and_image_resolves(site):
    out, pages = site
    assert (out / "index.html") in pages and (out / "tables" / "nng_table4.html") in pages and len(pages) > 20
    for page in pages:
        text = page.read_text()
        for ref in re.findall(r'(?:href|src)="([^"]+)"', text):
            assert not ref.startswith(("http:", "https:", "//")), (page, ref)   # nothing from the network
            path, _, anchor = ref.partition("#")
            assert (page.parent / path).resolve().exists(), (page, ref)
            if anchor:   # a link to a note: the anchor is on the notes page
                assert f'id="{anchor}"' in (page.parent / path).resolve().read_text(), (page, ref)
    table = (out / "tables" / "nng_table4.html").read_text()
    assert 'class="reproduced"' in table and "../runs/nng_table4/" in table and "notes.html" in table
    assert "reproduced 21 of 32; better 11 (|z| &gt; 4: 1); worse 0" in table   # the count line, reproduced first
    assert "notes.html#note-" in table   # the cell better by |z| > 4 links to the miss that explains it
    conv = (out / "tables" / "nng_mnist_conv.html").read_text()
    assert "Claims checked" in conv and "noisy K-FAC (NNG-MVG)" in conv
    index = (out / "index.html").read_text()
    assert "The leaderboard" in index and 'href="tables/nng_mnist_conv.html"' in index
    assert '<img src="figures/uci_leaderboard_cd.png"' in index   # the critical-difference diagram on the front page
    assert "All tables: reproduced 21 of 32 (66%); better 11 (|z| &gt; 4: 1); worse 0" in index


def _chromium(*args):
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (.ci/run installs Debian's package)")
def test_pages_load_in_a_browser_without_errors_and_the_index_shows_its_table(site, tmp_path):
    out, pages = site
    assert len(pages) < 80   # every page of this small site is opened (0.5-1 s each)
    for page in pages:
        res = _chromium("--dump-dom", page.as_uri())
        errors = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "ERR_FILE_NOT_FOUND" in ln]
        assert res.returncode == 0 and not errors, (page, errors)
        assert "</h1>" in res.stdout, page
    dom = _chromium("--dump-dom", (out / "index.html").as_uri()).stdout
    assert "<table>" in dom and "Wilcoxon" in dom
    shot = tmp_path / "index.png"
    _chromium(f"--screenshot={shot}", "--window-size=1200,900", "--hide-scrollbars", (out / "index.html").as_uri())
    import matplotlib.image
    img = matplotlib.image.imread(shot)[..., :3]
    assert img.std() > 0.05                                        # not blank
    border = (np.abs(img - 0xbb / 255).max(-1) < 0.03)             # the tables' cell borders (#bbb)
    assert border.sum() > 2000 and border.any(1).sum() > 20        # a grid of them: the leaderboard is on screen


def test_a_cell_links_to_the_note_that_concerns_it():
    from bnnbench.present.report import _misses, _note_of, _notes_html
    readme = ("x\n* **SLANG Table 2, BBB on yacht (RMSE and LL worse).** text\n"
              "* **SLANG Table 2 / Vadam Table 1, Dropout on\n  concrete (worse).** more\n")
    misses = _misses(readme)
    # every bullet's anchor is on the notes page, a title over two lines too (it had none: later links were off by one)
    assert [f'id="{a}"' in _notes_html(readme) for a, _ in misses] == [True, True]
    spec = {"paper": "slang", "table": "Table 2", "methods": {"bbb": {"paper_method": "BBB"},
                                                            "slang": {"paper_method": "SLANG"},
                                                            "mc_dropout": {"paper_method": "Dropout"}}}
    assert _note_of(spec, {"dataset": "yacht", "method": "BBB"}, misses) == "note-0"
    assert _note_of(spec, {"dataset": "yacht", "method": "SLANG"}, misses) is None        # the bullet names BBB
    assert _note_of(spec, {"dataset": "concrete", "method": "Dropout"}, misses) == "note-1"   # over two lines
    assert _note_of({**spec, "table": "Table 1"}, {"dataset": "yacht", "method": "BBB"}, misses) is None
