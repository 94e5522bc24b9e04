"""The README's set-up commands are the ones CI runs, and its layout section names real paths."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_ci_runs_exactly_the_readme_test_command():
    lines = [ln.strip() for ln in _readme().splitlines()[:4] if ln.strip()]
    run_cmd, test_cmd = lines[1], lines[2]
    assert "python -m experiments.video_denoise" in run_cmd
    assert test_cmd.endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].strip() == test_cmd


def test_layout_section_names_existing_paths():
    layout = _readme().split("## Layout", 1)[1]
    block = re.search(r"```\n(.*?)```", layout, re.S).group(1)
    folder, checked, missing = ROOT, [], []
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent > 2:
            continue  # a description's continuation line
        names = [n.strip() for n in re.split(r"\s{2,}", line.strip())[0].split(",")]
        base = ROOT if indent == 0 else folder
        for name in names:
            path = base / name.rstrip("/")
            checked.append(path)
            if not path.exists():
                missing.append(str(path.relative_to(ROOT)))
        if indent == 0 and names[0].endswith("/"):
            folder = ROOT / names[0].rstrip("/")
    assert len(checked) > 10 and not missing, missing
