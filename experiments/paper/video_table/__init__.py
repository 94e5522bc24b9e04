"""The paper's video grid (appendix B.4, "Table 3") as one job: every dataset, depth, γ_train,
model, ERM and constrained, through the shared runner; then the table and Figures 2, 3 and 7.

For each (dataset, L) ONE :func:`cudt.runner.run` call trains the whole γ_train × sweep point ×
seed grid of each model structure as one vmapped program (the runner shards it over the
devices), into ``<out>/<dataset>-L<L>/``. A sub-run whose ``results.json`` exists and whose
config matches is reused; an interrupted one resumes from its checkpoints (the runner's rule);
``--overwrite`` retrains every sub-run. Each (dataset, model, L, kind, γ_train) shows the
sweep point the runner's rule chooses (:func:`cudt.runner.choice.choose_points`): the lowest
validation RMSE among the points whose runs did not diverge and, constrained, met their
constraints and descended at every layer on validation (one seed: that run; several: the mean).

Outputs under ``<out>``: ``table3.csv`` (long format: one row per cell), ``table3.md`` (the
headline table at ``--headline-gamma``, the direction of each cell against the paper's table, and
every γ_train), ``fig2_rmse_vs_gamma.png``, ``fig3_depth.png``, ``fig7_layer_loss.png``; with
``--scale tiny`` also ``data/``: tiny copies of the three datasets in their real layouts
(:mod:`cudt.data.video.archives`), read back through the real readers."""

from __future__ import annotations

from typing import Any

from cudt.tasks.video import VideoTask
from experiments.paper import job as grid
from experiments.paper.video_table.config import (
    DATASETS,
    FOLDERS,
    GAMMA_TRAINS,
    NAMES,
    PAPER_TABLE3,
    SCALES,
    TABLE_MODELS,
    TINY_VIT,
    Table3Config,
    build_tiny_datasets,
    check_data_root,
    data_note,
    plan,
    prepare_tiny,
)
from experiments.paper.video_table.figures import figures
from experiments.paper.video_table.report import (
    CSV_COLUMNS,
    best_rows,
    gamma_table_lines,
    headline_markdown,
    paper_direction_markdown,
)

__all__ = [
    "CSV_COLUMNS",
    "DATASETS",
    "FOLDERS",
    "GAMMA_TRAINS",
    "NAMES",
    "PAPER_TABLE3",
    "SCALES",
    "TABLE_MODELS",
    "TINY_VIT",
    "Table3Config",
    "VideoTableJob",
    "best_rows",
    "build_tiny_datasets",
    "figures",
    "headline_markdown",
    "paper_direction_markdown",
    "run_table",
]


class VideoTableJob(grid.TableJob):
    name = "video table"
    table = "table3"
    title = "Video grid (the paper's Table 3)"
    csv_columns = CSV_COLUMNS

    def check(self, opts):
        check_data_root(opts)

    def plan(self, opts, out):
        return plan(opts, out)

    def prepare_tiny(self, opts, out):
        prepare_tiny(opts, out)

    def make_task(self):
        return VideoTask()

    def best_rows(self, results):
        return best_rows(results)

    def settings(self, opts, cfg):
        return f"{cfg.steps} steps, {cfg.seeds} seed(s)"

    def details(self, opts, cfg):
        return data_note(opts, cfg)

    def headline(self, rows, opts, test_gammas):
        return headline_markdown(
            rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma, test_gammas
        )

    def direction(self, rows, opts):
        return paper_direction_markdown(
            rows, opts.datasets, opts.models, opts.layers, opts.headline_gamma
        )

    def every_gamma(self, rows, opts):
        return gamma_table_lines(
            rows, opts.datasets, opts.models, opts.layers, list(opts.gamma_trains), label_gamma=True
        )

    def figures(self, rows, opts, out):
        return figures(rows, opts, out)


def run_table(opts: Table3Config) -> dict[str, Any]:
    """Trains (or reuses) every sub-run, then writes the table, CSV and figures
    (:func:`experiments.paper.job.run_job`); returns ``{"rows", "markdown", "paths", "trained",
    "reused", "wall_seconds"}``."""
    return grid.run_job(VideoTableJob(), opts)
