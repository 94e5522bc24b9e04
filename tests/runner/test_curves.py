"""Training curves: TensorBoard event files read back exactly, the PNG drawn, bad input refused."""

import math
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from cudt.runner.curves import plot_training_curves, write_tensorboard

L = 2  # layers: per-layer curves have L+1 = 3 columns


def make_run(label, group="ut-2", constrained=True, k=5, seed=0, slacks=False, diverge=None):
    rng = np.random.default_rng(seed)
    steps = [10 * j for j in range(k)]
    layer_loss = (1.0 + rng.random((k, L + 1))).tolist()
    constraint = rng.normal(0.0, 0.1, (k, L + 1)).tolist()
    lam = (rng.random((k, L + 1)) if constrained else np.zeros((k, L + 1))).tolist()
    curves = {
        "step": steps,
        "objective": rng.random(k).tolist(),
        "lagrangian": rng.random(k).tolist(),
        "layer_loss": layer_loss,
        "constraint": constraint,
        "multipliers": lam,
    }
    if slacks:
        curves["slacks"] = rng.random((k, L + 1)).tolist()
    if diverge is not None:
        curves["objective"][diverge:] = [None] * (k - diverge)
        curves["lagrangian"][diverge] = float("nan")
        for j in range(diverge, k):
            curves["constraint"][j] = [None, float("nan"), None]
            curves["multipliers"][j] = [float("nan")] * (L + 1)
    return {"label": label, "group": group, "constrained": constrained, "curves": curves}


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the folder's event file, by tag: [(step, value)], via TFRecord framing."""
    files = list(run_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    data = files[0].read_bytes()
    out: dict[str, list[tuple[int, float]]] = {}
    pos = 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        assert hcrc == masked_crc32c(header)
        body = data[pos + 12 : pos + 12 + length]
        (bcrc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert bcrc == masked_crc32c(body)
        pos += 16 + length
        event = Event.FromString(body)
        if event.HasField("summary"):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert pos == len(data)
    return out


def f32(x):
    return float(np.float32(np.nan if x is None else x))


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_tensorboard_scalars_read_back_exactly(tmp_path):
    runs = [
        make_run("ut-2 constrained seed 0", slacks=True),
        make_run("ut-2 ERM seed 0", constrained=False, seed=1),
        make_run("ut-2 constrained seed 2 diverged", seed=2, diverge=3),
    ]
    dirs = write_tensorboard(runs, tmp_path / "tb")
    assert [d.parent for d in dirs] == [tmp_path / "tb"] * 3
    for run, run_dir in zip(runs, dirs, strict=True):
        got = read_scalars(run_dir)
        c = run["curves"]
        want = {"train/objective": c["objective"], "train/lagrangian": c["lagrangian"]}
        for li in range(L + 1):
            want[f"layer_loss/l{li}"] = [row[li] for row in c["layer_loss"]]
            want[f"constraint/g{li}"] = [row[li] for row in c["constraint"]]
            want[f"multiplier/lambda{li}"] = [row[li] for row in c["multipliers"]]
            if "slacks" in c:
                want[f"slack/u{li}"] = [row[li] for row in c["slacks"]]
        assert set(got) == set(want)
        for tag, values in want.items():
            assert [s for s, _ in got[tag]] == c["step"], tag
            for (_, v), w in zip(got[tag], values, strict=True):
                assert same(v, f32(w)), (tag, v, w)
    # The diverged run: finite up to step 20, NaN from step 30 on.
    obj = read_scalars(dirs[2])["train/objective"]
    assert all(math.isfinite(v) for s, v in obj if s < 30)
    assert all(math.isnan(v) for s, v in obj if s >= 30)
    # Rewriting replaces the run's event file instead of adding a second one.
    assert write_tensorboard(runs[:1], tmp_path / "tb") == dirs[:1]
    assert len(list(dirs[0].glob("events.out.tfevents.*"))) == 1
    assert not [p for p in (tmp_path / "tb").iterdir() if p.name.startswith(".")]


def test_the_event_writer_does_not_load_pytorch(tmp_path):
    """tensorboardX's writer imports torch, seconds of every run's start, for tensors cudt
    never passes: in a fresh process (torch is installed with the test extras) the events are
    written, torch stays unloaded, and it still imports afterwards."""
    import subprocess
    import sys

    run = make_run("a")
    code = (
        "import sys; from cudt.runner.curves import write_tensorboard; "
        f"write_tensorboard([{run!r}], {str(tmp_path / 'tb')!r}); "
        "assert 'torch' not in sys.modules, 'torch loaded'; import torch; print(torch.ones(2).sum())"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tensor(2.)" in done.stdout
    assert read_scalars(tmp_path / "tb" / "a")["train/objective"]


def test_unsafe_and_clashing_labels_get_distinct_single_folders(tmp_path):
    labels = ["a/b c", "a b/c", "a_b_c", "A/B C", "../..", "", "a/b c"]
    dirs = write_tensorboard([make_run(label, k=2) for label in labels], tmp_path)
    assert len({d.name.casefold() for d in dirs}) == len(labels)
    for d in dirs:
        assert d.parent == tmp_path and d.is_dir()
        assert "/" not in d.name and " " not in d.name and not d.name.startswith(".")
        assert len(list(d.glob("events.out.tfevents.*"))) == 1
    assert dirs[0].name == "a_b_c"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(d.name for d in dirs)


def test_plot_training_curves_draws_a_png(tmp_path):
    runs = [
        make_run("ut-2 ERM seed 0", constrained=False, k=40),
        make_run("ut-2 constrained seed 0", k=40, seed=1),
        make_run("ut-2 constrained seed 1 (diverged)", k=40, seed=2, diverge=25),
        make_run("ut-4 constrained seed 0", group="ut-4", k=40, seed=3),
    ]
    path = tmp_path / "curves.png"
    plot_training_curves(runs, path, title="training curves")
    img = Image.open(path)
    img.load()
    assert img.format == "PNG"
    w, h = img.size
    assert w > 800 and h > 500  # two rows of two panels
    colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colors) > 100
    assert not [p for p in tmp_path.iterdir() if p.name != "curves.png"]  # no temp left behind


def test_a_sweep_with_more_runs_than_linestyles_gets_a_row_per_point(tmp_path):
    """27 runs of one group (ERM and 8 sweep points x 3 seeds) once shared one row: the legend
    squeezed the panels to nothing and runs repeated each other's linestyles. Each point now has
    its own row, ERM its own (not point 0's: tuned ERM lanes number their points as the
    constrained ones do, and sat in rows named after another setting), and each row is at
    least as tall as before."""
    from cudt.runner.curves import _LINESTYLES, _rows

    runs = [make_run(f"ut-5 ERM seed {s}", constrained=False, seed=s) for s in range(3)]
    for p, (eps, dlr) in enumerate((e, d) for e in (0.02, 0.05, 0.1, 0.2) for d in (10, 100)):
        for s in range(3):
            runs.append(make_run(f"ut-5 constrained seed {s} eps={eps} dlr={dlr}", seed=s))
            runs[-1]["sweep_point"] = p
    for run in runs:
        run["group"] = "ut-5"
    rows = _rows({"ut-5": [(run, None) for run in runs]})
    assert list(rows) == [
        f"ut-5 constrained eps={e} dlr={d}" for e in (0.02, 0.05, 0.1, 0.2) for d in (10, 100)
    ] + ["ut-5 ERM"]
    assert all(len(group) <= len(_LINESTYLES) for group in rows.values())
    assert [run["label"] for run, _ in rows["ut-5 ERM"]] == [f"ut-5 ERM seed {s}" for s in range(3)]
    # tuned ERM lanes at the constrained lanes' point numbers: a row of their own, named by them
    tuned = [dict(run, sweep_point=1, label=f"{run['label']} lr=0.002") for run in runs[:3]]
    rows = _rows({"ut-5": [(run, None) for run in tuned + runs[3:]]})
    assert [run["label"] for run, _ in rows["ut-5 ERM lr=0.002"]] == [r["label"] for r in tuned]
    assert all(r["constrained"] for r, _ in rows["ut-5 constrained eps=0.02 dlr=100"])
    assert sum(len(group) for group in rows.values()) == len(runs)
    # a group that fits the linestyles keeps its one row, whatever its sweep points, and so
    # does a group of many seeds of one point and kind; many seeds of ERM and constrained at
    # one point get a row per kind (in one row an ERM run took a constrained run's linestyle)
    assert list(_rows({"ut-5": [(run, None) for run in runs[:6]]})) == ["ut-5"]
    seeds = [dict(run, sweep_point=0) for run in runs[:9]]
    assert list(_rows({"ut-5": [(run, None) for run in seeds]})) == [
        "ut-5 constrained eps=0.02 dlr=10",
        "ut-5 ERM",
    ]
    many = [dict(run, sweep_point=0, label=f"ut-5 constrained seed {i}") for i, run in
            enumerate(runs[3:12])]  # fmt: skip
    assert list(_rows({"ut-5": [(run, None) for run in many]})) == ["ut-5"]

    path = tmp_path / "sweep.png"
    plot_training_curves(runs, path)
    w, h = Image.open(path).size
    assert h > 9 * 300  # nine rows, none collapsed


def test_ragged_or_malformed_input_raises(tmp_path):
    run = make_run("r", k=4)
    run["curves"]["constraint"][2] = [0.0, 0.1]
    with pytest.raises(ValueError, match="ragged"):
        write_tensorboard([run], tmp_path / "tb")
    assert not (tmp_path / "tb").exists()  # refused before writing anything
    with pytest.raises(ValueError, match="ragged"):
        plot_training_curves([run], tmp_path / "x.png")

    run = make_run("r", k=4)
    run["curves"]["objective"].pop()
    with pytest.raises(ValueError, match="objective"):
        plot_training_curves([run], tmp_path / "x.png")

    run = make_run("r", k=4)
    run["curves"]["multipliers"] = [row + [0.0] for row in run["curves"]["multipliers"]]
    with pytest.raises(ValueError, match="columns"):
        write_tensorboard([run], tmp_path / "tb")

    run = make_run("r", k=4)
    del run["curves"]["layer_loss"]
    with pytest.raises(ValueError, match="layer_loss"):
        write_tensorboard([run], tmp_path / "tb")
    with pytest.raises(ValueError, match="at least one run"):
        plot_training_curves([], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_the_layer_loss_plot_starts_at_the_runs_first_state(tmp_path, closed_figures):
    """A run whose problem starts at state 1 (the LLM's --reference-state block1) is drawn
    from layer 1, so its x axis is the model's; a run without ``first_state`` from layer 0."""
    from cudt.runner import plots

    base = dict(model="llm", layers=3, seed=0, test_gamma=[0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=False, layer_loss=[[4.0, 3.0, 2.0]], first_state=1),
        dict(base, constrained=True, model="ut", layer_loss=[[4.0, 3.0, 2.0, 1.0]]),
    ]
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png")
    assert (tmp_path / "layer_loss.png").read_bytes()[:4] == b"\x89PNG"
    llm, ut = closed_figures[0].axes
    assert list(llm.lines[0].get_xdata()) == [1, 2, 3]
    assert list(ut.lines[0].get_xdata()) == [0, 1, 2, 3]


def test_lanes_not_chosen_are_drawn_faint_under_their_own_legend_entry(tmp_path, closed_figures):
    """Tuned lanes: the chosen lane of each kind at full strength, the others thin and faint
    under "<kind>, lanes not chosen"; a run with no choice made (no ``chosen`` key) as before."""
    from cudt.runner import plots

    base = dict(model="ut", layers=2, seed=0, test_gamma=[0.0, 0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=False, chosen=True, layer_loss=[[3, 2, 1]] * 2, rmse=[1, 2]),
        dict(base, constrained=False, chosen=False, layer_loss=[[3, 4, 5]] * 2, rmse=[1, 3]),
        dict(base, constrained=True, layer_loss=[[3, 2, 1.5]] * 2, rmse=[1, 2]),
    ]
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png")
    plots.plot_metric_vs_gamma(runs, tmp_path / "rmse.png", key="rmse", ylabel="RMSE")
    for fig in closed_figures:
        (ax,) = fig.axes
        chosen, faint, plain = ax.lines[:3]
        assert chosen.get_alpha() == plain.get_alpha() > faint.get_alpha()
        assert chosen.get_linewidth() > faint.get_linewidth()
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[:3] == ["ERM", "ERM, lanes not chosen", "constrained"]


def test_each_diverged_lane_is_named_apart_in_the_legend(tmp_path, closed_figures):
    """Two ε lanes of one seed that both diverged: each named with its swept values (they read
    "constrained seed 0: diverged" twice); a run without swept values by kind and seed."""
    from cudt.runner import plots

    base = dict(model="ut", layers=2, seed=0, test_gamma=[0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=False, label="ut-2 ERM seed 0", layer_loss=[[3, 2, 1]]),
        *(
            dict(base, constrained=True, diverged=True, label=f"ut-2 constrained seed 0 {lane}")
            for lane in ("eps=0.02", "eps=0.05 dlr=10")
        ),
        dict(base, constrained=True, seed=1, diverged=True, label="ut-2 constrained seed 1"),
    ]
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png")
    (ax,) = closed_figures[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "ERM",
        "constrained seed 0 eps=0.02: diverged",
        "constrained seed 0 eps=0.05 dlr=10: diverged",
        "constrained seed 1: diverged",
    ]


def test_a_long_title_is_wrapped_to_a_one_panel_figure(tmp_path, closed_figures):
    """The LLM's accuracy plot title (58 characters) ran off both edges of its 5-inch figure."""
    from cudt.runner import plots

    title = "mean token accuracy vs embedding noise (γ > γ_train: OOD)"
    runs = [
        dict(model="llm", layers=2, seed=0, constrained=k, gamma_train=0.5,
             test_gamma=[0.0, 1.0], accuracy=[0.7, 0.4])
        for k in (False, True)
    ]  # fmt: skip
    plots.plot_metric_vs_gamma(
        runs, tmp_path / "a.png", key="accuracy", ylabel="acc", gamma_train=0.5, title=title
    )
    fig = closed_figures[0]
    lines = fig._suptitle.get_text().replace("\xa0", " ").split("\n")
    assert len(lines) == 2 and " ".join(lines) == title
    assert lines[1] == "(γ > γ_train: OOD)"  # not broken inside "γ > γ_train'
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_figure_text_breaks_at_spaces_but_never_inside_a_relation_or_a_short_parenthesis():
    """The one wrapping rule of the runner's titles, the curves' panel titles and the paper's
    notes; a parenthesis longer than half a line breaks as prose (else it would be cut
    mid-word, as textwrap cuts a word longer than a line)."""
    from cudt.runner.plots import wrap_text

    def plain(text):
        return text.replace("\xa0", " ").split("\n")

    lines = plain(wrap_text("ut-3 constrained (eps = 0.05) at γ_train = 0.5", 24))
    assert lines == ["ut-3 constrained", "(eps = 0.05) at", "γ_train = 0.5"]
    long = "a note (" + "word " * 12 + "end) closes"
    lines = plain(wrap_text(long, 24))
    assert all(len(line) <= 24 for line in lines) and " ".join(lines) == long
    assert all(w in long.split() for line in lines for w in line.split())  # no word cut


def test_infeasible_runs_are_named_layers_are_whole_and_log_labels_plain(tmp_path, closed_figures):
    """The dashes of an infeasible constrained run are explained by its legend entry; the
    layer axis has whole-number ticks only; a loss axis spanning less than a decade is labelled
    in plain numbers (0.682), not 6.82×10⁻¹."""
    from cudt.runner import plots

    base = dict(model="ut", layers=3, seed=0, test_gamma=[0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=False, layer_loss=[[0.693, 0.680, 0.681, 0.683]]),
        dict(base, constrained=True, feasible=False, layer_loss=[[0.693, 0.685, 0.684, 0.686]]),
        dict(base, constrained=True, feasible=True, seed=1, layer_loss=[[0.69, 0.688, 0.687, 0.686]]),
    ]  # fmt: skip
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png", xlabel="state l (0: the input)")
    (ax,) = closed_figures[0].axes
    assert ax.get_xlabel() == "state l (0: the input)"  # the task's name for its states
    erm, infeasible, feasible = ax.lines[:3]
    assert infeasible.get_linestyle() == "--" and feasible.get_linestyle() == "-"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["ERM", "constrained, infeasible", "constrained"]
    closed_figures[0].canvas.draw()
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    _assert_y_labels_read_their_ticks(ax, at_least=2)


def _assert_y_labels_read_their_ticks(ax, at_least: int) -> None:
    """At least ``at_least`` y ticks (major and minor) labelled within the axis' view, each
    label its tick's value as a plain number (0.682, not 6.82×10⁻¹)."""
    low, high = ax.get_ylim()
    shown = {
        label.get_position()[1]: label.get_text()
        for label in ax.get_yticklabels(minor=True) + ax.get_yticklabels()
        if label.get_text() and low <= label.get_position()[1] <= high
    }
    assert len(shown) >= at_least, shown
    assert all(float(text) == pytest.approx(y, rel=1e-3) for y, text in shown.items()), shown


def test_a_loss_axis_with_two_of_the_usual_log_ticks_in_view_labels_finer_ones(
    tmp_path, closed_figures
):
    """Losses from 0.088 to 0.17 put two of the 1..9×10^k ticks in view (0.09, 0.1): the axis
    read two labels for a factor of 2; finer ticks (0.15) are labelled there now."""
    from cudt.runner import plots

    base = dict(model="ut", layers=3, seed=0, test_gamma=[0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=False, layer_loss=[[0.17, 0.12, 0.095, 0.088]]),
        dict(base, constrained=True, feasible=True, layer_loss=[[0.17, 0.11, 0.092, 0.089]]),
    ]
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png")
    (ax,) = closed_figures[0].axes
    closed_figures[0].canvas.draw()
    low, high = ax.get_ylim()
    assert 0.08 < low < 0.09 and 0.15 < high < 0.2  # two of 1..9×10^k in view: 0.09, 0.1
    _assert_y_labels_read_their_ticks(ax, at_least=3)
    wide = Figure().add_subplot()  # an axis over decades keeps matplotlib's own ticks
    wide.plot([0, 1], [0.01, 1.0])
    plots.log_y_axis(wide)
    minor = [t for t in wide.get_yticks(minor=True) if 0.01 <= t <= 1.0]
    np.testing.assert_allclose(minor, [a * 10.0**k for k in (-2, -1) for a in range(2, 10)])


def test_ratio_histogram_bins_span_the_ratios(tmp_path, closed_figures):
    """Ratios within a few percent of 1 (a classifier's) spread over the bins instead of one
    bar of a fixed [0, 2] axis; wide ratios (up to 3) are not cut at 2."""
    from cudt.runner import plots

    rng = np.random.default_rng(0)
    narrow = 1.0 + 0.02 * rng.standard_normal(500)
    wide = rng.uniform(0.2, 3.0, 500)
    plots.plot_ratio_histograms(
        {("ut", False): narrow, ("ut", True): narrow - 0.01, ("dust", False): wide},
        tmp_path / "ratio_hist.png",
    )
    assert (tmp_path / "ratio_hist.png").read_bytes()[:4] == b"\x89PNG"
    dust, ut = closed_figures[0].axes
    heights = [p.get_height() for p in ut.patches]
    assert sum(h > 0 for h in heights) > 20  # spread over many of the 60 bars
    left, right = ut.patches[0].get_x(), ut.patches[-1].get_x() + ut.patches[-1].get_width()
    assert 0.8 < left < 1.0 < right < 1.2
    assert dust.patches[-1].get_x() + dust.patches[-1].get_width() > 2.9
    # the legend under the axes, where it hides no bar; what the edge bins hold is said
    closed_figures[0].canvas.draw()
    assert ut.get_legend().get_window_extent().y1 < ut.get_window_extent().y0
    labels = [t.get_text() for t in ut.get_legend().get_texts()]
    assert all("in the edge bins" in label for label in labels), labels  # 0.5 % each side
    # two long legend labels side by side were wider than a one-panel figure: its axes
    # collapsed (matplotlib warned, constrained layout not applied); one column now
    closed_figures.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spread = 0.98 + 0.15 * rng.standard_normal(1200)  # a text run's, tails past the bins
        plots.plot_ratio_histograms(
            {("minilm-6", False): spread, ("minilm-6", True): spread * 0.99},
            tmp_path / "one.png",
            title="per-sample ratios ℓ_l / ℓ_(l−1) on the test set at γ_train = 0.5",
        )
    assert not [w for w in caught if "constrained_layout" in str(w.message)]
    # few ratios, few bins: 32 ratios (an LLM's) in 2 sqrt(32) = 11 bars, not 60 spikes
    closed_figures.clear()
    plots.plot_ratio_histograms({("llm", True): narrow[:32]}, tmp_path / "few.png")
    assert len(closed_figures[0].axes[0].patches) == 11


def test_ratio_histogram_pools_the_chosen_point_not_every_lane(tmp_path, monkeypatch):
    """The text and LLM tasks' ``ratio_hist.png`` pooled the ratios of every lane of a model
    (every ε swept) under one "constrained" entry, chosen or not: it pools the runs of the
    point the runner chose on validation now (``chosen: True``; ``False``: the other lanes,
    left out), over their seeds, and its legend says so; runs without a mark (no choice was
    made: the ERM runs here) are pooled as before."""
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from cudt.runner import plots
    from cudt.tasks.accuracy import AccuracyReports

    def run(constrained, seed, eps=None, chosen=None):
        hp = {"lr": 1e-3} | ({"epsilon": eps} if constrained else {})
        r = {"model": "ut", "layers": 3, "gamma_train": 0.5, "constrained": constrained}
        return r | {"seed": seed, "hparams": hp} | ({} if chosen is None else {"chosen": chosen})

    runs = [run(False, s) for s in (0, 1)]
    runs += [run(True, s, 0.05, chosen=True) for s in (0, 1)]
    runs += [run(True, s, 0.2, chosen=False) for s in (0, 1)]
    lane = {0.05: 0.9, 0.2: 1.5}  # the chosen lane's ratios and the other's, far apart
    ratios = [
        np.full((8, 3), lane[r["hparams"]["epsilon"]] if r["constrained"] else 1.0) for r in runs
    ]
    ratios[2][0, 0] = np.nan  # an excluded ratio: left out

    drawn = {}
    monkeypatch.setattr(plots, "plot_losses_and_metric", lambda *a, **k: [tmp_path / "a.png"] * 2)
    monkeypatch.setattr(
        plots, "plot_ratio_histograms", lambda by_run, path, **k: drawn.update(k, by_run=by_run)
    )
    cfg = SimpleNamespace(gamma_train=0.5)
    AccuracyReports().accuracy_figures(cfg, runs, ratios, tmp_path, noise="noise")
    constrained = drawn["by_run"][("ut-3", True)]
    assert constrained.size == 2 * 8 * 3 - 1 and np.all(constrained == 0.9)  # the chosen lane's
    assert drawn["by_run"][("ut-3", False)].size == 2 * 8 * 3  # no choice made: all kept
    assert drawn["names"] == {
        ("ut-3", False): "ERM, 2 seeds pooled",
        ("ut-3", True): "constrained, chosen point, 2 seeds pooled",
    }
    # no choice made among two lanes: both pooled, and the legend says so
    unmarked = [{k: v for k, v in r.items() if k != "chosen"} for r in runs[2:]]
    assert plots.pooled_ratios(unmarked, ratios[2:])[1] == {
        ("ut-3", True): "constrained, 2 lanes × 2 seeds pooled"
    }
    # the legend reads the names
    figs = []
    monkeypatch.undo()
    monkeypatch.setattr(plt, "close", figs.append)
    plots.plot_ratio_histograms(drawn["by_run"], tmp_path / "r.png", names=drawn["names"])
    labels = figs[0].axes[0].get_legend_handles_labels()[1]
    assert labels[1].startswith("constrained, chosen point, 2 seeds pooled (median 0.900, 100.0%")


def test_runs_at_several_gamma_trains_get_a_panel_each(tmp_path, closed_figures):
    """A sweep of γ_train drew both noise levels' runs in one panel, the title naming the
    config's one γ_train, and pooled their ratios into one histogram: each γ_train is a panel
    of its own now, with its own γ_train line, and the title says so."""
    from cudt.runner import plots

    runs = [
        dict(model="ut", layers=2, seed=0, constrained=c, gamma_train=g, test_gamma=[0.0, 0.5],
             layer_loss=[[3, 2, 1]] * 2, rmse=[1, 2 + g])
        for g in (0.09, 0.15) for c in (False, True)
    ]  # fmt: skip
    assert plots.gamma_train_text(runs, 0.15) == "each panel's γ_train"
    assert plots.gamma_train_text(runs[:2], 0.5) == "γ_train = 0.09"
    plots.plot_metric_vs_gamma(
        runs, tmp_path / "rmse.png", key="rmse", ylabel="RMSE", gamma_train=0.15
    )
    axes = closed_figures[0].axes
    assert [ax.get_title() for ax in axes] == ["ut-2, γ_train 0.09", "ut-2, γ_train 0.15"]
    for ax, g in zip(axes, (0.09, 0.15), strict=True):
        data = [line for line in ax.lines if line.get_marker() == "o"]
        assert len(data) == 2 and all(line.get_ydata()[1] == 2 + g for line in data)
        (vline,) = [line for line in ax.lines if line.get_linestyle() == ":"]
        assert list(vline.get_xdata()) == [g, g]
    one = [dict(r, gamma_train=0.15) for r in runs]
    assert plots.panel_names(one) == ["ut-2"] * len(one)  # one γ_train: the model's panel


def test_the_constrained_curve_is_drawn_over_a_control_it_equals(tmp_path, closed_figures):
    """Constrained DUST with its multipliers at 0 trains as the control dust-pl: drawn after
    it at the same zorder, its line vanished; it is on top now, and the control has squares."""
    from cudt.runner import plots

    base = dict(model="dust", layers=2, seed=0, test_gamma=[0.5], gamma_train=0.5)
    runs = [
        dict(base, constrained=True, layer_loss=[[3, 2, 1]]),
        dict(base, constrained=False, variant="ERM, per-layer dict. (control)", panel="dust",
             model="dust-pl", layer_loss=[[3, 2, 1]]),
    ]  # fmt: skip
    plots.plot_layer_losses(runs, tmp_path / "layer_loss.png")
    constrained, control = closed_figures[0].axes[0].lines[:2]
    assert constrained.get_zorder() > control.get_zorder()
    assert constrained.get_marker() == "o" and control.get_marker() == "s"


def test_constraint_zero_is_drawn_only_where_a_run_has_a_reference(tmp_path, closed_figures):
    """Without a reference bound (ERM, --reference none) column 0 is recorded as 0, no
    constraint: it was drawn as a flat g_0 = 0 under "0 = reference"; steps tick whole."""
    with_ref = make_run("ut-2 constrained seed 0", seed=1)
    with_ref["hparams"] = {"reference": 0.7}
    without = make_run("ut-2 ERM seed 0", constrained=False)
    without["hparams"] = {"reference": None}
    plot_training_curves([with_ref, without], tmp_path / "a.png")
    ax_lam, ax_g, bar = closed_figures[0].axes[:3]
    # constrained: L+1 g-lines and L+1 λ-lines; ERM: L g-lines (columns 1..L)
    assert len(ax_lam.lines) == L + 1
    assert len(ax_g.lines) == (L + 1) + L + 1  # + the g = 0 line
    assert bar.get_ylabel() == "constraint l (0 = reference)"
    closed_figures.clear()
    with_ref["hparams"] = {"reference": None}
    plot_training_curves([with_ref], tmp_path / "b.png")
    ax_lam, ax_g, bar = closed_figures[0].axes[:3]
    assert len(ax_g.lines) == L + 1 and len(ax_lam.lines) == L
    assert bar.get_ylabel() == "constraint l (no reference)"
    closed_figures[0].canvas.draw()
    assert all(float(t).is_integer() for t in ax_g.get_xticks())


def test_a_run_with_one_logged_step_is_drawn_as_points(tmp_path, closed_figures):
    """One logged step (or a finite point between non-finite ones) is no line: it is marked,
    so the legend never names a run the panels do not show."""
    from cudt.runner import curves

    erm = make_run("ut-2 ERM seed 0", constrained=False, k=1, seed=1)
    runs = [make_run("ut-2 constrained seed 0", k=1), erm]
    plot_training_curves(runs, tmp_path / "one.png")
    (fig,) = closed_figures
    lam, g = fig.axes[:2]
    marked = [line for line in lam.lines + g.lines if line.get_marker() == "."]
    # λ of the constrained run's constraints 1..L, g of both runs' (ERM's too)
    assert len(marked) == 3 * L and all(len(line.get_xdata()) == 1 for line in marked)
    assert curves._isolated(np.array([True, True, False, True, False])).tolist() == [
        False, False, False, True, False,
    ]  # fmt: skip
