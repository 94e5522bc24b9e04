"""MultiNLI's own files, read without TFDS: the NYU archive's ``multinli_1.0/
multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl`` or GLUE's ``MNLI/{train,dev_matched,
dev_mismatched}.tsv`` (:func:`read_multinli`), what ``--dataset mnli --data-dir`` reads where
the folder holds them (a prepared TFDS ``glue/mnli`` otherwise: :mod:`cudt.data.text.tfds`).

Labels follow TFDS ``glue/mnli``: 0 entailment, 1 neutral, 2 contradiction. Pairs whose
annotators did not agree (``gold_label`` ``-``: 185 of dev_matched's 10,000, none in train) are
left out, as GLUE leaves them out, so the splits hold GLUE's 392,702 / 9,815 pairs. Each pair's
premise text is its ``groups`` entry, so that a validation split carved from train holds whole
premises (three hypotheses were written for each): by its text, not its ``promptID``, as TFDS
``glue/mnli`` (which keeps no promptID) is split, so that a premise written under two promptIDs
is not on both sides.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

from cudt.data.text.aclimdb import _subsample
from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = ["MULTINLI_LABELS", "multinli_folder", "read_multinli"]

MULTINLI_LABELS = ("entailment", "neutral", "contradiction")  # glue/mnli's order

# the TFDS split names the text task asks for -> the files' own names
_SPLIT_FILES = {
    "train": "train",
    "validation_matched": "dev_matched",
    "validation_mismatched": "dev_mismatched",
}
_FORMATS = {"jsonl": "multinli_1.0_{}.jsonl", "tsv": "{}.tsv"}
_HINT = (
    "re-extract multinli_1.0.zip (the .jsonl files) or GLUE's MNLI.zip (the .tsv files) into "
    "--data-dir"
)


def multinli_folder(root: str | Path) -> tuple[Path, str] | None:
    """``(folder, "jsonl" | "tsv")`` where ``root``, or its ``multinli_1.0`` / ``MNLI`` folder,
    holds MultiNLI's own files (any split); None where it holds none of them."""
    root = Path(root).expanduser()
    for folder in (root, root / "multinli_1.0", root / "MNLI"):
        for fmt, pattern in _FORMATS.items():
            if any((folder / pattern.format(name)).is_file() for name in _SPLIT_FILES.values()):
                return folder, fmt
    return None


def read_multinli(
    root: str | Path, split: str, *, max_examples: int | None = None, seed: int = 0
) -> TextSplit:
    """One split of MultiNLI's own files in ``root`` (see :func:`multinli_folder`): ``split`` a
    TFDS ``glue/mnli`` split name (``"train"``, ``"validation_matched"``,
    ``"validation_mismatched"``). Pairs come in file order; ``max_examples`` keeps a seeded
    random subset of them; pairs without a gold label are left out first. A line that is not a
    labelled pair raises :class:`DataError` naming the file and the line."""
    if split not in _SPLIT_FILES:
        raise DataError(
            f"MultiNLI split must be one of {', '.join(_SPLIT_FILES)}, got {split!r}: pass one"
        )
    found = multinli_folder(root)
    if found is None:
        raise DataError(f"no MultiNLI .jsonl or .tsv files in '{root}': {_HINT}")
    folder, fmt = found
    path = folder / _FORMATS[fmt].format(_SPLIT_FILES[split])
    if not path.is_file():
        raise DataError(f"'{folder}' has no {path.name} (the {split} split): {_HINT}")
    rows = _jsonl_rows(path) if fmt == "jsonl" else _tsv_rows(path)
    try:
        texts, pairs, labels = _labelled(path, rows)
    except UnicodeDecodeError as err:
        raise DataError(
            f"'{path}' is not UTF-8 ({err.reason} at byte {err.start}): {_HINT}"
        ) from err
    if not texts:
        raise DataError(f"{path} holds no labelled pairs: {_HINT}")
    keep = _subsample(len(texts), max_examples, seed)
    return TextSplit(
        texts=tuple(texts[i] for i in keep),
        pairs=tuple(pairs[i] for i in keep),
        labels=np.asarray(labels, np.int32)[keep],
        groups=tuple(texts[i] for i in keep),  # the premise: the TFDS reader's groups too
    )


def _labelled(path: Path, rows) -> tuple[list[str], list[str], list[int]]:
    """Premises, hypotheses and labels of ``rows``, the unlabelled left out."""
    texts, pairs, labels = [], [], []
    for line, row in rows:
        gold = row["gold_label"]
        if gold == "-":  # the annotators did not agree: no label (GLUE leaves it out)
            continue
        if gold not in MULTINLI_LABELS:
            raise DataError(
                f"{path.name} line {line}: gold_label {gold!r} is not one of "
                f"{', '.join(MULTINLI_LABELS)} or '-': {_HINT}"
            )
        texts.append(row["sentence1"])
        pairs.append(row["sentence2"])
        labels.append(MULTINLI_LABELS.index(gold))
    return texts, pairs, labels


_KEYS = ("sentence1", "sentence2", "gold_label")


def _checked(path: Path, line: int, row: dict) -> dict[str, str]:
    missing = [k for k in _KEYS if k not in row or row[k] is None]
    if missing:
        raise DataError(f"{path.name} line {line} has no {missing[0]!r}: {_HINT}")
    return {k: str(row[k]) for k in _KEYS}


def _jsonl_rows(path: Path):
    """``(line number, row)`` of a MultiNLI ``.jsonl`` file, blank lines skipped."""
    with _opened(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as err:
                raise DataError(f"{path.name} line {line} is not JSON ({err}): {_HINT}") from err
            if not isinstance(row, dict):
                raise DataError(f"{path.name} line {line} is not a JSON object: {_HINT}")
            yield line, _checked(path, line, row)


def _tsv_rows(path: Path):
    """``(line number, row)`` of GLUE's MNLI ``.tsv``: a header, then one tab-separated pair a
    line, quotes as plain characters (GLUE's files do not quote their fields)."""
    csv.field_size_limit(sys.maxsize)
    with _opened(path) as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None or any(k not in header for k in _KEYS):
            missing = next(k for k in _KEYS if header is None or k not in header)
            raise DataError(f"{path.name} has no {missing!r} column in its header: {_HINT}")
        for values in reader:
            line = reader.line_num
            if len(values) != len(header):
                raise DataError(
                    f"{path.name} line {line} has {len(values)} fields, its header "
                    f"{len(header)}: {_HINT}"
                )
            yield line, _checked(path, line, dict(zip(header, values, strict=True)))


def _opened(path: Path):
    try:
        return open(path, encoding="utf-8-sig", newline="")  # noqa: SIM115  (the caller's with)
    except OSError as err:
        raise DataError(f"'{path}' cannot be read ({err.strerror or err}): {_HINT}") from err
