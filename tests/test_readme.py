"""The README's set-up commands are the ones CI runs, its layout section lists exactly the files
in the tree, and every relative Markdown link in README.md and docs/ points at a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Files other branches add (listed in the layout ahead of their merge); a listed file in this set
# may be absent. Remove an entry once its file is in the tree.
_PLANNED = {
    "cudt/constraint.py",
    "cudt/formulation.py",
    "cudt/constrained_step.py",
    "cudt/models/llama/gguf_tokenizer.py",
    "benchmarks/general_step.py",
    "benchmarks/imported_step.py",
    "benchmarks/linalg_step.py",
    "benchmarks/smollm2_step.py",
    "docs/constrained.md",
    "docs/speed.md",
    "tests/conftest.py",
    "tests/helpers.py",
}
# Every file under these folders must be in the layout (tests/ is listed by its shared modules).
_LISTED_IN_FULL = ("cudt", "experiments", "benchmarks", "docs")


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _layout_paths() -> list[str]:
    """The paths the layout block names, relative to the root ('dir/' for a directory).

    A line is names, then two or more spaces and a description. Indent 0: a top-level file or
    'dir/' (whose files may follow on the line); indent 2: files of the last top-level folder, or
    'sub/' and its files; a line indented more continues the description above."""
    layout = _readme().split("## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", layout, re.S).group(1)
    paths, top = [], ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 2:
            continue
        names = [n for n in re.split(r"[\s,]+", re.split(r"\s{2,}", line.strip())[0]) if n]
        base = "" if indent == 0 else top
        if names[0].endswith("/"):
            base += names[0]
            paths.append(base)
            if indent == 0:
                top = base
            names = names[1:]
        paths += [base + n for n in names]
    return paths


def test_ci_runs_exactly_the_readme_test_command():
    lines = [ln.strip() for ln in _readme().splitlines()[:4] if ln.strip()]
    run_cmd, test_cmd = lines[1], lines[2]
    assert "python -m experiments.video_denoise" in run_cmd
    assert test_cmd.endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].strip() == test_cmd


def test_layout_section_names_existing_paths():
    paths = _layout_paths()
    missing = [p for p in paths if not (ROOT / p).exists() and p not in _PLANNED]
    assert len(paths) > 50 and not missing, f"listed in README's layout, not in the tree: {missing}"


def test_layout_section_lists_every_file():
    listed = set(_layout_paths())
    files = [
        p.relative_to(ROOT).as_posix()
        for folder in _LISTED_IN_FULL
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and p.suffix in {".py", ".md"} and "__pycache__" not in p.parts
    ]
    files += [
        p.name for p in ROOT.iterdir() if p.is_file() and p.name in {"README.md", "pyproject.toml"}
    ]
    unlisted = sorted(set(files) - listed)
    assert files and not unlisted, f"in the tree, missing from README's layout: {unlisted}"


def test_relative_markdown_links_resolve():
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")]
    broken, checked = [], 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            checked += 1
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert checked >= 10 and not broken, broken
