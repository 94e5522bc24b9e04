"""The paper's video grid (Table 3 of appendix B.4) as one job: ERM vs constrained DUST and UT,
L in {3, 5, 7}, on UCSD, Avenue and ShanghaiTech, at every training perturbation level.

Tiny scale (generated copies of the three datasets in their real layouts, small enough for a CPU):

    python -m experiments.video_table --scale tiny --out runs/table3-tiny

Paper scale (the extracted datasets under one folder: UCSD_Anomaly_Dataset.v1p2, 'Avenue
Dataset', shanghaitech), with the hyperparameters to search as sweeps:

    python -m experiments.video_table --scale paper --data-root /data --out runs/table3 \\
        --sweep epsilon=0.05,0.1 --sweep dual_lr=1e-2,5e-2

One runner call per (dataset, L) trains every γ_train × sweep point × seed of a model structure
as one vmapped program; rerunning the same command reuses finished sub-runs and resumes
interrupted ones. Writes table3.csv, table3.md, fig2_rmse_vs_gamma.png, fig3_depth.png and
fig7_layer_loss.png under --out and prints the headline table.
"""

from cudt.runner.cli import config_main, exit_process
from experiments.paper.video_table import Table3Config, run_table

__all__ = ["Table3Config", "main"]


def main(argv=None) -> int:
    return config_main(Table3Config, run_table, argv, __doc__, "experiments.video_table")


if __name__ == "__main__":
    exit_process(main())
