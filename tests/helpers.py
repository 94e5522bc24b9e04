"""Helpers shared by several test modules (fixtures are in ``conftest.py``).

No test module imports from another test module: what two of them need lives here.
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save_file

from cudt.models.encoders import minilm_path
from cudt.models.llama.gguf import TINY_SIZES
from cudt.runner import GroupModel, RunConfig, Task
from cudt.runner.cli import task_main
from cudt.runner.config import at_least, flag, shared
from cudt.runner.report import Column

ROOT = Path(__file__).resolve().parents[1]

# The suite's XLA:CPU code generation, which tests/conftest.py sets (here: a test imports it, and
# tests/bad_inputs/ has a conftest.py too): the legacy elementwise emitters and the plain thunk
# scheduler. Measured on this 2-core machine (tests/experiments/test_ut_study.py's end-to-end study, one core,
# cold cache, 2-3 runs each): 59-71 s with XLA's defaults, 44-47 s with these two; a test that trains
# for minutes (test_text_learns.py) 92.3 s vs 92.6 s: compile time goes, run time stays. The whole
# suite, back to back on that machine: 772 s without them, 485 s with them. The same functions in
# float32, rounded in another order (the suite compares floats with tolerances).
#
# The third sets the LLVM level of the tests marked ``optimized`` (XLA's default is 3; the other
# tests compile at 0, which jax_disable_most_optimizations sets over this flag): level 1 runs their
# training as fast and compiles in less time. Measured on the 2-core EPYC, one core, back to back
# (CPU seconds): test_video_headline.py, test_held_out_generators.py and test_ut_study.py's
# optimized test 295.8 at level 3, 271.4 at level 1; test_text_learns.py's run 114.0 vs 104.5;
# the same choices on validation, the printed losses within 0.3 % of each other.
QUICK_CODEGEN = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
    "--xla_backend_optimization_level=1",
)


# --------------------------------------------------------------------------------------------
# Random BERT, RoBERTa and DistilBERT folders (hidden size 32) in the Hugging Face layout
# --------------------------------------------------------------------------------------------

D, LAYERS, HEADS, FFN, MAX_POS = 32, 2, 4, 37, 64


def forced_devices_env(count: int, **extra: str) -> dict[str, str]:
    """The environment for a subprocess that sees ``count`` CPU devices: this process's
    ``XLA_FLAGS`` (the suite's code generation and threading flags, tests/conftest.py) plus
    the device count, and ``extra`` variables."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={count}")
    return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", **extra)


# A BERT block's Hugging Face names below ``encoder.layer.{i}.``: its six linear layers (query,
# key, value, attention output, MLP up, MLP down) and its two layer norms
BERT_BLOCK = (
    "encoder.layer.{}.",
    (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    ),
    ("attention.output.LayerNorm", "output.LayerNorm"),
)


def random_blocks(rand, layers: int, block, d: int, f: int, norm_offset: float = 1.0) -> dict:
    """Random tensors of ``layers`` transformer blocks in Hugging Face names. ``block`` is
    (the layer's prefix with ``{}`` for its index, the six linear layers: four d × d of
    attention, MLP up f × d and down d × f, the layer norms); each linear layer has a weight and
    a bias, each norm a scale (``norm_offset`` + noise) and a bias. Drawn with ``rand(*shape)``
    block by block, in that order."""
    layer_fmt, linears, norms = block
    shapes = ((d, d),) * 4 + ((f, d), (d, f))
    t = {}
    for i in range(layers):
        base = layer_fmt.format(i)
        for name, shape in zip(linears, shapes, strict=True):
            t[f"{base}{name}.weight"] = rand(*shape)
            t[f"{base}{name}.bias"] = rand(shape[0])
        for name in norms:
            t[f"{base}{name}.weight"] = norm_offset + rand(d)
            t[f"{base}{name}.bias"] = rand(d)
    return t


# A DistilBERT block's Hugging Face names (as BERT_BLOCK's)
DISTILBERT_BLOCK = (
    "transformer.layer.{}.",
    (
        "attention.q_lin",
        "attention.k_lin",
        "attention.v_lin",
        "attention.out_lin",
        "ffn.lin1",
        "ffn.lin2",
    ),
    ("sa_layer_norm", "output_layer_norm"),
)
# The tiny encoder's fixed sizes under BERT's config.json names; DistilBERT's names of them
TINY_ENCODER = dict(
    hidden_size=D, num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=MAX_POS
)
DISTILBERT_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
}


def tiny_sizes(model_type: str = "bert", *, layers: int = LAYERS, vocab: int = 100) -> dict:
    """The tiny encoder's sizes (hidden size 32) under ``model_type``'s config.json names."""
    sizes = dict(TINY_ENCODER, num_hidden_layers=layers, vocab_size=vocab)
    if model_type == "distilbert":
        return {DISTILBERT_KEYS.get(k, k): v for k, v in sizes.items()}
    return sizes


def write_tiny_folder(
    folder: Path,
    model_type: str = "bert",
    *,
    layers: int = LAYERS,
    vocab: int = 100,
    prefix: str = "",
    drop: tuple[str, ...] = (),
    config_overrides: dict[str, Any] | None = None,
    seed: int = 0,
) -> Path:
    """A random BERT, RoBERTa or DistilBERT folder (config.json, model.safetensors in Hugging
    Face tensor names, each behind ``prefix``, those in ``drop`` left out), hidden size 32."""
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    t = {
        "embeddings.word_embeddings.weight": rand(vocab, D),
        "embeddings.position_embeddings.weight": rand(MAX_POS, D),
    }
    if model_type != "distilbert":
        t["embeddings.token_type_embeddings.weight"] = rand(2, D)
    t["embeddings.LayerNorm.weight"] = 1 + rand(D)
    t["embeddings.LayerNorm.bias"] = rand(D)
    sizes = tiny_sizes(model_type, layers=layers, vocab=vocab)
    if model_type == "distilbert":
        config = sizes | dict(model_type=model_type, activation="gelu", sinusoidal_pos_embds=False)
        config["pad_token_id"] = 0
        block = DISTILBERT_BLOCK
    else:
        config = dict(sizes, model_type=model_type, type_vocab_size=2, hidden_act="gelu")
        config |= dict(layer_norm_eps=1e-12, pad_token_id=1 if model_type == "roberta" else 0)
        block = BERT_BLOCK
    t.update(random_blocks(rand, layers, block, D, FFN))
    config.update(config_overrides or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {prefix + k: a for k, a in t.items() if k not in drop}, str(folder / "model.safetensors")
    )
    return folder


def write_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """A random BERT folder (:func:`write_tiny_folder`) with MiniLM's vocabulary and
    tokenizer.json."""
    tok = minilm_path()
    vocab = json.loads((tok / "config.json").read_text())["vocab_size"]
    write_tiny_folder(folder, vocab=vocab, seed=seed)
    shutil.copy(tok / "tokenizer.json", folder / "tokenizer.json")
    return folder


# --------------------------------------------------------------------------------------------
# The paper-table jobs (Table 3 and Table 4 write the same kinds of outputs)
# --------------------------------------------------------------------------------------------


def headline_cells(text: str) -> dict[str, list[str]]:
    """Markdown table rows by their first cell (the headline table only: the first table)."""
    out = {}
    for line in text.split("### Direction")[0].splitlines():
        if line.startswith("| ") and not line.startswith("| model"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def cell_number(cell: str) -> float:
    """A table cell's number: bold or not, or a flagged one's in brackets."""
    return float(cell.strip("*").rsplit("(", 1)[-1].rstrip(")"))


def cell_status(run: dict) -> str:
    """A paper table's status of a cell that is one run (one seed, one point; at several
    points the best of those whose status is ok), by the runner's rule: ERM is eligible
    unless diverged; a constrained run must be feasible and descend at every layer on
    validation."""
    if not run["constrained"]:
        return "ok"
    if not run["feasible"]:
        return "infeasible"
    return "ok" if run["loss_decreases_val"] else "not monotone"


def one_line_error(capsys) -> str:
    """What the job wrote to stderr: one ``error: ...`` line."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def exit_status(main, argv) -> int:
    """``main(argv)``'s exit status, as the command line would give it: the value it returns,
    or ``SystemExit.code`` where the flag parser or the config's checks exit directly."""
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def assert_one_line_error(main, argv, capsys, *words: str, out: Path | None = None) -> str:
    """Bad input, as docs/errors.md promises: ``main(argv)`` exits 2 (:func:`exit_status`)
    with one line ``error: ...`` on stderr that holds each of ``words``, and ``out`` (where
    given) is not created. What was on stderr before the call is dropped. The line."""
    capsys.readouterr()
    assert exit_status(main, argv) == 2
    err = one_line_error(capsys)
    assert all(w in err for w in words), (words, err)
    assert out is None or not Path(out).exists(), out
    return err


def bad_flags_test(main, cases: list[tuple[list[str], str]]):
    """A test over ``cases``, each ``(argv, words)``: ``main([*argv, "--out", OUT])`` fails as
    :func:`assert_one_line_error` says (exit 2, one line holding ``words``) and creates no
    ``OUT``. Bind it to a ``test_...`` name in the test module."""

    @pytest.mark.parametrize("argv, words", cases)
    def test(argv, words, capsys, tmp_path):
        out = tmp_path / "out"
        assert_one_line_error(main, [*argv, "--out", out], capsys, words, out=out)

    return test


def stamps(folder: Path) -> dict[str, int]:
    """Every file below ``folder`` and its modification time (ns): what a rerun rewrote."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


def assert_rerun_reuses(main, argv, out: Path, subs: list[str], headline: str, capsys) -> None:
    """A paper-table job run again with its flags ``argv`` trains and rewrites nothing: every
    sub-run in ``subs`` reused, the headline table (its row ``headline``) printed; with one more
    ``--steps`` it refuses in one line, naming the difference, before anything is written."""
    results = out / subs[0] / "results.json"
    before = results.stat().st_mtime_ns
    files = stamps(results.parent)
    capsys.readouterr()
    assert main(argv) == 0
    assert stamps(results.parent) == files  # no training: no checkpoint or result rewritten
    assert results.stat().st_mtime_ns == before
    printed = capsys.readouterr().out
    assert all(f"{sub}: reusing" in printed for sub in subs), printed
    assert f"{len(subs)} sub-runs (0 trained, {len(subs)} reused)" in printed
    assert f"| {headline} |" in printed  # the headline table is printed
    # Other flags: refused before anything is trained or written, naming the difference.
    other = list(argv)
    steps = int(other[other.index("--steps") + 1])
    other[other.index("--steps") + 1] = str(steps + 1)
    words = f"holds results of another config (steps: {steps} there, {steps + 1} now"
    assert_one_line_error(main, other, capsys, words)
    assert results.stat().st_mtime_ns == before


def assert_figures(out, names, min_height: int) -> None:
    """Each figure a real PNG: at least 600 × ``min_height`` pixels, more than 50 colours."""
    for name in names:
        with Image.open(out / name) as im:
            assert im.format == "PNG"
            assert im.size[0] >= 600 and im.size[1] >= min_height, (name, im.size)
            assert len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 50, name


# The keys of a run record (results.json) that the shared runner writes for every task
RUNNER_KEYS = {
    "model",
    "layers",
    "constrained",
    "seed",
    "gamma_train",
    "test_gamma",
    "layer_loss",
    "descent_rate",
    "mean_ratio",
    "median_ratio",
    "feasible",
    "multipliers",
    "diverged",
}


# --------------------------------------------------------------------------------------------
# ToyTask: a task of a few lines through the shared runner (tests/runner/test_runner.py)
# --------------------------------------------------------------------------------------------

DIM = 8


@dataclasses.dataclass(frozen=True)
class ToyConfig(RunConfig):
    layers: int = flag(2, "residual layers", check=at_least(1))
    num_examples: int = flag(96, "examples per split", check=at_least(8))
    steps: int = shared("steps", 12)
    batch_size: int = shared("batch_size", 8)
    chunk_steps: int = shared("chunk_steps", 4)
    eval_batch_size: int = shared("eval_batch_size", 32)
    seeds: int = shared("seeds", 2)
    lr: float | None = shared("lr", 3e-2)
    dual_lr: float = shared("dual_lr", 0.2)
    epsilon: float = shared("epsilon", 0.3)
    warmup_steps: int | None = shared("warmup_steps", 2)


class ToyTask(Task):
    name = "toy"
    config_cls = ToyConfig
    eval_traces = 0

    def load(self, cfg):
        rng = np.random.default_rng(cfg.data_rng_seed)
        basis = rng.normal(size=(2, DIM)).astype(np.float32)
        return {
            split: (rng.normal(size=(cfg.num_examples, 2)).astype(np.float32) @ basis)
            for split in ("train", "val", "test")
        }

    def fingerprint(self, cfg, data):
        return {}  # the data is drawn from --num-examples and the seed alone: in the config

    def split_examples(self, data, split, model):
        return data[split]

    def model_names(self, cfg):
        return ["toy"]

    def build(self, cfg, data, name, structure):
        L = cfg.layers

        def states(params, x):
            out = [x]
            for layer in range(L):
                out.append(out[-1] - jnp.tanh(out[-1] @ params["w"][layer]))
            return jnp.stack(out)  # [L+1, B, D]

        def per_sample(params, clean, noise):
            return jnp.mean((states(params, clean + noise) - clean[None]) ** 2, axis=2).T

        def layer_losses(params, batch, key):
            noise = batch.gamma * jax.random.normal(key, batch.examples.shape)
            return per_sample(params, batch.examples, noise)

        def eval_outputs(params, frozen, clean, index, gamma, key):
            self.eval_traces += 1  # Python runs only while tracing: counts compilations
            noise = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i), (DIM,)))(index)
            return {"losses": per_sample(params, clean, gamma * noise)}

        return GroupModel(
            name="toy",
            num_layers=L,
            init=lambda key: {"w": 0.05 * jax.random.normal(key, (L, DIM, DIM))},
            layer_losses=layer_losses,
            eval_outputs=eval_outputs,
        )

    def test_gamma_grid(self, cfg, gamma_train):
        return sorted({0.0, 1.0, gamma_train})

    def run_metrics(self, cfg, test, val, gammas, gamma_train):
        return {"final_loss": [float(g[:, -1].mean()) for g in test["losses"]]}

    def metric_columns(self):
        return [Column("final", 8, lambda r: f"{r['final_loss'][0]:.4f}")]


def combine_toy_folders(tmp_path: Path, runs_by_folder: list[list[dict]], config=None) -> str:
    """``combine --per-folder``'s text over folders ``data0``, ``data1``, ... of ``tmp_path``,
    each a results.json of the given run records (and ``config``, its seed 5 by default), of a
    task that chooses on ``val_objective``, lower is better."""
    import types

    from cudt.runner.combine import combine_per_folder

    folders = []
    for f, runs in enumerate(runs_by_folder):
        folder = tmp_path / f"data{f}"
        folder.mkdir()
        results = {"experiment": "toy", "config": config or {"seed": 5}, "runs": runs}
        (folder / "results.json").write_text(json.dumps(results))
        folders.append(folder)

    @dataclasses.dataclass
    class Config:
        seed: int = 0

    task = types.SimpleNamespace(
        name="toy", config_cls=Config, selection_for=lambda cfg: ("val_objective", False)
    )
    return combine_per_folder(task, folders)


# A tiny text-classification run's data and batch sizes (the text task and the text table)
TINY_TEXT = [
    "--num-train", "40", "--num-test", "20", "--max-length", "16", "--batch-size", "8",
    "--test-gammas", "0,2",
]  # fmt: skip


def finished_job(main, argv, out) -> Path:
    """A job's ``main`` run on ``argv`` and ``--out out``, which must succeed: ``out``."""
    assert main([*argv, "--out", str(out)]) == 0
    return Path(out)


def job_results(main, argv, out) -> dict:
    """A job's ``main`` run on ``argv`` and ``--out out``, which must succeed: its results.json."""
    return json.loads((finished_job(main, argv, out) / "results.json").read_text())


def help_text(main, config_cls, capsys) -> str:
    """``main(["--help"])``'s text, which must exit 0 and name every field of ``config_cls`` as
    a flag."""
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(config_cls):
        assert "--" + f.name.replace("_", "-") in text
    return text


def toy_main(argv, task=None) -> int:
    """The toy job's command line (a fresh :class:`ToyTask` unless ``task`` is given)."""
    return task_main(task or ToyTask(), argv, "toy", "toy")


def toy(argv, out, task=None) -> dict:
    """The toy job's results.json, run on ``argv`` without its figures (``--figures`` in
    ``argv`` draws them: a test that reads them)."""
    return job_results(lambda a: toy_main(a, task), ["--no-figures", *argv], out)


def watch_opens_forbid_unpickling(monkeypatch) -> list[str]:
    """Record every path ``open``/``io.open`` is given from now on (the returned list) and make
    ``pickle.load(s)`` raise: a loader that refuses pickle checkpoints must never open one."""
    opened: list[str] = []

    def spy(real):
        def wrapper(file, *args, **kwargs):
            opened.append(str(file))
            return real(file, *args, **kwargs)

        return wrapper

    def no_unpickling(*args, **kwargs):
        raise AssertionError("the loader tried to unpickle")

    monkeypatch.setattr(builtins, "open", spy(builtins.open))
    monkeypatch.setattr(io, "open", spy(io.open))
    monkeypatch.setattr(pickle, "load", no_unpickling)
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    return opened


def assert_folder_refusals(load, write, folder: Path, monkeypatch, error) -> None:
    """What a loader of Hugging Face model folders refuses, each with ``error``: a missing
    folder, one with no config.json, one whose weights are a pickle only (pickle checkpoints are
    unsafe: never opened) and one with no weights at all. ``write(folder)`` writes one that loads."""
    with pytest.raises(error, match="does not exist"):
        load(folder / "nope")
    with pytest.raises(error, match="no config.json"):
        load(folder)
    write(folder)
    (folder / "model.safetensors").unlink()
    # Garbage that would blow up (not ``error``) if anything tried to unpickle it.
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x05garbage-not-a-pickle" * 8)
    opened = watch_opens_forbid_unpickling(monkeypatch)
    with pytest.raises(
        error, match=r"pickle checkpoints are not loaded \(unsafe\); convert to safetensors"
    ):
        load(folder)
    assert not [f for f in opened if f.endswith("pytorch_model.bin")], opened
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(error, match="has no model.safetensors"):
        load(folder)


# --------------------------------------------------------------------------------------------
# Another job holding output folders' locks (cudt.runner.lock)
# --------------------------------------------------------------------------------------------

_HOLDER = """
import os, signal, sys
from cudt.runner.lock import lock_output
held = {}
for line in sys.stdin:
    command, _, path = line.rstrip("\\n").partition(" ")
    if command == "hold":
        held[path] = lock_output(path)
    elif command == "release":
        held.pop(path).release()
    elif command == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    print("ok", flush=True)
"""


class LockHolder:
    """A second process that takes and releases the lock of output folders with the runner's
    own :func:`cudt.runner.lock.lock_output`, as another job would (started on first use):
    ``hold(folder)``, ``release(folder)``, ``die()`` (SIGKILL: the lock files it leaves are
    stale, as a killed job's are)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _send(self, line: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _HOLDER],
                cwd=ROOT,
                env=dict(os.environ, JAX_PLATFORMS="cpu"),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply == "ok\n", reply

    def hold(self, folder: Path) -> None:
        self._send(f"hold {folder}")

    def release(self, folder: Path) -> None:
        self._send(f"release {folder}")

    def die(self) -> None:
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def start_script(code: str, *args) -> subprocess.Popen:
    """Another job: ``code`` run by another Python process on the CPU, with ``args`` as its
    ``sys.argv[1:]`` (it can import ``helpers``); its stdout dropped, its stderr piped (text)."""
    tests = str(ROOT / "tests")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys\nsys.path.insert(0, {tests!r})\n{code}",
            *map(str, args),
        ],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` (itself included) with its kind, size and modification time
    in nanoseconds: a file created and removed again still changes its folder's time."""
    paths = [folder, *sorted(folder.rglob("*"))]
    return {
        str(p.relative_to(folder)): (p.is_dir(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in paths
    }


# --------------------------------------------------------------------------------------------
# The tiny Llama of the LLM tests: a DecoderConfig's sizes (a vocabulary is each test's own)
# --------------------------------------------------------------------------------------------

TINY_DECODER = TINY_SIZES  # write_tiny_gguf's
# ... as llm_sft's flags of the decoder it trains from scratch (no --checkpoint)
TINY_DECODER_FLAGS = [
    text
    for name, flag in (
        ("num_layers", "--layers"),
        ("hidden_size", "--hidden"),
        ("num_heads", "--heads"),
        ("num_kv_heads", "--kv-heads"),
        ("intermediate_size", "--intermediate"),
    )
    for text in (flag, str(TINY_DECODER[name]))
]


# --------------------------------------------------------------------------------------------
# A per-layer LM readout problem (tests/test_lm_loss.py, tests/test_response_readout.py)
# --------------------------------------------------------------------------------------------


def rms_norm(x, scale):
    """Llama's final norm, ``[..., D] -> [..., D]``, with a (traced) scale."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def readout_problem(layers, batch, seq, d, vocab, *, seed, masked, kept, dtype):
    """``(states [layers, batch, seq, d], head [d, vocab], scale [d], labels, mask)``: states that
    read out better with depth (accuracy neither 0 nor 1); each token masked with probability
    ``masked``, but sample 1 all masked and token 0 of sample 0 and the token ``kept`` (sample,
    position) unmasked; HF-style ``-100`` labels at every masked position."""
    ks = jax.random.split(jax.random.key(seed), 5)
    head = jax.random.normal(ks[0], (d, vocab))
    labels = jax.random.randint(ks[1], (batch, seq), 0, vocab)
    mask = jax.random.uniform(ks[2], (batch, seq)) > masked
    mask = mask.at[1].set(False).at[0, 0].set(True).at[kept].set(True)
    depth = jnp.linspace(0.0, 1.5, layers)[:, None, None, None]
    states = jax.random.normal(ks[3], (layers, batch, seq, d)) + depth * head.T[labels][None]
    scale = 1.0 + 0.1 * jax.random.normal(ks[4], (d,))
    labels = jnp.where(mask, labels, -100)
    return states.astype(dtype), head.astype(dtype), scale.astype(dtype), labels, mask


def readout_objective(fn, states, head, scale, labels, mask):
    """A weighted sum of both outputs of a readout ``fn`` (the weights differ per sample and
    layer): ``(objective, (ce, acc))``."""
    ce, acc = fn(states, lambda x: rms_norm(x, scale), head, labels, mask)
    weights = jnp.linspace(0.1, 1.0, ce.size).reshape(ce.shape)
    return jnp.sum(weights * ce) + jnp.sum(acc), (ce, acc)


# --------------------------------------------------------------------------------------------
# llama.cpp's converter
# --------------------------------------------------------------------------------------------


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """``LlamaModel.permute`` of llama.cpp's convert_hf_to_gguf.py, verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
