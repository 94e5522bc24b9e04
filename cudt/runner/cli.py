"""Command-line flags from a frozen config dataclass: one flag per field, ``--field-name``.

Field types understood: int, float, str, bool (``--flag`` / ``--no-flag``), ``X | None``, and
tuples of int/float/str (comma-separated: ``--models dust,ut``). Help text comes from
``dataclasses.field(metadata={"help": ...})``. Errors exit with status 2 and one line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn, TypeVar

from cudt.errors import CudtError
from cudt.knobs import TUNED_BY
from cudt.runner.run import run
from cudt.runner.sweep import distinct_values

__all__ = [
    "OneLineParser",
    "command_line_words",
    "config_from_args",
    "config_main",
    "given_on_command_line",
    "run_cli",
    "without_flag",
]

C = TypeVar("C")


_KINDS = {int: ("an integer", "a whole number"), float: ("a number", "a number such as 0.01")}


def shown_default(action: argparse.Action) -> str | None:
    """How ``--help`` writes a flag's default: ``action.shown_default`` where set (a default the
    value does not say: ``--lr``'s None is the task's rate), a ``--flag/--no-flag``'s spelling,
    a list comma-separated ("none" when empty), else the value; None where there is none to
    show (None, a flag that only switches something on)."""
    given = getattr(action, "shown_default", None)
    default = action.default
    if given is not None or default is None or default is argparse.SUPPRESS:
        return given
    if isinstance(action, argparse.BooleanOptionalAction):
        return action.option_strings[0 if default else 1]
    if action.nargs == 0:  # store_true, store_false: the default is not giving it
        return None
    if isinstance(default, tuple | list):
        return ",".join(map(str, default)) or "none"
    return str(default)


class _ShowsDefaults(argparse.HelpFormatter):
    """Every flag's help ends in its default, ``(default: 256)``, unless its words say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = shown_default(action)
        if shown is None or _states_default(text, action.default):
            return text
        return f"{text} (default: {shown.replace('%', '%%')})"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one line, ``error: <message>``, status 2,
    and whose ``--help`` gives every flag's default (:func:`shown_default`), whatever its
    ``formatter_class`` (which still lays out the description)."""

    def _get_formatter(self):
        cls = self.formatter_class
        if not issubclass(cls, _ShowsDefaults):
            cls = type(f"ShowsDefaults{cls.__name__}", (_ShowsDefaults, cls), {})
        return cls(prog=self.prog)

    def error(self, message: str):
        missing = re.match(r"argument (--[\w-]+): expected one argument$", message)
        if missing:
            flag = missing.group(1)
            message += f": pass a value, e.g. {flag} VALUE (a negative one as {flag}=-1e-3)"
        self.exit(2, f"error: {message} (see --help)\n")


def _unwrap_optional(tp):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _parser_for(tp, name: str, lanes: bool = False) -> Callable[[str], Any]:
    """``lanes``: a tuple whose values are lanes (``--tune-epsilon``), refused with an empty
    value or a repeat as ``--sweep`` is (:func:`cudt.runner.sweep.distinct_values`)."""
    tp, optional = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if origin is tuple:
        (elem, *_rest) = typing.get_args(tp)
        elem_parse = _parser_for(elem, name)

        def parse_tuple(text: str):
            items = [t.strip() for t in text.split(",")]
            if not any(items):
                raise argparse.ArgumentTypeError("needs at least one comma-separated value")
            if not lanes:
                if not all(items):  # '0.5,,1' or '0.5,': a value lost without a word
                    raise argparse.ArgumentTypeError(
                        f"{text} has an empty value: drop the extra comma or give its value"
                    )
                return tuple(elem_parse(t) for t in items)
            try:
                return distinct_values(",".join(items), items, elem_parse)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        return parse_tuple
    if origin is typing.Literal:
        choices = typing.get_args(tp)

        def parse_choice(text: str):
            if text not in choices:
                raise argparse.ArgumentTypeError(
                    f"invalid value {text!r}: choose from {', '.join(map(str, choices))}"
                )
            return text

        return parse_choice

    def parse_scalar(text: str):
        if optional and text.lower() == "none":
            return None
        try:
            return tp(text)
        except ValueError:
            what, fix = _KINDS.get(tp, (f"a {tp.__name__}", f"a {tp.__name__}"))
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}: pass {fix}") from None

    return parse_scalar


def build_parser(
    config_cls: type,
    description: str,
    prog: str | None = None,
    *,
    defaults: bool = True,
    add_help: bool = True,
    shown: Collection[str] | None = None,
):
    """The command line of ``config_cls``: a flag per field. ``defaults=False``: a flag left out
    is left out of the namespace too (which flags the command line names). ``shown``: the
    fields ``--help`` lists (a job that reads only some); the others still parse, so that the
    job refuses them in its own words."""
    parser = OneLineParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=add_help,
    )
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name]
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        given = default if defaults else argparse.SUPPRESS
        if tp is bool or tp == (bool | None):  # None: a default that depends on other flags
            action = parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=given
            )
        elif f.metadata.get("repeat"):
            action = parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                type=str,
                default=None if defaults else argparse.SUPPRESS,
                metavar=f.name.upper(),
            )
            help_text += " (repeatable" + (f"; default: {' '.join(default)})" if default else ")")
        else:
            action = parser.add_argument(
                flag,
                dest=f.name,
                type=_parser_for(tp, f.name.replace("_", "-"), lanes=f.name in TUNED_BY.values()),
                default=given,
                metavar=f.name.upper(),
            )
        action.help = help_text if shown is None or f.name in shown else argparse.SUPPRESS
        # a default the value does not say (None: the task's rate), in words (shown_default)
        action.shown_default = f.metadata.get("default_text")
    return parser


def config_from_args(
    config_cls: type[C],
    argv: Sequence[str] | None,
    description: str,
    prog: str | None = None,
    shown: Collection[str] | None = None,
) -> tuple[C, argparse.Namespace]:
    from cudt.runner.config import unmet_needs

    parser = build_parser(config_cls, description, prog, shown=shown)
    ns = parser.parse_args(argv)
    for f in dataclasses.fields(config_cls):
        if f.metadata.get("repeat"):
            given = getattr(ns, f.name)
            setattr(ns, f.name, tuple(given) if given else f.default)
    try:
        cfg = config_cls(**vars(ns))
        given = given_on_command_line(config_cls, argv)
        # a flag named where it acts on nothing is refused whatever its value (the config
        # refused values other than its default alone: --dual-lr 0.05 under the penalty)
        idle = unmet_needs(cfg, given)
        if idle:
            raise ValueError(idle)
        cfg = _pin_given(cfg, given)
    except (ValueError, TypeError) as e:
        parser.exit(2, f"error: {e}\n")
    return cfg, ns


def given_on_command_line(config_cls, argv, *, quiet: bool = False) -> set[str]:
    """The fields the command line names, whatever their values. ``quiet``: read before the
    values are checked (a job refusing a flag it does not use before its value): no value is
    parsed, and a command line argparse cannot read (``--help`` too) names none, printing
    nothing: the parser's own answer follows."""
    if not quiet:
        return set(vars(build_parser(config_cls, "", defaults=False).parse_args(argv)))
    return set(command_line_words(config_cls, argv))


def command_line_words(config_cls, argv) -> dict[str, typing.Any]:
    """The fields the command line names, each with its words as written (a string, or a
    list of them for a flag that takes several), read as :func:`given_on_command_line`'s
    ``quiet`` reads them: nothing parsed or checked, and an unreadable command line names
    none (a job deciding what to pass before the run's own parser answers)."""
    parser = build_parser(config_cls, "", defaults=False, add_help=False)
    for action in parser._actions:
        action.type = action.choices = None

    def unreadable(message: str):
        raise argparse.ArgumentError(None, message)

    parser.error = unreadable  # type: ignore[method-assign]
    try:
        return vars(parser.parse_args(argv))
    except argparse.ArgumentError:
        return {}


def _pin_given(cfg, given: set[str]):
    """A per-run hyperparameter the command line sets is the user's, even at the task's default
    value (the runner sees values: ``--dual-lr 0.03`` equal to the video task's default would
    otherwise be tuned over 0.03 and 0.1): its tuned grid is emptied and the models' own
    values of it (``--model-hparams``) dropped, as for any other value. A ``--sweep`` of it
    is left to the sweep's own check."""
    from cudt.runner.config import RunConfig, field_defaults
    from cudt.runner.sweep import parse_sweeps

    if not isinstance(cfg, RunConfig):  # a job's own options (a study's), not a run's
        return cfg
    defaults = field_defaults(cfg)
    swept = parse_sweeps(cfg)
    pinned = [
        n
        for n in TUNED_BY
        if n in given and n not in swept and n in defaults and getattr(cfg, n) == defaults[n]
    ]
    if not pinned:
        return cfg
    changes: dict[str, Any] = {TUNED_BY[n]: () for n in pinned if getattr(cfg, TUNED_BY[n], ())}
    if getattr(cfg, "model_hparams", ()):
        changes["model_hparams"] = tuple(
            item
            for item in (_drop_names(item, pinned) for item in cfg.model_hparams)
            if item is not None
        )
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _drop_names(item: str, names: Sequence[str]) -> str | None:
    """``"ut:epsilon=0.05,dual_lr=100"`` without the ``names`` (None when none is left)."""
    model, _, rest = item.partition(":")
    kept = [
        p
        for p in rest.split(",")
        if p.strip() and p.split("=")[0].strip().replace("-", "_") not in names
    ]
    return f"{model}:{','.join(kept)}" if kept else None


def run_cli(main: Callable[[], Any]) -> int:
    """Runs ``main``; a :class:`cudt.errors.CudtError` (bad input) prints one line, exits 2; a
    reader of stdout that left (``| head``) ends it quietly, 141 as on SIGPIPE."""
    try:
        main()
    except CudtError as e:
        print(f"error: {e.cli or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # kept, with the frames its traceback holds: freed as the handler ends, they freed
        # what XLA, still compiling on its own threads, was using (a segfault, 139, in 5 of
        # 12 Ctrl-C's during a compilation); exit_process then ends the process at once
        _INTERRUPTS.append(e)
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (``| head``): quiet, as a Unix tool ends on SIGPIPE; stdout
        # pointed at /dev/null, so that the interpreter's last flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


_INTERRUPTS: list[BaseException] = []  # run_cli's interrupts, never freed (see there)


def exit_process(status: int) -> NoReturn:
    """Ends an entry point's process with ``status`` (``sys.exit(main())``'s place). After an
    interrupt (130) it ends at once, its output flushed: the interrupt can leave jax compiling
    on XLA's own threads, and the interpreter's shutdown frees the runtime under them (a
    segfault, exit 139, seen on Ctrl-C during a program's first step). Everything the run
    keeps (checkpoints, the lock's release, its curves) was settled as the interrupt unwound."""
    if status == 130:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    sys.exit(status)


def without_flag(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--flag VALUE`` or ``--flag=VALUE``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(f"{flag}="):
            out.append(a)
    return out


def _states_default(help_text: str, default) -> bool:
    """Whether a flag's help already says its default: as "default: ..." or "(default ...)", or
    in its words where the value (None, an empty tuple) would say less (e.g. "empty (the shared
    default): --epsilon"); a value such as a task's (0.05,) is shown whatever the words."""
    if "default:" in help_text or "(default" in help_text:
        return True
    return "default" in help_text and (default is None or default == ())


def configure_process() -> None:
    """Process-wide settings an entry point applies (never ``import cudt``):

    * one OpenBLAS thread, unless the user exported ``OPENBLAS_NUM_THREADS``: jaxlib's CPU
      LAPACK kernels run on SciPy's OpenBLAS, which by default spins a thread per core; next to
      XLA's threads on a small or shared machine those threads wait for cores and a small
      eigh becomes orders of magnitude slower and erratic. Only the exact options call LAPACK
      per step: ``ut_project(method="eigh")`` and ``DUST(linalg="lapack")``; the defaults of
      both models are matmul only and run the same with or without this setting
      (docs/speed.md);
    * matplotlib's non-interactive Agg backend (plots are written to files);
    * the filters that keep orbax's own reports of a failed checkpoint write off stderr (the
      failure is reported once, as one line, by :class:`cudt.checkpoint.GroupCheckpointer`).
    """
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import matplotlib

    matplotlib.use("Agg")
    from cudt.checkpoint import install_log_filters

    install_log_filters()


def task_main(task, argv: Sequence[str] | None, description: str, prog: str) -> int:
    """The whole entry point of an experiment: flags → config → :func:`cudt.runner.run`."""
    from cudt.runner.config import RunConfig

    configure_process()
    cls = task.config_cls
    if not (isinstance(cls, type) and issubclass(cls, RunConfig)):  # its flags come from it
        print(
            f"error: {type(task).__name__}.config_cls is {cls!r}, not a subclass of "
            "cudt.runner.RunConfig: set config_cls to the task's config class (docs/design.md)",
            file=sys.stderr,
        )
        return 2
    cfg, _ = config_from_args(cls, argv, description, prog)

    return run_cli(lambda: run(task, cfg))


def config_main(
    config_cls: type[C],
    job: Callable[[C], Any],
    argv: Sequence[str] | None,
    doc: str,
    prog: str,
    *,
    refuse: Callable[[list[str]], Any] | None = None,
    shown: Collection[str] | None = None,
) -> int:
    """The whole entry point of a job on ``config_cls``'s flags (described by the first
    paragraph of ``doc``): ``refuse(argv)`` first, where given (a flag the job would not act on,
    refused before its value is read), then the flags → ``job(cfg)``; a bad flag or input is one
    line, status 2; ``--help``, status 0, listing the fields ``shown`` (default: all)."""
    configure_process()
    argv = list(sys.argv[1:] if argv is None else argv)
    if refuse is not None:
        status = run_cli(lambda: refuse(argv))
        if status:
            return status
    try:
        cfg, _ = config_from_args(config_cls, argv, doc.split("\n\n")[0], prog, shown)
    except SystemExit as e:  # --help, or a bad flag (already reported in one line)
        return 0 if e.code is None else int(e.code)
    return run_cli(lambda: job(cfg))
