"""Hugging Face model folders, shared by every pretrained model (encoders, ViT, decoders).

Every family (``encoders/``, ``vit/``, ``llama/``) is split the same way: ``config.py`` (a typed
config parsed from ``config.json``), ``model.py`` (the forward), ``weights.py`` / ``hf.py`` (its
tensor names, and the loader). The loader is :func:`load_folder`, written once here: it checks
the folder, parses ``config.json`` with the family's parser, reads the safetensors, finds the
model prefix from the family's :class:`Anchor` tensor, converts the tensors into params with
the family's function (through :class:`Weights`: named, shape-checked tensors) and casts them,
and reads the tokenizer.

The pieces: the folder check (:func:`model_folder`), JSON configs (:func:`read_json`, and
:class:`FolderConfig` with the config checks :func:`malformed_fields`, :func:`check_sizes`,
:func:`check_heads`, :func:`parse_activation`; :class:`EncoderStackConfig` and :func:`bert_sizes`,
the sizes the BERT-style encoders and the ViT share), safetensors reading, sharded index included
(:func:`load_tensors`, :func:`read_safetensors`), :func:`find_prefix`, :func:`stack_layers`, the
tokenizer (:func:`read_tokenizer`), the loaded models' base (:class:`FolderModel`), the input
checks (:func:`check_range`, :func:`check_shape`) and the torch-parity layers (:data:`ACTIVATIONS`,
:func:`activation`, :func:`layer_norm`, :func:`self_attention`). Every problem raises
:class:`ModelFolderError` with a one-line fix.

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ...)
can execute arbitrary code when loaded, so they are refused, never opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import CudtError

__all__ = [
    "ACTIVATIONS",
    "PICKLE_PATTERNS",
    "SAFETENSORS_FILE",
    "SAFETENSORS_INDEX",
    "Anchor",
    "FolderConfig",
    "Loaded",
    "ModelFolderError",
    "Params",
    "Weights",
    "activation",
    "check_float",
    "check_heads",
    "check_not_quantized",
    "check_range",
    "check_shape",
    "check_sizes",
    "find_prefix",
    "layer_norm",
    "load_folder",
    "load_tensors",
    "malformed_fields",
    "model_folder",
    "parse_activation",
    "read_json",
    "read_safetensors",
    "read_tokenizer",
    "self_attention",
    "stack_layers",
    "token_ids",
]

Params = dict[str, Any]
C = TypeVar("C")

# Files that hold a pickled state dict. Unpickling runs arbitrary code, so we only detect them
# (to give a useful error) and never open them.
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"

# HF ACT2FN names -> our canonical activation names.
ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",  # exact, erf based (torch.nn.functional.gelu default)
    "gelu_python": "gelu",  # same exact erf formula, written out in Python
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # same tanh formula, only written differently in HF
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


class ModelFolderError(CudtError):
    """A model folder, file, config or checkpoint that cannot be loaded; the message says how to
    fix it. (``cudt.EncoderError`` is the same class under its older name.)"""


def read_json(path: str | pathlib.Path) -> dict[str, Any]:
    """A JSON object file (``config.json``, ``preprocessor_config.json``) as a dict."""
    path = pathlib.Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFolderError(f"{path} is not valid JSON ({err}); re-export the model") from err
    if not isinstance(raw, dict):
        raise ModelFolderError(f"{path} must hold a JSON object; re-export the model")
    return raw


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


class FolderConfig:
    """Base of the families' typed configs (frozen dataclasses with a ``from_dict`` parser of
    the ``config.json`` dict): :meth:`from_file` reads the file."""

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> Any:
        """Parse a ``config.json`` file."""
        return cls.from_dict(read_json(path))  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class EncoderStackConfig(FolderConfig):
    """The sizes every BERT-style encoder stack's config has (BERT, DistilBERT, RoBERTa, ViT):
    the base of their typed configs, which add their own fields after these."""

    hidden_size: int  # D
    num_layers: int  # L
    num_heads: int  # H
    intermediate_size: int  # F, MLP width
    activation: str  # "gelu" (exact erf) | "gelu_tanh" | "relu" | "silu"
    layer_norm_eps: float

    @property
    def head_dim(self) -> int:
        """Per-head width ``D // H``."""
        return self.hidden_size // self.num_heads


def bert_sizes(raw: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`EncoderStackConfig`'s sizes but the activation, read from a ``config.json`` by
    ``BertConfig``'s keys and defaults (RoBERTa's and ViT's are the same), in field order."""
    return dict(
        hidden_size=int(raw.get("hidden_size", 768)),
        num_layers=int(raw.get("num_hidden_layers", 12)),
        num_heads=int(raw.get("num_attention_heads", 12)),
        intermediate_size=int(raw.get("intermediate_size", 3072)),
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
    )


@contextlib.contextmanager
def malformed_fields(file: str = "config.json") -> Iterator[None]:
    """Turn a field that will not convert (``int("x")``, a missing key) into one error line."""
    try:
        yield
    except ModelFolderError:
        raise
    except (TypeError, ValueError, KeyError) as err:
        raise ModelFolderError(f"{file} has a malformed field: {err}") from err


def check_sizes(config: Any, names: Sequence[str], source: str = "config.json") -> None:
    """Raise unless every field ``names`` of ``config`` is >= 1."""
    for name in names:
        if int(getattr(config, name)) < 1:
            raise ModelFolderError(f"{source} gives {name}={getattr(config, name)}: must be >= 1")


def check_heads(hidden_size: int, num_heads: int, fix: str = "") -> None:
    """Raise unless ``num_heads`` divides ``hidden_size``; ``fix`` ends the line."""
    if hidden_size % num_heads:
        raise ModelFolderError(
            f"hidden size {hidden_size} is not divisible by {num_heads} heads{fix}"
        )


def parse_activation(name: Any) -> str:
    """The canonical name of a ``config.json`` activation (``hidden_act``), or one error line."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ModelFolderError(
            f"unsupported activation {name!r}: supported are {', '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


# --------------------------------------------------------------------------------------------
# Folders and checkpoints
# --------------------------------------------------------------------------------------------


def model_folder(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(folder, folder/config.json)`` of a Hugging Face model folder, or one error line."""
    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ModelFolderError(
            f"model folder {folder} {what}: pass a folder holding config.json and "
            f"{SAFETENSORS_FILE}"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelFolderError(_no_config(folder))
    return folder, config_file


def _no_config(folder: pathlib.Path) -> str:
    """Why ``folder`` (no config.json) is no model folder: PEFT's LoRA adapters (an export's
    ``<model>/adapter/``), or a folder of model folders (an export's root), named as such."""
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        try:
            base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            base = None
        merged = folder.parent if (folder.parent / "config.json").is_file() else None
        instead = [f"the merged model beside them, {merged}"] if merged else []
        instead += [f"their base {base} (with --lora-rank, to train adapters anew)"] if base else []
        return f"{folder} holds LoRA adapters (PEFT's adapter_config.json), not a model: pass " + (
            ", or ".join(instead) if instead else "a Hugging Face model folder"
        )
    models = sorted(p.parent.name for p in folder.glob("*/config.json"))
    if models:
        what = "an export (export.json)" if (folder / "export.json").is_file() else "a folder"
        return (
            f"{folder} has no config.json: it is {what} of model folders "
            f"({', '.join(models[:3])}{', ...' if len(models) > 3 else ''}); pass one of them, "
            f"e.g. {folder / models[0]}"
        )
    return f"{folder} has no config.json: pass a Hugging Face model folder (save_pretrained)"


#: the safetensors dtypes read as numpy arrays: an fp8 (F8_E4M3, F8_E5M2), fp6 or fp4 tensor is
#: a quantized checkpoint's, which numpy cannot hold (it failed as "corrupt or truncated")
READ_DTYPES = ("BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")
READ_DTYPES += ("F16", "BF16", "F32", "F64")


def _refuse_unread_dtypes(file: pathlib.Path, header: int) -> None:
    """Refuse a tensor of a dtype not in :data:`READ_DTYPES`, read from the file's JSON header
    (``header`` bytes after the first 8); a header that does not parse is left to the reader
    (corrupt or truncated)."""
    try:
        with open(file, "rb") as fh:
            fh.seek(8)
            entries = json.loads(fh.read(header).decode("utf-8"))
        dtypes = {k: v["dtype"] for k, v in entries.items() if k != "__metadata__"}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return
    name, dtype = next(((k, d) for k, d in dtypes.items() if d not in READ_DTYPES), (None, None))
    if name is not None:
        raise ModelFolderError(
            f"tensor {name!r} in {file} has dtype {dtype}, which is not supported: quantized "
            "(fp8) checkpoints are not loaded; pass the unquantized (float16, bfloat16 or "
            "float32) model folder"
        )


def read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file; a pickle under that name is refused, unopened."""
    import safetensors
    import safetensors.numpy

    # A pickle (or torch.save zip of pickles) saved under a safetensors name: refused by its
    # first bytes; it is never unpickled.
    try:
        with open(file, "rb") as fh:
            magic = fh.read(9)
        size = file.stat().st_size
    except OSError as err:
        raise ModelFolderError(
            f"cannot read {file} ({err.strerror or err}): check the file"
        ) from err
    # safetensors: an 8-byte little-endian header length, then the JSON header ('{'); a header
    # of 640, 896, 1152 or 1408 bytes starts with a pickle's protocol bytes (0x80, 2-5), so
    # those are tested on what is not shaped like safetensors only
    header = int.from_bytes(magic[:8], "little") if len(magic) == 9 else None
    shaped = header is not None and magic[8:9] == b"{" and 8 + header <= size
    pickled = len(magic) >= 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5
    if not shaped and (pickled or magic[:4] == b"PK\x03\x04"):
        raise ModelFolderError(
            f"{file} is a pickle (torch.save) file, not safetensors: pickle checkpoints are not "
            "loaded (unsafe); convert to safetensors (e.g. save_pretrained(dir, "
            "safe_serialization=True) in a trusted environment)"
        )

    if shaped:
        _refuse_unread_dtypes(file, header)
    try:
        try:
            return safetensors.numpy.load_file(str(file))
        except KeyError:
            # Older safetensors' numpy backend lacks bfloat16; the flax one has it (ml_dtypes).
            with safetensors.safe_open(str(file), framework="flax") as fh:
                return {k: np.asarray(fh.get_tensor(k)) for k in fh.keys()}
    except Exception as err:  # SafetensorError, OSError: corrupt or truncated file
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelFolderError(
            f"cannot read {file} ({reason}): it is corrupt or truncated; re-export the "
            "safetensors file"
        ) from err


def _weight_map(index: pathlib.Path) -> dict[str, str]:
    """The ``weight_map`` of a sharded export's index (tensor name -> shard file), refused when
    malformed, when it lists a tensor twice (JSON keeps the last silently) or names a shard
    outside its folder (an absolute path or ``..``: a file the folder does not hold)."""
    twice: dict[int, str] = {}  # id of a JSON object -> a key it holds twice

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in items:
            if key in obj:
                twice.setdefault(id(obj), key)
            obj[key] = value
        return obj

    try:
        raw = json.loads(index.read_text(encoding="utf-8"), object_pairs_hook=pairs)
        weight_map = raw["weight_map"]
        if not all(isinstance(name, str) for name in weight_map.values()):
            raise TypeError("its weight_map values must be file names")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError, TypeError) as err:
        raise ModelFolderError(f"{index} is malformed ({err}); re-export the model") from err
    if id(weight_map) in twice:  # JSON keeps the last: one shard's copy would be dropped
        raise ModelFolderError(
            f"{index} lists tensor {twice[id(weight_map)]!r} twice in its weight_map: "
            "re-export the model"
        )
    for shard in weight_map.values():
        path = pathlib.PurePath(shard)
        if path.is_absolute() or ".." in path.parts:
            raise ModelFolderError(
                f"{index} lists shard {shard!r}, outside {index.parent}: re-export the model "
                "(its index names each shard by its file name in the folder)"
            )
    return weight_map


def load_tensors(folder: pathlib.Path) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    """``(tensors, source)`` of a folder's ``model.safetensors`` or sharded index; a folder with
    only pickle checkpoints is refused by their names (never opened)."""
    single = folder / SAFETENSORS_FILE
    if single.is_file():
        return read_safetensors(single), single
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        tensors: dict[str, np.ndarray] = {}
        found_in: dict[str, str] = {}
        for shard in sorted(set(_weight_map(index).values())):
            if not (folder / shard).is_file():
                raise ModelFolderError(
                    f"shard {shard} listed in {index.name} is missing from {folder}"
                )
            for name, array in read_safetensors(folder / shard).items():
                if name in found_in:  # one would be dropped: which is these weights is unknown
                    raise ModelFolderError(
                        f"tensor {name!r} is in two shards of {folder} ({found_in[name]} and "
                        f"{shard}): re-export the model (each tensor in one shard)"
                    )
                found_in[name], tensors[name] = shard, array
        return tensors, index
    pickles = sorted({p.name for pat in PICKLE_PATTERNS for p in folder.glob(pat)})
    if pickles:
        # Detected by name only: the file is never opened.
        raise ModelFolderError(
            f"{folder} has no {SAFETENSORS_FILE}, only {', '.join(pickles)}: pickle checkpoints "
            "are not loaded (unsafe); convert to safetensors (e.g. save_pretrained(dir, "
            "safe_serialization=True) in a trusted environment)"
        )
    raise ModelFolderError(
        f"{folder} has no {SAFETENSORS_FILE}: export the model with "
        "save_pretrained(dir, safe_serialization=True)"
    )


def read_tokenizer(folder: pathlib.Path) -> Any:
    """The folder's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, or None when it has none."""
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # tokenizers raises plain Exception subclasses
        raise ModelFolderError(f"cannot read {tokenizer_file} ({err}): re-export it") from err


class Weights:
    """HF state dict with a model prefix, giving named, shape-checked numpy tensors."""

    def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str, source: pathlib.Path):
        self.tensors, self.prefix, self.source = tensors, prefix, source

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = self.prefix + name
        if key not in self.tensors and key.endswith((".weight", ".bias")):
            # TF-converted checkpoints name LayerNorm params gamma/beta; HF renames them too.
            legacy = key.rsplit(".", 1)[0] + (".gamma" if key.endswith(".weight") else ".beta")
            key = legacy if legacy in self.tensors else key
        if key not in self.tensors:
            raise ModelFolderError(
                f"tensor {self.prefix + name!r} is missing from {self.source.name}: the weights "
                "do not fit config.json; pass the config.json exported with these weights, or "
                "re-export them if the file was cut short"
            )
        arr = self.tensors[key]
        if tuple(arr.shape) != tuple(shape):
            raise ModelFolderError(
                f"tensor {key!r} has shape {list(arr.shape)}, expected {list(shape)} from "
                "config.json: the weights do not fit the config; pass the config.json exported "
                "with these weights"
            )
        return check_float(key, arr)

    def dense(self, name: str, n_in: int, n_out: int, bias: bool = True) -> dict[str, np.ndarray]:
        """A torch ``Linear`` as flax ``Dense`` params; with ``bias=False`` (a checkpoint without
        one, e.g. ViT's ``qkv_bias=false``) a zero bias, which computes the same function."""
        # torch Linear stores weight as [out, in]; flax Dense kernels are [in, out].
        kernel = self.get(f"{name}.weight", (n_out, n_in)).T
        if not bias:
            return {"kernel": kernel, "bias": np.zeros((n_out,), kernel.dtype)}
        return {"kernel": kernel, "bias": self.get(f"{name}.bias", (n_out,))}

    def norm(self, name: str, dim: int) -> dict[str, np.ndarray]:
        return {
            "scale": self.get(f"{name}.weight", (dim,)),
            "bias": self.get(f"{name}.bias", (dim,)),
        }

    def layers(
        self,
        count: int,
        layer_fmt: str,
        names: Mapping[str, str],
        dims: Mapping[str, tuple[int, ...]],
        no_bias: frozenset[str] = frozenset(),
    ) -> Params:
        """``count`` layers as one tree of ``[L, ...]`` leaves (:func:`stack_layers`). Layer
        ``i``'s sub-module ``ours`` is the HF ``layer_fmt.format(i) + names[ours]``: a
        LayerNorm when ``dims[ours]`` is ``(dim,)``, a Linear when it is ``(n_in, n_out)``
        (without a stored bias when ``ours`` is in ``no_bias``)."""

        def layer(prefix: str) -> Params:
            return {
                ours: self.norm(prefix + theirs, *dims[ours])
                if len(dims[ours]) == 1
                else self.dense(prefix + theirs, *dims[ours], bias=ours not in no_bias)
                for ours, theirs in names.items()
            }

        self.no_layer_past(count, layer_fmt)
        return stack_layers([layer(layer_fmt.format(i)) for i in range(count)])

    def no_layer_past(self, count: int, layer_fmt: str) -> None:
        """Raise when the checkpoint holds a layer ``count`` (``layer_fmt.format(count)``): a
        config.json with fewer layers than its weights would load as a cut-short model."""
        beyond = self.prefix + layer_fmt.format(count)
        extra = sorted(k for k in self.tensors if k.startswith(beyond))
        if extra:
            raise ModelFolderError(
                f"{self.source.name} holds more layers than the {count} of config.json (tensor "
                f"{extra[0]!r}): the weights do not fit config.json; pass the config.json "
                "exported with these weights"
            )


def check_float(name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` unless it is not floating point: an integer weight is a quantized code (e.g.
    bitsandbytes int8), which cast to float is another model, not these weights."""
    if not jnp.issubdtype(arr.dtype, jnp.floating):
        raise ModelFolderError(
            f"tensor {name!r} has dtype {arr.dtype}, not a floating point weight: a quantized "
            "checkpoint is not loaded; pass the unquantized (float16, bfloat16 or float32) model"
        )
    return arr


def check_not_quantized(raw: Mapping[str, Any]) -> None:
    """Refuse a ``config.json`` with a ``quantization_config`` (bitsandbytes, GPTQ, AWQ, FP8,
    ...): its tensors are codes and scales that only the quantizer's kernels turn into weights."""
    quant = raw.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, Mapping) else quant
        raise ModelFolderError(
            f"config.json has quantization_config (quant_method {method!r}): quantized "
            "checkpoints are not loaded; pass the unquantized (float16, bfloat16 or float32) "
            "model folder"
        )


def find_prefix(
    tensors: Mapping[str, np.ndarray], key: str, preferred: tuple[str, ...], missing: str
) -> str:
    """The prefix in front of ``key`` among the tensor names: the first of ``preferred`` that
    occurs, else the only one; ``missing`` is the error line when none does."""
    found = [
        k[: -len(key)]
        for k in tensors
        if k.endswith(key) and (k == key or k[: -len(key)].endswith("."))
    ]
    for prefix in preferred:
        if prefix in found:
            return prefix
    if len(found) == 1:
        return found[0]
    if not found:
        raise ModelFolderError(missing)
    raise ModelFolderError(f"several models in the checkpoint (prefixes {found}); keep only one")


def stack_layers(layers: Sequence[Params]) -> Params:
    """Per-layer params trees -> one tree whose leaves have a leading ``[L]`` axis, so a layer
    scan slices one block's params per step."""
    return jax.tree.map(lambda *xs: np.stack(xs), *layers)


# --------------------------------------------------------------------------------------------
# The loader
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Anchor:
    """The tensor that marks a family's checkpoint and gives its name prefix: ``key`` (without
    prefix), the ``preferred`` prefixes in order (``""`` for a base model, ``"bert."`` for
    ``BertForX``, ...), and the error line when no tensor name ends with ``key``."""

    key: str
    preferred: tuple[str, ...]
    missing: str


@dataclasses.dataclass(frozen=True)
class Loaded(Generic[C]):
    """What :func:`load_folder` read: the folder, its typed config, the params (cast) and the
    tokenizer (a ``tokenizers.Tokenizer``, or None)."""

    folder: pathlib.Path
    config: C
    params: Params
    tokenizer: Any


@dataclasses.dataclass(frozen=True, eq=False)
class FolderModel(Generic[C]):
    """Base of the families' loaded models: a typed config and a params pytree (each family adds
    its tokenizer or preprocessor, compute dtype, folder). Not itself a pytree: pass
    ``model.params`` (or a trained copy) to ``model.apply``. ``eq=False`` keeps hashing by
    identity, so bound methods such as ``model.apply`` can be jitted."""

    config: C
    params: Params

    @property
    def num_layers(self) -> int:
        """L, the number of transformer blocks."""
        return self.config.num_layers  # type: ignore[attr-defined]


def load_folder(
    path: str | pathlib.Path,
    parse: Callable[[Mapping[str, Any]], C],
    anchor: Callable[[C], Anchor],
    convert: Callable[[Weights, C], Params],
    dtype: Any,
    *,
    tokenizer: bool = True,
) -> Loaded[C]:
    """Load a Hugging Face model folder, the steps every family shares, in this order (so the
    first problem found is the one reported): check the folder; parse ``config.json`` with
    ``parse``, refusing a quantized checkpoint's (:func:`check_not_quantized`); read
    ``model.safetensors`` (or its shards); find the model prefix from the family's
    ``anchor(config)``; turn the tensors into a params tree with ``convert(weights, config)``
    (through :meth:`Weights.get`, which checks each name, shape and floating dtype); cast every
    leaf to ``dtype``; read ``tokenizer.json`` when ``tokenizer``. Every problem raises
    :class:`ModelFolderError` with a one-line fix."""
    folder, config_file = model_folder(path)
    raw = read_json(config_file)
    config = parse(raw)
    check_not_quantized(raw)
    tensors, source = load_tensors(folder)
    mark = anchor(config)
    weights = Weights(tensors, find_prefix(tensors, mark.key, mark.preferred, mark.missing), source)
    params = jax.tree.map(lambda a: jnp.asarray(a, dtype=dtype), convert(weights, config))
    return Loaded(folder, config, params, read_tokenizer(folder) if tokenizer else None)


# --------------------------------------------------------------------------------------------
# Inputs and layers
# --------------------------------------------------------------------------------------------


def token_ids(input_ids: Any) -> jax.Array:
    """``input_ids`` as an array, or :class:`ModelFolderError` unless it is integer ``[B, T]``
    (ragged rows and text included: jax's own words for those name neither)."""
    try:
        input_ids = jnp.asarray(input_ids)
    except (TypeError, ValueError) as e:
        what = type(input_ids).__name__
        raise ModelFolderError(
            f"input_ids must be an integer array [B, T], got a {what} jax cannot read as "
            "one (rows of different lengths, or text): tokenize and pad the rows to one "
            "length first"
        ) from e
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ModelFolderError(
            f"input_ids must be an integer array [B, T], got {input_ids.dtype}"
            f"{list(input_ids.shape)}"
        )
    return input_ids


def check_range(name: str, ids: jax.Array, size: int) -> None:
    """Raise unless every id is in ``[0, size)``; a no-op under tracing (values unknown)."""
    if isinstance(ids, jax.core.Tracer) or ids.size == 0:
        return
    ids = np.asarray(ids)  # on the host: a concrete array closed over inside jit stays concrete
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= size:
        raise ModelFolderError(f"{name} must lie in [0, {size}), found values in [{lo}, {hi}]")


def check_shape(name: str, found: tuple[int, ...], expected: tuple[int, ...]) -> None:
    """Raise unless ``found == expected``."""
    if tuple(found) != tuple(expected):
        raise ModelFolderError(f"{name} has shape {list(found)}, expected {list(expected)}")


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """The function of a canonical activation name (a value of :data:`ACTIVATIONS`)."""
    if name == "gelu":
        return functools.partial(jax.nn.gelu, approximate=False)
    if name == "gelu_tanh":
        return functools.partial(jax.nn.gelu, approximate=True)
    if name == "relu":
        return jax.nn.relu
    if name == "silu":
        return jax.nn.silu
    raise ModelFolderError(f"unsupported activation {name!r}")  # unreachable: from_dict validates


def layer_norm(eps: float, dtype: Any, name: str) -> nn.LayerNorm:
    """A flax LayerNorm computed as torch computes it."""
    # Two-pass variance (use_fast_variance=False) as torch computes it; E[x^2]-E[x]^2 loses
    # precision and costs parity with HF.
    return nn.LayerNorm(
        epsilon=eps, dtype=dtype, param_dtype=dtype, use_fast_variance=False, name=name
    )


def self_attention(
    h: jax.Array, num_heads: int, dtype: Any, mask_bias: jax.Array | None = None
) -> jax.Array:
    """Multi-head self-attention of ``h [B, T, D]`` as the BERT family and ViT compute it, up to
    the output projection (``[B, T, D]``). Call it inside a compact flax module: its ``Dense``
    sub-modules ``query``, ``key``, ``value`` and ``attn_out`` become that module's.
    ``mask_bias`` (``[B, 1, 1, T]`` float32, added to the scores) masks keys."""
    dense = functools.partial(nn.Dense, dtype=dtype, param_dtype=dtype)
    batch, length, d = h.shape
    head_dim = d // num_heads
    split = (batch, length, num_heads, head_dim)
    q = dense(d, name="query")(h).reshape(split)  # [B, T, H, Dh]
    k = dense(d, name="key")(h).reshape(split)
    v = dense(d, name="value")(h).reshape(split)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(head_dim))
    # Mask and softmax in float32 even for half-precision params (as HF does): exp/normalise is
    # where low precision hurts most, and a float32 finfo.min bias cannot overflow to -inf.
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))  # [B, H, T, T]
    if mask_bias is not None:
        scores = scores + mask_bias
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, d)
    return dense(d, name="attn_out")(ctx)
