"""Prepared TFDS text datasets (IMDb, MNLI) read without TensorFlow.

``array_record`` and ``parquet`` are read through ``tfds``' own data sources, ``tfrecord`` (what
``tfds build`` writes by default) through the small TFRecord reader here; the serialized examples
are decoded by ``tfds``' numpy parser either way. Nothing is downloaded unless ``download=True``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cudt.data.text.aclimdb import _clean_review, _subsample
from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = ["load_tfds_text"]


# --------------------------------------------------------------------------------------------------
# TFDS (no TensorFlow)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TfdsSpec:
    name: str  # TFDS builder name
    config: str
    version: str  # the version TFDS prepares today (preferred; other versions on disk are read too)
    text: str  # feature holding the first segment
    pair: str | None  # feature holding the second segment
    label_names: tuple[str, ...]
    train: str  # TFDS split -> our train/val pool
    test: str  # TFDS split -> our test
    clean: bool  # strip IMDb's <br /> tags


_TFDS: dict[str, _TfdsSpec] = {
    "imdb": _TfdsSpec(
        name="imdb_reviews",
        config="plain_text",
        version="1.0.0",
        text="text",
        pair=None,
        label_names=("neg", "pos"),
        train="train",
        test="test",
        clean=True,
    ),
    "mnli": _TfdsSpec(
        name="glue",
        config="mnli",
        version="2.0.0",
        text="premise",
        pair="hypothesis",
        label_names=("entailment", "neutral", "contradiction"),
        train="train",
        test="validation_matched",
        clean=False,
    ),
}


def _default_tfds_dir() -> Path:
    return Path(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser()


def _prepare_hint(spec: _TfdsSpec, root: Path) -> str:
    return (
        "run the experiment with --download (download=True) on a machine with internet, or run "
        f"`tfds build {spec.name}/{spec.config} --data_dir {root} --file_format array_record` "
        f"(on another machine, then copy its {spec.name}/ folder into '{root}')"
    )


def _raw_files_hint(spec: _TfdsSpec, root: Path) -> str | None:
    """What to do where ``root`` holds the raw files of the data set rather than a prepared TFDS
    folder: the Stanford aclImdb folder (read by ``--dataset aclimdb``), or MultiNLI's own
    ``.jsonl`` / GLUE's ``.tsv`` files (read by ``--dataset mnli``: :mod:`cudt.data.text.multinli`).
    ``None`` elsewhere."""
    if not root.is_dir():
        return None
    if spec.name == "imdb_reviews":
        acl = root / "aclImdb" if (root / "aclImdb").is_dir() else root
        if (acl / "train" / "neg").is_dir() or (acl / "test" / "neg").is_dir():
            return (
                f"'{root}' is the Stanford aclImdb folder, which --dataset aclimdb reads: pass "
                f"--dataset aclimdb --data-dir '{root}'"
            )
    if spec.name == "glue":
        raw_name = re.compile(r"(multinli_1\.0_)?(train|dev_(mis)?matched)\.(jsonl|tsv|txt)")
        raw = sorted(
            p.name
            for d in (root, root / "multinli_1.0", root / "MNLI")
            if d.is_dir()
            for p in d.iterdir()
            if raw_name.fullmatch(p.name)
        )
        if raw:
            return (
                f"'{root}' holds MultiNLI's own files ({', '.join(raw[:2])}), which "
                "load_text_data('mnli', ...) and --dataset mnli read (read_multinli), not "
                "load_tfds_text: pass them there"
            )
    return None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".")) if re.fullmatch(r"\d+(\.\d+)*", name) else (-1,)


def _find_variant(spec: _TfdsSpec, root: Path) -> Path | None:
    """``root/name/config/<version>`` holding a ``dataset_info.json``: the version TFDS builds today
    if prepared, else the newest one there; ``root`` itself when it is such a folder, and
    ``root`` one or two levels down the layout (``.../imdb_reviews``, ``.../imdb_reviews/
    plain_text``: a --data-dir given as the data set's own folder)."""
    if (root / "dataset_info.json").is_file():
        return root
    candidates = [root / spec.name / spec.config]
    if root.name == spec.name:
        candidates.append(root / spec.config)
    if root.name == spec.config and root.parent.name == spec.name:
        candidates.append(root)
    config_dir = next((c for c in candidates if c.is_dir()), None)
    if config_dir is None:
        return None
    if (config_dir / spec.version / "dataset_info.json").is_file():
        return config_dir / spec.version
    # a version folder (1.0.0), not the leftovers of an interrupted build (incomplete.XYZ_1.0.0)
    versions = [
        d
        for d in config_dir.iterdir()
        if _version_key(d.name) != (-1,) and (d / "dataset_info.json").is_file()
    ]
    if not versions:
        return None
    return max(versions, key=lambda d: _version_key(d.name))


def _download_and_prepare(spec: _TfdsSpec, root: Path) -> None:
    """Build the dataset into ``root`` as array_record (readable here without TensorFlow)."""
    import tensorflow_datasets as tfds

    if spec.name == "glue":
        import tensorflow_datasets.text.glue  # noqa: F401  (registers the legacy GLUE builder)
    try:
        builder = tfds.builder(
            f"{spec.name}/{spec.config}", data_dir=str(root), file_format="array_record"
        )
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False)
        )
    except Exception as err:  # network, disk, TFDS: all mean "could not prepare"
        raise DataError(
            f"could not download and prepare {spec.name}/{spec.config} into '{root}' "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}): check the "
            f"internet connection and disk space, or prepare it elsewhere with `tfds build "
            f"{spec.name}/{spec.config} --data_dir {root} --file_format array_record` and copy it"
        ) from err


# TFRecord framing: uint64 length, uint32 masked CRC32C of the length, data, uint32 masked CRC32C
# of the data (little-endian). https://www.tensorflow.org/tutorials/load_data/tfrecord
def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as used by TFRecord; pure Python, meant for short inputs."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc32c(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord_records(path: Path, keep: set[int] | None = None, first: int = 0) -> Iterator[bytes]:
    """The records of one TFRecord file (those whose global index ``first + i`` is in ``keep``).

    The length header's CRC is checked (catches truncation and misframing); the data CRC is not
    (pure-Python CRC over the whole file would be slow); a corrupt record then fails to parse.
    """
    with open(path, "rb") as f:
        i = first
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise DataError(f"'{path}' is truncated: re-prepare the dataset")
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc32c(header[:8]) != length_crc:
                raise DataError(
                    f"'{path}' is not a TFRecord file or is corrupt (bad length checksum at "
                    f"record {i - first}): re-prepare the dataset"
                )
            if keep is None or i in keep:
                data = f.read(length)
                if len(data) < length:
                    raise DataError(f"'{path}' is truncated: re-prepare the dataset")
                yield data
            else:
                f.seek(length, os.SEEK_CUR)
            if len(f.read(4)) < 4:
                raise DataError(f"'{path}' is truncated: re-prepare the dataset")
            i += 1


def _read_tfrecord_split(builder: Any, split: str, keep: np.ndarray) -> list[Any]:
    """Decoded examples ``keep`` (sorted global indices) of a TFRecord split, in that order."""
    info = builder.info
    split_info = info.splits[split]
    variant = Path(str(builder.data_dir))
    shards = sorted(variant.glob(f"{info.name}-{split}.tfrecord-*"))
    n_shards = len(split_info.shard_lengths)
    if len(shards) != n_shards:
        raise DataError(
            f"found {len(shards)} {info.name}-{split}.tfrecord-* files in '{variant}' but "
            f"dataset_info.json lists {n_shards} shards: re-prepare the dataset"
        )
    wanted = {int(i) for i in keep}
    features = info.features
    out: list[Any] = []
    first = 0
    for shard, shard_len in zip(shards, split_info.shard_lengths, strict=True):
        count = 0
        for record in _tfrecord_records(shard, wanted, first):
            out.append(features.deserialize_example_np(record))
            count += 1
        first += int(shard_len)
    if len(out) != len(wanted):
        raise DataError(
            f"read {len(out)} of {len(wanted)} requested {split} records from '{variant}' (shard "
            "lengths in dataset_info.json do not match the files): re-prepare the dataset"
        )
    return out


def _read_examples(builder: Any, split: str, keep: np.ndarray, fmt: Any, hint: str) -> list[Any]:
    """The decoded examples ``keep`` of ``split``, from array_record/parquet (tfds' data source)
    or TFRecord (read here, without TensorFlow). Damaged files (a shard cut short or missing, a
    record that does not parse) are one :class:`DataError`, not the reader's traceback."""
    import tensorflow_datasets as tfds

    variant = Path(str(builder.data_dir))
    try:
        if fmt == tfds.core.FileFormat.TFRECORD:
            return _read_tfrecord_split(builder, split, keep)
        source = builder.as_data_source(split, file_format=fmt)
        examples: list[Any] = []
        for start in range(0, len(keep), 1024):
            examples += source.__getitems__([int(i) for i in keep[start : start + 1024]])
        return examples
    except DataError:
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise DataError(
            f"cannot read the {split} split ({fmt.value}) in '{variant}' "
            f"({type(err).__name__}: {first}): the files are damaged; delete the folder and "
            f"{hint}"
        ) from err


def _decode_text(value: Any, where: str) -> str:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{where} is not UTF-8 text: re-prepare the dataset") from err
    return str(value)


def _load_tfds(
    dataset: str,
    data_dir: str | Path | None,
    split: str,
    *,
    download: bool,
    max_examples: int | None,
    seed: int,
) -> tuple[TextSplit, str, int]:
    """:func:`load_tfds_text` plus where it was read from and the size of the whole split."""
    if dataset not in _TFDS:
        raise DataError(f"TFDS text dataset must be one of {', '.join(_TFDS)}, got {dataset!r}")
    spec = _TFDS[dataset]
    root = Path(data_dir).expanduser() if data_dir is not None else _default_tfds_dir()
    variant = _find_variant(spec, root)
    if variant is None and download:
        _download_and_prepare(spec, root)
        variant = _find_variant(spec, root)
    if variant is None:
        raise DataError(
            f"no prepared {spec.name}/{spec.config} in '{root}' (expected "
            f"{root}/{spec.name}/{spec.config}/<version>/dataset_info.json): "
            f"{_raw_files_hint(spec, root) or _prepare_hint(spec, root)}"
        )

    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder_from_directory(str(variant))
    except Exception as err:
        raise DataError(
            f"cannot read the TFDS metadata in '{variant}' ({type(err).__name__}): delete the "
            f"folder and {_prepare_hint(spec, root)}"
        ) from err
    info = builder.info
    features = info.features
    wanted = [spec.text, "label"] + ([spec.pair] if spec.pair else [])
    missing = [k for k in wanted if k not in features]
    label = features["label"] if "label" in features else None
    if missing or getattr(label, "num_classes", None) != len(spec.label_names):
        raise DataError(
            f"'{variant}' does not hold {spec.name}/{spec.config} (features {sorted(features)}, "
            f"need {wanted} with {len(spec.label_names)} classes): point data_dir at the right "
            "folder"
        )
    if split not in info.splits:
        raise DataError(
            f"{spec.name}/{spec.config} in '{variant}' has no split {split!r} (has "
            f"{', '.join(sorted(info.splits))}): pass one of those"
        )

    n = info.splits[split].num_examples
    keep = _subsample(n, max_examples, seed)
    formats = info.available_file_formats() or {tfds.core.FileFormat.TFRECORD}
    readable = [
        f for f in (tfds.core.FileFormat.ARRAY_RECORD, tfds.core.FileFormat.PARQUET) if f in formats
    ]
    if readable or tfds.core.FileFormat.TFRECORD in formats:
        fmt = readable[0] if readable else tfds.core.FileFormat.TFRECORD
        examples = _read_examples(builder, split, keep, fmt, f"{_prepare_hint(spec, root)}")
    else:
        names = ", ".join(sorted(f.value for f in formats))
        raise DataError(
            f"{spec.name}/{spec.config} in '{variant}' is stored as {names}, which cannot be read "
            f"without TensorFlow: re-prepare it with `tfds build {spec.name}/{spec.config} "
            f"--data_dir DIR --file_format array_record` (or install tensorflow and convert)"
        )

    texts, pairs, labels = [], [], []
    for i, ex in zip(keep, examples, strict=True):
        if ex.get("label") is None:  # a shard cut short reads back records without fields
            raise DataError(
                f"{split}[{i}] of '{variant}' has no label: the files are damaged; delete the "
                f"folder and {_prepare_hint(spec, root)}"
            )
        y = int(ex["label"])
        if not 0 <= y < len(spec.label_names):  # e.g. -1: unlabelled (GLUE test splits)
            continue
        text = _decode_text(ex[spec.text], f"{split}[{i}].{spec.text}")
        texts.append(_clean_review(text) if spec.clean else text.strip())
        if spec.pair:
            pairs.append(_decode_text(ex[spec.pair], f"{split}[{i}].{spec.pair}").strip())
        labels.append(y)
    out = TextSplit(
        texts=tuple(texts),
        pairs=tuple(pairs) if spec.pair else None,
        labels=np.asarray(labels, dtype=np.int32),
        # the premise's text, as MultiNLI's own files' pairs are grouped (glue/mnli keeps no
        # promptID): its three hypotheses on both sides of the validation split would let
        # validation read trained premises
        groups=tuple(texts) if spec.pair else None,
    )
    where = f"{info.name}/{info.config_name}:{info.version} ({fmt.value}) at {variant}"
    return out, where, n


def load_tfds_text(
    dataset: str,
    data_dir: str | Path | None,
    split: str,
    *,
    download: bool = False,
    max_examples: int | None = None,
    seed: int = 0,
) -> TextSplit:
    """Read one split of a prepared TFDS text dataset, without TensorFlow.

    ``dataset``: ``"imdb"`` (``imdb_reviews/plain_text``; text, label neg/pos) or ``"mnli"``
    (``glue/mnli``; premise + hypothesis pairs, label entailment/neutral/contradiction).
    ``split``: a TFDS split name (``"train"``, ``"test"``, ``"validation_matched"``, ...).

    ``data_dir`` is the TFDS data folder (holding ``imdb_reviews/plain_text/1.0.0/``), or the
    version folder itself; ``None`` means ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. The
    current TFDS version (``1.0.0``, ``2.0.0``) is read if prepared, else the newest one there. Formats: ``array_record`` and ``parquet`` (TFDS data
    sources), ``tfrecord`` (the ``tfds build`` default, read by a TFRecord reader in this
    module); ``riegeli`` raises :class:`DataError` asking to re-prepare as array_record.

    Missing data raises :class:`DataError` at once, saying how to prepare it; only
    ``download=True`` downloads (and prepares as array_record, which needs no TensorFlow).
    ``max_examples`` keeps a seeded random subset (only those records are decoded); examples come
    in file order. IMDb ``<br />`` tags are replaced by spaces; unlabelled examples (label -1)
    are dropped. MNLI's ``groups`` are its premises, so that a validation split carved from
    train holds whole premises.
    """
    out, _, _ = _load_tfds(
        dataset, data_dir, split, download=download, max_examples=max_examples, seed=seed
    )
    return out
