"""Staged training: one run trained on a sequence of splits with its state carried over (SLANG's MNIST schedule)."""

from __future__ import annotations

from dataclasses import replace

import torch

from bnnbench.run import results
from bnnbench.run.fit import FitOptions
from bnnbench.run.protocol import RunSpec
from bnnbench.run.replica_workers import fit_replicas
from bnnbench.run.splits import stage_splits


def fit_stages(spec: RunSpec, ds, hparams, gen, stage_files, opts: FitOptions, workers: int | None = None):
    """Train through ``spec.stages`` in turn, each on its own split, the method's state (step counter,
    momentum, curvature) carried over and only the data size and priors renewed: the MNIST schedule of
    SLANG's code (100 epochs on the first 50k images, then continued on all 60k). A finished stage is saved
    in ``stage_files[k]`` (state and generator), so an interrupted run resumes in the stage it was in.
    Returns the last stage's result, its history with every stage's evaluations (epochs counted on), and
    per stage its split, epochs and final metrics."""
    state, steps, wall, summary = None, 0, 0.0, []
    hist = {"epochs": [], "metrics": []}
    for k, st in enumerate(spec.stages):
        splits = stage_splits(ds, spec, st["split"])
        last = k == len(spec.stages) - 1
        if stage_files[k].exists() and not last:
            done = torch.load(stage_files[k], map_location=opts.device, weights_only=False)
            gen.set_state(done["generator"])
            state, res_final, h, w, n = done["state"], done["final"], done["history"], done["wall"], done["steps"]
        else:
            pairs = [(s.train, s.test) for s in splits]
            ck = opts.checkpoint.with_name(f"{opts.checkpoint.stem}-stage{k}.pt")
            stage_opts = replace(opts, epochs=st["epochs"], checkpoint=ck,
                                 eval_samples_final=spec.eval_samples_final if last else None)
            res = fit_replicas(spec, ds, pairs, list(range(len(pairs))), hparams, gen, stage_opts, workers=workers,
                               init_state=state)
            state, res_final, h, w, n = (res.state, {k_: v.tolist() for k_, v in res.final.items()},
                                         res.history.to_dict(), res.wall_time_s, res.steps)
            if not last:
                results.save_checkpoint(stage_files[k], {"state": state, "final": res_final, "history": h, "wall": w,
                                                         "steps": n, "generator": gen.get_state()})
                ck.unlink(missing_ok=True)
        offset = sum(s["epochs"] for s in spec.stages[:k])
        hist["epochs"] += [e + offset for e in h["epochs"]]
        hist["metrics"] += h["metrics"]
        steps, wall = steps + n, wall + w
        summary.append({"split": st["split"], "epochs": st["epochs"], "n_train": len(splits[0].train),
                        "n_eval": len(splits[0].test), "final": res_final})
    res.history.epochs, res.history.metrics = hist["epochs"], hist["metrics"]
    res.steps, res.wall_time_s = steps, wall
    return res, summary
