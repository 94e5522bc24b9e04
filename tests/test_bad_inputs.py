"""Bad input, tried as a new user would: every case exits 2 with ONE line ``error: <problem>:
<fix>``, no traceback, and nothing the user already had is overwritten or left half-written.

Cases are driven through the command line: ``experiments.video_denoise.main(argv)`` in-process
(its exit status is the return value, or ``SystemExit.code`` for flag errors), a real subprocess
where the process itself must be limited (a full disk, simulated with ``RLIMIT_FSIZE``, which
works as root), ``cudt.runner.cli.run_cli(lambda: cudt.load_encoder(folder))`` for pretrained weights,
and the same weights through ``experiments.text_classify --checkpoint FOLDER``.

Every case's message is checked against its row of docs/errors.md in the test that records it,
and a test reads this module's source for the cases that docs/errors.md must list: neither
depends on which tests ran or in what order. ``CUDT_ERRORS_TABLE=path pytest
tests/test_bad_inputs.py`` writes the tables of case -> message (from this run's real output)
that docs/errors.md shows, without comparing them with the page.
"""

from __future__ import annotations

import ast
import gc
import hashlib
import io
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import BERT_BLOCK, LockHolder, exit_status, finished_job, random_blocks
from PIL import Image
from safetensors.numpy import save_file

import cudt
from cudt.runner.cli import run_cli
from experiments import combine, video_denoise

ROOT = Path(__file__).resolve().parents[1]

# A tiny run: one layer of DUST and UT, 4 steps in chunks of 2 (checkpoints at steps 2 and 4),
# one seed. Four groups: DUST ERM and constrained (one dictionary per layer: another model), the
# control (ERM DUST with per-layer dictionaries), and UT, whose ERM and constrained runs share
# one program.
TINY = [
    "--models",
    "dust,ut",
    "--dust-atoms",
    "16",
    "--layers",
    "1",
    "--steps",
    "4",
    "--chunk-steps",
    "2",
    "--seeds",
    "1",
    "--batch-size",
    "4",
    "--num-videos",
    "3",
    "--num-frames",
    "4",
    "--seq-len",
    "4",
]
RESULTS = ("results.json", "layer_loss.png", "rmse_vs_gamma.png", "training_curves.png")
# Progress reports of the tiny run, on stderr before a failure after training started: its
# progress bars and "resumed from" notes.
PROGRESS = re.compile(
    r"^(dust-1 (ERM|constrained)|dust-pl-1 ERM|ut-1):"
    r"(\s+\d+%\|| resumed from the checkpoint at step)"
)

# case -> (section, message, exit status), for docs/errors.md
MESSAGES: dict[str, tuple[str, str, int]] = {}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def cli(argv, capsys) -> tuple[int, str]:
    """Runs the video CLI in-process: ``(exit status, stderr)``.

    What a command-line run would also print on stderr counts as stderr here: Python warnings
    (default filters), log records of WARNING and above (the root logger's default), and
    unraisable exceptions (e.g. a coroutine dying when collected, flushed by ``gc.collect``).
    """
    capsys.readouterr()
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    handler.setLevel(logging.WARNING)
    unraisable: list[str] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"Exception ignored in: {u.object!r}\n")
    logging.getLogger().addHandler(handler)
    # what existed before the call is set aside, so the collection below walks only what the
    # call made (a worker's heap after hundreds of tests: a full collection took ~1 s a call)
    gc.freeze()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
                warnings.filterwarnings("ignore", category=category)
            status = exit_status(video_denoise.main, argv)
            gc.collect()
    finally:
        gc.unfreeze()
        logging.getLogger().removeHandler(handler)
        sys.unraisablehook = previous_hook
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught
    )
    return status, shown + logged.getvalue() + "".join(unraisable) + capsys.readouterr().err


def entry_cli(main, argv, capsys) -> tuple[int, str]:
    """Runs an entry point's ``main`` in-process: ``(exit status, stderr)``."""
    capsys.readouterr()
    status = exit_status(main, argv)
    return status, capsys.readouterr().err


# Starts the CLI with a file size limit: SIGXFSZ ignored, so a write past the limit fails with
# EFBIG ("File too large"), as a write to a full disk fails with ENOSPC; it works as root.
_LIMITED = (
    "import os, resource, signal, sys; "
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'experiments.video_denoise', *sys.argv[2:]])"
)


def cli_subprocess(argv, *, max_file_bytes: int | None = None) -> tuple[int, str]:
    """Runs the video CLI as a real process, as a user starts it (a fresh interpreter), unable
    to write a file past ``max_file_bytes`` when that is given.

    Without the session's compilation cache (tests/conftest.py): on a full disk its writes
    fail too, and jax warns of each on stderr, which must hold the CLI's one line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if max_file_bytes is None:
        command = [sys.executable, "-m", "experiments.video_denoise"]
    else:
        command = [sys.executable, "-c", _LIMITED, str(max_file_bytes)]
    proc = subprocess.run(
        [*command, *map(str, argv)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


def check(case, status: int, err: str, problem: str, fix: str, *, progress=False) -> str:
    """Exit status 2 and exactly one stderr line ``error: ...`` naming the problem and the fix.

    ``progress=True``: the run failed after training started, so stderr also holds that run's
    progress report (bars, "resumed from ..."), not errors; it is set aside first.
    """
    assert "Traceback" not in err, err
    text = err
    if progress:
        text = "\n".join(s for s in re.split(r"[\r\n]", err) if s and not PROGRESS.match(s))
    lines = text.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: "), err
    assert problem in line, (problem, line)
    assert fix in line, (fix, line)
    assert status == 2, (status, err)
    if case is not None:
        section = _section()
        MESSAGES[case] = (section, line, status)
        if not os.environ.get("CUDT_ERRORS_TABLE"):  # regenerating: the page may be stale
            shown = _as_in_docs(line)
            assert _docs_rows().get(case) == (section, status, shown), (
                f"docs/errors.md's row {case!r} is not this run's message "
                f"({section!r}, {status}, {shown!r}): regenerate it with CUDT_ERRORS_TABLE "
                "(see the top of tests/test_bad_inputs.py)"
            )
    return line


# Sections of docs/errors.md, by the test that records a case.
SECTIONS = {
    "test_invalid_config": "Flags and config values",
    "test_bad_data_folder": "Data folders",
    "test_bad_weights": "Pretrained weights (`cudt.load_encoder`, `--checkpoint FOLDER`)",
    "test_model_flag": "Pretrained weights (`cudt.load_encoder`, `--checkpoint FOLDER`)",
    "test_output": "Output folder, full disk",
    "test_disk_full": "Output folder, full disk",
    "test_llm_": "Instruction data and model exports (`experiments.llm_sft`, "
    "`experiments.export_decoder`)",
    "test_held_out_data": "Held-out data sets (`experiments.held_out_data`)",
    "test_": "Checkpoints in `--out`",
}


def _section(test: str | None = None) -> str:
    """The docs/errors.md section of a test's cases (by default the test running now)."""
    if test is None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1]
    return next(title for prefix, title in SECTIONS.items() if test.startswith(prefix))


# The pytest base temporary folder, as docs/errors.md writes it: /tmp/ (set for every test).
_TEMP_BASE: list[str] = []


@pytest.fixture(autouse=True)
def _temp_base(tmp_path_factory):
    _TEMP_BASE[:] = [str(tmp_path_factory.getbasetemp())]


def _as_in_docs(line: str) -> str:
    """A message with each test's temporary folder written as /tmp/, as docs/errors.md has it,
    and the holder of a lock (its PID, host and start) as one example holder."""
    for base in _TEMP_BASE:
        line = re.sub(re.escape(base) + r"/[^/]+/", "/tmp/", line)
    return re.sub(
        r"PID \d+ on host [^,]+, started [^)]+",
        "PID 12345 on host node1, started 2026-01-01 12:00:00 UTC",
        line,
    )


def tree(path: Path) -> dict[str, str] | None:
    """Every file and folder under ``path`` with a hash of its bytes (None: nothing there)."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def temp_files(path: Path) -> list[str]:
    """Half-written leftovers: our atomic-write temporaries and orbax's temporary folders."""
    return [
        str(p)
        for p in path.rglob("*")
        if p.name.endswith(".tmp") or "orbax-checkpoint-tmp" in p.name
    ]


def previous_run(folder: Path) -> Path:
    """An --out folder holding the results of an earlier finished run."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text('{"experiment": "video_denoise", "runs": []}')
    (folder / "layer_loss.png").write_bytes(b"\x89PNG earlier figure")
    return folder


def write_video(folder: Path, frames: int = 4, size=(32, 32), suffix=".tif") -> None:
    folder.mkdir(parents=True)
    for i in range(frames):
        Image.new("L", size, 20 * i + 10).save(folder / f"{i + 1:03d}{suffix}")


def ucsd(root: Path, frames: int = 4) -> Path:
    """A UCSD Anomaly layout: ``root/UCSDped2/{Train,Test}/<video>/001.tif ...``."""
    ped2 = root / "UCSDped2"
    for video in ("Train/Train001", "Train/Train002", "Test/Test001", "Test/Test002"):
        write_video(ped2 / video, frames)
    return ped2


# --------------------------------------------------------------------------------------------
# Invalid flags and config values: refused before anything is read or written
# --------------------------------------------------------------------------------------------

CONFIG_CASES = [
    # (case, flags, problem, fix)
    ("epsilon = 1", ["--epsilon", "1"], "got 1.0", "--epsilon must lie in [0, 1)"),
    ("epsilon < 0", ["--epsilon=-0.1"], "got -0.1", "--epsilon must lie in [0, 1)"),
    ("learning rate 0", ["--lr", "0"], "got 0.0", "--lr must be a finite number > 0"),
    ("negative learning rate", ["--lr=-1e-3"], "got -0.001", "--lr must be a finite number > 0"),
    ("infinite learning rate", ["--lr", "inf"], "got inf", "--lr must be a finite number > 0"),
    (
        "negative dual learning rate",
        ["--dual-lr", "-0.01"],
        "got -0.01",
        "--dual-lr must be a finite number > 0",
    ),
    (
        "negative value written as a separate word",
        ["--lr", "-1e-3"],
        "argument --lr: expected one argument",
        "a negative one as --lr=-1e-3",
    ),
    ("layers 0", ["--layers", "0"], "got 0", "--layers must be >= 1"),
    (
        "layers not a number",
        ["--layers", "three"],
        "'three' is not an integer",
        "pass a whole number",
    ),
    (
        "negative gamma",
        ["--gamma-train", "-0.5"],
        "got -0.5",
        "--gamma-train must be a finite number >= 0",
    ),
    (
        "negative test gamma",
        ["--test-gammas", "0.5,-1"],
        "got -1.0",
        "--test-gammas must all be finite numbers >= 0",
    ),
    (
        "DUST atoms below the patch side",
        ["--dust-atoms", "12"],
        "--dust-atoms 12 is below the patch side 16",
        "pass --dust-atoms 16 or more",
    ),
    (
        "unknown DUST initial code",
        ["--dust-initial-code", "blank"],
        "--dust-initial-code must be one of dual, adjoint, zero",
        "got 'blank'",
    ),
    (
        "unknown model",
        ["--models", "ut,transformer"],
        "--models must all be one of dust, ut, vit",
        "got 'transformer'",
    ),
    (
        "unknown dataset",
        ["--dataset", "kitti"],
        "--dataset must be one of synthetic, ucsd, frames, avenue, shanghaitech",
        "got 'kitti'",
    ),
    (
        "--inject-nan of a model the run does not train",
        ["--inject-nan", "vit,ERM,0,3"],
        "--inject-nan model 'vit' is not trained by this run",
        "name one of dust, dust-pl, ut",
    ),
    ("seeds 0", ["--seeds", "0"], "got 0", "--seeds must be >= 1"),
    ("negative seed", ["--seed", "-1"], "got -1", "--seed must be >= 0"),
    ("steps 0", ["--steps", "0"], "got 0", "--steps must be >= 1"),
    ("batch size 0", ["--batch-size", "0"], "got 0", "--batch-size must be >= 1"),
    (
        "fewer synthetic frames than --seq-len",
        ["--num-frames", "4", "--seq-len", "8"],
        "--num-frames (4)",
        "must be >= --seq-len (8)",
    ),
    ("max videos 0", ["--max-videos", "0"], "got 0", "--max-videos must be >= 1"),
    (
        "frame dataset without --data-dir",
        ["--dataset", "ucsd"],
        "--dataset ucsd needs --data-dir",
        "pointing at the frame folders",
    ),
    (
        "misspelt flag",
        ["--learning-rate", "0.1"],
        "unrecognized arguments: --learning-rate 0.1",
        "see --help",
    ),
    ("learning rate nan", ["--lr", "nan"], "got nan", "--lr must be a finite number > 0"),
    (
        "malformed --sweep",
        ["--sweep", "epsilon"],
        "--sweep 'epsilon' must be NAME=V1,V2,...",
        "(e.g. epsilon=0.05,0.1)",
    ),
    (
        "--sweep of a field that cannot be swept",
        ["--sweep", "layers=3,5"],
        "--sweep layers is not sweepable",
        "choose from epsilon, epsilon_schedule, reference, lr, dual_lr, resilience, gamma_train",
    ),
    (
        "--sweep value out of range",
        ["--sweep", "epsilon=0.1,1"],
        "got 1.0",
        "--sweep epsilon must all lie in [0, 1)",
    ),
    (
        "--sweep resilience none with explicit slacks",
        ["--sweep", "resilience=none,2", "--resilience", "2", "--resilience-mode", "slack"],
        "none is not allowed with --resilience-mode slack",
        "drop none or use --resilience-mode decay",
    ),
    (
        "malformed --epsilon-schedule",
        ["--epsilon-schedule", "exp:0@10"],
        "--epsilon-schedule must be constant or SHAPE:START@STEPS[+BEGIN]",
        "got 'exp:0@10'",
    ),
    (
        "--epsilon-schedule longer than the run",
        ["--epsilon-schedule", "linear:0@500"],
        "reaches epsilon at step 500, after the run's 4 steps",
        "shorten it or pass more --steps",
    ),
    (
        "--distributed outside a cluster job",
        ["--distributed"],
        "--distributed: cannot join the job",
        "set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID",
    ),
    (
        "--reference chance on a denoising task",
        ["--reference", "chance"],
        "--reference chance needs a classification task",
        "pass a number or none",
    ),
    (
        "--resume with --overwrite",
        ["--resume", "--overwrite"],
        "--resume and --overwrite contradict each other",
        "pass one of them",
    ),
    (
        "--constraint not a kind",
        ["--constraint", "median"],
        "--constraint must be one of mean, indexed, tail",
        "got 'median'",
    ),
    (
        "--tail-beta without --constraint tail",
        ["--tail-beta", "0.5"],
        "--tail-beta is the beta of --constraint tail",
        "pass --constraint tail or drop it",
    ),
    (
        "--tail-beta outside (0, 1]",
        ["--constraint", "tail", "--tail-beta", "0"],
        "--tail-beta must lie in (0, 1]",
        "got 0.0",
    ),
    (
        "--sweep penalty with the Lagrangian",
        ["--sweep", "penalty=1,2"],
        "--penalty is rho of --formulation augmented or penalty",
        "pass one of them or drop it",
    ),
    (
        "--nupi-kp without --dual-optimizer nupi",
        ["--dual-optimizer", "sgd", "--nupi-kp", "1"],  # the video default is nupi
        "--nupi-kp is a gain of --dual-optimizer nupi",
        "pass --dual-optimizer nupi or drop it",
    ),
    (
        "--multipliers not a kind",
        ["--multipliers", "model"],
        "--multipliers must be one of table, implicit",
        "got 'model'",
    ),
    (
        "--multipliers implicit without --constraint indexed",
        ["--multipliers", "implicit"],
        "--multipliers implicit needs per-example constraints",
        "pass --constraint indexed or drop --multipliers",
    ),
    (
        "--multipliers implicit with the penalty formulation",
        ["--constraint", "indexed", "--multipliers", "implicit", "--formulation", "penalty"],
        "--multipliers implicit has no multipliers to learn under --formulation penalty",
        "pass --formulation lagrangian or augmented, or drop --multipliers",
    ),
    (
        "--multipliers implicit with explicit slacks",
        ["--constraint", "indexed", "--multipliers", "implicit"]
        + ["--resilience-mode", "slack", "--resilience", "1"],
        "--multipliers implicit cannot keep explicit slacks (a table of one per example)",
        "pass --resilience-mode decay or --multipliers table",
    ),
]


@pytest.mark.parametrize(
    "case, flags, problem, fix", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_invalid_config(case, flags, problem, fix, tmp_path, capsys):
    out = previous_run(tmp_path / "out")
    before = tree(out)
    if "--distributed" in flags:
        # what jax.distributed.initialize says depends on whether this process has started
        # JAX's backend (which earlier tests do): a fresh process, as the user's, says the same
        # whatever ran before
        status, err = cli_subprocess([*TINY, *flags, "--out", out])
    else:
        status, err = cli([*TINY, *flags, "--out", out], capsys)
    check(case, status, err, problem, fix)
    assert tree(out) == before


# --------------------------------------------------------------------------------------------
# Data folders: refused before --out is touched
# --------------------------------------------------------------------------------------------


def _missing(root: Path) -> Path:
    return root / "UCSD_Anomaly_Dataset.v1p2"


def _empty(root: Path) -> Path:
    (root / "empty").mkdir()
    return root / "empty"


def _a_file(root: Path) -> Path:
    (root / "UCSDped2.tar.gz").write_bytes(b"\x1f\x8b archive, not extracted")
    return root / "UCSDped2.tar.gz"


def _text_dataset(root: Path) -> Path:
    # aclImdb, the text-classification data set: train/test folders, but of .txt reviews.
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            (root / "aclImdb" / split / label).mkdir(parents=True)
            (root / "aclImdb" / split / label / "0_9.txt").write_text("a fine film")
    return root / "aclImdb"


def _image_dataset(root: Path) -> Path:
    # An image-classification folder (one folder of pictures per class): no video layout.
    write_video(root / "pictures" / "cat", 2, suffix=".png")
    write_video(root / "pictures" / "dog", 2, suffix=".png")
    return root / "pictures"


def _corrupt_frame(root: Path) -> Path:
    ped2 = ucsd(root)
    (ped2 / "Train" / "Train001" / "002.tif").write_bytes(b"II*\x00 not really a tiff")
    return root


def _truncated_frame(root: Path) -> Path:
    ped2 = ucsd(root)
    frame = ped2 / "Train" / "Train002" / "003.tif"
    noise = np.random.default_rng(0).integers(0, 255, (64, 64), np.uint8)
    Image.fromarray(noise).save(frame)
    frame.write_bytes(frame.read_bytes()[:600])  # a copy interrupted half-way
    return root


def _mixed_sizes(root: Path) -> Path:
    ped2 = ucsd(root)
    Image.new("L", (40, 32), 0).save(ped2 / "Test" / "Test002" / "005.tif")
    return root


def _non_image_files(root: Path) -> Path:
    ped2 = ucsd(root)
    video = ped2 / "Test" / "Test001"
    (video / "README.txt").write_text("notes")  # skipped: not a frame suffix
    (video / "Thumbs.db").write_bytes(b"\x00\x01")  # skipped
    (video / "005.jpg").write_text("<html>404 Not Found</html>")  # a failed download
    return root


def _too_few_frames(root: Path) -> Path:
    ucsd(root, frames=3)  # --seq-len 4
    return root


def _no_test_videos(root: Path) -> Path:
    write_video(root / "UCSDped2" / "Train" / "Train001")
    return root


DATA_CASES = [
    # (case, build the --data-dir, problem, fix)
    ("data folder missing", _missing, "does not exist", "pass data_dir pointing at the extracted"),
    ("data folder empty", _empty, "no video folders found", "extract the dataset in that layout"),
    (
        "data folder is a file",
        _a_file,
        "is not a folder",
        "pass data_dir pointing at the extracted",
    ),
    (
        "wrong dataset: a text dataset",
        _text_dataset,
        "has no image frames (.bmp, .jpeg, .jpg, .png, .tif, .tiff), only .txt files",
        "point data_dir at a video dataset of frame folders",
    ),
    (
        "wrong dataset: an image dataset",
        _image_dataset,
        "no video folders found under",
        "expected root/UCSDped2/Train/Train001/001.tif",
    ),
    (
        "corrupt frame",
        _corrupt_frame,
        "Train001/002.tif' (not an image file PIL can read)",
        "re-extract that frame or delete the file",
    ),
    (
        "truncated frame",
        _truncated_frame,
        "Train002/003.tif' (image file is truncated",
        "re-extract that frame or delete the file",
    ),
    (
        "frames of mixed sizes",
        _mixed_sizes,
        "differ in size: 001.tif is 32x32 but 005.tif is 40x32",
        "re-extract the video so all its frames have one size",
    ),
    (
        "non-image file among the frames",
        _non_image_files,
        "Test001/005.jpg' (not an image file PIL can read)",
        "re-extract that frame or delete the file",
    ),
    (
        "too few frames for one sequence",
        _too_few_frames,
        "Train001' has 3 frames, too few frames for one sequence of seq_len=4",
        "pass a smaller --seq-len or remove that folder",
    ),
    (
        "no test videos",
        _no_test_videos,
        "need at least 1 test video",
        "add test videos",
    ),
]


@pytest.mark.parametrize("case, build, problem, fix", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data_folder(case, build, problem, fix, tmp_path, capsys):
    root = tmp_path / "data"
    root.mkdir()
    data_dir = build(root)
    before = tree(root)
    out = tmp_path / "out"
    status, err = cli([*TINY, "--dataset", "ucsd", "--data-dir", data_dir, "--out", out], capsys)
    check(case, status, err, problem, fix)
    assert not out.exists()  # the data is read before --out is created
    assert tree(root) == before  # and the data is only read


def test_the_data_folders_are_broken_copies_of_one_that_loads(tmp_path):
    from cudt.data.video import load_video_data

    data = load_video_data("ucsd", ucsd(tmp_path), seq_len=4, size=32)
    # validation comes from the training videos (Train002), testing from both test videos
    assert data.train.shape == data.val.shape == (4, 4, 256) and data.test.shape == (8, 4, 256)


# --------------------------------------------------------------------------------------------
# Pretrained weights (cudt.load_encoder): refused with one line; pickles are never unpickled
# --------------------------------------------------------------------------------------------

D, F, V, P = 8, 12, 20, 16  # hidden, MLP, vocabulary, positions of a tiny BERT


def bert_folder(folder: Path, *, config=None, tensors=None) -> Path:
    """A Hugging Face BERT folder (config.json + model.safetensors) with random weights."""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    t = {
        "embeddings.word_embeddings.weight": rand(V, D),
        "embeddings.position_embeddings.weight": rand(P, D),
        "embeddings.token_type_embeddings.weight": rand(2, D),
        "embeddings.LayerNorm.weight": rand(D),
        "embeddings.LayerNorm.bias": rand(D),
    }
    t.update(random_blocks(rand, 1, BERT_BLOCK, D, F, norm_offset=0.0))
    cfg = dict(
        model_type="bert",
        hidden_size=D,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=F,
        vocab_size=V,
        max_position_embeddings=P,
        type_vocab_size=2,
        hidden_act="gelu",
    )
    cfg.update(config or {})
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(t if tensors is None else tensors, str(folder / "model.safetensors"))
    return folder


class _Trap:
    """Unpickling this creates the file ``marker``: proof that a loader unpickled it."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _pickle_only(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(marker)))
    return folder


def _pickle_named_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").write_bytes(pickle.dumps(_Trap(marker)))
    return folder


def _truncated_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


def _no_safetensors(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "model.safetensors").unlink()
    return folder


def _no_config(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "config.json").unlink()
    return folder


def _broken_config(folder: Path, marker: Path) -> Path:
    bert_folder(folder)
    (folder / "config.json").write_text('{"model_type": "bert",')
    return folder


WEIGHT_CASES = [
    # (case, build the model folder, problem, fix)
    ("model folder missing", lambda f, m: f, "does not exist", "pass a folder holding config.json"),
    (
        "weights file missing",
        _no_safetensors,
        "has no model.safetensors",
        "save_pretrained(dir, safe_serialization=True)",
    ),
    ("config.json missing", _no_config, "has no config.json", "pass a Hugging Face model folder"),
    ("config.json not JSON", _broken_config, "is not valid JSON", "re-export the model"),
    (
        "unsupported architecture",
        lambda f, m: bert_folder(f, config={"model_type": "gpt2"}),
        "unsupported architecture 'gpt2'",
        "pass a folder of one of those",
    ),
    (
        "weights of another architecture",
        lambda f, m: bert_folder(
            f, tensors={"wte.weight": np.zeros((V, D), np.float32), "wpe.weight": np.zeros((P, D))}
        ),
        "it is not a bert model",
        "pass the folder of a bert model, or the config.json that came with these weights",
    ),
    (
        "weights shape mismatch",
        lambda f, m: bert_folder(f, config={"intermediate_size": 16}),
        "'encoder.layer.0.intermediate.dense.weight' has shape [12, 8], expected [16, 8]",
        "pass the config.json exported with these weights",
    ),
    (
        "weights missing a layer",
        lambda f, m: bert_folder(f, config={"num_hidden_layers": 2}),
        "'encoder.layer.1.attention.self.query.weight' is missing",
        "pass the config.json exported with these weights",
    ),
    (
        "pickle checkpoint instead of safetensors",
        _pickle_only,
        "only pytorch_model.bin: pickle checkpoints are not loaded (unsafe)",
        "convert to safetensors",
    ),
    (
        "pickle saved as model.safetensors",
        _pickle_named_safetensors,
        "model.safetensors is a pickle (torch.save) file, not safetensors",
        "convert to safetensors",
    ),
    (
        "truncated safetensors",
        _truncated_safetensors,
        "it is corrupt or truncated",
        "re-export the safetensors file",
    ),
]


@pytest.mark.parametrize(
    "case, build, problem, fix", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES]
)
def test_bad_weights(case, build, problem, fix, tmp_path, capsys):
    marker = tmp_path / "UNPICKLED"
    folder = build(tmp_path / "model", marker)
    if "pickle" in case:  # the trap works: unpickling it really would create the marker
        data = next(folder.glob("*.bin"), folder / "model.safetensors").read_bytes()
        pickle.loads(data).close()
        assert marker.exists()
        marker.unlink()
    before = tree(tmp_path / "model")
    capsys.readouterr()
    status = run_cli(lambda: cudt.load_encoder(folder))
    check(case, status, capsys.readouterr().err, problem, fix)
    assert not marker.exists(), "the loader unpickled the checkpoint"
    assert tree(tmp_path / "model") == before


TEXT_TINY = ["--num-train", "8", "--num-test", "4"]  # a few generated reviews


def text_cli(argv, capsys) -> tuple[int, str]:
    """Runs ``python -m experiments.text_classify`` in-process: ``(exit status, stderr)``."""
    from experiments import text_classify

    return entry_cli(text_classify.main, argv, capsys)


@pytest.mark.parametrize(
    "case, build, problem, fix", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES]
)
def test_bad_weights_through_the_text_cli(case, build, problem, fix, tmp_path, capsys):
    """The same folders given to ``experiments.text_classify --checkpoint``: the same line,
    before --out is created."""
    marker = tmp_path / "UNPICKLED"
    folder = build(tmp_path / "model", marker)
    before = tree(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--model", "bert", "--checkpoint", folder, *TEXT_TINY, "--out", out]
    status, err = text_cli(argv, capsys)
    check(None, status, err, problem, fix)
    assert not marker.exists(), "the loader unpickled the checkpoint"
    assert tree(tmp_path / "model") == before
    assert not out.exists()


def test_model_flag_and_weights_disagree(tmp_path, capsys):
    folder = bert_folder(tmp_path / "model")
    before = tree(folder)
    out = tmp_path / "out"
    argv = ["--model", "roberta", "--checkpoint", folder, *TEXT_TINY, "--out", out]
    status, err = text_cli(argv, capsys)
    check(
        "--model and --checkpoint disagree (text CLI)",
        status,
        err,
        "--model roberta but",
        "holds a bert model: pass --model bert or a roberta folder",
    )
    assert tree(folder) == before
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# The LLM task's own data files and its model exports
# --------------------------------------------------------------------------------------------

LLM_TINY = ["--num-train", "8", "--num-val", "2", "--num-test", "2", "--steps", "1",
            "--layers", "1", "--hidden", "8", "--heads", "1", "--kv-heads", "1"]  # fmt: skip


def _alpaca_file(folder: Path, name: str, records: list) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(records))
    return folder / name


def _record(i: int) -> dict:
    return {"instruction": f"Say {i}.", "input": "", "output": f"{i}"}


def _no_output(tmp: Path) -> list:
    rows = [_record(0), {"instruction": "Say hi.", "input": ""}]
    return ["--train-data", _alpaca_file(tmp / "data", "train.json", rows)]


def _empty_file(tmp: Path) -> list:
    (tmp / "data").mkdir(parents=True)
    (tmp / "data" / "test.jsonl").write_text("")
    return ["--test-data", tmp / "data" / "test.jsonl"]


def _no_instruction(tmp: Path) -> list:
    path = tmp / "data" / "val.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record(0)) + "\n" + json.dumps({"output": "hi"}) + "\n")
    return ["--val-data", path]


def _three_files_and_data(tmp: Path) -> list:
    files = [_alpaca_file(tmp / "data", f"{s}.json", [_record(0)]) for s in ("a", "b", "c")]
    return ["--train-data", files[0], "--val-data", files[1], "--test-data", files[2],
            "--data", "tasks"]  # fmt: skip


def _export_not_empty(tmp: Path) -> list:
    (tmp / "models").mkdir()
    (tmp / "models" / "notes.txt").write_text("mine")
    return ["--export", tmp / "models"]


def _export_of_a_finished_run(tmp: Path) -> list:
    out = tmp / "out"
    out.mkdir()
    (out / "results.json").write_text('{"experiment": "llm_sft", "runs": []}')
    return ["--export", tmp / "models"]


LLM_CASES = [
    # (case, build(tmp) -> flags, problem, fix)
    (
        "--train-data record without output",
        _no_output,
        "--train-data: '/tmp/data/train.json' record 1 has no \"output\" key",
        "fix or remove it",
    ),
    (
        "--val-data record without instruction",
        _no_instruction,
        "--val-data: '/tmp/data/val.jsonl' record 1 (line 2) has no \"instruction\" key",
        "fix or remove it",
    ),
    (
        "--test-data file empty",
        _empty_file,
        "--test-data: '/tmp/data/test.jsonl' is empty",
        "it must hold a JSON list of records",
    ),
    (
        "--data with all three split files",
        _three_files_and_data,
        "--data has no split left to deal",
        "drop --data or one of them",
    ),
    (
        "--export folder not empty",
        _export_not_empty,
        "--export /tmp/models already exists and is not empty",
        "pass another path, or --overwrite-export to replace it",
    ),
    (
        "--overwrite-export without --export",
        lambda tmp: ["--overwrite-export"],
        "--overwrite-export replaces what --export holds",
        "pass --export DIR or drop it",
    ),
    (
        "--export with a finished --out",
        _export_of_a_finished_run,
        "--out /tmp/out holds a finished run",
        "python -m experiments.export_decoder /tmp/out /tmp/models",
    ),
    (
        "--lora-rank 0",
        lambda tmp: ["--lora-rank", "0", "--checkpoint", "smollm2"],
        "--lora-rank must be >= 1",
        "got 0",
    ),
    (
        "--lora-targets with an unknown projection",
        lambda tmp: ["--lora-rank", "8", "--checkpoint", "smollm2", "--lora-targets", "q,attn"],
        "--lora-targets must all be one of q, k, v, o, gate, up, down",
        "attn",
    ),
    (
        "--lora-rank without --checkpoint",
        lambda tmp: ["--lora-rank", "8"],
        "--lora-rank adapts a pretrained model",
        "pass --checkpoint FOLDER, model.gguf or smollm2",
    ),
    (
        "--lora-rank with --train-embeddings",
        lambda tmp: ["--lora-rank", "8", "--checkpoint", "smollm2", "--train-embeddings"],
        "--lora-rank trains adapters only, the base frozen",
        "drop --train-embeddings",
    ),
    (
        "--lora-alpha without --lora-rank",
        lambda tmp: ["--lora-alpha", "16"],
        "--lora-alpha and --lora-targets shape LoRA adapters",
        "pass --lora-rank R too, or drop them",
    ),
    (
        "--base-dtype bfloat16 without --lora-rank",
        lambda tmp: ["--base-dtype", "bfloat16"],
        "--base-dtype stores the frozen base of LoRA adapters",
        "pass --lora-rank R too, or drop it",
    ),
]


def test_llm_lora_resume_over_another_base(tmp_path, capsys):
    """LoRA checkpoints hold the adapters alone: an --out whose adapters were trained over
    other base weights than --checkpoint holds now (the same path and flags) is refused before
    anything is trained or written. The checkpoints' record is the one a run of these flags
    writes (the runner's fingerprint of the config and the task's, the base's digest in it)."""
    import jax

    from cudt.data.alpaca import AlpacaRecord, build_word_tokenizer
    from cudt.models.llama import DecoderConfig, write_decoder_folder
    from cudt.runner.cli import config_from_args
    from cudt.runner.output import checkpoint_record
    from cudt.tasks import llm, llm_config, llm_data
    from experiments import llm_sft

    base = tmp_path / "base"
    config = DecoderConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=1,
        num_kv_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    records = [_record(i) for i in range(12)]
    words = build_word_tokenizer([AlpacaRecord(**r) for r in records])
    write_decoder_folder(base, config, config.init_params(jax.random.key(0)), words)
    data = _alpaca_file(tmp_path / "data", "train.json", records)
    argv = [
        "--checkpoint", base, "--data", data, "--num-train", "8", "--num-val", "2",
        "--num-test", "2", "--steps", "1", "--lora-rank", "2", "--out", tmp_path / "out",
    ]  # fmt: skip
    argv = [str(a) for a in argv]
    cfg, _ = config_from_args(llm_config.LLMConfig, argv, "")
    task = llm.LLMTask()
    record = checkpoint_record(cfg) | task.fingerprint(cfg, task.load(cfg))
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "config.json").write_text(json.dumps(record))
    # the same folder, other weights (this process read the first ones: read them again)
    write_decoder_folder(base, config, config.init_params(jax.random.key(1)), words)
    llm_data._pretrained.cache_clear()
    llm_data._base_digest.cache_clear()
    before = tree(tmp_path / "out")
    status, err = entry_cli(llm_sft.main, argv, capsys)
    check(
        "--lora-rank resumed over other base weights",
        status,
        _as_in_docs(err),
        "holds checkpoints trained on other files than its flags name now (base_digest",
        "restore the files they were trained on, pass another --out, or --overwrite",
    )
    assert tree(tmp_path / "out") == before


@pytest.mark.parametrize("case, build, problem, fix", LLM_CASES, ids=[c[0] for c in LLM_CASES])
def test_llm_files_and_exports(case, build, problem, fix, tmp_path, capsys):
    """Each refused before anything is written: --out stays as it was (absent, or the finished
    run), --export too."""
    from experiments import llm_sft

    flags = build(tmp_path)
    before = {name: tree(tmp_path / name) for name in ("out", "models", "data")}
    status, err = entry_cli(llm_sft.main, [*LLM_TINY, *flags, "--out", tmp_path / "out"], capsys)
    check(case, status, _as_in_docs(err), problem, fix)
    assert {name: tree(tmp_path / name) for name in before} == before


def test_llm_export_of_a_folder_that_is_no_finished_run(tmp_path, capsys):
    from experiments import export_decoder

    (tmp_path / "run").mkdir()
    argv = [tmp_path / "run", tmp_path / "models"]
    status, err = entry_cli(export_decoder.main, argv, capsys)
    check(
        "export_decoder of a folder without results.json",
        status,
        _as_in_docs(err),
        "/tmp/run holds no results.json",
        "pass the --out folder of a finished experiments.llm_sft run",
    )
    assert not (tmp_path / "models").exists() and tree(tmp_path / "run") == {}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "notes.txt").write_text("mine")
    before = tree(tmp_path / "models")
    status, err = entry_cli(export_decoder.main, argv, capsys)
    check(
        "export_decoder into a folder that is not empty",
        status,
        _as_in_docs(err),
        "DEST /tmp/models already exists and is not empty",
        "pass another path, or --overwrite to replace it",
    )
    assert tree(tmp_path / "models") == before


def test_safe_model_folder_loads(tmp_path):
    """The folders above are broken copies of one that loads."""
    enc = cudt.load_encoder(bert_folder(tmp_path / "model"))
    assert enc.num_layers == 1 and enc.config.hidden_size == D


# --------------------------------------------------------------------------------------------
# Checkpoints and output folders (one real tiny run, copied per case)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A real finished tiny run: results, plots, checkpoints at steps 2 and 4 of both groups."""
    out = finished_job(video_denoise.main, TINY, tmp_path_factory.mktemp("finished") / "run")
    assert (out / "results.json").is_file()
    for group in ("dust-1-ERM", "dust-1-constrained", "dust-pl-1-ERM", "ut-1"):
        assert sorted(p.name for p in (out / "checkpoints" / group).iterdir()) == ["2", "4"]
    return out


@pytest.fixture
def interrupted_run(finished_run, tmp_path) -> Path:
    """The same run as if killed before it wrote its results: only checkpoints."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    for name in RESULTS:
        (out / name).unlink()
    return out


@pytest.mark.slow
def test_output_holding_results_is_never_overwritten(finished_run, capsys):
    before = tree(finished_run)
    status, err = cli([*TINY, "--out", finished_run], capsys)
    check(
        "--out holds results of a finished run",
        status,
        err,
        "already holds results.json of a finished run",
        "pass another --out, or --overwrite to replace it",
    )
    assert tree(finished_run) == before


@pytest.mark.slow
def test_corrupt_checkpoint(interrupted_run, capsys):
    # The last group's latest checkpoint: found before the first group trains or writes.
    step = interrupted_run / "checkpoints" / "ut-1" / "4"
    for chunk in (step / "state" / "ocdbt.process_0" / "d").iterdir():
        chunk.write_bytes(b"\0" * 64)
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "corrupt checkpoint",
        status,
        err,
        "ut-1/4 is corrupt (its arrays cannot be read",
        "delete that folder to resume from an earlier step, or pass --overwrite",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_of_an_older_state_layout(interrupted_run, capsys):
    """ut-1's latest checkpoint rewritten as cudt wrote it before nuPI's gains took the knobs'
    names (``kp`` / ``ema_nu`` in the dual state, now ``nupi_kp`` / ``nupi_ema``): the same
    arrays under other names, named as such, not as a corrupt file."""
    from jax.tree_util import keystr, tree_flatten_with_path

    from cudt.checkpoint import GroupCheckpointer

    def old_names(tree):
        if isinstance(tree, (list, tuple)):
            return type(tree)(old_names(v) for v in tree)
        if not isinstance(tree, dict):
            return tree
        rename = {"nupi_kp": "kp", "nupi_ema": "ema_nu"}
        return {rename.get(k, k): old_names(v) for k, v in tree.items()}

    group = interrupted_run / "checkpoints" / "ut-1"
    checkpointer = GroupCheckpointer(group)
    states, loop = checkpointer.restore(None, 4)
    checkpointer.close()
    paths = [keystr(p) for p, _ in tree_flatten_with_path(states)[0]]
    assert any(p.endswith("['nupi_kp']") for p in paths)  # the video task's default is nuPI
    shutil.rmtree(group / "4")
    checkpointer = GroupCheckpointer(group)
    checkpointer.save(4, old_names(states), {k: v for k, v in loop.items() if k != "pinned"})
    checkpointer.close()
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoint of an older state layout",
        status,
        err,
        "ut-1/4 was written by another version of cudt (it names dual_state/",
        "pass another --out, or --overwrite to discard it",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_with_truncated_index(interrupted_run, capsys):
    state = interrupted_run / "checkpoints" / "ut-1" / "4" / "state"
    for manifest in state.rglob("manifest.ocdbt"):
        manifest.write_bytes(manifest.read_bytes()[:10])
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoint with a truncated array index",
        status,
        err,
        "ut-1/4 is corrupt (its arrays cannot be read",
        "delete that folder to resume from an earlier step, or pass --overwrite",
    )
    assert tree(interrupted_run) == before


def _orbax_read_coroutine():
    """An unstarted coroutine shaped like orbax's per-array read (its name and file)."""
    namespace: dict = {}
    code = compile(
        "async def _read_array_index_and_device_put():\n    pass\n",
        "/site-packages/orbax/checkpoint/_src/serialization/serialization.py",
        "exec",
    )
    exec(code, namespace)
    return namespace["_read_array_index_and_device_put"]()


def test_failed_restore_closes_orbax_reads_it_left_unstarted():
    """What the restore above leaves when orbax's loop closes under queued reads: each such
    coroutine warns "never awaited" when collected, unless the restore closes it (it did print,
    intermittently, after the error line above)."""
    from cudt.checkpoint import _close_orbax_stragglers

    def warnings_on_collect(close: bool) -> list[str]:
        coro = _orbax_read_coroutine()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if close:
                assert _close_orbax_stragglers() >= 1
            del coro
            gc.collect()
        return [str(w.message) for w in caught]

    assert any("never awaited" in m for m in warnings_on_collect(close=False))
    assert warnings_on_collect(close=True) == []


@pytest.mark.slow
def test_checkpoint_with_corrupt_loop_record(interrupted_run, capsys):
    (interrupted_run / "checkpoints" / "ut-1" / "4" / "loop" / "metadata").write_text("{")
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoint with a corrupt loop record",
        status,
        err,
        "ut-1/4 is corrupt (its loop record cannot be read",
        "delete that folder to resume from an earlier step, or pass --overwrite",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_of_a_different_config(interrupted_run, capsys):
    assert video_denoise.Config().lr is None  # the run was trained with each model's default
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--lr", 5e-4, "--out", interrupted_run], capsys)
    check(
        "checkpoints of a different config",
        status,
        err,
        "holds checkpoints of a different config (lr None -> 0.0005)",
        "pass another --out, rerun with the same flags to resume, or --overwrite",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_of_a_different_model_flag(interrupted_run, capsys):
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--models", "ut", "--out", interrupted_run], capsys)
    check(
        "checkpoints of a different model (--models)",
        status,
        err,
        "holds checkpoints of a different config (models ['dust', 'ut'] -> ['ut'])",
        "pass another --out, rerun with the same flags to resume, or --overwrite",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_written_by_a_different_model(interrupted_run, capsys):
    """A DUST checkpoint under the UT group's name (a folder copied from another group): its
    arrays are compared with this model's before anything is trained."""
    checkpoints = interrupted_run / "checkpoints"
    shutil.rmtree(checkpoints / "ut-1")
    shutil.copytree(checkpoints / "dust-1-ERM", checkpoints / "ut-1")
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoint written by a different model",
        status,
        err,
        "ut-1/4 was written by a different model (",
        "pass another --out, or --overwrite to discard it",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoints_without_their_config(interrupted_run, capsys):
    (interrupted_run / "checkpoints" / "config.json").unlink()
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoints without their config.json",
        status,
        err,
        "holds checkpoints but no checkpoints/config.json saying which config they belong to",
        "pass another --out, or --overwrite to discard them",
    )
    assert tree(interrupted_run) == before


@pytest.mark.slow
def test_checkpoint_config_unreadable(interrupted_run, capsys):
    (interrupted_run / "checkpoints" / "config.json").write_text('{"lr": 0.0')
    before = tree(interrupted_run)
    status, err = cli([*TINY, "--out", interrupted_run], capsys)
    check(
        "checkpoint config.json unreadable",
        status,
        err,
        "checkpoints/config.json is unreadable",
        "pass another --out, or --overwrite to start again",
    )
    assert tree(interrupted_run) == before


def test_resume_with_nothing_to_resume(tmp_path, capsys):
    out = tmp_path / "new"
    status, err = cli([*TINY, "--resume", "--out", out], capsys)
    check(
        "--resume with no checkpoint",
        status,
        err,
        "holds no checkpoint to resume from",
        "drop --resume to start a new run",
    )
    assert not out.exists()


def test_output_is_a_file(tmp_path, capsys):
    out = tmp_path / "results.txt"
    out.write_text("my notes")
    status, err = cli([*TINY, "--out", out], capsys)
    check("--out is a file", status, err, "is a file, not a folder", "pass a folder path")
    assert out.read_text() == "my notes"


def test_output_under_a_file(tmp_path, capsys):
    """An unwritable --out that stays unwritable as root: its parent is a regular file."""
    parent = tmp_path / "notes.txt"
    parent.write_text("my notes")
    status, err = cli([*TINY, "--out", parent / "run"], capsys)
    check(
        "--out cannot be created",
        status,
        err,
        "cannot write to --out",
        "(Not a directory): pass a writable folder",
    )
    assert parent.read_text() == "my notes"


def test_output_in_a_read_only_folder(tmp_path, capsys):
    """--out inside a folder nobody may write to. As a normal user: a chmod 0o555 folder. Root
    writes through file permissions, so as root the folder is one the kernel refuses to
    anyone: /sys (sysfs; mkdir there fails with EPERM for root too). Never skipped."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        out, reason = locked / "run", "(Permission denied)"
    else:
        locked, out, reason = Path("/sys"), Path("/sys/cudt-test-run"), "(Operation not permitted)"
    assert not out.exists()
    before = sorted(p.name for p in locked.iterdir())
    try:
        status, err = cli([*TINY, "--out", out], capsys)
    finally:
        if locked != Path("/sys"):
            locked.chmod(0o755)
    # the OS reason differs between the two mechanisms: not a docs/errors.md row
    check(None, status, err, f"cannot write to --out {out} {reason}", "pass a writable folder")
    assert not out.exists() and sorted(p.name for p in locked.iterdir()) == before


@pytest.fixture(scope="module")
def other_job():
    """Another job's process, holding output folders' locks."""
    other = LockHolder()
    yield other
    other.close()


def test_output_in_use_by_another_job(other_job, tmp_path, capsys):
    out = tmp_path / "run"
    other_job.hold(out)
    before = tree(out)
    status, err = cli([*TINY, "--out", out], capsys)
    check(
        "--out in use by another job",
        status,
        err,
        f"--out {out} is in use by another job (PID {other_job.pid} on host ",
        "wait for it to finish (or stop it), or pass another --out",
    )
    assert tree(out) == before
    other_job.release(out)


def test_output_being_written_is_not_combined(other_job, tmp_path, capsys):
    run = previous_run(tmp_path / "run")  # a job running again on it (say with --overwrite)
    before = tree(run)
    other_job.hold(run)
    capsys.readouterr()
    try:
        status = combine.main([str(run)])
    finally:
        other_job.release(run)
    check(
        "experiments.combine on a folder a job is writing",
        status,
        capsys.readouterr().err,
        f"{run} is being written by a job still running (PID {other_job.pid} on host ",
        "wait for it to finish",
    )
    assert tree(run) == before


def test_disk_full_at_start(tmp_path):
    """No room even for the run's config: refused, and the new --out is removed again."""
    out = tmp_path / "run"
    status, err = cli_subprocess([*TINY, "--out", out], max_file_bytes=200)
    check(
        "disk full when the run starts",
        status,
        err,
        "checkpoints/config.json (File too large)",
        "free disk space or pass a writable --out",
    )
    assert not out.exists()


@pytest.mark.slow
def test_disk_full_while_checkpointing(tmp_path):
    """The disk fills up during training: the checkpoint being written is removed, no
    half-written checkpoint or result is left, and the message names the cause."""
    out = tmp_path / "run"
    status, err = cli_subprocess([*TINY, "--out", out], max_file_bytes=100_000)
    check(
        "disk full while writing a checkpoint",
        status,
        err,
        "cannot write checkpoints in",
        "(File too large): free disk space or pass a writable --out",
        progress=True,
    )
    assert temp_files(out) == []
    assert not any((out / name).exists() for name in RESULTS)
    steps = [p for p in (out / "checkpoints").rglob("*") if p.is_dir() and p.name.isdigit()]
    assert steps == []  # no checkpoint that looks complete but is not
    assert json.loads((out / "checkpoints" / "config.json").read_text())["steps"] == 4


@pytest.mark.slow
def test_disk_full_while_writing_results(interrupted_run):
    """Resuming a run whose training is done, with no room for its figures: no half-written
    figure or results.json (atomic writes), and its checkpoints are untouched."""
    before = tree(interrupted_run / "checkpoints")
    status, err = cli_subprocess([*TINY, "--out", interrupted_run], max_file_bytes=8_000)
    check(
        "disk full while writing results",
        status,
        err,
        "cannot write " + str(interrupted_run / "layer_loss.png") + " (File too large)",
        "free disk space or pass a writable --out",
        progress=True,
    )
    assert temp_files(interrupted_run) == []
    # what training wrote (checkpoints, the training curves' logs) stays; no result file
    assert sorted(p.name for p in interrupted_run.iterdir()) == ["checkpoints", "tensorboard"]
    assert tree(interrupted_run / "checkpoints") == before


# --------------------------------------------------------------------------------------------
# The held-out data sets' writer: refused before anything is written
# --------------------------------------------------------------------------------------------


def _existing_avenue(root: Path) -> list:
    (root / "Avenue Dataset" / "training_videos").mkdir(parents=True)
    (root / "Avenue Dataset" / "training_videos" / "01.avi").write_bytes(b"my own video")
    return ["plaza", root]


def _file_as_folder(root: Path) -> list:
    (root / "notes.txt").write_text("my notes")
    return ["forum", root / "notes.txt"]


HELD_OUT_CASES = [
    # (case, build(root) -> argv, problem, fix)
    (
        "held-out data set already written",
        _existing_avenue,
        "Avenue Dataset' already exists",
        "pass another folder or remove it",
    ),
    (
        "held-out data folder is a file",
        _file_as_folder,
        "notes.txt' is a file, not a folder",
        "pass a folder to write the data in",
    ),
    (
        "held-out videos of an odd width",
        lambda root: ["plaza", root / "new", "--width", "321"],
        "must be even and at least 32",
        "pass e.g. --width 320 --height 180",
    ),
    (
        "held-out videos with no test video",
        lambda root: ["plaza", root / "new", "--test-videos", "0"],
        "--test-videos must be >= 1",
        "got 0",
    ),
    (
        "held-out reviews too few",
        lambda root: ["forum", root / "new", "--train", "1"],
        "--train and --test must be >= 2",
        "got 1 and 400",
    ),
    (
        "held-out videos in an unknown layout",
        lambda root: ["plaza", root / "new", "--layout", "ucsd"],
        "argument --layout: invalid choice: 'ucsd'",
        "(choose from",
    ),
]


@pytest.mark.parametrize(
    "case, build, problem, fix", HELD_OUT_CASES, ids=[c[0] for c in HELD_OUT_CASES]
)
def test_held_out_data(case, build, problem, fix, tmp_path, capsys):
    from experiments.held_out_data import main

    root = tmp_path / "data"
    root.mkdir()
    argv = build(root)
    before = tree(root)
    capsys.readouterr()
    status = exit_status(main, argv)
    captured = capsys.readouterr()
    check(case, status, captured.err, problem, fix)
    assert captured.out == "" and tree(root) == before  # nothing written, nothing created


# --------------------------------------------------------------------------------------------
# The table of docs/errors.md
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _write_table(tmp_path_factory):
    yield
    path = os.environ.get("CUDT_ERRORS_TABLE")
    if not path:
        return
    lines = []
    for title in dict.fromkeys(SECTIONS.values()):
        rows = [(case, line, st) for case, (sec, line, st) in MESSAGES.items() if sec == title]
        if not rows:
            continue
        lines += [f"### {title}", "", "| case | exit | message (stderr) |", "|---|---|---|"]
        for case, line, status in rows:
            cell = _as_in_docs(line).replace("|", "\\|")
            lines.append(f"| {case} | {status} | `{cell}` |")
        lines.append("")
    Path(path).write_text("\n".join(lines))


def _docs_rows() -> dict[str, tuple[str, int, str]]:
    """docs/errors.md's table rows: case -> (section, exit status, message)."""
    rows, section = {}, None
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if line.startswith("### "):
            section = line[4:]
        m = re.fullmatch(r"\| (.+?) \| (\d+) \| `(.*)` \|", line)
        if m:
            rows[m.group(1)] = (section, int(m.group(2)), m.group(3).replace("\\|", "|"))
    return rows


def _cases_in_this_module() -> dict[str, str]:
    """case -> docs/errors.md section, for every case a test of this module records, read from
    its source (not from a run): ``check("case", ...)`` in a test, or ``check(case, ...)`` in
    a test parametrized over a table of cases."""
    cases = {}
    for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        tables = [
            globals()[d.args[1].id]
            for d in node.decorator_list
            if isinstance(d, ast.Call)
            and getattr(d.func, "attr", None) == "parametrize"
            and len(d.args) > 1
            and isinstance(d.args[1], ast.Name)
        ]
        for call in ast.walk(node):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "check"):
                continue
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                cases[first.value] = _section(node.name)
            elif isinstance(first, ast.Name) and first.id == "case":
                cases.update({row[0]: _section(node.name) for table in tables for row in table})
    return cases


def test_docs_errors_md_has_a_row_for_every_case_and_no_other():
    """docs/errors.md lists exactly the cases this module's tests record, each in its test's
    section (each test checks its message against its row as it records it). Fix: regenerate
    the page with CUDT_ERRORS_TABLE (see the top)."""
    docs = {case: section for case, (section, _, _) in _docs_rows().items()}
    cases = _cases_in_this_module()
    assert len(cases) > 50 and len(docs) > 50, "docs/errors.md or the case tables are lost"
    assert sorted(set(cases) - set(docs)) == [], "cases without a row in docs/errors.md"
    assert sorted(set(docs) - set(cases)) == [], "rows of docs/errors.md without a case"
    assert {c: docs[c] for c in cases} == cases, "rows in another section than their test's"
