"""CPU (or GPU) time of SLANG Table 3's protocol per rank L and for BBB, from measured step times.

784-400-400-10, minibatch 200, 4 MC samples per step (the protocol), one replica: milliseconds per step,
the implied time of one epoch on 50k images (250 steps) and of the whole schedule (100 epochs on 50k,
300 on 60k: 115 000 steps), and SLANG's epoch relative to an Adam (MAP) epoch on the same network with
one sample, measured in the same run (issue 5 asks for <= 5x at L = 32).

    python bench/mnist_epoch.py [--steps 5] [--device cpu] [--ranks 1,8,32] [--threads 1,2] [--json out.json]
        [--compile]

``--threads`` times every row at each of these intra-op thread counts in turn (what ``threads=auto`` of a run was
decided from: bnnbench/run/threads.py); without it, at torch's current count. ``--json`` also writes every row to a file
(bench/gpu_queue.py prices SLANG Table 3's GPU cells from it). ``--compile`` adds Adam's, BBB's and SLANG's (each
rank) rows stepped as ``compile=true`` steps them: on a GPU as CUDA graphs (issue 31, section 3; SLANG as graphs around
its eagerly run eigensolvers; the first steps compile, untimed).
"""

from __future__ import annotations

import argparse

import torch

from bnnbench.run.execute import device_of

from step_ratios import CFG, device_name, time_steps, write_json

STEPS_EPOCH = 50000 // 200
STEPS_PROTOCOL = 100 * (50000 // 200) + 300 * (60000 // 200)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ranks", default="1,8,32")
    ap.add_argument("--threads", default="", help="comma list of intra-op thread counts (default: torch's current)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--compile", action="store_true", help="also Adam, BBB and SLANG compiled (CUDA graphs on a GPU)")
    args = ap.parse_args()
    dev = device_of({"device": args.device})  # full float32 on CUDA, as the runs
    counts = [int(t) for t in args.threads.split(",")] if args.threads else [torch.get_num_threads()]
    print(f"torch {torch.__version__}, {'/'.join(map(str, counts))} threads, device {dev}")
    mn = dict(sizes=[784, 400, 400, 10], lik="categorical", R=1, M=200, steps=args.steps, device=dev)
    adam = {}
    out = {"bench": "mnist_epoch", "device": str(dev), "device_name": device_name(dev), "torch": torch.__version__,
           "steps": args.steps, "steps_epoch": STEPS_EPOCH, "steps_protocol": STEPS_PROTOCOL, "rows": []}
    for t in counts:
        torch.set_num_threads(t)
        adam[t] = time_steps("map", CFG["map"], **{**mn, "steps": 4 * args.steps})
        print(f"  {'Adam (MAP), 1 sample':<24s} {t} thr {adam[t]:8.1f} ms/step  "
              f"epoch {adam[t] * STEPS_EPOCH / 1e3:7.1f} s")
        out["rows"].append({"label": "Adam", "method": "map", "rank": None, "samples": 1, "threads": t,
                            "ms_step": adam[t], "epoch_s": adam[t] * STEPS_EPOCH / 1e3})
    rows = [("BBB", "bbb", {}), *[(f"SLANG L={L}", "slang", {"rank": int(L)}) for L in args.ranks.split(",")]]
    for label, name, over in rows:
        for t in counts:
            torch.set_num_threads(t)
            ms = time_steps(name, {**CFG[name], **over, "train_samples": 4}, **mn)
            print(f"  {label + ', 4 samples':<24s} {t} thr {ms:8.1f} ms/step  epoch {ms * STEPS_EPOCH / 1e3:7.1f} s  "
                  f"protocol {ms * STEPS_PROTOCOL / 3.6e6:6.1f} h  epoch / Adam epoch {ms / adam[t]:5.1f}x")
            out["rows"].append({"label": label, "method": name, "rank": over.get("rank"), "samples": 4, "threads": t,
                                "ms_step": ms, "epoch_s": ms * STEPS_EPOCH / 1e3,
                                "protocol_s": ms * STEPS_PROTOCOL / 1e3, "ratio_adam": ms / adam[t]})
    if args.compile:
        compiled = [("Adam (MAP), 1 sample", "map", 1, {}), ("BBB, 4 samples", "bbb", 4, {}),
                    *[(f"SLANG L={L}, 4 samples", "slang", 4, {"rank": int(L)}) for L in args.ranks.split(",")]]
        for label, name, samples, over in compiled:
            for t in counts:
                torch.set_num_threads(t)
                cfg = {**CFG[name], **over, **({"train_samples": samples} if name != "map" else {})}
                try:
                    ms = time_steps(name, cfg, **{**mn, "steps": 4 * args.steps}, warm=5, compile=True)
                except Exception as e:   # one method's compilation failing leaves the other rows to time
                    print(f"  {label + ' compiled':<24s} {t} thr failed: {type(e).__name__}: {str(e)[:300]}")
                    out["rows"].append({"label": f"{label} compiled", "method": name, "rank": over.get("rank"),
                                        "threads": t, "compile": True, "error": f"{type(e).__name__}: {e}"[:2000]})
                    torch._dynamo.reset()
                    continue
                print(f"  {label + ' compiled':<24s} {t} thr {ms:8.1f} ms/step  epoch {ms * STEPS_EPOCH / 1e3:7.1f} s  "
                      f"protocol {ms * STEPS_PROTOCOL / 3.6e6:6.1f} h  / eager Adam {ms / adam[t]:5.2f}x")
                out["rows"].append({"label": f"{label} compiled", "method": name, "rank": over.get("rank"),
                                    "samples": samples,
                                    "threads": t, "compile": True, "ms_step": ms, "epoch_s": ms * STEPS_EPOCH / 1e3,
                                    "protocol_s": ms * STEPS_PROTOCOL / 1e3, "ratio_adam": ms / adam[t]})
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
