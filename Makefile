# bnnbench: two set-up commands, `make install` then `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
BNN     = $(VENV)/bin/bnnbench
TORCH  ?= torch==2.13.0
RUNS   ?= results/runs
TABLES_OUT ?= $(if $(filter results/runs results/runs/,$(RUNS)),results/tables,$(RUNS)/tables)   # tables of records elsewhere go beside them, not over the committed ones
EXPERIMENTS ?= slang_table1 slang_table2 vadam_table1 nng_table1 nng_table4 nng_table3 gi_fig1 gi_fig2 gi_tableG uci_leaderboard uci_leaderboard_x2 uci_leaderboard_x4 cls_leaderboard
TABLES ?= slang_table1 slang_table2 vadam_table1 nng_table1 nng_table4 nng_table3 gi_tableG slang_table3 uci_leaderboard uci_leaderboard_x2 uci_leaderboard_x4 cls_leaderboard   # MNIST's cells are GPU work (device=cuda) or, on a CPU, protocol=slang_mnist_50k
JOBS   ?= 1
LAUNCHER ?=        # e.g. joblib, submitit_slurm: each cell one job through Hydra's launcher (docs/cluster.md)
LAUNCHER_ARGS ?=   # e.g. --partition gpu --time 60 --cpus 2
ARGS   ?=
OVERRIDES ?=       # e.g. compile=true: Hydra overrides for every cell of reproduce-tables (with RUNS=<a fresh runs root>)
PYTEST_ARGS ?=

.PHONY: install test test-e2e test-slow test-all lint data reproduce-tables tables report bench gpu-queue regression clean

install:  ## virtual environment in .venv with bnnbench (editable), the test tools and ruff
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q --no-deps laplace-torch==0.3 backpack-for-pytorch==1.7.1 curvlinops-for-pytorch==3.0.1   # pyproject.toml: laplace
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q -e "examples/my_method[test]"   # the bring-your-own-method example (IVON) and its test

test:  ## fast tests, a process per core (about 1.5 min on 2 cores; end-to-end runs and the check of every committed record: make test-e2e; long: make test-slow)
	$(PY) -m pytest -n auto

test-e2e:  ## end-to-end runs through the CLI, reproduce and worker processes
	$(PY) -m pytest -m e2e

test-slow:  ## long-running checks (the MNIST one is most of it)
	$(PY) -m pytest -m slow

test-all:  ## every test: fast, e2e and slow (what CI runs; under CI=true a skip fails, except the CUDA tests)
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

lint:  ## ruff check and the layer contract (lint-imports; both configured in pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

data:  ## fetch, verify and convert every data set (BNNBENCH_MIRROR=<dir> to copy from a mirror)
	$(BNN) data fetch all

reproduce-tables:  ## run every missing cell of the paper tables, then write results/tables/ and the READMEs' generated counts (RUNS=<elsewhere>: <RUNS>/tables, the committed ones untouched); LAUNCHER=joblib|submitit_slurm: one job per cell
	for e in $(EXPERIMENTS); do $(BNN) reproduce $$e progress=false $(OVERRIDES) --jobs $(JOBS) --runs-root $(RUNS) --out $(TABLES_OUT) $(if $(strip $(LAUNCHER)),--launcher $(strip $(LAUNCHER)) $(LAUNCHER_ARGS)) || exit 1; done

tables:  ## re-render results/tables/ from the records in results/runs (no training), and the generated counts of README.md and results/README.md
	for e in $(TABLES); do $(BNN) table $$e --runs-root $(RUNS) --out $(TABLES_OUT) || exit 1; done

report:  ## the static site of the results, from the records: results/site/index.html (no server, no network)
	$(BNN) report

bench:  ## performance benchmarks (ratios measured in one run)
	$(PY) bench/replica_axis.py
	$(PY) bench/step_ratios.py
	$(PY) bench/mnist_epoch.py
	$(PY) bench/uci_run_times.py
	$(PY) bench/logreg_table1.py
	$(PY) bench/threads_contention.py
	$(PY) bench/hmc_leapfrog.py
	$(PY) bench/gi_uci_step_ratios.py
	$(PY) bench/gi_step_ratios.py

# `+` runs the line under make -n / --dry-run too, where it adds --dry-run: the queue is listed, nothing runs
gpu-queue:  ## the cells only a GPU can run, most valuable first, each resumable (bench/gpu_queue.py): `make gpu-queue --dry-run` (or ARGS=--dry-run) lists them with CPU costs and expected GPU times; ARGS="--budget 600 --fill", "--only slang_L1", "--tiny" (tiny settings on a CPU)
	+$(PY) bench/gpu_queue.py $(ARGS) $(if $(findstring n,$(firstword -$(MAKEFLAGS))),--dry-run)

regression:  ## CI: re-run the short cells of the paper tables with their records' configurations; fail on any moved number
	$(BNN) regression --results results --runs-root $${TMPDIR:-/tmp}/bnnbench-regression $(ARGS)

clean:
	rm -rf runs outputs multirun .pytest_cache
