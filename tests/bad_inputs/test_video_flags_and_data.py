"""The video CLI (``experiments.video_denoise``) given invalid flags or config values, or a broken
data folder: refused with one line before --out is touched (docs/errors.md: "Flags and config
values", "Data folders"). The helpers are in refusals.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from refusals import (
    TINY,
    TINY_REAL,
    check,
    cli,
    cli_subprocess,
    over_cases,
    previous_run,
    refused,
    tree,
)

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
        "DUST spread with one shared dictionary",
        ["--dust-dictionary", "shared", "--dust-spread", "0.1"],
        "--dust-dictionary shared has one",
        "drop --dust-spread, or pass --dust-dictionary paper or per-layer",
    ),
    ("negative DUST spread", ["--dust-spread=-0.1"], "got -0.1", "--dust-spread must be"),
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
    (
        "--inject-nan past --steps",  # the fault never fired: the test passed vacuously
        ["--inject-nan", "ut,ERM,0,5"],
        "--inject-nan step 5 is past the last of --steps 4, so the fault would never fire",
        "pass a STEP from 1 to 4",
    ),
    (
        "--inject-nan of a kind --kinds leaves out",
        ["--kinds", "erm", "--inject-nan", "ut,constrained,0,3"],
        "--inject-nan kind constrained is not trained with --kinds erm",
        "pass KIND ERM, or --kinds both",
    ),
    (
        "--inject-nan of a kind the model does not train",
        ["--inject-nan", "dust-pl,constrained,0,3"],
        "dust-pl has no constrained runs here (only ERM), so the fault would never fire",
        "pass KIND ERM, or another MODEL",
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
        "--data-dir without a real --dataset",
        ["--data-dir", "/tmp/data/UCSD_Anomaly_Dataset.v1p2"],
        "--data-dir /tmp/data/UCSD_Anomaly_Dataset.v1p2 is read only by a real dataset",
        "pass --dataset ucsd|frames|avenue|shanghaitech, or drop --data-dir",
    ),
    (
        "frame dataset without --data-dir",
        ["--dataset", "ucsd"],
        "--dataset ucsd needs --data-dir",
        "pointing at the frame folders",
    ),
    (
        "video-file dataset without --data-dir",
        ["--dataset", "avenue"],
        "--dataset avenue needs --data-dir",
        "pointing at its .avi videos",
    ),
    # a flag of the other kind of dataset would be ignored without a word
    (
        "--num-videos with a real dataset",
        ["--dataset", "ucsd", "--data-dir", "/tmp/data/UCSD_Anomaly_Dataset.v1p2"]
        + ["--num-videos", "5"],
        "--num-videos 5 sets the synthetic clips' count, and --dataset ucsd reads its own videos",
        "drop --num-videos (--max-videos caps the videos read)",
    ),
    (
        "--num-frames with a real dataset",
        ["--dataset", "avenue", "--data-dir", "/tmp/data/avenue", "--num-frames", "16"],
        "--num-frames 16 sets the synthetic clips' length, and --dataset avenue reads its own",
        "drop --num-frames",
    ),
    (
        "--max-videos with the synthetic dataset",
        ["--max-videos", "2"],
        "--max-videos 2 caps the videos read from --data-dir, and --dataset is synthetic",
        "drop --max-videos (--num-videos sizes the synthetic clips), or pass --dataset ucsd|",
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
        "--sweep repeating a value",
        ["--sweep", "epsilon=0.1,1e-1"],
        "--sweep epsilon=0.1,1e-1 repeats 0.1 (as 1e-1)",
        "list each value once",
    ),
    (
        "--sweep with an empty value",
        ["--sweep", "epsilon=0.1,,0.2"],
        "--sweep epsilon=0.1,,0.2 has an empty value",
        "drop the extra comma or give its value",
    ),
    (
        "--tune-epsilon repeating a value",
        ["--tune-epsilon", "0.1,1e-1"],
        "argument --tune-epsilon: 0.1,1e-1 repeats 0.1 (as 1e-1)",
        "list each value once",
    ),
    (
        "--tune-lr with an empty value",
        ["--tune-lr", "1,,2"],
        "argument --tune-lr: 1,,2 has an empty value",
        "drop the extra comma or give its value",
    ),
    (
        "--test-gammas with an empty value",
        ["--test-gammas", "0.5,,1"],
        "argument --test-gammas: 0.5,,1 has an empty value",
        "drop the extra comma or give its value",
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
        "reaches epsilon at step 500, and the run's 4 steps end at step 3",
        "shorten it or pass more --steps",
    ),
    (
        "--epsilon-margin past epsilon 1",
        ["--tune-epsilon", "0.05,0.5", "--epsilon-margin", "0.5"],
        "--epsilon-margin 0.5 trains epsilon 0.5 at 1 (at least 1: a loss below 0)",
        "pass a smaller margin",
    ),
    (
        "--epsilon-margin past epsilon 1 on a model's own epsilon",
        ["--model-hparams", "ut:epsilon=0.6", "--epsilon-margin", "0.45"],
        "--epsilon-margin 0.45 trains epsilon 0.6 at 1.05 (at least 1: a loss below 0)",
        "pass a smaller margin",
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
        "--vit-checkpoint without --models vit",
        ["--vit-checkpoint", "vit-folder"],
        "--vit-checkpoint is read with --models ...,vit only",
        "add vit to --models or drop it",
    ),
    (
        "--resume with --overwrite",
        ["--resume", "--overwrite"],
        "--resume and --overwrite contradict each other",
        "pass one of them",
    ),
    (
        "--model-hparams with a knob whose setting is off",
        ["--model-hparams", "ut:tail_beta=0.3"],
        "--model-hparams ut: --tail-beta is the beta of --constraint tail",
        "pass --constraint tail or drop it",
    ),
    (
        "--sweep dual_lr with --formulation penalty",
        ["--formulation", "penalty", "--sweep", "dual_lr=0.01,10"],
        "dual_lr varies the multipliers' steps and --formulation penalty has none",
        "pass --formulation lagrangian or augmented",
    ),
    (
        "--dual-lr with --formulation penalty",
        ["--formulation", "penalty", "--dual-lr", "0.5"],
        "--dual-lr steps the multipliers and --formulation penalty has none",
        "drop --dual-lr, or pass --formulation lagrangian or augmented",
    ),
    (
        "--models naming a model twice",
        ["--models", "dust,dust"],
        "--models names dust twice",
        "name each model once",
    ),
    (
        "a UT flag with --models dust",
        ["--models", "dust", "--ut-b", "0.5"],
        "--ut-b applies to --models ...,ut only, and --models dust trains no ut",
        "drop --ut-b or add ut to --models",
    ),
    (
        "--resume without --out",
        ["--resume"],  # and no --out: run where a fresh runs/ would be made
        "--resume needs --out DIR",
        "holds nothing to resume from",
    ),
    (
        "a warm-up as long as the run",
        ["--steps", "12", "--warmup-steps", "12"],
        "--warmup-steps 12 freezes the multipliers for all 12 steps",
        "pass --warmup-steps below --steps",
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


@over_cases(CONFIG_CASES, "case, flags, problem, fix")
def test_invalid_config(case, flags, problem, fix, tmp_path, capsys, monkeypatch):
    out = previous_run(tmp_path / "out")
    before = tree(out)
    # a real dataset's run: without TINY's synthetic clip sizes (refused there, as not acting)
    real = "--dataset" in flags and flags[flags.index("--dataset") + 1] != "synthetic"
    base = TINY_REAL if real else TINY
    if case == "--resume without --out":
        monkeypatch.chdir(tmp_path)
        status, err = cli([*base, *flags], capsys)
        check(case, status, err, problem, fix)
        assert not (tmp_path / "runs").exists()  # no fresh folder made to be refused
        return
    if "--distributed" in flags:
        # what jax.distributed.initialize says depends on whether this process has started
        # JAX's backend (which earlier tests do): a fresh process, as the user's, says the same
        # whatever ran before
        status, err = cli_subprocess([*base, *flags, "--out", out])
    else:
        status, err = cli([*base, *flags, "--out", out], capsys)
    check(case, status, err, problem, fix)
    assert tree(out) == before


@pytest.mark.parametrize(
    "flags", [["--reference", "chance"], ["--sweep", "reference=none,chance+0.1"]]
)
def test_a_chance_reference_is_refused_before_the_data_is_read(
    flags, tmp_path, capsys, monkeypatch
):
    """The refusal depends on the task, not its data: a user waits for no frames to load
    (nor for a real data set's folder to be checked) to learn it."""
    from cudt.tasks.video import VideoTask

    def no_reading(self, cfg):
        raise AssertionError("the data was read before --reference was checked")

    monkeypatch.setattr(VideoTask, "load", no_reading)
    status, err = cli([*TINY, *flags, "--out", str(tmp_path / "out")], capsys)
    check(None, status, err, "needs a classification task", "pass a number or none")
    assert not (tmp_path / "out").exists()


def test_the_synthetic_clips_sizes_do_not_hold_back_a_real_dataset():
    """--num-videos and --num-frames size the synthetic clips: a real dataset's longer
    sequences (UCSD's videos have 120-200 frames) are not refused by their defaults (the reader
    checks each video's length), nor are the defaults, left as they are, refused as flags that
    do not act (set to another value they are: test_invalid_config)."""
    from cudt.tasks.video import VideoConfig

    for dataset in ("ucsd", "frames", "avenue", "shanghaitech"):
        assert VideoConfig(dataset=dataset, data_dir="d", seq_len=40).seq_len == 40
    assert VideoConfig(dataset="ucsd", data_dir="d", max_videos=2).max_videos == 2
    with pytest.raises(ValueError, match=r"--num-frames \(32\) must be >= --seq-len \(40\)"):
        VideoConfig(seq_len=40)


# --------------------------------------------------------------------------------------------
# Data folders: refused before --out is touched
# --------------------------------------------------------------------------------------------


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


def _one_level_down(root: Path) -> Path:
    return ucsd(root) / "Train"  # the split folder, not the dataset


def _empty_train_folder(root: Path) -> Path:
    ped2 = ucsd(root)
    for video in (ped2 / "Train").iterdir():
        shutil.rmtree(video)
    return root


def _dangling_link(root: Path) -> Path:
    ped2 = ucsd(root)
    (ped2 / "Train" / "Train003").symlink_to(root / "unmounted" / "Train003")
    return root


def _float_frames_past_one(root: Path) -> Path:
    ped2 = ucsd(root)
    frame = np.full((32, 32), 200.0, np.float32)  # float pixels on 0-255, not 0-1
    Image.fromarray(frame).save(ped2 / "Test" / "Test001" / "002.tif")
    return root


DATA_CASES = [
    # (case, build the --data-dir, problem, fix)
    (
        "data folder missing",
        _missing,
        "does not exist",
        "pass --data-dir pointing at the extracted",
    ),
    ("data folder empty", _empty, "no video folders found", "extract the dataset in that layout"),
    (
        "data folder is a file",
        _a_file,
        "is not a folder",
        "pass --data-dir pointing at the extracted",
    ),
    (
        "wrong dataset: a text dataset",
        _text_dataset,
        "has no image frames (.bmp, .jpeg, .jpg, .png, .tif, .tiff), only .txt files",
        "point --data-dir at a video dataset of frame folders",
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
    (
        "data folder one level too deep",
        _one_level_down,
        "/Train' ('",
        "holds it: pass --data-dir '",
    ),
    (
        "train folder without video folders",
        _empty_train_folder,
        "no training videos under",
        "must hold one folder of frames per video (frames directly in it are not read)",
    ),
    (
        "a link to a missing video folder",
        _dangling_link,
        "Train003' is a link to '",
        "which does not exist: mount or restore its target, or delete the link",
    ),
    (
        "float frames outside [0, 1]",
        _float_frames_past_one,
        "002.tif' (F) holds values outside [0, 1] (200 to 200)",
        "convert the frames to 8-bit grayscale",
    ),
]


@over_cases(DATA_CASES)
def test_bad_data_folder(case, build, problem, fix, tmp_path, capsys):
    root = tmp_path / "data"
    root.mkdir()
    data_dir = build(root)
    out = tmp_path / "out"
    argv = [*TINY_REAL, "--dataset", "ucsd", "--data-dir", data_dir, "--out", out]
    refused(case, argv, capsys, problem, fix, keeps=root)  # the data is only read
    assert not out.exists()  # and read before --out is created


def test_the_data_folders_are_broken_copies_of_one_that_loads(tmp_path):
    from cudt.data.video import load_video_data

    data = load_video_data("ucsd", ucsd(tmp_path), seq_len=4, size=32)
    # validation comes from the training videos (Train002), testing from both test videos
    assert data.train.shape == data.val.shape == (4, 4, 256) and data.test.shape == (8, 4, 256)
