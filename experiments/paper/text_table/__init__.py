"""The paper's text grid (appendix B.4, "Table 4") as one job: IMDb and MNLI, DistilBERT,
RoBERTa and UT of every depth, every γ_train, ERM and constrained, through the shared runner;
then the table of accuracy AUCs and Figures 1, 4 and 12.

For each (dataset, model, L) ONE :func:`cudt.runner.run` call of the text task trains the whole
γ_train × sweep point × seed grid, ERM and constrained, as one vmapped program (the runner
shards it over the devices), into ``<out>/<dataset>-<model>[-L<L>]/``. A sub-run whose
``results.json`` exists and whose config matches is reused; an interrupted one resumes from its
checkpoints (the runner's rule); ``--overwrite`` retrains every sub-run. Each (dataset, model,
L, kind, γ_train) shows the sweep point the runner's rule chooses: the highest validation
accuracy AUC (the paper's rule, appendix B.3: validation data scored over the same test γ grid,
the text task's ``--select val-auc``) among the points whose runs did not diverge and,
constrained, met their constraints and descended at every layer on validation.
The test AUC in the table is never used to choose.

Metric (the paper's B.3): the area under test accuracy vs test γ (trapezoid), over one γ grid
shared by every cell (the text task's 0, 0.5, 1, 1.5, 2 joined with every γ_train), so AUCs
compare across cells.

Scales. ``paper``: the pretrained DistilBERT and RoBERTa folders, one constraint per sub-layer
(attention and MLP of each block: the paper's L = 12 and 24), UT with L in {3, 5, 7, 9} over
DistilBERT's word embeddings (as the paper's B.3), IMDb and MNLI from a prepared TFDS folder,
γ_train in {0, 0.2, ..., 1}, five seeds per setting. ``tiny`` (minutes on a CPU): MiniLM
(all-MiniLM-L6-v2, pip) stands in for both pretrained encoders (6 blocks, so L = 12 sub-layers,
as DistilBERT), the UT reads MiniLM's word embeddings, and the data are generated and written
under ``<out>/data`` as prepared TFDS folders (``imdb_reviews/plain_text/1.0.0``,
``glue/mnli/2.0.0``, array_record), read back by the same reader as the real ones: the
generated sentiment reviews of :func:`cudt.data.text.synthetic_sentiment` for IMDb, and
generated premise/hypothesis pairs (:func:`cudt.data.text.nli.generated_nli`) for MNLI.

Figure 12 needs every run's per-sample ratios ℓ_l / ℓ_{l-1}, which ``results.json`` summarises
(descent rate, mean, median) but does not keep: each sub-run is trained by
:class:`RatioRecordingTextTask`, the text task that also writes the histogram of every run's
ratios (per layer, fixed bins) to ``<sub-run>/ratio_histograms.npz`` before ``results.json``.

Outputs under ``<out>``: ``table4.csv`` (long format: one row per cell), ``table4.md`` (the
headline table at ``--headline-gamma``, the direction of each cell against the paper's table,
every γ_train), ``fig1_layer_loss.png``, ``fig4_accuracy_vs_gamma.png``,
``fig12_ratio_hist.png``."""

from __future__ import annotations

from typing import Any

from experiments.paper import job as grid
from experiments.paper.text_table.config import (
    DATASETS,
    GAMMA_TRAINS,
    NAMES,
    PAPER_TABLE4,
    SCALES,
    TABLE_MODELS,
    Table4Config,
    build_tiny_datasets,
    check_inputs,
    checkpoint_of,
    details_note,
    plan,
    prepare_tiny,
    settings_note,
)
from experiments.paper.text_table.figures import figures
from experiments.paper.text_table.report import (
    CSV_COLUMNS,
    RATIO_EDGES,
    RATIOS_FILE,
    RatioRecordingTextTask,
    best_rows,
    gamma_table_lines,
    headline_markdown,
    paper_direction_markdown,
    read_ratio_histograms,
)

__all__ = [
    "CSV_COLUMNS",
    "DATASETS",
    "GAMMA_TRAINS",
    "NAMES",
    "PAPER_TABLE4",
    "RATIOS_FILE",
    "RATIO_EDGES",
    "SCALES",
    "TABLE_MODELS",
    "Table4Config",
    "TextTableJob",
    "best_rows",
    "build_tiny_datasets",
    "check_inputs",
    "checkpoint_of",
    "figures",
    "headline_markdown",
    "paper_direction_markdown",
    "plan",
    "read_ratio_histograms",
    "run_table",
]


class TextTableJob(grid.TableJob):
    name = "text table"
    table = "table4"
    title = "Text grid (the paper's Table 4)"
    csv_columns = CSV_COLUMNS

    def check(self, opts):
        check_inputs(opts)

    def plan(self, opts, out):
        return plan(opts, out)

    def prepare_tiny(self, opts, out):
        prepare_tiny(opts, out)

    def make_task(self):
        return RatioRecordingTextTask()

    def best_rows(self, results):
        return best_rows(results)

    def settings(self, opts, cfg):
        return settings_note(opts, cfg)

    def details(self, opts, cfg):
        return details_note(opts, cfg)

    def headline(self, rows, opts, test_gammas):
        return headline_markdown(rows, opts.datasets, opts.headline_gamma, test_gammas)

    def direction(self, rows, opts):
        return paper_direction_markdown(rows, opts.datasets, opts.headline_gamma)

    def every_gamma(self, rows, opts):
        return gamma_table_lines(rows, opts.datasets, list(opts.gamma_trains), label_gamma=True)

    def figures(self, rows, opts, out):
        return figures(rows, opts, out)


def run_table(opts: Table4Config) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the table, CSV and figures
    (:func:`experiments.paper.job.run_job`); returns ``{"rows", "markdown", "paths", "trained",
    "reused", "wall_seconds"}``."""
    return grid.run_job(TextTableJob(), opts)
