"""Saving a decoder where other tools read it: :func:`save_decoder`.

A path ending in ``.gguf`` gets one GGUF file (:func:`cudt.models.llama.gguf.write_gguf`:
llama.cpp's tensor names and query/key permutation, the tokenizer and the chat template in its
``tokenizer.*`` metadata); any other path a Hugging Face folder, which transformers'
``AutoModelForCausalLM`` and ``AutoTokenizer`` load as they are::

    config.json              architecture, rope, special token ids (transformers 4.x and 5.x)
    model.safetensors        *ForCausalLM tensor names (hf.write_decoder_folder)
    tokenizer.json           the decoder's tokenizers.Tokenizer
    tokenizer_config.json    PreTrainedTokenizerFast, BOS / EOS / PAD by name, chat_template
    generation_config.json   BOS / EOS / PAD ids, greedy decoding

Both are written atomically (:func:`cudt.io.atomic_output`): a temporary name beside the target,
renamed when complete; a path that holds something is refused unless ``overwrite``. Both load
back through :func:`cudt.load_decoder` as the same model.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.io import atomic_output
from cudt.models.hf import ModelFolderError
from cudt.models.llama.config import DecoderConfig, Params
from cudt.models.llama.gguf import check_gguf_config, write_gguf
from cudt.models.llama.gguf_tokenizer import gguf_pre_tokenizer, tokenizer_to_gguf
from cudt.models.llama.hf import write_decoder_folder
from cudt.models.llama.model import Decoder

__all__ = ["SAVE_DTYPES", "check_gguf", "save_decoder"]

# dtype name -> GGUF type of the matrices (1-D tensors stay F32)
SAVE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def save_decoder(
    decoder: Decoder,
    params: Params | None,
    path: str | pathlib.Path,
    *,
    dtype: Any = None,
    chat_template: str | None = None,
    overwrite: bool = False,
) -> pathlib.Path:
    """Write ``decoder`` with ``params`` (None: ``decoder.params``) to ``path``: a GGUF file
    when it ends in ``.gguf``, else a Hugging Face folder (see the module docstring).

    ``dtype``: ``"float32"``, ``"float16"`` or ``"bfloat16"`` (or a numpy / jax dtype); None
    keeps the params' own dtype in a folder and writes float32 GGUF. ``chat_template``: the
    Jinja template written with the tokenizer (default ``decoder.chat_template``). The
    special tokens are the ids of ``decoder.config``. A GGUF tokenizer must be byte-level BPE.
    Returns the path; every problem is one :class:`~cudt.CudtError` line, and nothing is left
    at ``path``."""
    params = decoder.params if params is None else params
    _refuse_adapted(params)
    decoder.config.check_params(params)
    name = _dtype_name(dtype)
    template = decoder.chat_template if chat_template is None else chat_template
    path = pathlib.Path(path).expanduser()
    if name == "float16":  # GGUF keeps 1-D tensors in float32
        _check_fits_float16(params, matrices_only=path.suffix.lower() == ".gguf")
    if path.suffix.lower() == ".gguf":
        check_gguf(decoder, path)

        def write(target: pathlib.Path) -> None:
            write_gguf(
                target,
                decoder.config,
                params,
                tokenizer=decoder.tokenizer,
                chat_template=template,
                qtype=SAVE_DTYPES[name or "float32"],
            )

    else:
        store = None if name is None else jnp.dtype(name)
        host = jax.tree.map(lambda a: np.asarray(a if store is None else a.astype(store)), params)

        def write(target: pathlib.Path) -> None:
            write_decoder_folder(target, decoder.config, host, decoder.tokenizer)
            _write_json(target / "generation_config.json", generation_config(decoder.config))
            if decoder.tokenizer is not None:
                raw = tokenizer_config(decoder.config, decoder.tokenizer, template)
                _write_json(target / "tokenizer_config.json", raw)

    return atomic_output(
        path, write, overwrite=overwrite, flag="save_decoder:", replace="overwrite=True"
    )


def check_gguf(decoder: Decoder, path: pathlib.Path) -> None:
    """Refuse (one line) what :func:`write_gguf` cannot write: a folder as the file, a model it
    cannot hold (:func:`~cudt.models.llama.gguf.check_gguf_config`), or a tokenizer that is not
    byte-level BPE; before any weights are read or written."""
    if path.is_dir():
        raise ModelFolderError(f"{path} is a folder: pass the path of a .gguf file to write")
    check_gguf_config(decoder.config)
    if decoder.tokenizer is not None:
        tokenizer_to_gguf(decoder.tokenizer)
        gguf_pre_tokenizer(decoder.tokenizer)


def _refuse_adapted(params: Params) -> None:
    """Refuse (one line) the params :func:`~cudt.models.llama.adapted` gives, LoRA's factors
    beside the kernels: no file holds them so, and check_params's fix (init_params) is not
    theirs."""
    blocks = params.get("blocks") if isinstance(params, dict) else None
    if isinstance(blocks, dict) and any(
        isinstance(b, dict) and "lora_a" in b for b in blocks.values()
    ):
        raise ModelFolderError(
            "these params hold LoRA factors beside their kernels (adapted's, what the forward "
            "reads): save merged(base, adapters, spec.scale), the kernels W + s·A B"
        )


def _check_fits_float16(params: Params, *, matrices_only: bool) -> None:
    """Refuse (one line) a finite weight beyond float16's range, which would be written as inf
    (a broken model saved without a word); the first such leaf is named."""
    limit = float(np.finfo(np.float16).max)
    ulp = limit - float(np.nextafter(np.float16(limit), np.float16(0)))  # 32 at the top
    overflow = limit + ulp / 2  # 65520: round to nearest (even) gives inf from here on
    for keys, leaf in jax.tree_util.tree_leaves_with_path(params):
        if matrices_only and np.ndim(leaf) < 2:
            continue
        a = np.abs(np.asarray(leaf, np.float32))
        big = float(np.max(np.where(np.isfinite(a), a, 0.0), initial=0.0))
        if big >= overflow:
            raise ModelFolderError(
                f"cannot save in float16: weight {jax.tree_util.keystr(keys)} holds "
                f"{big:.4g}, beyond float16's largest {limit:g} (it would be written as inf): "
                "pass dtype bfloat16 or float32"
            )


def _dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    try:
        name = jnp.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in SAVE_DTYPES:
        raise ModelFolderError(
            f"cannot save in dtype {dtype!r}: pass one of {', '.join(SAVE_DTYPES)}"
        )
    return name


def _token(tokenizer: Any, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.id_to_token(int(token_id))


def tokenizer_config(c: DecoderConfig, tokenizer: Any, chat_template: str | None) -> dict:
    """``tokenizer_config.json`` of a ``tokenizers.Tokenizer`` saved as ``tokenizer.json``:
    transformers' fast tokenizer class, the special tokens of ``c`` by name (what
    :func:`cudt.data.alpaca.load_tokenizer` reads too) and the chat template."""
    raw: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": c.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    }
    for key, token_id in (
        ("bos_token", c.bos_token_id),
        ("eos_token", c.eos_token_id[0] if c.eos_token_id else None),
        ("pad_token", c.pad_token_id),
    ):
        token = _token(tokenizer, token_id)
        if token is not None:
            raw[key] = token
    if chat_template:
        raw["chat_template"] = chat_template
    return raw


def generation_config(c: DecoderConfig) -> dict:
    """``generation_config.json``: the special token ids, greedy decoding (what
    :meth:`Decoder.generate` does)."""
    eos = list(c.eos_token_id)
    return {
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": c.pad_token_id,
        "do_sample": False,
    }


def _write_json(path: pathlib.Path, raw: dict) -> None:
    path.write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
