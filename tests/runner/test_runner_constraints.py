"""The runner's --constraint, --formulation, --update, --dual-optimizer nupi and --resilience-mode
on the toy task: each flag reaches the one step, every combination composes (explicit slacks
with nuPI, alternating updates and every constraint kind), the options reproduce the default
where the maths says they must, the runner has one path to the step, and an indexed run resumes
bit for bit."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
from helpers import toy

from cudt.checkpoint import GroupCheckpointer

ONE = ["--seeds", "1"]


def _constrained(results) -> dict:
    (run,) = [r for r in results["runs"] if r["constrained"]]
    return run


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return toy(ONE, tmp_path_factory.mktemp("default") / "o")


@pytest.fixture(scope="module")
def sgd_run(tmp_path_factory):
    return toy([*ONE, "--dual-optimizer", "sgd"], tmp_path_factory.mktemp("sgd") / "o")


def _close(a, b) -> bool:
    return np.allclose(a["final_loss"], b["final_loss"], rtol=1e-4) and np.allclose(
        a["multipliers"], b["multipliers"], rtol=1e-4, atol=1e-6
    )


@pytest.mark.slow
def test_general_path_reproduces_the_default_where_it_must(default_run, sgd_run, tmp_path):
    """The augmented Lagrangian at ρ = 0 is the Lagrangian, and nuPI with K_P = 0, ν = 0 is SGD
    ascent: both must give the default's runs."""
    augmented = toy([*ONE, "--formulation", "augmented", "--penalty", "0"], tmp_path / "a")
    nupi = toy([*ONE, "--dual-optimizer", "nupi"], tmp_path / "n")
    assert _close(_constrained(augmented), _constrained(default_run))
    assert _close(_constrained(nupi), _constrained(sgd_run))
    assert max(_constrained(default_run)["multipliers"]) > 0
    for a, b in zip(augmented["runs"], default_run["runs"], strict=True):  # ERM lanes too
        np.testing.assert_allclose(a["final_loss"], b["final_loss"], rtol=1e-4)


@pytest.mark.parametrize(
    "flags",
    [
        ["--constraint", "indexed"],
        ["--constraint", "tail"],
        ["--formulation", "augmented", "--penalty", "20"],
        ["--update", "alternating"],
        ["--update", "extragradient"],
        ["--update", "optimistic"],
    ],
    ids=lambda f: "-".join(a.strip("-") for a in f),
)
def test_each_flag_changes_the_constrained_run(flags, default_run, tmp_path):
    results = toy([*ONE, *flags], tmp_path / "o")
    run, base = _constrained(results), _constrained(default_run)
    assert not _close(run, base), flags
    assert results["config"][flags[0][2:].replace("-", "_")] == flags[1]
    # ERM lanes see no constraint: the default's ERM run, except under the extrapolating
    # schemes, which change the primal step of every lane (ERM's too)
    erm = [r for r in results["runs"] if not r["constrained"]]
    base_erm = [r for r in default_run["runs"] if not r["constrained"]]
    same = np.allclose(erm[0]["final_loss"], base_erm[0]["final_loss"], rtol=1e-4)
    assert same == (flags[1] not in ("extragradient", "optimistic"))
    if flags[1] == "indexed":
        # one multiplier per training example and layer: the table's max is above its mean
        assert np.all(np.asarray(run["multipliers_table_max"][1:]) > run["multipliers"][1:])
    else:
        assert "multipliers_table_max" not in run


@pytest.mark.slow
def test_penalty_formulation_and_nupi_gains(sgd_run, tmp_path):
    both = toy([*ONE, "--formulation", "penalty", "--penalty", "50"], tmp_path / "p")
    penalty = _constrained(both)
    (erm,) = [r for r in both["runs"] if not r["constrained"]]
    assert penalty["multipliers"] == [0.0, 0.0, 0.0]  # no multipliers, yet not ERM: the
    # penalty moves the run away from its own ERM lane (same seed, data and steps)
    assert not np.allclose(penalty["final_loss"], erm["final_loss"], rtol=1e-4)
    assert penalty["final_loss"] != _constrained(sgd_run)["final_loss"]
    swept = toy(
        [*ONE, "--dual-optimizer", "nupi", "--sweep", "nupi_kp=0,5", "--nupi-ema", "0.5"],
        tmp_path / "k",
    )
    by_kp = {r["hparams"]["nupi_kp"]: r for r in swept["runs"] if r["constrained"]}
    assert set(by_kp) == {0.0, 5.0}
    assert by_kp[0.0]["multipliers"] != by_kp[5.0]["multipliers"]
    assert all(r["hparams"]["nupi_ema"] == 0.5 for r in by_kp.values())


def test_tail_beta_is_a_per_run_value(tmp_path):
    results = toy([*ONE, "--constraint", "tail", "--sweep", "tail_beta=0.25,1"], tmp_path / "o")
    runs = {r["hparams"]["tail_beta"]: r for r in results["runs"] if r["constrained"]}
    assert set(runs) == {0.25, 1.0}
    assert runs[0.25]["multipliers"] != runs[1.0]["multipliers"]
    assert [r["hparams"]["tail_beta"] for r in results["runs"] if not r["constrained"]] == [None]


def _state_bytes(out) -> dict[str, bytes]:
    with GroupCheckpointer(out / "checkpoints" / "toy-2") as ckpt:
        assert ckpt.latest_step() == 12
        states, _ = ckpt.restore(None)
    flat = jax.tree_util.tree_flatten_with_path(states)[0]
    return {jax.tree_util.keystr(p): np.asarray(x).tobytes() for p, x in flat}


@pytest.mark.slow
def test_indexed_run_resumes_bitwise(tmp_path):
    """Train 12 steps (checkpoints at 4, 8, 12); drop the last checkpoint and the results and
    rerun: it resumes at step 8 and ends bit for bit where the straight run ended, the
    multiplier table [4 runs (2 seeds, ERM and constrained), 96 examples, 2 layers] and its Adam moments included."""
    argv = [
        *("--constraint", "indexed", "--steps", "12", "--chunk-steps", "4", "--seeds", "2"),
        *("--data-seed", "0"),  # one draw: both seeds in one group, one multiplier table
    ]
    straight = tmp_path / "straight"
    first = toy(argv, straight)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "results.json").unlink()
    shutil.rmtree(resumed / "checkpoints" / "toy-2" / "12")
    second = toy(argv, resumed)
    a, b = _state_bytes(straight), _state_bytes(resumed)
    assert a.keys() == b.keys()
    tables = [k for k in a if "multipliers" in k and "descent" in k]
    assert tables and len(a[tables[0]]) == 4 * 96 * 2 * 4  # float32 [R, N, L], R = 2 seeds x 2
    assert len({a[tables[0]]} - {bytes(len(a[tables[0]]))}) == 1  # not all zeros
    for key in a:
        assert a[key] == b[key], key
    for ra, rb in zip(first["runs"], second["runs"], strict=True):
        assert ra["multipliers"] == rb["multipliers"]
        assert ra.get("multipliers_table_max") == rb.get("multipliers_table_max")
        assert ra["curves"] == rb["curves"]
        assert ra["final_loss"] == rb["final_loss"]


def test_a_task_default_of_nupi_leaves_other_dual_optimizers_usable():
    from cudt.tasks.video import VideoConfig

    # the video default is nupi with K_P = 5: sgd keeps that default K_P (unused) or takes 0,
    # the neutral gain, without a complaint; any other K_P without nupi is still refused
    assert VideoConfig().dual_optimizer == "nupi" and VideoConfig().nupi_kp == 5.0
    VideoConfig(dual_optimizer="sgd")
    VideoConfig(dual_optimizer="sgd", nupi_kp=0.0, nupi_ema=0.0)
    with pytest.raises(ValueError, match="--nupi-kp is a gain of --dual-optimizer nupi"):
        VideoConfig(dual_optimizer="sgd", nupi_kp=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("constraint", ["mean", "indexed", "tail"])
def test_slacks_compose_with_nupi_alternating_and_every_constraint(constraint, tmp_path):
    """The video default's dynamics (nuPI, alternating) with explicit resilience slacks, which
    the runner once refused: trained, the slacks move and are reported, and they relax the
    constraints (their multipliers end below the hard run's of the same flags)."""
    flags = [*ONE, "--constraint", constraint, "--dual-optimizer", "nupi", "--nupi-kp", "1"]
    flags += ["--update", "alternating"]
    slack = toy([*flags, "--resilience-mode", "slack", "--resilience", "0.5"], tmp_path / "s")
    hard = toy(flags, tmp_path / "h")
    run = _constrained(slack)
    assert slack["config"]["resilience_mode"] == "slack"
    u = np.asarray(run["curves"]["slacks"])
    assert u.shape[1] == 3 and np.max(u[:, 1:]) > 0 and np.all(u >= 0)
    assert sum(run["multipliers"][1:]) < sum(_constrained(hard)["multipliers"][1:])


def test_slacks_with_erm_runs_alone_train(tmp_path):
    """A group of ERM runs alone (--kinds erm here; the video's ERM-only dust-pl control) under
    --resilience-mode slack: its runs have no α of their own, so the step is built with the
    flag's (it raised after --out was made)."""
    res = toy([*ONE, "--kinds", "erm", "--resilience-mode", "slack", "--resilience", "2"], tmp_path)
    assert [r["constrained"] for r in res["runs"]] == [False] and not res["runs"][0]["diverged"]


def test_the_runner_has_one_path_to_the_step():
    """Every run is built by make_group_step through cudt.make_train_step, the one engine's
    convenience: no module of the runner builds a step otherwise, and no config switch picks
    an engine."""
    import pathlib

    import cudt
    from cudt.runner.config import RunConfig

    runner = pathlib.Path(cudt.__file__).parent / "runner"
    builders = ("make_train_step(", "make_constrained_step(", "make_descent_step(")
    calls = {
        (f.name, b)
        for f in runner.glob("*.py")
        for b in builders
        if b in f.read_text(encoding="utf-8")
    }
    assert calls == {("groups.py", "make_train_step(")}, calls
    assert not hasattr(RunConfig, "uses_general_step")
    assert not hasattr(cudt, "make_descent_step")
