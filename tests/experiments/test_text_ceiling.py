"""``python -m experiments.text_ceiling``: linear readers of the text task's tokens, fitted to
their optimum, chosen on validation, and blind to order exactly where they say so."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

from cudt.data.text import write_aclimdb
from cudt.data.text.generated import imdb_like_reviews
from cudt.data.text.tokenized import TokenizedSplit
from cudt.errors import UsageError
from cudt.runner.cli import config_from_args
from cudt.stats import paired_t_interval
from cudt.tasks.text import TextConfig
from experiments import text_ceiling


def _gradient(x, labels, k, c, params):
    """The gradient of mean cross-entropy + ‖W‖² / (2 C N) at ``params``, written out again."""
    w, b = params
    z = x @ w + b
    if k == 2:
        p = 1 / (1 + np.exp(-z[:, 0]))
        r = (p - labels)[:, None]
    else:
        p = np.exp(z - z.max(1, keepdims=True))
        r = p / p.sum(1, keepdims=True) - np.eye(k)[labels]
    n = x.shape[0]
    return np.concatenate([(x.T @ r / n + w / (c * n)).ravel(), r.sum(0) / n])


@pytest.mark.parametrize("k", [2, 3])
def test_fit_is_the_regularised_optimum(k):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 7))
    labels = (x[:, :k].argmax(1) if k > 2 else (x[:, 0] + 0.5 * rng.normal(size=60) > 0)).astype(
        int
    )
    for c in (0.1, 10.0):
        params, converged = text_ceiling.fit(x, labels, k, c)
        assert converged
        assert params[0].shape == (7, 1 if k == 2 else k)
        assert np.abs(_gradient(x, labels, k, c, params)).max() < 1e-6
    # a smaller C holds the weights nearer 0
    assert np.linalg.norm(text_ceiling.fit(x, labels, k, 0.1)[0][0]) < np.linalg.norm(
        text_ceiling.fit(x, labels, k, 10.0)[0][0]
    )


def _split(rows: list[list[int]], labels: list[int]) -> TokenizedSplit:
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return TokenizedSplit(ids, mask, np.asarray(labels, np.int32))


def test_order_free_readers_cannot_tell_ab_from_ba_and_the_pair_reader_can():
    # label 1: token 3 right before token 4 somewhere; label 0: 4 before 3; the same multiset
    # of tokens either way (2 is filler), so only a reader of order tells them apart
    rng = np.random.default_rng(1)

    def make(n):
        rows, mirrors, labels = [], [], []
        for _ in range(n):
            label = int(rng.integers(2))
            row = [2] * int(rng.integers(2, 6))
            at = int(rng.integers(len(row) + 1))
            rows.append(row[:at] + ([3, 4] if label else [4, 3]) + row[at:])
            mirrors.append(row[:at] + ([4, 3] if label else [3, 4]) + row[at:])
            labels.append(label)
        return _split(rows, labels), _split(mirrors, [1 - y for y in labels])

    (train, _), (val, _), (test, mirror) = make(80), make(40), make(40)
    splits = {"train": train, "val": val, "test": test}
    table = rng.normal(size=(6, 4))
    labels = {k: s.labels for k, s in splits.items()}
    presence = text_ceiling.features("word pieces present", splits, table)["train"]
    assert sp.issparse(presence) and presence.shape == (80, 3)  # the ids training holds: 2, 3, 4
    for reader, (_, ordered) in text_ceiling.READERS.items():
        x = text_ceiling.features(reader, splits, table)
        x_mirror = text_ceiling.features(reader, dict(splits, test=mirror), table)["test"]
        dense = [a.toarray() if sp.issparse(a) else a for a in (x["test"], x_mirror)]
        if ordered:  # reads the pairs, so it tells every row from its mirror
            assert (np.abs(dense[0] - dense[1]).sum(1) > 0).all(), reader
            assert text_ceiling.choose(x, labels, 2)["test_accuracy"] == 1.0, reader
        else:  # a row and its mirror (the other class) are one input
            np.testing.assert_array_equal(dense[0], dense[1], err_msg=reader)


def test_features_share_one_scale_set_on_the_training_split():
    splits = {
        "train": _split([[1, 2, 2], [3, 1]], [0, 1]),
        "val": _split([[1, 1, 1, 1]], [0]),
        "test": _split([[5]], [1]),
    }
    table = np.arange(12.0).reshape(6, 2)
    for reader in text_ceiling.READERS:
        x = text_ceiling.features(reader, splits, table)
        train = x["train"].toarray() if sp.issparse(x["train"]) else x["train"]
        assert np.mean(np.square(train).sum(1)) == pytest.approx(1.0), reader
    freq = text_ceiling.features("word-piece frequencies (count / length)", splits, table)
    scale = 1 / np.sqrt(((1 / 9 + 4 / 9) + (1 / 4 + 1 / 4)) / 2)  # rows (1/3, 2/3), (1/2, 1/2)
    # columns: the ids training holds (1, 2, 3); token 1 is the whole validation row, and the
    # test row's one token (5) is unseen in training, so it has no column
    np.testing.assert_allclose(freq["val"].toarray(), [[scale, 0, 0]])
    assert freq["test"].shape == (1, 3) and freq["test"].nnz == 0


def test_c_is_chosen_on_validation_and_test_only_reports():
    rng = np.random.default_rng(2)
    x = {k: rng.normal(size=(n, 5)) for k, n in (("train", 60), ("val", 30), ("test", 30))}
    labels = {k: (v[:, 0] + rng.normal(size=len(v)) > 0).astype(int) for k, v in x.items()}
    chosen = text_ceiling.choose(x, labels, 2, grid=(1e-3, 1.0, 1e3))
    shuffled = dict(labels, test=rng.permutation(labels["test"]))
    again = text_ceiling.choose(x, shuffled, 2, grid=(1e-3, 1.0, 1e3))
    assert (again["C"], again["val_accuracy"]) == (chosen["C"], chosen["val_accuracy"])
    assert chosen["val_accuracy"] == max(chosen["val_by_C"])
    # every C scoring the same on validation (one review far out on the labels' side, which
    # every fit reads right): the smallest is chosen
    far = {"val": np.eye(5)[:1] * 100.0}
    tie = text_ceiling.choose(dict(x, **far), dict(labels, val=np.ones(1, int)), 2, (1e-3, 1e3))
    assert tie["val_by_C"] == [1.0, 1.0] and tie["C"] == 1e-3


CELL = re.compile(r"\d\.\d{3} \(\d\.\d{3}, C [0-9.e+]+\*?\)")


def test_the_command_reads_each_seeds_draw_and_prints_the_table(tiny_bert, tmp_path, capsys):
    train, train_ratings = imdb_like_reviews(120, seed=0, stream=0, short=True)
    test, test_ratings = imdb_like_reviews(40, seed=0, stream=1, short=True)
    data = write_aclimdb(tmp_path, train, test, ratings=(train_ratings, test_ratings))
    common = ["--model", "ut", "--checkpoint", str(tiny_bert), "--dataset", "aclimdb"]
    common += ["--num-train", "100", "--num-test", "30", "--seeds", "2", "--max-length", "64"]
    argv = [*common, "--data-dir", str(data)]
    result = text_ceiling.run_ceiling(config_from_args(TextConfig, argv, "")[0], argv)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "seed 0" not in line]
    assert [line.split(" | ")[0][2:] for line in rows] == list(text_ceiling.READERS)
    for line in rows:  # two seeds, then the mean with its interval over them
        cells = line.strip("| ").split(" | ")
        assert all(CELL.fullmatch(c) for c in cells[2:4]), line
        assert re.fullmatch(r"\d\.\d{3} \[-?\d\.\d{3}, \d\.\d{3}\]", cells[4]), line
    assert "90 train / 10 validation / 30 test per seed" in out
    assert len(result["rows"]) == 2 * len(text_ceiling.READERS)
    draws = {s: [r["val_by_C"] for r in result["rows"] if r["seed"] == s] for s in (0, 1)}
    assert draws[0] != draws[1]  # each seed drew its own split
    assert out.split("\n\n")[1].startswith("`python -m experiments.text_ceiling --model ut ")
    one = dict(result, rows=[r for r in result["rows"] if r["seed"] == 0])
    table = text_ceiling.markdown(one).split("\n\n")[1]
    assert "mean (one seed: no interval)" in table and "[" not in table  # one seed: no interval
    assert "stopped short" not in out  # every fit converged on these
    short = dict(result, rows=[dict(r, unconverged=1) for r in result["rows"]])
    assert f"{len(result['rows'])} stopped short of the optimum" in text_ceiling.markdown(short)
    assert text_ceiling.main(argv) == 0  # the command line, as a user runs it: the same table
    again = capsys.readouterr().out
    assert [r for r in again.splitlines() if r.startswith("| ")] == [
        r for r in out.splitlines() if r.startswith("| ")
    ]
    capsys.readouterr()
    assert text_ceiling.main([*argv, "--gamma-train", "0.3"]) == 2  # a flag that would not act
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --gamma-train does not act here")
    # flags as the parser reads them: an abbreviation of one that acts is that flag (it was
    # refused as one that does not, found by review); of one that does not, named in full
    assert text_ceiling._read_only(["--num-tr", "10"]) == ["--num-tr", "10"]
    with pytest.raises(UsageError, match="^--gamma-train does not act here"):
        text_ceiling._read_only(["--gamma-tr", "0.3"])
    assert text_ceiling.main([*common, "--data-dir", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and err[0].startswith("error: aclImdb folder") and "does not exist" in err[0]
    )


def test_orders_gain_is_against_the_order_free_reader_best_on_validation_paired_over_seeds():
    """ "Order adds N points" needs a paired interval, and its baseline is chosen on validation:
    here the reader best on test (presence) is not the one best on validation (frequencies)."""
    names = list(text_ceiling.READERS)
    test = {names[0]: [0.80, 0.84, 0.82], names[1]: [0.70, 0.75, 0.71], names[2]: [0.6] * 3}
    test[names[3]] = [0.78, 0.86, 0.80]
    val = {names[0]: 0.7, names[1]: 0.9, names[2]: 0.5, names[3]: 0.8}
    rows = [
        {"reader": n, "seed": s, "test_accuracy": test[n][s], "val_accuracy": val[n]}
        for n in names
        for s in range(3)
    ]
    (_, line) = text_ceiling.order_gain_lines(rows, [0, 1, 2])
    iv = paired_t_interval(test[names[3]], test[names[1]])
    assert line == (
        f"Order: {names[3]} − {names[1]} (the order-free reader best on validation): "
        f"+0.093 [{iv.low:+.3f}, {iv.high:+.3f}], paired t over 3 seeds."
    )
    (_, one) = text_ceiling.order_gain_lines([r for r in rows if r["seed"] == 0], [0])
    assert one.endswith(": +0.080 (one seed: no interval).")
    # a gain whose interval spans 0 is level, as every claim line says (it printed the
    # interval alone: "+0.010 [-0.104, +0.124], paired t over 3 seeds.")
    for r in rows:
        if r["reader"] == names[3]:
            r["test_accuracy"] = [0.75, 0.71, 0.73][r["seed"]]
    (_, line) = text_ceiling.order_gain_lines(rows, [0, 1, 2])
    iv = paired_t_interval([0.75, 0.71, 0.73], test[names[1]])
    assert iv.low < 0 < iv.high
    assert line.endswith(f"+0.010 [{iv.low:+.3f}, {iv.high:+.3f}] level, paired t over 3 seeds.")


@pytest.mark.parametrize("flags", [["--gamma-train", "-1"], ["--update", "sideways"], ["--lr=x"]])
def test_a_flag_it_does_not_read_is_refused_before_its_value(capsys, flags):
    """A bad value of a flag text_ceiling ignores was reported as the value's fault, as if
    fixing it would make the flag act (review)."""
    assert text_ceiling.main(["--seeds", "1", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    name = flags[0].partition("=")[0]
    assert len(err) == 1 and err[0].startswith(f"error: {name} does not act here")


def test_help_lists_the_flags_it_reads_and_no_other(capsys):
    """--help listed every flag of the text task (--out, --steps, --dual-lr, ...), each refused
    as 'does not act here': it now lists the ones text_ceiling reads."""
    assert text_ceiling.main(["--help"]) == 0
    listed = set(re.findall(r"^  (--[a-z-]+)", capsys.readouterr().out, re.M))
    assert listed == {"--" + name.replace("_", "-") for name in text_ceiling.READ}
