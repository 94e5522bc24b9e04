"""experiments.paper.rows: which of constrained and ERM a table calls better, and its bold."""

from __future__ import annotations

from experiments.paper import rows as table_rows


def _row(mean: float, seeds: dict[int, float] | None = None) -> dict:
    """A table row of status ok: a single run, or (``seeds``) a mean over seeds."""
    row = {"status": "ok", "mean_rmse": mean, "not_applicable": ""}
    if seeds is not None:
        row["per_seed"] = {s: {"mean_rmse": v} for s, v in seeds.items()}
    return row


def test_means_over_seeds_without_an_interval_are_level_not_decided_to_3_decimals():
    """Rows of means over seeds sharing fewer than two seeds (or beside a single run) have no
    paired interval: better() fell back to comparing 3 decimals and bolded a winner, while the
    legend of such a table says bold needs an interval excluding 0."""
    cases = [
        (_row(5.1, {0: 5.0, 1: 5.2}), _row(5.3, {1: 5.1, 2: 5.5})),  # one seed shared
        (_row(5.1, {0: 5.0, 1: 5.2}), _row(5.3)),  # means beside a single run
    ]
    for c, e in cases:
        assert table_rows.paired(c, e, "mean_rmse") is None
        assert table_rows.better(c, e, "mean_rmse", higher=False) == "="
        assert table_rows._pair_cells(c, e, "mean_rmse", higher=False) == ("5.100", "5.300")
        legend = table_rows.selection_legend("validation RMSE", [c, e], "lower")
        assert "neither where it spans 0 (level)" in legend
    # two seeds shared: the interval decides (here it excludes 0: constrained lower)
    c, e = _row(5.1, {0: 5.0, 1: 5.2}), _row(5.6, {0: 5.5, 1: 5.7})
    assert table_rows.better(c, e, "mean_rmse", higher=False) == "C"
    assert table_rows._pair_cells(c, e, "mean_rmse", higher=False) == ("**5.100**", "5.600")
    # one seed each (the tiny tables): 3 decimals, as their legend says ("no interval, so no
    # verdict"; the count "a count of signs, not of wins")
    c, e = _row(5.1), _row(5.3)
    assert table_rows.better(c, e, "mean_rmse", higher=False) == "C"
    assert "one seed: no interval" in table_rows.selection_legend("RMSE", [c, e], "lower")
