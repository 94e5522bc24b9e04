"""The Stanford aclImdb folder ``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt``: its reader
(:func:`read_aclimdb`) and a writer of splits in that layout (:func:`write_aclimdb`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = ["read_aclimdb", "write_aclimdb"]


def write_aclimdb(
    root: str | Path,
    train: TextSplit,
    test: TextSplit,
    *,
    ratings: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Path:
    """Write two binary splits in the Stanford layout ``root/aclImdb/{train,test}/{neg,pos}/
    <id>_<rating>.txt`` (what :func:`read_aclimdb` reads) and return the ``aclImdb`` folder.

    ``ratings`` (per split, 1-10) name the files as the real archive does; without them
    negative reviews get rating 1 and positive ones 10. Texts are written as given (UTF-8).
    A folder that already holds reviews is refused: the new ones would be read with them.
    Nothing :func:`read_aclimdb` refuses is written: an empty text (or one of ``<br />`` tags
    and spaces only), or a split without a negative or a positive review, is refused before
    any file is (not skipped: the files' ids, ratings and counts would no longer be the
    split's).
    """
    base = Path(root).expanduser() / "aclImdb"
    splits = (
        ("train", train, None if ratings is None else ratings[0]),
        ("test", test, None if ratings is None else ratings[1]),
    )
    for name, split, _ in splits:
        _check_writable(name, split)
    held = [base / s / f for s in ("train", "test") for f in ("neg", "pos")]
    if any(next(folder.glob("*.txt"), None) is not None for folder in held if folder.is_dir()):
        raise DataError(
            f"'{base}' already holds reviews: writing more there would mix the two data sets "
            "(read_aclimdb reads every .txt; some files would be replaced); pass another root, "
            "or remove that aclImdb folder first"
        )
    for name, split, split_ratings in splits:
        for folder in ("neg", "pos"):
            (base / name / folder).mkdir(parents=True, exist_ok=True)
        for i, (text, label) in enumerate(zip(split.texts, split.labels, strict=True)):
            rating = (10 if label else 1) if split_ratings is None else int(split_ratings[i])
            path = base / name / ("pos" if label else "neg") / f"{i}_{rating}.txt"
            path.write_text(text, encoding="utf-8")
    return base


def _check_writable(name: str, split: TextSplit) -> None:
    """Refuses a split :func:`read_aclimdb` could not read back (see :func:`write_aclimdb`)."""
    if split.pairs is not None or (len(split) and int(split.labels.max()) > 1):
        raise DataError(
            f"write_aclimdb writes binary single-text splits; the {name} split has pairs or "
            "labels above 1: pass neg (0) / pos (1) reviews"
        )
    empty = next((i for i, t in enumerate(split.texts) if not _clean_review(t)), None)
    if empty is not None:
        raise DataError(
            f"the {name} split's text {empty} is empty (or only <br /> tags and spaces), "
            "which read_aclimdb refuses to read: drop it from the split, or give it words"
        )
    for label, folder in enumerate(("neg", "pos")):
        if not np.any(np.asarray(split.labels) == label):
            raise DataError(
                f"the {name} split has no {folder} review (label {label}), and read_aclimdb "
                f"refuses an empty {name}/{folder} folder: pass reviews of both labels"
            )


# --------------------------------------------------------------------------------------------------
# aclImdb folder
# --------------------------------------------------------------------------------------------------

_ACLIMDB_HINT = (
    "download aclImdb_v1.tar.gz from https://ai.stanford.edu/~amaas/data/sentiment/ and extract "
    "it, then pass the aclImdb folder (or its parent) as --data-dir"
)


def _clean_review(text: str) -> str:
    """IMDb reviews carry HTML line breaks (``<br />``): replace them, collapse whitespace."""
    text = re.sub(r"<br\s*/?>", " ", text, flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", text).strip()


def _subsample(n: int, max_examples: int | None, seed: int) -> np.ndarray:
    """Indices to keep: all (in order), or a seeded random ``max_examples`` of them (sorted)."""
    if max_examples is not None and max_examples < 0:
        raise DataError(f"max_examples must be >= 0 or None, got {max_examples}: pass a count")
    if max_examples is None or max_examples >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:max_examples])


def read_aclimdb(
    root: str | Path, split: str, *, max_examples: int | None = None, seed: int = 0
) -> TextSplit:
    """Read ``aclImdb/{train,test}/{neg,pos}/*.txt`` (labels 0 neg, 1 pos).

    ``root`` is the ``aclImdb`` folder or its parent. Files are taken in name order, ``neg``
    first; ``max_examples`` keeps a seeded random subset (only those files are read). ``<br />``
    tags are replaced by spaces. The ``unsup`` folder is ignored.

    Where the split has the archive's ``urls_neg.txt`` and ``urls_pos.txt`` (line ``i``: the
    IMDb page of the movie that review ``<i>_<rating>.txt`` is about), each review's movie is
    its ``groups`` entry, so that a validation split carved from ``train`` holds whole movies
    (the archive has up to 30 reviews of one movie). Without them (a folder
    :func:`write_aclimdb` wrote), ``groups`` is None.
    """
    if split not in ("train", "test"):
        raise DataError(f"aclImdb split must be 'train' or 'test', got {split!r}: pass one of them")
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(f"aclImdb folder '{root}' {what}: {_ACLIMDB_HINT}")
    if (root / "aclImdb").is_dir():
        root = root / "aclImdb"
    split_dir = root / split
    if not split_dir.is_dir():
        # one or two levels too deep: the split folder (aclImdb/train) or a class folder
        deep = root.parent if root.name in ("train", "test") else None
        if root.name in ("neg", "pos", "unsup") and root.parent.name in ("train", "test"):
            deep = root.parent.parent
        hint = f"'{deep}' holds it: pass --data-dir '{deep}'" if deep else _ACLIMDB_HINT
        if deep is None and (root / "imdb_reviews").is_dir():  # a prepared TFDS data folder
            hint = (
                f"'{root}' holds TFDS imdb_reviews, which --dataset imdb reads: pass --dataset "
                f"imdb --data-dir '{root}'"
            )
        raise DataError(
            f"no {split}/ folder in '{root}' (expected aclImdb/{split}/{{neg,pos}}): {hint}"
        )
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(("neg", "pos")):
        folder = split_dir / name
        if not folder.is_dir():
            raise DataError(
                f"no {name}/ folder in '{split_dir}' (expected {split}/neg and {split}/pos): "
                f"{_ACLIMDB_HINT}"
            )
        found = sorted(p for p in folder.glob("*.txt") if not p.name.startswith("."))
        if not found:
            raise DataError(f"no .txt reviews in '{folder}': {_ACLIMDB_HINT}")
        files += found
        labels += [label] * len(found)
    movies = _movies(split_dir, files)
    keep = _subsample(len(files), max_examples, seed)
    texts = []
    for i in keep:
        try:
            raw = files[i].read_bytes().decode("utf-8-sig")  # a BOM is no text
        except UnicodeDecodeError as err:
            raise DataError(
                f"'{files[i]}' is not UTF-8 ({err.reason} at byte {err.start}): re-extract "
                "aclImdb_v1.tar.gz or re-save the file as UTF-8"
            ) from err
        except OSError as err:  # a broken link, a folder named *.txt, no permission
            raise DataError(
                f"review '{files[i]}' cannot be read ({err.strerror or err}): re-extract "
                "aclImdb_v1.tar.gz or remove that entry"
            ) from err
        text = _clean_review(raw)
        if not text:  # nothing, or only <br /> tags and spaces
            raise DataError(
                f"review '{files[i]}' is empty: re-extract aclImdb_v1.tar.gz or remove the file"
            )
        texts.append(text)
    return TextSplit(
        texts=tuple(texts),
        pairs=None,
        labels=np.asarray(labels)[keep],
        groups=None if movies is None else tuple(movies[i] for i in keep),
    )


def _movies(split_dir: Path, files: list[Path]) -> list[str] | None:
    """Each review's movie, from ``urls_{neg,pos}.txt`` (line ``i`` for ``<i>_<rating>.txt``),
    or None where the split has neither file."""
    urls = {name: split_dir / f"urls_{name}.txt" for name in ("neg", "pos")}
    if not any(path.is_file() for path in urls.values()):
        return None
    lines = {}
    for name, path in urls.items():
        if not path.is_file():
            raise DataError(
                f"'{split_dir}' has urls_{'pos' if name == 'neg' else 'neg'}.txt but no "
                f"urls_{name}.txt: re-extract aclImdb_v1.tar.gz, or remove both"
            )
        try:
            # a BOM (an editor's) is no part of the first movie's URL, as of a review's text
            lines[name] = path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as err:
            raise DataError(
                f"'{path}' is not UTF-8 ({err.reason} at byte {err.start}): re-extract "
                "aclImdb_v1.tar.gz, or remove both urls files"
            ) from err
        except OSError as err:  # no permission, a broken link
            raise DataError(
                f"'{path}' cannot be read ({err.strerror or err}): re-extract "
                "aclImdb_v1.tar.gz, or remove both urls files"
            ) from err
    movies = []
    for file in files:
        stem = file.name.split("_", 1)[0]
        table = lines[file.parent.name]
        if not stem.isdigit() or int(stem) >= len(table):
            raise DataError(
                f"review '{file}' has no line in urls_{file.parent.name}.txt ({len(table)} "
                "lines; the archive names reviews <line>_<rating>.txt): re-extract "
                "aclImdb_v1.tar.gz, or remove the urls files"
            )
        movies.append(table[int(stem)].strip())
    return movies
