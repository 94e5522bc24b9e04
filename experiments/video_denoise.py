"""Video denoising: ERM vs layerwise-descent constrained DUST and UT.

Run (embedded synthetic surveillance video, no download, small enough for a laptop CPU):

    python -m experiments.video_denoise

On UCSD Anomaly frames (``UCSDped2/Train/Train001/001.tif`` ...):

    python -m experiments.video_denoise --dataset ucsd --data-dir /data/UCSD_Anomaly_Dataset.v1p2

A sweep, every point and seed trained as one program per model structure:

    python -m experiments.video_denoise --sweep epsilon=0.05,0.1,0.2 --sweep lr=1e-3,3e-3

Writes ``results.json``, ``layer_loss.png``, ``rmse_vs_gamma.png``, ``training_curves.png`` and
TensorBoard logs under ``--out`` (a fresh ``runs/video_denoise-<time>`` folder by default) and
prints a summary table.
"""

from cudt.runner.cli import exit_process, task_main
from cudt.tasks.video import VideoConfig as Config
from cudt.tasks.video import VideoTask

__all__ = ["Config", "main"]


def main(argv=None) -> int:
    return task_main(VideoTask(), argv, __doc__.split("\n\n")[0], "experiments.video_denoise")


if __name__ == "__main__":
    exit_process(main())
