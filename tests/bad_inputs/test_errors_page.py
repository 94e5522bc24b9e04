"""docs/errors.md lists exactly the cases that the tests of this folder record, each in its
test's section. The cases are read from the tests' sources, not from a run (each test checks
its messages against their rows as it records them: refusals.check)."""

from __future__ import annotations

import ast
from pathlib import Path

from refusals import docs_rows, section_of


def _cases_in_these_modules() -> dict[str, str]:
    """case -> docs/errors.md section, for every case a test of this folder records, read from
    its module's source: ``check("case", ...)`` (or ``refused``) in a test, or
    ``check(case, ...)`` in a test decorated ``@over_cases(TABLE)`` (a list of tuples, the case
    first, assigned in its module)."""
    cases = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        assigned = {
            target.id: node.value
            for node in body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            tables = [
                [ast.literal_eval(row.elts[0]) for row in assigned[d.args[0].id].elts]
                for d in node.decorator_list
                if isinstance(d, ast.Call)
                and getattr(d.func, "id", None) == "over_cases"
                and isinstance(d.args[0], ast.Name)
            ]
            for call in ast.walk(node):
                if not (
                    isinstance(call, ast.Call)
                    and getattr(call.func, "id", None) in ("check", "refused")
                ):
                    continue
                first = call.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    cases[first.value] = section_of(node.name)
                elif isinstance(first, ast.Name) and first.id == "case":
                    cases.update(
                        {case: section_of(node.name) for table in tables for case in table}
                    )
    return cases


def test_docs_errors_md_has_a_row_for_every_case_and_no_other():
    """docs/errors.md lists exactly the cases this folder's tests record, each in its test's
    section (each test checks its message against its row as it records it). Fix: regenerate
    the page with CUDT_ERRORS_TABLE (see docs/errors.md)."""
    docs = {case: section for case, (section, _, _) in docs_rows().items()}
    cases = _cases_in_these_modules()
    assert len(cases) > 50 and len(docs) > 50, "docs/errors.md or the case tables are lost"
    assert sorted(set(cases) - set(docs)) == [], "cases without a row in docs/errors.md"
    assert sorted(set(docs) - set(cases)) == [], "rows of docs/errors.md without a case"
    assert {c: docs[c] for c in cases} == cases, "rows in another section than their test's"
