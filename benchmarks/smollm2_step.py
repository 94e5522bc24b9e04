"""One constrained fine-tuning step of SmolLM2-135M-Instruct (GGUF, 30 blocks, V = 49152) on
this machine: every state's readout over the whole sequence vs over the response window only.

The step is the LLM task's own (``LLMTask.load`` / ``build`` and the runner's
:func:`cudt.runner.groups.make_group_step`): 31 per-layer token losses (30 descent constraints
and the reference bound), Adam and dual ascent, chat-template prompts of the generated
instructions, embeddings frozen. ``--readout-tokens all`` reads out all ``(L+1)·B·T`` positions;
``response`` (the default of ``python -m experiments.llm_sft``) only each sample's response
window. Prints the compile time and the median of ``--repeats`` timed steps for each, and checks
that both give the same objective::

    python -m benchmarks.smollm2_step                 # B = 4, T = 64
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from cudt.models.llama import smollm2_gguf_path
from cudt.runner.groups import make_group_step
from cudt.runner.task import RunBatch
from cudt.tasks.llm import LLMConfig, LLMTask


def timed_step(task: LLMTask, cfg: LLMConfig, data, repeats: int) -> dict:
    model = task.build(cfg, data, "llm", None)
    init, step = make_group_step(
        cfg, model, lr=task.default_lr(cfg, "llm"), warmup=0, steps_per_epoch=1, jit=True
    )
    params = model.init(jax.random.key(0))
    ex = {
        k: jnp.asarray(v[: cfg.batch_size]) for k, v in task.split_examples(data, "train").items()
    }
    batch = RunBatch(ex, jnp.float32(cfg.gamma_train), model.frozen)
    key = jax.random.key(1)
    losses = np.asarray(jax.jit(model.layer_losses)(params, batch, key)).mean(0)  # [L+1]
    state = init(params, reference=math.log(data.decoder.config.vocab_size))
    t0 = time.perf_counter()
    state, _ = jax.block_until_ready(step(state, batch, key))  # compile + first step
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, _ = jax.block_until_ready(step(state, batch, key))
        times.append(time.perf_counter() - t0)
    return {"compile_s": compile_s, "step_s": statistics.median(times), "losses": losses}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    task = LLMTask()
    base = LLMConfig(
        checkpoint=str(smollm2_gguf_path()),
        batch_size=args.batch,
        max_length=args.seq,
        num_train=16,
        num_val=4,
        num_test=4,
    )
    data = task.load(base)
    print("\n".join(task.describe(base, data)))
    print(f"response window: {data.response_tokens} of {args.seq} positions per sample")
    rows = {}
    for mode in ("all", "response"):
        cfg = dataclasses.replace(base, readout_tokens=mode)
        d = data if mode == "response" else dataclasses.replace(data, response_tokens=None)
        rows[mode] = timed_step(task, cfg, d, args.repeats)
        r = rows[mode]
        print(
            f"readouts over {mode:8s}: compile {r['compile_s']:6.1f} s, step {r['step_s']:6.2f} s"
        )
    diff = np.max(np.abs(rows["all"]["losses"] - rows["response"]["losses"]))
    print(
        f"speed-up {rows['all']['step_s'] / rows['response']['step_s']:.2f}x; "
        f"largest per-layer loss difference {diff:.2e}"
    )


if __name__ == "__main__":
    main()
