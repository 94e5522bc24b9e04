"""The fine-tuned decoders of a finished ``experiments.llm_sft`` run, as Hugging Face folders
(or one GGUF file), read from its checkpoints.

    python -m experiments.export_decoder RUN DIR                  # the chosen runs, one folder each
    python -m experiments.export_decoder RUN DIR --run "llm-4 constrained seed 0"
    python -m experiments.export_decoder RUN model.gguf --run "llm-4 ERM seed 0" --dtype float16

``RUN`` is the ``--out`` folder of a finished run. Without ``--run``: the chosen runs (the best
constrained and the best ERM run on validation), a folder per run under ``DIR`` and
``export.json`` naming them; ``llm_sft --export DIR`` writes the same after training. With one
``--run``: that run's model at ``DIR`` (``.gguf``: one GGUF file; its tokenizer must be
byte-level BPE, so not the tiny decoder's word tokenizer). ``DIR`` must not exist or be empty
(``--overwrite``); it is written to a temporary name and renamed when complete.
"""

from cudt.runner.cli import configure_process, exit_process, run_cli
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_export import export_cli

__all__ = ["main"]


def main(argv=None) -> int:
    configure_process()
    return run_cli(lambda: export_cli(LLMTask(), argv))


if __name__ == "__main__":
    exit_process(main())
