"""The LLM task's own data files and its model exports (``experiments.llm_sft``,
``experiments.export_decoder``): refused with one line before anything is written
(docs/errors.md: "Instruction data and model exports"). The helpers are in refusals.py."""

from __future__ import annotations

import json
from pathlib import Path

from refusals import entry, over_cases, refused

LLM_TINY = ["--num-train", "8", "--num-val", "2", "--num-test", "2", "--steps", "1",
            "--layers", "1", "--hidden", "8", "--heads", "1", "--kv-heads", "1"]  # fmt: skip


def _tiny_beside(flags: list) -> list:
    """LLM_TINY without the size of a split ``flags`` give a file of its own (``--num-test``
    beside ``--test-data`` is refused: the file is every record of it), nor the tiny decoder's
    sizes beside a ``--checkpoint``, which brings its own."""
    given = {str(f) for f in flags}
    tiny = LLM_TINY if "--checkpoint" not in given else LLM_TINY[: LLM_TINY.index("--layers")]
    pairs = zip(tiny[::2], tiny[1::2], strict=True)
    drop = {f"--num-{s}" for s in ("train", "val", "test") if f"--{s}-data" in given}
    return [x for name, value in pairs if name not in drop for x in (name, value)]


def _alpaca_file(folder: Path, name: str, records: list) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(records))
    return folder / name


def _record(i: int) -> dict:
    return {"instruction": f"Say {i}.", "input": "", "output": f"{i}"}


def _no_output(tmp: Path) -> list:
    rows = [_record(0), {"instruction": "Say hi.", "input": ""}]
    return ["--train-data", _alpaca_file(tmp / "data", "train.json", rows), "--data", "toy"]


def _empty_file(tmp: Path) -> list:
    (tmp / "data").mkdir(parents=True)
    (tmp / "data" / "test.jsonl").write_text("")
    return ["--test-data", tmp / "data" / "test.jsonl", "--data", "toy"]


def _no_instruction(tmp: Path) -> list:
    path = tmp / "data" / "val.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record(0)) + "\n" + json.dumps({"output": "hi"}) + "\n")
    return ["--val-data", path, "--data", "toy"]


def _three_files_and_data(tmp: Path) -> list:
    files = [_alpaca_file(tmp / "data", f"{s}.json", [_record(0)]) for s in ("a", "b", "c")]
    return ["--train-data", files[0], "--val-data", files[1], "--test-data", files[2],
            "--data", "tasks"]  # fmt: skip


def _export_not_empty(tmp: Path) -> list:
    (tmp / "models").mkdir()
    (tmp / "models" / "notes.txt").write_text("mine")
    return ["--export", tmp / "models"]


def _export_of_a_finished_run(tmp: Path) -> list:
    out = tmp / "out"
    out.mkdir()
    (out / "results.json").write_text('{"experiment": "llm_sft", "runs": []}')
    return ["--export", tmp / "models"]


def _export_holding_a_run(tmp: Path) -> list:
    (tmp / "models" / "old-run").mkdir(parents=True)
    (tmp / "models" / "old-run" / "results.json").write_text('{"runs": []}')
    return ["--export", tmp / "models", "--overwrite-export"]


def _tied_checkpoint(tmp: Path, num_layers: int = 1, max_positions: int = 2048) -> list:
    """A tiny tied checkpoint (D = 8) at tmp/base, with --data toy."""
    import jax

    from cudt.data.alpaca import AlpacaRecord, build_word_tokenizer
    from cudt.models.llama import DecoderConfig, write_decoder_folder

    config = DecoderConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=num_layers, num_heads=1,
        num_kv_heads=1, tie_word_embeddings=True, max_position_embeddings=max_positions,
    )  # fmt: skip
    words = build_word_tokenizer([AlpacaRecord(**_record(i)) for i in range(12)])
    write_decoder_folder(tmp / "base", config, config.init_params(jax.random.key(0)), words)
    return ["--checkpoint", tmp / "base", "--data", "toy"]


def _template_without_its_markers(tmp: Path) -> list:
    """The tiny checkpoint with a ChatML template, whose markers its word tokenizer lacks."""
    from cudt.models.llama.gguf import CHATML

    flags = _tied_checkpoint(tmp, num_layers=2)
    (tmp / "base" / "chat_template.jinja").write_text(CHATML)
    return flags


def _an_export(tmp: Path) -> Path:
    """An export as export_decoder writes one of a LoRA run, of the tiny checkpoint at
    tmp/base: models/export.json and models/<run>/ (the merged model, its adapters in
    adapter/). The folder of models."""
    import shutil

    import jax

    from cudt.models.llama import DecoderConfig, LoraSpec, init_adapters, save_adapters

    _tied_checkpoint(tmp)
    model = tmp / "models" / "llm-1-constrained-seed-0"
    shutil.copytree(tmp / "base", model)
    (tmp / "models" / "export.json").write_text('{"models": [{"folder": "' + model.name + '"}]}')
    config = DecoderConfig.from_dict(json.loads((model / "config.json").read_text()))
    spec = LoraSpec(2, 4.0, ("q", "v"))
    adapters = init_adapters(config, spec, jax.random.key(0))
    save_adapters(model / "adapter", adapters, spec, base=str(tmp / "base"))
    return tmp / "models"


LLM_CASES = [
    (
        "--checkpoint at an export's folder of models",
        lambda tmp: ["--checkpoint", _an_export(tmp), "--data", "toy"],
        "/tmp/models has no config.json: it is an export (export.json) of model folders "
        "(llm-1-constrained-seed-0)",
        "pass one of them, e.g. /tmp/models/llm-1-constrained-seed-0",
    ),
    (
        "--checkpoint at an export's LoRA adapters",
        lambda tmp: [
            "--checkpoint",
            _an_export(tmp) / "llm-1-constrained-seed-0" / "adapter",
            "--data",
            "toy",
        ],  # fmt: skip
        "/tmp/models/llm-1-constrained-seed-0/adapter holds LoRA adapters (PEFT's "
        "adapter_config.json), not a model",
        "pass the merged model beside them, /tmp/models/llm-1-constrained-seed-0, or their "
        "base /tmp/base (with --lora-rank, to train adapters anew)",
    ),
    # (case, build(tmp) -> flags, problem, fix)
    (
        "--train-data record without output",
        _no_output,
        "--train-data: '/tmp/data/train.json' record 1 has no \"output\" key",
        "fix or remove it",
    ),
    (
        "--val-data record without instruction",
        _no_instruction,
        "--val-data: '/tmp/data/val.jsonl' record 1 (line 2) has no \"instruction\" key",
        "fix or remove it",
    ),
    (
        "--test-data file empty",
        _empty_file,
        "--test-data: '/tmp/data/test.jsonl' is empty",
        "it must hold one JSON record per line",
    ),
    (
        "--test-data without --train-data or --data",
        lambda tmp: ["--test-data", _alpaca_file(tmp / "data", "test.json", [_record(0)])],
        "--test-data without --train-data or --data would train on the 8 small toy templates",
        "pass --train-data FILE or --data FILE (or --data toy / tasks to train on a generated",
    ),
    (
        "--num-test beside --test-data",
        lambda tmp: [
            "--data",
            "toy",
            "--num-test",
            "5",
            "--test-data",
            _alpaca_file(tmp / "data", "test.json", [_record(0)]),
        ],
        "--num-test sizes the test split dealt from --data, and --test-data gives that split as "
        "every record of its file",
        "drop --num-test",
    ),  # fmt: skip
    (
        "--train-data without --data or held-out files",
        lambda tmp: ["--train-data", _alpaca_file(tmp / "data", "train.json", [_record(0)])],
        "--train-data without --data leaves the val and test splits to the 8 small toy templates",
        "pass --val-data FILE and --test-data FILE, or --data FILE to deal from (or --data toy",
    ),
    (
        "--checkpoint of 1 block whose problem starts at its readout",
        _tied_checkpoint,
        "--checkpoint /tmp/base has 1 block and the problem starts at its readout "
        "(--reference-state auto: its tied head reads the frozen input embeddings)",
        "pass a model of 2 or more blocks, or --reference-state embeddings",
    ),
    (
        "--checkpoint with fewer positions than asked",
        lambda tmp: [
            *_tied_checkpoint(tmp, num_layers=2, max_positions=32),
            *("--max-length", "24", "--max-new-tokens", "16"),
        ],
        "--max-length 24 + --max-new-tokens 16 = 40 positions, but /tmp/base has 32 "
        "(max_position_embeddings)",
        "pass a smaller --max-length or --max-new-tokens (or --completions 0)",
    ),
    (
        "--data with all three split files",
        _three_files_and_data,
        "--data has no split left to deal",
        "drop --data or one of them",
    ),
    (
        "--export folder not empty",
        _export_not_empty,
        "--export /tmp/models already exists and is not empty",
        "pass another path, or --overwrite-export to replace it",
    ),
    (
        "--overwrite-export without --export",
        lambda tmp: ["--overwrite-export"],
        "--overwrite-export replaces what --export holds",
        "pass --export DIR or drop it",
    ),
    (
        "--export with a finished --out",
        _export_of_a_finished_run,
        "--out /tmp/out holds a finished run",
        "python -m experiments.export_decoder /tmp/out /tmp/models",
    ),
    (
        "--export is --out",
        lambda tmp: ["--export", tmp / "out", "--overwrite-export"],
        "--export /tmp/out holds --out /tmp/out",
        "writing the models there would replace it; pass an --export path outside it",
    ),
    (
        "--export inside --out",  # it trained, then wrote the models over its checkpoints
        lambda tmp: ["--export", tmp / "out" / "checkpoints", "--overwrite-export"],
        "--export /tmp/out/checkpoints lies inside --out /tmp/out",
        "pass an --export folder outside --out",
    ),
    (
        "--export empty",
        lambda tmp: ["--export="],
        "--export needs a path",
        "pass --export DIR (a folder)",
    ),
    (
        "--export FILE.gguf",
        lambda tmp: ["--export", tmp / "model.gguf"],
        "--export /tmp/model.gguf: --export writes a folder, a model per chosen run",
        "python -m experiments.export_decoder OUT FILE.gguf --run LABEL",
    ),
    (
        "--export holding the --checkpoint folder",
        lambda tmp: [
            "--checkpoint",
            _alpaca_file(tmp / "base", "x.json", []).parent,
            "--export",
            tmp / "base",
        ],  # fmt: skip
        "--export /tmp/base holds --checkpoint /tmp/base",
        "pass an --export path outside it",
    ),
    (
        "--overwrite-export of a folder holding a run",
        _export_holding_a_run,
        "--export /tmp/models holds an experiment's run (/tmp/models/old-run/results.json)",
        "replacing it would delete the run; pass another path",
    ),
    (
        "--lora-rank 0",
        lambda tmp: ["--lora-rank", "0", "--checkpoint", "smollm2"],
        "--lora-rank must be >= 1",
        "got 0",
    ),
    (
        "--lora-targets with an unknown projection",
        lambda tmp: ["--lora-rank", "8", "--checkpoint", "smollm2", "--lora-targets", "q,attn"],
        "--lora-targets must all be one of q, k, v, o, gate, up, down",
        "attn",
    ),
    (
        "a tiny decoder's size beside --checkpoint",
        lambda tmp: ["--checkpoint", "smollm2", "--hidden", "32"],
        "--hidden sizes the tiny decoder, which --checkpoint smollm2 replaces with its own sizes",
        "drop it",
    ),
    (
        "--lora-rank above a projection's rank",  # A B: rank <= 8; 10 trains more, for nothing
        lambda tmp: [*_tied_checkpoint(tmp, num_layers=2), "--lora-rank", "10"],
        "--lora-rank 10 exceeds the q projection of --checkpoint /tmp/base (8 x 8), whose "
        "update A B has rank at most 8",
        "pass --lora-rank 8 or less",
    ),
    (
        "--checkpoint whose tokenizer lacks its chat template's markers",
        _template_without_its_markers,
        "the chat template of /tmp/base writes <|im_start|>, which its tokenizer has no token "
        "for (chat prompts would spell it in 3 pieces of text)",
        "pass --prompt-format alpaca, or a checkpoint whose tokenizer holds its template's markers",
    ),
    (
        "--lora-rank without --checkpoint",
        lambda tmp: ["--lora-rank", "8"],
        "--lora-rank adapts a pretrained model",
        "pass --checkpoint FOLDER, model.gguf or smollm2",
    ),
    (
        "--lora-rank with --train-embeddings",
        lambda tmp: ["--lora-rank", "8", "--checkpoint", "smollm2", "--train-embeddings"],
        "--lora-rank trains adapters only, the base frozen",
        "drop --train-embeddings",
    ),
    (
        "--lora-alpha without --lora-rank",
        lambda tmp: ["--lora-alpha", "16"],
        "--lora-alpha shapes LoRA adapters",
        "pass --lora-rank R too, or drop it",
    ),
    (
        "--bucket-tokens where every position is read out",
        lambda tmp: ["--readout-tokens", "all", "--bucket-tokens", "64"],
        "--bucket-tokens sizes the buckets of the response readout",
        "drop --bucket-tokens",
    ),
    (
        "--base-dtype bfloat16 without --lora-rank",
        lambda tmp: ["--base-dtype", "bfloat16"],
        "--base-dtype stores the frozen base of LoRA adapters",
        "pass --lora-rank R too, or drop it",
    ),
]


BASE_CASES = [
    ("--lora-rank resumed over other base weights", ["--lora-rank", "2"]),
    # a fixed noise scale: the embeddings' std (noise_unit) does not tell the bases apart
    ("full fine-tuning resumed over other base weights", ["--noise-scale", "0.1"]),
]


@over_cases(BASE_CASES, "case, lora")
def test_llm_resume_over_another_base(tmp_path, capsys, case, lora):
    """LoRA checkpoints hold the adapters alone, and a full fine-tuning's hold no frozen leaf
    (the input embeddings: read again from --checkpoint): an --out trained over other base
    weights than --checkpoint holds now (the same path and flags) is refused before anything
    is trained or written. The checkpoints' record is the one a run of these flags writes (the
    runner's fingerprint of the config and the task's, the base's digest in it)."""
    import jax

    from cudt.data.alpaca import AlpacaRecord, build_word_tokenizer
    from cudt.models.llama import DecoderConfig, write_decoder_folder
    from cudt.runner.cli import config_from_args
    from cudt.runner.output import checkpoint_record
    from cudt.tasks import llm, llm_config
    from experiments import llm_sft

    base = tmp_path / "base"
    config = DecoderConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=1,
        num_kv_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    records = [_record(i) for i in range(12)]
    words = build_word_tokenizer([AlpacaRecord(**r) for r in records])
    write_decoder_folder(base, config, config.init_params(jax.random.key(0)), words)
    data = _alpaca_file(tmp_path / "data", "train.json", records)
    argv = [
        "--checkpoint", base, "--data", data, "--num-train", "8", "--num-val", "2",
        "--num-test", "2", "--steps", "1", *lora, "--out", tmp_path / "out",
    ]  # fmt: skip
    argv = [str(a) for a in argv]
    cfg, _ = config_from_args(llm_config.LLMConfig, argv, "")
    task = llm.LLMTask()
    record = checkpoint_record(cfg) | task.fingerprint(cfg, task.load(cfg))
    (tmp_path / "out" / "checkpoints" / "llm-1" / "1").mkdir(parents=True)  # a saved step
    (tmp_path / "out" / "checkpoints" / "config.json").write_text(json.dumps(record))
    # the same folder, other weights (read again: the cache is keyed by the files' state)
    write_decoder_folder(base, config, config.init_params(jax.random.key(1)), words)
    refused(
        case,
        argv,
        capsys,
        "holds checkpoints trained on other files than its flags name now (base_digest",
        "restore the files they were trained on, pass another --out, or --overwrite",
        keeps=tmp_path / "out",
        via=entry(llm_sft.main),
    )


def test_llm_resumed_with_an_evaluation_flag_that_moves_the_training_split(tmp_path, capsys):
    """The toy set deals its test items first: another --num-test gives other training
    examples, so the checkpoints cannot resume, and the refusal names that flag (an
    evaluation-only one, not in the compared config), not files nobody changed."""
    from cudt.runner.cli import config_from_args
    from cudt.runner.output import checkpoint_record
    from cudt.tasks import llm, llm_config
    from experiments import llm_sft

    argv = [str(a) for a in [*LLM_TINY, "--out", tmp_path / "out"]]
    cfg, _ = config_from_args(llm_config.LLMConfig, argv, "")
    task = llm.LLMTask()
    record = checkpoint_record(cfg) | task.fingerprint(cfg, task.load(cfg))
    (tmp_path / "out" / "checkpoints" / "llm-2" / "1").mkdir(parents=True)  # a saved step
    (tmp_path / "out" / "checkpoints" / "config.json").write_text(json.dumps(record))
    at = argv.index("--num-test")
    refused(
        "--num-test moving the training split of a resumed run",
        [*argv[: at + 1], "4", *argv[at + 2 :]],
        capsys,
        "trained on other examples than this command gives: --num-test 2 -> 4 changes",
        "rerun with the values they were trained with to resume, pass another --out",
        keeps=tmp_path / "out",
        via=entry(llm_sft.main),
    )


@over_cases(LLM_CASES)
def test_llm_files_and_exports(case, build, problem, fix, tmp_path, capsys):
    """Each refused before anything is written: --out stays as it was (absent, or the finished
    run), --export too."""
    from experiments import llm_sft

    flags = build(tmp_path)
    argv = [*_tiny_beside(flags), *flags, "--out", tmp_path / "out"]
    refused(case, argv, capsys, problem, fix, keeps=tmp_path, via=entry(llm_sft.main))


def test_llm_export_of_a_folder_that_is_no_finished_run(tmp_path, capsys):
    from experiments import export_decoder

    (tmp_path / "run").mkdir()
    argv = [tmp_path / "run", tmp_path / "models"]
    via = entry(export_decoder.main)
    refused(
        "export_decoder of a folder without results.json",
        argv,
        capsys,
        "/tmp/run holds no results.json",
        "pass the --out folder of a finished experiments.llm_sft run",
        keeps=tmp_path,  # models/ not made, run/ untouched
        via=via,
    )
    refused(
        "export_decoder of a RUN folder that does not exist",
        [tmp_path / "gone", tmp_path / "models"],
        capsys,
        "/tmp/gone does not exist",
        "pass the --out folder of a finished experiments.llm_sft run",
        keeps=tmp_path,
        via=via,
    )
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "notes.txt").write_text("mine")
    refused(
        "export_decoder into a folder that is not empty",
        argv,
        capsys,
        "DEST /tmp/models already exists and is not empty",
        "pass another path, or --overwrite to replace it",
        keeps=tmp_path,
        via=via,
    )
    # a DEST it cannot create is refused first, before the run is read (this one is no run)
    status, err = via([tmp_path / "run", "/proc/cudt-export"], capsys)
    assert status == 2 and err.startswith("error: cannot write DEST /proc/cudt-export in /proc")


def test_llm_export_decoder_into_its_own_run_or_to_gguf_or_without_its_data(tmp_path, capsys):
    """DEST inside a finished RUN (its checkpoints folder): --overwrite wrote the models over
    the checkpoints and exited 0; refused before DEST is tried, the run byte for byte as it
    was. A .gguf DEST of the tiny decoder's word tokenizer: its fix is a DEST folder (it named
    writing "the GGUF file without a tokenizer", which no flag does). A data file of the run
    gone since: restore it (it named --test-data's fix, "pass the path of a JSON file")."""
    from experiments import export_decoder, llm_sft

    run = tmp_path / "run"
    test = _alpaca_file(tmp_path / "data", "test.json", [_record(i) for i in range(2)])
    flags = ["--data", "toy", "--test-data", test]
    argv = [*_tiny_beside(flags), *flags, "--out", run]
    assert llm_sft.main([str(a) for a in argv]) == 0
    refused(
        "export_decoder into its RUN's checkpoints",
        [run, run / "checkpoints", "--overwrite"],
        capsys,
        "DEST /tmp/run/checkpoints lies inside RUN /tmp/run",
        "pass a DEST folder outside RUN",
        keeps=tmp_path,
        via=entry(export_decoder.main),
    )
    refused(
        "export_decoder of the word tokenizer to a .gguf file",
        [run, tmp_path / "model.gguf", "--run", "llm-1 ERM seed 0"],
        capsys,
        "DEST /tmp/model.gguf: a GGUF file holds byte-level BPE tokenizers (llama.cpp's gpt2 "
        "model), not 'WordLevel' ones",
        "pass a DEST path without .gguf (a folder)",
        keeps=tmp_path,
        via=entry(export_decoder.main),
    )
    test.unlink()
    refused(
        "export_decoder of a run whose data file is gone",
        [run, tmp_path / "models"],
        capsys,
        "--test-data: Alpaca data file '/tmp/data/test.json' does not exist",
        "export_decoder reads the files of the run in /tmp/run again; restore them",
        keeps=tmp_path,
        via=entry(export_decoder.main),
    )


def test_export_with_the_default_out_refuses_a_folder_holding_runs(tmp_path, monkeypatch, capsys):
    """Without --out the run goes to runs/llm_sft-<time>: --export runs (or the working
    folder) would replace it, and every earlier run there, when the models are written."""
    from experiments import llm_sft

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "llm_sft-earlier").mkdir(parents=True)
    for export in ("runs", "."):
        status, err = entry(llm_sft.main)([*LLM_TINY, "--export", export], capsys)
        assert status == 2 and f"--export {export} holds --out runs/llm_sft-<time>" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["llm_sft-earlier", "runs"]


def test_llm_export_into_the_empty_working_folder(tmp_path, monkeypatch, capsys):
    """--export . in an empty working folder (found by the export review): it trained, then
    failed to rename the models over "." ("cannot write . (File exists): free disk space");
    the folder's absolute path was replaced, the shell's working folder deleted. Refused
    before training, as export_decoder's DEST is."""
    from experiments import export_decoder, llm_sft

    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    refused(
        "--export the empty working folder",
        [*LLM_TINY, "--out", tmp_path / "out", "--export", "."],
        capsys,
        "--export . is the working folder /tmp/here",
        "the output is renamed into place, replacing that folder; pass a new folder inside "
        "it, such as models",
        keeps=tmp_path,
        via=entry(llm_sft.main),
    )
    status, err = entry(export_decoder.main)([tmp_path / "out", tmp_path / "here"], capsys)
    assert status == 2 and "is the working folder" in err, err  # (before the run is read)
