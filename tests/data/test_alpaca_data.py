"""Alpaca instruction data: reading files, the prompt template, tokenizing, splits, generated set.

Two tokenizers go through the same ``tokenizer.json`` path: the word-level default
(:func:`build_word_tokenizer`, BOS/EOS/PAD found by name) and a byte-level BPE trained here in a
folder laid out like a Llama 3 checkpoint (``tokenizer.json`` whose post-processor prepends
``<|begin_of_text|>``, ``tokenizer_config.json`` naming ``<|end_of_text|>``, no pad token).
"""

import json
import re

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from cudt.data.alpaca import (
    ALPACA_PROMPT,
    ALPACA_PROMPT_NO_INPUT,
    AlpacaDataError,
    AlpacaRecord,
    alpaca_prompt,
    alpaca_splits,
    build_word_tokenizer,
    load_alpaca,
    load_tokenizer,
    prompt_batches,
    split_alpaca,
    tokenize_alpaca,
    write_alpaca,
)
from cudt.data.instructions import INSTRUCTION_KINDS, generated_instructions, toy_splits
from cudt.errors import DataError, UsageError

RECORDS = [
    {"instruction": "Give three tips for staying healthy.", "input": "", "output": "1. Eat well."},
    {
        "instruction": "Translate the sentence into French.",
        "input": "The cat sleeps.",
        "output": "Le chat dort.",
    },
    {"instruction": "Name a primary color.", "output": "Red, for example!"},  # no "input" key
]


@pytest.fixture(scope="module")
def generated():
    return generated_instructions(160, seed=0)


@pytest.fixture(scope="module")
def word_tok(generated, tmp_path_factory):
    folder = tmp_path_factory.mktemp("word")
    build_word_tokenizer(generated).save(str(folder / "tokenizer.json"))
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    """A byte-level BPE in a Llama-3-like folder, trained on the test records and templates."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        alpaca_prompt(AlpacaRecord(r["instruction"], r.get("input", ""), r["output"]))
        for r in RECORDS
    ]
    corpus += [r["output"] for r in RECORDS]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    folder = tmp_path_factory.mktemp("bpe")
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": None}
    # with a byte-order mark, as Windows editors save it: read as the same JSON
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8-sig")
    return folder


# --------------------------------------------------------------------------------------------------
# Files and the prompt
# --------------------------------------------------------------------------------------------------


def test_alpaca_json_and_jsonl_round_trip(tmp_path):
    path = tmp_path / "alpaca_data.json"
    path.write_text(json.dumps(RECORDS, indent=4))
    records = load_alpaca(path)
    assert records == (
        AlpacaRecord("Give three tips for staying healthy.", "", "1. Eat well."),
        AlpacaRecord("Translate the sentence into French.", "The cat sleeps.", "Le chat dort."),
        AlpacaRecord("Name a primary color.", "", "Red, for example!"),
    )
    lines = tmp_path / "data.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n\n")
    assert load_alpaca(lines) == records
    # JSON lines under a .json name are recognised too; write_alpaca writes both layouts.
    (tmp_path / "lines.json").write_text(lines.read_text())
    assert load_alpaca(tmp_path / "lines.json") == records
    for name in ("out.json", "out.jsonl"):
        assert load_alpaca(write_alpaca(records, tmp_path / name)) == records
    assert isinstance(json.loads((tmp_path / "out.json").read_text()), list)
    # U+2028, U+2029 and U+0085 are legal unescaped inside a JSON string (the writer keeps
    # them so): a line of JSON lines ends at a newline only, CRLF included
    odd = (AlpacaRecord("Say hi\u2028now", "a\u2029b", "c\x85d"),)
    for name in ("odd.jsonl", "odd.json"):
        assert load_alpaca(write_alpaca(odd, tmp_path / name)) == odd
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes((json.dumps(RECORDS[0], ensure_ascii=False) + "\r\n").encode() * 2)
    assert load_alpaca(crlf) == (records[0], records[0])
    # "input": null is how pandas / Hugging Face exports spell "no input" (it was refused)
    null = tmp_path / "null.json"
    null.write_text(json.dumps([{"instruction": "Say hi.", "input": None, "output": "Hi."}]))
    assert load_alpaca(null) == (AlpacaRecord("Say hi.", "", "Hi."),)


def test_prompt_is_the_stanford_alpaca_template():
    with_input = AlpacaRecord("Translate.", "The cat sleeps.", "Le chat dort.")
    assert alpaca_prompt(with_input) == (
        "Below is an instruction that describes a task, paired with an input that provides "
        "further context. Write a response that appropriately completes the request.\n\n"
        "### Instruction:\nTranslate.\n\n### Input:\nThe cat sleeps.\n\n### Response:\n"
    )
    assert alpaca_prompt(AlpacaRecord("Name a color.", "", "Red")) == (
        "Below is an instruction that describes a task. Write a response that appropriately "
        "completes the request.\n\n### Instruction:\nName a color.\n\n### Response:\n"
    )
    assert with_input.prompt() == ALPACA_PROMPT.format(
        instruction="Translate.", input="The cat sleeps."
    )
    assert ALPACA_PROMPT_NO_INPUT.endswith("### Response:\n")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.json", None, r"'{path}' does not exist: pass the path of a JSON file"),
        (
            "bad.json",
            '[{"instruction": "a", ',
            r"'{path}' is not valid JSON .*line 1 column .*: fix",
        ),
        ("empty.json", "[]", r"'{path}' holds no records: add"),
        ("blank.json", "  \n", r"'{path}' is empty: it must hold a JSON list of records$"),
        # not "a JSON list", which a .jsonl file refuses (found by the export review)
        ("blank.jsonl", "\n\n", r"'{path}' is empty: it must hold one JSON record per line$"),
        (
            "dict.json",
            '{"instruction": "a"}',
            r"'{path}' holds a JSON object, not a list .* or one object per line in dict\.jsonl",
        ),
        (
            "one_line.jsonl",
            json.dumps(list(RECORDS[:2])),
            r"'{path}' holds one JSON list, not one JSON object per line: name it one_line.json",
        ),
        (
            "no_output.json",
            json.dumps([RECORDS[0], {"instruction": "Say hi.", "input": ""}]),
            r"'{path}' record 1 has no \"output\" key \(keys: input, instruction\): every record",
        ),
        (
            "int_input.json",
            json.dumps([{"instruction": "a", "input": 3, "output": "b"}]),
            r"'{path}' record 0 has a number \"input\", not a string",
        ),
        (
            "empty_instruction.json",
            json.dumps([{"instruction": " ", "output": "b"}]),
            r"'{path}' record 0 has an empty \"instruction\"",
        ),
        (
            "list.jsonl",
            json.dumps(RECORDS[0]) + "\n[1]\n",
            r"'{path}' record 1 \(line 2\) is a JSON array",
        ),
        ("bad.jsonl", json.dumps(RECORDS[0]) + "\n{oops\n", r"'{path}' line 2 is not valid JSON"),
        (  # valid JSON, then a UnicodeEncodeError in the tokenizer (found by review)
            "surrogate.jsonl",
            '{"instruction": "Say it.", "output": "ok \\ud83d"}\n',
            r"'{path}' record 0 \(line 1\) has an unpaired surrogate \\ud83d in \"output\"",
        ),
        (
            "pretty.jsonl",
            json.dumps(list(RECORDS[:2]), indent=2),
            r"'{path}' holds one JSON list, not one JSON object per line: name it pretty.json",
        ),
    ],
)
def test_bad_files_give_one_line_naming_the_file_and_the_fix(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as err:
        load_alpaca(path)
    text = str(err.value)
    assert isinstance(err.value, AlpacaDataError) and isinstance(err.value, DataError)
    assert "\n" not in text and ": " in text, text
    assert re.search(message.format(path=re.escape(str(path))), text), text


def test_bad_tokenizer_and_sizes_give_clear_errors(tmp_path, generated, word_tok):
    with pytest.raises(UsageError, match=r"no tokenizer file at '.*tokenizer.json': pass"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(UsageError, match=r"is not a readable tokenizer.json .*: replace it"):
        load_tokenizer(tmp_path)
    with pytest.raises(UsageError, match=r"eos token '<eot>' is not in the vocabulary"):
        load_tokenizer(word_tok.tokenizer, eos="<eot>")
    with pytest.raises(UsageError, match=r"max_length=2 leaves no room.*max_length >= 3"):
        tokenize_alpaca(generated[:2], word_tok, 2)
    with pytest.raises(UsageError, match=r"cannot split 160 records into train 100, val 50"):
        split_alpaca(generated, num_train=100, num_val=50, num_test=50)


# --------------------------------------------------------------------------------------------------
# Tokenizing
# --------------------------------------------------------------------------------------------------


def _check_rows(arrays, records, tok):
    """Labels are the next tokens; the loss mask decodes back to exactly output + EOS."""
    ids, mask, labels, loss = (
        arrays.input_ids,
        arrays.attention_mask,
        arrays.labels,
        arrays.loss_mask,
    )
    assert ids.dtype == labels.dtype == mask.dtype == loss.dtype == np.int32
    for i, record in enumerate(records):
        n = int(mask[i].sum())
        assert mask[i, :n].all() and not mask[i, n:].any()
        np.testing.assert_array_equal(labels[i, : n - 1], ids[i, 1:n])
        assert (ids[i, n:] == tok.pad_id).all() and not loss[i, n - 1 :].any()
        response = labels[i][loss[i] == 1]
        assert response[-1] == tok.eos_id and (tok.eos_id not in response[:-1])
        assert tok.decode(response[:-1]) == record.output
        p = int(arrays.prompt_length[i])
        assert loss[i, p - 1] == 1 and not loss[i, : p - 1].any()  # from the last prompt token on
        if tok.bos_id is not None:
            assert ids[i, 0] == tok.bos_id
        assert tok.decode(ids[i, :p]) == record.prompt()


def test_loss_mask_covers_exactly_the_response_word_tokenizer(generated, word_tok):
    assert (word_tok.bos_id, word_tok.eos_id, word_tok.pad_id) == (1, 2, 0)
    arrays = tokenize_alpaca(generated[:40], word_tok, 96)
    assert arrays.input_ids.shape == arrays.loss_mask.shape == (40, 96)
    assert not arrays.truncated.any()
    _check_rows(arrays, generated[:40], word_tok)
    sub = arrays.take([3, 1])
    np.testing.assert_array_equal(sub.labels, arrays.labels[[3, 1]])
    assert set(arrays.arrays()) == {
        "input_ids",
        "attention_mask",
        "labels",
        "loss_mask",
        "prompt_length",
    }


def test_loss_mask_covers_exactly_the_response_llama_style_folder(bpe_folder):
    tok = load_tokenizer(bpe_folder)
    begin = tok.tokenizer.token_to_id("<|begin_of_text|>")
    end = tok.tokenizer.token_to_id("<|end_of_text|>")
    # BOS from the post-processor, EOS from tokenizer_config.json, no pad token: pad = EOS.
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (begin, end, end)
    records = [AlpacaRecord(r["instruction"], r.get("input", ""), r["output"]) for r in RECORDS]
    arrays = tokenize_alpaca(records, bpe_folder / "tokenizer.json", 128)
    _check_rows(arrays, records, tok)
    assert load_tokenizer(bpe_folder, bos=None).bos_id is None
    bare = tokenize_alpaca(records, load_tokenizer(bpe_folder, bos=None), 128)
    np.testing.assert_array_equal(bare.prompt_length, arrays.prompt_length - 1)


def test_truncation_cuts_the_prompt_from_the_left_and_keeps_response_tokens(word_tok):
    long_input = " ".join(["apple river cloud"] * 20)
    records = [
        AlpacaRecord("Reverse the following words.", long_input, "cloud river apple"),
        AlpacaRecord("Repeat the word 5 times.", "apple", " ".join(["apple"] * 60)),
    ]
    prompts = [word_tok.encode(r.prompt()) for r in records]
    outputs = [word_tok.encode(r.output) for r in records]
    arrays = tokenize_alpaca(records, word_tok, 64, min_response_tokens=6)
    assert arrays.truncated.all() and (arrays.attention_mask.sum(1) == 64).all()
    # Long prompt: the whole response survives, the prompt keeps its last tokens after BOS.
    p0 = int(arrays.prompt_length[0])
    assert word_tok.decode(arrays.labels[0][arrays.loss_mask[0] == 1][:-1]) == records[0].output
    np.testing.assert_array_equal(arrays.input_ids[0, 1:p0], prompts[0][-(p0 - 1) :])
    assert word_tok.decode(arrays.input_ids[0, :p0]).endswith("### Response:\n")
    # Long response: the prompt is cut only as far as needed, the response at the right (no EOS).
    p1 = int(arrays.prompt_length[1])
    kept = arrays.labels[1][arrays.loss_mask[1] == 1]
    assert p1 == 1 + len(prompts[1]) and len(kept) == 64 - p1 > 6
    assert len(outputs[1]) > len(kept) and word_tok.eos_id not in kept
    np.testing.assert_array_equal(kept, outputs[1][: len(kept)])
    # Both long: the response keeps exactly min_response_tokens.
    both = AlpacaRecord("Reverse the following words.", long_input, records[1].output)
    cut = tokenize_alpaca([both], word_tok, 64, min_response_tokens=6)
    assert cut.loss_mask.sum() == 6 and cut.input_ids[0, 0] == word_tok.bos_id


def test_a_special_tokens_spelling_in_a_record_is_text_not_that_token(bpe_folder):
    """An output quoting the special tokens (``<s>old</s>`` in HTML, here Llama 3's) was
    trained with EOS in the middle: the record's text is encoded as text, its one EOS the one
    added at the end (found by review)."""
    tok = load_tokenizer(bpe_folder)
    quoted = "<|begin_of_text|>old<|end_of_text|> new"
    record = AlpacaRecord("Quote the special tokens.", "", quoted)
    arrays = tokenize_alpaca([record], tok, 128)
    scored = arrays.labels[0][arrays.loss_mask[0] == 1]
    assert scored.tolist().count(tok.eos_id) == 1 and scored[-1] == tok.eos_id
    assert tok.bos_id not in scored.tolist() and tok.decode(scored[:-1]) == record.output
    # a chat rendering's markers are parsed: the same text, read as a template's
    rendered = tok.encode_batch(["<|end_of_text|>"])[0]
    assert rendered == [tok.eos_id]
    assert tok.eos_id not in tok.encode_batch(["<|end_of_text|>"], specials=False)[0]
    tok.tokenizer.encode_special_tokens = True  # a caller's own setting is put back
    tok.encode_batch(["x"], specials=False)
    assert tok.tokenizer.encode_special_tokens is True


def test_a_template_bos_is_written_once_and_survives_truncation(word_tok):
    """A chat template that writes ``bos_token`` first (Llama 3's): the prompt is cut from the
    left after it, not through it (found by review: a truncated row lost its BOS)."""
    from types import SimpleNamespace

    from cudt.tasks.llm_data import _template_bos, chat_prompt

    template = (
        "{{ bos_token }}{% for m in messages %}### Instruction:\n{{ m['content'] }}\n\n"
        "{% endfor %}{% if add_generation_prompt %}### Response:\n{% endif %}"
    )
    config = SimpleNamespace(bos_token_id=word_tok.bos_id)
    decoder = SimpleNamespace(chat_template=template, config=config)
    assert _template_bos(decoder, word_tok) == word_tok.bos_id
    written = SimpleNamespace(chat_template=template.removeprefix("{{ bos_token }}"), config=config)
    assert _template_bos(written, word_tok) is None  # no bos_token: nothing to keep

    def prompt(r):
        return chat_prompt(r, decoder, word_tok)

    record = AlpacaRecord("Repeat the words.", " ".join(["apple river cloud"] * 20), "cloud")
    for length in (128, 24):
        row = tokenize_alpaca([record], word_tok, length, prompt=prompt, prompt_specials=True)
        ids = row.input_ids[0][row.attention_mask[0] == 1].tolist()
        assert ids[0] == word_tok.bos_id and ids.count(word_tok.bos_id) == 1, (length, ids)
    assert row.truncated[0]
    (batch,) = prompt_batches(
        [record], word_tok, batch_size=1, max_prompt_length=16, prompt=prompt, prompt_specials=True
    )
    ids = batch.input_ids[0][batch.attention_mask[0] == 1].tolist()
    assert ids[0] == word_tok.bos_id and ids.count(word_tok.bos_id) == 1


def test_prompt_batches_are_left_padded_training_prompts(generated, word_tok):
    records = generated[:7]
    arrays = tokenize_alpaca(records, word_tok, 96)
    batches = list(prompt_batches(records, word_tok, batch_size=3, max_prompt_length=64))
    assert len(batches) == 3 and all(b.input_ids.shape == (3, 64) for b in batches)
    assert batches[-1].valid.tolist() == [True, False, False]
    assert np.concatenate([b.indices[b.valid] for b in batches]).tolist() == list(range(7))
    for b in batches:
        for row, i in enumerate(b.indices):
            p = int(arrays.prompt_length[i])
            assert b.prompt_length[row] == p and b.attention_mask[row].sum() == p
            np.testing.assert_array_equal(b.input_ids[row, 64 - p :], arrays.input_ids[i, :p])
            assert (b.input_ids[row, : 64 - p] == word_tok.pad_id).all()
            np.testing.assert_array_equal(b.positions[row, 64 - p :], np.arange(p))


# --------------------------------------------------------------------------------------------------
# Generated set, its tokenizer, splits
# --------------------------------------------------------------------------------------------------


def test_generated_set_is_deterministic_distinct_and_varied(generated):
    assert generated_instructions(160, seed=0) == generated
    assert (
        generated_instructions(50, seed=0) == generated[:50]
    )  # a longer set extends a shorter one
    assert not set(generated_instructions(160, seed=1)) <= set(generated)
    assert len(set(generated)) == 160
    with_input = [r for r in generated if r.input]
    assert 40 < len(with_input) < 120
    first_words = {r.instruction.split()[0] for r in generated}
    assert len(first_words) >= len(INSTRUCTION_KINDS) - 2
    sort = next(r for r in generated if r.instruction.startswith("Sort") and r.input)
    numbers = [int(x) for x in sort.input.split(", ")]
    assert sort.output == ", ".join(map(str, sorted(numbers)))
    add = next(r for r in generated if r.instruction.startswith("What is"))
    a, b = (int(x) for x in add.instruction[len("What is ") : -1].split(" plus "))
    assert add.output == f"{a} plus {b} is {a + b}."


def test_word_tokenizer_covers_the_set_and_reloads_identically(generated, word_tok, tmp_path):
    tok = build_word_tokenizer(generated)
    unk = tok.token_to_id("<unk>")
    assert [tok.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert tok.get_vocab_size() < 400
    texts = [r.prompt() for r in generated] + [r.output for r in generated]
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    assert all(unk not in e.ids for e in encodings)
    assert [tok.decode(e.ids) for e in encodings] == texts  # exact round trip
    tok.save(str(tmp_path / "tokenizer.json"))
    reloaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert [reloaded.encode(t) for t in texts] == [e.ids for e in encodings]
    a = tokenize_alpaca(generated, tok, 80)  # an in-memory Tokenizer is accepted too
    b = tokenize_alpaca(generated, reloaded, 80)
    for name, value in a.arrays().items():
        np.testing.assert_array_equal(value, getattr(b, name))
    # The caller's Tokenizer is copied, not reconfigured.
    tok.enable_padding(length=99)
    load_tokenizer(tok)
    assert tok.padding is not None and tok.padding["length"] == 99


def test_splits_are_seeded_disjoint_and_stable(generated, tmp_path):
    s = split_alpaca(generated, num_train=100, num_val=20, num_test=30, seed=5)
    assert (len(s.train), len(s.val), len(s.test)) == (100, 20, 30)
    assert not (set(s.train) & set(s.val) or set(s.train) & set(s.test) or set(s.val) & set(s.test))
    assert split_alpaca(generated, num_train=100, num_val=20, num_test=30, seed=5) == s
    rest = split_alpaca(generated, num_train=None, num_val=20, num_test=30, seed=5)
    assert rest.test == s.test and rest.val == s.val and len(rest.train) == 110
    none = split_alpaca(generated, num_train=0, num_val=20, num_test=30, seed=5)
    assert none.train == () and none.test == s.test and none.val == s.val
    assert split_alpaca(generated, num_train=100, num_val=20, num_test=30, seed=6).test != s.test
    default = toy_splits(num_train=60, num_val=10, num_test=10, seed=0)
    assert len(default.train) == 60 and set(default.test) <= set(generated_instructions(80, 0))
    # the toy set's held-out records do not change with its training size (an ablation over
    # --num-train is scored on one test set), and the larger training set extends the smaller
    more = toy_splits(num_train=120, num_val=10, num_test=10, seed=0)
    assert more.test == default.test and more.val == default.val
    assert more.train[:60] == default.train
    assert not set(default.test) & set(default.train) and not set(default.val) & set(more.train)
    path = write_alpaca(generated, tmp_path / "alpaca_data.json")
    from_file = alpaca_splits(path, num_train=None, num_val=20, num_test=30, seed=5)
    assert from_file.test == s.test and str(path) in from_file.source
    # too few records: the line names the file and the flags that size the splits
    with pytest.raises(UsageError, match=rf"Alpaca file {re.escape(str(path))}: cannot split 160 "):
        alpaca_splits(path, num_train=200, num_val=20, num_test=30)
    # exact repeats in the file (real Alpaca has some): left out after the first, so that no
    # copy of a training record is dealt into test (dealt apart, 3 copies of one record could)
    copies = write_alpaca([*generated, *[generated[7]] * 3], tmp_path / "repeats.json")
    got = alpaca_splits(copies, num_train=None, num_val=20, num_test=30, seed=5)
    assert got.test == s.test and got.val == s.val and got.train == from_file.train
    assert "(3 exact repeats left out)" in got.source and "of 160 (split seed=5)" in got.source
