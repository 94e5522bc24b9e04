"""Text data: the synthetic sentiment corpus, TFDS reading without TensorFlow, aclImdb, tokenizing.

The TFDS tests build tiny datasets with the real TFDS machinery (a ``GeneratorBasedBuilder`` with
the name, config, version and features of ``imdb_reviews`` / ``glue/mnli``, prepared with
``download_and_prepare``) in a temporary ``data_dir`` and read them through the same code as real
data. TFDS can only *write* TFRecord with TensorFlow, so the TFRecord case re-frames the records
TFDS wrote as array_record (the same serialized ``tf.Example`` bytes) into TFRecord files, as
TensorFlow would.
"""

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from cudt.data import (
    TEXT_DATASETS,
    DataError,
    TextSplit,
    load_text_data,
    load_tfds_text,
    read_aclimdb,
    synthetic_sentiment,
    synthetic_sentiment_score,
    tokenize_split,
)
from cudt.data.text import aclimdb, generated, source_fingerprint
from cudt.data.text import tfds as tfds_reader

# --------------------------------------------------------------------------------------------------
# Synthetic sentiment
# --------------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_per_seed_stream_and_index():
    a = synthetic_sentiment(30, seed=3)
    b = synthetic_sentiment(30, seed=3)
    assert a.texts == b.texts and np.array_equal(a.labels, b.labels)
    # Example i depends on (seed, stream, i) only: a shorter run is a prefix.
    short = synthetic_sentiment(7, seed=3)
    assert short.texts == a.texts[:7] and np.array_equal(short.labels, a.labels[:7])
    assert not set(a.texts) & set(synthetic_sentiment(30, seed=4).texts)
    assert not set(a.texts) & set(synthetic_sentiment(30, seed=3, stream=1).texts)
    assert a.pairs is None and a.labels.dtype == np.int32 and len(a) == 30


def test_synthetic_is_balanced_varied_and_labelled_by_the_rule():
    s = synthetic_sentiment(400, seed=0)
    assert s.labels.sum() == 200  # balanced
    assert len(set(s.texts)) >= 396  # almost no repeats
    scores = np.array([synthetic_sentiment_score(t) for t in s.texts])
    np.testing.assert_array_equal((scores > 0).astype(np.int32), s.labels)
    assert np.abs(scores).min() >= 0.5  # no ties
    lower = [t.lower() for t in s.texts]

    def frac(pattern):
        return np.mean([re.search(pattern, t) is not None for t in lower])

    assert frac(r"\b(not|never|hardly|barely|no|didn't|wasn't|isn't|weren't|aren't)\b") > 0.3
    assert frac(r", but ") > 0.2
    assert frac(r"^although |, although |, even though ") > 0.1
    assert frac(r"\b(very|extremely|truly|incredibly|remarkably|really|genuinely)\b") > 0.2
    assert frac(r"\b(somewhat|fairly|rather|mildly|slightly|moderately)\b") > 0.05
    assert frac(r"\b(follows|set in|minutes|watched it|subtitles|screening)\b") > 0.3
    words = np.array([len(t.split()) for t in s.texts])
    assert words.min() <= 6 and words.max() >= 50, (words.min(), words.max())
    # Many sentiment words in use, on both sides.
    vocab = {w for t in lower for w in re.findall(r"[a-z']+", t)}
    assert len(vocab & set(generated._POS_ADJ)) >= 30 and len(vocab & set(generated._NEG_ADJ)) >= 30


@pytest.mark.parametrize(
    "text, score",
    [
        ("The acting was superb.", 1.0),
        ("The acting was not superb.", -1.0),  # negation flips
        ("The acting wasn't superb.", -1.0),
        ("The acting was never dull.", 1.0),
        ("The plot was hardly clever.", -1.0),
        ("It was no masterpiece.", -1.0),
        ("I did not enjoy the ending.", -1.0),
        ("We never hated it.", 1.0),
        ("The score was very good.", 2.0),  # strong intensifier
        ("I truly loved it.", 2.0),
        ("The score was somewhat good.", 0.5),  # weak intensifier
        ("The acting was superb, but the plot was dull.", -1.0),  # the "but" clause dominates
        ("The acting was dull, but the plot was superb.", 1.0),
        ("The acting was dull, but the plot was not bad.", 1.0),
        ("Although the acting was superb, the plot was dull.", -1.0),
        ("The plot was dull, even though the acting was superb.", -1.0),
        ("It runs about 90 minutes. I had not heard of the director before.", 0.0),
        ("The acting was superb. The plot was dull. The ending was very moving.", 2.0),
        ("What a gem! It was a waste of time, but the cast was extremely lazy.", -1.0),
    ],
)
def test_rule_on_constructed_reviews(text, score):
    assert synthetic_sentiment_score(text) == score


def test_filler_sentences_carry_no_sentiment():
    rng = np.random.default_rng(0)
    for _ in range(300):
        sentence = generated._filler_sentence(rng)
        assert synthetic_sentiment_score(sentence) == 0.0, sentence
        assert not set(re.findall(r"[a-z']+", sentence.lower())) & set(generated._LEXICON)


def test_synthetic_splits_are_disjoint_sized_and_deterministic():
    sp = load_text_data(num_train=250, num_test=80, val_fraction=0.2, seed=1)
    assert (len(sp.train), len(sp.val), len(sp.test)) == (200, 50, 80)
    train, val, test = set(sp.train.texts), set(sp.val.texts), set(sp.test.texts)
    assert len(train) == 200 and len(val) == 50 and len(test) == 80
    assert not (train & val) and not (train & test) and not (val & test)
    assert sp.num_classes == 2 and sp.label_names == ("negative", "positive")
    assert "synthetic" in sp.source
    for split in (sp.train, sp.val, sp.test):
        assert 0.3 < split.labels.mean() < 0.7
        assert all(
            int(synthetic_sentiment_score(t) > 0) == y
            for t, y in zip(split.texts, split.labels, strict=True)
        )
    again = load_text_data(num_train=250, num_test=80, val_fraction=0.2, seed=1)
    assert again.train.texts == sp.train.texts and again.test.texts == sp.test.texts
    other = load_text_data(num_train=250, num_test=80, val_fraction=0.2, seed=2)
    assert not set(other.train.texts) & train


def test_load_text_data_rejects_bad_arguments(tmp_path):
    assert TEXT_DATASETS == ("synthetic", "imdb", "mnli", "aclimdb")
    with pytest.raises(DataError, match="unknown dataset 'sst2'.*synthetic, imdb, mnli, aclimdb"):
        load_text_data("sst2")
    with pytest.raises(DataError, match="val_fraction"):
        load_text_data(val_fraction=1.0)
    with pytest.raises(DataError, match="num_train"):
        load_text_data(num_train=0)
    with pytest.raises(DataError, match="too small"):
        load_text_data(num_train=1, num_test=1, val_fraction=0.5)
    with pytest.raises(DataError, match="aclimdb' needs data_dir"):
        load_text_data("aclimdb")
    with pytest.raises(DataError, match="same number"):
        TextSplit(texts=("a", "b"), pairs=None, labels=np.array([0]))


# --------------------------------------------------------------------------------------------------
# TFDS: tiny imdb_reviews / glue/mnli built locally
# --------------------------------------------------------------------------------------------------


def _imdb_example(i: int) -> dict:
    label = i % 2
    word = ("awful", "great")[label]
    return {"text": f"Review {i}: a {word} film.<br /><br />Second  line {i}.", "label": label}


def _mnli_example(split: str, i: int) -> dict:
    label = -1 if split.startswith("test") else i % 3
    return {
        "premise": f"{split} premise {i}.",
        "hypothesis": f"{split} hypothesis {i}.",
        "label": label,
        "idx": i,
    }


_IMDB_SIZES = {"train": 20, "test": 8, "unsupervised": 3}
_MNLI_SIZES = {"train": 15, "validation_matched": 6, "validation_mismatched": 4, "test_matched": 3}


class _ImdbReviews(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Same name, config, version and features as TFDS ``imdb_reviews``; tiny made-up content."""

    name = "imdb_reviews"
    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name="plain_text", version=tfds.core.Version("1.0.0"))
    ]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "text": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(names=["neg", "pos"]),
                }
            ),
            supervised_keys=("text", "label"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in _IMDB_SIZES}

    def _generate_examples(self, split):
        for i in range(_IMDB_SIZES[split]):
            ex = _imdb_example(i if split != "test" else 100 + i)
            if split == "unsupervised":
                ex["label"] = -1
            yield f"{split}{i}", ex


class _Glue(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Same name, ``mnli`` config, version and features as TFDS ``glue``; tiny content."""

    name = "glue"
    VERSION = tfds.core.Version("2.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="mnli", version=tfds.core.Version("2.0.0"))]

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "premise": tfds.features.Text(),
                    "hypothesis": tfds.features.Text(),
                    "label": tfds.features.ClassLabel(
                        names=["entailment", "neutral", "contradiction"]
                    ),
                    "idx": np.int32,
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in _MNLI_SIZES}

    def _generate_examples(self, split):
        for i in range(_MNLI_SIZES[split]):
            yield i, _mnli_example(split, i)


def _prepare(builder_cls, data_dir: Path, file_format: str) -> Path:
    builder = builder_cls(data_dir=str(data_dir), file_format=file_format)
    builder.download_and_prepare()
    return Path(str(builder.data_dir))


def _crc32c_bitwise(data: bytes) -> int:
    """CRC-32C bit by bit (independent of the table-driven one in the module)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _array_record_to_tfrecord(variant: Path) -> None:
    """Rewrite a prepared array_record dataset as TensorFlow writes TFRecord: same records, TFRecord
    framing (length, masked CRC32C, data, masked CRC32C), ``*.tfrecord-*`` shards, fileFormat."""
    builder = tfds.builder_from_directory(str(variant))
    info_file = variant / "dataset_info.json"
    meta = json.loads(info_file.read_text())
    for split in meta["splits"]:
        name = split["name"]
        raw = builder.as_data_source(
            name, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES
        )
        records = [bytes(raw[i]) for i in range(len(raw))]
        shards = sorted(variant.glob(f"{meta['name']}-{name}.array_record-*"))
        lengths = [int(n) for n in split["shardLengths"]]
        assert len(shards) == len(lengths) and sum(lengths) == len(records)
        start = 0
        for shard, n in zip(shards, lengths, strict=True):
            out = variant / shard.name.replace(".array_record-", ".tfrecord-")
            with open(out, "wb") as f:
                for rec in records[start : start + n]:
                    header = struct.pack("<Q", len(rec))
                    f.write(header + struct.pack("<I", _masked(_crc32c_bitwise(header))))
                    f.write(rec + struct.pack("<I", _masked(_crc32c_bitwise(rec))))
            start += n
            shard.unlink()
    meta["fileFormat"] = "tfrecord"
    info_file.write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def tfds_dirs(tmp_path_factory):
    """``{format: data_dir}`` with a tiny imdb_reviews in each format and glue/mnli in
    array_record (under the array_record dir) and tfrecord (under the tfrecord dir)."""
    dirs = {}
    for fmt in ("array_record", "parquet"):
        dirs[fmt] = tmp_path_factory.mktemp(f"tfds_{fmt}")
        _prepare(_ImdbReviews, dirs[fmt], fmt)
    _prepare(_Glue, dirs["array_record"], "array_record")
    dirs["tfrecord"] = tmp_path_factory.mktemp("tfds_tfrecord")
    shutil.copytree(dirs["array_record"], dirs["tfrecord"], dirs_exist_ok=True)
    _array_record_to_tfrecord(dirs["tfrecord"] / "imdb_reviews" / "plain_text" / "1.0.0")
    _array_record_to_tfrecord(dirs["tfrecord"] / "glue" / "mnli" / "2.0.0")
    return dirs


def test_crc32c_matches_the_standard_check_value():
    assert _crc32c_bitwise(b"123456789") == 0xE3069283
    assert tfds_reader._crc32c(b"123456789") == 0xE3069283
    assert tfds_reader._masked_crc32c(b"some bytes") == _masked(_crc32c_bitwise(b"some bytes"))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["array_record", "parquet", "tfrecord"])
def test_tfds_imdb_reads_every_example_without_tensorflow(tfds_dirs, fmt):
    import sys

    assert "tensorflow" not in sys.modules  # nothing here imports TensorFlow
    s = load_tfds_text("imdb", tfds_dirs[fmt], "train")
    assert len(s) == 20 and s.pairs is None and s.labels.dtype == np.int32
    expected = {aclimdb._clean_review(e["text"]): e["label"] for e in map(_imdb_example, range(20))}
    assert dict(zip(s.texts, s.labels.tolist(), strict=True)) == expected
    assert all("<br" not in t and "  " not in t for t in s.texts)
    assert "Review 3: a great film. Second line 3." in s.texts
    test = load_tfds_text("imdb", tfds_dirs[fmt], "test")
    assert len(test) == 8 and all(t.startswith("Review 1") for t in test.texts)
    # Unlabelled examples (label -1) are dropped.
    assert len(load_tfds_text("imdb", tfds_dirs[fmt], "unsupervised")) == 0


def test_tfds_subsample_is_seeded_and_the_same_in_every_format(tfds_dirs):
    picks = {}
    for fmt in ("array_record", "parquet", "tfrecord"):
        a = load_tfds_text("imdb", tfds_dirs[fmt], "train", max_examples=6, seed=5)
        b = load_tfds_text("imdb", tfds_dirs[fmt], "train", max_examples=6, seed=5)
        assert len(a) == 6 and a.texts == b.texts
        picks[fmt] = a.texts
    assert picks["array_record"] == picks["parquet"] == picks["tfrecord"]
    other = load_tfds_text("imdb", tfds_dirs["array_record"], "train", max_examples=6, seed=6)
    assert other.texts != picks["array_record"]


@pytest.mark.parametrize("fmt", ["array_record", "tfrecord"])
def test_load_text_data_imdb_and_mnli(tfds_dirs, fmt):
    sp = load_text_data("imdb", tfds_dirs[fmt], num_train=None, num_test=5, val_fraction=0.25)
    assert (len(sp.train), len(sp.val), len(sp.test)) == (15, 5, 5)
    assert not set(sp.train.texts) & set(sp.val.texts)
    assert sp.num_classes == 2 and sp.label_names == ("neg", "pos")
    assert f"imdb_reviews/plain_text:1.0.0 ({fmt})" in sp.source and "20 of 20" in sp.source
    # TFDS records no movie: the data line says validation holds reviews one by one (as the
    # aclImdb line names the movies it holds whole), a note a run's fingerprint leaves out
    note = "; validation holds single reviews (TFDS imdb_reviews records no movie, so"
    assert note in sp.source and note not in source_fingerprint(sp.source)
    assert source_fingerprint(sp.source).endswith("-> test (seed=0)")

    nli = load_text_data("mnli", tfds_dirs[fmt], num_train=12, num_test=None, val_fraction=0.25)
    assert (len(nli.train), len(nli.val), len(nli.test)) == (9, 3, 6)
    assert nli.num_classes == 3 and nli.label_names == ("entailment", "neutral", "contradiction")
    assert f"glue/mnli:2.0.0 ({fmt})" in nli.source
    for split in (nli.train, nli.val):
        for (premise, hypothesis), y in zip(split.inputs(), split.labels, strict=True):
            i = int(premise.split()[-1].rstrip("."))
            assert premise == f"train premise {i}." and hypothesis == f"train hypothesis {i}."
            assert y == i % 3
    assert all(p.startswith("validation_matched premise") for p in nli.test.texts)
    assert isinstance(nli.test.inputs()[0], tuple)
    # --data-dir given as the data set's own folder, one or two levels down: the same data
    for deeper in ("imdb_reviews", "imdb_reviews/plain_text"):
        again = load_text_data(
            "imdb", tfds_dirs[fmt] / deeper, num_train=None, num_test=5, val_fraction=0.25
        )
        assert again.test.texts == sp.test.texts and again.train.texts == sp.train.texts


def test_tfds_mnli_validation_holds_whole_premises(tmp_path):
    """glue/mnli keeps no promptID: a premise's hypotheses (three of each, as in MultiNLI) are
    kept together by the premise's text, so validation reads no premise trained on."""
    from cudt.data.text.nli import tfds_builder

    def split(name, n):
        texts = tuple(f"{name} premise {i // 3}." for i in range(n))
        return TextSplit(
            texts, tuple(f"{name} hypothesis {i}." for i in range(n)), np.arange(n) % 3
        )

    splits = {"train": split("train", 60), "validation_matched": split("dev", 9)}
    tfds_builder("mnli", splits)(
        data_dir=str(tmp_path), file_format="array_record"
    ).download_and_prepare()
    for seed in range(3):
        data = load_text_data(
            "mnli", tmp_path, num_train=None, num_test=None, val_fraction=0.2, seed=seed
        )
        assert set(data.train.texts).isdisjoint(data.val.texts)
        assert len(data.val) == 12 and len(data.train) == 48
        assert "validation holds whole premises (4 of 20, by premise text)" in data.source


def test_tfds_missing_data_fails_fast_and_names_the_fix(tmp_path):
    # No download is attempted (that would hang for minutes offline): the error comes at once.
    with pytest.raises(DataError) as err:
        load_tfds_text("imdb", tmp_path, "train")
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path) in msg
    assert "--download" in msg
    assert (
        f"tfds build imdb_reviews/plain_text --data_dir {tmp_path} --file_format array_record"
        in msg
    )
    with pytest.raises(DataError, match=r"no prepared glue/mnli.*tfds build glue/mnli"):
        load_text_data("mnli", tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists() and not list(tmp_path.iterdir())
    # an interrupted build's leftovers are no prepared data set
    left = tmp_path / "imdb_reviews" / "plain_text" / "incomplete.AB12CD_1.0.0"
    left.mkdir(parents=True)
    (left / "dataset_info.json").write_text("{}")
    with pytest.raises(DataError, match="no prepared imdb_reviews/plain_text"):
        load_tfds_text("imdb", tmp_path, "train")


def test_raw_files_given_to_the_other_reader_name_the_dataset_that_reads_them(tmp_path):
    """The Stanford aclImdb folder given to --dataset imdb (or a TFDS data folder to aclimdb)
    names the --dataset that reads it, not a `tfds build` into it; MultiNLI's own files given to
    the TFDS reader name the reader that reads them."""
    base = _write_aclimdb(tmp_path / "raw", n=1)
    for given in (base, base.parent):
        with pytest.raises(DataError) as err:
            load_text_data("imdb", given)
        assert "is the Stanford aclImdb folder, which --dataset aclimdb reads: pass " in str(
            err.value
        ) and f"--dataset aclimdb --data-dir '{given}'" in str(err.value)
        assert "tfds build" not in str(err.value)
    (tmp_path / "tfds" / "imdb_reviews" / "plain_text").mkdir(parents=True)
    with pytest.raises(DataError, match="pass --dataset imdb --data-dir '.*tfds'$"):
        load_text_data("aclimdb", tmp_path / "tfds")
    mnli = tmp_path / "multinli_1.0"
    mnli.mkdir()
    for name in ("train", "dev_matched", "dev_mismatched"):
        (mnli / f"multinli_1.0_{name}.jsonl").write_text('{"gold_label": "-"}\n')
    with pytest.raises(DataError, match=r"holds MultiNLI's own files \(multinli_1\.0_dev_match"):
        load_tfds_text("mnli", mnli, "train")  # load_text_data reads them: test_multinli_*
    assert sorted(p.name for p in mnli.iterdir())[0] == "multinli_1.0_dev_matched.jsonl"


def test_tfds_bad_split_format_and_dataset_name(tfds_dirs, tmp_path):
    with pytest.raises(DataError, match=r"no split 'validation'.*test, train, unsupervised"):
        load_tfds_text("imdb", tfds_dirs["array_record"], "validation")
    with pytest.raises(DataError, match="imdb, mnli"):
        load_tfds_text("sst2", tfds_dirs["array_record"], "train")
    # A format that needs TensorFlow to read: the error says to re-prepare as array_record.
    variant = tmp_path / "imdb_reviews" / "plain_text" / "1.0.0"
    shutil.copytree(tfds_dirs["tfrecord"] / "imdb_reviews" / "plain_text" / "1.0.0", variant)
    meta = json.loads((variant / "dataset_info.json").read_text())
    meta["fileFormat"] = "riegeli"
    (variant / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="riegeli.*without TensorFlow.*--file_format array_record"):
        load_tfds_text("imdb", tmp_path, "train")
    # The version folder itself is accepted as data_dir.
    variant = tfds_dirs["tfrecord"] / "imdb_reviews" / "plain_text" / "1.0.0"
    assert len(load_tfds_text("imdb", variant, "test")) == 8


def test_tfrecord_corruption_is_reported(tfds_dirs, tmp_path):
    shutil.copytree(tfds_dirs["tfrecord"] / "imdb_reviews", tmp_path / "imdb_reviews")
    shard = next((tmp_path / "imdb_reviews" / "plain_text" / "1.0.0").glob("*-train.tfrecord-*"))
    original = shard.read_bytes()
    data = bytearray(original)
    data[3] ^= 0xFF  # the first record's length
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt"):
        load_tfds_text("imdb", tmp_path, "train")
    shard.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(DataError, match="corrupt|truncated"):
        load_tfds_text("imdb", tmp_path, "train")
    # framing and checksums intact, the record itself garbage: one line, not protobuf's error
    records, rest = [], original
    while rest:
        (n,) = struct.unpack("<Q", rest[:8])
        records.append(rest[12 : 12 + n])
        rest = rest[16 + n :]
    records[0] = b"\xff" * len(records[0])
    with open(shard, "wb") as f:
        for rec in records:
            header = struct.pack("<Q", len(rec))
            f.write(header + struct.pack("<I", _masked(_crc32c_bitwise(header))))
            f.write(rec + struct.pack("<I", _masked(_crc32c_bitwise(rec))))
    with pytest.raises(DataError, match=r"cannot read the train split \(tfrecord\).*delete"):
        load_tfds_text("imdb", tmp_path, "train")


def test_damaged_array_record_shards_are_one_line(tfds_dirs, tmp_path):
    """An interrupted copy (a shard cut short) and a missing shard: a :class:`DataError`
    naming the split and the folder, not the reader's ``TypeError`` or ``RuntimeError``."""
    shutil.copytree(tfds_dirs["array_record"] / "imdb_reviews", tmp_path / "imdb_reviews")
    variant = tmp_path / "imdb_reviews" / "plain_text" / "1.0.0"
    shard = next(variant.glob("*-train.array_record-*"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(DataError, match=rf"'{re.escape(str(variant))}'.*(damaged|re-prepare)"):
        load_tfds_text("imdb", tmp_path, "train")
    next(variant.glob("*-test.array_record-*")).unlink()
    with pytest.raises(DataError, match=r"cannot read the test split \(array_record\)"):
        load_tfds_text("imdb", tmp_path, "test")


# --------------------------------------------------------------------------------------------------
# aclImdb folder
# --------------------------------------------------------------------------------------------------


def _write_aclimdb(root: Path, n: int = 4) -> Path:
    base = root / "aclImdb"
    for split in ("train", "test"):
        for name in ("neg", "pos"):
            folder = base / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                (folder / f"{i}_{7 if name == 'pos' else 2}.txt").write_text(
                    f"{split} {name} review {i}.<br /><br />It is café-good.", encoding="utf-8"
                )
    (base / "train" / "unsup").mkdir()
    (base / "train" / "unsup" / "0_0.txt").write_text("unlabelled")
    return base


def test_read_aclimdb(tmp_path):
    base = _write_aclimdb(tmp_path)
    s = read_aclimdb(tmp_path, "train")
    assert len(s) == 8 and s.labels.tolist() == [0] * 4 + [1] * 4
    assert s.texts[0] == "train neg review 0. It is café-good."
    assert all(("pos" in t) == bool(y) for t, y in zip(s.texts, s.labels, strict=True))
    assert read_aclimdb(base, "train").texts == s.texts  # the aclImdb folder itself works too
    sub = read_aclimdb(base, "test", max_examples=3, seed=1)
    assert len(sub) == 3 and set(sub.texts) <= set(read_aclimdb(base, "test").texts)
    assert sub.texts == read_aclimdb(base, "test", max_examples=3, seed=1).texts
    sp = load_text_data("aclimdb", tmp_path, num_train=None, num_test=None, val_fraction=0.25)
    assert (len(sp.train), len(sp.val), len(sp.test)) == (6, 2, 8)
    assert all(t.startswith("test") for t in sp.test.texts)


def test_read_aclimdb_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist.*aclImdb_v1.tar.gz"):
        read_aclimdb(tmp_path / "missing", "train")
    with pytest.raises(DataError, match="'train' or 'test'"):
        read_aclimdb(tmp_path, "unsup")
    with pytest.raises(DataError, match="no train/ folder"):
        read_aclimdb(tmp_path, "train")
    base = _write_aclimdb(tmp_path)
    for deep in (base / "train", base / "train" / "pos"):  # the folder to pass is named
        with pytest.raises(DataError, match=f"'{base}' holds it: pass --data-dir '{base}'"):
            read_aclimdb(deep, "train")
    shutil.rmtree(base / "test" / "pos")
    with pytest.raises(DataError, match="no pos/ folder"):
        read_aclimdb(tmp_path, "test")
    for f in (base / "train" / "neg").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"no \.txt reviews in .*neg"):
        read_aclimdb(tmp_path, "train")
    (base / "train" / "neg" / "9_1.txt").write_bytes(b"caf\xe9 latin-1 review")
    with pytest.raises(DataError, match=r"9_1\.txt' is not UTF-8"):
        read_aclimdb(tmp_path, "train")
    # an entry that is no readable file, and an empty review: named, not a traceback
    (base / "train" / "neg" / "9_1.txt").unlink()
    (base / "train" / "neg" / "9_1.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(DataError, match=r"review '.*9_1\.txt' cannot be read \(No such file"):
        read_aclimdb(tmp_path, "train")
    (base / "train" / "neg" / "9_1.txt").unlink()
    (base / "train" / "neg" / "9_1.txt").mkdir()
    with pytest.raises(DataError, match=r"9_1\.txt' cannot be read \(Is a directory"):
        read_aclimdb(tmp_path, "train")
    (base / "train" / "neg" / "9_1.txt").rmdir()
    (base / "train" / "neg" / "9_1.txt").write_text(" \n")
    with pytest.raises(DataError, match=r"9_1\.txt' is empty"):
        read_aclimdb(tmp_path, "train")
    (base / "train" / "neg" / "9_1.txt").write_text("<br /><br />  \n")  # tags alone: empty
    with pytest.raises(DataError, match=r"9_1\.txt' is empty"):
        read_aclimdb(tmp_path, "train")


def test_a_review_in_both_source_splits_is_held_out_not_trained_on(tmp_path):
    """A review that the source's train and test splits both hold (IMDb has some) is left out
    of train and val, and the data line says how many; without one the draw is unchanged."""
    base = _write_aclimdb(tmp_path, n=4)
    plain = load_text_data("aclimdb", base, num_train=None, num_test=None, val_fraction=0.25)
    assert "also in the test split" not in plain.source
    shutil.copy(base / "test" / "pos" / "1_7.txt", base / "train" / "pos" / "9_7.txt")
    sp = load_text_data("aclimdb", base, num_train=None, num_test=None, val_fraction=0.25)
    assert "; 1 training examples also in the test split left out" in sp.source
    assert not set(sp.test.texts) & (set(sp.train.texts) | set(sp.val.texts))
    assert len(sp.train) + len(sp.val) == len(plain.train) + len(plain.val)
    # a review the training split holds twice: once in train and val together, and said
    for copy in ("10_8.txt", "11_8.txt"):
        shutil.copy(base / "train" / "pos" / "0_7.txt", base / "train" / "pos" / copy)
    twice = load_text_data("aclimdb", base, num_train=None, num_test=None, val_fraction=0.25)
    assert "; 2 repeated training examples left out" in twice.source
    kept = twice.train.texts + twice.val.texts
    assert len(set(kept)) == len(kept) == len(sp.train) + len(sp.val)


def test_validation_holds_whole_movies_where_the_urls_files_name_them(tmp_path):
    """The archive's urls_{neg,pos}.txt name each review's movie (line i: <i>_<rating>.txt):
    validation, carved from train, holds whole movies, so it never reads a review of a movie
    trained on (it did review by review). Without the files the split is the one before."""
    base = _write_aclimdb(tmp_path, n=40)
    before = load_text_data("aclimdb", base, num_train=None, num_test=None, val_fraction=0.2)
    assert before.val.groups is None and "whole movies" not in before.source
    assert "; validation holds single reviews (no urls_*.txt names" in before.source
    old = np.random.default_rng([0, 1]).permutation(80)[:16]  # the per-review draw, unchanged
    pool = read_aclimdb(base, "train")
    assert before.val.texts == pool.take(np.sort(old)).texts
    for name in ("neg", "pos"):  # 5 reviews a movie, as the archive's up to 30
        lines = [f"http://www.imdb.com/title/tt{name}{i // 5}/usercomments" for i in range(40)]
        (base / "train" / f"urls_{name}.txt").write_text("\n".join(lines) + "\n")
    for seed in range(4):
        sp = load_text_data(
            "aclimdb", base, num_train=None, num_test=None, val_fraction=0.2, seed=seed
        )
        assert not set(sp.train.groups) & set(sp.val.groups)
        assert len(sp.val) == 20 and len(sp.train) == 60  # 16 asked: 4 whole movies
        assert "; validation holds whole movies (4 of 16, by urls_*.txt)" in sp.source
    (base / "train" / "pos" / "40_9.txt").write_text("a review past the urls file's lines")
    with pytest.raises(DataError, match=r"40_9\.txt' has no line in urls_pos\.txt \(40 lines"):
        read_aclimdb(base, "train")
    (base / "train" / "pos" / "40_9.txt").unlink()
    (base / "train" / "urls_neg.txt").unlink()
    with pytest.raises(DataError, match="has urls_pos.txt but no urls_neg.txt"):
        read_aclimdb(base, "train")


def test_a_urls_file_that_is_not_utf8_is_one_line(tmp_path):
    base = _write_aclimdb(tmp_path)
    for name in ("neg", "pos"):
        (base / "train" / f"urls_{name}.txt").write_text("http://a\nhttp://b\n" * 2)
    (base / "train" / "urls_neg.txt").write_bytes(b"http://a\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"urls_neg\.txt' is not UTF-8 \(invalid start byte at"):
        read_aclimdb(base, "train")


def test_a_byte_order_mark_in_a_urls_file_is_no_part_of_the_first_movie(tmp_path):
    """A urls file saved with a BOM named its first line's movie "\\ufeffhttp://…": that
    review was another movie than the next ones of the same page, which validation could then
    split from it (a movie on both sides)."""
    base = _write_aclimdb(tmp_path)
    for name in ("neg", "pos"):
        path = base / "train" / f"urls_{name}.txt"
        path.write_text("\ufeffhttp://a\nhttp://a\nhttp://b\nhttp://b\n", encoding="utf-8")
    split = read_aclimdb(base, "train")
    assert sorted(set(split.groups)) == ["http://a", "http://b"]


def test_fewer_reviews_than_asked_and_one_class_splits_are_said(tmp_path):
    """A folder holding fewer reviews than asked gives all it holds and the data line says so;
    a validation or test split of one class is said there too (a constant scores it); a
    training split of one class is refused (nothing to learn)."""
    base = _write_aclimdb(tmp_path)  # 8 training reviews (4 neg, 4 pos), 8 test
    sp = load_text_data("aclimdb", base, num_train=20, num_test=5, val_fraction=0.25)
    assert len(sp.train) + len(sp.val) == 8 and len(sp.test) == 5
    assert (
        "; the training split holds 8 examples, fewer than the 20 asked (--num-train): all used"
        in sp.source
    )
    assert sp.source.count("fewer than") == 1  # the test split gave the 5 asked
    assert "fewer than" not in load_text_data("aclimdb", base, num_train=8, num_test=8).source
    one_class = []
    for seed in range(12):  # 2 validation reviews of 8: some draws give both one class
        sp = load_text_data(
            "aclimdb", base, num_train=None, num_test=None, val_fraction=0.25, seed=seed
        )
        said = "the validation split holds class" in sp.source
        assert said == (len(set(sp.val.labels.tolist())) == 1), (seed, sp.source)
        one_class.append(said)
    assert any(one_class) and not all(one_class)
    assert "test split holds class" not in sp.source
    with pytest.raises(DataError, match="the training split holds 1 examples, all of class"):
        load_text_data("aclimdb", base, num_train=1, num_test=None, val_fraction=0.0)


def test_a_byte_order_mark_is_no_text(tmp_path):
    """A review saved with a UTF-8 BOM reads as the same text (byte-level BPE, RoBERTa's,
    would make a token of it)."""
    base = _write_aclimdb(tmp_path, n=1)
    review = base / "train" / "pos" / "0_7.txt"
    review.write_bytes(b"\xef\xbb\xbf" + review.read_bytes())
    assert read_aclimdb(base, "train").texts[1] == "train pos review 0. It is café-good."


# --------------------------------------------------------------------------------------------------
# Tokenizing with the real all-MiniLM-L6-v2
# --------------------------------------------------------------------------------------------------


def test_tokenize_split_with_minilm():
    from cudt.models.encoders import load_encoder, minilm_path

    encoder = load_encoder(minilm_path())
    single = TextSplit(
        texts=("The acting was superb.", " ".join(["long"] * 100)), pairs=None, labels=[1, 0]
    )
    ids, mask = tokenize_split(encoder, single, 16)
    assert ids.shape == mask.shape == (2, 16) and ids.dtype == mask.dtype == np.int32
    cls_id, sep_id = encoder.tokenizer.token_to_id("[CLS]"), encoder.tokenizer.token_to_id("[SEP]")
    assert (ids[:, 0] == cls_id).all()
    assert mask[0].sum() == 7 and ids[0, 6] == sep_id and (ids[0, 7:] == 0).all()  # 5 tokens
    assert mask[1].all() and ids[1, -1] == sep_id  # truncated to max_length
    pair = TextSplit(texts=("A man is eating.",), pairs=("Someone eats.",), labels=[0])
    ids, mask, types = tokenize_split(encoder, pair, 24, return_token_type_ids=True)
    row = ids[0, : mask[0].sum()]
    assert (row == sep_id).sum() == 2 and row[0] == cls_id
    first_sep = int(np.flatnonzero(row == sep_id)[0])
    assert (types[0, : first_sep + 1] == 0).all()
    assert (types[0, first_sep + 1 : len(row)] == 1).all()
    text_ids, _ = encoder.tokenize(["A man is eating."], 24)
    np.testing.assert_array_equal(ids[0, : first_sep + 1], text_ids[0, : first_sep + 1])


def test_imdb_like_reviews_are_long_mixed_and_round_trip_the_aclimdb_layout(tmp_path):
    from cudt.data.text import imdb_like_reviews, write_aclimdb
    from cudt.data.text.aclimdb import _clean_review
    from cudt.data.text.generated import _REVIEW_NEG, _REVIEW_POS

    split, ratings = imdb_like_reviews(40, seed=3)
    again, _ = imdb_like_reviews(41, seed=3)
    assert split.texts == again.texts[:40]  # example i depends on (seed, stream, i) only
    assert split.labels.tolist() == [i % 2 for i in range(40)]
    assert np.all((ratings >= 7) == (split.labels == 1)) and set(ratings) <= {
        1,
        2,
        3,
        4,
        7,
        8,
        9,
        10,
    }
    words = [len(t.split()) for t in split.texts]
    assert min(words) > 100 and all("<br /><br />" in t for t in split.texts)
    # opinion words are a minority, and both polarities occur within the same reviews
    lexicon = set(_REVIEW_POS) | set(_REVIEW_NEG)
    tokens = [re.findall(r"[a-z]+", t.lower()) for t in split.texts]
    share = np.mean([sum(w in lexicon for w in ws) / len(ws) for ws in tokens])
    assert 0.01 < share < 0.1
    assert any(set(ws) & set(_REVIEW_POS) and set(ws) & set(_REVIEW_NEG) for ws in tokens)
    short, _ = imdb_like_reviews(10, seed=3, short=True)
    assert max(len(t.split()) for t in short.texts) < 100

    test, test_ratings = imdb_like_reviews(6, seed=3, stream=1)
    root = write_aclimdb(tmp_path, split, test, ratings=(ratings, test_ratings))
    assert root == tmp_path / "aclImdb"
    names = sorted(p.name for p in (root / "test" / "pos").glob("*.txt"))
    assert names == sorted(f"{i}_{test_ratings[i]}.txt" for i in (1, 3, 5))
    back = read_aclimdb(tmp_path, "train")
    assert sorted(back.texts) == sorted(_clean_review(t) for t in split.texts)
    assert sorted(back.labels.tolist()) == sorted(split.labels.tolist())
    pairs = TextSplit(texts=("a",), pairs=("b",), labels=np.array([0]))
    with pytest.raises(DataError, match="binary single-text"):
        write_aclimdb(tmp_path / "x", pairs, test)


def test_write_aclimdb_refuses_a_folder_that_holds_reviews(tmp_path):
    """A second write_aclimdb into the same root left the first data set's files beside the
    new ones (200 reviews, then 100: read_aclimdb read 200, a mixture); refused, and the
    folder is left as it was."""
    from cudt.data.text import imdb_like_reviews, write_aclimdb

    first, _ = imdb_like_reviews(20, seed=0)
    test, _ = imdb_like_reviews(4, seed=0, stream=1)
    root = write_aclimdb(tmp_path, first, test)
    before = sorted(p.relative_to(root) for p in root.rglob("*.txt"))
    second, _ = imdb_like_reviews(10, seed=1)
    with pytest.raises(DataError, match="already holds reviews: writing more there would mix"):
        write_aclimdb(tmp_path, second, test)
    assert sorted(p.relative_to(root) for p in root.rglob("*.txt")) == before
    assert len(read_aclimdb(tmp_path, "train")) == 20
    empty = tmp_path / "empty"
    for name in ("train/neg", "test/pos"):  # folders without reviews are written into
        (empty / "aclImdb" / name).mkdir(parents=True)
    assert len(read_aclimdb(write_aclimdb(empty, second, test), "train")) == 10


def test_write_aclimdb_writes_nothing_read_aclimdb_refuses(tmp_path):
    """An empty text (or one of ``<br />`` tags only) was written as an empty review file, and
    a split of one label left an empty neg/ or pos/ folder: read_aclimdb refused both ("review
    '...1_1.txt' is empty", "no .txt reviews in"). Refused by the writer, nothing written."""
    from cudt.data.text import imdb_like_reviews, write_aclimdb
    from cudt.data.text.tokenized import TextSplit

    def split(texts, labels):
        return TextSplit(texts=tuple(texts), pairs=None, labels=np.asarray(labels), groups=None)

    test, _ = imdb_like_reviews(4, seed=0, stream=1)
    for i, (train, words) in enumerate(
        (
            (split(["a fine film", "", "bad"], [1, 0, 0]), "the train split's text 1 is empty"),
            (split(["a fine film", "<br /> ", "bad"], [1, 0, 0]), "train split's text 1 is emp"),
            (split(["a fine film"], [1]), "the train split has no neg review (label 0)"),
            (split([], []), "the train split has no neg review (label 0)"),
        )
    ):
        with pytest.raises(DataError, match=re.escape(words)):
            write_aclimdb(tmp_path / str(i), train, test)
        assert not (tmp_path / str(i)).exists()
    good = split(["a fine film", "bad <br /> film"], [1, 0])
    assert read_aclimdb(write_aclimdb(tmp_path / "good", good, test), "train").texts == (
        "bad film",
        "a fine film",
    )


# --------------------------------------------------------------------------------------------
# MultiNLI's own files (multinli_1.0/*.jsonl, GLUE's MNLI/*.tsv), read without TFDS
# --------------------------------------------------------------------------------------------

# (promptID, premise, hypothesis, gold_label): three hypotheses a premise, as the corpus has
_MNLI_TRAIN = [
    (p, f'Premise {p} says "{w}" twice.', f"Hypothesis {p}.{k} about {w}.", gold)
    for p, w in enumerate(("rain", "trains", "it's", "tea", "ships", "maps"))
    for k, gold in enumerate(("entailment", "neutral", "contradiction"))
]
_MNLI_DEV = [
    (100, "A dev premise.", "A dev hypothesis.", "neutral"),
    (100, "A dev premise.", "Nobody agreed here.", "-"),  # no gold label: left out
    (101, "Another premise.", "It contradicts.", "contradiction"),
]


def _write_multinli(root: Path, fmt: str) -> Path:
    """The NYU archive's ``multinli_1.0/multinli_1.0_<split>.jsonl`` (with its other fields), or
    GLUE's ``MNLI/<split>.tsv`` (header, parse columns, unquoted fields), under ``root``."""
    folder = root / ("multinli_1.0" if fmt == "jsonl" else "MNLI")
    folder.mkdir(parents=True)
    for split, rows in (("train", _MNLI_TRAIN), ("dev_matched", _MNLI_DEV)):
        if fmt == "jsonl":
            lines = [
                json.dumps(
                    {"annotator_labels": [g], "genre": "fiction", "gold_label": g,
                     "pairID": f"{p}{k}e", "promptID": str(p), "sentence1": a,
                     "sentence1_binary_parse": "( x )", "sentence2": b}
                )
                for k, (p, a, b, g) in enumerate(rows)
            ]  # fmt: skip
            (folder / f"multinli_1.0_{split}.jsonl").write_text("\n".join(lines) + "\n")
        else:
            header = "index\tpromptID\tpairID\tgenre\tsentence1_parse\tsentence1\tsentence2"
            lines = [header + "\tlabel1\tgold_label"]
            lines += [
                f"{k}\t{p}\t{p}{k}e\tfiction\t( x )\t{a}\t{b}\t{g}\t{g}"
                for k, (p, a, b, g) in enumerate(rows)
            ]
            (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("fmt", ["jsonl", "tsv"])
def test_multinli_own_files_are_read_as_glue_mnli_with_whole_premises_held_out(tmp_path, fmt):
    """--dataset mnli on MultiNLI's own files: every labelled pair, GLUE's label order, quotes
    kept as written, the unlabelled dev pair left out, and validation holding whole premises
    (a premise's three hypotheses on both sides would let validation read trained premises)."""
    _write_multinli(tmp_path, fmt)
    for seed in range(4):
        data = load_text_data(
            "mnli", tmp_path, num_train=None, num_test=None, val_fraction=0.34, seed=seed
        )
        assert data.label_names == ("entailment", "neutral", "contradiction")
        assert f"MultiNLI .{fmt} files in {tmp_path}" in data.source
        assert "validation holds whole premises (2 of 6, by premise text)" in data.source
        assert set(data.train.groups).isdisjoint(data.val.groups)
        pairs = {
            (g, a, b, int(y))
            for split in (data.train, data.val)
            for g, a, b, y in zip(split.groups, split.texts, split.pairs, split.labels, strict=True)
        }
        labels = data.label_names
        assert pairs == {(a, a, b, labels.index(g)) for p, a, b, g in _MNLI_TRAIN}
        assert data.test.texts == ("A dev premise.", "Another premise.")
        assert data.test.pairs == ("A dev hypothesis.", "It contradicts.")
        assert data.test.labels.tolist() == [1, 2]
    half = load_text_data("mnli", tmp_path, num_train=9, num_test=1, seed=3)
    assert len(half.train) + len(half.val) == 9 and len(half.test) == 1


def test_a_premise_written_under_two_prompt_ids_is_on_one_side(tmp_path):
    """MultiNLI's own files are grouped by premise text, as TFDS glue/mnli is (one rule): a
    premise written under two promptIDs (short ones recur) was on both sides of the
    validation split when the files were grouped by promptID."""
    folder = tmp_path / "multinli_1.0"
    folder.mkdir()
    labels = ("entailment", "neutral", "contradiction")
    rows = [  # promptIDs 2k and 2k + 1: one premise text
        {"promptID": str(p), "sentence1": f"Premise {p // 2}.", "sentence2": f"H {p}.{k}.",
         "gold_label": gold}
        for p in range(10)
        for k, gold in enumerate(labels)
    ]  # fmt: skip
    dev = {"promptID": "99", "sentence1": "Dev.", "sentence2": "H.", "gold_label": "neutral"}
    for split, lines in (("train", rows), ("dev_matched", [dev])):
        text = "\n".join(json.dumps(r) for r in lines) + "\n"
        (folder / f"multinli_1.0_{split}.jsonl").write_text(text)
    for seed in range(4):
        data = load_text_data(
            "mnli", tmp_path, num_train=None, num_test=None, val_fraction=0.2, seed=seed
        )
        assert set(data.train.texts).isdisjoint(data.val.texts)
        assert "validation holds whole premises (1 of 5, by premise text)" in data.source


def _replaced(old: str, new: str):
    return lambda f: f.write_text(f.read_text().replace(old, new, 1))


@pytest.mark.parametrize(
    ("fmt", "damage", "words"),
    [
        ("jsonl", _replaced('"}\n', '"\n'), "train.jsonl line 1 is not JSON"),
        ("jsonl", lambda f: f.write_text('{"gold_label": "neutral"}'), "line 1 has no 'sentence1'"),
        ("jsonl", _replaced('l": "neutral"', 'l": "neutre"'), "gold_label 'neutre' is not one"),
        ("jsonl", lambda f: f.unlink(), "has no multinli_1.0_train.jsonl (the train split)"),
        ("tsv", _replaced("\tneutral\tneutral", "\tneutral"), "train.tsv line 3 has 8 fields"),
        ("tsv", _replaced("gold_label", "label5"), "train.tsv has no 'gold_label' column"),
        ("tsv", lambda f: f.write_bytes(b"\xff" + f.read_bytes()), "train.tsv' is not UTF-8"),
    ],
)
def test_multinli_files_that_are_not_labelled_pairs_are_named(tmp_path, fmt, damage, words):
    folder = _write_multinli(tmp_path, fmt)
    damage(next(folder.glob("*train*")))
    with pytest.raises(DataError, match=re.escape(words)):
        load_text_data("mnli", tmp_path)
