"""The forward of a BERT-family encoder: flax modules, and :class:`Encoder` (config, params,
tokenizer and pure apply functions) that returns EVERY layer's hidden state."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.encoders.config import EncoderConfig, EncoderError
from cudt.models.hf import (
    FolderModel,
    Params,
    activation,
    check_range,
    check_shape,
    layer_norm,
    self_attention,
    token_ids,
)

__all__ = ["Encoder", "Granularity"]

Granularity = Literal["block", "sublayer"]


# --------------------------------------------------------------------------------------------
# Flax modules
# --------------------------------------------------------------------------------------------


def _position_ids(config: EncoderConfig, input_ids: jax.Array) -> jax.Array:
    """Position ids ``[B, T]`` as HF computes them for this architecture."""
    batch, length = input_ids.shape
    if config.model_type == "roberta":
        # HF create_position_ids_from_input_ids: padding_idx + cumsum of non-pad tokens; pad
        # tokens keep padding_idx. It looks at input_ids, not at the attention mask.
        not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))


class _Embeddings(nn.Module):
    """Word + token type + position embeddings followed by LayerNorm."""

    config: EncoderConfig
    dtype: Any

    def setup(self) -> None:
        c, dt = self.config, self.dtype
        self.word_embeddings = nn.Embed(c.vocab_size, c.hidden_size, dtype=dt, param_dtype=dt)
        self.position_embeddings = nn.Embed(
            c.max_position_embeddings, c.hidden_size, dtype=dt, param_dtype=dt
        )
        if c.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embed(
                c.type_vocab_size, c.hidden_size, dtype=dt, param_dtype=dt
            )
        self.layer_norm = layer_norm(c.layer_norm_eps, dt, "layer_norm")

    def word(self, input_ids: jax.Array) -> jax.Array:
        """Word embedding lookup only: ``[B, T] -> [B, T, D]``."""
        return self.word_embeddings(input_ids)

    def __call__(
        self,
        input_ids: jax.Array,  # [B, T] int
        token_type_ids: jax.Array | None,  # [B, T] int, None = all zeros (HF default)
        embedding_noise: jax.Array | None,  # [B, T, D]
    ) -> jax.Array:  # [B, T, D]
        x = self.word_embeddings(input_ids)
        if embedding_noise is not None:
            # The perturbation acts on the input token embeddings only, before positions,
            # token types and the LayerNorm see them.
            x = x + embedding_noise.astype(x.dtype)
        # Same summation order as HF ((word + type) + position) for bit-closer parity.
        if self.config.type_vocab_size > 0:
            if token_type_ids is None:
                token_type_ids = jnp.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(_position_ids(self.config, input_ids))
        return self.layer_norm(x)


class _Block(nn.Module):
    """One post-LayerNorm transformer block; the body of the layer scan.

    Returns ``(carry, ys)``: carry is the block output; ys is the block output (``[B, T, D]``)
    or, when ``sublayer``, ``(after attention sub-layer, block output)``.
    """

    config: EncoderConfig
    dtype: Any
    sublayer: bool = False

    @nn.compact
    def __call__(
        self,
        h: jax.Array,  # [B, T, D]
        mask_bias: jax.Array,  # [B, 1, 1, T] float32 additive: 0 on real keys, finfo.min on pads
    ) -> tuple[jax.Array, Any]:
        c, dt = self.config, self.dtype
        dense = functools.partial(nn.Dense, dtype=dt, param_dtype=dt)
        attn = self_attention(h, c.num_heads, dt, mask_bias)  # [B, T, D]
        h_attn = layer_norm(c.layer_norm_eps, dt, "attn_norm")(attn + h)  # [B, T, D]

        m = dense(c.intermediate_size, name="mlp_in")(h_attn)  # [B, T, F]
        m = dense(c.hidden_size, name="mlp_out")(activation(c.activation)(m))
        h_out = layer_norm(c.layer_norm_eps, dt, "mlp_norm")(m + h_attn)  # [B, T, D]
        return h_out, ((h_attn, h_out) if self.sublayer else h_out)


class _EncoderModule(nn.Module):
    """Embeddings then ``L`` blocks scanned over stacked params; returns all hidden states."""

    config: EncoderConfig
    dtype: Any
    granularity: str = "block"

    def setup(self) -> None:
        self.embeddings = _Embeddings(self.config, self.dtype)
        scanned = nn.scan(
            _Block,
            variable_axes={"params": 0},  # params["blocks"] leaves: leading [L] axis
            split_rngs={"params": True},
            in_axes=nn.broadcast,  # the same mask for every block
            length=self.config.num_layers,
        )
        self.blocks = scanned(self.config, self.dtype, self.granularity == "sublayer")

    def embed(self, input_ids: jax.Array) -> jax.Array:  # [B, T] -> [B, T, D]
        return self.embeddings.word(input_ids)

    def __call__(
        self,
        input_ids: jax.Array,  # [B, T] int
        attention_mask: jax.Array,  # [B, T], nonzero = real token
        token_type_ids: jax.Array | None = None,  # [B, T]
        embedding_noise: jax.Array | None = None,  # [B, T, D]
    ) -> jax.Array:  # [L+1, B, T, D] or [2L+1, B, T, D]
        h0 = self.embeddings(input_ids, token_type_ids, embedding_noise)  # [B, T, D]
        # Additive mask like HF: finfo.min rather than -inf, so a fully padded row stays finite
        # (uniform attention, as HF "eager"; HF "sdpa" zeroes that row's attention instead) and
        # never NaN. Padded queries are still computed, as in HF.
        neg = jnp.finfo(jnp.float32).min
        mask_bias = jnp.where(attention_mask[:, None, None, :] != 0, 0.0, neg).astype(jnp.float32)
        _, ys = self.blocks(h0, mask_bias)
        if self.granularity == "sublayer":
            h_attn, h_out = ys  # each [L, B, T, D]
            # Interleave to [2L, B, T, D]: attn_0, out_0, attn_1, out_1, ...
            ys = jnp.stack([h_attn, h_out], axis=1).reshape(-1, *h0.shape)
        return jnp.concatenate([h0[None], ys], axis=0)


@functools.partial(jax.jit, static_argnames=("config", "dtype", "granularity"))
def _forward(
    params: Params,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    token_type_ids: jax.Array | None,
    embedding_noise: jax.Array | None,
    *,
    config: EncoderConfig,
    dtype: np.dtype,
    granularity: str,
) -> jax.Array:
    module = _EncoderModule(config, dtype, granularity)
    return module.apply(
        {"params": params}, input_ids, attention_mask, token_type_ids, embedding_noise
    )


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _embed(params: Params, input_ids: jax.Array, *, config: EncoderConfig, dtype: np.dtype):
    module = _EncoderModule(config, dtype)
    return module.apply({"params": params}, input_ids, method=_EncoderModule.embed)


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Encoder(FolderModel[EncoderConfig]):
    """A loaded encoder: config, params pytree (``{"embeddings": {...}, "blocks": {... leaves
    [L, ...]}}``), tokenizer and pure apply functions (see :class:`~cudt.models.hf.FolderModel`).
    """

    tokenizer: Any = None  # tokenizers.Tokenizer | None
    dtype: Any = jnp.float32
    path: pathlib.Path | None = None

    def apply(
        self,
        params: Params,
        input_ids: Any,  # [B, T] int
        attention_mask: Any,  # [B, T], 1 = real token, 0 = padding; None = no padding
        *,
        embedding_noise: Any = None,  # [B, T, D]
        granularity: Granularity = "block",
        token_type_ids: Any = None,  # [B, T]; None = zeros (HF default)
    ) -> jax.Array:
        """Pure forward pass returning every hidden state.

        Returns ``[L+1, B, T, D]`` for ``granularity="block"``: the embedding output, then the
        output of each block (HF ``hidden_states``). ``granularity="sublayer"`` returns
        ``[2L+1, B, T, D]``: the embedding output, then per block the state after the attention
        sub-layer (after its residual + LayerNorm) and after the MLP sub-layer (= block output),
        so the block outputs are ``states[2::2]``.

        ``embedding_noise`` (``[B, T, D]``) is added to the WORD embeddings before position /
        token type embeddings and the embedding LayerNorm, i.e. it perturbs the input token
        embeddings; ``embedding_noise=0`` gives the unperturbed states.

        Differentiable and jittable (``jax.jit(enc.apply, static_argnames="granularity")``).
        Ids outside the vocabulary raise :class:`EncoderError` when called eagerly; under
        tracing they cannot be checked: an id past the vocabulary reads as NaN, a negative one
        counts from its end (numpy's indexing).
        """
        if granularity not in ("block", "sublayer"):
            raise EncoderError(f"granularity must be 'block' or 'sublayer', got {granularity!r}")
        input_ids = token_ids(input_ids)
        batch, length = input_ids.shape
        if length > self.config.max_length:
            raise EncoderError(
                f"sequence length {length} exceeds the model's {self.config.max_length} "
                "positions; tokenize with a smaller max_length"
            )
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        attention_mask = jnp.asarray(attention_mask)
        check_shape("attention_mask", attention_mask.shape, (batch, length))
        check_range("input_ids", input_ids, self.config.vocab_size)
        if token_type_ids is not None:
            token_type_ids = jnp.asarray(token_type_ids)
            check_shape("token_type_ids", token_type_ids.shape, (batch, length))
            if self.config.type_vocab_size == 0:
                raise EncoderError(f"{self.config.model_type} has no token type embeddings")
            check_range("token_type_ids", token_type_ids, self.config.type_vocab_size)
        if embedding_noise is not None:
            embedding_noise = jnp.asarray(embedding_noise)
            check_shape(
                "embedding_noise", embedding_noise.shape, (batch, length, self.config.hidden_size)
            )
        return _forward(
            params,
            input_ids,
            attention_mask,
            token_type_ids,
            embedding_noise,
            config=self.config,
            dtype=jnp.dtype(self.dtype),
            granularity=granularity,
        )

    def embed(self, params: Params, input_ids: Any) -> jax.Array:
        """Word (token) embedding lookup only, ``[B, T] -> [B, T, D]``.

        Before position / token type embeddings and LayerNorm: the space ``embedding_noise``
        lives in (e.g. scale noise by the norm of these vectors). Ids are checked as
        :meth:`apply` checks them.
        """
        input_ids = token_ids(input_ids)
        check_range("input_ids", input_ids, self.config.vocab_size)
        return _embed(params, input_ids, config=self.config, dtype=jnp.dtype(self.dtype))

    def position_embeddings(self, input_ids: Any) -> jax.Array:
        """The pretrained position embeddings ``[B, T, D]`` of ``input_ids`` ``[B, T]``, with
        the position ids this architecture's embedding layer gives them (RoBERTa's count from
        ``pad_token_id + 1``); jittable, read from the loaded params (a constant)."""
        input_ids = token_ids(input_ids)
        length = input_ids.shape[-1]
        if length > self.config.max_length:  # indexing would repeat the table's last row
            raise EncoderError(
                f"sequence length {length} exceeds the model's {self.config.max_length} "
                "positions; tokenize with a smaller max_length"
            )
        table = jnp.asarray(self.params["embeddings"]["position_embeddings"]["embedding"])
        return table[_position_ids(self.config, input_ids)]

    def __call__(self, input_ids: Any, attention_mask: Any) -> jax.Array:
        """``apply`` with the loaded params: ``[B, T] -> [L+1, B, T, D]``."""
        return self.apply(self.params, input_ids, attention_mask)

    def tokenize(
        self,
        texts: Sequence[str] | Sequence[tuple[str, str]],
        max_length: int,
        *,
        return_token_type_ids: bool = False,
    ) -> tuple[np.ndarray, ...]:
        """Tokenize with the model's ``tokenizer.json``, truncating and padding to ``max_length``.

        Pairs ``(a, b)`` use the tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``),
        truncated longest-first as HF ``truncation=True``. Returns ``(input_ids,
        attention_mask)`` as int32 numpy arrays ``[B, max_length]`` padded on the right with the
        model's pad id, plus ``token_type_ids`` when ``return_token_type_ids`` (pass them to
        ``apply`` to give the second segment of a BERT pair its type embedding; HF does).

        Reconfigures the padding/truncation of ``self.tokenizer`` in place on every call.
        """
        if self.tokenizer is None:
            raise EncoderError(
                f"no tokenizer.json in {self.path}: this encoder cannot tokenize; add the "
                "model's tokenizer.json to the folder or tokenize elsewhere"
            )
        if isinstance(texts, str | tuple):
            raise EncoderError("texts must be a list of strings or of (str, str) pairs")
        if max_length > self.config.max_length:
            raise EncoderError(
                f"max_length {max_length} exceeds the model's {self.config.max_length} positions"
            )
        pad_id = self.config.pad_token_id
        pad_token = self.tokenizer.id_to_token(pad_id)
        if pad_token is None:
            raise EncoderError(f"pad_token_id {pad_id} is not in the tokenizer vocabulary")
        tok = self.tokenizer
        # tokenizer.json may carry its own fixed padding/truncation (all-MiniLM-L6-v2 pads to
        # 128); the caller's max_length wins.
        tok.enable_truncation(max_length)
        tok.enable_padding(
            direction="right",
            pad_id=pad_id,
            pad_type_id=0,
            pad_token=pad_token,
            length=max_length,
        )
        try:
            encodings = tok.encode_batch(list(texts))
        except Exception as err:  # tokenizers raises plain Exception subclasses
            raise EncoderError(f"tokenization failed: {err}") from err
        ids = np.asarray([e.ids for e in encodings], dtype=np.int32).reshape(-1, max_length)
        if ids.size and int(ids.max()) >= self.config.vocab_size:  # compiled, it would read NaN
            top = int(ids.max())
            raise EncoderError(
                f"the tokenizer.json of {self.path} gives token id {top} "
                f"({tok.id_to_token(top)!r}), past the {self.config.vocab_size} rows of the "
                "model's word embeddings (config.json vocab_size): it is another model's "
                "tokenizer; put this checkpoint's own tokenizer.json in the folder"
            )
        mask = np.asarray([e.attention_mask for e in encodings], np.int32).reshape(ids.shape)
        if return_token_type_ids:
            types = np.asarray([e.type_ids for e in encodings], np.int32).reshape(ids.shape)
            return ids, mask, types
        return ids, mask
