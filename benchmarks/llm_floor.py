"""The arithmetic of ``python -m benchmarks llm``'s step: its model FLOPs, the matrix products
no implementation of it can avoid (the product floor, timed as
:class:`benchmarks.step.ProductFloor`), the bound they give, and the peaks an MFU is against.

Pure functions of the decoder's config, parameters and batch (``cudt_side``: a
:class:`benchmarks.llm.CudtSide`); ``tests/benchmarks/test_bench_llm_floor.py`` counts them by
hand and against XLA's compiled programs.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import median
from benchmarks.step import ProductFloor

# float32 peak FLOP/s (no tensor cores) of the GPUs whose MFU the table can give.
FP32_PEAK = {"H100": 67e12, "H200": 67e12, "A100": 19.5e12, "L4": 30.3e12}
# dense bf16 tensor-core peak FLOP/s (SXM parts; no sparsity) of the same GPUs.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}

# the block weights that read a block's (normed) input: in the first block that input is the
# frozen embeddings plus noise, whose gradient no step needs
BLOCK_INPUT = ("q", "k", "v")


def step_flops(cudt_side) -> float:
    """Model FLOPs of one step: ``6·N·B·T`` for the blocks' ``N`` weights (forward and
    backward) plus, per readout of a response token at each of the L+1 states, ``4·D·V``
    (forward, and backward to the state: a tied head is frozen with the embeddings) or
    ``6·D·V`` (an untied head, trained). Attention scores and cudt's rematerialised readouts
    are not counted."""
    dec = cudt_side.data.decoder
    c = dec.config
    blocks = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(dec.params["blocks"]))
    ex = cudt_side.batch.examples
    tokens = int(np.prod(ex["input_ids"].shape))
    responses = int(np.sum(np.asarray(ex["loss_mask"]) != 0))
    per_readout = (4.0 if c.tie_word_embeddings else 6.0) * c.hidden_size * c.vocab_size
    return 6.0 * blocks * tokens + per_readout * (c.num_layers + 1 - cudt_side.first) * responses


def floor_products(
    config, params, tokens: int, responses: int, first: int
) -> list[tuple[int, int, int, int]]:
    """The matrix products a constrained step of this decoder cannot avoid, as ``(count, m, k,
    n)`` (``count`` products ``[m, k] @ [k, n]``), at the step's shapes: for every weight matrix
    ``W [in, out]`` of the blocks (``params["blocks"]``, stacked ``[L, in, out]``), over the
    ``tokens`` = B·T positions, the forward ``x @ W``, the input's gradient ``dy @ Wᵀ`` (but not
    into the first block's input, the frozen embeddings: :data:`BLOCK_INPUT`) and the weight's
    gradient ``xᵀ @ dy``; for the ``responses`` response tokens read out at each of the states
    from ``first`` on, the head's logits ``[rows, D] @ [D, V]`` and the state's gradient
    ``[rows, V] @ [V, D]`` (none at state 0, the frozen embeddings), plus the head's own gradient
    when it is untied (trained). Left out, so the floor only gets lower: the attention scores
    (3.4 GFLOP of 309 at SmolLM2's B 4 × T 64), every elementwise operation, the norms and the
    optimisers."""
    products = []
    for path, w in jax.tree_util.tree_flatten_with_path(params["blocks"])[0]:
        if len(w.shape) != 3:  # a norm's weights (or a bias): no product
            continue
        layers, fan_in, fan_out = w.shape
        skip_input = path[0].key in BLOCK_INPUT
        products += [
            (layers, tokens, fan_in, fan_out),  # forward
            (layers - skip_input, tokens, fan_out, fan_in),  # the input's gradient
            (layers, fan_in, tokens, fan_out),  # the weight's gradient
        ]
    dim, vocab = config.hidden_size, config.vocab_size
    rows = (config.num_layers + 1 - first) * responses
    products += [
        (1, rows, dim, vocab),  # logits
        (1, rows - (first == 0) * responses, vocab, dim),  # the states' gradients
    ]
    if not config.tie_word_embeddings:
        products.append((1, dim, rows, vocab))  # a trained head's gradient
    return products


def product_floor(cudt_side) -> ProductFloor:
    """:func:`floor_products` of this side's decoder and batch, compiled in its compute dtype."""
    dec, ex = cudt_side.data.decoder, cudt_side.batch.examples
    products = floor_products(
        dec.config,
        dec.params,
        int(np.prod(ex["input_ids"].shape)),
        int(np.sum(np.asarray(ex["loss_mask"]) != 0)),
        cudt_side.first,
    )
    return ProductFloor(products, jnp.dtype(cudt_side.cfg.compute_dtype))


def fp32_peak(device_name: str, dtype: str = "float32") -> float | None:
    """The float32 (``dtype="bfloat16"``: dense bf16) peak FLOP/s of a GPU this script knows
    by name, as a whole word (an "L40S" is not an "L4"; None for others, CPUs)."""
    peaks = BF16_PEAK if dtype == "bfloat16" else FP32_PEAK
    return next((v for k, v in peaks.items() if re.search(rf"\b{k}\b", device_name)), None)


def floor_bounds(floor_results: dict, seconds: dict) -> list[list]:
    """Rows ``threads, floor s, torch s, torch / floor, torch / cudt`` (medians; the floor: the
    faster of its timings) per thread count of ``floor_results`` (threads -> the floor's seconds
    in every round, one list per way of timing it)."""
    rows = []
    for threads, timings in floor_results.items():
        floor_s = min(median(ts) for ts in timings)
        torch_s = seconds[("torch + Cooper", threads)]
        label = f"{threads}" if threads > 0 else "default"
        rows.append(
            [label, floor_s, torch_s, torch_s / floor_s, torch_s / seconds[("cudt", threads)]]
        )
    return rows
