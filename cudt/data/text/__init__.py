"""Text classification data for the perturbed-embedding experiments: synthetic, IMDb, MNLI.

A split is a :class:`TextSplit` of raw strings (one text, or a premise/hypothesis pair, per
example) and int32 labels; :func:`tokenize_split` turns it into ``(ids, mask)`` with the encoder's
tokenizer, the encoder maps ids to the embeddings that get perturbed.

Pipeline::

    source train split --seeded subset (num_train)--> pool --seeded val_fraction--> train / val
    source test split  --seeded subset (num_test)-->  test
    TextSplit --tokenize_split(encoder, split, max_length)--> ids [N, T] int32, mask [N, T] int32

Sources (``load_text_data(dataset=...)``):

* ``"synthetic"`` (default, no download): :func:`synthetic_sentiment`, generated mini movie
  reviews whose binary label follows from their content by the rule in
  :func:`synthetic_sentiment_score` (negation, intensifiers, contrast clauses, neutral filler).
* ``"imdb"``: TFDS ``imdb_reviews/plain_text`` (25k train / 25k test reviews, neg/pos). It
  records no movie, so the validation split holds single reviews (the data line says so).
* ``"mnli"``: TFDS ``glue/mnli`` (premise/hypothesis pairs; entailment/neutral/contradiction);
  *test* is ``validation_matched`` (the GLUE test labels are hidden). A ``data_dir`` holding
  MultiNLI's own ``.jsonl`` files or GLUE's ``MNLI/*.tsv`` is read without TFDS
  (:mod:`cudt.data.text.multinli`). Either way the validation split holds whole premises (by
  premise text: TFDS keeps no promptID, and one premise can be written under two).
* ``"aclimdb"``: the raw Stanford folder ``aclImdb/{train,test}/{pos,neg}/*.txt``, the same
  reviews as ``"imdb"`` without TFDS; validation holds whole movies where its
  ``urls_{neg,pos}.txt`` name them.

TFDS data is read from a prepared ``data_dir`` (``DATA_DIR/imdb_reviews/plain_text/1.0.0/``,
``DATA_DIR/glue/mnli/2.0.0/``) without TensorFlow: ``array_record`` and ``parquet`` through
``tfds``' own data sources, and ``tfrecord`` (what ``tfds build`` writes by default) through a
small TFRecord reader (:mod:`cudt.data.text.tfds`); the serialized examples are decoded by
``tfds``' numpy parser either way. Nothing is downloaded unless ``download=True``.

Modules: :mod:`~cudt.data.text.tokenized` (splits, tokens, length batches),
:mod:`~cudt.data.text.generated` (generated reviews and their word lists),
:mod:`~cudt.data.text.forum` (forum-style product reviews: a second generator for held-out
checks, never used to choose anything, written in the aclImdb layout),
:mod:`~cudt.data.text.aclimdb` (the aclImdb folder), :mod:`~cudt.data.text.multinli`
(MultiNLI's own files), :mod:`~cudt.data.text.tfds` (TFDS without TensorFlow), :mod:`~cudt.data.text.nli` (generated NLI pairs, tiny prepared-TFDS datasets).
:func:`load_text_data` is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cudt.data.text.aclimdb import _ACLIMDB_HINT, read_aclimdb, write_aclimdb
from cudt.data.text.forum import forum_reviews, write_forum
from cudt.data.text.generated import (
    _unique_synthetic,
    imdb_like_review,
    imdb_like_reviews,
    synthetic_sentiment,
    synthetic_sentiment_score,
)
from cudt.data.text.multinli import MULTINLI_LABELS, multinli_folder, read_multinli
from cudt.data.text.tfds import _TFDS, _load_tfds, load_tfds_text
from cudt.data.text.tokenized import (
    TextSplit,
    TextSplits,
    TokenizedSplit,
    length_batches,
    tokenize_split,
    tokenize_splits,
)
from cudt.errors import DataError

__all__ = [
    "TEXT_DATASETS",
    "TextSplit",
    "TextSplits",
    "TokenizedSplit",
    "forum_reviews",
    "imdb_like_review",
    "imdb_like_reviews",
    "length_batches",
    "load_text_data",
    "load_tfds_text",
    "read_aclimdb",
    "read_multinli",
    "source_fingerprint",
    "synthetic_sentiment",
    "synthetic_sentiment_score",
    "tokenize_split",
    "tokenize_splits",
    "write_aclimdb",
    "write_forum",
]

TEXT_DATASETS: tuple[str, ...] = ("synthetic", "imdb", "mnli", "aclimdb")

# Default sizes when num_train / num_test are not given: synthetic always, the real datasets use
# everything when None is passed explicitly.
_DEFAULT_NUM_TRAIN = 4000
_DEFAULT_NUM_TEST = 1000
_SYNTHETIC_LABEL_NAMES = ("negative", "positive")


# The data line's note where a review data set's validation split holds reviews one by one (no
# movie recorded: one movie's reviews can sit on both sides). It describes the split every
# version drew, so a run's fingerprint leaves it out (:func:`source_fingerprint`).
UNGROUPED = {
    "imdb": "; validation holds single reviews (TFDS imdb_reviews records no movie, so one "
    "movie's reviews can be in train and validation)",
    "aclimdb": "; validation holds single reviews (no urls_*.txt names their movies, so one "
    "movie's reviews can be in train and validation)",
}


def source_fingerprint(source: str) -> str:
    """``source`` (:attr:`TextSplits.source`, the data line) as a run's fingerprint records it:
    without the note :data:`UNGROUPED`, which names no change of the data (checkpoints written
    before the note resume)."""
    for note in UNGROUPED.values():
        source = source.replace(note, "")
    return source


def _grouping(dataset: str, pool: TextSplit, val: TextSplit) -> str:
    """The data line's words on what the validation split holds whole: aclImdb's movies (by
    its urls files), MNLI's premises (by their text, from either reader); or that it holds
    single reviews (:data:`UNGROUPED`)."""
    if val.groups is None:
        return UNGROUPED.get(dataset, "") if len(val) else ""
    whole, by = ("movies", "urls_*.txt") if dataset == "aclimdb" else ("premises", "premise text")
    return (
        f"; validation holds whole {whole} ({len(set(val.groups))} of "
        f"{len(set(pool.groups or ()))}, by {by})"
    )


# --------------------------------------------------------------------------------------------------
# All splits
# --------------------------------------------------------------------------------------------------


def _split_val(pool: TextSplit, val_fraction: float, seed: int) -> tuple[TextSplit, TextSplit]:
    """Seeded random ``(train, val)`` split of ``pool``: ``round(val_fraction * N)`` go to val (at
    least one when ``val_fraction > 0``), each part keeps the pool's order. A pool with
    ``groups`` (aclImdb's movies) gives val whole groups, drawn in a seeded order until they
    hold that many: a movie's reviews on both sides would make validation, which chooses, read
    reviews of movies trained on."""
    n = len(pool)
    n_val = int(round(val_fraction * n))
    if val_fraction > 0:
        n_val = max(n_val, 1)
    if n - n_val < 1:
        raise DataError(
            f"a training pool of {n} examples is too small to hold out val_fraction="
            f"{val_fraction}: use more training examples or a smaller val_fraction"
        )
    if pool.groups is not None:
        return _split_val_by_group(pool, n_val, seed)
    perm = np.random.default_rng([seed, 1]).permutation(n)
    return pool.take(np.sort(perm[n_val:])), pool.take(np.sort(perm[:n_val]))


def _split_val_by_group(pool: TextSplit, n_val: int, seed: int) -> tuple[TextSplit, TextSplit]:
    """:func:`_split_val` of a pool with ``groups``: whole groups to val until it holds
    ``n_val`` examples or more (never the whole pool)."""
    names, index = np.unique(np.asarray(pool.groups, dtype=object), return_inverse=True)
    counts = np.bincount(index, minlength=len(names))
    order = np.random.default_rng([seed, 1]).permutation(len(names))
    taken = np.cumsum(counts[order])
    chosen = order[: int(np.searchsorted(taken, n_val)) + 1] if n_val else order[:0]
    if len(chosen) == len(names):
        raise DataError(
            f"a training pool of {len(pool)} examples from {len(names)} movies is too small to "
            f"hold out {n_val} of them by movie: use more training examples or a smaller "
            "val_fraction"
        )
    val = np.isin(index, chosen)
    return pool.take(np.flatnonzero(~val)), pool.take(np.flatnonzero(val))


def _fewer_than_asked(n_pool: int, num_train: int | None, n_test: int, num_test: int | None) -> str:
    """The data line's note where the source holds fewer examples than asked: all of them are
    used, and the line says so (the requested counts are what ``results.json``'s config
    records)."""
    short = [
        f"{split} split holds {n} examples, fewer than the {asked} asked ({flag}): all used"
        for split, n, asked, flag in (
            ("the training", n_pool, num_train, "--num-train"),
            ("the test", n_test, num_test, "--num-test"),
        )
        if asked is not None and n < asked
    ]
    return "".join(f"; {line}" for line in short)


def _check_classes(train: TextSplit, label_names: Sequence[str]) -> None:
    """A :class:`DataError` where the training split holds one class alone (a tiny draw, or a
    folder missing a class): nothing can be learnt from it. A validation or test split of one
    class is said in the data line instead (a smoke test's few examples may be)."""
    present = np.unique(train.labels)
    if len(train) == 0 or len(present) > 1 or len(label_names) < 2:
        return
    raise DataError(
        f"the training split holds {len(train)} examples, all of class "
        f"{label_names[int(present[0])]!r}: there is nothing to learn; draw more (--num-train) "
        "or give the data folder every class"
    )


def _without_test_examples(pool: TextSplit, test: TextSplit) -> tuple[TextSplit, int]:
    """``pool`` without the examples whose text (and pair) is also a test example, and how many
    it drops: a source's train and test splits can hold the same review (IMDb does), which
    would be trained on or chosen on (validation) and then scored as held out."""
    pairs = test.pairs if test.pairs is not None else (None,) * len(test)
    seen = set(zip(test.texts, pairs, strict=True))
    mine = pool.pairs if pool.pairs is not None else (None,) * len(pool)
    keep = [i for i, key in enumerate(zip(pool.texts, mine, strict=True)) if key not in seen]
    if len(keep) == len(pool):
        return pool, 0
    return pool.take(np.asarray(keep, dtype=np.int64)), len(pool) - len(keep)


def _without_repeats(pool):
    """``pool`` with each repeated ``(text, pair)`` after its first left out (a real training
    split holds some exact repeats: one could land in train and its copy in validation, which
    chooses), and how many were."""
    mine = pool.pairs if pool.pairs is not None else (None,) * len(pool)
    first = {}
    for i, key in enumerate(zip(pool.texts, mine, strict=True)):
        first.setdefault(key, i)
    if len(first) == len(pool):
        return pool, 0
    return pool.take(np.asarray(sorted(first.values()), dtype=np.int64)), len(pool) - len(first)


def _multinli_splits(data_dir, num_train, num_test, seed) -> tuple:
    """``(pool, test, label names, source)`` of MultiNLI's own files in ``data_dir``."""
    folder, fmt = multinli_folder(data_dir)
    pool = read_multinli(folder, "train", max_examples=num_train, seed=seed)
    test = read_multinli(folder, "validation_matched", max_examples=num_test, seed=seed)
    source = (
        f"MultiNLI .{fmt} files in {folder}: train {len(pool)} -> train/val, dev_matched "
        f"{len(test)} -> test (seed={seed})"
    )
    return pool, test, MULTINLI_LABELS, source


def load_text_data(
    dataset: str = "synthetic",
    data_dir: str | Path | None = None,
    *,
    download: bool = False,
    num_train: int | None = _DEFAULT_NUM_TRAIN,
    num_test: int | None = _DEFAULT_NUM_TEST,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> TextSplits:
    """Train / val / test text splits of one source.

    ``num_train`` examples are drawn (seeded) from the source's training split into a pool, of
    which ``val_fraction`` (rounded) is held out as *val* and the rest is *train* (so
    ``num_train=2000, val_fraction=0.1`` gives 1800 / 200). ``num_test`` examples are drawn from
    the source's test split. ``None`` means all of it (``synthetic``: the defaults, 4000 / 1000).

    * ``"synthetic"``: :func:`synthetic_sentiment`, pool from stream 0 and test from stream 1
      with repeated texts skipped, so no review is in two splits; ``data_dir`` is not used.
    * ``"imdb"`` / ``"mnli"``: :func:`load_tfds_text` from ``data_dir``; IMDb ``train`` ->
      train/val, ``test`` -> test; MNLI ``train`` -> train/val, ``validation_matched`` -> test
      (MultiNLI's own files, where ``data_dir`` holds them: :func:`read_multinli`).
      ``download=True`` downloads and prepares missing data (otherwise missing data is a
      :class:`DataError` naming the fix).
    * ``"aclimdb"``: :func:`read_aclimdb` on ``data_dir``: ``train`` -> train/val, ``test`` ->
      test.
    """
    if dataset not in TEXT_DATASETS:
        raise DataError(f"unknown dataset {dataset!r}: valid names are {', '.join(TEXT_DATASETS)}")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}: pass e.g. 0.1")
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value is not None and value < 1:
            raise DataError(f"{name} must be >= 1 or None, got {value}: pass a positive count")

    mnli_files = dataset == "mnli" and data_dir is not None and multinli_folder(data_dir)
    if dataset == "synthetic":
        n_train = _DEFAULT_NUM_TRAIN if num_train is None else num_train
        n_test = _DEFAULT_NUM_TEST if num_test is None else num_test
        pool = _unique_synthetic(n_train, seed, 0, set())
        test = _unique_synthetic(n_test, seed, 1, set(pool.texts))
        label_names = _SYNTHETIC_LABEL_NAMES
        source = f"synthetic sentiment reviews (seed={seed}, pool={n_train}, test={n_test})"
    elif dataset == "aclimdb":
        if data_dir is None:
            raise DataError(f"dataset 'aclimdb' needs data_dir: {_ACLIMDB_HINT}")
        pool = read_aclimdb(data_dir, "train", max_examples=num_train, seed=seed)
        test = read_aclimdb(data_dir, "test", max_examples=num_test, seed=seed)
        label_names = ("neg", "pos")
        source = f"aclImdb folder {data_dir}: train {len(pool)}, test {len(test)} (seed={seed})"
    elif mnli_files:
        pool, test, label_names, source = _multinli_splits(data_dir, num_train, num_test, seed)
    else:
        spec = _TFDS[dataset]
        pool, where, n_pool = _load_tfds(
            dataset, data_dir, spec.train, download=download, max_examples=num_train, seed=seed
        )
        test, _, n_test = _load_tfds(
            dataset, data_dir, spec.test, download=download, max_examples=num_test, seed=seed
        )
        label_names = spec.label_names
        source = (
            f"TFDS {where}: {spec.train} {len(pool)} of {n_pool} -> train/val, {spec.test} "
            f"{len(test)} of {n_test} -> test (seed={seed})"
        )
    if dataset != "synthetic":  # (the generated pool and test share no text by construction)
        source += _fewer_than_asked(len(pool), num_train, len(test), num_test)
        pool, shared = _without_test_examples(pool, test)
        if shared:
            source += f"; {shared} training examples also in the test split left out"
        pool, repeated = _without_repeats(pool)
        if repeated:
            source += f"; {repeated} repeated training examples left out (train and val apart)"
    train, val = _split_val(pool, val_fraction, seed)
    source += _grouping(dataset, pool, val)
    _check_classes(train, label_names)
    for name, split in (("validation", val), ("test", test)):
        if len(split) and len(label_names) > 1 and len(np.unique(split.labels)) == 1:
            only = label_names[int(split.labels[0])]
            source += (
                f"; the {name} split holds class {only!r} alone ({len(split)} examples): a "
                "constant prediction scores its accuracy"
            )
    return TextSplits(
        train=train,
        val=val,
        test=test,
        num_classes=len(label_names),
        label_names=label_names,
        source=source,
    )
