"""Convert the SLANG authors' CSV behind Table 1 / appendix Table 7
(``bnnbench/judge/reference/from_original_code/slang_table_1_7.csv``: means and standard errors of all ten
columns, L = 2 included) into the long reference format of ``bnnbench/judge/reference/*.csv``.

    python data_scripts/slang_table1_authors.py   # writes bnnbench/judge/reference/slang_table1_authors.csv

Values are copied as strings, exactly as the authors' file prints them; KL values are on the true scale
(the paper prints them x 10^-k). ``error`` is the authors' standard error (MATLAB std / sqrt(R)).
"""

from __future__ import annotations

import csv
from pathlib import Path

REF = Path(__file__).resolve().parents[1] / "bnnbench" / "judge" / "reference"
SOURCE = REF / "from_original_code" / "slang_table_1_7.csv"
OUT = REF / "slang_table1_authors.csv"

COLUMNS = [("Mean-Field EF", ""), ("Mean-Field Hessian", ""), ("Mean-Field Exact", ""),
           ("SLANG", "L=1"), ("SLANG", "L=2"), ("SLANG", "L=5"), ("SLANG", "L=10"),
           ("Full-Gaussian EF", ""), ("Full-Gaussian Hessian", ""), ("Full-Gaussian Exact", "")]
DATASETS = {"Australian": "australian", "Breast Cancer": "breast_cancer", "a1a": "a1a", "USPS 3vs5": "usps_3vs5"}
METRICS = {"ELBO": "neg_elbo", "NLL": "test_nll", "KL": "sym_kl"}


def convert(source: Path = SOURCE) -> list[dict]:
    rows = [[c.strip() for c in r] for r in csv.reader(source.read_text().splitlines())]
    header = rows[1]
    assert header[2] == "EF (mean)" and header[21] == "(se)", header
    body = [r for r in rows[2:] if any(r)]
    assert len(body) == 12, len(body)
    out = []
    for k in range(0, 12, 3):
        block = body[k:k + 3]
        names = [r[0] for r in block if r[0]]
        assert len(names) == 1 and names[0] in DATASETS, names
        dataset = DATASETS[names[0]]
        for r in block:
            metric = METRICS[r[1]]
            for j, (method, setting) in enumerate(COLUMNS):
                value, se = r[2 + 2 * j], r[3 + 2 * j]
                float(value), float(se)
                out.append({"paper": "slang", "table": "Table 1 (authors' CSV)", "dataset": dataset,
                            "method": method, "setting": setting, "metric": metric, "value": value,
                            "error": se, "error_kind": "stderr", "scale": "",
                            "notes": "SLANG authors' code/matlab/tables/table_1_7.csv (mean, SE over splits; "
                                     "a1a: 1 run); the paper's Table 1 prints these rounded, KL x 10^-k"})
    return out


def main() -> None:
    rows = convert()
    with OUT.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {OUT} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
