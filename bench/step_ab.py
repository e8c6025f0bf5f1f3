"""A/B of each UCI method's training step against an older commit's code, in one run (issue 31, section 2).

Issue 31's targets are ratios against the code of 5c21305 (before the ``compile`` setting and the later speed work):
the step of a selection round of BBB, VOGN, Vadam, SLANG L = 1, noisy Adam, noisy K-FAC, MC dropout and App. G's
factorised and global-inducing families at least 2.5x faster, one thread. This script times both codes' steps on the
same core in the same minutes: it checks the old commit out into a git worktree (``--base``, once; kept under the
system's temporary folder) and starts one child process per code, each importing its own ``bnnbench`` (the old tree on
``PYTHONPATH``; module paths of either layout) and building the same cases: Boston, each method at the protocol that
selects or trains it (``bench/step_profile.py``'s table; App. G's families at ``gi_uci``), R = 100 replicas (a
Bayesian-optimisation round: 20 splits x 5 folds) and R = 20 (a final run), float32, the engine's own minibatches and
``update`` (draws included), one intra-op thread each. The parent then asks the children for timings in turns
(old, new, old, new, ... a configuration at a time), so a change of load on this shared machine hits both alike, and
prints medians and the ratio old / new. It also times the new side's draws alone (``Method.noise``, the same random
numbers in both codes and in every run of a record's configuration): ``old/draws`` is the most any step that keeps
them can gain.

The new side runs each step as a run of this code with ``compile=true`` would (``run.compiled.compiled_update``: the
whole step compiled for a ``compilable`` method, eagerly otherwise), and, with ``--eager``, also as ``compile=false``.
The compilation is done before the clock starts (it is reported once: it counts in a run's wall time, see
``bench/suite_cost.py``).

    PYTHONPATH=. taskset -c 0 python bench/step_ab.py [--base 5c21305] [--methods bbb,vogn] [--replicas 100,20]
        [--rounds 7] [--eager] [--base-compiled] [--data uci/kin8nm] [--protocol vadam_uci]

``--methods pbp`` times PBP (under ``nng_uci``), ``--methods noisy_kfac_blktri`` NNG Table 4's BlkTri (``nng_small``,
``--replicas 10``: its trials) and ``--methods map,deep_ensemble,swag,laplace,laplace_ll,vprop`` the boards' other
compilable methods (under ``leaderboard_uci``); they are not in the default set. BlkTri, deep ensembles, SWAG and the
Laplace methods do not exist at 5c21305: time them against this code's eager step (``--base HEAD``): the ratio is
then what compiling saves against today's eager step, not against the code that made their records.

``--rng philox`` runs the new code's steps with ``rng=philox`` (``core/prng.py``: counter-based draws; its rows carry
``"rng": "philox"``; ``bench/projection.py --rng philox`` uses them).

``--set KEY=VALUE`` overrides a setting of every case on both sides (SLANG's large sets at the authors' code's
minibatch of 10: ``--set protocol.sizes.large.batch_size=10``); the rows carry it, and ``bench/projection.py``, which
times cells by their own configuration, leaves them out.

``--data`` runs every case on another data set at its protocol's settings for it (SLANG's selection on kin8nm, power
and naval: minibatch 100, 2 samples and the authors' Nystrom eigensolver), ``--protocol`` under another protocol (BBB
as Vadam Table 1 or NNG Table 1 select it).

Needs the data mirror (``BNNBENCH_MIRROR``) and git.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [  # label, method, protocol
    ("BBB", "bbb", "slang_uci"),
    ("VOGN", "vogn", "vadam_uci"),
    ("Vadam", "vadam", "vadam_uci"),
    ("SLANG L=1", "slang", "slang_uci"),
    ("noisy Adam", "noisy_adam", "nng_uci"),
    ("noisy K-FAC", "noisy_kfac", "nng_uci"),
    ("MC dropout", "mc_dropout", "gal_uci"),
    ("App. G fac", "fac", "gi_uci"),
    ("App. G gi", "gi", "gi_uci"),
    ("App. G li", "li", "gi_uci"),
    ("App. G fac_gi", "fac_gi", "gi_uci"),
]
EXTRA_CASES = [  # timed only when --methods names them: PBP (NNG Tables 1, 3, 4), the boards' other compilable methods
    # (BlkTri, deep ensembles, SWAG and the Laplace methods came after 5c21305: --base HEAD, this code's eager step)
    ("PBP", "pbp", "nng_uci"),
    ("NNG-BlkTri", "noisy_kfac_blktri", "nng_small"),
    ("MAP", "map", "leaderboard_uci"),
    ("deep ensemble", "deep_ensemble", "leaderboard_uci"),
    ("SWAG", "swag", "leaderboard_uci"),
    ("Laplace", "laplace", "leaderboard_uci"),
    ("last-layer Laplace", "laplace_ll", "leaderboard_uci"),
    ("Vprop", "vprop", "leaderboard_uci"),
]
REPO = Path(__file__).resolve().parent.parent
GRID_PROTOCOLS = ("gal_uci", "leaderboard_uci", "leaderboard_cls")   # select by a grid (a run says hpo=grid)


# ----------------------------------------------------------------------------------------------------- child side

def _api():
    """The functions a case needs, from either package layout (the layered one since 9ce139e, the flat one before).

    The layout is read from the tree, not by trying imports: an editable install's import hook would find the new
    tree's ``bnnbench.core`` for an old tree that lacks it."""
    import bnnbench
    if (Path(bnnbench.__file__).parent / "core").is_dir():
        from bnnbench.core.data import load_dataset
        from bnnbench.run.config import CommandLine, compose
        from bnnbench.run.engine import epoch_batches, make_batch
        from bnnbench.run.fit import FitOptions, program
        from bnnbench.run.protocol import resolve
    else:
        from bnnbench.config import CommandLine, compose
        from bnnbench.data import load_dataset
        from bnnbench.engine import epoch_batches, make_batch
        from bnnbench.fit import FitOptions, program
        from bnnbench.protocol import resolve
    return load_dataset, CommandLine, compose, epoch_batches, make_batch, FitOptions, program, resolve


def cv_pairs(ds, R: int, folds: int = 5):
    """``R`` (train, eval) row sets of a UCI set: the 20 splits (R <= 20) or each split's 5 CV folds (R = 100)."""
    import numpy as np
    splits = [(s.train, s.test) for s in ds.splits]
    if R <= len(splits):
        return splits[:R]
    rng = np.random.default_rng(123)
    pairs = []
    for train, _ in splits:
        for chunk in np.array_split(rng.permutation(train), folds):
            pairs.append((np.setdiff1d(train, chunk), np.sort(chunk)))
    if len(pairs) < R:
        raise ValueError(f"at most {len(pairs)} replicas")
    return pairs[:R]


class Timed:
    """A case's stepping loop: ``update`` over its cycle of minibatches ``batches`` from ``state`` (``k`` steps so
    far), and its timing (also bench/step_profile.py's and bench/compile_step.py's cases)."""

    def step(self):
        self.state, _ = self.update(self.state, self.batches[self.k % len(self.batches)], self.g)
        self.k += 1

    def time_ms(self, n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            self.step()
        return (time.perf_counter() - t) / n * 1e3

    def draws_ms(self, n: int) -> float:
        """ms per step of the step's draws alone (``Method.noise``: the same numbers whatever the code around them)."""
        batch = self.batches[self.k % len(self.batches)]
        t = time.perf_counter()
        for _ in range(n):
            self.method.noise(self.state, batch, self.g)
        return (time.perf_counter() - t) / n * 1e3


class Stepper(Timed):
    """One case of one code: its method, state, minibatches and update (eager or compiled)."""

    def __init__(self, name, proto, R, compiled: bool, data: str = "uci/boston", overrides=()):
        import torch
        load_dataset, CommandLine, compose, epoch_batches, make_batch, FitOptions, program, resolve = _api()
        ds = load_dataset(data)
        ov = [f"method={name}", f"data={data}", f"protocol={proto}"] + (["hpo=grid"] if proto in GRID_PROTOCOLS else [])
        ov += list(overrides)
        spec = resolve(compose(ov), CommandLine.parse(ov), meta=ds.meta)
        pairs = cv_pairs(ds, R)
        hp = [dict(spec.fixed)] * R
        opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32)
        self.method, data, problem = program(spec, ds, pairs, list(range(R)), hp, opts)
        self.g = torch.Generator().manual_seed(0)
        self.state = self.method.init(problem, self.g)
        self.replica_data = data   # the minibatches' source (bench/epoch_overhead.py)
        self.batches = [make_batch(data, rows) for rows in epoch_batches(data, spec.batch_size, self.g)]
        self.update = self.method.update
        self.compiled = False
        t = time.perf_counter()
        if compiled:
            from bnnbench.run.compiled import compiled_update
            self.update = compiled_update(self.method)
            self.compiled = self.update != self.method.update
        self.k = 0
        self.step()
        self.step()
        self.compile_s = time.perf_counter() - t if self.compiled else 0.0


def isolate_tree() -> None:
    """Let this process import the ``bnnbench`` on ``PYTHONPATH`` (an old tree) as it is: no plugin methods of this
    environment (built for this tree's interface, not the old one's), no editable-install hook (it would resolve
    modules the old tree lacks to this tree's)."""
    import importlib.metadata
    entry_points = importlib.metadata.entry_points
    importlib.metadata.entry_points = lambda **kw: [] if kw.get("group") == "bnnbench.methods" else entry_points(**kw)
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]


def _mkl_any_vendor() -> bool:
    """Whether this child's MKL dispatches by instruction set alone (a code without ``mkl_vendor``: no)."""
    try:
        from bnnbench.core.linalg import mkl_vendor
    except ImportError:
        return False
    return mkl_vendor.active()


def child(args):
    """Build the cases, say so on stdout, then answer ``index n`` lines with the ms per step of ``n`` steps."""
    import bnnbench   # noqa: F401  (before torch: BNNBENCH_MKL_ANY_VENDOR acts there)
    import torch
    isolate_tree()
    torch.set_num_threads(1)
    keys = json.loads(args.cases)
    if args.rng != "torch":   # the new code alone is given --rng: it has core/prng.py
        from bnnbench.core import prng
        prng._MODE.set(args.rng)
    steppers = []
    for name, proto, R, compiled in keys:
        s = Stepper(name, proto, R, compiled, args.data, json.loads(args.set[0]) if args.set else [])
        steppers.append(s)
        print(json.dumps({"built": len(steppers) - 1, "compiled": s.compiled, "compile_s": s.compile_s,
                          "ms": s.time_ms(2), "mkl_any_vendor": _mkl_any_vendor()}), flush=True)
    for line in sys.stdin:
        i, n, what = line.split()
        s = steppers[int(i)]
        print(json.dumps({"ms": (s.draws_ms if what == "draws" else s.time_ms)(int(n))}), flush=True)


# ---------------------------------------------------------------------------------------------------- parent side

def _head() -> str:
    """This tree's commit, ``-dirty`` with uncommitted changes (they are what was measured) outside results/speed/,
    where this script's own rows go (an earlier case's row leaves the code clean)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results/speed")
    return git("rev-parse", "--short=7", "HEAD") + ("-dirty" if dirty else "")


def worktree(base: str) -> Path:
    """The old commit checked out (once) into a detached worktree under the temporary folder."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", base], capture_output=True, text=True,
                         check=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"bnnbench_ab_{sha[:12]}"
    if not (path / "bnnbench").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-f", "--detach", str(path), sha], check=True,
                       capture_output=True)
    return path


class Child:
    def __init__(self, tree: Path, keys, data: str, extra_env: dict | None = None, rng: str = "torch",
                 overrides=()):
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **(extra_env or {}))
        self.p = subprocess.Popen([sys.executable, __file__, "--child", "--cases", json.dumps(keys), "--data", data,
                                   "--rng", rng, "--set", json.dumps(list(overrides))],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(tree))
        self.built = [json.loads(self.p.stdout.readline()) for _ in keys]

    def ms(self, i: int, n: int, what: str = "step") -> float:
        self.p.stdin.write(f"{i} {n} {what}\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())["ms"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--base", default="5c21305", help="the old code's commit (default: issue 31's 5c21305)")
    ap.add_argument("--methods", help="comma-separated method names (default: every case)")
    ap.add_argument("--replicas", default="100,20")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="append each case's medians to this JSON-lines file (bench/projection.py reads "
                                   "them)")
    ap.add_argument("--protocol", help="the protocol of every chosen case instead of its own (BBB's selection in "
                                       "Vadam Table 1: vadam_uci; in NNG Table 1: nng_uci)")
    ap.add_argument("--data", default="uci/boston",
                    help="the data set of every case (its protocol's settings for it: SLANG's selection on kin8nm, "
                         "power and naval uses the authors' Nystrom eigensolver, eig: nystrom)")
    ap.add_argument("--target-ms", type=float, default=200.0, help="time per configuration and round")
    ap.add_argument("--eager", action="store_true", help="also time the new code's eager step")
    ap.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable of the new code's processes only, e.g. BNNBENCH_MKL_ANY_VENDOR=1 "
                         "(MKL's kernels by instruction set: core/linalg/mkl_vendor); repeatable")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a configuration override of every case on both sides, as a run's command line takes it, "
                         "e.g. protocol.sizes.large.batch_size=10; repeatable (its rows carry them: "
                         "bench/projection.py leaves such rows out)")
    ap.add_argument("--rng", default="torch", choices=["torch", "philox"],
                    help="the new code's draws (core/prng.py; the old code's are torch's)")
    ap.add_argument("--base-compiled", action="store_true",
                    help="run the old code's step compiled too (a base that has the compile setting): A/B of two "
                         "compiled codes")
    args = ap.parse_args()
    if args.child:
        return child(args)
    overrides = args.set
    chosen = set(args.methods.split(",")) if args.methods else None
    pool = CASES + [c for c in EXTRA_CASES if chosen is not None and c[1] in chosen]
    cases = [(label, name, args.protocol or proto, int(R)) for label, name, proto in pool
             if chosen is None or name in chosen for R in args.replicas.split(",")]
    base_tree = worktree(args.base)
    new_env = dict(kv.split("=", 1) for kv in args.new_env)
    sides = {"old": Child(base_tree, [(n, p, R, args.base_compiled) for _, n, p, R in cases], args.data,
                          overrides=overrides),
             "new": Child(REPO, [(n, p, R, True) for _, n, p, R in cases], args.data, new_env, args.rng, overrides)}
    if args.eager:
        sides["new eager"] = Child(REPO, [(n, p, R, False) for _, n, p, R in cases], args.data, new_env, args.rng,
                                   overrides)
    inner = [max(2, int(args.target_ms / max(0.05, sides["old"].built[i]["ms"]))) for i in range(len(cases))]
    times = {k: [[] for _ in cases] for k in [*sides, "draws"]}
    for _ in range(args.rounds):
        for i in range(len(cases)):
            for k, c in sides.items():
                times[k][i].append(c.ms(i, inner[i]))
            times["draws"][i].append(sides["new"].ms(i, inner[i], "draws"))
    for c in sides.values():
        c.close()
    med = {k: [statistics.median(v) for v in t] for k, t in times.items()}
    print(f"{args.data}, float32, 1 thread; medians of {args.rounds} interleaved rounds; old = {args.base} "
          f"({base_tree}{', compile=true' if args.base_compiled else ''}), new = this tree "
          f"({'compile=true' + (', and eager' if args.eager else '')}"
          f"{''.join(f', {kv}' for kv in args.new_env)}{'' if args.rng == 'torch' else ', rng=' + args.rng}"
          f"{''.join(f'; {kv}' for kv in overrides)}"
          f"); MKL by instruction set alone: old "
          f"{sides['old'].built[0]['mkl_any_vendor']}, new {sides['new'].built[0]['mkl_any_vendor']}")
    hdr = f"{'method':<12s} {'protocol':<10s} {'R':>4s} {'old ms':>8s} {'new ms':>8s} {'old/new':>8s}"
    if args.eager:
        hdr += f" {'eager ms':>9s} {'old/eager':>9s}"
    hdr += f" {'draws ms':>9s} {'old/draws':>9s} {'compiled':>9s} {'compile s':>9s}"
    print(hdr)
    print("-" * len(hdr))
    for i, (label, _, proto, R) in enumerate(cases):
        o, n = med["old"][i], med["new"][i]
        line = f"{label:<12s} {proto:<10s} {R:4d} {o:8.2f} {n:8.2f} {o / n:7.2f}x"
        if args.eager:
            e = med["new eager"][i]
            line += f" {e:9.2f} {o / e:8.2f}x"
        d, b = med["draws"][i], sides["new"].built[i]
        line += f" {d:9.2f} {o / d:8.2f}x {'yes' if b['compiled'] else 'no':>9s} {b['compile_s']:9.1f}"
        print(line)
        if args.json:
            row = {"method": cases[i][1], "protocol": proto, "data": args.data, "R": R, "base": args.base,
                   "base_compiled": args.base_compiled, "old_ms": o, "new_ms": n, "draws_ms": d,
                   "compiled": b["compiled"], "compile_s": b["compile_s"], "rounds": args.rounds,
                   "when": time.strftime("%Y-%m-%d %H:%M"), "commit": _head(),
                   "mkl_any_vendor": bool(b.get("mkl_any_vendor", False)), "rng": args.rng}
            if overrides:
                row["overrides"] = overrides
            if args.eager:
                row["eager_ms"] = med["new eager"][i]
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
