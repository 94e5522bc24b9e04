"""``python -m benchmarks llm``'s product floor counts exactly the products it says it times.

The floor (``benchmarks.llm_floor.floor_products``, timed as ``benchmarks.step.ProductFloor``)
bounds the speed-up any implementation of SmolLM2's step could reach, so its FLOPs must be the
step's unavoidable products: checked here against a count written out from the model's
dimensions, and against XLA's own count of the compiled floor program.
"""

from __future__ import annotations

import jax
import pytest
from helpers import TINY_DECODER

from benchmarks import llm_floor, step
from cudt.models.llama.config import DecoderConfig

# SmolLM2-135M: D 576, MLP 1536, 9 heads (3 kv) of 64, 30 blocks, V 49152, tied head
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    tie_word_embeddings=True,
)


def _floor_flops(config: DecoderConfig, tokens: int, responses: int, first: int) -> float:
    params = jax.eval_shape(config.init_params, jax.random.key(0))
    products = llm_floor.floor_products(config, params, tokens, responses, first)
    return sum(2.0 * c * m * k * n for c, m, k, n in products)


def _by_hand(c: DecoderConfig, tokens: int, responses: int, first: int) -> float:
    """Written out: per block, q, k, v, o, gate, up, down, each 3 products of 2·tokens·in·out
    (forward, input gradient, weight gradient), less the first block's q, k, v input gradients
    (the frozen embeddings); per readout row, the logits and the state's gradient, 2·D·V each
    (a trained head: its gradient too), no state gradient at state 0."""
    d, heads, kv, mlp, v = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
        c.vocab_size,
    )
    per_block = d * heads + 2 * d * kv + heads * d + 3 * d * mlp
    blocks = 6.0 * tokens * c.num_layers * per_block - 2.0 * tokens * d * (heads + 2 * kv)
    rows = (c.num_layers + 1 - first) * responses
    grad_rows = rows - (responses if first == 0 else 0)
    head = 2.0 * d * v * (rows + grad_rows + (0 if c.tie_word_embeddings else rows))
    return blocks + head


@pytest.mark.parametrize(
    "first, tied", [(1, True), (0, True), (1, False)], ids=["block1", "state0", "untied"]
)
def test_smollm2_floor_counts_the_steps_products(first, tied):
    config = DecoderConfig(**{**SMOLLM2, "tie_word_embeddings": tied})
    assert config.head_dim == 64
    tokens, responses = 4 * 64, 43  # the benchmark's default batch
    assert _floor_flops(config, tokens, responses, first) == _by_hand(
        config, tokens, responses, first
    )


def test_smollm2_floor_is_the_model_flops_less_what_no_step_computes():
    """At the benchmark's setting (state 1 on, tied frozen head) the floor is ``step_flops``'
    6·N·B·T + 4·D·V per readout less the norms' 6·N·B·T (no products) and the first block's
    q, k, v input gradients: 163.5 + 146.1 GFLOP model FLOPs."""
    config = DecoderConfig(**SMOLLM2)
    params = jax.eval_shape(config.init_params, jax.random.key(0))
    tokens, responses, d = 256, 43, config.hidden_size
    blocks = sum(x.size for x in jax.tree.leaves(params["blocks"]))
    norms = sum(x.size for x in jax.tree.leaves(params["blocks"]) if len(x.shape) == 2)
    model = 6.0 * blocks * tokens + 4.0 * d * config.vocab_size * config.num_layers * responses
    skipped = 6.0 * norms * tokens + 2.0 * tokens * d * (576 + 2 * 192)
    assert _floor_flops(config, tokens, responses, 1) == model - skipped
    assert round(model / 1e9, 1) == 309.2  # the figure the benchmark prints (docs/speed.md)


def test_compiled_floor_does_the_flops_it_claims():
    """XLA's count of the compiled floor program equals the products' 2·m·k·n (a tiny Llama)."""
    config = DecoderConfig(
        vocab_size=400,
        **TINY_DECODER,
        tie_word_embeddings=True,
    )
    params = jax.eval_shape(config.init_params, jax.random.key(0))
    floor = step.ProductFloor(llm_floor.floor_products(config, params, 2 * 32, 17, 1))
    assert floor.flops == _by_hand(config, 64, 17, 1)
    assert step.xla_flops(floor.compiled) == pytest.approx(floor.flops, rel=1e-6)
    assert floor.block(1) > 0


def test_the_bound_takes_the_faster_floor_and_the_medians():
    """The floor is the faster median of its two timings (XLA's, torch's): the bound
    torch / floor must not use the slower one, which would overstate the room left."""
    seconds = {("cudt", 0): 4.0, ("torch + Cooper", 0): 6.0}
    timings = {0: ([3.0, 9.0, 2.0], [2.5, 2.4, 8.0])}  # medians 3.0 (XLA) and 2.5 (torch)
    ((label, floor_s, torch_s, bound, measured),) = llm_floor.floor_bounds(timings, seconds)
    assert (label, floor_s, torch_s) == ("default", 2.5, 6.0)
    assert bound == pytest.approx(6.0 / 2.5) and measured == pytest.approx(1.5)


def test_a_peak_is_known_by_its_gpus_whole_name():
    """An MFU is against the GPU's own peak: an "NVIDIA L40S" is not an "L4" (a substring
    match gave it the L4's, a third of its own, and an MFU three times too high)."""
    assert llm_floor.fp32_peak("NVIDIA L4") == llm_floor.FP32_PEAK["L4"]
    assert llm_floor.fp32_peak("NVIDIA L40S") is None
    assert llm_floor.fp32_peak("NVIDIA A100-SXM4-80GB", "bfloat16") == llm_floor.BF16_PEAK["A100"]
    assert llm_floor.fp32_peak("NVIDIA H200") == llm_floor.FP32_PEAK["H200"]
    assert llm_floor.fp32_peak("cpu") is None
