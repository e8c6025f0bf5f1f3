"""The folder tree is the pipeline: ``bnnbench/`` holds the layers core <- methods <- run <- judge <- present beside
``cli.py``; each imports only the layers below it (the import-linter contract of pyproject.toml, which ``make lint``
also runs) and no module imports itself through a chain of others (at module level or inside a function)."""

from pathlib import Path

import grimp
import pytest

import bnnbench

PACKAGE = Path(bnnbench.__file__).parent
ROOT = PACKAGE.parent
LAYERS = ("core", "methods", "run", "judge", "present")


def test_the_package_holds_the_layer_folders_beside_the_command_line():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == {*LAYERS, "cli.py", "__init__.py", "__main__.py"}
    assert all((PACKAGE / layer / "__init__.py").is_file() for layer in LAYERS)


def test_each_layer_imports_only_the_layers_below_it():
    lint_imports = pytest.importorskip("importlinter.cli").lint_imports
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_a_layer_that_imports_one_above_it_breaks_the_contract():
    """The contract can fail: an import of ``judge`` into ``core`` (added to the graph) is found."""
    graph = grimp.build_graph("bnnbench")
    graph.add_import(importer="bnnbench.core.metrics", imported="bnnbench.judge.verdicts")
    illegal = graph.find_illegal_dependencies_for_layers(layers=("bnnbench.cli", *(f"bnnbench.{x}" for x in
                                                                                   reversed(LAYERS))))
    assert {(d.importer, d.imported) for d in illegal} == {("bnnbench.core", "bnnbench.judge")}


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("bnnbench")
    cycles = sorted((m, b) for m in graph.modules for b in graph.find_modules_directly_imported_by(m)
                    if graph.chain_exists(importer=b, imported=m))
    assert cycles == []


def test_the_tests_mirror_the_layers():
    """A layer's tests in ``tests/<layer>/``; those of the command line and the whole package in ``tests/``."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders == set(LAYERS)
    assert all(any((ROOT / "tests" / layer).glob("test_*.py")) for layer in LAYERS)
