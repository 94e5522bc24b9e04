"""Llama-family decoders (Llama, Mistral, Qwen2) in JAX, from a Hugging Face folder.

Loads a Hugging Face causal-LM folder (``config.json``, ``model.safetensors`` or sharded
``model-0000x-of-0000y.safetensors`` + ``model.safetensors.index.json``, optionally
``tokenizer.json``) with no torch/transformers at run time and returns EVERY layer's hidden
state, BEFORE the final RMSNorm::

    dec = load_decoder("path/to/folder")                  # or Decoder(cfg, cfg.init_params(key))
    states = dec(input_ids, attention_mask)                # [L+1, B, T, D]
    logits = dec.readout(states)                           # [L+1, B, T, V]: norm + LM head, each
    new_ids = dec.generate(dec.params, ids, mask, 16, noise_std=0.1, key=key)  # [B, 16]

``states[0]`` is the token embedding (plus ``embed_noise`` if given), ``states[i]`` the output of
block ``i``. Transformers' ``hidden_states`` differ in their LAST entry only: Llama's
``capture_outputs`` ties ``hidden_states[-1]`` to ``last_hidden_state`` (the final norm applied),
so ``hidden_states[-1] == dec.final_norm(params, states[-1])`` and ``hidden_states[:L] ==
states[:L]``; ``readout`` gives every state the final norm and LM head, so ``readout(states)[-1]``
are the model's logits.

The forward is pure JAX (no flax modules): ``params`` is a nested dict pytree, every leaf under
``params["blocks"]`` has a leading ``[L]`` axis and the blocks run as one ``jax.lax.scan``::

    {"embed": [V, D], "final_norm": [D], "lm_head": [D, V] (untied only),
     "blocks": {"attn_norm": [L, D], "mlp_norm": [L, D],
                "q": {"kernel": [L, D, H*Dh], "bias"?}, "k"/"v": {"kernel": [L, D, K*Dh], "bias"?},
                "o": {"kernel": [L, H*Dh, D], "bias"?},
                "gate"/"up": {"kernel": [L, D, F], "bias"?}, "down": {"kernel": [L, F, D], "bias"?}}}

``dtype`` is the COMPUTE dtype: params of any dtype are cast to it one layer at a time inside the
scan (float32 params with ``dtype=bfloat16`` is mixed precision; gradients stay float32), while
RMSNorm statistics, rotary angles, attention scores and softmax, and logits are float32.

Attention is grouped-query causal attention (head ``h`` uses key/value head ``h // (H / K)``) with
an optional sliding window (Mistral) measured in sequence slots; padded keys never get
attention. Position ids default to ``max(cumsum(mask) - 1, 0)``: ``0, 1, 2, ...`` over the real
tokens, which is ``arange(T)`` for right-padded or unpadded rows and what transformers'
``generate`` uses for left-padded ones (its plain forward uses ``arange(T)`` whatever the padding;
pass ``position_ids`` to reproduce that). Padded query positions are computed but meaningless.

Supported: ``model_type`` ``llama`` (``attention_bias``, ``mlp_bias``, ``head_dim``, GQA, rope
``default`` and ``llama3``), ``mistral`` (the same blocks without biases, ``sliding_window``) and
``qwen2`` (query/key/value biases, no output bias, no sliding-window layers). Anything else is
refused with one line. Only safetensors checkpoints are read: pickle checkpoints are refused,
never opened. Every problem raises :class:`cudt.models.hf.ModelFolderError`.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.hf import FolderModel, ModelFolderError, check_range, check_shape, token_ids
from cudt.models.llama import layers
from cudt.models.llama.config import DecoderConfig, Params
from cudt.models.llama.generate import greedy_generate

__all__ = ["Decoder"]


@functools.partial(jax.jit, static_argnames=("config", "dtype", "remat"))
def _forward(
    params: Params,
    embeds: jax.Array,  # [B, T, D]
    attention_mask: jax.Array,  # [B, T]
    position_ids: jax.Array | None,  # [B, T]
    *,
    config: DecoderConfig,
    dtype: Any,
    remat: bool = False,
) -> jax.Array:  # [L+1, B, T, D]
    mask = attention_mask != 0
    positions = layers.default_positions(mask) if position_ids is None else position_ids
    x = embeds.astype(dtype)
    states, _, _ = layers.run_blocks(params["blocks"], x, positions, mask, config, dtype, remat)
    return jnp.concatenate([x[None], states], axis=0)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "remat"))
def _forward_ids(
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    position_ids: jax.Array | None,
    embed_noise: jax.Array | None,
    *,
    config: DecoderConfig,
    dtype: Any,
    remat: bool = False,
) -> jax.Array:
    x = layers.embed_tokens(params, input_ids, dtype)
    if embed_noise is not None:
        x = x + embed_noise.astype(dtype)
    return _forward(
        params, x, attention_mask, position_ids, config=config, dtype=dtype, remat=remat
    )


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


@dataclasses.dataclass(frozen=True, eq=False)
class Decoder(FolderModel[DecoderConfig]):
    """A Llama-family decoder: config, params pytree, tokenizer and pure functions (see
    :class:`~cudt.models.hf.FolderModel`). ``dtype`` is the compute dtype (see the module
    docstring); params are used in whatever dtype they have. ``remat`` rematerialises every block
    in the backward pass (``dataclasses.replace(dec, remat=True)``): the same values and
    gradients, less activation memory.
    """

    tokenizer: Any = None  # tokenizers.Tokenizer | None
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None
    remat: bool = False
    chat_template: str | None = None  # Jinja; render with llama.chat.apply_chat_template

    # ---- forward ----------------------------------------------------------------------------

    @property
    def _compiled_as(self) -> dict[str, Any]:
        """The static arguments of the jitted forwards: the config, compute dtype and remat."""
        return {"config": self.config, "dtype": jnp.dtype(self.dtype), "remat": self.remat}

    def _mask_and_positions(
        self, shape: tuple[int, int], attention_mask: Any, position_ids: Any
    ) -> tuple[jax.Array, jax.Array | None]:
        mask = jnp.ones(shape, jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
        check_shape("attention_mask", mask.shape, shape)
        if position_ids is not None:
            position_ids = jnp.asarray(position_ids)
            check_shape("position_ids", position_ids.shape, shape)
            if not jnp.issubdtype(position_ids.dtype, jnp.integer):
                raise ModelFolderError(f"position_ids must be integers, got {position_ids.dtype}")
        return mask, position_ids

    def apply(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any = None,  # [B, T], 1 = real token, 0 = padding; None = no padding
        *,
        embed_noise: Any = None,  # [B, T, D], added to the token embeddings
        position_ids: Any = None,  # [B, T] int; None = max(cumsum(mask) - 1, 0)
    ) -> jax.Array:  # [L+1, B, T, D]
        """Pure forward: the token embeddings (plus ``embed_noise``), then every block's
        output, all before the final norm. Differentiable and jittable. Ids outside the
        vocabulary raise :class:`ModelFolderError` when called eagerly."""
        input_ids = token_ids(input_ids)
        mask, position_ids = self._mask_and_positions(input_ids.shape, attention_mask, position_ids)
        check_range("input_ids", input_ids, self.config.vocab_size)
        if embed_noise is not None:
            embed_noise = jnp.asarray(embed_noise)
            check_shape(
                "embed_noise", embed_noise.shape, (*input_ids.shape, self.config.hidden_size)
            )
        return _forward_ids(
            params,
            input_ids,
            mask,
            position_ids,
            embed_noise,
            **self._compiled_as,
        )

    def apply_embeds(
        self,
        params: Params,
        embeds: Any,  # [B, T, D]
        attention_mask: Any = None,  # [B, T]
        *,
        position_ids: Any = None,  # [B, T] int
    ) -> jax.Array:  # [L+1, B, T, D]
        """:meth:`apply` from input embeddings instead of token ids (``states[0] == embeds``)."""
        embeds = jnp.asarray(embeds)
        if embeds.ndim != 3 or embeds.shape[-1] != self.config.hidden_size:
            raise ModelFolderError(
                f"embeds has shape {list(embeds.shape)}, expected [B, T, {self.config.hidden_size}]"
            )
        mask, position_ids = self._mask_and_positions(
            embeds.shape[:2], attention_mask, position_ids
        )
        return _forward(
            params,
            embeds,
            mask,
            position_ids,
            **self._compiled_as,
        )

    def embed(self, params: Params, input_ids: Any) -> jax.Array:
        """Token embedding lookup ``[B, T] -> [B, T, D]`` in the compute dtype (the space
        ``embed_noise`` lives in)."""
        input_ids = jnp.asarray(input_ids)
        check_range("input_ids", input_ids, self.config.vocab_size)
        return layers.embed_tokens(params, input_ids, jnp.dtype(self.dtype))

    def __call__(self, input_ids: Any, attention_mask: Any = None) -> jax.Array:
        """``apply`` with the loaded params: ``[B, T] -> [L+1, B, T, D]``."""
        return self.apply(self.params, input_ids, attention_mask)

    # ---- readout ----------------------------------------------------------------------------

    def final_norm(self, params: Params, x: Any) -> jax.Array:
        """The model's final RMSNorm of ``x [..., D]``, in the compute dtype."""
        x = jnp.asarray(x).astype(self.dtype)
        return layers.rms_norm(x, params["final_norm"], self.config.rms_norm_eps)

    def head_matrix(self, params: Params) -> jax.Array:
        """The LM head as ``[D, V]`` (the embedding transposed when tied), in the params' dtype."""
        return layers.head_matrix(params, self.config)

    def readout_apply(self, params: Params, states: Any) -> jax.Array:
        """Final norm + LM head of every state: ``[..., D] -> [..., V]`` float32 logits (e.g.
        ``[L+1, B, T, D] -> [L+1, B, T, V]``; ``[-1]`` is the model's output)."""
        states = jnp.asarray(states)
        if states.ndim < 1 or states.shape[-1] != self.config.hidden_size:
            raise ModelFolderError(
                f"states have shape {list(states.shape)}, expected [..., {self.config.hidden_size}]"
            )
        return layers.readout_logits(params, states, self.config, jnp.dtype(self.dtype))

    def readout(self, states: Any) -> jax.Array:
        """:meth:`readout_apply` with the loaded params."""
        return self.readout_apply(self.params, states)

    # ---- generation -------------------------------------------------------------------------

    def generate(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any,  # [B, T]; None = no padding
        max_new_tokens: int,
        *,
        noise_std: float | jax.Array = 0.0,
        key: jax.Array | None = None,
        eos_id: int | Sequence[int] | None = None,
        pad_id: int | None = None,
    ) -> jax.Array:  # [B, max_new_tokens]
        """Greedy decoding with a fixed-size KV cache, one compiled program.

        Prompts may be left- or right-padded (each row is first rolled so its last real token
        is last; position ids count real tokens only, as transformers' ``generate``). With a
        ``key``, Gaussian noise ``noise_std * jax.random.normal(key, (B, T + max_new_tokens,
        D))`` is added to the input embedding of every token: slot ``s`` (after that roll) of
        row ``b`` gets ``noise[b, s]``, prompt and generated tokens alike. Once a row emits
        ``eos_id`` (or any of several: Llama 3.1 Instruct ends a turn with ``<|eot_id|>``,
        ``<|eom_id|>`` or ``<|end_of_text|>``, as its ``generation_config.json`` lists them)
        its later tokens are ``pad_id`` (default the first ``eos_id``); with ``eos_id=None``
        every row runs ``max_new_tokens`` steps. ``noise_std`` may be an array (no recompile).
        """
        input_ids = token_ids(input_ids)
        if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
            raise ModelFolderError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        mask, _ = self._mask_and_positions(input_ids.shape, attention_mask, None)
        check_range("input_ids", input_ids, self.config.vocab_size)
        if not _is_traced(mask) and input_ids.shape[1] and not bool(np.all(np.any(mask, axis=1))):
            raise ModelFolderError(
                "a prompt row has no real token (attention_mask all 0): give every row one"
            )
        if input_ids.shape[1] == 0:
            raise ModelFolderError("prompts are empty (T = 0): give every row at least one token")
        noise_std = jnp.asarray(noise_std, jnp.float32)
        if key is None and not _is_traced(noise_std) and float(noise_std) != 0.0:
            raise ModelFolderError(f"noise_std={float(noise_std)} needs a key: pass key=...")
        if eos_id is None:
            eos = ()
        elif isinstance(eos_id, int | np.integer):
            eos = (int(eos_id),)
        else:
            eos = tuple(dict.fromkeys(int(e) for e in eos_id))
        for name, value in [*(("eos_id", e) for e in eos), ("pad_id", pad_id)]:
            if value is not None and not 0 <= int(value) < self.config.vocab_size:
                raise ModelFolderError(
                    f"{name} {value} is outside the vocabulary [0, {self.config.vocab_size})"
                )
        if max_new_tokens == 0:
            return jnp.zeros((input_ids.shape[0], 0), input_ids.dtype)
        pad = int(pad_id) if pad_id is not None else (eos[0] if eos else 0)
        return greedy_generate(
            params,
            input_ids,
            mask,
            noise_std,
            key,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            max_new_tokens=int(max_new_tokens),
            eos_id=eos,
            pad_id=pad,
        )
