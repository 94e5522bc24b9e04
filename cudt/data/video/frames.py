"""Reading the real video datasets from disk: frame folders (UCSD, extracted frames) and the
datasets stored as ``.avi`` files (CUHK Avenue, ShanghaiTech) in the layout their archives extract.

Frame folders are read with PIL; ``.avi`` files are decoded by :mod:`cudt.data.video.avi`, imported
only when such a dataset is read. Both give grayscale ``[F, size, size]`` float32 in ``[0, 1]``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from cudt.errors import DataError
from cudt.io import available_memory

__all__ = [
    "DATASETS",
    "IMAGE_SUFFIXES",
    "VIDEO_SUFFIX",
    "load_frame_folders",
    "load_videos",
    "training_scenes",
]

DATASETS: tuple[str, ...] = ("synthetic", "ucsd", "frames", "avenue", "shanghaitech")
IMAGE_SUFFIXES: frozenset[str] = frozenset({".tif", ".tiff", ".png", ".jpg", ".jpeg", ".bmp"})
VIDEO_SUFFIX = ".avi"
# The training-video folder that identifies each dataset stored as video files.
_VIDEO_MARKERS = {"avenue": ("training_videos",), "shanghaitech": ("training", "videos")}

# Split-folder names as shipped by UCSD (Train/Test) and by the common extracted-frames layouts
# (train/test, training/testing); matched case-insensitively.
_SPLIT_NAMES = {"train": "train", "training": "train", "test": "test", "testing": "test"}

_EXPECTED_LAYOUT = {
    "ucsd": "root/UCSDped2/Train/Train001/001.tif "
    "(or root = UCSDped2, or a folder with Train/Test)",
    "frames": "root/{train,test}/<video>/<frame>.{tif,png,jpg,bmp} "
    "(training/testing and a frames/ level are accepted)",
    "avenue": "root/training_videos/01.avi and root/testing_videos/01.avi "
    "(root = 'Avenue Dataset' or the folder holding it)",
    "shanghaitech": "root/training/videos/01_001.avi and root/testing/frames/01_0014/000.jpg "
    "(root = shanghaitech or the folder holding it)",
}


# --------------------------------------------------------------------------------------------------
# Frame folders
# --------------------------------------------------------------------------------------------------


def _natural_key(path: Path) -> tuple:
    """Sort ``2.tif`` before ``10.tif``: digit runs compare as numbers; names equal that way
    (``1.tif``, ``001.tif``; ``Train001``, ``train001``) by the name itself, so the order never
    depends on the file system's listing."""
    parts = re.split(r"(\d+)", path.name.lower())
    return (tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), path.name)


def _entries(folder: Path) -> list[Path]:
    """The visible entries of ``folder`` (hidden ones, ``.*`` and AppleDouble ``._*``, skipped);
    a link whose target is missing is an error naming it, not an entry silently dropped (a
    video or frame gone from the data without a word)."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    for p in entries:
        if p.is_symlink() and not p.exists():
            raise DataError(
                f"'{p}' is a link to '{p.readlink()}', which does not exist: mount or restore "
                "its target, or delete the link"
            )
    return entries


def _visible_dirs(folder: Path) -> list[Path]:
    return sorted((p for p in _entries(folder) if p.is_dir()), key=_natural_key)


def _split_dirs(folder: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {"train": [], "test": []}
    for child in _visible_dirs(folder):
        split = _SPLIT_NAMES.get(child.name.lower())
        if split is not None:
            found[split].append(child)
    return found


def _video_dirs(split_dir: Path) -> list[Path]:
    """Video folders of one split; UCSD ``*_gt`` mask folders are not videos."""
    dirs = [p for p in _visible_dirs(split_dir) if not p.name.lower().endswith("_gt")]
    # The common extracted layout has one more level: training/frames/<video>/, beside which
    # ShanghaiTech keeps its masks (testing/test_frame_mask/, test_pixel_mask/)
    frames = [d for d in dirs if d.name.lower() == "frames"]
    if frames:
        return _video_dirs(frames[0])
    return dirs


# Bytes a frame takes per pixel at the peak of preparing the data (measured with tracemalloc,
# cudt.data.video.splits.load_video_data): the decoded float32 frames (4) while a split's float32
# sequences are made, held twice as they are joined (8); then, the frames freed, the sequences (4)
# and the float64 pass over the training ones that gives the noise scale sigma_x (8). Each
# bounds the peak where (nearly) every frame trains.
_BYTES_PER_PIXEL = 12
# with keep_frames (the ViT's whole frames, a float32 copy kept beside the sequences)
_BYTES_PER_PIXEL_KEEPING_FRAMES = _BYTES_PER_PIXEL + 4


def check_fits(
    frame_counts: list[int | None],
    *,
    size: int,
    max_frames: int | None,
    what: str,
    keep_frames: bool = False,
) -> None:
    """Before decoding: a :class:`DataError` where the videos (their frame counts, listed
    without decoding; None: unknown, left out) would not fit in the memory available now as
    ``size x size`` frames and their sequences (and, ``keep_frames``, a copy of the frames),
    naming the sizes and the ``--max-videos`` that fits. Full ShanghaiTech at 160x160 holds
    about 317,000 frames: 91 GiB so prepared."""
    counts = [min(n, max_frames) if max_frames is not None else n for n in frame_counts if n]
    available = available_memory()
    if not counts or available is None:
        return
    per_frame = size * size * (_BYTES_PER_PIXEL_KEEPING_FRAMES if keep_frames else _BYTES_PER_PIXEL)
    need = sum(counts) * per_frame
    if need <= available:
        return
    per_video = need / len(counts)
    fit = max(1, int(available // per_video) // 2)  # --max-videos caps each of train and test
    raise DataError(
        f"{what}: {len(counts)} videos of {sum(counts):,} frames need about {_size(need)} of "
        f"memory at {size}x{size} (the frames and their sequences"
        f"{', and the frames kept for the ViT' if keep_frames else ''}), and {_size(available)} is "
        f"available: pass --max-videos {fit} (videos per split) or run where more memory is free"
    )


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def _frame_count(folder: Path) -> int:
    """The image frames in one video folder, counted without decoding them."""
    return sum(1 for p in _entries(folder) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_video(folder: Path, size: int, max_frames: int | None, min_frames: int = 1) -> np.ndarray:
    """``[F, size, size]`` float32 in ``[0, 1]`` from one folder of frames."""
    entries = _entries(folder)
    files = sorted(
        (p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
        key=_natural_key,
    )
    if not files:
        others = sorted({p.suffix.lower() or p.name for p in entries})
        found = f", only {', '.join(others[:3])} files" if others else ""
        raise DataError(
            f"video folder '{folder}' has no image frames "
            f"({', '.join(sorted(IMAGE_SUFFIXES))}){found}: point --data-dir at a video dataset "
            "of frame folders, or extract this video's frames there"
        )
    if max_frames is not None:
        files = files[:max_frames]
    if len(files) < min_frames:
        raise DataError(
            f"video folder '{folder}' has {len(files)} frames, too few frames for one sequence "
            f"of seq_len={min_frames}: pass a smaller --seq-len or remove that folder"
        )
    frames = np.empty((len(files), size, size), np.float32)
    first_size: tuple[int, int] | None = None
    for i, path in enumerate(files):
        try:
            # PIL warns (e.g. "Corrupt EXIF data") on stderr about files it can still decode or
            # is about to refuse; a frame either decodes or raises the one DataError below.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Image.open(path) as im:
                    gray = _grayscale(im, path)  # decodes, so truncated files fail here
        except DataError:
            raise  # decoded, and refused (_grayscale): its own line
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            if isinstance(exc, UnidentifiedImageError):
                reason = "not an image file PIL can read"
            else:
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise DataError(
                f"cannot decode frame '{path}' ({reason}): re-extract that frame or delete the file"
            ) from exc
        if first_size is None:
            first_size = gray.size
        elif gray.size != first_size:
            raise DataError(
                f"frames in video folder '{folder}' differ in size: {files[0].name} is "
                f"{first_size[0]}x{first_size[1]} but {path.name} is "
                f"{gray.size[0]}x{gray.size[1]}; "
                "re-extract the video so all its frames have one size"
            )
        gray = gray.resize((size, size), Image.Resampling.BILINEAR)
        scale = np.float32(1.0 if gray.mode == "F" else 255.0)
        frames[i] = np.asarray(gray, dtype=np.float32) / scale
    return frames


# Frames of more than 8 bits a channel (PIL's modes) and the value of full intensity: 16-bit
# TIFF and PNG (``I;16*``, or ``I`` as PIL opens some 16-bit PNGs), float TIFF in [0, 1] (``F``).
# ``convert("L")`` would clip them to 0-255 instead of scaling them: a 12-bit frame came out
# nearly white, a float one black, and training went on without a word.
_DEEP_MODES = {"I;16": 65535.0, "I;16B": 65535.0, "I;16L": 65535.0, "I;16N": 65535.0}
_DEEP_MODES |= {"I": 65535.0, "F": 1.0}


def _grayscale(im: Image.Image, path: Path) -> Image.Image:
    """The decoded frame in one channel: ``L`` (8 bits, scaled by 1/255 later) or, for a frame
    of more bits, ``F`` already scaled to ``[0, 1]`` by its full intensity (65535 for 16 bits,
    1 for floats); values outside that range are refused, naming the frame."""
    full = _DEEP_MODES.get(im.mode)
    if full is None:
        return im.convert("L")
    values = np.asarray(im, dtype=np.float32)
    if values.size and not (
        np.isfinite(values).all() and values.min() >= 0 and values.max() <= full
    ):
        raise DataError(
            f"frame '{path}' ({im.mode}) holds values outside [0, {full:g}] "
            f"({values.min():g} to {values.max():g}): convert the frames to 8-bit grayscale"
        )
    return Image.fromarray(values / np.float32(full))  # float32: mode F


def _existing_root(root, dataset: str) -> Path:
    """``root`` as a Path, or a DataError naming the expected layout when it is no folder."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise DataError(
            f"data folder '{root}' {what}: pass --data-dir pointing at the extracted dataset "
            f"(expected {_EXPECTED_LAYOUT[dataset]})"
        )
    return root


def ucsd_subsets(root: str | Path) -> list[Path]:
    """The UCSD cameras' folders (``UCSDped1``, ``UCSDped2``) under ``root``, each holding
    ``Train``/``Test``, when ``root`` holds more than one; else ``[root]``. Folders renamed
    (``ped1``, ``ped2``) are cameras too where no ``UCSDped*`` folder is there: the folders
    :func:`load_frame_folders` reads, one by one."""
    root = _existing_root(root, "ucsd")
    if any(_split_dirs(root).values()):
        return [root]
    found = _ucsd_cameras(root)
    return found if len(found) > 1 else [root]


def _ucsd_cameras(root: Path) -> list[Path]:
    """The folders under ``root`` holding ``Train``/``Test``: the ``UCSDped*`` ones where there
    are any (a copy of the archive beside them is another folder), else all of them."""
    nested = [d for d in _visible_dirs(root) if any(_split_dirs(d).values())]
    return [d for d in nested if d.name.lower().startswith("ucsdped")] or nested


def load_frame_folders(
    root: str | Path,
    *,
    dataset: str = "ucsd",
    size: int = 160,
    max_videos: int | None = None,
    max_frames: int | None = None,
    min_frames: int = 1,
    keep_frames: bool = False,
) -> dict[str, list[np.ndarray]]:
    """Read train/test videos stored as folders of frames.

    Layouts (folder names matched case-insensitively; hidden entries, ``*_gt`` folders and
    non-image files are skipped; frames sorted in natural order, ``2.tif`` before ``10.tif``):

    * ``dataset="ucsd"``: ``root/UCSDped1|UCSDped2/Train/Train001/001.tif`` (every ``UCSDped*``
      folder found is read, in name order: point ``root`` at ``UCSDped2`` to read only Ped2;
      ``load_video_data`` splits each camera's training videos apart, :func:`ucsd_subsets`), or
      ``root`` itself holding ``Train``/``Test``.
    * ``dataset="frames"``: ``root/{train,test}/<video>/<frame>.{tif,png,jpg,...}``; ``training``/
      ``testing`` and an extra ``frames/`` level (``training/frames/01/0000.jpg``) are accepted, as
      is one dataset folder in between (``root/avenue/training/...``).

    Each frame is converted to grayscale ``L``, resized to ``size x size`` (bilinear) and scaled by
    1/255; a 16-bit frame by 1/65535 and a float frame as it is (values in [0, 1]). ``max_videos`` caps the videos per split, ``max_frames`` the frames per video (the first
    ones); a video with fewer than ``min_frames`` frames is refused (naming its folder).
    ``keep_frames``: the caller keeps a copy of the frames too (``load_video_data``'s): counted
    by the check that they fit in memory (:func:`check_fits`), made before decoding.

    Returns:
        ``{"train": [[F, size, size] float32, ...], "test": [...]}``; a split without a folder is an
        empty list.
    """
    if dataset not in ("ucsd", "frames"):
        raise DataError(
            f"load_frame_folders reads dataset 'ucsd' or 'frames', got {dataset!r}: "
            "pass one of them"
        )
    root = _existing_root(root, dataset)
    splits = _split_dirs(root)
    if not splits["train"] and not splits["test"]:
        # One level down: UCSDped1/UCSDped2 (ucsd), or one dataset folder (frames).
        nested = [d for d in _visible_dirs(root) if any(_split_dirs(d).values())]
        if dataset == "ucsd":
            nested = _ucsd_cameras(root)
        elif len(nested) > 1:
            names = ", ".join(d.name for d in nested)
            raise DataError(
                f"several datasets under '{root}' ({names}): point --data-dir at one of them"
            )
        for d in nested:
            for split, dirs in _split_dirs(d).items():
                splits[split].extend(dirs)

    videos = {split: [v for d in dirs for v in _video_dirs(d)] for split, dirs in splits.items()}
    _refuse_video_archive(root, dataset, [v for found in videos.values() for v in found])
    if max_videos is not None:
        videos = {split: found[:max_videos] for split, found in videos.items()}
    check_fits(
        [n for found in videos.values() for n in map(_frame_count, found)],
        size=size,
        max_frames=max_frames,
        what=f"--dataset {dataset} '{root}'",
        keep_frames=keep_frames,
    )
    out = {
        split: [_read_video(v, size, max_frames, min_frames) for v in found]
        for split, found in videos.items()
    }
    if not out["train"] and not out["test"]:
        near = _layout_nearby(root)
        hint = f" ('{near}' holds it: pass --data-dir '{near}')" if near else ""
        raise DataError(
            f"no video folders found under '{root}'{hint}: expected {_EXPECTED_LAYOUT[dataset]}; "
            "extract the dataset in that layout or point --data-dir at the right folder"
        )
    return out


def _layout_nearby(root: Path) -> Path | None:
    """A folder near ``root`` holding train/test folders, when ``root`` is one level off: a
    split folder (``…/UCSDped2/Train``), a video folder (``…/Train/Train001``), or the folder
    an archive was extracted into, two levels above the split folders."""
    if root.name.lower() in _SPLIT_NAMES:
        return root.parent
    if root.parent.name.lower() in _SPLIT_NAMES:
        return root.parent.parent
    for child in _visible_dirs(root):
        for grandchild in _visible_dirs(child):
            if any(_split_dirs(grandchild).values()):
                return child
    return None


# --------------------------------------------------------------------------------------------------
# Video files: CUHK Avenue, ShanghaiTech
# --------------------------------------------------------------------------------------------------


def _child_dir(folder: Path, *names: str) -> Path | None:
    """``folder/names[0]/names[1]/...`` matched case-insensitively among visible folders."""
    for name in names:
        match = [d for d in _visible_dirs(folder) if d.name.lower() == name]
        if not match:
            return None
        folder = match[0]
    return folder


def _dataset_root(root: Path, dataset: str, marker: tuple[str, ...]) -> Path | None:
    """``root`` if it holds ``marker`` (a folder path), else its one child that does."""
    if _child_dir(root, *marker) is not None:
        return root
    found = [d for d in _visible_dirs(root) if _child_dir(d, *marker) is not None]
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise DataError(
            f"several {dataset} datasets under '{root}' ({names}): point --data-dir at one of them"
        )
    return found[0] if found else None


def _video_files(folder: Path) -> list[Path]:
    """The ``.avi`` files of ``folder`` in natural order; hidden (``.*``, ``._*``) and other
    files are skipped; none is an error naming what was there."""
    visible = [p for p in _entries(folder) if p.is_file()]
    files = sorted((p for p in visible if p.suffix.lower() == VIDEO_SUFFIX), key=_natural_key)
    if not files:
        others = sorted({p.suffix.lower() or p.name for p in visible})
        found = f", only {', '.join(others[:3])} files" if others else ""
        raise DataError(
            f"no {VIDEO_SUFFIX} videos in '{folder}' (hidden files skipped){found}: put the "
            "dataset's videos there or point --data-dir at the extracted dataset"
        )
    return files


def _video_archives(root: Path) -> list[tuple[str, Path]]:
    """``(dataset, folder)`` of each dataset stored as videos in ``root`` or a folder in it:
    its training folder (``training_videos``, ``training/videos``) with ``.avi`` files."""
    found = []
    for other, marker in _VIDEO_MARKERS.items():
        for d in [root, *_visible_dirs(root)]:
            folder = _child_dir(d, *marker)
            if folder is not None and any(
                p.suffix.lower() == VIDEO_SUFFIX for p in _entries(folder) if p.is_file()
            ):
                found.append((other, folder))
    return found


def _refuse_video_archive(root: Path, dataset: str, video_dirs: list[Path]) -> None:
    """Frame folders read from a dataset stored as videos (its training videos' folder taken
    for a frame folder: "no image frames"), or none found where such a dataset is: a
    DataError naming the dataset to pass. One beside the frame folders read is left alone, as
    is one beside a folder that holds them (the no-videos error names that folder)."""
    for other, folder in _video_archives(root):
        inside = any(v == folder or folder in v.parents for v in video_dirs)
        if inside or (not video_dirs and _layout_nearby(root) is None):
            raise DataError(
                f"'{root}' holds the {other} archive's videos ({folder}/*{VIDEO_SUFFIX}), not "
                f"{dataset} frame folders: pass --dataset {other}"
            )


def _frame_folders_reader(root: Path) -> str | None:
    """The dataset that reads ``root`` where it, or a folder in it, holds training videos as
    folders of image frames: ``ucsd`` (UCSD's ``Train/``), else ``frames`` (Avenue or
    ShanghaiTech with their frames extracted, ``training/frames/01/0000.jpg``); None elsewhere."""
    for d in [root, *_visible_dirs(root)]:
        for split_dir in _split_dirs(d)["train"]:
            videos = _video_dirs(split_dir)
            if videos and _frame_count(videos[0]):
                return "ucsd" if split_dir.name == "Train" else "frames"
    return None


def _layout_error(root: Path, dataset: str) -> DataError:
    """No ``dataset`` layout under ``root``: name the folder expected, and a wrong dataset name."""
    hint = ""
    for other, marker in _VIDEO_MARKERS.items():
        candidates = [root, *_visible_dirs(root)]
        if other != dataset and any(_child_dir(d, *marker) for d in candidates):
            hint = f" (this looks like the {other} layout: pass --dataset {other})"
    reader = _frame_folders_reader(root)
    if not hint and reader is not None:
        hint = f" (it holds the videos as folders of frames: pass --dataset {reader})"
    return DataError(
        f"no {'/'.join(_VIDEO_MARKERS[dataset])}/ folder under '{root}' or its subfolders{hint}: "
        f"expected the {dataset} layout {_EXPECTED_LAYOUT[dataset]}; point --data-dir at the "
        "extracted dataset"
    )


def load_videos(
    root: str | Path,
    *,
    dataset: str = "ucsd",
    size: int = 160,
    max_videos: int | None = None,
    max_frames: int | None = None,
    min_frames: int = 1,
    keep_frames: bool = False,
) -> dict[str, list[np.ndarray]]:
    """Train/test videos of a real dataset in the layout its archive extracts to.

    * ``"ucsd"``, ``"frames"``: :func:`load_frame_folders`.
    * ``"avenue"`` (CUHK Avenue): ``root/training_videos/01.avi ...`` and
      ``root/testing_videos/01.avi ...``; ``root`` may also be the folder holding
      ``Avenue Dataset/``. The ground truth beside them (``training_vol/``, ``testing_vol/``,
      ``testing_label_mask/``, ``ground_truth_demo/``) is ignored.
    * ``"shanghaitech"``: ``root/training/videos/01_001.avi ...`` and
      ``root/testing/frames/01_0014/000.jpg ...`` (one frame folder per test clip, frames in
      numeric order); ``root`` may also be the folder holding ``shanghaitech/``. The masks
      (``testing/test_frame_mask/``, ``testing/test_pixel_mask/``) are ignored.

    Folder names match case-insensitively; videos are read in natural name order; hidden files
    (``.DS_Store``, AppleDouble ``._01.avi``) and other non-video files are skipped. ``.avi`` files
    are decoded with PyAV (:func:`cudt.data.video.avi.read_avi`), frame folders as for UCSD; both give
    grayscale ``[F, size, size]`` float32 in ``[0, 1]``. ``max_videos`` caps the videos per split,
    ``max_frames`` the frames per video (the first ones); a video with fewer than ``min_frames``
    frames is refused; ``keep_frames`` as for :func:`load_frame_folders`.

    Returns:
        ``{"train": [[F, size, size], ...], "test": [...]}``.
    """
    if dataset not in DATASETS or dataset == "synthetic":
        raise DataError(
            f"load_videos reads a real dataset ({', '.join(DATASETS[1:])}), got {dataset!r}: "
            "pass one of them"
        )
    root = _existing_root(root, dataset)
    if dataset in ("ucsd", "frames"):
        return load_frame_folders(
            root,
            dataset=dataset,
            size=size,
            max_videos=max_videos,
            max_frames=max_frames,
            min_frames=min_frames,
            keep_frames=keep_frames,
        )
    # PyAV loads only for the datasets stored as videos
    from cudt.data.video.avi import listed_frames, read_avi

    def cap(items: list[Path]) -> list[Path]:
        return items if max_videos is None else items[:max_videos]

    def avi(path: Path) -> np.ndarray:
        return read_avi(path, size=size, max_frames=max_frames, min_frames=min_frames)

    if dataset == "avenue":
        base = _dataset_root(root, dataset, _VIDEO_MARKERS[dataset])
        if base is None:
            raise _layout_error(root, dataset)
        test_dir = _child_dir(base, "testing_videos")
        if test_dir is None:
            raise DataError(
                f"no testing_videos/ folder beside '{_child_dir(base, 'training_videos')}': "
                f"extract the test videos there (expected {_EXPECTED_LAYOUT[dataset]})"
            )
        train_files = cap(_video_files(_child_dir(base, "training_videos")))
        test_files = cap(_video_files(test_dir))
        counts = [listed_frames(p) for p in train_files + test_files]
        fits = dict(size=size, max_frames=max_frames, keep_frames=keep_frames)
        check_fits(counts, **fits, what=f"--dataset avenue '{base}'")
        return {"train": [avi(p) for p in train_files], "test": [avi(p) for p in test_files]}

    base = _dataset_root(root, dataset, _VIDEO_MARKERS[dataset])
    if base is None:
        raise _layout_error(root, dataset)
    test_dir = _child_dir(base, "testing", "frames")
    if test_dir is None:
        raise DataError(
            f"no testing/frames/ folder in '{base}': extract the test clips' frame folders there "
            f"(expected {_EXPECTED_LAYOUT[dataset]})"
        )
    clips = cap(_visible_dirs(test_dir))
    if not clips:
        raise DataError(
            f"no test clip folders in '{test_dir}': extract the test clips there, one frame "
            "folder per clip (testing/frames/01_0014/000.jpg)"
        )
    train_files = _shanghaitech_training(base, max_videos)
    counts = [listed_frames(p) for p in train_files] + [_frame_count(d) for d in clips]
    fits = dict(size=size, max_frames=max_frames, keep_frames=keep_frames)
    check_fits(counts, **fits, what=f"--dataset shanghaitech '{base}'")
    return {
        "train": [avi(p) for p in train_files],
        "test": [_read_video(d, size, max_frames, min_frames) for d in clips],
    }


def _shanghaitech_training(base: Path, max_videos: int | None) -> list[Path]:
    """ShanghaiTech's training videos under ``base`` in natural order, the first ``max_videos``."""
    files = _video_files(_child_dir(base, "training", "videos"))
    return files if max_videos is None else files[:max_videos]


def training_scenes(
    root: str | Path, dataset: str, max_videos: int | None = None
) -> list[str] | None:
    """The scene (camera) of each training video :func:`load_videos` reads, in its order, for
    a dataset whose videos come from several scenes and say which: ShanghaiTech's
    ``<scene>_<clip>.avi`` (13 cameras). None for the others (one camera each; UCSD's two are
    read apart, :func:`ucsd_subsets`)."""
    if dataset != "shanghaitech":
        return None
    base = _dataset_root(_existing_root(root, dataset), dataset, _VIDEO_MARKERS[dataset])
    if base is None:
        return None  # load_videos says what is wrong with the folder
    return [p.stem.split("_", 1)[0] for p in _shanghaitech_training(base, max_videos)]
