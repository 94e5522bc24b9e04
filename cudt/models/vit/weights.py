"""Hugging Face folders of ViTs: their tensor names, :func:`load_vit` and
:func:`write_vit_folder`.

A folder holds ``config.json`` (``model_type "vit"``), ``model.safetensors`` (or a sharded
safetensors index) and optionally ``preprocessor_config.json``; the steps of loading are
:func:`cudt.models.hf.load_folder`'s, this module gives the ViT's tensor names. Pickle
checkpoints are refused, never opened.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np

from cudt.io import save_safetensors
from cudt.models.hf import SAFETENSORS_FILE, Anchor, Params, Weights, load_folder, read_json
from cudt.models.vit.config import ViTConfig, ViTPreprocessor
from cudt.models.vit.model import ViT

__all__ = ["load_vit", "write_vit_folder"]

# The tensor that identifies a ViT checkpoint and gives its prefix ('' or 'vit.').
_PATCH_KEY = "embeddings.patch_embeddings.projection.weight"

# Our block param name -> HF sub-module name (relative to the layer), for the layout every hub
# checkpoint and transformers' save_pretrained use ("legacy") and for transformers 5.x's
# in-memory module names, in case a checkpoint was written without reverting them.
_LEGACY_BLOCK = {
    "layernorm_before": "layernorm_before",
    "query": "attention.attention.query",
    "key": "attention.attention.key",
    "value": "attention.attention.value",
    "attn_out": "attention.output.dense",
    "layernorm_after": "layernorm_after",
    "mlp_in": "intermediate.dense",
    "mlp_out": "output.dense",
}
_V5_BLOCK = {
    "layernorm_before": "layernorm_before",
    "query": "attention.q_proj",
    "key": "attention.k_proj",
    "value": "attention.v_proj",
    "attn_out": "attention.o_proj",
    "layernorm_after": "layernorm_after",
    "mlp_in": "mlp.fc1",
    "mlp_out": "mlp.fc2",
}


# The prefix before ``embeddings.``: '' for ViTModel, 'vit.' for ViTForX checkpoints.
_ANCHOR = Anchor(
    _PATCH_KEY,
    ("", "vit."),
    f"tensor {_PATCH_KEY!r} (optionally prefixed 'vit.') is missing from the checkpoint: it "
    "is not a ViT model; pass the folder of a ViT model, or the config.json that came with "
    "these weights",
)


def _convert(weights: Weights, config: ViTConfig) -> Params:
    """HF tensors -> our params tree (numpy): ``{"embeddings": ..., "blocks": [L]-stacked}``."""
    c = config
    d, f = c.hidden_size, c.intermediate_size
    conv = weights.get(_PATCH_KEY, (d, c.num_channels, *c.patch_size))  # [D, C, ph, pw]
    embeddings = {
        "cls_token": weights.get("embeddings.cls_token", (1, 1, d)).reshape(d),
        "position_embeddings": weights.get(
            "embeddings.position_embeddings", (1, c.num_patches + 1, d)
        ).reshape(c.num_patches + 1, d),
        "patch_embedding": {
            # Flattened in (C, ph, pw) order, the order _patchify lays out each patch.
            "kernel": conv.reshape(d, c.patch_dim).T,
            "bias": weights.get("embeddings.patch_embeddings.projection.bias", (d,)),
        },
    }
    v5 = weights.prefix + "layers.0.layernorm_before.weight" in weights.tensors
    names, layer_fmt = (_V5_BLOCK, "layers.{}.") if v5 else (_LEGACY_BLOCK, "encoder.layer.{}.")
    dims = {name: (d, d) for name in ("query", "key", "value", "attn_out")}
    dims |= {"layernorm_before": (d,), "layernorm_after": (d,), "mlp_in": (d, f), "mlp_out": (f, d)}
    # A checkpoint with qkv_bias=false gets zero (trainable) query/key/value biases.
    no_bias = frozenset() if c.qkv_bias else frozenset({"query", "key", "value"})
    blocks = weights.layers(c.num_layers, layer_fmt, names, dims, no_bias)
    return {"embeddings": embeddings, "blocks": blocks}


def load_vit(path: str | pathlib.Path, dtype: Any = jnp.float32) -> ViT:
    """Load a Hugging Face ViT folder into a :class:`ViT`.

    Reads ``config.json``, ``model.safetensors`` (or a sharded safetensors index) and, when
    present, ``preprocessor_config.json`` (else the ViT defaults: mean = std = 0.5, rescale
    1/255). A ``vit.`` prefix on tensor names (``ViTForImageClassification``,
    ``ViTForMaskedImageModeling``) is handled; the final LayerNorm, pooler, classifier head,
    decoder and mask token are ignored. Params are cast to ``dtype``. Raises
    :class:`ModelFolderError` with a one-line fix for every loading problem.
    """
    got = load_folder(
        path, ViTConfig.from_dict, lambda _: _ANCHOR, _convert, dtype, tokenizer=False
    )
    channels = got.config.num_channels
    pre_file = got.folder / "preprocessor_config.json"
    preprocessor = (
        ViTPreprocessor.from_dict(read_json(pre_file), channels)
        if pre_file.is_file()
        else ViTPreprocessor(image_mean=(0.5,) * channels, image_std=(0.5,) * channels)
    )
    return ViT(
        config=got.config,
        params=got.params,
        preprocessor=preprocessor,
        dtype=dtype,
        path=got.folder,
    )


def write_vit_folder(
    folder: str | pathlib.Path,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int = 64,
    num_channels: int = 3,
    seed: int = 0,
    std: float = 0.02,
) -> pathlib.Path:
    """Write a random-weight ViT in the Hugging Face layout (``config.json``,
    ``model.safetensors`` with ``ViTModel``'s tensor names, ``preprocessor_config.json``), as
    transformers' ``save_pretrained`` does (initialised the way transformers does: matrices
    ~ N(0, std), biases 0, LayerNorm weights 1), with no torch. It stands in for a pretrained
    ViT where none can be downloaded (the tiny Table 3 job) and reads back with
    :func:`load_vit`. Returns the folder."""
    folder = pathlib.Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, f = hidden_size, intermediate_size
    n = (image_size // patch_size) ** 2

    def normal(*shape):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    tensors = {
        "embeddings.cls_token": normal(1, 1, d),
        "embeddings.position_embeddings": normal(1, n + 1, d),
        _PATCH_KEY: normal(d, num_channels, patch_size, patch_size),
        "embeddings.patch_embeddings.projection.bias": np.zeros(d, np.float32),
        "layernorm.weight": np.ones(d, np.float32),
        "layernorm.bias": np.zeros(d, np.float32),
    }
    shapes = {"query": (d, d), "key": (d, d), "value": (d, d), "attn_out": (d, d)}
    shapes |= {"mlp_in": (f, d), "mlp_out": (d, f)}
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        for name in ("layernorm_before", "layernorm_after"):
            tensors[p + _LEGACY_BLOCK[name] + ".weight"] = np.ones(d, np.float32)
            tensors[p + _LEGACY_BLOCK[name] + ".bias"] = np.zeros(d, np.float32)
        for name, (n_out, n_in) in shapes.items():
            tensors[p + _LEGACY_BLOCK[name] + ".weight"] = normal(n_out, n_in)
            tensors[p + _LEGACY_BLOCK[name] + ".bias"] = np.zeros(n_out, np.float32)
    save_safetensors(tensors, folder / SAFETENSORS_FILE, metadata={"format": "pt"})
    config = {
        "model_type": "vit",
        "architectures": ["ViTModel"],
        "hidden_size": d,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "intermediate_size": f,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "image_size": image_size,
        "patch_size": patch_size,
        "num_channels": num_channels,
        "qkv_bias": True,
        "initializer_range": std,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    processor = {
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * num_channels,
        "image_std": [0.5] * num_channels,
        "rescale_factor": 1 / 255,
        "size": {"height": image_size, "width": image_size},
        "image_processor_type": "ViTImageProcessor",
    }
    (folder / "preprocessor_config.json").write_text(
        json.dumps(processor, indent=2) + "\n", encoding="utf-8"
    )
    return folder
