"""Shared helpers of the benchmark scripts: data, the UT denoiser wiring, timing, tables.

Timing rules (the house rule for speed): alternatives are measured side by side in one process,
interleaved over several repetitions (the order rotates every repetition), and reported as
medians and ratios of medians, never as absolute claims. Work is synchronised with
``jax.block_until_ready`` (or by the host fetching metrics) before a clock is read.

LAPACK threads: the UT step's eigenvalue clipping calls LAPACK's symmetric eigensolver on a
256x256 matrix (jax's CPU kernels call SciPy's OpenBLAS). OpenBLAS splits the call over one
thread per core by default; on a machine whose cores other jobs share, the call then waits for
threads that are not running, and becomes an order of magnitude slower or more, erratically.
The scripts therefore run with ``--lapack-threads 1`` by default (:func:`lapack_threads`); pass
0 to keep the libraries' own default.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

import cudt
from cudt.data.video import load_video_data, perturb
from cudt.loop import sample_indices, train_group
from cudt.models import DUST, UT, ut_project

__all__ = [
    "VIDEO",
    "ChunkClock",
    "JaxSteps",
    "UTSetup",
    "VideoSetup",
    "add_lapack_threads_flag",
    "build_video_model",
    "burn_in",
    "command_line",
    "compile_seconds",
    "copy_tree",
    "cpu_cores",
    "environment",
    "header",
    "interleave",
    "lapack_threads",
    "make_layer_losses",
    "make_ut_setup",
    "make_video_setup",
    "max_abs_diff",
    "median",
    "model_names",
    "parse_video_args",
    "print_table",
    "run_main",
    "stack_states",
    "time_alternatives",
    "video_batch",
    "video_data",
    "video_parser",
]

# The compile-side events jax records for every new program (trace, lowering, XLA compile).
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


# --------------------------------------------------------------------------------------------------
# Data and model
# --------------------------------------------------------------------------------------------------


def video_data(seq_len: int = 8, num_videos: int = 4, num_frames: int = 32, seed: int = 0):
    """Synthetic surveillance clips as 16x16-patch sequences: (train [N, T, 256] on device, σ_x)."""
    data = load_video_data(
        "synthetic", seq_len=seq_len, num_videos=num_videos, num_frames=num_frames, seed=seed
    )
    return jnp.asarray(data.train), float(data.sigma)


def video_batch(seq_len: int, batch_size: int):
    """``(train [N, T, 256], σ_x, batch, key)``: ``video_data``, its first ``batch_size``
    sequences (the batch every timed step sees) and ``jax.random.key(0)``."""
    train_x, sigma = video_data(seq_len=seq_len)
    return train_x, sigma, train_x[:batch_size], jax.random.key(0)


def make_layer_losses(model, gamma, sigma: float):
    """``(params, clean [B, T, P], key) -> [B, L+1]``: per-sample MSE of every layer's state.

    The same function as the video task's ``layer_losses`` (``cudt/tasks/video.py``), restated
    here so the benchmarks import only the library core, not the task module.
    """

    def layer_losses(params, clean, key):
        noisy = perturb(clean, gamma, sigma, key)
        _, states = model.apply(params, noisy)  # [L+1, B, T, P]
        return jnp.mean((states - clean[None]) ** 2, axis=(2, 3)).T

    return layer_losses


@dataclasses.dataclass
class UTSetup:
    """The video experiment's wiring of a UT denoiser (as the video task, ``cudt/tasks/video.py``)."""

    model: UT
    params: Any
    init: Callable
    step: Callable  # jitted or pure, as asked
    layer_losses: Callable
    config: cudt.DescentConfig
    make_batch: Callable  # (key, step) -> [B, T, P], sampled from device-resident data


def make_ut_setup(
    train_x: jax.Array,
    sigma: float,
    *,
    layers: int = 3,
    batch_size: int = 64,
    gamma: float = 0.5,
    lr: float = 2e-3,
    dual_lr: float = 1e-2,
    epsilon: float = 0.1,
    jit: bool = False,
    donate: bool = True,
    clip: str = "matmul",
) -> UTSetup:
    """Constrained UT-``layers`` with primal Adam, projected SGD dual ascent, eigenvalue clipping
    (``clip``: ``ut_project``'s method, ``"matmul"`` its default or ``"eigh"`` the exact one)."""
    dim = train_x.shape[-1]
    model = UT(num_layers=layers, dim=dim, init_scheme="dct")
    params = model.init(jax.random.key(0), jnp.zeros((1,) + train_x.shape[1:], jnp.float32))
    layer_losses = make_layer_losses(model, jnp.float32(gamma), sigma)
    config = cudt.DescentConfig(num_layers=layers, epsilon=epsilon)
    init, step = cudt.make_train_step(
        layer_losses,
        optax.adam(lr),
        cudt.dual_ascent(dual_lr),
        config,
        project_params=functools.partial(ut_project, method=clip),
        jit=jit,
        donate=donate,
    )
    num_train = train_x.shape[0]

    def make_batch(key, step_count):
        return train_x[sample_indices(key, step_count, num_train, batch_size)]

    return UTSetup(model, params, init, step, layer_losses, config, make_batch)


# The video experiment's defaults (experiments/video_denoise.py), as the newer scripts use them:
# γ_train, primal Adam lr, dual ascent lr, ε, the UT's attention step a, DUST's atoms per axis
# (K = 400 atoms) and soft threshold. DUST is the constrained model of the paper's setting, one
# dictionary per layer.
VIDEO = dict(
    gamma=0.5, lr=1e-3, dual_lr=5e-2, epsilon=0.1, ut_a=0.25, dust_atoms=20, dust_threshold=0.01
)


def model_names(text: str) -> list[str]:
    """``"ut,dust"`` -> ``["ut", "dust"]`` (for ``--models``)."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ("ut", "dust")]
    if bad or not names:
        raise ValueError(f"--models takes a comma-separated list of ut, dust; got {text!r}")
    return names


@dataclasses.dataclass
class VideoSetup:
    """One denoiser of the video setting wired to ``cudt.make_train_step`` (see ``VIDEO``)."""

    name: str  # "UT-5", "DUST-5"
    model: Any
    params: Any
    init: Callable
    step: Callable  # jitted (donating) or pure, as asked
    layer_losses: Callable
    config: cudt.DescentConfig
    project: Callable | None  # the parameter projection after every step (UT), or None
    sigma: float  # σ_x of the data (the noise is γ·σ_x·n)


def build_video_model(
    model_name: str,
    layers: int,
    dim: int,
    *,
    linalg: str = "default",
    atoms_per_dim: int | None = None,
    ut_clip: str | None = None,
    dtype: Any = jnp.float32,
):
    """``(module, projection)`` of the video experiment's UT or DUST (see ``VIDEO``).

    ``linalg``: ``"default"`` (the library's defaults), ``"exact"`` (LAPACK: DUST's
    eigvalsh/solve, UT's eigh clipping) or ``"matmul"`` (matrix products only, see
    ``cudt.linalg``). ``ut_clip`` (``ut_project``'s method: ``"eigh"``, ``"matmul"`` or
    ``"newton_schulz"``) overrides the UT's clipping alone. ``atoms_per_dim``: DUST's atoms per
    axis (default ``VIDEO``'s, 20). ``dtype``: the models' compute dtype (``jnp.bfloat16``: every
    model product in bf16; parameters, softmax and the linear algebra stay float32).
    """
    if linalg not in ("default", "exact", "matmul"):
        raise ValueError(f"linalg must be default, exact or matmul, got {linalg!r}")
    if model_name == "ut":
        project = ut_project  # the default: matrix products only
        if linalg == "exact":
            project = functools.partial(ut_project, method="eigh")
        elif linalg == "matmul":
            project = functools.partial(ut_project, method="matmul")
        if ut_clip is not None:
            project = functools.partial(ut_project, method=ut_clip)
        model = UT(num_layers=layers, dim=dim, a=VIDEO["ut_a"], init_scheme="dct", dtype=dtype)
        return model, project
    if model_name == "dust":
        model = DUST(
            num_layers=layers,
            patch_dim=dim,
            atoms_per_dim=atoms_per_dim or VIDEO["dust_atoms"],
            per_layer_dictionary=True,
            threshold=VIDEO["dust_threshold"],
            linalg="lapack" if linalg == "exact" else "matmul",
            dtype=dtype,
        )
        return model, None
    raise ValueError(f"unknown model {model_name!r}")


def make_video_setup(
    model_name: str,
    train_x: jax.Array,
    sigma: float,
    *,
    layers: int,
    constrained: bool = True,
    jit: bool = True,
    donate: bool = True,
    linalg: str = "default",
    atoms_per_dim: int | None = None,
    ut_clip: str | None = None,
    dtype: Any = jnp.float32,
) -> VideoSetup:
    """UT-``layers`` or DUST-``layers``: per-layer MSE losses, primal Adam, SGD dual ascent.

    ``constrained=False`` is ERM through the same step (``DescentConfig(constrained=False)``);
    ``linalg``, ``atoms_per_dim``, ``ut_clip`` and ``dtype``: see :func:`build_video_model`.
    """
    model, project = build_video_model(
        model_name,
        layers,
        train_x.shape[-1],
        linalg=linalg,
        atoms_per_dim=atoms_per_dim,
        ut_clip=ut_clip,
        dtype=dtype,
    )
    params = model.init(jax.random.key(0), jnp.zeros((1,) + train_x.shape[1:], jnp.float32))
    layer_losses = make_layer_losses(model, jnp.float32(VIDEO["gamma"]), sigma)
    config = cudt.DescentConfig(
        num_layers=layers, epsilon=VIDEO["epsilon"], constrained=constrained
    )
    init, step = cudt.make_train_step(
        layer_losses,
        optax.adam(VIDEO["lr"]),
        cudt.dual_ascent(VIDEO["dual_lr"]),
        config,
        project_params=project,
        jit=jit,
        donate=donate,
    )
    name = f"{model_name.upper()}-{layers}"
    if model_name == "dust" and atoms_per_dim and atoms_per_dim != VIDEO["dust_atoms"]:
        name += f"-K{atoms_per_dim**2}"
    if jnp.dtype(dtype) != jnp.float32:
        name += f"-{jnp.dtype(dtype).name}"
    return VideoSetup(name, model, params, init, step, layer_losses, config, project, sigma)


def stack_states(init: Callable, params: Any, num_runs: int):
    """``num_runs`` fresh train states stacked on a leading axis (the layout ``train_group`` wants)."""
    return jax.jit(jax.vmap(lambda _: init(params)))(jnp.arange(num_runs))


def burn_in(setup: UTSetup, states: Any, keys: jax.Array, num_steps: int):
    """Trains the stacked ``states`` ``num_steps`` steps, then resets their step counters to 0.

    At the DCT init W̃_f = −0.9·I is inside the clip, so the default eigenvalue clipping is
    skipped (and ``eigh`` of a diagonal matrix is cheaper than of a trained one); in the video
    setting the clip is active at every step after the first few: benchmarks start after a
    burn-in so every step they time costs what a step mid-training costs. The counters go back to 0 so
    every timed ``train_group`` call starts at a chunk boundary (the optimiser's own count, in
    its state, is kept).
    """
    if num_steps > 0:
        states = train_group(
            setup.step, states, keys, setup.make_batch, num_steps, chunk_steps=num_steps
        ).states
    return states.replace(step=jnp.zeros_like(states.step))


def copy_tree(tree: Any) -> Any:
    """Fresh device buffers (inputs of donating programs are consumed)."""
    return jax.tree.map(jnp.copy, tree)


def max_abs_diff(a: Any, b: Any) -> float:
    diffs = jax.tree.map(lambda x, y: jnp.max(jnp.abs(jnp.asarray(x) - jnp.asarray(y))), a, b)
    return float(max(jax.tree.leaves(diffs)))


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def time_alternatives(alternatives: dict[Any, Callable[[], float]], repeats: int) -> dict:
    """One untimed call of each alternative (warm-up), then ``interleave``: median seconds each."""
    for measure in alternatives.values():
        measure()
    results = interleave(alternatives, repeats)
    return {name: median(ts) for name, ts in results.items()}


def interleave(
    alternatives: dict[str, Callable[[], Any]], repeats: int, *, verbose: bool = True
) -> dict[str, list[Any]]:
    """Runs every alternative once per repetition, rotating the order, and collects the results.

    Each alternative is a callable returning its own measurement (seconds, or a tuple of them);
    rotating the order keeps a slow phase of the machine from always hitting the same one.
    """
    names = list(alternatives)
    results: dict[str, list[Any]] = {name: [] for name in names}
    for rep in range(repeats):
        t0 = time.perf_counter()
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(alternatives[name]())
        if verbose:
            print(
                f"  repetition {rep + 1}/{repeats} done ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
    return results


class ChunkClock:
    """A tqdm-like ``train_group(progress=...)`` object that timestamps every chunk.

    ``train_group`` calls ``progress.update(n)`` after each chunk, once the chunk's metrics are on
    the host, so the stamps bound each chunk's full cost (device work and host bookkeeping).
    ``start()`` right before ``train_group`` (states must start at step 0, or a resumed loop's
    initial ``update`` would count as a chunk); afterwards ``first`` is the first chunk's wall
    time (tracing + compilation + the chunk) and ``steady`` the wall times of the later chunks.
    """

    def __init__(self):
        self.stamps: list[float] = []

    def start(self) -> ChunkClock:
        self.stamps = [time.perf_counter()]
        return self

    def update(self, n: int = 1) -> None:
        del n
        self.stamps.append(time.perf_counter())

    def set_postfix_str(self, *args, **kwargs) -> None:
        del args, kwargs

    @property
    def durations(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps[:-1], self.stamps[1:], strict=True)]

    @property
    def first(self) -> float:
        return self.durations[0]

    @property
    def steady(self) -> list[float]:
        return self.durations[1:]


class JaxSteps:
    """Advances a train state with a jitted step; ``block(n)`` times n steps (s/step).

    The state is replaced after every call (a donating step consumes its input); the clock is
    read after ``jax.block_until_ready`` of the state.
    """

    def __init__(self, step: Callable, state: Any, batch: Any, key: jax.Array):
        self.step, self.state, self.batch, self.key = step, state, batch, key

    def __call__(self) -> None:
        self.state, _ = self.step(self.state, self.batch, self.key)

    def block(self, num_steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(num_steps):
            self()
        jax.block_until_ready(self.state)
        return (time.perf_counter() - t0) / num_steps


@contextlib.contextmanager
def cpu_cores(num_cores: int) -> Iterator[None]:
    """Every thread of this process (jax's, torch's, OpenBLAS's) on its first ``num_cores``
    allowed cores inside the block; 0 (or at least all of them) changes nothing.

    The way to give jax the same thread count as torch within one process: XLA's CPU thread
    pool is sized once, at start, but threads confined to n cores run at most n at a time.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if num_cores <= 0 or num_cores >= len(allowed):
        yield
        return

    def pin(cores) -> None:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread may end meanwhile
                os.sched_setaffinity(int(tid), cores)

    pin(allowed[:num_cores])
    try:
        yield
    finally:
        pin(allowed)


@contextlib.contextmanager
def lapack_threads(num_threads: int) -> Iterator[str]:
    """Limits the OpenBLAS threads behind jax's CPU LAPACK kernels inside the block.

    ``num_threads`` 0 leaves the libraries as they are. Yields one line for the script's
    header saying what is in effect. Needs ``threadpoolctl`` (installed with scikit-learn);
    without it nothing is changed and the line says so.
    """
    # jax's CPU LAPACK kernels call SciPy's LAPACK (loaded on first use): load it now, so the
    # limit below finds it.
    import scipy.linalg.cython_lapack  # noqa: F401

    try:
        import threadpoolctl
    except ImportError:
        yield "LAPACK threads: library default (threadpoolctl is not installed)"
        return

    def describe() -> str:
        found = [
            f"{info['internal_api']} {info['version']}: {info['num_threads']}"
            for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas"
        ]
        return ", ".join(found) or "no BLAS library found"

    if num_threads <= 0:
        yield f"LAPACK threads: library default ({describe()})"
        return
    with threadpoolctl.threadpool_limits(limits=num_threads, user_api="blas"):
        yield f"LAPACK threads: {num_threads} (--lapack-threads; {describe()})"


def add_lapack_threads_flag(parser) -> None:
    parser.add_argument(
        "--lapack-threads",
        type=int,
        default=1,
        help="OpenBLAS threads for jax's LAPACK calls (the exact options' eigh, eigvalsh, solve); "
        "0 keeps the library default, one per core (default 1, see benchmarks/README.md)",
    )


def video_parser(doc: str, *, steps: int, repeats: int, quick_help: str) -> argparse.ArgumentParser:
    """The flags of the scripts in the video setting; each script adds its own.

    ``--models``, ``--layers`` (5), ``--batch-size`` (32), ``--seq-len`` (8), ``--steps`` and
    ``--repeats`` (defaults as given), ``--quick`` (``quick_help`` names its sizes) and
    ``--lapack-threads``. Parse with :func:`parse_video_args`.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=model_names, default=["ut", "dust"], help="default ut,dust")
    p.add_argument("--layers", type=int, default=5, help="unrolled layers L (default 5)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per batch (default 32)")
    p.add_argument("--seq-len", type=int, default=8, help="frames per sequence T (default 8)")
    p.add_argument(
        "--steps", type=int, default=steps, help=f"steps per timed block (default {steps})"
    )
    p.add_argument(
        "--repeats", type=int, default=repeats, help=f"interleaved repetitions (default {repeats})"
    )
    p.add_argument("--quick", action="store_true", help=f"tiny sizes for the tests ({quick_help})")
    add_lapack_threads_flag(p)
    return p


def parse_video_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, quick: dict[str, Any]
) -> argparse.Namespace:
    """``parser.parse_args(argv)``; with ``--quick``, the attributes in ``quick`` replace the
    parsed values (also ones given on the command line)."""
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args


def run_main(
    module: str,
    argv: Sequence[str] | None,
    parse_args: Callable[[Sequence[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace, str], None],
) -> None:
    """A script's ``main``: parses ``argv``, prints the :func:`header`, then calls
    ``run(args, lapack)`` inside ``lapack_threads(args.lapack_threads)`` (``lapack``: its line)."""
    args = parse_args(argv)
    header(module, argv)
    with lapack_threads(args.lapack_threads) as lapack:
        run(args, lapack)


@contextlib.contextmanager
def compile_seconds() -> Iterator[list[float]]:
    """Sums jax's trace + lowering + XLA compile durations inside the block into ``total[0]``."""
    total = [0.0]

    def listener(event: str, duration: float, **kwargs) -> None:
        if event in _COMPILE_EVENTS:
            total[0] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield total
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def choice_list(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of ``choices`` (in the order given), or one
    line naming the unknown ones and the choices."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none given)'}: choose from "
                f"{','.join(choices)}"
            )
        return names

    return parse


def environment() -> str:
    """One line naming what the numbers were measured on (jax runs on its default device)."""
    import jaxlib

    device = jax.devices()[0]  # the default device: a GPU if jax has one, else the CPU
    return (
        f"jax {jax.__version__} (jaxlib {jaxlib.__version__}), default device "
        f"{device.platform}:{device.device_kind} (x{jax.device_count()}), "
        f"python {platform.python_version()}, {os.cpu_count()} CPU cores"
    )


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that runs ``module`` with ``argv`` (``sys.argv[1:]`` when None)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    exe = sys.executable
    rel = os.path.relpath(exe)
    if not rel.startswith(".."):
        exe = rel
    return shlex.join([exe, "-m", module, *argv])


def header(module: str, argv: Sequence[str] | None) -> None:
    """Prints the exact command line and the environment, the first lines of every output."""
    print(f"command: {command_line(module, argv)}")
    print(f"environment: {environment()}", flush=True)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table; floats are shown with 4 significant digits."""

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
