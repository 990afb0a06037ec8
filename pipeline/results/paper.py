"""The FedCache paper's reported figures (paper/fedcache_tables.csv), to show beside measured runs.

    python -m pipeline.results.paper            # the table as the report shows it

Each row: table (5 homogeneous, 6 heterogeneous), dataset, setting (homo | hetero), method,
the models, MAUA (%), communication to the paper's target (GB), speed-up against the table's
reference method, and the preset that runs the row's setting (paper/README.md).
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputFileError

FIGURES = Path(__file__).resolve().parents[2] / "paper" / "fedcache_tables.csv"
COLUMNS = ("table", "dataset", "setting", "method", "client_models", "server_model", "maua_pct", "comm_gb",
           "speedup", "reference", "preset")


@dataclass(frozen=True)
class PaperRow:
    table: int
    dataset: str
    setting: str
    method: str
    client_models: str
    server_model: str
    maua: float | None  # a fraction (the paper prints %)
    comm_gb: float | None
    speedup: float | None
    reference: str
    preset: str


def _number(text: str, path: Path, line: int, column: str) -> float | None:
    if text.strip() == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise InputFileError(f"{path}, line {line}: {column} = {text!r} is not a number (leave it empty for the "
                             f"paper's '-')") from None


def load(path: Path = FIGURES) -> list[PaperRow]:
    """Every row, checked: a missing column or a bad number names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path} not found: it ships with the repository (paper/fedcache_tables.csv)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputFileError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
        rows = []
        for line, r in enumerate(reader, start=2):
            if r["setting"] not in ("homo", "hetero"):
                raise InputFileError(f"{path}, line {line}: setting = {r['setting']!r}; expected homo or hetero")
            maua = _number(r["maua_pct"], path, line, "maua_pct")
            rows.append(PaperRow(int(r["table"]), r["dataset"], r["setting"], r["method"], r["client_models"],
                                 r["server_model"], None if maua is None else maua / 100,
                                 _number(r["comm_gb"], path, line, "comm_gb"),
                                 _number(r["speedup"], path, line, "speedup"), r["reference"], r["preset"]))
    return rows


def lookup(rows: list[PaperRow], dataset: str, method: str, setting: str) -> PaperRow | None:
    """The paper's row for a measured run's (dataset, method, setting), if the paper reports one."""
    return next((r for r in rows if (r.dataset, r.method, r.setting) == (dataset, method, setting)), None)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    rows = load()
    print("| table | dataset | setting | method | MAUA | GB to target | speed-up | reference | preset |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.table} | {r.dataset} | {r.setting} | {r.method} | {_fmt(r.maua, '.2%')} | {_fmt(r.comm_gb, 'g')} "
              f"| {'-' if r.speedup is None else f'{r.speedup:g}x'} | {r.reference} | {r.preset} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
