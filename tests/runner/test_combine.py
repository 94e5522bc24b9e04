"""A job's seeds trained as separate commands, each on its own data or on one draw
(``--data-seed``), and reported as one (``python -m experiments.combine``): real tiny runs of the LLM task, their results.json."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import (
    TINY_DECODER_FLAGS,
    ToyTask,
    combine_toy_folders,
    exit_status,
    finished_job,
    toy,
)

from cudt.data.alpaca import write_alpaca
from cudt.data.instructions import generated_instructions
from cudt.errors import UsageError
from cudt.runner.combine import combine as combine_folders
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig
from experiments import combine, llm_sft

TINY = [
    "--num-train", "24", "--num-val", "4", "--num-test", "4", "--max-length", "48",
    *TINY_DECODER_FLAGS, "--steps", "2", "--batch-size", "4", "--completions", "0",
    "--eval-batch-size", "4", "--test-gammas", "0,2", "--chunk-tokens", "100",
    "--no-figures",  # combine reads results.json alone
]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("combine")
    first, rest = root / "seed0", root / "seed1"
    finished_job(llm_sft.main, [*TINY, "--seeds", "1"], first)
    finished_job(llm_sft.main, [*TINY, "--seed", "1", "--seeds", "1", "--data-seed", "0"], rest)
    return first, rest


def test_data_seed_gives_the_data_of_that_seed_whatever_the_runs_seed():
    task = LLMTask()
    kw = dict(num_train=24, num_val=4, num_test=4, max_length=48, layers=2, hidden=16)
    base = task.load(LLMConfig(seed=0, **kw))
    same = task.load(LLMConfig(seed=1, data_seed=0, **kw))
    other = task.load(LLMConfig(seed=1, **kw))
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(same.tokens[split].input_ids, base.tokens[split].input_ids)
    assert any(
        other.tokens[s].input_ids.shape != base.tokens[s].input_ids.shape
        or np.any(other.tokens[s].input_ids != base.tokens[s].input_ids)
        for s in ("train", "val", "test")
    )


def test_two_folders_report_as_one_job_with_intervals_over_their_seeds(folders, capsys):
    assert combine.main([str(f) for f in folders]) == 0
    out = capsys.readouterr().out
    assert "4 runs of llm_sft from 2 folders:" in out
    assert "paired by seed (0, 1) and prompt" in out
    for kind in ("ERM", "constrained"):
        for seed in (0, 1):
            assert f"llm-2 {kind} seed {seed}:" in out
    assert "llm-2 constrained: feasible at 0 %" in out and "of 2 seeds" in out
    # the intervals are over both folders' seeds: each kind's validation objective, recomputed
    from cudt.stats import t_interval

    runs = [r for f in folders for r in json.loads((f / "results.json").read_text())["runs"]]
    for kind, constrained in (("ERM", False), ("constrained", True)):
        values = [r["val_objective"] for r in runs if r["constrained"] == constrained]
        iv = t_interval(values)
        assert len(values) == 2
        (line,) = [x for x in out.splitlines() if x.startswith(f"llm-2 {kind}: mean [95% ")]
        assert f"val_objective {iv.mean:.4g} [{iv.low:.4g}, {iv.high:.4g}]" in line, line


def test_seeds_on_one_draw_of_the_data_say_so_on_their_interval_lines(folders, tmp_path, capsys):
    """Seeds that read one draw of the data (--data-seed, in one command or over folders)
    replicate the initialisation and the batch order only: the interval lines say so, and
    results.json's entries record the draw; they read "over 2 seeds" as if each seed had drawn
    its own data."""
    assert combine.main([str(f) for f in folders]) == 0  # seed 0's own draw, seed 1 on it
    out = capsys.readouterr().out
    for kind in ("ERM", "constrained"):
        (line,) = [x for x in out.splitlines() if x.startswith(f"llm-2 {kind}: mean [95% ")]
        assert "over 2 seeds on one data draw (data seed 0): " in line, line
    # the LLM footer's paired lines too (its runs record the draw each read: data_draw)
    (paired,) = [x for x in out.splitlines() if x.startswith("constrained − ERM, paired by")]
    assert paired.startswith(
        "constrained − ERM, paired by seed (0, 1) and prompt on one data draw (data seed 0): "
    ), paired
    # one command, --data-seed: its results.json (which the pages print) and its summary
    results = toy(["--seeds", "2", "--data-seed", "0", "--steps", "4"], tmp_path / "toy")
    assert [e["data_draw"] for e in results["intervals"]] == [0, 0]
    lines = [x for x in capsys.readouterr().out.splitlines() if "Student-t interval" in x]
    assert len(lines) == 2
    assert all("over 2 seeds on one data draw (data seed 0): " in x for x in lines), lines
    # (each seed on its own draw, nothing is said: test_each_seed_draws_its_own_data_...)


def test_folders_of_another_job_are_refused_with_one_line(folders, tmp_path, capsys):
    first, rest = folders
    assert combine.main([str(first), str(first)]) == 2
    assert "is in both" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(rest, other)
    results = json.loads((other / "results.json").read_text())
    for key, value, says in (
        ("data_seed", 2, "trained on one draw of the data (--data-seed) and another"),
        ("steps", 3, f"{first} and {other} differ in steps (2 vs 3)"),  # in that order
    ):
        changed = {**results, "config": {**results["config"], key: value}}
        (other / "results.json").write_text(json.dumps(changed))
        assert combine.main([str(first), str(other)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert combine.main([str(first), str(tmp_path / "missing")]) == 2
    assert "no results.json" in capsys.readouterr().err
    # JSON that is not a run's results (another program's, or edited by hand) was a traceback
    without_config = {k: v for k, v in results.items() if k != "config"}
    cases = [("[1, 2]", "(no experiment, config, runs)")]
    cases.append((json.dumps(without_config), "(no config)"))
    bare_run = {**results, "runs": [*results["runs"][:1], {}]}  # a run with no fields: KeyError
    cases.append((json.dumps(bare_run), "(no runs[1].label, runs[1].model, runs[1].seed,"))
    for text, says in cases:
        (other / "results.json").write_text(text)
        for argv in ([str(first), str(other)], [str(other), str(first)]):
            assert combine.main(argv) == 2
            err = capsys.readouterr().err
            assert f"{other / 'results.json'}: not a cudt run's results {says}" in err, err
            assert err.count("\n") == 1, err


def test_one_seed_on_two_draws_is_refused_in_either_order(folders, tmp_path, capsys):
    """Seed 1 trained on its own draw in one folder (no --data-seed) and on seed 0's draw in
    another (``--data-seed 0``, at another sweep point: other labels): the two would be paired
    as if on one draw of the data, whichever folder comes first."""
    first, rest = folders
    results = json.loads((rest / "results.json").read_text())
    own = tmp_path / "own_draw"
    shutil.copytree(rest, own)
    config = {**results["config"], "data_seed": None, "data_per_seed": True}
    (own / "results.json").write_text(json.dumps({**results, "config": config}))
    other = tmp_path / "seed0_draw"
    shutil.copytree(rest, other)
    relabelled = [{**r, "label": r["label"] + " dual_lr=0.5"} for r in results["runs"]]
    (other / "results.json").write_text(json.dumps({**results, "runs": relabelled}))
    for order in ([first, own, other], [first, other, own]):
        assert combine.main([str(f) for f in order]) == 2
        err = capsys.readouterr().err
        assert f"{other} trained on one draw of the data (--data-seed)" in err, err
        assert err.count("\n") == 1, err


def test_one_folder_is_reported_again_unchanged(folders, capsys):
    """One folder: its own runs re-reported (the same rows and intervals as the run printed),
    the folder left as it was."""
    first, _ = folders
    before = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()}
    assert combine.main([str(first)]) == 0
    out = capsys.readouterr().out
    results = json.loads((first / "results.json").read_text())
    assert f"{len(results['runs'])} runs of llm_sft from 1 folder:" in out
    for r in results["runs"]:  # every run's per-seed line
        assert f"{r['label']}: " in out
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()} == before
    with pytest.raises(UsageError, match="at least one run folder"):
        combine_folders(LLMTask(), [])


def test_a_folder_of_one_kind_joins_the_job(folders, tmp_path, capsys):
    """More settings of a job trained later, --kinds constrained (no second ERM twin), at a
    commit with another evaluation flag: the kinds and the per-state readout at other γ are
    not the job's settings, so the folders combine."""
    first, rest = folders
    later = tmp_path / "later"
    shutil.copytree(rest, later)
    results = json.loads((later / "results.json").read_text())
    config = {k: v for k, v in results["config"].items() if k != "states_at_every_gamma"}
    changed = {
        **results,
        "config": {**config, "kinds": "constrained"},
        "runs": [r for r in results["runs"] if r["constrained"]],
    }
    (later / "results.json").write_text(json.dumps(changed))
    assert combine.main([str(first), str(later)]) == 0
    out = capsys.readouterr().out
    assert "3 runs of llm_sft from 2 folders:" in out
    assert "llm-2 constrained seed 1:" in out and "llm-2 ERM seed 1:" not in out


def _swept_epsilon_folder(source, out, epsilons=(0.1, 0.3)):
    """``source``'s constrained runs as a later ``--kinds constrained --sweep epsilon=...``
    command writes them: a lane per ε, labelled ``eps=`` (ε 0.1, the task's default, the
    source's own point)."""
    shutil.copytree(source, out)
    results = json.loads((out / "results.json").read_text())
    runs = [
        {**r, "label": f"{r['label']} eps={e:g}", "hparams": {**r["hparams"], "epsilon": e}}
        for e in epsilons
        for r in results["runs"]
        if r["constrained"]
    ]
    sweep = {"sweeps": {"epsilon": list(epsilons)}, "swept": ["epsilon"], "kinds": "constrained"}
    config = {**results["config"], **sweep, "sweep": ["epsilon=0.1,0.3"]}
    (out / "results.json").write_text(json.dumps({**results, "config": config, "runs": runs}))
    return out


def test_a_folder_that_sweeps_joins_and_a_run_held_twice_under_another_label_is_refused(
    folders, tmp_path, capsys
):
    """Another command sweeping ε (a hyperparameter either folder sweeps may differ): its
    folder joins the job. Its lane at the default ε of a seed another folder holds is that
    run again under another label: refused, not averaged in twice."""
    first, rest = folders
    assert LLMConfig().epsilon == 0.1
    swept = _swept_epsilon_folder(rest, tmp_path / "eps")
    # before: "differ in swept ([] vs ['epsilon'])"
    assert combine.main([str(first), str(swept)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "4 runs of llm_sft from 2 folders:" in out
    assert "llm-2 constrained seed 1 eps=0.3:" in out
    # seed 1 at ε 0.1 in both: before (swept allowed), paired "by seed (0, 1, 1)" in silence
    assert combine.main([str(first), str(rest), str(swept)]) == 2
    err = capsys.readouterr().err
    assert (
        f"llm-2 constrained seed 1 eps=0.1 in {swept} is llm-2 constrained seed 1 in {rest} "
        "(the same seed and settings)" in err
    ), err
    assert err.count("\n") == 1, err


def test_folders_of_other_tune_grids_join_and_name_each_folders_grid(folders, tmp_path, capsys):
    """Seeds tuned over other grids (``--tune-dual-lr``): each run records the point it trained
    at, and a point one folder's grid lacks is a seed short, no rival for the point chosen over
    every seed (:func:`cudt.runner.choice.choose_points`): joined (before: refused, "differ in
    tune_dual_lr"), each folder's line naming its grid."""
    first, rest = folders
    other = tmp_path / "grid"
    shutil.copytree(rest, other)
    results = json.loads((other / "results.json").read_text())
    runs = [r for r in results["runs"] if not r["constrained"]] + [
        {**r, "label": f"{r['label']} dlr={d:g}", "hparams": {**r["hparams"], "dual_lr": d}}
        for d in (0.1, 0.3)
        for r in results["runs"]
        if r["constrained"]
    ]
    config = {**results["config"], "tune_dual_lr": [0.1, 0.3]}
    (other / "results.json").write_text(json.dumps({**results, "config": config, "runs": runs}))
    assert combine.main([str(first), str(other)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "5 runs of llm_sft from 2 folders:" in out
    assert f"  {first}: seeds [0], commit " in out and out.count("--tune-dual-lr") == 2
    assert ", --tune-dual-lr -\n" in out and ", --tune-dual-lr 0.1,0.3\n" in out
    assert "llm-2 constrained seed 1 dlr=0.3:" in out
    # one grid in every folder: the lines are as before
    assert combine.main([str(f) for f in folders]) == 0
    assert "--tune-" not in capsys.readouterr().out


def _copy_recording(source, out, **config):
    """A copy of the run folder ``source`` at ``out`` whose results.json records ``config``
    (as an earlier cudt, or another command, would have written it)."""
    shutil.copytree(source, out)
    results = json.loads((out / "results.json").read_text())
    results["config"].update(config)
    (out / "results.json").write_text(json.dumps(results))
    return out


def test_seeds_trained_on_one_file_spelt_otherwise_join(tmp_path, monkeypatch, capsys):
    """A job's seeds as commands on other machines or from other folders: the same data file
    at another path (a copy, a path relative to another folder) joins, as a resume would take
    it (its digests decide); it was refused, "differ in data". Other data there is refused."""
    records = generated_instructions(40, seed=10)
    first, later, other = (tmp_path / n for n in ("first", "later", "other"))
    for folder in (first, later, other):
        (folder / "data").mkdir(parents=True)
        these = records if folder != other else generated_instructions(40, seed=11)
        write_alpaca(these, folder / "data" / "alpaca.json")
    runs = []
    for i, folder in enumerate((first, later, other)):
        monkeypatch.chdir(folder)
        argv = [*TINY, "--data", "data/alpaca.json" if i != 1 else "./data//alpaca.json"]
        argv += ["--data-seed", "0", "--seed", str(min(i, 1)), "--seeds", "1"]
        runs.append(finished_job(llm_sft.main, argv, tmp_path / f"seed{i}"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert combine.main([str(runs[0]), str(runs[1])]) == 0
    assert "4 runs of llm_sft from 2 folders:" in capsys.readouterr().out
    assert combine.main([str(runs[0]), str(runs[2])]) == 2
    err = capsys.readouterr().err
    assert "they are not one job's runs" in err and err.count("\n") == 1, err


def test_a_folder_written_before_a_setting_existed_joins_at_its_earlier_behaviour(
    folders, tmp_path, capsys
):
    """Seeds trained before a version added a setting (``RunConfig.ADDED``, here
    --epsilon-margin): its absence is the earlier behaviour, so they join later seeds trained
    at that value, and not seeds trained at another."""
    first, rest = folders
    older = tmp_path / "older"
    shutil.copytree(first, older)
    results = json.loads((older / "results.json").read_text())
    assert results["config"]["epsilon_margin"] == LLMConfig.ADDED["epsilon_margin"] == 0.0
    del results["config"]["epsilon_margin"]
    (older / "results.json").write_text(json.dumps(results))
    assert combine.main([str(older), str(rest)]) == 0
    assert "4 runs of llm_sft from 2 folders:" in capsys.readouterr().out
    later = _copy_recording(rest, tmp_path / "later", epsilon_margin=0.01)
    assert combine.main([str(older), str(later)]) == 2
    assert "differ in epsilon_margin (0.0 vs 0.01)" in capsys.readouterr().err


def test_a_folder_recording_a_setting_since_removed_is_refused_naming_it_removed(
    folders, tmp_path, capsys
):
    """Seeds an earlier cudt trained under a setting it has since removed (ut_gate here) are
    not one job's runs with seeds of this cudt: refused in one line that says the setting was
    removed (not "None", as if the later folder had left a setting unset), with the fix; two
    folders recording the same value of it join, as before."""
    first, rest = folders
    older = _copy_recording(first, tmp_path / "older", ut_gate="sigmoid")
    for pair, values in (((older, rest), "'sigmoid' vs None"), ((rest, older), "None vs 'sigm")):
        assert combine.main([str(f) for f in pair]) == 2
        err = capsys.readouterr().err
        assert f"differ in ut_gate ({values}" in err, err
        assert "a setting removed from cudt, which an earlier version recorded)" in err, err
        assert err.rstrip().endswith("or combine only folders that record the same"), err
        assert len(err.strip().splitlines()) == 1
    both = _copy_recording(rest, tmp_path / "both", ut_gate="sigmoid")
    assert combine.main([str(older), str(both)]) == 0
    assert "4 runs of llm_sft from 2 folders:" in capsys.readouterr().out


def test_folders_differing_in_a_flag_that_acted_on_nothing_join(folders, tmp_path, capsys):
    """A flag whose needs neither run met (--lora-alpha without --lora-rank, recorded by a cudt
    that accepted it) is no difference; the same flag where it acts is one."""
    first, rest = folders
    other = _copy_recording(rest, tmp_path / "other", lora_alpha=4.0)
    assert combine.main([str(first), str(other)]) == 0
    assert "4 runs of llm_sft from 2 folders:" in capsys.readouterr().out
    acting = _copy_recording(other, tmp_path / "acting", lora_rank=8)  # it acts: another job
    assert combine.main([str(first), str(acting)]) == 2
    assert "differ in lora_alpha (None vs 4.0)" in capsys.readouterr().err


def test_each_seed_draws_its_own_data_and_equals_its_own_command(folders, tmp_path, capsys):
    """Without --data-seed every seed reads its own draw of the data: seed 1 of ``--seeds 2``
    is exactly ``--seed 1 --seeds 1``, which combines with seed 0's own command."""
    both, alone = tmp_path / "both", tmp_path / "alone"
    assert llm_sft.main([*TINY, "--seeds", "2", "--out", str(both)]) == 0
    assert llm_sft.main([*TINY, "--seed", "1", "--seeds", "1", "--out", str(alone)]) == 0
    capsys.readouterr()
    two = json.loads((both / "results.json").read_text())
    one = json.loads((alone / "results.json").read_text())
    assert two["config"]["data_per_seed"] and one["config"]["data_per_seed"]
    for run in one["runs"]:
        twin = next(
            r for r in two["runs"] if r["seed"] == 1 and r["constrained"] == run["constrained"]
        )
        for key in ("val_objective", "accuracy", "layer_loss_val", "multipliers"):
            assert twin[key] == run[key], key
    first, _ = folders  # seed 0 on its own data
    assert combine.main([str(first), str(alone)]) == 0
    joined = capsys.readouterr().out
    assert "4 runs of llm_sft from 2 folders:" in joined
    assert "over 2 seeds: " in joined and "one data draw" not in joined  # each its own draw
    # what each draw derives from its data may differ; a flag the task resolved may not
    other = tmp_path / "other-lr"
    shutil.copytree(alone, other)
    results = json.loads((other / "results.json").read_text())
    assert "lr" in results["config"]["data_derived"]
    changed = {**results, "config": {**results["config"], "lr": 10 * results["config"]["lr"]}}
    (other / "results.json").write_text(json.dumps(changed))
    assert combine.main([str(first), str(other)]) == 2
    assert "differ in lr" in capsys.readouterr().err


@pytest.fixture(scope="module")
def own_data(tmp_path_factory):
    """Two commands, each on its own Alpaca file (a held-out data set each), both at seed 0,
    with no reference bound and ε = 0.05, the runner's tolerance: each folder's constrained run
    is eligible on validation where its losses descend, its multipliers active (about 0.01)."""
    root = tmp_path_factory.mktemp("own-data")
    out = []
    for i in (0, 1):
        data = write_alpaca(generated_instructions(40, seed=10 + 3 * i), root / f"data{i}.json")
        argv = [*TINY, "--data", str(data), "--epsilon", "0.05", "--reference", "none"]
        out.append(finished_job(llm_sft.main, argv, root / f"set{i}"))
    return out


def test_per_folder_pairs_each_data_sets_own_choice(own_data, tmp_path, capsys):
    """``--per-folder``: folders on different data sets (both at seed 0), refused as one job's,
    report each folder's own choice and the chosen constrained − chosen ERM paired t over the
    folders' seeds (its mean is the mean of each folder's difference in its results.json)."""
    first, second = own_data
    assert combine.main([str(first), str(second)]) == 2
    assert "differ in data (" in capsys.readouterr().err
    assert combine.main(["--per-folder", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "2 folders of llm_sft, each on its own data" in out
    runs = [json.loads((f / "results.json").read_text())["runs"] for f in own_data]
    assert all(
        r["feasible"] and r["loss_decreases_val"] for rs in runs for r in rs if r["constrained"]
    )
    assert "llm-2 constrained: a point chosen in 2 of 2 folders" in out
    assert "llm-2 ERM: a point chosen in 2 of 2 folders" in out
    diffs = [
        next(r for r in rs if r["constrained"])["val_objective"]
        - next(r for r in rs if not r["constrained"])["val_objective"]
        for rs in runs
    ]
    assert diffs[0] != diffs[1]  # two data sets, two results
    assert (
        "llm-2: chosen constrained (each folder's chosen point) − chosen ERM (each folder's "
        "chosen point), paired t over 2 seeds:" in out
    )
    assert f"val_objective {np.mean(diffs):+.4g} [" in out
    assert "constrained feasible at 2 of 2" in out
    # a folder given twice, and another setting, are refused with one line
    assert combine.main(["--per-folder", str(first), str(first)]) == 2
    assert "is given twice" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(second, other)
    results = json.loads((other / "results.json").read_text())
    (other / "results.json").write_text(
        json.dumps({**results, "config": {**results["config"], "steps": 3}})
    )
    assert combine.main(["--per-folder", str(first), str(other)]) == 2
    err = capsys.readouterr().err
    assert "differ in steps (2 vs 3)" in err and err.count("\n") == 1, err


def test_per_folder_point_reports_a_given_lane_at_every_folder(own_data, capsys):
    """``--per-folder --point NAME=V``: every folder's constrained runs at that point (not
    chosen) against each folder's chosen ERM; here the one point each folder trained, so the
    paired t equals the chosen one's. A point some folder lacks, a name that is not a per-run
    hyperparameter, or --point alone are refused with one line."""
    first, second = own_data
    runs = [json.loads((f / "results.json").read_text())["runs"] for f in own_data]
    diffs = [
        next(r for r in rs if r["constrained"])["val_objective"]
        - next(r for r in rs if not r["constrained"])["val_objective"]
        for rs in runs
    ]
    assert combine.main(["--per-folder", "--point", "epsilon=0.050", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "its constrained runs at epsilon=0.05:" in out
    assert "llm-2 constrained: at epsilon=0.05 in 2 of 2 folders" in out
    assert (
        "llm-2: constrained at epsilon=0.05 (given, not chosen) − chosen ERM (each folder's "
        "chosen point), paired t over 2 seeds:" in out
    )
    assert f"val_objective {np.mean(diffs):+.4g} [" in out
    for argv, problem in [
        (["--per-folder", "--point", "epsilon=0.1"], "no constrained run of llm-2 at epsilon=0.1"),
        (["--per-folder", "--point", "steps=3"], "--point steps: not a per-run hyperparameter"),
        (["--point", "epsilon=0.05"], "--point goes with --per-folder"),
        (["--per-folder", "--point", "epsilon"], "'epsilon' is not NAME=VALUE"),
    ]:
        assert exit_status(combine.main, [*argv, str(first), str(second)]) == 2
        err = capsys.readouterr().err
        assert problem in err and err.count("\n") == 1, err


def test_per_folder_names_a_folder_where_one_kind_chose_by_its_folder_and_seed(tmp_path):
    """A folder whose constrained point is not eligible while its ERM chose: its seed is left
    out of the paired t, named as the folder's seed (``data1:5``), not as the internal number
    of its pair (it said ``seed 1 left out``: no folder has a seed 1)."""

    def record(constrained, val, feasible=True):
        return {
            "model": "m", "layers": 2, "gamma_train": 0.0, "constrained": constrained,
            "seed": 5, "label": f"m {constrained}", "val_objective": val, "diverged": False,
            "hparams": {"dual_lr": 0.1 if constrained else None, "gamma_train": 0.0},
            "feasible": feasible, "loss_decreases_val": True, "loss_decreases": True,
        }  # fmt: skip

    runs = [
        [record(True, 0.1 + 0.01 * f, feasible=f != 1), record(False, 0.3 + 0.05 * f**2)]
        for f in range(3)
    ]
    text = combine_toy_folders(tmp_path, runs)
    assert "m-2 constrained: a point chosen in 2 of 3 folders" in text, text
    (line,) = [x for x in text.splitlines() if x.startswith("m-2: chosen")]
    assert "paired t over 2 seeds (seed data1:5 left out: one side only):" in line, line


def test_per_folder_counts_the_erm_runs_meeting_each_folders_chosen_constraints(tmp_path):
    """``--per-folder`` says at how many folders' seeds ERM meets the constraints of its own
    folder's chosen constrained point (its ε, the folder's tolerance), as one job's report
    does: it said only the constrained count."""

    def record(constrained, val, losses):
        return {
            "model": "m", "layers": 2, "gamma_train": 0.1, "constrained": constrained,
            "seed": 0, "label": f"m {constrained}", "val_objective": val, "diverged": False,
            "hparams": {"epsilon": 0.1}, "layer_loss_val": losses, "feasible": True,
            "loss_decreases_val": True, "loss_decreases": True,
        }  # fmt: skip

    descends, stalls = [1.0, 0.8, 0.6], [1.0, 0.95, 0.5]  # layer 1: 0.95 > 0.9
    runs = [
        [record(True, 1.0, descends), record(False, 1.2, stalls)],
        [record(True, 1.1, descends), record(False, 1.3, [1.0, 0.85, 0.7])],
    ]
    text = combine_toy_folders(tmp_path, runs, config={"seed": 0, "tolerance": 0.0})
    assert "constrained feasible at 2 of 2, ERM at 1 of 2 (the same constraints)" in text, text
    # a looser tolerance, read from each folder's results.json, admits the stalled layer
    (tmp_path / "loose").mkdir()
    loose = combine_toy_folders(tmp_path / "loose", runs, config={"seed": 0, "tolerance": 0.1})
    assert "ERM at 2 of 2 (the same constraints)" in loose, loose


def test_per_folder_names_the_gamma_train_of_each_settings_lines(tmp_path):
    """Folders that train a model at two γ_train (a sweep of it): each γ_train is its own
    choice and comparison, and ``--per-folder``'s lines say which (its point is "each folder's
    chosen point", which names no γ_train): they read as one setting's twice, opposite claims
    under one name ("m-2: chosen constrained ... acc +0.5" and "m-2: ... acc -0.5")."""

    def record(constrained, gamma, f):
        acc = 0.5 + (0.5 if gamma == 0 else -0.5) * constrained + 0.01 * f * constrained
        return {
            "model": "m", "layers": 2, "gamma_train": gamma, "constrained": constrained,
            "seed": 5, "label": f"m {constrained} {gamma}", "val_objective": 0.1 + gamma,
            "diverged": False, "hparams": {"gamma_train": gamma}, "feasible": True,
            "loss_decreases_val": True, "loss_decreases": True, "interval_metrics": ["acc"],
            "acc": acc,
        }  # fmt: skip

    runs = [[record(c, g, f) for c in (True, False) for g in (0.0, 1.0)] for f in range(3)]
    text = combine_toy_folders(
        tmp_path, runs, config={"seed": 5, "sweeps": {"gamma_train": [0, 1]}}
    )
    for gamma in (0, 1):
        for kind in ("constrained", "ERM"):
            assert f"m-2 at gamma_train={gamma} {kind}: a point chosen in 3 of 3 folders" in text
    lines = {x.split(":")[0]: x for x in text.splitlines() if ": chosen constrained" in x}
    assert sorted(lines) == ["m-2 at gamma_train=0", "m-2 at gamma_train=1"], text
    assert "acc +0.51 [" in lines["m-2 at gamma_train=0"]
    assert "acc -0.49 [" in lines["m-2 at gamma_train=1"]


def test_a_penalty_run_records_no_dual_steps_and_an_earlier_folder_joins_a_later(tmp_path):
    """--formulation penalty has no multipliers: its runs record None for --dual-lr (the dual
    knobs, cudt.knobs: Knob.acts), which acts on nothing there. A folder an earlier cudt wrote,
    recording --dual-lr under penalty, is read as a later one records it, so the seeds of the
    two are one setting's: intervals over both, not two points of one seed each."""
    from cudt.runner.combine import load_results

    source = tmp_path / "both"
    argv = ["--seeds", "2", "--steps", "4", "--kinds", "constrained", "--formulation", "penalty"]
    results = toy(argv, source)
    assert {r["hparams"]["dual_lr"] for r in results["runs"]} == {None}
    assert {r["hparams"]["nupi_kp"] for r in results["runs"]} == {None}
    folders = []
    for seed in (0, 1):  # the job's two seeds as two folders
        folder = tmp_path / f"seed{seed}"
        folder.mkdir()
        runs = [r for r in results["runs"] if r["seed"] == seed]
        if seed == 0:  # as an earlier cudt recorded it
            runs = [r | {"hparams": r["hparams"] | {"dual_lr": 0.2}} for r in runs]
        kept = {k: results[k] for k in ("experiment", "config", "provenance")}
        (folder / "results.json").write_text(json.dumps(kept | {"runs": runs}))
        folders.append(folder)
    assert {r["hparams"]["dual_lr"] for r in load_results(folders[0])["runs"]} == {None}
    text = combine_folders(ToyTask(), folders)
    (line,) = [x for x in text.splitlines() if x.startswith("toy-2 constrained: mean [95% ")]
    assert "over 2 seeds" in line, text


def test_folders_of_one_draw_list_their_runs_as_one_job_over_their_seeds(tmp_path, capsys):
    """``--data-seed 0`` jobs of seeds 0-1 and 2-3 report as the one job of seeds 0-3: each
    setting's seeds together (they were listed folder by folder: ERM 0, 1, constrained 0, 1,
    ERM 2, 3, …)."""

    def rows(text: str) -> list[str]:
        return [x for x in text.splitlines() if x.startswith("  toy ")]

    base = ["--data-seed", "0", "--steps", "4"]
    toy([*base, "--seeds", "4"], tmp_path / "one")
    one_job = rows(capsys.readouterr().out)
    toy([*base, "--seeds", "2"], tmp_path / "a")
    toy([*base, "--seed", "2", "--seeds", "2"], tmp_path / "b")
    joined = rows(combine_folders(ToyTask(), [tmp_path / "a", tmp_path / "b"]))
    assert [x.split()[2:4] for x in joined] == [
        [kind, str(seed)] for kind in ("ERM", "constrained") for seed in range(4)
    ]
    assert joined == one_job
