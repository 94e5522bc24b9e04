"""How far a linear reader of the text task's tokens gets, with and without their order: the
ceiling an order-free model (the UT without positions: attention and a mean) is held to.

    python -m experiments.text_ceiling --dataset aclimdb --data-dir DIR/aclImdb --seeds 3

The flags are the text task's own (``python -m experiments.text_classify --help``); read are the
data (``--dataset``, ``--data-dir``, ``--num-train``, ``--num-test``, ``--val-fraction``), the
seeds (each draws its own data as the runner does; ``--data-seed D``: one draw), and the
tokenizer and word embeddings (``--model``, ``--checkpoint``, ``--max-length``); any other flag
would not act, and is refused. Nothing is
trained but the readers: on exactly the tokens a run of these flags reads, at γ = 0, each
:data:`READERS` is an L2-regularised logistic regression (binomial for two classes,
multinomial above), fitted on the training split by L-BFGS to convergence at every C of
:data:`C_GRID` (the loss: mean cross-entropy + ‖W‖² / (2 C N), as scikit-learn's C, on features
scaled to unit mean squared row norm, so one grid serves every reader). C is
chosen on VALIDATION accuracy (ties: the smaller C); test accuracy is reported only. Prints one
table: per seed, and the mean with a Student-t interval over the seeds; writes nothing. Bad
input is one line, exit status 2.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse as sp

from cudt.errors import UsageError
from cudt.runner.cli import (
    config_main,
    exit_process,
    given_on_command_line,
)
from cudt.runner.provenance import provenance
from cudt.runner.run import data_draws
from cudt.stats import level_mark, paired_t_interval, t_interval
from cudt.tasks.text import TextConfig, TextTask

__all__ = [
    "C_GRID",
    "READ",
    "READERS",
    "choose",
    "features",
    "fit",
    "main",
    "markdown",
    "run_ceiling",
]

_PROG = "python -m experiments.text_ceiling"
# the text task's flags this command reads; any other (a training flag) would not act: refused
READ = (
    "dataset", "data_dir", "download", "num_train", "num_test", "val_fraction", "seed", "seeds",
    "data_seed", "model", "checkpoint", "max_length",
)  # fmt: skip
C_GRID = tuple(10.0**e for e in range(-1, 5))  # on features scaled to unit mean row norm


def _counts(ids: np.ndarray, mask: np.ndarray, width: int) -> sp.csr_matrix:
    """``[N, width]``: how often each id occurs among each row's real tokens."""
    rows = np.repeat(np.arange(ids.shape[0]), mask.sum(1).astype(int))
    cols = ids[mask.astype(bool)]
    data = np.ones(cols.size)
    return sp.csr_matrix((data, (rows, cols)), shape=(ids.shape[0], width))


def _pairs(ids: np.ndarray, mask: np.ndarray, width: int) -> np.ndarray:
    """``[N, T-1]`` codes ``a·width + b`` of adjacent real tokens (−1 where either is padding)."""
    both = mask[:, :-1].astype(bool) & mask[:, 1:].astype(bool)
    codes = ids[:, :-1].astype(np.int64) * width + ids[:, 1:]
    return np.where(both, codes, -1)


def _pair_presence(codes: np.ndarray, known: np.ndarray) -> sp.csr_matrix:
    """``[N, len(known)]``: which of the ``known`` pair codes (sorted) each row holds."""
    if known.size == 0:
        return sp.csr_matrix((codes.shape[0], 0))
    where = np.minimum(np.searchsorted(known, codes), known.size - 1)
    hit = (codes >= 0) & (known[where] == codes)
    rows = np.nonzero(hit)[0]
    x = sp.csr_matrix((np.ones(rows.size), (rows, where[hit])), shape=(codes.shape[0], known.size))
    return (x > 0).astype(np.float64)


def _presence(split, width, table, known):
    return (_counts(split.ids, split.mask, width) > 0).astype(np.float64)


def _frequency(split, width, table, known):
    counts = _counts(split.ids, split.mask, width)
    return sp.diags(1.0 / np.maximum(split.mask.sum(1), 1)) @ counts


def _mean_embedding(split, width, table, known):
    return np.asarray(_frequency(split, width, table, known) @ table)


def _with_pairs(split, width, table, known):
    pairs = _pair_presence(_pairs(split.ids, split.mask, width), known)
    return sp.hstack([_presence(split, width, table, known), pairs]).tocsr()


# name -> (features of a split, whether it reads the tokens' order)
READERS: dict[str, tuple[Callable, bool]] = {
    "word pieces present": (_presence, False),
    "word-piece frequencies (count / length)": (_frequency, False),
    "mean word embedding (the UT's state 0 at γ = 0)": (_mean_embedding, False),
    "word pieces and adjacent pairs present": (_with_pairs, True),
}


def features(reader: str, splits: dict, table: np.ndarray) -> dict[str, Any]:
    """``{split: [N, F]}`` of ``reader`` for each tokenized split (pairs: those of the training
    split; a pair seen only in validation or test has no weight to read), all scaled by one
    number so the training rows have mean squared norm 1: the readers' features differ in scale
    by 10⁴ (a presence row has ~150 ones, a frequency row sums to 1), and one :data:`C_GRID`
    then serves them all."""
    make, _ = READERS[reader]
    width = table.shape[0]
    known = None
    if READERS[reader][1]:  # the pairs the training split holds
        known = np.unique(_pairs(splits["train"].ids, splits["train"].mask, width))
        known = known[known >= 0]
    x = {k: make(s, width, table, known) for k, s in splits.items()}
    if sp.issparse(x["train"]):  # the columns the training split holds: no other has a weight
        used = np.unique(x["train"].indices)
        x = {k: v.tocsc()[:, used].tocsr() for k, v in x.items()}
    train = x["train"]
    squares = train.multiply(train).sum() if sp.issparse(train) else np.square(train).sum()
    scale = 1.0 / np.sqrt(max(float(squares) / train.shape[0], 1e-300))
    return {k: v * scale for k, v in x.items()}


def _columns(num_classes: int) -> int:
    return 1 if num_classes == 2 else num_classes


def _logits(x, w: np.ndarray, b: np.ndarray, num_classes: int) -> np.ndarray:
    z = np.asarray(x @ w) + b
    return np.concatenate([np.zeros_like(z), z], 1) if num_classes == 2 else z


def fit(
    x, labels: np.ndarray, num_classes: int, c: float, start: tuple | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], bool]:
    """The minimiser ``(W [F, K'], b [K'])`` of mean cross-entropy + ‖W‖² / (2 C N), K' = 1 for
    two classes (binomial: class 1's logit against class 0's zero) and K otherwise; L-BFGS from
    ``start`` (zero when None) until the gradient's largest entry is below 1e-8; and whether it
    got within 1e-6 of that (False: L-BFGS stopped at its iteration cap or in a failed line
    search first). The problem is convex, strictly for two classes (above two the biases are
    set up to one shared constant, which no prediction reads): the start changes the time, not
    the answer."""
    n, f = x.shape
    k = _columns(num_classes)
    onehot = np.eye(num_classes)[labels]

    def loss_and_grad(theta):
        w, b = theta[: f * k].reshape(f, k), theta[f * k :]
        z = _logits(x, w, b, num_classes)
        z = z - z.max(1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
        loss = -(onehot * log_p).sum() / n + (w * w).sum() / (2 * c * n)
        dz = (np.exp(log_p) - onehot) / n
        dz = dz[:, 1:] if num_classes == 2 else dz
        gw = np.asarray(x.T @ dz) + w / (c * n)
        return loss, np.concatenate([gw.ravel(), dz.sum(0)])

    found = scipy.optimize.minimize(
        loss_and_grad,
        np.zeros(f * k + k) if start is None else np.concatenate([p.ravel() for p in start]),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 15_000, "gtol": 1e-8, "ftol": 0.0},
    )
    theta = found.x
    converged = bool(found.success) or float(np.abs(found.jac).max()) < 1e-6
    return (theta[: f * k].reshape(f, k), theta[f * k :]), converged


def accuracy(x, labels: np.ndarray, params, num_classes: int) -> float:
    return float(np.mean(_logits(x, *params, num_classes).argmax(1) == labels))


def choose(x: dict, labels: dict, num_classes: int, grid: Sequence[float] = C_GRID) -> dict:
    """Fits at every C of ``grid`` on ``train`` (in increasing order, each from the last one's
    solution); the C of the best validation accuracy (ties: the smaller), and its validation and
    test accuracies (test read after the choice only)."""
    scored, params, short = [], None, 0
    for c in sorted(grid):
        params, converged = fit(x["train"], labels["train"], num_classes, c, params)
        short += not converged
        scored.append((accuracy(x["val"], labels["val"], params, num_classes), -c, params))
    val, neg_c, params = max(scored, key=lambda s: s[:2])
    return {
        "C": -neg_c,
        "val_accuracy": val,
        "test_accuracy": accuracy(x["test"], labels["test"], params, num_classes),
        "val_by_C": [s[0] for s in scored],
        "unconverged": short,
    }


def _seed_rows(task: TextTask, draw_cfg) -> list[dict]:
    data = task.load(draw_cfg)
    splits = data.tokens
    table = np.asarray(data.model.table, np.float64)
    labels = {k: np.asarray(s.labels) for k, s in splits.items()}
    k = data.source.num_classes
    rows = []
    for reader, (_, ordered) in READERS.items():
        t = time.perf_counter()
        row = choose(features(reader, splits, table), labels, k)
        rows.append(
            {"reader": reader, "ordered": ordered, "seed": draw_cfg.data_rng_seed}
            | row
            | {"sizes": {s: len(v) for s, v in splits.items()}, "num_classes": k}
            | {"seconds": time.perf_counter() - t}
        )
    return rows


def markdown(result: dict) -> str:
    """Test accuracy per reader and seed (the validation accuracy and the chosen C beside it),
    and the mean with its t interval over the seeds."""
    rows = result["rows"]
    seeds = sorted({r["seed"] for r in rows})
    first = rows[0]
    origin = result["provenance"]
    commit = (origin.get("commit") or "?")[:7] + ("+dirty" if origin.get("dirty") else "")
    lines = [
        f"`{result['command']}` at commit {commit}, "
        f"{result['wall_seconds']:.0f} s wall; {first['sizes']['train']} train / "
        f"{first['sizes']['val']} validation / {first['sizes']['test']} test per seed, "
        f"{first['num_classes']} classes (chance {1 / first['num_classes']:.3f}). Test accuracy "
        "(validation accuracy, C chosen on it); C in "
        + ", ".join(f"{c:g}" for c in result["grid"]),
        "",
        "| reader (logistic regression, γ = 0) | order | "
        + " | ".join(f"seed {s}" for s in seeds)
        + (
            " | mean [95 % t over seeds] |"
            if len(seeds) > 1
            else " | mean (one seed: no interval) |"
        ),
        "|---|---|" + "---|" * (len(seeds) + 1),
    ]
    for reader in READERS:
        mine = {r["seed"]: r for r in rows if r["reader"] == reader}
        cells = [
            f"{mine[s]['test_accuracy']:.3f} ({mine[s]['val_accuracy']:.3f}, C {mine[s]['C']:g}"
            + ("*)" if mine[s]["C"] in (result["grid"][0], result["grid"][-1]) else ")")
            for s in seeds
        ]
        interval = t_interval([mine[s]["test_accuracy"] for s in seeds])
        mean = (
            f"{interval.mean:.3f}"
            if len(seeds) == 1
            else f"{interval.mean:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
        )
        order = "reads order" if mine[seeds[0]]["ordered"] else "order-free"
        lines.append(f"| {reader} | {order} | " + " | ".join(cells) + f" | {mean} |")
    lines += order_gain_lines(rows, seeds)
    short = sum(r.get("unconverged", 0) for r in rows)
    if short:
        lines += [
            "",
            f"Of the {len(rows) * len(result['grid'])} fits, {short} stopped short of the "
            "optimum (L-BFGS's iteration cap or a failed line search): those readers may read more.",
        ]
    edge = [r for r in rows if r["C"] in (result["grid"][0], result["grid"][-1])]
    if edge:
        lines += [
            "",
            f"\\* C at an end of the grid ({len(edge)} of {len(rows)}): a wider grid may read more.",
        ]
    return "\n".join(lines) + "\n"


def order_gain_lines(rows: list[dict], seeds: list[int]) -> list[str]:
    """What reading order adds: each order-reading reader's test accuracy minus the order-free
    reader best on validation (mean over the seeds; test data only report), with the paired t
    interval over the seeds (each seed its own draw of the data), ``level`` where it spans 0."""
    by = {
        reader: [next(r for r in rows if r["reader"] == reader and r["seed"] == s) for s in seeds]
        for reader in READERS
    }
    free = [reader for reader, (_, ordered) in READERS.items() if not ordered]
    base = max(free, key=lambda reader: np.mean([r["val_accuracy"] for r in by[reader]]))
    lines = []
    for reader, (_, ordered) in READERS.items():
        if not ordered:
            continue
        a = [r["test_accuracy"] for r in by[reader]]
        b = [r["test_accuracy"] for r in by[base]]
        diff = float(np.mean(a) - np.mean(b))
        if len(seeds) > 1:
            iv = paired_t_interval(a, b)
            level = level_mark(iv)  # no gain claimed where it spans 0
            shown = (
                f"{iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]{level}, paired t over "
                f"{len(seeds)} seeds"
            )
        else:
            shown = f"{diff:+.3f} (one seed: no interval)"
        lines.append(
            f"Order: {reader} − {base} (the order-free reader best on validation): {shown}."
        )
    return ["", *lines] if lines else []


def run_ceiling(cfg: TextConfig, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Every reader at every seed's draw of ``cfg``'s data; prints and returns the table (its
    first line names the command of the flags ``argv`` that made ``cfg``)."""
    t0 = time.perf_counter()
    task = TextTask()
    origin = provenance()
    rows = []
    for seed, draw_cfg in data_draws(cfg).items():
        t = time.perf_counter()
        rows += _seed_rows(task, draw_cfg)
        print(f"data seed {seed}: {len(READERS)} readers in {time.perf_counter() - t:.0f} s")
    command = _PROG if not argv else f"{_PROG} {shlex.join(argv)}"
    result = {"command": command, "provenance": origin, "grid": list(C_GRID), "rows": rows}
    result["wall_seconds"] = time.perf_counter() - t0
    result["markdown"] = markdown(result)
    print()
    print(result["markdown"], end="")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point: the text task's flags → the readers' table; bad input is one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # a flag that would not act here is refused before its value is read (a bad value of one
    # was reported as the value's fault)
    return config_main(
        TextConfig,
        lambda cfg: run_ceiling(cfg, argv),
        argv,
        __doc__,
        "experiments.text_ceiling",
        refuse=_read_only,
        shown=READ,
    )


def _read_only(argv: list[str]) -> list[str]:
    """``argv``, unless it gives a flag that would not act here (one line naming it); the
    names as the parser read them (``--num-tr`` is ``--num-train``, which acts)."""
    extra = sorted(given_on_command_line(TextConfig, argv, quiet=True) - set(READ))
    if extra:
        flags = ", ".join("--" + n.replace("_", "-") for n in READ)
        raise UsageError(
            f"--{extra[0].replace('_', '-')} does not act here: text_ceiling trains no model and "
            f"reads only {flags}: drop it"
        )
    return argv


if __name__ == "__main__":
    exit_process(main())
