"""The dashboard's other tabs, one function each: clients, communication, privacy, the knowledge cache, ablations,
the partition, neighbours and params (Streamlit layout over dashboard.data, dashboard.stages and dashboard.charts).
The overview and its comparison tables are dashboard.views'."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import ablation_charts, charts, data, privacy_chart, stages
from dashboard.config import Config
from dashboard.views import figure_downloads, fitted
from pipeline import paths
from pipeline.data import datasets
from pipeline.results.store import rebuild_command

# the neighbours view's colours: the query sample, a neighbour of its own client, of another client, of another label
QUERY, SAME_CLIENT, OTHER_CLIENT, WRONG_LABEL = (20, 20, 20), (170, 170, 170), (255, 140, 0), (220, 0, 0)


def view_clients(snap: data.Snapshot, ids: list[str], stats: dict | None) -> None:
    labels = data.run_algorithms(snap, [s.run_id for s in data.series(snap, ids)])
    best = data.best_round_clients(snap)
    if best.empty:
        st.info("No per-client accuracies yet for the selected runs.")
        return
    st.altair_chart(charts.client_spread(best, labels), width="stretch")
    acc = best.groupby("run", sort=False)["acc"]
    summary = pd.DataFrame({"best round": best.groupby("run", sort=False)["round"].first(),
                            "min": acc.min(), "median": acc.median(), "max": acc.max(),
                            "std": acc.std()}).reset_index()
    # full width, every column sized to its texts: nothing cut off in a 1280 px window
    texts = summary.assign(**{c: summary[c].map(lambda v: f"{v:.2%}") for c in ("min", "median", "max")},
                           std=summary["std"].map(lambda v: f"{v:.3f}"))
    px, rows = fitted(texts, {c: c for c in summary.columns}, wrappable=("run",))
    st.dataframe(summary, hide_index=True, key="client_stats", row_height=rows, placeholder="—", column_config={
        "run": st.column_config.TextColumn("run", width=px["run"]),
        "best round": st.column_config.NumberColumn("best round", width=px["best round"]),
        **{c: st.column_config.NumberColumn(c, format="percent", width=px[c]) for c in ("min", "median", "max")},
        "std": st.column_config.NumberColumn("std", format="%.3f", width=px["std"])})
    st.subheader("Client drill-down")
    clients = sorted(snap.clients["client_id"].unique().tolist())
    cid = st.selectbox("Client", clients, key="client")
    left, right = st.columns([3, 2])
    with left:
        st.altair_chart(charts.client_accuracy(data.client_history(snap, cid), cid, labels), width="stretch")
    with right:
        if stats is not None and cid < len(stats["train_counts"]):
            mix = stages.label_mix(stats, _dataset(snap, ids))
            st.caption(f"Client {cid}'s training label mix (current partition)")
            st.bar_chart(mix[mix["client_id"] == cid].set_index("class")["count"], height=200)
    table = data.client_bytes_table(snap, cid)
    if len(table):
        st.caption(f"Bytes client {cid} sent (up) and received (down), by what they carry")
        shown = table.assign(**{c: table[c].map(data.fmt_bytes) for c in table.columns if c != "run"})
        px, rows = fitted(shown, {c: c for c in shown.columns}, wrappable=("run",))
        st.dataframe(shown, hide_index=True, key="client_bytes", row_height=rows, column_config={
            c: st.column_config.TextColumn(c, width=px[c]) for c in shown.columns})


def view_comm(snap: data.Snapshot, ids: list[str], include_setup: bool) -> None:
    totals = data.bytes_by_family(snap, include_setup)
    if totals.empty:
        st.info("No bytes recorded for the selected runs (local-only training sends nothing).")
        return
    sending = set(snap.comm_rounds["run_id"])
    runs = data.run_algorithms(snap, [r for r in ids if r in sending])  # label -> method: its colour
    with_bytes = list(runs)
    st.altair_chart(charts.bytes_by_family(totals, runs), width="stretch")
    st.caption("What the bytes carry: set-up (FedCache's hashes), knowledge (logits, soft labels), parameters "
               "(models, blocks, pDFL's feedback copies), features (prototypes, GKT's feature maps). Without a server "
               "(pDFL), what a client sends its peers is up for it and down for each peer that receives it: one "
               "transfer, counted once in the totals.")
    st.altair_chart(charts.bytes_per_round(data.bytes_per_round(snap, include_setup), runs), width="stretch")
    silent = [snap.label(r) for r in ids if snap.label(r) not in with_bytes]
    if silent:
        st.caption("No traffic: " + ", ".join(silent))


AUDIT_HOW = ("`.venv/bin/dvc repro` runs `audit@<method>` after each training stage (one by hand: "
             "`.venv/bin/python -m flows.audit <method>`, with `audit.capture` on while it trained), and the report "
             "stage puts its figures in the results index; docs/privacy.md says what they mean.")
NOT_APPLIED = "the attack does not apply to the method, or is not built for it yet: docs/privacy.md"


def view_privacy(snap: data.Snapshot, ids: list[str], include_setup: bool, results_db: Path) -> None:
    """What the privacy audit's attackers learn from each selected run beside its accuracy and bytes: one scatter per
    attack (data.ATTACKS), and every figure with its interval in a table; the runs without an audit named."""
    if not snap.privacy_indexed:
        st.info(f"The results index `{results_db}` has no privacy table: it was built before the privacy audit (or "
                f"no index was read). {AUDIT_HOW} To rebuild the index alone: `{rebuild_command(results_db)}`.")
        return
    audited = data.audited(snap, ids)
    without = [snap.label(r) for r in ids if r not in audited]
    if not audited:
        st.info(f"None of the selected runs has a privacy audit ({', '.join(without)}). {AUDIT_HOW}")
        return
    points = data.privacy_points(snap, audited, include_setup)
    runs = data.run_algorithms(snap, audited)  # label -> method: its colour
    st.caption("What an honest-but-curious server (reconstruction, label mix) and a holder of a client's final model "
               "(membership) learn from each audited run, against the run's MAUA. Each figure is a mean over the "
               "audited clients with its 95% interval (horizontal bars); MAUA with its 95% interval over the clients "
               "(vertical bars); bytes up + down in the tooltips and the table, set-up traffic "
               f"{'included' if include_setup else 'excluded'} (sidebar). Dashed: what an attacker who ignores the "
               "uploads or the model scores. A figure near it means these attacks could not tell, not that the method "
               "is private (docs/privacy.md).")
    for column, (attack, spec) in zip(st.columns(2) * 2, data.ATTACKS.items()):
        with column:
            part = points[points["attack"] == attack]
            if part.empty:
                st.caption(f"**{spec.title}**: no selected run has this figure ({NOT_APPLIED}).")
                continue
            drawn = {label: method for label, method in runs.items() if label in set(part["run"])}
            chart = privacy_chart.privacy_scatter(part, data.privacy_baselines(snap, audited, attack), attack, drawn)
            st.altair_chart(chart, width="stretch")
            figure_downloads(chart, f"privacy_{attack}", f"fig_privacy_{attack}")
            missing = [label for label in runs if label not in drawn]
            if missing:
                st.caption(f"No figure ({NOT_APPLIED}): " + ", ".join(missing))
    st.markdown("**Every figure** (mean over the audited clients [95% interval]; in brackets after a figure: its "
                "baseline)\n\n" + data.markdown_table(data.privacy_table(snap, audited, include_setup)))
    st.caption("Label-mix TV 0: the server has the exact mix (FedCache, FedDKC, FedICT and FedProto send it by "
               "design). TPR @ 1% FPR: the members found when 1% of non-members are wrongly flagged.")
    if without:
        st.caption(f"No audit: {', '.join(without)}. {AUDIT_HOW}")


def view_cache(snap: data.Snapshot, ids: list[str]) -> None:
    """FedCache's knowledge cache per evaluated round (data.CACHE_METRICS), for the selected runs that recorded
    it: coverage, staleness, the teachers' accuracy beside the students' and the teachers' entropy."""
    stats = data.cache_stats(snap)
    algorithms = snap.runs.set_index("run_id")["algorithm"]
    without = [snap.label(r) for r in ids if r in algorithms.index and algorithms[r] == "fedcache"
               and r not in set(stats["run_id"]) and r in set(snap.rounds["run_id"])]  # FedCache runs from before
    older = f"{', '.join(without)} ran before FedCache recorded its cache" if without else ""
    if stats.empty:
        have = [snap.label(r) for r in reversed(snap.cache_runs)]  # newest first
        text = ("None of the selected runs recorded its knowledge cache" + (f" ({older})" if older else "")
                + ". FedCache runs do, every evaluated round (coverage, staleness, teacher accuracy and entropy).")
        if have:
            more = f" and {len(have) - 5} more" if len(have) > 5 else ""
            text += f" Runs that have it: {', '.join(have[:5])}{more}; pick one in the sidebar."
        else:
            text += (" No run has it yet: start one with `make run` (FedCache is in `train.algorithms`), or "
                     "`.venv/bin/python -m flows.train fedcache`.")
        st.info(text)
        return
    runs = data.run_algorithms(snap, list(dict.fromkeys(stats["run_id"])))  # label -> method: its colour
    st.caption("What FedCache's server holds at the end of each evaluated round, over all training samples. "
               "A sample's teacher is the mean of the cached logits of its R neighbours that have uploaded any. "
               "Coverage: the share of samples with a teacher. Staleness: the mean age, in rounds, of the "
               "neighbour knowledge the teachers are built from. Teacher accuracy: the share of teachers whose "
               "largest logit is the sample's label (training samples), beside the students' mean user accuracy "
               "(test splits). Entropy: of softmax(teacher / fedcache.T), in nats (uniform over C classes: "
               "ln C, 2.30 for 10).")
    for pair in (("cache_coverage", "cache_staleness"), ("cache_teacher_acc", "cache_teacher_entropy")):
        for column, metric in zip(st.columns(2), pair):
            with column:
                chart = (charts.teacher_vs_students(stats, runs) if metric == "cache_teacher_acc"
                         else charts.cache_metric(stats, metric, runs))
                st.altair_chart(chart, width="stretch")
    if without:
        st.caption(f"No cache metrics: {older}.")


SWEEP_COMMANDS = ("ablation_alpha", "ablation_R", "ablation_data_share")


def view_ablations(snap: data.Snapshot, include_setup: bool) -> None:
    """The FedCache paper's section 5.3: per swept key (runs of `python -m pipeline.experiments.sweeps run NAME`), MAUA and
    bytes against the swept value, one line per method. Independent of the sidebar's run selection."""
    points = data.ablation_points(snap, include_setup)
    if points.empty:
        st.caption("No ablation runs yet. A sweep varies one param and runs each value as a DVC experiment "
                   "(FedCache and FD), e.g. " + ", ".join(f"`.venv/bin/python -m pipeline.experiments.sweeps run {name}`"
                                                          for name in SWEEP_COMMANDS)
                   + "; its runs appear here as their experiments publish them.")
        return
    st.caption("Runs of one-parameter sweeps (DVC experiments named `<sweep>-<key>-<value>`), whatever the sidebar "
               "selects. MAUA: best mean user accuracy over rounds (as in the comparison table); bytes: up + down "
               f"to the run's last round, set-up traffic {'included' if include_setup else 'excluded'} (sidebar); "
               "each the mean over seeds when several were run. Bars: MAUA's 95% interval (one or two seeds: a "
               "bootstrap over clients, not the seed; three or more: a t interval over the seeds). Bars apart: "
               "the values differ; bars that overlap: not told apart here (the sweeps table's paired "
               "differences may still tell them).")
    for n, (name, part) in enumerate(points.groupby("ablation", sort=False)):
        key = part["key"].iloc[0]
        st.subheader(name)
        note = (f"Sweep {part['sweeps'].iloc[0]}: {part['value'].astype(str).nunique()} values, "
                f"{int(part['seeds'].sum())} runs.")
        if part["also_changed"].iloc[0]:
            note += f" Also changed against params.yaml: {part['also_changed'].iloc[0]}."
        st.caption(note)
        left, right = st.columns(2)
        with left:
            chart = ablation_charts.ablation_maua(part, key)
            st.altair_chart(chart, width="stretch")
            figure_downloads(chart, f"maua_vs_{key}", f"fig_abl{n}_maua")
        with right:
            chart = ablation_charts.ablation_bytes(part, key)
            st.altair_chart(chart, width="stretch")
            figure_downloads(chart, f"bytes_vs_{key}", f"fig_abl{n}_bytes")
            silent = sorted(set(part.loc[part["bytes"] == 0, "line"]))
            if silent:
                st.caption("Sending no bytes (left out of the log axis): " + ", ".join(silent))


def view_partition(cfg: Config, stats: dict | None, params: dict) -> None:
    if stats is None:  # not read yet (or written since): read it; a missing file raises InputMissing with the fix
        stats = stages.load_stats(cfg.stats_path)
    dataset = (params.get("data") or {}).get("dataset")
    mix = stages.label_mix(stats, dataset)
    per = stats.get("train_per_client", {})
    st.caption(f"`{cfg.stats_path}`: {stats['num_clients']} clients, {stats['num_train']:,} training / "
               f"{stats['num_test']:,} test samples, per client min {per.get('min')} · mean {per.get('mean')} · "
               f"max {per.get('max')}. Test splits follow each client's training mix.")
    k = (params.get("partition") or {}).get("num_clients")
    if k is not None and k != stats["num_clients"]:
        st.warning(f"The selected run used {k} clients; the partition on disk has {stats['num_clients']} "
                   "(it was re-partitioned since).")
    st.altair_chart(charts.label_heatmap(mix), width="stretch")


@st.cache_resource(show_spinner="Loading the dataset…", max_entries=2)
def _train_images(name: str, root: str):
    return datasets.load_dataset(name, root).train_x


@st.cache_resource(max_entries=2)
def _train_index(path: str, mtime: float):
    return stages.load_train_index(Path(path))


def view_neighbours(cfg: Config, params: dict) -> None:
    cache_db = cfg.cache_db or stages.cache_db_path(params)
    overview = stages.cache_overview(cache_db)
    meta = overview["meta"]
    dataset = (params.get("data") or {}).get("dataset") or meta.get("dataset") or "fashion_mnist"
    names = stages.class_names(dataset, int(meta.get("num_classes", len(overview["labels"]) or 10)))
    st.caption(f"`{cache_db}`: {overview['num_samples']:,} samples, R = {meta.get('R')} cached neighbours each "
               f"(same label, cosine on the {meta.get('hash_dim')}-d hash codes). Frames: black = the sample, "
               "orange = a neighbour held by another client, grey = by the same client.")
    c1, c2, c3 = st.columns(3)
    n = c1.slider("Samples", 1, 10, 4, key="nb_n")
    seed = c2.number_input("Seed", 0, 10_000, 0, key="nb_seed")
    label = c3.selectbox("Class", [None, *overview["labels"]], key="nb_label",
                         format_func=lambda c: "one per class" if c is None else names[c])
    ids = stages.pick_samples(cache_db, n, int(seed), label)
    nb = stages.neighbours(cache_db, ids)
    part = cfg.partition_path
    train_index = _train_index(str(part), part.stat().st_mtime if part.is_file() else 0.0)  # reloaded when rewritten
    if len(train_index) != overview["num_samples"]:
        st.warning(f"The partition has {len(train_index)} samples, the cache {overview['num_samples']}: "
                   "they come from different stage runs (`dvc repro index`).")
        return
    root = cfg.data_root or Path((params.get("data") or {}).get("root") or "data/raw")
    images = _train_images(dataset, str(root))
    for sid in ids:
        rows = nb[nb["sample_id"] == sid]
        q = rows.iloc[0]
        borders = [QUERY] + [WRONG_LABEL if r.label != q.label else (SAME_CLIENT if r.client_id == q.client_id
                                                                      else OTHER_CLIENT) for r in rows.iloc[1:].itertuples()]
        strip = stages.montage(images[train_index[rows["member_id"].to_numpy()]], borders)
        others = int((rows.iloc[1:]["client_id"] != q.client_id).sum())
        st.image(strip, caption=f"sample {sid} · {names[int(q.label)]} · client {int(q.client_id)} → "
                                f"{len(rows) - 1} nearest cached neighbours ({others} from other clients)")


def view_params(snap: data.Snapshot, ids: list[str], runs_dir: Path | None = None) -> None:
    """The params of N runs side by side, only the keys where they differ; one run's record (data.run_record; its
    stage's summary.json from `runs_dir` when it is that run's) and its params in full."""
    runs = snap.runs
    options = ids + [r for r in runs["run_id"] if r not in ids]
    picked = st.multiselect("Runs to compare", options, default=ids if len(ids) > 1 else options[:2],
                            format_func=snap.label, key="params_runs")
    st.subheader("What differs")
    if len(picked) < 2:
        st.caption("Pick two or more runs to compare.")
    else:
        diff = data.params_diff({snap.label(r): data.run_params(runs, r) for r in picked})
        if diff.empty:
            st.success(f"The {len(picked)} runs have the same params.")
        else:
            st.dataframe(diff, hide_index=True, width="stretch", key="params_diff", placeholder="—")
            st.caption(f"{len(diff)} of {len(data.run_params(runs, picked[0]))} keys differ (`run.*`: the run's "
                       f"own columns; {data.MISSING}: the run's params have no such key).")
    st.subheader("All params of one run")
    one = st.selectbox("Run", options, format_func=snap.label, key="params_one")
    row = runs.loc[runs["run_id"] == one].iloc[0]
    st.caption(f"git {row['git_rev']} · {row['status_shown']}")
    st.markdown("**Run record**\n\n" + data.markdown_table(data.run_record(row, _stage_summary(runs_dir, row))))
    if not row.get("environment"):
        st.caption("The results hold no record of where this run ran (the command, package versions, CPU, GPU, torch "
                   "threads): it ran before training stages recorded one (`runs.environment`). Its params say what "
                   "it asked for.")
    st.json(row["params"], expanded=1)


def _stage_summary(runs_dir: Path | None, row) -> dict | None:
    """The summary.json its training stage wrote beside its results file, when it is this run's (a stage keeps the
    summary of its latest run only)."""
    if runs_dir is None:
        return None
    path = Path(runs_dir) / paths.run_name(row["algorithm"], row["setting"] == "hetero") / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("run_id") == row["run_id"] else None


def _dataset(snap: data.Snapshot, ids: list[str]) -> str | None:
    hit = snap.runs.loc[snap.runs["run_id"].isin(ids), "dataset"]
    return hit.iloc[0] if len(hit) else None
