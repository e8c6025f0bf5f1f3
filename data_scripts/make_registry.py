#!/usr/bin/env python
"""Generate ``bnnbench/core/data/registry.json`` from the raw-data mirror's MANIFEST.md.

The registry is the single source of truth the data layer uses at run time:

* ``files``: one entry per raw file -- dataset group, path relative to the
  mirror / cache root, upstream URL (plus alternates), sha256 (or md5 where no
  sha256 is known), md5, size in bytes and a few handling flags.
* ``datasets``: the public dataset ids (``uci/boston``, ``mnist`` ...) with their
  loader family, the raw files they need and loader parameters.

Usage::

    python data_scripts/make_registry.py [--manifest PATH] [--out PATH] [--check]

``--check`` exits non-zero if the committed registry differs from what the
manifest produces (used by the tests).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MANIFEST = REPO.parent / "shared" / "data" / "MANIFEST.md"
DEFAULT_OUT = REPO / "bnnbench" / "core" / "data" / "registry.json"

REGISTRY_FORMAT = 1

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")

# Gal & Ghahramani folders -> public ids.
UCI_FOLDERS = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}

# CIFAR-10 is not in the mirror: added by hand (only an md5 is published).
CIFAR10_ENTRY = {
    "path": "cifar10/cifar-10-python.tar.gz",
    "group": "CIFAR-10",
    "url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "sha256": None,
    "md5": "c58f30108f718f92721af3b95e74349a",
    "bytes": 170498071,
    "note": "not in the shared mirror; md5 is the published checksum (no sha256 known)",
}

# Files whose mirror bytes were normalised from a modified public copy (see MANIFEST
# caveats): the cache stores them with CRs and blank lines removed and a final newline,
# and the checksum is verified on those normalised bytes.
NORMALIZED_TEXT = {
    "libsvm/australian_scale": "mirror copy normalised from a CRLF public copy; upstream bytes unverified",
    "libsvm/breast-cancer_scale": "mirror copy relabelled back to 2/4 from a public copy; upstream bytes unverified",
}

MNIST_ALT_PREFIX = "https://ossci-datasets.s3.amazonaws.com/mnist/"


def parse_manifest(text: str) -> list[dict]:
    """Parse the ``## Per-file table`` section of MANIFEST.md into file entries."""
    lines = text.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if l.strip().lower() == "## per-file table")
    except StopIteration:
        raise ValueError("MANIFEST.md has no '## Per-file table' section") from None
    header = None
    entries = []
    for line in lines[start + 1:]:
        s = line.strip()
        if s.startswith("## "):
            break
        if not s.startswith("|"):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            expected = ["dataset", "file", "bytes", "sha256", "md5", "canonical upstream url"]
            if header[:6] != expected:
                raise ValueError(f"unexpected per-file table header: {header}")
            continue
        if set(s.replace("|", "").strip()) <= set("-: "):
            continue  # separator row
        if len(cells) != len(header):
            raise ValueError(f"row has {len(cells)} cells, expected {len(header)}: {line[:120]}")
        group, path, nbytes, sha256, md5, url_cell = cells[:6]
        sha256 = sha256.split()[0].lower()
        md5 = md5.split()[0].lower()  # e.g. "f68b... (= canonical)"
        if not _HEX64.match(sha256):
            raise ValueError(f"bad sha256 for {path}: {sha256!r}")
        if not _HEX32.match(md5):
            raise ValueError(f"bad md5 for {path}: {md5!r}")
        url = url_cell.split()[0]
        if not re.match(r"^(https?|file)://", url):
            raise ValueError(f"bad url for {path}: {url_cell!r}")
        entry = {
            "path": path,
            "group": group,
            "url": url,
            "sha256": sha256,
            "md5": md5,
            "bytes": int(nbytes),
        }
        m = re.search(r"\(member\s+([^)\s]+)\)", url_cell)
        if m:
            # The upstream URL is an archive; the mirror / cache hold its member.
            fmt = "tar.bz2" if url.endswith(".tar.bz2") else "tar"
            entry["archive"] = {"format": fmt, "member": m.group(1)}
        if path.startswith("mnist/"):
            entry["alt_urls"] = [MNIST_ALT_PREFIX + path.split("/", 1)[1]]
        if path in NORMALIZED_TEXT:
            entry["normalize"] = "text-lines"
            entry["note"] = NORMALIZED_TEXT[path]
        entries.append(entry)
    if not entries:
        raise ValueError("per-file table is empty")
    paths = [e["path"] for e in entries]
    if len(set(paths)) != len(paths):
        raise ValueError("duplicate paths in per-file table")
    return entries


def define_datasets(paths: list[str]) -> dict[str, dict]:
    """Public dataset ids -> family, task, raw files and loader parameters."""
    have = set(paths)

    def need(*ps: str) -> list[str]:
        for p in ps:
            if p not in have:
                raise ValueError(f"registry lacks file {p}")
        return list(ps)

    ds: dict[str, dict] = {}
    for short, folder in UCI_FOLDERS.items():
        prefix = f"uci_gal/UCI_Datasets/{folder}/data/"
        files = sorted(p for p in paths if p.startswith(prefix))
        need(prefix + "data.txt", prefix + "n_splits.txt", prefix + "index_features.txt",
             prefix + "index_target.txt")
        ds[f"uci/{short}"] = {
            "family": "uci",
            "task": "regression",
            "description": f"UCI {folder}, Gal & Ghahramani (2016) splits",
            "files": files,
            "params": {"dir": prefix.rstrip("/"), "folder": folder},
        }

    # The noisy natural gradient authors' regression code (pomonam/NoisyNaturalGradient @ 87fa0df,
    # regression/data/naval.data: Gal's data.txt byte for byte) takes the last column as the target: the gas turbine
    # decay coefficient (column 17), with the compressor decay coefficient (column 16, Gal's target) among the inputs.
    naval = ds["uci/naval"]
    ds["uci/naval_turbine"] = {
        **naval,
        "description": "UCI naval-propulsion-plant, Gal & Ghahramani (2016) splits, the turbine decay coefficient "
                       "(column 17) from the other 17 columns, as the noisy natural gradient authors' code reads it",
        "params": {**naval["params"], "feature_columns": list(range(17)), "target_column": 17},
    }

    def libsvm_random(name, path, n_features, pos, neg, desc):
        ds[name] = {
            "family": "libsvm",
            "task": "binary",
            "description": desc,
            "files": need(path),
            "params": {"kind": "random_splits", "file": path, "n_features": n_features,
                       "positive_label": pos, "negative_label": neg, "n_splits": 20,
                       "train_fraction": 0.5},
        }

    def libsvm_presplit(name, folder, stem, desc):
        files = {k: f"slang_presplit/{folder}/{stem}_{k}.csv" for k in ("X_tr", "X_te", "y_tr", "y_te")}
        ds[name] = {
            "family": "libsvm",
            "task": "binary",
            "description": desc,
            "files": need(*files.values()),
            "params": {"kind": "presplit", **files},
        }

    libsvm_random("libsvm/australian", "libsvm/australian_scale", 14, 1, -1,
                  "LIBSVM australian_scale (label +1 -> 1), 20 random 50/50 splits")
    libsvm_presplit("libsvm/australian_presplit", "australian_presplit", "australian_scale",
                    "australian_scale, fixed SLANG/Vadam train/test presplit")
    libsvm_random("libsvm/breast_cancer", "libsvm/breast-cancer_scale", 10, 4, 2,
                  "LIBSVM breast-cancer_scale (label 4 = malignant -> 1), 20 random 50/50 splits")
    libsvm_presplit("libsvm/breast_cancer_presplit", "breast_cancer_scale_presplit",
                    "breast_cancer_scale", "breast-cancer_scale, fixed SLANG/Vadam train/test presplit")
    ds["libsvm/a1a"] = {
        "family": "libsvm",
        "task": "binary",
        "description": "LIBSVM a1a (train) + a1a.t (test), 123 features, official split",
        "files": need("libsvm/a1a", "libsvm/a1a.t"),
        "params": {"kind": "train_test", "train": "libsvm/a1a", "test": "libsvm/a1a.t",
                   "n_features": 123, "positive_label": 1, "negative_label": -1},
    }
    ds["usps/3vs5"] = {
        "family": "usps",
        "task": "binary",
        "description": "USPS resampled (GPML), digits 3 (->0) vs 5 (->1), train+test pooled, 20 random 50/50 splits",
        "files": need("usps/usps_resampled.mat"),
        "params": {"file": "usps/usps_resampled.mat", "negative_digit": 3, "positive_digit": 5,
                   "n_splits": 20, "train_fraction": 0.5},
    }
    mn = {
        "train_images": "mnist/train-images-idx3-ubyte.gz",
        "train_labels": "mnist/train-labels-idx1-ubyte.gz",
        "test_images": "mnist/t10k-images-idx3-ubyte.gz",
        "test_labels": "mnist/t10k-labels-idx1-ubyte.gz",
    }
    ds["mnist"] = {
        "family": "mnist",
        "task": "multiclass",
        "description": "MNIST 60k train + 10k test (idx files); validation split = last 10k of train",
        "files": need(*mn.values()),
        "params": {**mn, "n_validation": 10000},
    }
    ds["cifar10"] = {
        "family": "cifar10",
        "task": "multiclass",
        "description": "CIFAR-10 python tarball, 50k train + 10k test",
        "files": need(CIFAR10_ENTRY["path"]),
        "params": {"file": CIFAR10_ENTRY["path"]},
    }
    ds["synthetic/gap_cubic"] = {
        "family": "synthetic",
        "task": "regression",
        "description": "toy cubic with a gap (Hernandez-Lobato & Adams 2015; Ober & Aitchison 2020 Fig. 1), generated",
        "files": [],
        "params": {"generator": "gap_cubic", "seed": 0, "n_per_side": 20, "noise_std": 3.0, "grid": [-6.0, 6.0],
                   "n_grid": 200},
    }
    ds["synthetic/deep_linear"] = {
        "family": "synthetic",
        "task": "regression",
        "description": "linear-Gaussian data for deep linear networks (Ober & Aitchison 2020 Fig. 2), generated",
        "files": [],
        "params": {"generator": "deep_linear", "seed": 0, "d_in": 5, "n_train": 1000, "n_test": 100,
                   "weight_var": 0.2, "noise_var": 0.1, "n_draws": 3},
    }
    return ds


def build_registry(manifest_text: str) -> dict:
    files = parse_manifest(manifest_text)
    files.append(dict(CIFAR10_ENTRY))
    datasets = define_datasets([f["path"] for f in files])
    return {
        "format": REGISTRY_FORMAT,
        "generated_by": "data_scripts/make_registry.py from the raw-data mirror's MANIFEST.md",
        "checksum_rule": "sha256 when not null, else md5; digest of the file as stored in the cache/mirror",
        "files": files,
        "datasets": datasets,
    }


def dumps(registry: dict) -> str:
    """JSON with one file entry per line (small, diff-friendly)."""
    out = ["{"]
    for key in ("format", "generated_by", "checksum_rule"):
        out.append(f"  {json.dumps(key)}: {json.dumps(registry[key])},")
    out.append('  "files": [')
    fl = registry["files"]
    for i, e in enumerate(fl):
        out.append("    " + json.dumps(e, sort_keys=False) + ("," if i < len(fl) - 1 else ""))
    out.append("  ],")
    out.append('  "datasets": {')
    items = list(registry["datasets"].items())
    for i, (name, spec) in enumerate(items):
        out.append(f"    {json.dumps(name)}: " + json.dumps(spec) + ("," if i < len(items) - 1 else ""))
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", type=Path, default=DEFAULT_MANIFEST)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="only compare with the existing file")
    args = ap.parse_args(argv)
    text = dumps(build_registry(args.manifest.read_text(encoding="utf-8")))
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; re-run data_scripts/make_registry.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.out)
    reg = json.loads(text)
    print(f"wrote {args.out}: {len(reg['files'])} files, {len(reg['datasets'])} datasets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
