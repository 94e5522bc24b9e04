"""What every subcommand shares: the header, timing, tables.

Timing rules (the house rule for speed): alternatives are measured side by side in one process,
interleaved over several repetitions (the order rotates every repetition), and reported as
medians and ratios of medians, never as absolute claims. Work is synchronised with
``jax.block_until_ready`` (or by the host fetching metrics) before a clock is read. Fewer
threads than the machine's cores: that process is a child started on as many cores
(:func:`on_cores`), where XLA sizes its thread pool for them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "ChunkClock",
    "JaxSteps",
    "choice_list",
    "copy_tree",
    "cpu_cores",
    "environment",
    "header",
    "int_list",
    "interleave",
    "max_abs_diff",
    "measure_on_cores",
    "median",
    "narrow_thread_counts",
    "on_cores",
    "print_table",
    "time_alternatives",
]


# --------------------------------------------------------------------------------------------------
# The header
# --------------------------------------------------------------------------------------------------


def environment() -> str:
    """One line naming what the numbers were measured on (jax runs on its default device)."""
    import jaxlib

    device = jax.devices()[0]  # the default device: a GPU if jax has one, else the CPU
    return (
        f"jax {jax.__version__} (jaxlib {jaxlib.__version__}), default device "
        f"{device.platform}:{device.device_kind} (x{jax.device_count()}), "
        f"python {platform.python_version()}, {os.cpu_count()} CPU cores"
    )


def command_line(subcommand: str, argv: Sequence[str] | None) -> str:
    """The command that runs ``python -m benchmarks <subcommand>`` with ``argv``."""
    argv = sys.argv[2:] if argv is None else list(argv)
    exe = sys.executable
    rel = os.path.relpath(exe)
    if not rel.startswith(".."):
        exe = rel
    return shlex.join([exe, "-m", "benchmarks", subcommand, *argv])


def header(subcommand: str, argv: Sequence[str] | None) -> None:
    """Prints the exact command line and the environment, the first lines of every output."""
    print(f"command: {command_line(subcommand, argv)}")
    print(f"environment: {environment()}", flush=True)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def interleave(
    alternatives: dict[Any, Callable[[], Any]], repeats: int, *, verbose: bool = True
) -> dict[Any, list[Any]]:
    """Runs every alternative once per repetition, rotating the order, and collects the results.

    Each alternative is a callable returning its own measurement (seconds, or a tuple of them);
    rotating the order keeps a slow phase of the machine from always hitting the same one.
    """
    names = list(alternatives)
    results: dict[Any, list[Any]] = {name: [] for name in names}
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


def time_alternatives(alternatives: dict[Any, Callable[[], float]], repeats: int) -> dict:
    """One untimed call of each alternative (warm-up), then ``interleave``: median seconds each."""
    for measure in alternatives.values():
        measure()
    results = interleave(alternatives, repeats)
    return {name: median(ts) for name, ts in results.items()}


class JaxSteps:
    """Advances a train state with a jitted step; ``block(n)`` times n steps (s/step).

    The state is replaced after every call (a donating step consumes its input); the clock is
    read after ``jax.block_until_ready`` of the state.
    """

    def __init__(self, step: Callable, state: Any, batch: Any, key: jax.Array):
        self.step, self.state, self.batch, self.key = step, state, batch, key

    def __call__(self) -> Any:
        self.state, metrics = self.step(self.state, self.batch, self.key)
        return metrics

    def block(self, num_steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(num_steps):
            self()
        jax.block_until_ready(self.state)
        return (time.perf_counter() - t0) / num_steps


class ChunkClock:
    """A tqdm-like ``train_group(progress=...)`` object that timestamps every chunk.

    ``train_group`` calls ``progress.update(n)`` after each chunk, once the chunk's metrics are on
    the host, so the stamps bound each chunk's full cost (device work and host bookkeeping).
    ``start()`` right before ``train_group``; afterwards ``first`` is the first chunk's wall time
    (tracing + compilation + the chunk) and ``steady`` the wall times of the later chunks.
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


def on_cores(num_cores: int, argv: Sequence[str]) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS...`` or ``python -c CODE`` (``argv``) in a child process confined
    to this process's first ``num_cores`` allowed cores before it imports anything (its output
    captured): the way to run jax on ``n`` threads.

    XLA sizes its CPU thread pool once, for the cores the process may use when it starts;
    :func:`cpu_cores` confines a running process's threads but not that pool, whose tasks then
    queue on fewer cores: the video UT-5 step took 17.1-18.2 ms so (a pool of 2 threads on one
    core) against 14.8-15.9 ms in a process started on one core (4 alternating runs each,
    2026-11-30, 2-core AMD EPYC), where torch, told ``torch.set_num_threads(1)``, is unaffected.
    The child sets its own affinity (no ``preexec_fn``: a fork of this multithreaded process).
    """
    allowed = sorted(os.sched_getaffinity(0))
    if not 0 < num_cores <= len(allowed):
        raise ValueError(f"num_cores must be in 1..{len(allowed)}, got {num_cores}")
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        raise ValueError(f"argv must be ['-m', MODULE, ...] or ['-c', CODE, ...], got {argv!r}")
    boot = (
        "import os, runpy, sys\n"
        f"os.sched_setaffinity(0, {set(allowed[:num_cores])!r})\n"
        f"kind, target, *rest = {list(argv)!r}\n"
        "sys.argv = [target, *rest]\n"
        "if kind == '-c':\n"
        "    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})\n"
        "else:\n"
        "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    )
    return subprocess.run([sys.executable, "-c", boot], capture_output=True, text=True, check=False)


def narrow_thread_counts(counts: Sequence[int]) -> list[int]:
    """The thread counts of ``counts`` below this process's cores: each is measured in a child
    process started on as many cores (:func:`measure_on_cores`)."""
    return [n for n in counts if 0 < n < len(os.sched_getaffinity(0))]


def measure_on_cores(subcommand: str, argv: Sequence[str], threads: int) -> Any:
    """``python -m benchmarks SUBCOMMAND argv --torch-threads threads --json FILE`` in a child
    process started on ``threads`` cores (:func:`on_cores`): what the child wrote to FILE.

    A subcommand that times fewer threads than the machine's cores calls this for them and
    merges what comes back with its own figures; the child, on exactly that many cores, measures
    them itself. Raises ``RuntimeError`` with the end of the child's output when it fails.
    """
    from cudt.runner.cli import without_flag

    # the caller's own --json (its file, written by the caller: the child's type check refuses
    # a path that exists) and --torch-threads give way to the child's
    argv = without_flag(without_flag(argv, "--json"), "--torch-threads")
    with tempfile.TemporaryDirectory(prefix="cudt_bench_") as tmp:
        path = Path(tmp) / f"threads-{threads}.json"
        full = [*argv, "--torch-threads", str(threads), "--json", str(path)]
        print(
            f"\n{threads} thread(s): a child process started on {threads} core(s) ...", flush=True
        )
        child = on_cores(threads, ["-m", "benchmarks", subcommand, *full])
        if child.returncode != 0 or not path.is_file():
            tail = "\n".join((child.stdout + child.stderr).splitlines()[-15:])
            raise RuntimeError(f"the child measuring {threads} thread(s) failed:\n{tail}")
        return json.loads(path.read_text())


def copy_tree(tree: Any) -> Any:
    """Fresh device buffers (inputs of donating programs are consumed)."""
    return jax.tree.map(jnp.copy, tree)


def max_abs_diff(a: Any, b: Any) -> float:
    diffs = jax.tree.map(lambda x, y: jnp.max(jnp.abs(jnp.asarray(x) - jnp.asarray(y))), a, b)
    return float(max(jax.tree.leaves(diffs)))


# --------------------------------------------------------------------------------------------------
# Flags and output
# --------------------------------------------------------------------------------------------------


def subcommand_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A subcommand's parser: ``prog`` and its module docstring ``doc`` as the description,
    printed as written (its tables and lists keep their lines). A bad command line is one
    line, ``error: …``, and status 2, as the experiments' (:class:`cudt.runner.cli.OneLineParser`)."""
    from cudt.runner.cli import OneLineParser

    return OneLineParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 1 (sizes, steps, repetitions), checked before
    anything is measured."""
    return _at_least(text, 1)


def number_flag(
    p: argparse.ArgumentParser,
    flag: str,
    default: Any,
    help: str,
    type: Callable[[str], Any] = positive_int,
) -> None:
    """Adds ``flag`` to ``p``: a number read by ``type`` (default :func:`positive_int`), whose
    help ends with its default, ``help (default N)``: the value is stated once."""
    p.add_argument(flag, type=type, default=default, help=f"{help} (default {default})")


def non_negative_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 0."""
    return _at_least(text, 0)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text!r}")
    return value


def positive_int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, each >= 1 (an argparse ``type``)."""
    return _ints_at_least(text, 1)


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def output_file(text: str) -> Path:
    """An argparse ``type``: a file to write at the end, checked before anything is measured
    (its folder must exist; it must not be a folder), so a typo cannot lose a measurement; nor
    may it exist: a second run on the same path would replace the first one's figures (an hour
    of a lent GPU, for ``gpu``) without a word."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: pass a file path")
    if path.exists():
        raise argparse.ArgumentTypeError(
            f"{text} exists (an earlier measurement): pass another path, or move that file away"
        )
    if path.parent.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} is a file, not a folder: pass a file path")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"the folder {path.parent} does not exist: create it, or pass a path in a folder "
            "that does"
        )
    _check_writable(path.parent)
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type``: a folder written in at the end (created if missing, as
    ``--profile``'s traces), checked before anything is measured: not a file, and the nearest
    folder of it that exists is one a file can be created in (a path under a file, or in a
    read-only folder, failed at the end, after the timing)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file: pass a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(
            f"{existing} is a file, so no folder can be made under it: pass a path in a folder"
        )
    _check_writable(existing)
    return path


def _check_writable(folder: Path) -> None:
    """A file can be created in ``folder``: probed with an unnamed temporary file, which
    leaves nothing behind (a folder that exists but takes no file, such as a read-only one or
    /proc, lost the measurement at its end)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot write in the folder {folder} ({err.strerror or err}): pass a path in a "
            "folder you can write to"
        ) from None


def parse_quick(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, quick: dict[str, Any], help: str
) -> argparse.Namespace:
    """``argv`` parsed by ``p`` with one more flag, ``--quick`` (``help``): tiny sizes for the
    tests, the values of ``quick`` in place of the parsed ones."""
    p.add_argument("--quick", action="store_true", help=help)
    args = p.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args


def int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, each >= 0 (an argparse ``type``; thread counts: 0 is a
    library's default)."""
    return _ints_at_least(text, 0)


def _ints_at_least(text: str, low: int) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        values = []
    if not values or min(values) < low:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers >= {low}, got {text!r}"
        )
    return values


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
