"""Hugging Face folders of Llama-family decoders: :func:`load_decoder` and
:func:`write_decoder_folder`.

A folder holds ``config.json``, ``model.safetensors`` (or sharded ``model-0000x-of-0000y``
files + ``model.safetensors.index.json``) and optionally ``tokenizer.json``; tensor names are
those of transformers' ``*ForCausalLM`` (``model.`` prefix optional). The steps of loading are
:func:`cudt.models.hf.load_folder`'s; this module gives the decoder's tensor layout. No torch or
transformers at run time; pickle checkpoints are refused, never opened.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.io import save_safetensors
from cudt.models.hf import (
    SAFETENSORS_FILE,
    Anchor,
    ModelFolderError,
    Weights,
    check_float,
    load_folder,
    read_json,
)
from cudt.models.llama.config import (
    BLOCK_LINEARS,
    DecoderConfig,
    Params,
    Place,
    leaf_at,
    params_from_places,
)
from cudt.models.llama.gguf import load_gguf
from cudt.models.llama.model import Decoder

__all__ = ["load_decoder", "write_decoder_folder"]

# Projections and their HF sub-module names (relative to ``model.layers.{i}.``).
HF_LINEAR = {ours: hf for ours, (hf, _) in BLOCK_LINEARS.items()}
_EMBED_KEY = "embed_tokens.weight"
_HEAD_KEY = "lm_head.weight"  # outside the model prefix


def hf_layout(c: DecoderConfig) -> list[tuple[str, Place, bool]]:
    """Every tensor of a ``*ForCausalLM`` checkpoint of ``c`` but the LM head, once: what
    :func:`load_decoder` reads and :func:`write_decoder_folder` writes. torch's ``Linear``
    stores ``weight`` as ``[out, in]``; our kernels are ``[in, out]`` (transposed)."""
    out: list[tuple[str, Place, bool]] = [
        (_EMBED_KEY, ("embed",), False),
        ("norm.weight", ("final_norm",), False),
    ]
    for i, name, _, place, transposed in c.block_tensors(0):
        out.append((f"layers.{i}.{name}", place, transposed))
    return out


# The prefix before ``embed_tokens.``: 'model.' for ForCausalLM, '' for a base model.
_ANCHOR = Anchor(
    _EMBED_KEY,
    ("model.", ""),
    f"tensor 'model.{_EMBED_KEY}' is missing from the checkpoint: it is not a Llama-family "
    "decoder; pass the folder of one, or the config.json that came with these weights",
)


def _convert(w: Weights, c: DecoderConfig) -> Params:
    """HF tensors -> our params tree (numpy), block leaves stacked to ``[L, ...]``."""
    w.no_layer_past(c.num_layers, "layers.{}.")
    found = {}
    for name, place, transposed in hf_layout(c):
        shape = c.tensor_shape(place)
        arr = w.get(name, shape[::-1] if transposed else shape)
        found[place] = arr.T if transposed else arr
    params = params_from_places(c, found)
    stored = w.tensors.get(_HEAD_KEY)
    if c.tie_word_embeddings and stored is not None and not np.array_equal(stored, params["embed"]):
        # transformers 5.x then reads the stored head, not the embeddings: another model
        raise ModelFolderError(
            f"config.json ties the LM head to the embeddings (tie_word_embeddings true) but "
            f"{w.source.name} holds an {_HEAD_KEY!r} that differs from them: set "
            "tie_word_embeddings to false in config.json"
        )
    if not c.tie_word_embeddings:
        if _HEAD_KEY not in w.tensors:
            raise ModelFolderError(
                f"tensor {_HEAD_KEY!r} is missing from {w.source.name} and tie_word_embeddings is "
                "false: a base model without its LM head cannot be read out; pass a "
                "ForCausalLM folder"
            )
        found_head = w.tensors[_HEAD_KEY]
        if tuple(found_head.shape) != (c.vocab_size, c.hidden_size):
            raise ModelFolderError(
                f"tensor {_HEAD_KEY!r} has shape {list(found_head.shape)}, expected "
                f"{[c.vocab_size, c.hidden_size]} from config.json"
            )
        params["lm_head"] = check_float(_HEAD_KEY, found_head).T
    return params


def load_decoder(
    path: str | pathlib.Path, dtype: Any = jnp.float32, *, param_dtype: Any = None
) -> Decoder:
    """Load a Llama / Mistral / Qwen2 causal LM into a :class:`Decoder`: a Hugging Face folder,
    or a ``.gguf`` file (:func:`cudt.models.llama.gguf.load_gguf`: dequantised weights, its
    tokenizer and chat template).

    From a folder: ``config.json``, ``model.safetensors`` (or the shards of
    ``model.safetensors.index.json``) and, when present, ``tokenizer.json`` (``dec.tokenizer``,
    a ``tokenizers.Tokenizer``; else None) and the ``chat_template`` of
    ``tokenizer_config.json`` (``dec.chat_template``). ``dtype`` is the compute dtype; params
    are stored in ``param_dtype`` (default ``dtype``; ``dtype=jnp.bfloat16,
    param_dtype=jnp.float32`` is mixed precision). Raises :class:`ModelFolderError` with a
    one-line fix for every problem.
    """
    if pathlib.Path(path).suffix.lower() == ".gguf":
        return load_gguf(path, dtype, param_dtype=param_dtype)
    store = jnp.dtype(dtype if param_dtype is None else param_dtype)
    got = load_folder(path, DecoderConfig.from_dict, lambda _: _ANCHOR, _convert, store)
    return Decoder(
        config=got.config,
        params=got.params,
        tokenizer=got.tokenizer,
        dtype=dtype,
        path=got.folder,
        chat_template=_chat_template(got.folder),
    )


def _chat_template(folder: pathlib.Path) -> str | None:
    """The ``chat_template`` string of ``tokenizer_config.json`` (or ``chat_template.jinja``).
    A list of named templates (``[{"name": "default", "template": ...}, {"name": "tool_use",
    ...}]``, as Hermes 2 Pro Llama 3 ships) gives its ``default`` one, the template
    transformers' ``apply_chat_template`` renders when no name is passed."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    template = read_json(config).get("chat_template") if config.is_file() else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def write_decoder_folder(
    folder: str | pathlib.Path,
    config: DecoderConfig,
    params: Params,
    tokenizer: Any = None,
) -> pathlib.Path:
    """Write ``config.json`` + ``model.safetensors`` (HF ``*ForCausalLM`` tensor names, the
    params' dtype) and, given a ``tokenizers.Tokenizer``, ``tokenizer.json``: a folder that
    :func:`load_decoder` and transformers' ``from_pretrained`` read back. Returns the folder."""
    config.check_params(params)
    folder = pathlib.Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(np.asarray, params)
    tensors: dict[str, np.ndarray] = {}
    for name, place, transposed in hf_layout(config):  # the loader's layout, inverted
        arr = leaf_at(host, place)
        tensors["model." + name] = arr.T if transposed else arr
    if not config.tie_word_embeddings:
        tensors[_HEAD_KEY] = host["lm_head"].T
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_safetensors(tensors, folder / SAFETENSORS_FILE, metadata={"format": "pt"})
    dtypes = {str(v.dtype) for v in tensors.values()}
    raw = config.to_dict()
    if len(dtypes) == 1:
        raw["dtype"] = dtypes.pop()
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(str(folder / "tokenizer.json"))
    return folder
