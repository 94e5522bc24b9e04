"""``python -m benchmarks step``: the video step, cudt vs PyTorch + Cooper, and its FLOP rate.

    .venv/bin/python -m benchmarks step                 # UT-5 and DUST-5, both dynamics
    .venv/bin/python -m benchmarks step --quick         # tiny sizes (the tests)

The step is the main job's (``python -m experiments.video_denoise``), built by the runner's own
wiring from :class:`cudt.tasks.video.VideoConfig` (``benchmarks/setting.py``): a constrained
UT-5 or DUST-5 (one dictionary per layer) on batches of 32 sequences of 8 synthetic 16x16
patches, noise x̃ = x + γ·σ·n drawn in the step, per-layer MSE, primal Adam, the UT's
eigenvalue clipping. Two primal-dual dynamics (``--dynamics``): ``default``, the config's own
(nuPI duals, alternating updates), and ``paper`` (Adam duals, simultaneous updates: the shared
RunConfig defaults). The peer is the same models in PyTorch with the problem in Cooper
(``benchmarks/peer.py``: Cooper's ``AlternatingDualPrimalOptimizer`` with its ``nuPI``, or its
``SimultaneousOptimizer`` with ``torch.optim.Adam(maximize=True)``); the UT's clipping there is
``torch.linalg.eigh`` (cudt: its default, matmul only).

1. **Equal work**, before any timing: both sides start from cudt's parameters and λ = 0, at
   ε = ``--check-epsilon`` (0.5: the constraints are violated at the start, so the multipliers
   move from the first step; ε is a value in the run's state, the step is the same program)
   and take
   ``--check-steps`` steps on the same batch, torch given the noise cudt draws. Per step: the
   layer losses (max relative difference) and the multipliers after the step (max difference
   relative to the largest). The verdict: step 1's losses and multipliers within 1e-4, later
   steps' losses within 1e-3 and multipliers within 1e-2 (after one Adam step, an element
   whose gradient is at rounding level may move the other way, so later steps agree less than
   the first; the losses alone tell a different primal step: Adam duals hardly see it).
2. **Speed**: cudt (jitted, state donated) and torch + Cooper, each with 1 thread and with
   torch's default thread count (``--torch-threads``), all interleaved over ``--repeats``
   repetitions of ``--steps`` steps after ``--burn-in`` untimed steps and an untimed block
   each; median ms/step and torch / cudt. n threads, fewer than the machine's cores: measured
   in a child process started on n cores (``benchmarks.common.measure_on_cores``: XLA sizes its thread
   pool at start; until 2026-11-30 the threads of this process were confined instead, which
   left cudt a pool of 2 threads on one core, 15 % slower), torch told n threads.
3. **FLOP rate** (``--no-flops`` skips it): XLA's FLOP count of the default-dynamics step with
   every ``lax.scan``, ``fori_loop`` and ``map`` unrolled (a while loop's body is counted once
   otherwise; before 2026-12-02 only ``scan``: DUST's Lanczos undercounted; the UT counted
   with ``eigh`` clipping, whose LAPACK call counts 0, since XLA counts both branches of the
   default clipping's ``lax.cond``), divided by its time, against a jitted float32
   ``--matmul-size`` square matmul timed in the same interleaving. A ``while_loop``'s
   data-dependent trips are not unrolled: DUST's Newton–Schulz solve (``cudt.linalg.spd_solve``,
   3 trips at the initial dictionaries) is counted as one, 0.13 of its 3.31 GFLOP missed (4 %:
   its GFLOP/s and its floor that much low, its bound that much high).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks.common import (
    JaxSteps,
    choice_list,
    copy_tree,
    cpu_cores,
    header,
    int_list,
    measure_on_cores,
    narrow_thread_counts,
    non_negative_int,
    number_flag,
    output_file,
    parse_quick,
    positive_int,
    print_table,
    time_alternatives,
)
from benchmarks.peer import TORCH_DEFAULT_THREADS, relative_diff, torch_threads, video_peer
from benchmarks.setting import VideoSetup, dynamics_config, video_config, video_parser, video_setup
from cudt.data.video import perturb
from cudt.models import ut_project
from cudt.runner.groups import make_group_step

DYNAMICS_FLAGS = {"default": "video default", "paper": "paper"}
QUICK = dict(steps=2, repeats=1, torch_threads=[0], check_steps=3, matmul_size=256, burn_in=0)


def parse_args(argv=None) -> argparse.Namespace:
    p = video_parser("python -m benchmarks step", __doc__)
    p.add_argument(
        "--dynamics",
        type=choice_list(tuple(DYNAMICS_FLAGS), "dynamics"),
        default=list(DYNAMICS_FLAGS),
        help="default (nuPI, alternating: the video task's) and/or paper (Adam duals, "
        "simultaneous) (default default,paper)",
    )
    number_flag(p, "--steps", 10, "steps per timed block")
    number_flag(p, "--repeats", 7, "interleaved repetitions")
    p.add_argument(
        "--torch-threads",
        type=int_list,
        default=[1, 0],
        help="comma-separated thread counts; 0 is torch's default "
        f"({TORCH_DEFAULT_THREADS} here); cudt runs on as many cores (default 1,0)",
    )
    p.add_argument(
        "--burn-in",
        type=non_negative_int,
        default=20,
        help="untimed steps of each side before timing (default 20): the UT's clipping is "
        "inactive at its initial weights (W̃_f = −0.9·I) and active from the first few steps on",
    )
    number_flag(p, "--check-steps", 3, "equal-work steps")
    number_flag(p, "--check-epsilon", 0.5, "ε of the equal-work check", type=float)
    p.add_argument("--no-flops", dest="flops", action="store_false", help="skip the FLOP rate")
    p.add_argument("--matmul-size", type=positive_int, default=2048, help="n of the n x n matmul")
    p.add_argument(
        "--json",
        type=output_file,
        help="also write the speed medians (ms/step per model, dynamics, side, threads) to this "
        "JSON file (how the child processes of fewer threads report)",
    )
    args = parse_quick(
        p,
        argv,
        QUICK,
        "tiny sizes for the tests (L = 2, 3 short videos, batch 4, 1 repeat of 2 steps, "
        "torch's default threads, a 256² matmul)",
    )
    return args


def base_config(args: argparse.Namespace):
    overrides = {}
    if args.layers is not None:
        overrides["layers"] = args.layers
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    elif args.quick:
        overrides["batch_size"] = 4
    return video_config(quick=args.quick, **overrides)


# --------------------------------------------------------------------------------------------------
# Equal work
# --------------------------------------------------------------------------------------------------


def states_at(setup: VideoSetup, epsilon: float):
    """Run 0's initial state with ε = ``epsilon`` (a per-run value: the same step program)."""
    program = setup.program
    per_run = dict(program.per_run, epsilon=jnp.full_like(program.per_run["epsilon"], epsilon))
    states = jax.jit(program.init_states)(program.init_keys, per_run)
    return jax.tree.map(lambda a: a[0], states)


def check_equal_work(setup: VideoSetup, dynamics: str, num_steps: int, epsilon: float) -> dict:
    """``num_steps`` steps of cudt and of torch + Cooper from the same start, batch and noise.

    Returns ``{"rows": table rows, "ok": verdict, "first_call": cudt's first step in seconds
    (tracing and compilation included), "setup": seconds to build both sides, "torch_first":
    torch + Cooper's first step}`` (the H200's first call once stalled in this check for 80 s,
    where a later one took 2.4 s: the three times say which side).
    """
    t0 = time.perf_counter()
    state = states_at(setup, epsilon)
    tstep, kwargs = video_peer(setup, setup.params(0), epsilon=epsilon)
    batch = setup.batch()
    key = jax.random.key(0)
    rows, ok, first_call, torch_first = [], True, None, None
    setup_s = time.perf_counter() - t0
    for i in range(num_steps):
        # the noise cudt's step draws at step i: its layer losses perturb the batch with the
        # step key fold_in(key, i); perturb(0, γ=1, σ=1, k) is that noise itself
        noise = perturb(jnp.zeros_like(batch.examples), 1.0, 1.0, jax.random.fold_in(key, i))
        t0 = time.perf_counter()
        state, jm = jax.block_until_ready(setup.jitted(state, batch, key))
        first_call = first_call or time.perf_counter() - t0
        t0 = time.perf_counter()
        tm = tstep(**kwargs(batch.examples, noise))
        torch_first = torch_first or time.perf_counter() - t0
        loss = relative_diff(jm["layer_loss"], tm["layer_loss"].cpu().numpy(), normwise=False)
        lam = relative_diff(jm["multipliers"], tm["multipliers"].cpu().numpy(), normwise=True)
        # later steps: the losses too (the multipliers alone passed a torch side at twice
        # cudt's primal learning rate under Adam duals, whose steps hardly depend on it)
        good = loss < 1e-4 and lam < 1e-4 if i == 0 else loss < 1e-3 and lam < 1e-2
        ok = ok and good
        largest = float(np.max(np.abs(np.asarray(jm["multipliers"]))))
        rows.append([setup.name, dynamics, i + 1, loss, lam, largest, "yes" if good else "NO"])
    return {
        "rows": rows,
        "ok": ok,
        "first_call": first_call,
        "setup": setup_s,
        "torch_first": torch_first,
    }


# --------------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------------


def xla_flops(compiled) -> float:
    """``cost_analysis()['flops']`` (a dict, or a list of one dict in some jax versions)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list | tuple):
        analysis = analysis[0]
    return float(analysis["flops"])


@contextlib.contextmanager
def scans_unrolled() -> Iterator[None]:
    """Inside the block, ``jax.lax.scan``, ``fori_loop`` (static bounds) and ``map`` fully
    unroll (for XLA's FLOP count only: a loop's body is counted once otherwise). ``fori_loop``
    and ``map`` call jax's scan directly, past a patched ``jax.lax.scan``, so each is patched."""
    scan, fori_loop, lax_map = jax.lax.scan, jax.lax.fori_loop, jax.lax.map

    def mapped(f, xs, *, batch_size=None):
        return scan(lambda carry, x: (carry, f(x)), None, xs, unroll=True)[1]

    jax.lax.scan = functools.partial(scan, unroll=True)
    jax.lax.fori_loop = functools.partial(fori_loop, unroll=True)
    jax.lax.map = mapped
    try:
        yield
    finally:
        jax.lax.scan, jax.lax.fori_loop, jax.lax.map = scan, fori_loop, lax_map


def step_flops(setup: VideoSetup, state, batch, key) -> tuple[float, float]:
    """(XLA's FLOPs of the step as compiled, with every scan unrolled); the UT's counted with
    ``eigh`` clipping (see the module docstring)."""
    as_compiled = xla_flops(setup.jitted.lower(state, batch, key).compile())
    step = setup.step
    if setup.model_name == "ut":
        model = dataclasses.replace(
            setup.model, project=functools.partial(ut_project, method="eigh")
        )
        lr = float(setup.program.per_run["lr"][0])
        _, step = make_group_step(setup.cfg, model, lr=lr, warmup=0, steps_per_epoch=1)
    with scans_unrolled():
        unrolled = xla_flops(jax.jit(functools.partial(step)).lower(state, batch, key).compile())
    return as_compiled, unrolled


class Matmul:
    """A jitted float32 ``n x n`` matmul (2n³ FLOPs): the machine's reference rate."""

    def __init__(self, n: int):
        ka, kb = jax.random.split(jax.random.key(1))
        self.a = jax.random.normal(ka, (n, n), jnp.float32)
        self.b = jax.random.normal(kb, (n, n), jnp.float32)
        self.compiled = jax.jit(jnp.dot).lower(self.a, self.b).compile()
        self.flops = 2.0 * n**3

    def block(self, calls: int) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready([self.compiled(self.a, self.b) for _ in range(calls)])
        return (time.perf_counter() - t0) / calls


class ProductFloor:
    """A step's FLOPs as float32 (``dtype``) products alone, in one jitted program: ``products``
    lists ``(count, m, k, n)``, ``count`` products ``[m, k] @ [k, n]`` each (one batched product
    per distinct shape, its own operands for every one of the ``count``). No implementation of the
    step's arithmetic on these cores can take less time than its products, so ``torch s / floor
    s`` bounds the ratio any of them could reach against the peer. :meth:`square` is the video
    steps'; ``benchmarks/llm.py`` gives SmolLM2's products at their own shapes."""

    def __init__(self, products: Sequence[tuple[int, int, int, int]], dtype=jnp.float32):
        groups: dict[tuple[int, int, int], int] = {}
        for count, m, k, n in products:
            if count > 0:
                groups[(m, k, n)] = groups.get((m, k, n), 0) + count
        self.products = [(count, *shape) for shape, count in groups.items()]
        self.flops = sum(2.0 * count * m * k * n for count, m, k, n in self.products)
        rng = np.random.default_rng(2)  # numpy's: no compilation per shape

        def normal(shape):
            return jnp.asarray(rng.standard_normal(shape, np.float32), dtype)

        self.operands = [
            (normal((count, m, k)), normal((count, k, n))) for count, m, k, n in self.products
        ]

        def program(operands):
            return [jnp.einsum("kij,kjn->kin", a, b) for a, b in operands]

        self.compiled = jax.jit(program).lower(self.operands).compile()

    @classmethod
    def square(cls, gflop: float, width: int) -> ProductFloor:
        """``[256, 256] @ [256, width]`` products (the shape of the video steps' products: a
        batch of 32 sequences of 8 tokens against a 256-wide layer or a ``width``-atom
        dictionary) adding up to ``gflop``."""
        per = 2.0 * 256 * 256 * width
        return cls([(max(1, round(gflop * 1e9 / per)), 256, 256, width)])

    def block(self, calls: int) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready([self.compiled(self.operands) for _ in range(calls)])
        return (time.perf_counter() - t0) / calls

    def torch_block(self, calls: int) -> float:
        """The same products by torch's matrix library (``torch.bmm`` on the same buffers, shared
        through DLPack; torch's threads), s/call: the floor of an implementation built on it."""
        operands = [(torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in self.operands]
        cuda = operands[0][0].is_cuda
        t0 = time.perf_counter()
        for _ in range(calls):
            outputs = [torch.bmm(a, b) for a, b in operands]
            if cuda:
                torch.cuda.synchronize()
            del outputs
        return (time.perf_counter() - t0) / calls


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def on_threads(threads: int, measure: Callable[[], float]) -> Callable[[], float]:
    """``measure`` with ``threads`` torch threads and every thread of the process on as many
    cores (0: the defaults)."""

    def run() -> float:
        with cpu_cores(threads), torch_threads(threads):
            return measure()

    return run


def torch_block(step, kwargs: dict, num_steps: int) -> Callable[[], float]:
    """s/step of ``num_steps`` torch steps, the clock read once the device is done (as
    :class:`JaxSteps` reads it after ``block_until_ready``)."""

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(num_steps):
            step(**kwargs)
        step.wait()
        return (time.perf_counter() - t0) / num_steps

    return run


def thread_label(threads: int) -> str:
    return f"{threads}" if threads > 0 else f"{TORCH_DEFAULT_THREADS} (default)"


@dataclasses.dataclass
class StepResult:
    checks: list  # equal-work rows
    ok: bool
    ms: dict  # (model, dynamics, impl, threads label) -> median ms/step
    flops: list  # FLOP-rate rows
    matmul_gflops: float | None
    settings: list[str]  # one line per (model, dynamics)
    bounds: list = dataclasses.field(default_factory=list)  # product-floor rows


def measure(args: argparse.Namespace, *, on_setup: Callable[[VideoSetup], None] | None = None):
    """Everything ``step`` prints, as a :class:`StepResult` (``gpu`` renders the same)."""
    base = base_config(args)
    checks, settings, alternatives, ok = [], [], {}, True
    flop_counts: dict[str, tuple[float, float]] = {}
    matmul = None
    if args.flops and "default" in args.dynamics:
        matmul = Matmul(args.matmul_size)
        alternatives[("matmul", "", f"{args.matmul_size}²", thread_label(0))] = lambda: (
            matmul.block(3)
        )
    for model_name in args.models:
        for flag in args.dynamics:
            dynamics = DYNAMICS_FLAGS[flag]
            setup = video_setup(dynamics_config(base, dynamics), model_name)
            if on_setup is not None:
                on_setup(setup)
            settings.append(f"{dynamics}: {setup.describe()}")
            print(f"\n{setup.name}, {dynamics}: checking equal work ...", flush=True)
            check = check_equal_work(setup, dynamics, args.check_steps, args.check_epsilon)
            checks += check["rows"]
            ok = ok and check["ok"]
            print(
                f"  set up {check['setup']:.2f}s; cudt's first step (tracing + compilation): "
                f"{check['first_call']:.2f}s; torch + Cooper's: {check['torch_first']:.2f}s"
            )
            batch, key = setup.batch(), jax.random.key(0)
            state = setup.state(0)
            if matmul is not None and flag == "default":
                flop_counts[setup.name] = step_flops(setup, state, batch, key)
                width = setup.cfg.dust_atoms**2 if model_name == "dust" else 256
                floor = ProductFloor.square(flop_counts[setup.name][1] / 1e9, width)
            for threads in args.torch_threads:
                label = thread_label(threads)
                if matmul is not None and flag == "default":
                    alternatives[(setup.name, dynamics, "product floor", label)] = on_threads(
                        threads, lambda f=floor: f.block(3)
                    )
                steps = JaxSteps(setup.jitted, copy_tree(state), batch, key)
                tstep, kwargs = video_peer(setup, setup.params(0))
                torch_steps = torch_block(tstep, kwargs(batch.examples), args.steps)
                if args.burn_in:  # both sides past the first steps (see --burn-in)
                    steps.block(args.burn_in)
                    torch_block(tstep, kwargs(batch.examples), args.burn_in)()
                alternatives[(setup.name, dynamics, "cudt", label)] = on_threads(
                    threads, lambda s=steps: s.block(args.steps)
                )
                alternatives[(setup.name, dynamics, "torch + Cooper", label)] = on_threads(
                    threads, torch_steps
                )
    seconds = time_alternatives(alternatives, args.repeats)
    ms = {k: 1e3 * s for k, s in seconds.items() if k[0] != "matmul"}
    flops, peak = [], None
    if matmul is not None:
        (matmul_key,) = [k for k in seconds if k[0] == "matmul"]
        peak = matmul.flops / seconds[matmul_key]
        flops.append(
            [matmul_key[2] + " matmul", xla_flops(matmul.compiled) / 1e9, matmul.flops / 1e9,
             1e3 * seconds[matmul_key], peak / 1e9, 1.0]
        )  # fmt: skip
        for name, (as_compiled, used) in flop_counts.items():
            s = seconds.get((name, "video default", "cudt", thread_label(0)))
            if s is None:  # the default threads not measured here (a child of fewer)
                continue
            flops.append(
                [name, as_compiled / 1e9, used / 1e9, 1e3 * s, used / s / 1e9, used / s / peak]
            )
    peak_gflops = None if peak is None else peak / 1e9
    return StepResult(checks, ok, ms, flops, peak_gflops, settings, floor_bounds(ms))


def floor_bounds(ms: dict) -> list[list]:
    """Rows ``model, threads, floor ms, torch ms, torch / floor, torch / cudt`` of ``ms``'s
    product-floor timings."""
    bounds = []
    for (name, dynamics, impl, threads), floor_ms in ms.items():
        if impl == "product floor":
            torch_ms = ms[(name, dynamics, "torch + Cooper", threads)]
            cudt_ms = ms[(name, dynamics, "cudt", threads)]
            bounds.append(
                [name, threads, floor_ms, torch_ms, torch_ms / floor_ms, torch_ms / cudt_ms]
            )
    return bounds


def speed_on_cores(argv: Sequence[str], threads: int) -> dict:
    """``python -m benchmarks step argv`` at ``threads`` threads in a child process on as many
    cores (:func:`benchmarks.common.measure_on_cores`): its speed medians, keyed as
    :func:`measure`'s."""
    rows = measure_on_cores("step", argv, threads)
    return {tuple(key): value for *key, value in rows}


def merge_threads(parts: dict[int, dict], order: Sequence[int]) -> dict:
    """The speed medians of every thread count in one dict, each (model, dynamics, side)'s
    thread counts in ``order``."""
    sides = list(dict.fromkeys(k[:3] for n in order for k in parts[n]))
    return {
        (*side, thread_label(n)): parts[n][(*side, thread_label(n))]
        for side in sides
        for n in order
        if (*side, thread_label(n)) in parts[n]
    }


def ratios(ms: dict) -> list[list]:
    """Rows ``model, dynamics, threads, cudt ms, torch + Cooper ms, torch / cudt``."""
    rows = []
    for (name, dynamics, impl, threads), value in ms.items():
        if impl == "cudt":
            torch_ms = ms[(name, dynamics, "torch + Cooper", threads)]
            rows.append([name, dynamics, threads, value, torch_ms, torch_ms / value])
    return rows


def full_float32() -> None:
    """On a GPU, the same float32 arithmetic on both sides: no TF32 in jax's matmuls (torch's
    default already has none)."""
    if jax.devices()[0].platform == "gpu":
        jax.config.update("jax_default_matmul_precision", "highest")
        torch.set_float32_matmul_precision("highest")


def main(argv=None) -> int:
    args = parse_args(argv)
    header("step", argv)
    full_float32()
    import cooper

    print(
        f"torch {torch.__version__} (default {TORCH_DEFAULT_THREADS} threads), cooper-optim "
        f"{cooper.__version__}",
        flush=True,
    )
    t0 = time.perf_counter()
    narrow = narrow_thread_counts(args.torch_threads)
    order, args.torch_threads = (
        args.torch_threads,
        [n for n in args.torch_threads if n not in narrow],
    )
    result = measure(args)
    if narrow:
        parts = {n: {k: v for k, v in result.ms.items() if k[3] == thread_label(n)} for n in order}
        for n in narrow:
            parts[n] = speed_on_cores(sys.argv[1:] if argv is None else argv, n)
        result.ms = merge_threads(parts, order)
        result.bounds = floor_bounds(result.ms)
    if args.json is not None:  # every thread count's medians, the children's merged in
        rows = [[*key, value] for key, value in result.ms.items()]
        args.json.write_text(json.dumps(rows))
    print("\n" + "\n".join(result.settings))
    print(
        "\nequal work: cudt vs torch + Cooper from the same parameters, λ = 0, "
        f"ε = {args.check_epsilon:g}, the same batch and noise (losses: max relative difference; "
        "λ after the step: max difference / largest λ; match: step 1 within 1e-4, later λ "
        "within 1e-2)"
    )
    print_table(
        ["model", "dynamics", "step", "layer loss rel", "λ rel", "largest λ", "match"],
        result.checks,
    )
    print(
        f"\nspeed: median ms/step over {args.repeats} interleaved repetitions of {args.steps} "
        "steps (torch / cudt > 1: cudt is faster)"
    )
    rows = ratios(result.ms)
    print_table(
        ["model", "dynamics", "threads", "cudt ms", "torch + Cooper ms", "torch / cudt"], rows
    )
    for name, dynamics, threads, _, _, ratio in rows:
        print(f"ratio {name} [{dynamics}, threads {threads}]: torch + Cooper / cudt = {ratio:.3g}")
    if result.flops:
        print(
            "\nFLOP rate of the default-dynamics step (GFLOP: XLA's count as compiled, and with "
            "every scan unrolled, used for the rate), against a jitted float32 matmul"
        )
        print_table(
            ["program", "GFLOP as compiled", "GFLOP used", "ms/call", "GFLOP/s", "/ matmul rate"],
            result.flops,
        )
        for row in result.flops[1:]:
            print(f"ratio {row[0]}: achieved FLOP/s / matmul rate = {row[5]:.3g}")
    if result.bounds:
        print(
            "\nthe bound, video default: the step's FLOPs (scans unrolled) as float32 products "
            "alone (ProductFloor), timed in the same interleaving on the same cores; torch / floor "
            "is the largest torch / cudt any implementation of this arithmetic could reach"
        )
        print_table(
            ["model", "threads", "floor ms", "torch + Cooper ms", "bound", "torch / cudt"],
            result.bounds,
        )
        for name, threads, _, _, bound, measured in result.bounds:
            print(
                f"ratio {name} [threads {threads}]: bound torch / floor = {bound:.3g}, "
                f"measured torch / cudt = {measured:.3g}"
            )
    print(f"total wall {time.perf_counter() - t0:.0f}s")
    if not result.ok:
        print("error: the PyTorch + Cooper step does not do cudt's work (see 'equal work')")
        return 1
    return 0
