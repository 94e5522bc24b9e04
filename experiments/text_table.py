"""The paper's text grid (Table 4 of appendix B.4) as one job: ERM vs constrained DistilBERT,
RoBERTa and UT (L in {3, 5, 7, 9}) on IMDb and MNLI, at every training perturbation level,
scored by the area under test accuracy vs embedding perturbation.

Tiny scale (MiniLM standing in for both pretrained encoders, UT-3, generated IMDb- and
MNLI-format data written as prepared TFDS folders; small enough for a CPU):

    python -m experiments.text_table --scale tiny --out runs/table4-tiny

Paper scale (the pretrained folders, the prepared TFDS data), with hyperparameters to search as
sweeps:

    python -m experiments.text_table --scale paper --data-dir ~/tensorflow_datasets \\
        --checkpoint-distilbert /models/distilbert-base-uncased \\
        --checkpoint-roberta /models/roberta-base --out runs/table4 \\
        --sweep epsilon=0.05,0.1 --sweep dual_lr=1e-2,5e-2

One runner call per (dataset, model, L) trains every γ_train × sweep point × seed, ERM and
constrained, as one vmapped program sharded over the devices; rerunning the same command reuses
finished sub-runs and resumes interrupted ones. Writes table4.csv, table4.md,
fig1_layer_loss.png, fig4_accuracy_vs_gamma.png and fig12_ratio_hist.png under --out and prints
the headline table.
"""

from cudt.runner.cli import config_main, exit_process
from experiments.paper.text_table import Table4Config, run_table

__all__ = ["Table4Config", "main"]


def main(argv=None) -> int:
    return config_main(Table4Config, run_table, argv, __doc__, "experiments.text_table")


if __name__ == "__main__":
    exit_process(main())
