"""Text classification with perturbed embeddings: ERM vs layerwise-descent constrained models.

Run (all-MiniLM-L6-v2 from the pip package, generated sentiment reviews, no download; small
enough for a CPU):

    python -m experiments.text_classify

RoBERTa on IMDb, one constraint per sub-layer (the paper's L = 24), from a prepared TFDS folder:

    python -m experiments.text_classify --model roberta --checkpoint /models/roberta-base \\
        --dataset imdb --data-dir ~/tensorflow_datasets --granularity sublayer

A UT over MiniLM's word embeddings on MNLI (premise and hypothesis joined by the tokenizer):

    python -m experiments.text_classify --model ut --layers 5 --dataset mnli --data-dir DIR

Writes ``results.json``, ``layer_loss.png``, ``accuracy_vs_gamma.png``, ``ratio_hist.png``,
``training_curves.png`` and TensorBoard logs under ``--out`` (a fresh
``runs/text_classify-<time>`` folder by default) and prints a summary table with the paper's
per-sample descent figures beside it.
"""

from cudt.runner.cli import exit_process, task_main
from cudt.tasks.text import TextConfig as Config
from cudt.tasks.text import TextTask

__all__ = ["Config", "main"]


def main(argv=None) -> int:
    return task_main(TextTask(), argv, __doc__.split("\n\n")[0], "experiments.text_classify")


if __name__ == "__main__":
    exit_process(main())
