"""The Table 4 job (experiments.text_table): the generated IMDb/MNLI sets read back by the TFDS
reader, the sub-run plan of the paper scale, a micro grid end to end (CSV, Markdown, figures,
ratio histograms), reuse of finished sub-runs, refusals.

The stand-in encoder is the random 2-block BERT (hidden size 32) of test_text_experiment, so the
micro grid compiles and trains in seconds.
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    TINY_TEXT,
    assert_figures,
    assert_one_line_error,
    assert_rerun_reuses,
    cell_number,
    cell_status,
    headline_cells,
)

from cudt.data.text import load_text_data, synthetic_sentiment
from cudt.data.text.nli import NLI_LABELS, generated_nli
from experiments import text_table
from experiments.paper import text_table as table4


def test_generated_nli_is_balanced_deterministic_and_labelled_by_construction():
    a = generated_nli(60, seed=0)
    assert a.pairs is not None and len(a) == 60
    assert np.array_equal(a.labels, np.arange(60) % 3)
    b = generated_nli(60, seed=0)
    assert a.texts == b.texts and a.pairs == b.pairs
    assert generated_nli(60, seed=0, stream=1).pairs != a.pairs
    assert len(set(zip(a.texts, a.pairs, strict=True))) >= 55  # varied
    for premise, hypothesis, label in zip(a.texts, a.pairs, a.labels, strict=True):
        assert premise.endswith(".") and hypothesis.endswith(".")
        if hypothesis.startswith("Someone is "):  # a part of the premise: entailed
            assert label == 0 and hypothesis[len("Someone is ") : -1] in premise
        if hypothesis.startswith("Nobody is "):  # denies the premise's activity
            assert label == 2 and hypothesis[len("Nobody is ") : -1] in premise
    # No single opening word gives a label away.
    for word in ("The", "A"):
        labels = {int(y) for h, y in zip(a.pairs, a.labels, strict=True) if h.split()[0] == word}
        assert len(labels) >= 2, word


def test_tiny_datasets_are_read_back_by_the_tfds_reader(tmp_path):
    made = table4.build_tiny_datasets(tmp_path, ("imdb", "mnli"), 30, 12)
    assert made == {"imdb": tmp_path / "imdb_reviews", "mnli": tmp_path / "glue"}
    assert (tmp_path / "imdb_reviews/plain_text/1.0.0/dataset_info.json").is_file()
    assert (tmp_path / "glue/mnli/2.0.0/dataset_info.json").is_file()

    imdb = load_text_data("imdb", tmp_path, num_train=30, num_test=12, val_fraction=0.2)
    assert (len(imdb.train), len(imdb.val), len(imdb.test), imdb.num_classes) == (24, 6, 12, 2)
    assert "imdb_reviews/plain_text:1.0.0 (array_record)" in imdb.source
    generated = set(synthetic_sentiment(40, seed=0).texts)
    assert set(imdb.train.texts) <= generated  # the generated reviews, unchanged

    mnli = load_text_data("mnli", tmp_path, num_train=30, num_test=12, val_fraction=0.2)
    assert mnli.num_classes == 3 and mnli.label_names == NLI_LABELS
    assert mnli.test.pairs is not None and len(mnli.test) == 12
    assert np.bincount(mnli.test.labels, minlength=3).tolist() == [4, 4, 4]
    train = set(
        zip(mnli.train.texts + mnli.val.texts, mnli.train.pairs + mnli.val.pairs, strict=True)
    )
    assert not train & set(zip(mnli.test.texts, mnli.test.pairs, strict=True))  # held out

    # The same spec again: kept, not rewritten; another size: rewritten.
    info = tmp_path / "glue/mnli/2.0.0/dataset_info.json"
    before = info.stat().st_mtime_ns
    table4.build_tiny_datasets(tmp_path, ("mnli",), 30, 12)
    assert info.stat().st_mtime_ns == before
    table4.build_tiny_datasets(tmp_path, ("mnli",), 30, 9)
    assert len(load_text_data("mnli", tmp_path, num_train=30, num_test=None).test) == 9


def _encoder_folder(folder: Path, model_type: str) -> Path:
    """A folder that passes the job's up-front checks (it is not loaded by these tests)."""
    folder.mkdir(parents=True)
    config = dict(
        model_type=model_type,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        vocab_size=100,
        max_position_embeddings=64,
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_paper_plan_is_the_papers_grid(tmp_path):
    distilbert = _encoder_folder(tmp_path / "distilbert", "distilbert")
    roberta = _encoder_folder(tmp_path / "roberta", "roberta")
    table4.build_tiny_datasets(tmp_path / "tfds", ("imdb", "mnli"), 6, 3)  # a prepared layout
    opts = table4.Table4Config(
        scale="paper",
        data_dir=str(tmp_path / "tfds"),
        checkpoint_distilbert=str(distilbert),
        checkpoint_roberta=str(roberta),
    )
    table4.check_inputs(opts)
    subs = table4.plan(opts, tmp_path / "out")
    models = ["ut-L3", "ut-L5", "ut-L7", "ut-L9", "distilbert", "roberta"]  # the paper's order
    assert [s.name for s in subs] == [f"{d}-{m}" for d in ("imdb", "mnli") for m in models]
    by_name = {s.name: s.cfg for s in subs}
    assert len(subs) == 12
    ut = by_name["mnli-ut-L7"]
    assert (ut.model, ut.layers, ut.granularity, ut.dataset) == ("ut", 7, "block", "mnli")
    assert ut.checkpoint == str(distilbert)  # the UT reads DistilBERT's word embeddings
    assert ut.data_dir == str(tmp_path / "tfds")
    rob = by_name["imdb-roberta"]
    assert (rob.checkpoint, rob.granularity, rob.layers) == (str(roberta), "sublayer", None)
    assert rob.sweep == ("gamma_train=0,0.2,0.4,0.6,0.8,1",)
    assert (rob.seeds, rob.num_train, rob.num_test, rob.gamma_train) == (5, None, None, 1.0)
    assert subs[0].out == tmp_path / "out" / subs[0].name


def test_the_note_names_each_models_own_constraint_setting(tmp_path):
    """The note said "ε 0.05" of every row while the UT's runs train at the text task's own UT
    value, 0.02 (its model_hparams); found by the paper-jobs review. A --sweep of ε sets every
    model's, so the note then names no model's own."""
    from cudt.tasks.text import TextTask

    for sweep, ut_eps in (((), 0.02), (("epsilon=0.1",), 0.1)):
        opts = table4.Table4Config(scale="tiny", datasets=("imdb",), sweep=sweep)
        subs = {s.key[1]: s.cfg for s in table4.plan(opts, tmp_path / "out")}
        specs = TextTask().run_specs(subs["ut"])
        assert {s.hp["epsilon"] for s in specs if s.constrained} == {ut_eps}
        note = table4.details_note(opts, subs["ut"])
        assert ("UT's own ε 0.02" in note) == (ut_eps == 0.02), note
        assert "MiniLM's own" not in note  # MiniLM trains at the shared ε 0.05 the note gives
        assert "ε 0.05" in note
        assert "tolerance 0.01" in note and "from --tolerance" not in note  # the task's own
    # a --tolerance the user gave is said so, not passed off as the task's default
    opts = table4.Table4Config(scale="tiny", datasets=("imdb",), tolerance=0.1)
    (sub, *_) = table4.plan(opts, tmp_path / "given")
    assert "tolerance 0.1 from --tolerance" in table4.details_note(opts, sub.cfg)


TINY = [
    "--models",
    "minilm",
    "--gamma-trains",
    "0,1",
    "--steps",
    "4",
    *TINY_TEXT,
    # every constrained run counts as feasible, so each cell has both numbers to compare
    "--tolerance",
    "100",
]


@pytest.fixture(scope="module")
def stand_in(tiny_bert) -> Path:
    return tiny_bert


@pytest.fixture(scope="module")
def micro_grid(tmp_path_factory, stand_in):
    out = tmp_path_factory.mktemp("table4") / "out"
    argv = TINY + ["--checkpoint-minilm", str(stand_in), "--out", str(out)]
    assert text_table.main(argv) == 0
    return out, argv


@pytest.mark.slow
def test_micro_grid_writes_table_csv_figures_and_ratio_histograms(micro_grid):
    out, _ = micro_grid
    assert (out / "data/imdb_reviews/plain_text/1.0.0/dataset_info.json").is_file()
    assert (out / "data/glue/mnli/2.0.0/dataset_info.json").is_file()
    results = {
        d: json.loads((out / f"{d}-minilm/results.json").read_text()) for d in table4.DATASETS
    }
    assert results["mnli"]["config"]["dataset"] == "mnli"
    assert results["mnli"]["config"]["num_classes"] == 3
    assert results["imdb"]["config"]["data_dir"] == str(out / "data")
    assert results["imdb"]["config"]["sweep"] == ["gamma_train=0,1"]
    assert results["imdb"]["config"]["test_gamma"] == [0.0, 1.0, 2.0]

    with open(out / "table4.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == table4.CSV_COLUMNS
    keys = {(r["dataset"], r["kind"], float(r["gamma_train"])) for r in rows}
    assert keys == {
        (d, k, g) for d in ("imdb", "mnli") for k in ("ERM", "constrained") for g in (0, 1)
    }
    assert len(rows) == 8
    for r in rows:
        assert r["model"] == "minilm" and r["layers"] == "4"  # 2 blocks, one state per sub-layer
        assert 0 <= float(r["auc"]) <= 2
        assert r["epsilon"] == ("0.05" if r["kind"] == "constrained" else "")  # text default
        assert r["sub_run"] == f"{r['dataset']}-minilm"
    # The CSV numbers are the best runs' of results.json, the best by validation accuracy AUC
    # (validation data scored over the test γ grid, as the paper's B.3).
    for r in rows:
        runs = [
            x
            for x in results[r["dataset"]]["runs"]
            if x["gamma_train"] == float(r["gamma_train"])
            and x["constrained"] == (r["kind"] == "constrained")
        ]
        (best,) = runs  # one seed, one point: the cell is that run, its status the rule's
        assert float(r["auc"]) == pytest.approx(best["auc"], rel=1e-5)
        assert r["status"] == cell_status(best), (r, best["loss_decreases_val"])
        assert float(r["val_auc"]) == pytest.approx(best["val_auc"], rel=1e-5)
        assert len(best["val_accuracy_by_gamma"]) == len(best["test_gamma"])

    md = (out / "table4.md").read_text()
    cells = headline_cells(md)
    assert set(cells) == {"MiniLM-4"}
    for c, e in (cells["MiniLM-4"][:2], cells["MiniLM-4"][2:]):
        higher = max(cell_number(c), cell_number(e))
        flagged = "(" in c + e  # a cell not eligible (its number in brackets): no bold
        for cell in (c, e):  # else the higher AUC bold (both when equal), the other not
            assert cell.startswith("**") == (not flagged and cell_number(cell) == higher), (c, e)
    # MiniLM is compared with the paper's DistilBERT-12 at γ_train = 1: C (+0.044), C (+0.003)
    assert "/ C (+0.044)" in md and "/ C (+0.003)" in md
    assert "### Every γ_train" in md and "| MiniLM-4 | 0 |" in md

    figures = ("fig1_layer_loss.png", "fig4_accuracy_vs_gamma.png", "fig12_ratio_hist.png")
    assert_figures(out, figures, min_height=400)
    for d, res in results.items():  # the figures' chance level: K as the sub-run recorded it
        best = table4.best_rows({(d, "minilm", 4): res})
        assert {r["num_classes"] for r in best} == {len(res["config"]["label_names"])}

    # Every run's ratio histogram counts each test sample once per layer, and its share below
    # 1 is the run's descent rate.
    edges, hists = table4.read_ratio_histograms(out / "mnli-minilm")
    assert np.array_equal(edges, table4.RATIO_EDGES)
    assert np.allclose(np.diff(edges)[np.searchsorted(edges, 0.9)], 0.0025)  # fine near 1
    runs = results["mnli"]["runs"]
    assert set(hists) == {r["label"] for r in runs}
    below_one = int(np.searchsorted(table4.RATIO_EDGES, 1.0))
    assert table4.RATIO_EDGES[below_one] == 1.0
    for run in runs:
        counts = hists[run["label"]]  # [L, B+1]
        assert counts.shape == (4, len(table4.RATIO_EDGES))
        assert counts.sum(axis=1).tolist() == [20] * 4
        assert counts[:, :below_one].sum() / counts.sum() == pytest.approx(run["descent_rate"])


@pytest.mark.slow
def test_ratio_histograms_count_each_layer_without_the_excluded_ratios():
    """The runner hands a run's test ratios as ``[N, L]`` with NaN where a ratio is excluded
    (its ℓ_(l−1) below the floor: a confident classifier's). A flat list of the kept ones,
    which the histograms once reshaped to ``[-1, L]``, lost the layers, and failed (or
    miscounted) whenever a ratio was excluded: after training, before ``results.json``."""
    from cudt.metrics import descent_stats
    from experiments.paper.text_table.report import ratio_histograms

    losses = np.array([[0.7, 0.6, 0.5, 0.4]] * 2 + [[0.7, 1e-7, 0.5, 0.4], [0.7, 0.6, 0.5, 3.0]])
    stats = descent_stats(losses)
    assert stats.excluded == 1 and stats.ratios.shape == (4, 3)
    runs = [{"layers": 3, "label": "a"}, {"layers": 3, "label": "diverged"}]
    counts, labels = ratio_histograms(runs, [stats.ratios, None])
    assert labels == ["a", "diverged"] and counts.shape == (2, 3, len(table4.RATIO_EDGES))
    assert counts[0].sum(axis=1).tolist() == [4, 3, 4]  # layer 2: 0.5 / 1e-7 is excluded
    assert counts[0, 2, -1] == 1  # 3.0 / 0.5 = 6 > 2.5: the last count
    assert counts[1].sum() == 0


def test_rerun_reuses_finished_subruns_and_refuses_other_flags(micro_grid, capsys):
    out, argv = micro_grid
    subs = ["imdb-minilm", "mnli-minilm"]
    argv = [*argv, "--no-figures"]  # a batch rerun: reused the same
    assert_rerun_reuses(text_table.main, argv, out, subs, "MiniLM-4", capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--datasets", "imdb,sst2"], "--datasets: unknown dataset 'sst2'"),
        (["--models", "ut,gpt2"], "--models: unknown model 'gpt2'"),
        (["--gamma-trains", "0,nan"], "--gamma-trains must all be finite numbers >= 0"),
        (["--headline-gamma", "0.5"], "--headline-gamma 0.5 is not among --gamma-trains"),
        (["--sweep", "gamma_train=0,1"], "--sweep gamma_train: the training levels are"),
        (
            ["--sweep", "nupi_kp=0,1"],
            "--sweep nupi_kp does not act in this table's runs, which "
            "train --dual-optimizer adam (the task's; the table has no flag for it): sweep one of",
        ),
        (["--encoder-granularity", "layer"], "--encoder-granularity must be block or sublayer"),
        (["--models", "ut", "--encoder-granularity", "block"], "read by the pretrained encod"),
        (["--models", "minilm", "--layers", "5"], "--models minilm trains no UT (the encoders"),
        (["--max-length", "2"], "--max-length must be >= 4, got 2"),
        (["--data-dir", "{tmp}"], "--data-dir is read by --scale paper only"),
        (
            ["--scale", "paper"],
            "--scale paper needs --data-dir TFDS_DIR, --checkpoint-distilbert DIR, "
            "--checkpoint-roberta DIR",
        ),
        (["--scale", "paper", "--models", "roberta"], "needs --data-dir TFDS_DIR, --checkpoint-r"),
        (["--models", "distilbert"], "--models distilbert needs --checkpoint-distilbert DIR"),
        (
            ["--models", "distilbert", "--checkpoint-distilbert", "{tmp}/roberta"],
            "roberta' holds a roberta model, not distilbert",
        ),
        (["--checkpoint-minilm", "{tmp}/nope"], "--checkpoint-minilm '{tmp}/nope' does not exist"),
        (
            ["--checkpoint-distilbert", "{tmp}/distilbert"],
            "--checkpoint-distilbert would be read by no sub-run (--models minilm,ut at --scale "
            "tiny; the UT reads minilm's word embeddings): add the model to --models, or drop",
        ),
        (
            ["{paper}", "--models", "ut", "--checkpoint-minilm", "{tmp}/x", "--data-dir", "{tmp}"],
            "--checkpoint-roberta, --checkpoint-minilm would be read by no sub-run (--models ut "
            "at --scale paper; the UT reads distilbert's",
        ),
        (
            ["--checkpoint-minilm", "{tmp}/empty"],
            "empty' has no config.json, tokenizer.json, model",
        ),
        (["{paper}", "--data-dir", "{tmp}/nope"], "--data-dir '{tmp}/nope' does not exist"),
        (["{paper}", "--data-dir", "{tmp}"], "has no prepared imdb_reviews/plain_text"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    distilbert = _encoder_folder(tmp_path / "distilbert", "distilbert")
    roberta = _encoder_folder(tmp_path / "roberta", "roberta")
    (tmp_path / "empty").mkdir()
    paper = ["--scale", "paper", "--checkpoint-distilbert", str(distilbert)]
    paper += ["--checkpoint-roberta", str(roberta)]
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "{paper}":
        argv = paper + argv[1:]
    message = message.replace("{tmp}", str(tmp_path))
    assert_one_line_error(text_table.main, [*argv, "--out", out], capsys, message, out=out)


def test_cells_over_seeds_are_means_and_the_count_needs_a_paired_interval():
    """Table 4 over several seeds: a cell is the best point's mean AUC over the seeds (on
    validation AUC), the higher bold and counted only where the paired t interval excludes 0."""

    def runs(kind: str, aucs: list[float]) -> list[dict]:
        return [
            {
                "model": "ut", "layers": 3, "constrained": kind == "constrained",
                "gamma_train": 0.5, "seed": s, "hparams": {"lr": 1e-3},
                "label": f"ut-3 {kind} seed {s}", "diverged": False, "feasible": True,
                "best": s == 0, "auc": a, "val_auc": a, "val_accuracy": a,
                "accuracy": [a, a - 0.1], "test_gamma": [0.5, 1.0],
                "loss_decreases_val": True, "loss_decreases": True, "descent_rate": 0.9,
                "mean_ratio": 0.8, "median_ratio": 0.8, "layer_loss": [[0.7, 0.6], [0.7, 0.6]],
                "max_multipliers": [1.0], "not_applicable": [],
            }
            for s, a in enumerate(aucs)
        ]  # fmt: skip

    res = {"config": {"out": "/x/imdb-ut3"}}
    for con, higher in (([1.82, 1.84, 1.83], True), ([1.95, 1.70, 1.78], False)):
        res["runs"] = runs("ERM", [1.80, 1.81, 1.79]) + runs("constrained", con)
        rows = table4.best_rows({("imdb", "ut", 3): res})
        assert {r["kind"]: round(r["auc"], 4) for r in rows} == {
            "ERM": 1.8, "constrained": round(sum(con) / 3, 4)}  # fmt: skip
        text = table4.headline_markdown(rows, ["imdb"], 0.5, [0.5, 1.0])
        shown = f"{sum(con) / 3:.3f}"
        assert headline_cells(text)["UT-3"] == [f"**{shown}**" if higher else shown, "1.800"]
        assert f"(paired t interval over seeds excluding 0) in {int(higher)} of 1" in text


def test_figures_draw_chance_where_the_sub_runs_recorded_their_classes():
    """Fig. 1 and 4 draw chance (ln K, 1/K) from the K the sub-runs recorded, so a UT at chance
    reads as chance, not as a 5e-4 descent; none where K is unknown or differs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = importlib.import_module("experiments.paper.text_table.figures")
    rows = [{"dataset": "mnli", "num_classes": 3}, {"dataset": "imdb", "num_classes": None}]
    _, ax = plt.subplots()
    figures._chance_line(ax, rows, "mnli", np.log, "chance, ln {k}")
    figures._chance_line(ax, rows, "imdb", np.log, "chance, ln {k}")  # unknown: nothing
    rows.append({"dataset": "mnli", "num_classes": 2})
    figures._chance_line(ax, rows, "mnli", np.log, "chance, ln {k}")  # two K: nothing
    [line] = ax.lines
    assert line.get_label() == "chance, ln 3"
    assert np.allclose(line.get_ydata(), np.log(3))
    plt.close("all")


def test_fig12_legend_states_the_pooled_ratios_it_draws(tmp_path, monkeypatch):
    """Over several seeds Fig. 12 draws every seed's ratios pooled; its legend gave the row's
    numbers, the mean over seeds of each seed's median, mean and share below 1. Two seeds of
    30 and 10 ratios whose medians differ (0.802 and 1.051): the legend now states the pooled
    ratios' mean and share below 1 and the histogram bin holding their median, not the mean
    of the seeds' medians (0.927), means (0.907) or shares (70%)."""
    import matplotlib

    matplotlib.use("Agg")
    figures = importlib.import_module("experiments.paper.text_table.figures")
    edges = table4.RATIO_EDGES
    values = {0: [0.802] * 30, 1: [0.951] * 4 + [1.051] * 6}  # per seed, one layer
    stats = {s: (np.mean(v), np.median(v), np.mean(np.less(v, 1))) for s, v in values.items()}

    def run(kind: str, s: int) -> dict:
        mean, median, rate = stats[s]
        return {
            "model": "ut", "layers": 1, "constrained": kind == "constrained",
            "gamma_train": 1.0, "seed": s, "hparams": {"lr": 1e-3},
            "label": f"ut-1 {kind} seed {s}", "diverged": False, "feasible": True,
            "best": s == 0, "auc": 1.8, "val_auc": 1.8, "val_accuracy": 0.9,
            "accuracy": [0.9, 0.8], "test_gamma": [0.5, 1.0],
            "loss_decreases_val": True, "loss_decreases": True, "descent_rate": rate,
            "mean_ratio": mean, "median_ratio": median, "layer_loss": [[0.7, 0.6]] * 2,
            "max_multipliers": [1.0], "not_applicable": [],
        }  # fmt: skip

    runs = [run(k, s) for k in ("ERM", "constrained") for s in (0, 1)]
    rows = table4.best_rows({("imdb", "ut", 1): {"config": {"out": "/x/imdb-ut1"}, "runs": runs}})
    counts = np.zeros((len(runs), 1, edges.size), np.int64)
    for i, r in enumerate(runs):
        counts[i, 0, :-1] = np.histogram(values[r["seed"]], bins=edges)[0]
    (tmp_path / "imdb-ut1").mkdir()
    labels = np.asarray([r["label"] for r in runs], dtype=str)
    np.savez(tmp_path / "imdb-ut1" / table4.RATIOS_FILE, edges=edges, counts=counts, labels=labels)

    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig))
    opts = table4.Table4Config(datasets=("imdb",))
    figures.plot_fig12(rows, opts, tmp_path, tmp_path / "fig12.png")
    [ax] = drawn[0].axes
    shown = ax.get_legend_handles_labels()[1]
    pooled = "mean 0.854, median in [0.8, 0.8025), 85% < 1"  # (30·0.802+4·0.951+6·1.051)/40
    assert shown == [f"ERM: {pooled}", f"constrained: {pooled}"], shown
    # a point the runner chose by its resilient fallback is named so (its table cell: r)
    marked = [dict(r, resilient=r["kind"] == "constrained") for r in rows]
    figures.plot_fig12(marked, opts, tmp_path, tmp_path / "fig12.png")
    assert drawn[1].axes[0].get_legend_handles_labels()[1][1].startswith("constrained (resilient)")
    row = next(r for r in rows if r["kind"] == "ERM")
    assert row["median_ratio"] == pytest.approx(0.9265)  # the mean of the seeds' medians
    # one seed's run alone: its own exact numbers
    seed_1 = {row["labels"][1]: counts[1]}
    assert figures.ratio_stats_text(row, edges, seed_1)[1] == "mean 1.011, median 1.051, 40% < 1"
    # an even count whose two middle ratios lie in two bins: from one's left edge to the other's
    two = np.append(np.histogram([0.802, 0.951], bins=edges)[0], 0)
    assert figures.binned_median(edges, two) == (0.8, 0.9525)
