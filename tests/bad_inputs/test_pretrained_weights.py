"""Pretrained weights (``cudt.load_encoder``, ``experiments.text_classify --checkpoint FOLDER``):
a broken or unsafe model folder is refused with one line, and pickles are never unpickled
(docs/errors.md: "Pretrained weights"). The helpers are in refusals.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import ml_dtypes
import numpy as np
from helpers import BERT_BLOCK, random_blocks
from refusals import check, entry_cli, over_cases, refused, tree
from safetensors.numpy import load_file, save_file

import cudt
from cudt.runner.cli import run_cli

D, F, V, P = 8, 12, 20, 16  # hidden, MLP, vocabulary, positions of a tiny BERT


def bert_folder(folder: Path, *, config=None, tensors=None) -> Path:
    """A Hugging Face BERT folder (config.json + model.safetensors) with random weights."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    t = {
        "embeddings.word_embeddings.weight": rand(V, D),
        "embeddings.position_embeddings.weight": rand(P, D),
        "embeddings.token_type_embeddings.weight": rand(2, D),
        "embeddings.LayerNorm.weight": rand(D),
        "embeddings.LayerNorm.bias": rand(D),
    }
    t.update(random_blocks(rand, 1, BERT_BLOCK, D, F, norm_offset=0.0))
    cfg = dict(
        model_type="bert",
        hidden_size=D,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=F,
        vocab_size=V,
        max_position_embeddings=P,
        type_vocab_size=2,
        hidden_act="gelu",
    )
    cfg.update(config or {})
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(t if tensors is None else tensors, str(folder / "model.safetensors"))
    return folder


class _Trap:
    """Unpickling this creates the file ``marker``: proof that a loader unpickled it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickle_only(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(marker)))
    return folder


def _pickle_named_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").write_bytes(pickle.dumps(_Trap(marker)))
    return folder


def _truncated_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


def _no_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").unlink()
    return folder


def _no_config(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "config.json").unlink()
    return folder


def _broken_config(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "config.json").write_text('{"model_type": "bert",')
    return folder


def _int8_weights(folder: Path, marker: Path) -> Path:
    """A bitsandbytes-style int8 query weight (its codes, no quantization_config): cast to float
    it is another model, and it loaded as one."""
    bert_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    tensors[key] = np.round(tensors[key] * 40).astype(np.int8)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _fp8_weights(folder: Path, marker: Path) -> Path:
    """An fp8 (F8_E4M3) query weight, config.json without quantization_config: refused as
    "corrupt or truncated" (numpy cannot hold it), though the file is whole."""
    bert_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    tensors[key] = tensors[key].astype(ml_dtypes.float8_e4m3fn)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _two_layers(folder: Path, marker: Path) -> Path:
    """Two layers of weights, config.json's num_hidden_layers 1: it loaded as a 1-layer model."""
    bert_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    layer0 = "encoder.layer.0."
    second = {
        "encoder.layer.1." + k[len(layer0) :]: v for k, v in tensors.items() if k.startswith(layer0)
    }
    save_file(tensors | second, str(folder / "model.safetensors"))
    return folder


def _sharded(folder: Path, marker: Path, edit=None, also: str | None = None) -> Path:
    """The folder's weights in two shards and their index (``edit``: the index's text, changed;
    ``also``: a tensor of the first shard written in the second too)."""
    bert_folder(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-1.safetensors": names[: len(names) // 2]}
    shards["model-2.safetensors"] = names[len(names) // 2 :]
    index = {"weight_map": {k: shard for shard, held in shards.items() for k in held}}
    for shard, held in shards.items():
        save_file({k: tensors[k] for k in {*held, *([also] if also else [])}}, str(folder / shard))
    text = json.dumps(index | {"metadata": {}}) if edit is None else edit(json.dumps(index))
    (folder / "model.safetensors.index.json").write_text(text)
    return folder


QUERY = "encoder.layer.0.attention.self.query.weight"


WEIGHT_CASES = [
    # (case, build the model folder, problem, fix)
    ("model folder missing", lambda f, m: f, "does not exist", "pass a folder holding config.json"),
    (
        "model folder is a file",
        lambda f, m: (f.write_text("{}"), f)[1],
        "is a file, not a folder",
        "pass a folder holding config.json",
    ),
    (
        "weights file missing",
        _no_safetensors,
        "has no model.safetensors",
        "save_pretrained(dir, safe_serialization=True)",
    ),
    ("config.json missing", _no_config, "has no config.json", "pass a Hugging Face model folder"),
    ("config.json not JSON", _broken_config, "is not valid JSON", "re-export the model"),
    (
        "unsupported architecture",
        lambda f, m: bert_folder(f, config={"model_type": "gpt2"}),
        "unsupported architecture 'gpt2'",
        "pass a folder of one of those",
    ),
    (
        "weights of another architecture",
        lambda f, m: bert_folder(
            f, tensors={"wte.weight": np.zeros((V, D), np.float32), "wpe.weight": np.zeros((P, D))}
        ),
        "it is not a bert model",
        "pass the folder of a bert model, or the config.json that came with these weights",
    ),
    (
        "weights shape mismatch",
        lambda f, m: bert_folder(f, config={"intermediate_size": 16}),
        "'encoder.layer.0.intermediate.dense.weight' has shape [12, 8], expected [16, 8]",
        "pass the config.json exported with these weights",
    ),
    (
        "weights missing a layer",
        lambda f, m: bert_folder(f, config={"num_hidden_layers": 2}),
        "'encoder.layer.1.attention.self.query.weight' is missing",
        "pass the config.json exported with these weights",
    ),
    (
        "weights with more layers than config.json",
        _two_layers,
        "model.safetensors holds more layers than the 1 of config.json (tensor "
        "'encoder.layer.1.attention.output.LayerNorm.bias')",
        "pass the config.json exported with these weights",
    ),
    (
        "quantized checkpoint",
        lambda f, m: bert_folder(
            f,
            config={"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
        ),
        "config.json has quantization_config (quant_method 'bitsandbytes'): quantized "
        "checkpoints are not loaded",
        "pass the unquantized (float16, bfloat16 or float32) model folder",
    ),
    (
        "integer (quantized) weights",
        _int8_weights,
        "'encoder.layer.0.attention.self.query.weight' has dtype int8, not a floating point weight",
        "pass the unquantized (float16, bfloat16 or float32) model",
    ),
    (
        "fp8 weights",
        _fp8_weights,
        "tensor 'encoder.layer.0.attention.self.query.weight' in ",
        "model.safetensors has dtype F8_E4M3, which is not supported: quantized (fp8) checkpoints are not loaded; "
        "pass the unquantized (float16, bfloat16 or float32) model folder",
    ),
    (
        "pickle checkpoint instead of safetensors",
        _pickle_only,
        "only pytorch_model.bin: pickle checkpoints are not loaded (unsafe)",
        "convert to safetensors",
    ),
    (
        "pickle saved as model.safetensors",
        _pickle_named_safetensors,
        "model.safetensors is a pickle (torch.save) file, not safetensors",
        "convert to safetensors",
    ),
    (
        "shard outside the model folder",
        lambda f, m: _sharded(f, m, lambda t: t.replace('"model-2.', '"../model-2.')),
        "model.safetensors.index.json lists shard '../model-2.safetensors', outside ",
        "re-export the model (its index names each shard by its file name in the folder)",
    ),
    (
        "tensor listed twice in the shard index",
        lambda f, m: _sharded(f, m, lambda t: t[:-2] + f', "{QUERY}": "model-2.safetensors"}}}}'),
        f"model.safetensors.index.json lists tensor '{QUERY}' twice in its weight_map",
        "re-export the model",
    ),
    (
        "tensor in two shards",
        lambda f, m: _sharded(f, m, also=QUERY),
        f"tensor '{QUERY}' is in two shards of ",
        "re-export the model (each tensor in one shard)",
    ),
    (
        "truncated safetensors",
        _truncated_safetensors,
        "it is corrupt or truncated",
        "re-export the safetensors file",
    ),
]


@over_cases(WEIGHT_CASES)
def test_bad_weights(case, build, problem, fix, tmp_path, capsys):
    marker = tmp_path / "UNPICKLED"
    folder = build(tmp_path / "model", marker)
    if "pickle" in case:  # the trap works: unpickling it really would create the marker
        data = next(folder.glob("*.bin"), folder / "model.safetensors").read_bytes()
        pickle.loads(data).close()
        assert marker.exists()
        marker.unlink()
    before = tree(tmp_path / "model")
    capsys.readouterr()
    status = run_cli(lambda: cudt.load_encoder(folder))
    check(case, status, capsys.readouterr().err, problem, fix)
    assert not marker.exists(), "the loader unpickled the checkpoint"
    assert tree(tmp_path / "model") == before


TEXT_TINY = ["--num-train", "8", "--num-test", "4"]  # a few generated reviews


def text_cli(argv, capsys) -> tuple[int, str]:
    """Runs ``python -m experiments.text_classify`` in-process: ``(exit status, stderr)``."""
    from experiments import text_classify

    return entry_cli(text_classify.main, argv, capsys)


@over_cases(WEIGHT_CASES)
def test_bad_weights_through_the_text_cli(case, build, problem, fix, tmp_path, capsys):
    """The same folders given to ``experiments.text_classify --checkpoint``: the same line,
    before --out is created."""
    marker = tmp_path / "UNPICKLED"
    folder = build(tmp_path / "model", marker)
    out = tmp_path / "out"
    argv = ["--model", "bert", "--checkpoint", folder, *TEXT_TINY, "--out", out]
    refused(None, argv, capsys, problem, fix, keeps=tmp_path / "model", via=text_cli)
    assert not marker.exists(), "the loader unpickled the checkpoint"
    assert not out.exists()


def test_model_flag_and_weights_disagree(tmp_path, capsys):
    folder = bert_folder(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--model", "roberta", "--checkpoint", folder, *TEXT_TINY, "--out", out]
    refused(
        "--model and --checkpoint disagree (text CLI)",
        argv,
        capsys,
        "--model roberta but",
        "holds a bert model: pass --model bert or a roberta folder",
        keeps=folder,
        via=text_cli,
    )
    assert not out.exists()


def test_safe_model_folder_loads(tmp_path):
    """The folders above are broken copies of one that loads."""
    enc = cudt.load_encoder(bert_folder(tmp_path / "model"))
    assert enc.num_layers == 1 and enc.config.hidden_size == D
