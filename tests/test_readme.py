"""The README's set-up commands are the ones CI runs, it stays short, its layout section names
every top-level folder and file (and only paths that exist), docs/layout.md lists exactly the
files in the tree, and every relative Markdown link in README.md and docs/ points at a file."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Every tracked file under these folders must be in docs/layout.md.
_LISTED_IN_FULL = ("cudt", "experiments", "benchmarks", "docs")
_CONTINUATION_INDENT = 6  # a description continued on the next line
README_MAX_LINES = 250
# The pages state the present (issue 48): a results page at most 300 lines, speed.md 250.
PAGE_MAX_LINES = {"docs/results/*.md": 300, "docs/speed.md": 250}


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _layout_block(text: str | None = None) -> str:
    """The first code block after "## Layout" in the README (or the first code block of
    ``text``)."""
    if text is None:
        text = _readme().split("## Layout", 1)[1]
    return re.search(r"```\n(.*?)```", text, re.S).group(1)


def _docs_layout_block() -> str:
    return _layout_block((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"))


def parse_layout(block: str) -> list[str]:
    """The paths a layout block names, relative to the root ('dir/' for a directory).

    A line is names (space- or comma-separated), then two or more spaces and a description.
    Indent 0: a top-level file or 'dir/' (whose files may follow on the line); indent 2: files of
    the last top-level folder, or 'sub/' or 'sub/deeper/' (relative to it) and its files; indent
    6 or more: the description above, continued. Any other indent is an error, so no line of
    names is ever skipped."""
    paths, top, previous_is_entry = [], "", False
    for number, line in enumerate(block.splitlines(), 1):
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            previous_is_entry = False
            continue
        if indent >= _CONTINUATION_INDENT:
            assert previous_is_entry, f"layout line {number} continues nothing: {line!r}"
            continue
        assert indent in (0, 2), (
            f"layout line {number} is indented {indent} (0: top level, 2: inside it, "
            f"{_CONTINUATION_INDENT}+: a continued description): {line!r}"
        )
        assert indent == 0 or top, f"layout line {number} is inside no top-level folder: {line!r}"
        names = [n for n in re.split(r"[\s,]+", re.split(r"\s{2,}", line.strip())[0]) if n]
        base = "" if indent == 0 else top
        if names[0].endswith("/"):
            base += names[0]
            paths.append(base)
            if indent == 0:
                top = base
            names = names[1:]
        paths += [base + n for n in names]
        previous_is_entry = True
    return paths


def _ignored(relative: Path) -> bool:
    """What .gitignore leaves out (and git's own folder), for a tree that is not a checkout."""
    return any(
        part in _IGNORED or part.endswith((".egg-info", ".pyc", ".whl")) for part in relative.parts
    )


_IGNORED = {".git", ".gl", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "runs"}


def _tracked_files(*folders: str) -> list[str]:
    """The files git tracks (under ``folders``, if any); when the tree is not a git checkout,
    every file there that .gitignore does not leave out."""
    try:
        return subprocess.run(
            ["git", "ls-files", "--", *folders],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        roots = [ROOT / f for f in folders] if folders else [ROOT]
        files = (p.relative_to(ROOT) for root in roots for p in root.rglob("*") if p.is_file())
        return [f.as_posix() for f in files if not _ignored(f)]


def test_ci_runs_exactly_the_readme_test_command():
    lines = [ln.strip() for ln in _readme().splitlines()[:4] if ln.strip()]
    run_cmd, test_cmd = lines[1], lines[2]
    assert "python -m experiments.video_denoise" in run_cmd
    assert test_cmd.endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].strip() == test_cmd


def test_readme_is_short():
    lines = len(_readme().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_results_pages_are_short():
    long = {}
    for pattern, most in PAGE_MAX_LINES.items():
        pages = sorted(ROOT.glob(pattern))
        assert pages, f"no page matches {pattern}"
        for page in pages:
            lines = len(page.read_text(encoding="utf-8").splitlines())
            if lines > most:
                long[str(page.relative_to(ROOT))] = f"{lines} lines (at most {most})"
    assert not long, f"pages over their length (history lives in git): {long}"


def test_readme_layout_names_existing_paths():
    paths = parse_layout(_layout_block())
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert len(paths) >= 8 and not missing, f"listed in README's layout, not in the tree: {missing}"


def test_readme_layout_names_every_top_level_folder_and_file():
    """Each top-level entry of the tree (a file, or a folder with tracked files) is named at
    the layout's top level: ``name`` for a file, ``name/`` for a folder."""
    listed = set(parse_layout(_layout_block()))
    tops = {f.split("/", 1)[0] + ("/" if "/" in f else "") for f in _tracked_files()}
    unlisted = sorted(tops - listed)
    assert len(tops) >= 8 and not unlisted, f"in the tree, missing from README's layout: {unlisted}"


def test_docs_layout_names_existing_paths():
    paths = parse_layout(_docs_layout_block())
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert len(paths) > 50 and not missing, f"listed in docs/layout.md, not in the tree: {missing}"


def test_docs_layout_lists_every_file():
    listed = set(parse_layout(_docs_layout_block()))
    files = _tracked_files(*_LISTED_IN_FULL)
    unlisted = sorted(set(files) - listed)
    assert len(files) > 50 and not unlisted, f"in the tree, missing from docs/layout.md: {unlisted}"


def test_layout_parser_refuses_a_line_it_would_skip():
    block = "cudt/  the library\n  models/ ut.py  UT\n    models/llama/ model.py  hidden?\n"
    try:
        parse_layout(block)
    except AssertionError as e:
        assert "indented 4" in str(e)
    else:
        raise AssertionError("a line of names indented 4 was skipped")
    ok = "cudt/  the library\n  models/llama/ a.py, b.py  x\n      more x\n"
    assert parse_layout(ok) == [
        "cudt/",
        "cudt/models/llama/",
        "cudt/models/llama/a.py",
        "cudt/models/llama/b.py",
    ]


def test_relative_markdown_links_resolve():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")]
    broken, checked = [], 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            checked += 1
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert checked >= 10 and not broken, broken


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", _readme(), flags=re.S)


def test_the_readmes_self_contained_examples_run_and_print_what_it_says(capsys):
    """Every README code block that starts with its imports runs as written; a block that
    starts with ``init, step`` continues the one before it (the vmap sweep)."""
    blocks = _python_blocks()
    runnable = [i for i, b in enumerate(blocks) if b.startswith("import ")]
    assert len(runnable) >= 2  # the descent step and the general constrained step
    for i in runnable:
        namespace: dict = {}
        exec(compile(blocks[i], f"README block {i}", "exec"), namespace)
        if i + 1 < len(blocks) and blocks[i + 1].startswith("init, step"):
            exec(compile(blocks[i + 1], f"README block {i + 1}", "exec"), namespace)
    printed = capsys.readouterr().out.strip()
    assert f"prints `{printed}`" in _readme()  # the output the README quotes is this run's


def test_each_row_of_the_cooper_table_names_tests_that_exist():
    """docs/constrained.md's comparison proves cudt's side of every row with a named test: each
    file exists and each ``file::test`` is defined in it."""
    page = (ROOT / "docs" / "constrained.md").read_text(encoding="utf-8")
    table = page.split("## Against Cooper and TFCO", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| Feature")]
    assert len(rows) >= 15
    for row in rows:
        cell = row.rstrip(" |").rsplit("|", 1)[1]
        named = re.findall(r"`(test_\w+\.py)(?:::(test_\w+))?`", cell)
        assert named, row
        for file, test in named:
            found = sorted((ROOT / "tests").rglob(file))
            assert len(found) == 1, (file, found)
            source = found[0].read_text(encoding="utf-8")
            assert not test or f"def {test}(" in source, (file, test)


def _pages_text() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


def test_every_public_name_is_on_a_page_and_every_name_a_page_gives_exists():
    """``cudt.constraint_values``, ``project_nonnegative`` and ``resilience_decay`` were exported
    and named on no page (nor ``Decoder``): each of ``cudt.__all__`` is named in README.md or
    docs/, and each dotted ``cudt.``, ``experiments.`` or ``benchmarks.`` name a page gives
    is a module or one of its attributes (``cudt.lock``, a lock file's name, aside)."""
    import importlib

    import cudt

    text = _pages_text()
    unnamed = [n for n in cudt.__all__ if not re.search(rf"(?<![\w.]){n}(?!\w)|cudt\.{n}\b", text)]
    assert not unnamed, f"exported by cudt, named on no page: {unnamed}"
    gone = set()
    for dotted in set(re.findall(r"\b(?:cudt|experiments|benchmarks)(?:\.[A-Za-z_]\w*)+", text)):
        if dotted == "cudt.lock":
            continue
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for name in parts[i:]:
                obj = getattr(obj, name, gone)
                if obj is gone:
                    break
            break
        if obj is gone:
            gone.add(dotted)
    assert not gone, f"named on a page, not in the code: {sorted(gone)}"


def test_the_constrained_pages_own_dual_chains_are_duals_the_step_takes():
    """docs/constrained.md's chains of ``resilience_decay`` and ``project_nonnegative`` run as
    written and are duals ``make_constrained_step`` accepts (a chain not ending in the
    projection is refused), each decaying or projecting as the page says."""
    import jax.numpy as jnp
    import optax

    import cudt
    from cudt.constrained._dual import check_dual

    page = (ROOT / "docs" / "constrained.md").read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "ramped" in b]
    namespace: dict = {}
    exec(
        compile("import optax, cudt\n" + textwrap.dedent(block), "constrained.md", "exec"),
        namespace,
    )
    lam, g = {"c": jnp.array(2.0)}, {"c": jnp.array(0.5)}
    for name in ("decayed", "ramped"):
        check_dual(namespace[name])
    decayed = namespace["decayed"]
    updates, _ = decayed.update(g, decayed.init(lam), lam)
    assert jnp.allclose(updates["c"], 0.1 * (0.5 - 2.0 / 10.0))  # ascent on g − λ/α
    with pytest.raises(ValueError, match="goes on after cudt.project_nonnegative"):
        check_dual(optax.chain(cudt.project_nonnegative(), optax.scale(2.0)))


def test_a_blocks_unmarked_level_intervals_are_named_beside_it():
    """The runner marks a constrained − ERM interval spanning 0 ``level``; a generated block
    written before it did (docs/results/llm.md's llm-section6-2epochs: ``auc 0.002731 [-0.02704,
    0.0325]``, its results.json not kept) cannot be rewritten, so the prose just above the block
    names each such interval."""
    item = re.compile(r"(\w[\w@γ]*) (-?[\d.e+-]+) \[(-?[\d.e+-]+), (-?[\d.e+-]+)\]( level)?")
    checked = 0
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(
            r"\n\n((?:[^\n]+\n)+)\n<!-- generated:([\w.-]+)[^\n]*\n(.*?)<!-- end:", text, re.S
        ):
            before, name, body = m.groups()
            for line in re.findall(r"constrained − ERM, paired by seed: ([^\n]*)", body):
                checked += 1
                unmarked = [
                    metric
                    for metric, _, low, high, level in item.findall(line)
                    if float(low) <= 0 <= float(high) and not level
                ]
                missing = [u for u in unmarked if f"{u}'s" not in before]
                assert not missing, f"{page.name} {name}: unmarked level intervals {missing}"
    assert checked >= 1
