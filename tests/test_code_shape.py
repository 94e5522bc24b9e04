"""No function of the library is longer than a reader can hold (issue 48): at most 100 lines,
docstring included, except the models' forward passes (a Flax module's ``__call__`` in
``cudt/models/``, which reads best as the one equation it computes)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MOST_LINES = 100


def long_functions(root: pathlib.Path = ROOT, most: int = MOST_LINES) -> dict[str, int]:
    """``"path:line name"`` → lines, for every function under ``root/cudt`` longer than
    ``most`` lines, the models' ``__call__`` left out."""
    found = {}
    for path in sorted((root / "cudt").rglob("*.py")):
        rel = path.relative_to(root)
        model = rel.parts[:2] == ("cudt", "models")
        for node in ast.walk(ast.parse(path.read_bytes())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > most and not (model and node.name == "__call__"):
                found[f"{rel}:{node.lineno} {node.name}"] = lines
    return found


def test_the_checker_sees_a_long_function_and_spares_a_models_forward_pass(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MOST_LINES))
    for folder in ("cudt/runner", "cudt/models"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "cudt/runner/run.py").write_text(f"def short():\n    pass\n\n\ndef run():\n{body}")
    (tmp_path / "cudt/models/ut.py").write_text(
        f"class UT:\n    def __call__(self):\n{body.replace('    ', '        ')}"
        f"\n    def helper(self):\n{body.replace('    ', '        ')}"
    )
    assert long_functions(tmp_path) == {
        "cudt/models/ut.py:104 helper": MOST_LINES + 1,
        "cudt/runner/run.py:5 run": MOST_LINES + 1,
    }


def test_no_library_function_is_over_100_lines():
    assert long_functions() == {}
