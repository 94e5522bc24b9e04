"""LoRA adapters on a Llama-family decoder's projections: train them, merge them, write them
as PEFT does.

An adapter on projection ``W [in, out]`` (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
``down``) is ``A [in, r]`` and ``B [r, out]``; the adapted projection is ``x W + s·x A B``
with ``s = alpha / r``. The adapters are a pytree of their own, stacked over the blocks like
the kernels they adapt::

    adapters = init_adapters(dec.config, spec, key)      # {"q": {"a": [L, D, r], "b": [L, r, H*Dh]}, ...}
    states = dec.apply(adapted(dec.params, adapters, spec.scale), ids, mask)   # the same forward
    save_decoder(dec, merged(dec.params, adapters, spec.scale), "out/model")   # W + s·A B
    save_adapters("out/adapter", adapters, spec, base="out/base")             # PEFT's folder

:func:`adapted` only puts ``A`` and ``s·B`` beside each kernel (``lora_a``, ``lora_b``); the
decoder's one forward (:func:`cudt.models.llama.layers.linear`) adds ``(x A)(s B)``, so a
training step never forms a merged ``[in, out]`` matrix and differentiates the adapters alone
when the base is held fixed. Initialisation is PEFT's default: ``A`` Kaiming-uniform (``U(±1 /
sqrt(in))``), ``B`` zero, so an adapted model starts as its base exactly. The kernels are
``[in, out]`` as everywhere here; PEFT's ``lora_A.weight [r, in]`` and ``lora_B.weight [out,
r]`` are their transposes (:func:`peft_tensors`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.errors import UsageError
from cudt.io import atomic_output, save_safetensors
from cudt.models.llama.config import DecoderConfig, Params
from cudt.models.llama.hf import HF_LINEAR

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "TARGETS",
    "LoraSpec",
    "adapted",
    "init_adapters",
    "merged",
    "peft_tensors",
    "save_adapters",
]

TARGETS = tuple(HF_LINEAR)  # q, k, v, o, gate, up, down
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """Rank ``r``, ``alpha`` (the update is scaled by ``alpha / r``) and the adapted
    projections."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = TARGETS

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def init_adapters(config: DecoderConfig, spec: LoraSpec, key: jax.Array) -> Params:
    """``{target: {"a": [L, in, r], "b": [L, r, out]}}`` float32: ``A ~ U(±1/sqrt(in))`` (PEFT's
    Kaiming-uniform), ``B = 0``; each target from its own key."""
    blocks = config.param_shapes()["blocks"]
    out = {}
    for i, name in enumerate(spec.targets):
        layers, n_in, n_out = blocks[name]["kernel"]
        bound = 1.0 / np.sqrt(n_in)
        a = jax.random.uniform(
            jax.random.fold_in(key, i), (layers, n_in, spec.rank), jnp.float32, -bound, bound
        )
        out[name] = {"a": a, "b": jnp.zeros((layers, spec.rank, n_out), jnp.float32)}
    return out


def adapted(base: Params, adapters: Params, scale: float | jax.Array) -> Params:
    """``base`` with each adapted projection's ``lora_a = A`` and ``lora_b = scale·B`` beside
    its kernel: what the decoder's forward reads (no merged matrix is formed)."""
    blocks = dict(base["blocks"])
    for name, ab in adapters.items():
        blocks[name] = {**blocks[name], "lora_a": ab["a"], "lora_b": scale * ab["b"]}
    return {**base, "blocks": blocks}


def merged(base: Params, adapters: Params, scale: float) -> Params:
    """``base`` with every adapted kernel replaced by ``W + scale·A B`` (float32 products, the
    kernel's dtype kept): a plain decoder's params, as :func:`cudt.save_decoder` writes them."""
    blocks = dict(base["blocks"])
    for name, ab in adapters.items():
        kernel = blocks[name]["kernel"]
        delta = jnp.einsum(
            "lir,lro->lio",
            jnp.asarray(ab["a"], jnp.float32),
            jnp.asarray(ab["b"], jnp.float32),
            precision=jax.lax.Precision.HIGHEST,
        )
        new = jnp.asarray(kernel, jnp.float32) + scale * delta
        blocks[name] = {**blocks[name], "kernel": new.astype(kernel.dtype)}
    return {**base, "blocks": blocks}


def peft_tensors(adapters: Params) -> dict[str, np.ndarray]:
    """PEFT's tensor names and layout for a ``*ForCausalLM``:
    ``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in]`` and
    ``...lora_B.weight [out, r]``, float32."""
    out = {}
    for name, ab in adapters.items():
        a, b = np.asarray(ab["a"], np.float32), np.asarray(ab["b"], np.float32)
        for i in range(a.shape[0]):
            prefix = f"base_model.model.model.layers.{i}.{HF_LINEAR[name]}"
            out[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[i].T)
            out[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[i].T)
    return out


def adapter_config(spec: LoraSpec, base: str | None) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of a causal-LM LoRA adapter (no dropout, no bias)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": sorted(HF_LINEAR[t].rsplit(".", 1)[1] for t in spec.targets),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def save_adapters(
    path: str | pathlib.Path,
    adapters: Params,
    spec: LoraSpec,
    *,
    base: str | None = None,
    overwrite: bool = False,
) -> pathlib.Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` to the folder ``path``
    (atomically): what ``peft.PeftModel.from_pretrained(model, path)`` applies to the base
    model (``base``: its name or path, recorded in the config). Returns the folder.
    ``adapters`` must be those of ``spec`` (its targets, rank ``r``), which the config names:
    PEFT loads other tensors without a word, and skips or mis-scales them."""
    _check_spec(adapters, spec)
    tensors = peft_tensors(adapters)
    raw = json.dumps(adapter_config(spec, base), indent=2) + "\n"

    def write(target: pathlib.Path) -> None:
        target.mkdir()
        save_safetensors(tensors, target / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        (target / ADAPTER_CONFIG).write_text(raw, encoding="utf-8")

    return atomic_output(
        path, write, overwrite=overwrite, flag="save_adapters:", replace="overwrite=True"
    )


def _check_spec(adapters: Params, spec: LoraSpec) -> None:
    """Refuse (one line) adapters that are not ``spec``'s: other targets or another rank."""
    if set(adapters) != set(spec.targets):
        on = sorted(adapters, key=lambda t: TARGETS.index(t) if t in TARGETS else len(TARGETS))
        raise UsageError(
            f"save_adapters: the adapters are on {', '.join(on)}, the spec's targets "
            f"{', '.join(spec.targets)}: pass the LoraSpec they were made with"
        )
    ranks = sorted({int(np.shape(ab["a"])[-1]) for ab in adapters.values()})
    if ranks != [spec.rank]:
        raise UsageError(
            f"save_adapters: the adapters have rank {', '.join(map(str, ranks))}, the spec's "
            f"rank is {spec.rank}: pass the LoraSpec they were made with"
        )
