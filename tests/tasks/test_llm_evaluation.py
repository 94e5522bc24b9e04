"""The LLM task's Section 6 evaluation: the reference state (--reference-state, --untie-head),
feasibility at 0 % and at the tolerance, paired constrained − ERM intervals, and completions
scored case-sensitively in batches that give every run the same noise."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_DECODER

from cudt import stats
from cudt.models.llama import Decoder, DecoderConfig
from cudt.runner.task import RunBatch
from cudt.tasks.accuracy import feasibility_lines, largest_epsilon_met, paired_with_erm
from cudt.tasks.llm import LLMTask, reference_state
from cudt.tasks.llm_completions import completion_lines, completion_record, paired_lines
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.llm_data import untied

TINY = dict(
    num_train=24, num_val=4, num_test=6, max_length=48, layers=3, hidden=16, heads=2,
    kv_heads=1, intermediate=32, chunk_tokens=64, max_new_tokens=3, eval_batch_size=4,
)  # fmt: skip


def tiny_decoder(tied: bool) -> Decoder:
    c = DecoderConfig(vocab_size=40, **TINY_DECODER, tie_word_embeddings=tied)
    return Decoder(config=c, params=c.init_params(jax.random.key(0)))


@pytest.fixture(scope="module")
def tiny():
    task = LLMTask()
    cfg = LLMConfig(**TINY)
    return task, cfg, task.load(cfg)


@pytest.mark.slow
def test_block1_leaves_state_0_out_and_keeps_every_other_state(tiny):
    task, cfg, data = tiny
    full = task.build(dataclasses.replace(cfg, reference_state="embeddings"), data, "llm", None)
    b1 = task.build(dataclasses.replace(cfg, reference_state="block1"), data, "llm", None)
    assert (full.num_layers, b1.num_layers) == (3, 2)
    assert b1.record["first_state"] == 1 and "first_state" not in full.record
    params = full.init(jax.random.key(0))
    ex = jax.tree.map(lambda a: jnp.asarray(a[:4]), task.split_examples(data, "train"))
    batch = RunBatch(examples=ex, gamma=jnp.float32(0.5), frozen=full.frozen)
    a = np.asarray(full.layer_losses(params, batch, jax.random.key(1)))
    b = np.asarray(b1.layer_losses(params, batch, jax.random.key(1)))
    assert a.shape == (4, 4) and b.shape == (4, 3)
    np.testing.assert_array_equal(b, a[:, 1:])
    args = (params, full.frozen, ex, jnp.arange(4), jnp.float32(1.0), jax.random.key(2))
    ea, eb = full.eval_outputs(*args), b1.eval_outputs(*args)
    for k in ("losses", "correct"):
        np.testing.assert_array_equal(np.asarray(eb[k]), np.asarray(ea[k])[:, 1:])


def test_the_last_state_evaluation_equals_the_whole_ones_last_state(tiny):
    """eval_last (the runner's evaluator at a γ that is no run's γ_train) reads out the last
    state alone, with the same noise: its values are the whole evaluation's last column, with
    the reference state's model (block1) as without it. --states-at-every-gamma turns it off."""
    task, cfg, data = tiny
    ex = jax.tree.map(lambda a: jnp.asarray(a[:4]), task.split_examples(data, "test"))
    for ref in ("embeddings", "block1"):
        model = task.build(dataclasses.replace(cfg, reference_state=ref), data, "llm", None)
        params = model.init(jax.random.key(0))
        args = (params, model.frozen, ex, jnp.arange(4), jnp.float32(1.5), jax.random.key(2))
        whole, last = model.eval_outputs(*args), model.eval_last(*args)
        for k in ("losses", "correct"):
            assert last[k].shape == (4, 1) and whole[k].shape == (4, model.num_layers + 1)
            np.testing.assert_allclose(last[k], np.asarray(whole[k])[:, -1:], rtol=1e-5, atol=1e-6)
    every = dataclasses.replace(cfg, states_at_every_gamma=True)
    assert task.build(every, data, "llm", None).eval_last is None


def test_the_runner_reads_out_every_state_only_at_gamma_train():
    """evaluate_group with eval_last: the γ in ``per_state`` get every state, the others the
    last state only (NaN before it), each γ with its own key, as the whole evaluator's."""
    from cudt.runner.record import evaluate_group

    calls = []

    def whole(params, frozen, ex, index, gamma, key):  # [R=1, B, S=3]
        calls.append("whole")
        v = ex[None, :, None] * jnp.arange(1.0, 4.0) + gamma + jax.random.uniform(key)
        return {"losses": v}

    def last(params, frozen, ex, index, gamma, key):
        calls.append("last")
        return {"losses": whole(params, frozen, ex, index, gamma, key)["losses"][..., -1:]}

    batches = [
        dataclasses.make_dataclass("B", ["examples", "index", "count"])(
            jnp.asarray([1.0, 2.0]), np.asarray([2 * i, 2 * i + 1]), 2
        )
        for i in range(2)
    ]
    key = jax.random.key(0)
    ref = evaluate_group(whole, None, None, batches, 4, [0.0, 0.5, 1.0], key)["losses"]
    calls.clear()
    out = evaluate_group(whole, None, None, batches, 4, [0.0, 0.5, 1.0], key, last, {0.5})
    out = out["losses"]
    assert out.shape == ref.shape == (3, 1, 4, 3)
    np.testing.assert_array_equal(out[1], ref[1])  # γ_train: every state
    np.testing.assert_array_equal(out[[0, 2], ..., -1], ref[[0, 2], ..., -1])
    assert np.isnan(out[[0, 2], ..., :-1]).all()
    assert calls.count("last") == 4  # 2 γ x 2 batches; "whole" also traced once for the widths


def test_auto_reference_state_is_block1_only_when_the_embeddings_readout_is_fixed():
    tied, free = tiny_decoder(True), tiny_decoder(False)
    ckpt = LLMConfig(checkpoint="model.gguf")
    assert reference_state(ckpt, tied) == 1  # a checkpoint's tied head, frozen embeddings
    assert reference_state(ckpt, free) == 0  # its own head: ℓ_0 can move
    assert reference_state(dataclasses.replace(ckpt, train_embeddings=True), tied) == 0
    assert reference_state(LLMConfig(), tied) == 0  # trained from scratch
    assert reference_state(dataclasses.replace(ckpt, reference_state="embeddings"), tied) == 0
    assert reference_state(LLMConfig(reference_state="block1"), free) == 1
    # LoRA freezes the embeddings, the final norm and the head, tied or not: ℓ_0 cannot move
    lora = dataclasses.replace(ckpt, lora_rank=8)
    assert reference_state(lora, free) == reference_state(lora, tied) == 1


def test_untied_head_reads_out_the_same_and_is_its_own_parameter():
    dec = tiny_decoder(True)
    u = untied(dec)
    assert not u.config.tie_word_embeddings and "lm_head" in u.params
    ids = jnp.array([[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(
        np.asarray(u.readout_apply(u.params, u(ids))),
        np.asarray(dec.readout_apply(dec.params, dec(ids))),
    )
    moved = {**u.params, "lm_head": u.params["lm_head"] * 2.0}  # the head alone moves ℓ_0
    assert not np.allclose(
        np.asarray(u.readout_apply(moved, u(ids))[0]),
        np.asarray(u.readout_apply(u.params, u(ids))[0]),
    )
    assert untied(u) is u


def test_completions_are_scored_case_sensitively():
    from cudt.data.alpaca import AlpacaRecord

    rec = AlpacaRecord("Uppercase the word.", "apple", "APPLE")
    assert completion_record(rec, 0, 0.0, "APPLE")["exact"]
    assert not completion_record(rec, 0, 0.0, "apple")["exact"]
    assert completion_record(rec, 0, 0.0, "apple")["rouge_l"] == pytest.approx(1.0)


def test_completions_end_at_any_of_the_checkpoints_end_ids(tiny):
    """A checkpoint listing several end ids (Llama 3.1 Instruct: three) ended a completion at
    the tokenizer's EOS only and kept the text after another (found by review). The first
    token of the model's completion of prompt 0 is made a second end id: the completion ends
    before it."""
    from cudt.tasks.llm_completions import greedy_completions
    from cudt.tasks.llm_data import stop_ids

    task, cfg, data = tiny
    cfg = dataclasses.replace(cfg, completions=2, eval_batch_size=2, test_gammas=(0.0,))
    model = task.build(cfg, data, "llm", None)
    params = jax.tree.map(lambda x: x[None], model.init(jax.random.key(0)))  # one run
    tok, dec = data.tokenizer, data.decoder
    first = greedy_completions(cfg, data, model, params, ["a"], [0.0])
    written = tok.encode_batch([first[0]["completions"][0]["completion"]], specials=False)[0]
    other = int(written[-1])  # the last token of prompt 0's completion (a word, not <unk>)
    assert other != tok.eos_id and tok.decode([other]).strip()
    two = dataclasses.replace(dec.config, eos_token_id=(tok.eos_id, other))
    assert stop_ids(tok, two) == (tok.eos_id, other)
    data2 = dataclasses.replace(data, decoder=dataclasses.replace(dec, config=two))
    completion = greedy_completions(cfg, data2, model, params, ["a"], [0.0])[0]["completions"]
    before = first[0]["completions"][0]["completion"]
    assert completion[0]["completion"] != before
    assert before.startswith(completion[0]["completion"])


def test_runs_on_their_own_draws_show_their_completions_under_their_own_prompt():
    from cudt.data.alpaca import AlpacaRecord

    def run(label: str, word: str) -> dict:
        rec = AlpacaRecord("Uppercase the word.", word, word.upper())
        return {"label": label, "completions": [completion_record(rec, 0, 0.0, word.upper())]}

    runs = [run("ERM seed 0", "apple"), run("constrained seed 0", "apple")]
    runs += [run("ERM seed 1", "pear"), run("constrained seed 1", "pear")]
    lines = [line for line in completion_lines(runs) if line]
    assert lines == [
        "prompt 0: Uppercase the word. | input: apple",
        "  reference: APPLE",
        "  γ=0 ERM seed 0 [exact 1, ROUGE-L 1.00]: APPLE",
        "  γ=0 constrained seed 0 [exact 1, ROUGE-L 1.00]: APPLE",
        "prompt 0: Uppercase the word. | input: pear",
        "  reference: PEAR",
        "  γ=0 ERM seed 1 [exact 1, ROUGE-L 1.00]: PEAR",
        "  γ=0 constrained seed 1 [exact 1, ROUGE-L 1.00]: PEAR",
    ]


def fake_run(kind: bool, seed: int, acc: np.ndarray, rel: list[float], feasible: bool) -> dict:
    label = f"llm-2 {'constrained' if kind else 'ERM'} seed {seed}"
    return {
        "model": "llm", "layers": 2, "gamma_train": 0.5, "seed": seed, "constrained": kind,
        "hparams": {"lr": 1e-4, "epsilon": 0.0 if kind else None}, "label": label,
        "test_gamma": [0.0, 1.0], "prompt_accuracy": acc.tolist(),
        "relative_violation_val": rel, "feasible": feasible, "diverged": False,
        "completions": [
            {"prompt_index": i, "gamma": g, "exact": bool((i + seed + kind) % 2), "rouge_l": 0.5}
            for g in (0.0, 1.0) for i in range(4)
        ],
    }  # fmt: skip


def test_paired_intervals_pair_each_constrained_seed_with_its_erm_twin():
    rng = np.random.default_rng(0)
    erm_acc = rng.uniform(0, 1, (3, 2, 4))
    runs = [fake_run(False, s, erm_acc[s], [0.0, 0.1, -0.2], False) for s in range(3)]
    runs += [fake_run(True, s, erm_acc[s] + 0.1, [0.0, -0.01, 0.02], True) for s in range(3)]
    runs.append(fake_run(True, 7, erm_acc[0], [0.0, 0.0, 0.0], True))  # no ERM twin: left out
    ((name, cons, erm),) = paired_with_erm(runs)
    assert name == "" and [r["seed"] for r in cons] == [0, 1, 2] == [r["seed"] for r in erm]
    lines = paired_lines(runs)
    acc0 = next(ln for ln in lines if "token accuracy γ=0:" in ln)
    assert acc0.split()[3] == "+0.1000"  # every prompt gains exactly 0.1: the interval is a point
    assert "[+0.1000, +0.1000]" in acc0 and "4 prompts x 3 seeds" in acc0
    exact = next(ln for ln in lines if "exact match γ=1:" in ln)
    a = np.array([[(i + s + 1) % 2 for i in range(4)] for s in range(3)], float)
    b = np.array([[(i + s) % 2 for i in range(4)] for s in range(3)], float)
    iv = stats.paired_bootstrap_interval(a, b)
    t = stats.paired_t_interval(a.mean(axis=1), b.mean(axis=1))  # over the 3 seeds' means
    level = ", level" if t.low <= 0 <= t.high else ""
    assert f"{iv.mean:+.4f} [{t.low:+.4f}, {t.high:+.4f}] paired t{level}; bootstrap" in exact
    assert f"bootstrap [{iv.low:+.4f}, {iv.high:+.4f}]" in exact  # beside it, not instead


def test_the_headline_interval_is_the_paired_t_over_seeds_and_says_level_across_zero():
    """Seeds that disagree in sign: the t interval over their means spans 0 and says so, while
    the bootstrap over 400 prompts a seed is narrower; one seed gets no t interval at all."""
    gains = np.array([0.3, -0.2, 0.15])  # per seed, the same for every prompt
    erm = np.full((3, 2, 400), 0.4)
    runs = [fake_run(False, s, erm[s], [0.0], False) for s in range(3)]
    runs += [fake_run(True, s, erm[s] + gains[s], [0.0], True) for s in range(3)]
    line = next(ln for ln in paired_lines(runs) if "token accuracy γ=1:" in ln)
    t = stats.paired_t_interval(0.4 + gains, np.full(3, 0.4))
    assert t.low < 0 < t.high
    assert f"+{gains.mean():.4f} [{t.low:+.4f}, {t.high:+.4f}] paired t, level; bootstrap" in line
    one = next(ln for ln in paired_lines(runs[:1] + runs[3:4]) if "token accuracy γ=1:" in ln)
    assert "+0.3000, one seed: no t interval; bootstrap over prompts [+0.3000, +0.3000]" in one


def test_one_seed_and_one_prompt_say_there_is_no_interval_rather_than_nan():
    """A single test prompt and one seed: nothing to resample, so the line says so in words."""
    runs = [fake_run(k, 0, np.array([[0.4], [0.3]]) + 0.1 * k, [0.0], k) for k in (False, True)]
    for r in runs:
        r["completions"] = [c for c in r["completions"] if c["prompt_index"] == 0]
    lines = [ln for ln in paired_lines(runs) if ln.startswith("  ")]
    assert len(lines) == 6  # token accuracy, exact match and ROUGE-L at the two γ
    assert all("nan" not in ln and "one seed and one prompt: no interval" in ln for ln in lines)
    assert "token accuracy γ=0: +0.1000, one seed and one prompt: no interval" in lines[0]


def test_feasibility_is_reported_at_zero_and_at_the_tolerance():
    erm = fake_run(False, 0, np.zeros((2, 4)), [0.0, 0.1, -0.2], False)
    within = fake_run(True, 0, np.zeros((2, 4)), [0.0, -0.01, 0.02], True)  # +2 %: tol only
    strict = fake_run(True, 1, np.zeros((2, 4)), [-0.5, -0.01, 0.0], True)  # 0 % holds
    lines = feasibility_lines([erm, within, strict])
    assert "llm-2 ERM seed 0: +10.00%  0%: NO | tol: NO" in lines
    assert "llm-2 constrained seed 0: +2.00%  0%: NO | tol: yes" in lines
    assert "llm-2 constrained seed 1: +0.00%  0%: yes | tol: yes" in lines
    assert "llm-2 constrained: feasible at 0 % 1 of 2 seeds, at tolerance 2 of 2" in lines


def test_the_largest_epsilon_met_reads_the_worst_step_of_the_validation_losses():
    run = fake_run(True, 0, np.zeros((2, 4)), [-0.1, 0.0, 0.0, 0.0], True)
    run["layer_loss_val"] = [10.0, 9.0, 9.9, 4.0]  # steps: -10 %, +10 %, -59.6 %
    assert largest_epsilon_met(run) == pytest.approx(-0.1)
    run["constraint_applicable_val"] = [True, True, False, True]  # the rise not judged
    assert largest_epsilon_met(run) == pytest.approx(0.1)
    (line, _) = feasibility_lines([run])[1:]
    assert line.endswith("| descent met up to ε = +0.1000")
    run["relative_violation_val"] = [0.2, 0.0, 0.0, 0.0]
    assert feasibility_lines([run])[1].endswith("(the reference bound is not)")
    assert largest_epsilon_met(fake_run(True, 0, np.zeros((2, 4)), [0.0], True)) is None


@pytest.mark.slow
def test_completions_come_in_batches_with_the_same_noise_for_every_run(tiny):
    task, cfg, data = tiny
    cfg = dataclasses.replace(cfg, completions=5, eval_batch_size=2, test_gammas=(0.0, 2.0))
    model = task.build(cfg, data, "llm", None)
    one = model.init(jax.random.key(0))
    params = jax.tree.map(lambda x: jnp.stack([x, x]), one)  # two runs, the same weights
    out = task.trained_outputs(cfg, data, model, params, ["a", "b"])
    a, b = out[0]["completions"], out[1]["completions"]
    assert [(c["gamma"], c["prompt_index"]) for c in a] == [
        (g, i) for g in (0.0, 2.0) for i in range(5)
    ]  # 5 prompts in batches of 2 (the last one padded), each once per gamma
    assert [c["completion"] for c in a] == [c["completion"] for c in b]  # same noise: paired
    assert [c["reference"] for c in a[:5]] == [r.output for r in data.records["test"][:5]]


def test_the_section6_command_is_the_issues_comparison_and_later_flags_win():
    from cudt.runner.cli import config_from_args
    from experiments.llm_section6 import SECTION6

    cfg, _ = config_from_args(LLMConfig, list(SECTION6), "", "x")
    assert (cfg.checkpoint, cfg.data, cfg.seeds, cfg.kinds) == ("smollm2", "tasks", 3, "both")
    assert cfg.num_train >= 2000 and cfg.num_test >= 500 and cfg.completions >= 200
    assert (cfg.reference_state, cfg.reference, cfg.epsilon) == ("block1", "27", 0.02)
    assert (cfg.dual_optimizer, cfg.update, cfg.steps) == ("nupi", "alternating", 400)
    assert cfg.nupi_kp == 0  # plain projected ascent, as the pages say (llm.md, README)
    assert (cfg.dual_scale, cfg.dual_lr) == ("absolute", 0.05)  # the page's units (llm.md)
    assert cfg.completions <= cfg.num_test  # the completed prompts are test prompts
    cfg, _ = config_from_args(
        LLMConfig,
        [*SECTION6, "--steps", "300", "--epsilon", "0.05", "--dual-scale", "relative"],
        "",
        "x",
    )
    assert (cfg.steps, cfg.epsilon, cfg.dual_scale) == (300, 0.05, "relative")


def test_the_checkpoint_help_says_lora_rank_keeps_the_base_frozen(capsys):
    """--checkpoint is fine-tuned whole only without --lora-rank: its help says both."""
    from experiments import llm_sft

    with pytest.raises(SystemExit):
        llm_sft.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_ = text.split("--checkpoint CHECKPOINT ", 1)[1].split(" --", 1)[0]
    assert "fine-tune whole" not in help_
    assert "whole, or frozen under LoRA adapters with --lora-rank" in text


def test_the_section6_command_names_itself_in_its_help(capsys):
    from experiments import llm_section6

    with pytest.raises(SystemExit) as stop:
        llm_section6.main(["--help"])
    text = capsys.readouterr().out
    assert stop.value.code == 0 and text.startswith("usage: experiments.llm_section6 ")
    assert "Section 6 on SmolLM2-135M-Instruct" in text
    # what it runs: llm_sft with every flag and value of SECTION6, in order (the defaults shown
    # are llm_sft's), each flag on the line of its value
    assert " ".join(llm_section6.SECTION6) in " ".join(text.split())
    listed = text.split("these flags first", 1)[1].split("options:", 1)[0].split(":\n", 1)[1]
    for line in listed.strip("\n").splitlines():
        words = line.split()
        assert len(words) % 2 == 0 and all(w.startswith("--") for w in words[::2]), line


def test_the_section6_command_with_a_file_for_every_split_deals_no_generated_set(tmp_path):
    """llm_section6 with --train-data, --val-data and --test-data: its --data tasks would have
    no split left to deal, and the user, who never passed --data, was told to drop it."""
    from cudt.runner.cli import config_from_args
    from experiments.llm_section6 import SECTION6, section6_for

    files = []
    for split in ("train", "val", "test"):
        files += [f"--{split}-data", str(tmp_path / f"{split}.json")]
        (tmp_path / f"{split}.json").write_text('[{"instruction": "Say 1.", "output": "1"}]')
    cfg, _ = config_from_args(LLMConfig, [*section6_for(files), *files], "", "x")
    assert cfg.data is None and cfg.test_data == str(tmp_path / "test.json")
    assert cfg.epsilon == 0.02 and cfg.checkpoint == "smollm2"  # the rest of the command kept
    # --data deals the split without a file, at the command's size; a file is every record
    two = section6_for(files[:4])
    assert "--data" in two and "--num-test" in two
    assert "--num-train" not in two and "--num-val" not in two
    config_from_args(LLMConfig, [*two, *files[:4]], "", "x")  # accepted
    own = dict(zip(*[iter(section6_for([*files, "--data=alpaca.json"]))] * 2, strict=True))
    sizes = ("--num-train", "--num-val", "--num-test")  # the user's own --data: only the sizes go
    assert own == {k: v for k, v in zip(*[iter(SECTION6)] * 2, strict=True) if k not in sizes}


def test_the_section6_command_reads_an_abbreviated_file_flag_as_argparse_does(tmp_path):
    """``--test-d FILE`` is ``--test-data FILE`` to argparse; the command kept its ``--num-test
    500`` beside it and was refused with ``drop --num-test``, a flag the user never passed."""
    from cudt.runner.cli import config_from_args
    from experiments.llm_section6 import section6_for

    (tmp_path / "test.json").write_text('[{"instruction": "Say 1.", "output": "1"}]')
    for given in (["--test-d", str(tmp_path / "test.json")], [f"--test-dat={tmp_path}/test.json"]):
        flags = section6_for(given)
        assert "--num-test" not in flags and "--num-train" in flags, given
        cfg, _ = config_from_args(LLMConfig, [*flags, *given], "", "x")  # accepted
        assert cfg.test_data == str(tmp_path / "test.json") and cfg.data == "tasks"


def test_completions_are_taken_once_per_gamma_at_the_largest_gamma_of_the_jobs_grid():
    """Completions at γ = 0 and the largest test γ of the job: of every γ_train it trains (a
    sweep of them, not the flag's alone), and each γ once (--completion-gamma 0 generated and
    counted every prompt twice)."""
    from cudt.runner.run import evaluation_grids
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_completions import completion_gammas
    from cudt.tasks.llm_config import LLMConfig

    task = LLMTask()

    def gammas(cfg):  # as the task takes them: the runner's test grid of the job
        return completion_gammas(cfg, evaluation_grids(task, cfg, task.run_specs(cfg))[0])

    assert gammas(LLMConfig(test_gammas=(0.0, 1.0))) == [0.0, 1.0]
    swept = LLMConfig(test_gammas=(0.0, 1.0), sweep=("gamma_train=0.5,3",))
    assert gammas(swept) == [0.0, 3.0]
    assert gammas(LLMConfig(completion_gamma=0.0)) == [0.0]
    # a model's own γ_train (--model-hparams) is trained and evaluated: its grid counts too
    own = LLMConfig(test_gammas=(0.0, 1.0), model_hparams=("llm:gamma_train=3",))
    assert gammas(own) == [0.0, 3.0]


def test_validation_over_the_test_grid_is_reported_only_where_the_selection_reads_it():
    """val_auc / val_mean_rmse score validation over the test γ grid (--select val-auc,
    val-mean-rmse); a γ_train sweep alone scores validation at its values, which are no grid:
    no such field then (it was an "AUC" over the swept γ_trains, in the interval lines)."""
    import types

    from cudt.tasks.text import TextTask
    from cudt.tasks.video import VideoTask

    correct = {"correct": np.ones((2, 4, 3)), "losses": np.ones((2, 4, 3))}
    for task, select, name in (
        (TextTask(), "val-auc", "val_auc"),
        (VideoTask(), "val-mean-rmse", "val_mean_rmse"),
    ):
        assert task.val_metrics(types.SimpleNamespace(select="x"), correct, [0.5, 1.0], 0.5) == {}
        chosen = task.val_metrics(types.SimpleNamespace(select=select), correct, [0.0, 1.0], 0.0)
        assert name in chosen, (task, chosen)


def test_an_auc_over_one_gamma_is_not_a_number():
    from cudt.metrics import trapezoid_auc

    assert np.isnan(trapezoid_auc([1.0], [0.7])) and trapezoid_auc([0, 1], [1, 0]) == 0.5


def test_the_section6_command_under_penalty_passes_none_of_its_dual_steps():
    """``llm_section6 --formulation penalty`` (the penalty method as a control): the command's
    own ``--dual-optimizer nupi --nupi-kp 0 --dual-lr 0.05`` step multipliers the penalty has
    none of, and the user, who passed none of them, was told to drop ``--dual-optimizer``."""
    from cudt.runner.cli import config_from_args
    from experiments.llm_section6 import SECTION6, section6_for

    for given in (["--formulation", "penalty"], ["--form=penalty", "--penalty", "2"]):
        flags = section6_for(given)
        assert not {"--dual-optimizer", "--nupi-kp", "--dual-lr"} & set(flags), given
        cfg, _ = config_from_args(LLMConfig, [*flags, *given], "", "x")  # accepted
        assert cfg.formulation == "penalty" and cfg.epsilon == 0.02
    assert section6_for(["--formulation", "augmented"]) == SECTION6  # it has multipliers
