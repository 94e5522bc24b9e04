"""Hugging Face model folders, shared by every pretrained model (encoders, ViT, decoders).

Public helpers: the folder check (:func:`model_folder`), JSON configs (:func:`read_json`),
safetensors reading, sharded index included (:func:`load_tensors`, :func:`read_safetensors`),
:class:`Weights` (named, shape-checked tensors under a model prefix, :func:`find_prefix`), the
tokenizer (:func:`read_tokenizer`), the input checks (:func:`check_range`, :func:`check_shape`)
and the torch-parity layer conventions (:data:`ACTIVATIONS`, :func:`activation`,
:func:`layer_norm`). Every problem raises :class:`ModelFolderError` with a one-line fix.

Only safetensors checkpoints are read: pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ...)
can execute arbitrary code when loaded, so they are refused, never opened.
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from cudt.errors import CudtError

__all__ = [
    "ACTIVATIONS",
    "PICKLE_PATTERNS",
    "SAFETENSORS_FILE",
    "SAFETENSORS_INDEX",
    "ModelFolderError",
    "Weights",
    "activation",
    "check_range",
    "check_shape",
    "find_prefix",
    "layer_norm",
    "load_tensors",
    "model_folder",
    "read_json",
    "read_safetensors",
    "read_tokenizer",
]

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
    except json.JSONDecodeError as err:
        raise ModelFolderError(f"{path} is not valid JSON ({err}); re-export the model") from err
    if not isinstance(raw, dict):
        raise ModelFolderError(f"{path} must hold a JSON object; re-export the model")
    return raw


# --------------------------------------------------------------------------------------------
# Folders and checkpoints
# --------------------------------------------------------------------------------------------


def model_folder(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(folder, folder/config.json)`` of a Hugging Face model folder, or one error line."""
    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        raise ModelFolderError(
            f"model folder {folder} does not exist: pass a folder holding config.json and "
            f"{SAFETENSORS_FILE}"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelFolderError(
            f"{folder} has no config.json: pass a Hugging Face model folder (save_pretrained)"
        )
    return folder, config_file


def read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file; a pickle under that name is refused, unopened."""
    import safetensors
    import safetensors.numpy

    # A pickle (or torch.save zip of pickles) saved under a safetensors name: refused by its
    # first bytes; it is never unpickled.
    try:
        with open(file, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ModelFolderError(
            f"cannot read {file} ({err.strerror or err}): check the file"
        ) from err
    if (len(magic) >= 2 and magic[0] == 0x80 and 2 <= magic[1] <= 5) or magic == b"PK\x03\x04":
        raise ModelFolderError(
            f"{file} is a pickle (torch.save) file, not safetensors: pickle checkpoints are not "
            "loaded (unsafe); convert to safetensors (e.g. save_pretrained(dir, "
            "safe_serialization=True) in a trusted environment)"
        )

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


def load_tensors(folder: pathlib.Path) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    """``(tensors, source)`` of a folder's ``model.safetensors`` or sharded index; a folder with
    only pickle checkpoints is refused by their names (never opened)."""
    single = folder / SAFETENSORS_FILE
    if single.is_file():
        return read_safetensors(single), single
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        # Sharded export: the index maps tensor name -> shard file.
        try:
            shards = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise ModelFolderError(f"{index} is malformed ({err}); re-export the model") from err
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            if not (folder / shard).is_file():
                raise ModelFolderError(
                    f"shard {shard} listed in {index.name} is missing from {folder}"
                )
            tensors.update(read_safetensors(folder / shard))
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
        return arr

    def dense(self, name: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        # torch Linear stores weight as [out, in]; flax Dense kernels are [in, out].
        return {
            "kernel": self.get(f"{name}.weight", (n_out, n_in)).T,
            "bias": self.get(f"{name}.bias", (n_out,)),
        }

    def norm(self, name: str, dim: int) -> dict[str, np.ndarray]:
        return {
            "scale": self.get(f"{name}.weight", (dim,)),
            "bias": self.get(f"{name}.bias", (dim,)),
        }


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


# --------------------------------------------------------------------------------------------
# Inputs and layers
# --------------------------------------------------------------------------------------------


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
