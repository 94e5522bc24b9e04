"""Results pages written from the results.json of named commands.

A page under ``docs/results`` may hold generated blocks::

    <!-- generated:video-default (python -m experiments.pages write) -->
    ... (rewritten by ``write``) ...
    <!-- end:video-default -->

Everything outside the blocks is kept byte for byte. :data:`BLOCKS` names each block's command
(a module and its flags), the folder it reads under a runs root (``RUNS/<block>/results.json``)
and its renderer. ``run`` makes the missing results (``python -m MODULE FLAGS --out
RUNS/<block>``); ``write`` rewrites every block whose results exist, its header read from the
run's ``provenance`` record (commit, machine, date) and its table from
:func:`cudt.runner.report.summary_table`, the runner's own summary; ``write --check`` writes
nothing and exits 1 when a page differs from what ``write`` would make, 2 when a block's results
are missing (a block it cannot check does not pass).

A block of a *job* (a paper table, the dual study) names in ``Block.report`` the report the job
writes from its runner calls' results.json (``table3.md``, ``study.md``); it reads that report
and the results.json of every call the job has (those its ``job.json`` lists, not folders of an
earlier grid left in ``RUNS/<block>``): its header gives their commits, machines and dates, the
report follows with its headings one level down (:func:`render_job`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cudt.errors import UsageError
from cudt.io import atomic_write, check_creatable
from cudt.runner.cli import OneLineParser, without_flag
from cudt.runner.lock import OutputInUse, check_free

__all__ = [
    "BLOCKS",
    "Block",
    "MarkerError",
    "main",
    "parse_page",
    "render_job",
    "render_page",
    "render_run",
    "run_blocks",
    "write_pages",
]

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "results"

_OPEN = re.compile(r"<!-- generated:(?P<name>[A-Za-z0-9_.-]+)(?: \([^()]*\))? -->")
_END = re.compile(r"<!-- end:(?P<name>[A-Za-z0-9_.-]+) -->")


@dataclasses.dataclass(frozen=True)
class Block:
    """One generated block: ``python -m {module} {argv}`` writes ``RUNS/{folder}/results.json``
    (``folder`` defaults to the block's name), ``task()`` is the experiment's task (its summary
    columns), ``render(block, results)`` the block's text."""

    name: str
    module: str
    argv: tuple[str, ...]
    task: Callable[[], object]
    render: Callable[[Block, dict], str] | None = None
    folder: str | None = None
    report: str | None = None  # a job's report file (its sub-runs' results.json beside it)

    @property
    def command(self) -> str:
        return shlex.join(["python", "-m", self.module, *self.argv])

    def results_path(self, runs: Path) -> Path:
        """The file whose presence means the command has run: results.json, or a job's report."""
        return Path(runs) / (self.folder or self.name) / (self.report or "results.json")


def _video_task():
    from cudt.tasks.video import VideoTask

    return VideoTask()


def _text_task():
    from cudt.tasks.text import TextTask

    return TextTask()


def _llm_task():
    from cudt.tasks.llm import LLMTask

    return LLMTask()


_DUAL_GRID = (
    "--formulations", "lagrangian,augmented", "--dual-optimizers", "sgd,nupi",
    "--updates", "simultaneous,alternating", "--dual-lr-factors", "0.1,1,10", "--seeds", "3",
)  # fmt: skip
# the video default's winning dynamics on the text default (one seed: text calls are long)
_DUAL_TEXT = (
    "--settings", "text", "--formulations", "lagrangian", "--dual-optimizers", "nupi",
    "--updates", "alternating", "--dual-lr-factors", "0.1,1,10", "--seeds", "1",
)  # fmt: skip

# a warm-started ε against the constant one (issue 51), on the video default's part of the grid
_DUAL_SCHEDULE = (
    "--settings", "video", "--formulations", "lagrangian", "--dual-optimizers", "sgd,nupi",
    "--updates", "alternating", "--dual-lr-factors", "0.1,1,10", "--seeds", "3",
    "--epsilon-schedules", "constant,linear:0@200",
)  # fmt: skip


def _job(name: str, module: str, argv: tuple[str, ...], report: str) -> Block:
    return Block(name, module, argv, lambda: None, report=report)  # rendered by render_job


BLOCKS: dict[str, Block] = {
    b.name: b
    for b in (
        # docs/results/video.md: the default run
        Block("video-default", "experiments.video_denoise", (), _video_task),
        # docs/results/text.md: the MiniLM default run
        Block("text-default", "experiments.text_classify", (), _text_task),
        # docs/results/llm.md: the default run (a tiny decoder from scratch)
        Block("llm-default", "experiments.llm_sft", (), _llm_task),
        # docs/results/llm.md: Section 6 at 2 epochs, a draw per seed (on a GPU: 158 s on an H200)
        Block(
            "llm-section6-2epochs",
            "experiments.llm_section6",
            ("--steps", "1000", "--chunk-steps", "500"),
            _llm_task,
        ),
        # docs/results/tables.md: the paper's tables at --scale tiny
        _job("table3-tiny", "experiments.video_table", ("--scale", "tiny"), "table3.md"),
        _job("table4-tiny", "experiments.text_table", ("--scale", "tiny"), "table4.md"),
        # docs/results/dual_study.md: the video default's and the published UT's settings
        _job(
            "dual-video", "experiments.dual_study", ("--settings", "video", *_DUAL_GRID), "study.md"
        ),
        _job("dual-ut", "experiments.dual_study", ("--settings", "ut", *_DUAL_GRID), "study.md"),
        _job("dual-text", "experiments.dual_study", _DUAL_TEXT, "study.md"),
        _job("dual-schedule", "experiments.dual_study", _DUAL_SCHEDULE, "study.md"),
    )
}


class MarkerError(ValueError):
    """A malformed marker: ``str(e)`` names the page and line."""


# -- rendering --------------------------------------------------------------------------------


def _flags_of(argv: Sequence[str]) -> list[str]:
    """A recorded command line's flags without ``--out DIR`` (where it wrote changes nothing)
    and ``--no-figures`` (the same results.json, and a page shows no figure)."""
    return [a for a in without_flag(list(argv)[1:], "--out") if a not in NO_RESULT_FLAGS]


#: the runner's flags that leave results.json as it is (cudt.runner.config: ``figures``)
NO_RESULT_FLAGS = ("--figures", "--no-figures")


def _utc(text: str) -> str:
    t = datetime.datetime.fromisoformat(text).astimezone(datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M UTC")


def _started(text: str | None) -> str:
    return "started " + _utc(text) if text else "date not recorded"


def header_line(block: Block, results: dict) -> str:
    """The command, commit, machine, date and wall time of a run, read from its results.json;
    ``provenance not recorded`` where it has none (nothing is guessed)."""
    wall = results.get("wall_seconds")
    wall_text = f"{wall:.0f} s wall" if isinstance(wall, int | float) else "wall time not recorded"
    head = f"`{block.command}`"
    p = results.get("provenance")
    if not p:
        return f"{head}; provenance not recorded (commit, machine and date unknown); {wall_text}:"
    return f"{head} at {_code(p)}; {_machine(p)}; {_started(p.get('started_utc'))}; {wall_text}:"


def _code(p: dict) -> str:
    commit = p.get("commit")
    if commit is None:
        return "commit unknown (not a git checkout)"
    return f"commit {commit[:7]}" + (" + uncommitted changes" if p.get("dirty") else "")


def _machine(p: dict) -> str:
    cpu = p.get("cpu") or "CPU unknown"
    cores = p.get("cores")
    machine = cpu + (f", {cores} cores" if cores else "")
    backend = p.get("backend")
    if backend == "cpu":
        machine += ", CPU backend"
    elif backend:
        kinds = ", ".join(p.get("device_kinds") or [])
        count = p.get("device_count")
        machine += f", {backend} backend ({kinds}" + (f" × {count})" if count else ")")
    return machine


_WALL = re.compile(r"^Wall time of the job that wrote this: (?P<s>[0-9.]+) s\b.*$")
_FIGURE = re.compile(r"^!\[[^\]]*\]\((?P<file>[^()]+)\)$")


def _joined(values: Sequence[str]) -> str:
    return " and ".join(dict.fromkeys(values))  # in order, each once


def render_job(block: Block, results: dict) -> str:
    """A job's block: one header line (the command; the commits, machines and start dates of
    its sub-runs, read from their results.json; the job's wall time, from its report), then the
    report as the job wrote it, its title dropped, its headings one level down, its figures
    named (they are written beside the report, not kept in the repository)."""
    records = [r.get("provenance") for r in results["subruns"]]
    head = f"`{block.command}`"
    n = len(records)
    if not all(records):
        missing = sum(1 for r in records if not r)
        where = f"provenance not recorded for {missing} of its {n} runner calls"
    else:
        starts = sorted(r.get("started_utc") or "" for r in records)
        dates = _started(starts[0])
        if n > 1 and starts[-1]:
            dates += f" (last call {_utc(starts[-1])})"
        where = (
            f"{n} runner calls at {_joined([_code(r) for r in records])}; "
            f"{_joined([_machine(r) for r in records])}; {dates}"
        )
    body, figures, wall = [], [], None
    lines = results["markdown"].splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    for line in lines:
        if m := _WALL.match(line):
            wall = float(m.group("s"))
        elif m := _FIGURE.match(line.strip()):
            figures.append(m.group("file"))
        elif line.startswith("#"):
            body.append("#" + line)
        else:
            body.append(line)
    while body and body[-1].strip() in ("", "### Figures"):  # the figures' heading, now empty
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    wall_text = f"{wall:.0f} s wall" if wall is not None else "wall time not recorded"
    text = f"{head}: {where}; {wall_text}. Its report, verbatim:\n\n" + "\n".join(body) + "\n"
    if figures:
        text += (
            f"\nThe command also writes {', '.join(f'`{f}`' for f in figures)} beside the "
            "report (generated files, not kept in the repository).\n"
        )
    return text


def render_run(block: Block, results: dict) -> str:
    """The header line, then the runner's summary (table, notes, interval lines, footer) in a
    code block: the text :func:`cudt.runner.run.run` prints, re-rendered from results.json."""
    from cudt.runner.hparams import SWEEPABLE
    from cudt.runner.report import summary_table

    config = results.get("config", {})
    varied = set(config.get("sweeps") or {}) | set(config.get("swept") or [])
    swept = [n for n in SWEEPABLE if n in varied]
    table = summary_table(
        block.task(),
        results["runs"],
        swept,
        results.get("intervals", []),
        results.get("chosen_points", []),
        results.get("chosen_comparison", []),
    )
    return f"{header_line(block, results)}\n\n```\n{table}\n```\n"


def _argv_mismatch(block: Block, argv) -> str | None:
    script = block.module.rsplit(".", 1)[-1] + ".py"
    if argv and Path(argv[0]).name != script:
        return f"was made by {argv[0]}, not by python -m {block.module}"
    if argv and _flags_of(argv) != list(block.argv):
        return f"was made with flags {shlex.join(_flags_of(argv)) or '(none)'}, not the block's"
    return None


def _mismatch(block: Block, results: dict) -> str | None:
    """Why ``results`` are not the block command's output, or None."""
    if block.report is not None:
        if not results["subruns"]:
            return "has no runner call's results.json beside it"
        for r in results["subruns"]:
            why = _argv_mismatch(block, (r.get("provenance") or {}).get("argv"))
            if why:
                return f"holds a runner call that {why}"
        return None
    task = block.task()
    if results.get("experiment") != getattr(task, "name", None):
        return f"holds experiment {results.get('experiment')!r}, not {task.name!r}"
    return _argv_mismatch(block, (results.get("provenance") or {}).get("argv"))


# -- pages ------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """The lines of ``text``, each with its own ending ("\\n" splits; "\\r" stays in its line)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def parse_page(text: str, page: str, known: Sequence[str]) -> list:
    """The page as a list of pieces: ``str`` (kept as is) and ``(name, open line, body, end
    line)`` for each block. Raises :class:`MarkerError` naming ``page`` and the line."""
    pieces: list = []
    current = None  # [name, open line, body lines, line number]
    for n, line in enumerate(_lines(text), 1):
        stripped = line.strip()
        is_open, is_end = stripped.startswith("<!-- generated"), stripped.startswith("<!-- end:")
        if not (is_open or is_end):
            if current is None:
                pieces.append(line)
            else:
                current[2].append(line)
            continue
        where = f"{page}:{n}"
        m = (_OPEN if is_open else _END).fullmatch(stripped)
        if m is None:
            raise MarkerError(
                f"{where}: malformed marker {stripped!r}: write <!-- generated:NAME "
                "(python -m experiments.pages write) --> ... <!-- end:NAME -->"
            )
        name = m.group("name")
        if is_open:
            if current is not None:
                raise MarkerError(f"{where}: block {name!r} opens inside block {current[0]!r}")
            if name not in known:
                raise MarkerError(
                    f"{where}: unknown block {name!r} (known: {', '.join(known) or 'none'})"
                )
            current = [name, line, [], n]
        else:
            if current is None or current[0] != name:
                raise MarkerError(
                    f"{where}: <!-- end:{name} --> without its <!-- generated:{name} -->"
                )
            pieces.append((current[0], current[1], "".join(current[2]), line))
            current = None
    if current is not None:
        raise MarkerError(
            f"{page}:{current[3]}: block {current[0]!r} has no <!-- end:{current[0]} -->"
        )
    return pieces


def render_page(pieces: list, bodies: dict[str, str]) -> str:
    """The page text with each block's body replaced by ``bodies[name]`` where given."""
    out = []
    for p in pieces:
        if isinstance(p, str):
            out.append(p)
        else:
            name, open_line, body, end_line = p
            out += [open_line, bodies.get(name, body), end_line]
    return "".join(out)


def _job_subruns(folder: Path) -> list[Path]:
    """The results.json of the sub-runs the job in ``folder`` has: those its job.json lists
    (written as the job ends), not the folders of an earlier grid left beside them; every
    results.json under ``folder`` where it lists none (a job from before the list)."""
    from experiments.paper.job import JOB_FILE, SUBRUNS

    try:
        listed = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))[SUBRUNS]
    except (OSError, ValueError, KeyError, TypeError):
        listed = None
    if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
        return sorted(folder.rglob("results.json"))
    return sorted(folder / sub / "results.json" for sub in listed)


def _load_results(block: Block, runs: Path, say, left: str = "left unchanged") -> dict | None:
    path = block.results_path(runs)
    if not path.is_file():
        say(
            f"{block.name}: no {path}: block {left} (make it: python -m "
            f"experiments.pages run --runs {runs} --blocks {block.name})"
        )
        return None
    try:
        if block.report is None:
            results = json.loads(path.read_text())
        else:  # a job: its report, and its sub-runs' results.json
            subruns = _job_subruns(path.parent)
            results = {
                "markdown": path.read_text(encoding="utf-8"),
                "subruns": [json.loads(p.read_text()) for p in subruns],
            }
    except (OSError, ValueError) as e:
        say(f"{block.name}: cannot read {path} ({e}): block {left}")
        return None
    why = _mismatch(block, results)
    if why:  # the wrong folder (another command's results): not a block to leave quietly
        raise UsageError(
            f"{block.name}: {path} {why}: remake it with python -m experiments.pages run "
            f"--runs {runs} --blocks {block.name} (after moving it away), or pass the right --runs"
        )
    return results


def write_pages(
    pages: Path = PAGES,
    runs: Path = Path("runs/pages"),
    *,
    blocks: Sequence[str] | None = None,
    check: bool = False,
    registry: dict[str, Block] | None = None,
    say=print,
) -> int:
    """Rewrites the blocks (all, or those named in ``blocks``) of every ``pages/*.md`` whose
    results exist; ``check``: writes nothing, returns 1 when a page would change, else 2 when a
    block of a page has no readable results (it could not be checked). Returns 0, 1 (check:
    stale), or 2 (check: a block not checked; a malformed marker, a block's folder locked by a
    job still running, or holding another command's results: nothing written)."""
    registry = BLOCKS if registry is None else registry
    parsed = {}
    for path in sorted(Path(pages).glob("*.md")):
        text = path.read_bytes().decode("utf-8")  # newlines as they are
        try:
            parsed[path] = (text, parse_page(text, str(path), list(registry)))
        except MarkerError as e:
            print(f"error: {e}; nothing written", file=sys.stderr)
            return 2
    wanted = list(registry) if blocks is None else list(blocks)
    bodies: dict[str, str] = {}
    found = {p[0] for _, pieces in parsed.values() for p in pieces if not isinstance(p, str)}
    for name in wanted:
        if name in found:  # a run in progress writes there: its results are not final
            try:
                check_free(Path(runs) / (registry[name].folder or name), reader=True)
            except OutputInUse as e:
                print(f"error: {e}; nothing written", file=sys.stderr)
                return 2
    for name in wanted:
        block = registry[name]
        if name not in found:
            say(f"{name}: in no page under {pages}: nothing to write")
            continue
        try:
            results = _load_results(
                block, Path(runs), say, "not checked" if check else "left unchanged"
            )
        except UsageError as e:
            print(f"error: {e}; nothing written", file=sys.stderr)
            return 2
        if results is not None:
            default = render_job if block.report is not None else render_run
            bodies[name] = (block.render or default)(block, results)
    if check and not bodies:  # a check of nothing passed: a mistyped --runs looked up to date
        print(
            f"error: --check: no block's results under --runs {runs}, nothing to check: make "
            f"them with python -m experiments.pages run --runs {runs}, or pass the runs root "
            "that made them",
            file=sys.stderr,
        )
        return 2
    unchecked = [n for n in wanted if n in found and n not in bodies]
    stale = []
    for path, (text, pieces) in parsed.items():
        new = render_page(pieces, bodies)
        if new == text:
            continue
        if check:
            stale.append(path)
            say(f"stale: {path} is not what `python -m experiments.pages write` writes")
            continue
        data = new.encode("utf-8")
        try:  # each page whole or not at all; the pages written before it stay written
            atomic_write(path, lambda f, data=data: f.write(data), flag="--pages")
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        say(f"wrote {path}")
    if check and unchecked:  # a block without results passed as up to date: it was not read
        _say_unchecked(unchecked, [n for n in wanted if n in bodies], runs)
    return 1 if stale else 2 if check and unchecked else 0


def _say_unchecked(unchecked: Sequence[str], checked: Sequence[str], runs: Path) -> None:
    n = len(unchecked) + len(checked)
    print(
        f"error: --check: {len(unchecked)} of the {n} blocks not checked, their results missing "
        f"or unreadable under --runs {runs} ({', '.join(unchecked)}): make them with python -m "
        f"experiments.pages run --runs {runs} --blocks {','.join(unchecked)}, or check the "
        f"others alone with --blocks {','.join(checked)}",
        file=sys.stderr,
    )


def run_blocks(
    runs: Path,
    *,
    blocks: Sequence[str] | None = None,
    registry: dict[str, Block] | None = None,
    say=print,
) -> int:
    """Runs the command of every block (all, or ``blocks``) whose results.json (a job's: its
    report) is missing, as ``python -m MODULE FLAGS --out RUNS/<folder>``; returns 0, 1 if a
    command failed, or 2 (nothing run) if a block's folder cannot be created under ``runs``."""
    registry = BLOCKS if registry is None else registry
    todo = []
    for name in list(registry) if blocks is None else blocks:
        path = registry[name].results_path(Path(runs)).resolve()
        if path.is_file():
            say(f"{name}: {path} exists: not rerun (delete it to rerun)")
        else:
            todo.append((name, registry[name], path))
    try:  # up front: an unwritable root was found by each command, after it loaded its data
        for _, _, path in todo:
            check_creatable(path.parent, "--runs")
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = 0
    for name, block, path in todo:
        cmd = [sys.executable, "-m", block.module, *block.argv, "--out", str(path.parent)]
        say(f"{name}: {block.command} --out {path.parent}")
        if subprocess.run(cmd, cwd=ROOT, check=False).returncode != 0:
            say(f"{name}: the command failed: no results")
            failed = 1
    return failed


def main(argv: Sequence[str] | None = None, registry: dict[str, Block] | None = None) -> int:
    registry = BLOCKS if registry is None else registry
    parser = OneLineParser(
        prog="python -m experiments.pages",
        description="Results pages from the results.json of their commands: `run` makes the "
        "missing results, `write` rewrites the generated blocks of docs/results/*.md.",
    )
    parser.add_argument("action", choices=("run", "write"))
    parser.add_argument(
        "--runs", type=Path, required=True, help="the runs root: RUNS/<block>/results.json"
    )
    parser.add_argument(
        "--blocks", help=f"comma-separated block names (default: all of {', '.join(registry)})"
    )
    pages_flag = parser.add_argument("--pages", type=Path, default=PAGES, help="the pages folder")
    # as the other defaults are shown: not this checkout's absolute path
    pages_flag.shown_default = f"{PAGES.relative_to(ROOT).as_posix()} of this checkout"
    parser.add_argument(
        "--check",
        action="store_true",
        help="write: write nothing, exit 1 if a page is stale, 2 if a block has no results to "
        "check it against",
    )
    ns = parser.parse_args(argv)
    blocks = None
    if ns.blocks is not None:  # --blocks '' names none (it was taken as every block)
        blocks = [b.strip() for b in ns.blocks.split(",") if b.strip()]
        unknown = [b for b in blocks if b not in registry]
        if not blocks:
            parser.exit(
                2,
                f"error: --blocks names no block: name some of {', '.join(registry)}, or drop "
                "--blocks for all of them\n",
            )
        if unknown:
            parser.exit(
                2, f"error: unknown block {', '.join(unknown)} (known: {', '.join(registry)})\n"
            )
    if ns.action == "run":
        if ns.check:
            parser.exit(2, "error: --check goes with write\n")
        if ns.runs.exists() and not ns.runs.is_dir():
            parser.exit(2, f"error: --runs {ns.runs} is a file: pass a folder for the runs\n")
        return run_blocks(ns.runs, blocks=blocks, registry=registry)
    for flag, folder, fix in (
        ("--pages", ns.pages, "pass the folder of the pages"),
        ("--runs", ns.runs, "pass the runs root that pages run made"),
    ):
        if not folder.is_dir():  # a mistyped root: not every block's "no results.json"
            what = "is not a folder" if folder.exists() else "does not exist"
            parser.exit(2, f"error: {flag} {folder} {what}: {fix}\n")
    return write_pages(ns.pages, ns.runs, blocks=blocks, check=ns.check, registry=registry)
