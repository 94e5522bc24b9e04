"""Where a jitted step spends its time on XLA:CPU, from a profiler trace of its thunks.

``python -m benchmarks llm --profile DIR`` traces two of cudt's steps after the timed rounds
(``jax.profiler.trace``, a Perfetto JSON trace written under ``DIR``) and prints, per part of
the step, the time of its matrix products and of everything else, then the slowest thunks that
are not products. XLA:CPU runs a compiled program as a sequence of thunks, one per fused
operation, each a trace event named after its HLO instruction; the instruction's ``op_name``
metadata says which part of the step it belongs to, by the library's named scopes
(``blocks`` in :func:`cudt.models.llama.layers.run_blocks`, ``readout`` in
:func:`cudt.lm_loss.response_token_losses`; the decoder's jitted forward, ``_forward``, counts
as its blocks) and ``transpose(...)`` for the backward pass.
Thunks on different cores may overlap, so the parts can add up to more than the step's time.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax

__all__ = ["Thunk", "parts", "print_profile", "trace_thunks"]

PARTS = (
    "blocks forward",
    "blocks backward",
    "readout forward",
    "readout backward",
    "the rest (optimisers, losses, noise)",
)


@dataclasses.dataclass(frozen=True)
class Thunk:
    name: str  # the HLO instruction
    ms: float  # milliseconds per traced step, all its executions together
    count: int  # executions per step
    shape: str  # the instruction's result shape
    op_name: str  # its op_name metadata ("" if none)

    @property
    def part(self) -> str:
        backward = "transpose(" in self.op_name
        for scope, pattern in (
            # the decoder's jitted forward holds the blocks' scan; the backward's zeroed
            # gradient accumulators are named after it, not after the scope
            ("blocks", r"(^|[/(])(blocks|jit\(_forward)([/)]|$)"),
            ("readout", r"(^|[/(])readout([/)]|$)"),
        ):
            if re.search(pattern, self.op_name):
                return f"{scope} {'backward' if backward else 'forward'}"
        return PARTS[-1]

    @property
    def product(self) -> bool:
        """A matrix product: XLA:CPU's dot thunks, or a fusion that is one (``ynn_fusion``)."""
        return self.name.startswith("dot") or (
            self.name.startswith("ynn_fusion") and self.op_name.endswith("dot_general")
        )


def _instructions(hlo_text: str) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (result shape, op_name), from ``compiled.as_text()``."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([^\n]*)", hlo_text, re.M):
        op = re.search(r'op_name="([^"]*)"', m.group(3))
        name = m.group(1).removesuffix(".clone")
        out.setdefault(name, (m.group(2), op.group(1) if op else ""))
    return out


def trace_thunks(
    run_step: Callable[[], object], hlo_text: str, steps: int = 2, out: Path | None = None
) -> list[Thunk]:
    """Run ``run_step`` (one step, synchronised) ``steps`` times under the profiler and return
    the step's thunks (events named after an instruction of ``hlo_text``), slowest first."""
    if jax.default_backend() != "cpu":
        raise ValueError("the thunk profile reads XLA:CPU's trace events: run it on a CPU")
    with tempfile.TemporaryDirectory(prefix="cudt_profile_") as tmp:
        folder = Path(out) if out is not None else Path(tmp)
        with jax.profiler.trace(str(folder), create_perfetto_trace=True):
            for _ in range(steps):
                run_step()
        traces = sorted(folder.glob("**/perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
        if not traces:
            raise RuntimeError(f"the profiler wrote no perfetto_trace.json.gz under {folder}")
        with gzip.open(traces[-1]) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    known = _instructions(hlo_text)
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.removesuffix(".clone") in known:
            total[name] += e.get("dur", 0)
            count[name] += 1
    return [
        Thunk(name, us / steps / 1e3, count[name] // steps, *known[name.removesuffix(".clone")])
        for name, us in total.most_common()
    ]


def parts(thunks: list[Thunk]) -> dict[str, tuple[int, float, float]]:
    """Part -> (its thunks, milliseconds in matrix products, milliseconds in everything else),
    per step."""
    out = {p: [0, 0.0, 0.0] for p in PARTS}
    for t in thunks:
        out[t.part][0] += 1
        out[t.part][1 if t.product else 2] += t.ms
    return {p: (n, a, b) for p, (n, a, b) in out.items()}


def print_profile(thunks: list[Thunk], top: int = 12) -> None:
    rows = parts(thunks)
    print(
        "\n| part of cudt's step | thunks | matrix products ms | everything else ms |\n"
        "|---|---|---|---|"
    )
    for part, (n, prod, rest) in rows.items():
        print(f"| {part} | {n} | {prod:.1f} | {rest:.1f} |")
    n, prod, rest = (sum(r[i] for r in rows.values()) for i in range(3))
    print(f"| all (thunks on different cores may overlap) | {n} | {prod:.1f} | {rest:.1f} |")
    print(f"\nthe {top} slowest thunks that are not products (ms per step, executions per step):")
    for t in [t for t in thunks if not t.product][:top]:
        print(
            f"  {t.ms:7.1f} ms  x{t.count:<4d} {t.name}  {t.shape}  [{t.part}]  {t.op_name[-70:]}"
        )
