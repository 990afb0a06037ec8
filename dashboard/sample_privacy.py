"""The sample's privacy-audit figures (dashboard/sample_data.py): made-up, in the index's privacy table, as the
index rebuilt after their runs' audits holds them (pipeline.results.store.audit_figures; docs/privacy.md)."""

from __future__ import annotations

from pipeline.results.store import INDEX_SCHEMA, PRIVACY_COLUMNS, ResultsDB, insert_rows

# Made-up privacy-audit figures per method (metric -> mean, 95% low, high; pipeline.results.privacy.METRICS), as an
# audit of such a run gives them (docs/privacy.md): FedCache's codes inverted a little above the mean public image and
# its label mix sent by design (TV 0); FedAvg's round-1 update inverted below the mean image (DLG on several local
# steps) and its label mix estimated from the classifier's update; local-only sends nothing: membership only.
PRIVACY = {
    "fedcache": {"psnr": (13.2, 12.6, 13.9), "ssim": (0.21, 0.17, 0.25), "baseline_psnr": (11.9, 11.5, 12.3),
                 "mia_auc": (0.56, 0.52, 0.60), "mia_tpr": (0.03, 0.01, 0.06), "lira_auc": (0.61, 0.56, 0.66),
                 "label_tv": (0.0, 0.0, 0.0), "uniform_tv": (0.52, 0.47, 0.58)},
    "fedavg": {"psnr": (10.4, 9.1, 11.8), "ssim": (0.08, 0.05, 0.12), "baseline_psnr": (11.7, 11.2, 12.1),
               "mia_auc": (0.53, 0.50, 0.57), "mia_tpr": (0.02, 0.0, 0.04), "lira_auc": (0.55, 0.51, 0.60),
               "label_tv": (0.21, 0.15, 0.28), "uniform_tv": (0.50, 0.45, 0.56)},
    "local": {"mia_auc": (0.58, 0.53, 0.63), "mia_tpr": (0.04, 0.02, 0.07), "lira_auc": (0.64, 0.58, 0.70)},
}
# the index's privacy table as pipeline.results.store creates it (the report stage's rebuild fills it)
PRIVACY_TABLE = INDEX_SCHEMA[INDEX_SCHEMA.index("CREATE TABLE IF NOT EXISTS privacy "):].split(";")[0]


def write_privacy(db: ResultsDB, audited: dict[str, str]) -> None:
    """The privacy table's rows of the runs in `audited` (run_id -> method: its PRIVACY figures), as an index
    rebuilt after their audits holds them."""
    with db.connect() as con:
        con.execute(PRIVACY_TABLE)
        insert_rows(con, "privacy", PRIVACY_COLUMNS,
                    [(r, m, *v) for r, method in audited.items() for m, v in PRIVACY[method].items()])
