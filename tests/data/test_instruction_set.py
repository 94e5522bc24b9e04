"""The generated task families (cudt.data.instructions): answers, splits by item, selection.

Data only, no training: every answer is re-derived here by its own computation from the
item's arguments, and every split is checked for items, paraphrases and inverses in common.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from cudt.data.alpaca import (
    AlpacaDataError,
    alpaca_prompt,
    build_word_tokenizer,
    load_tokenizer,
    tokenize_alpaca,
)
from cudt.data.instructions import (
    FAMILIES,
    FAMILY_GROUPS,
    WithInput,
    exact_answer,
    make_item,
    split_of,
    task_splits,
    toy_splits,
)

SIZES = {"num_train": 2000, "num_val": 200, "num_test": 500}


@functools.cache
def splits(seed: int = 0, **sizes):
    return task_splits(**(SIZES | sizes), seed=seed)


def every_item(s):
    return s.train + s.val + s.test


# ---- independent answers ---------------------------------------------------------------------


def _csv(values) -> str:
    out = ""
    for v in values:
        out += ("" if not out else ", ") + str(v)
    return out


def _ordered_unique(values):
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _camel(words):
    return "".join(w if i == 0 else w[:1].upper() + w[1:] for i, w in enumerate(words))


def _snake_from_camel(text: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), text)


EXPECTED = {
    "add": lambda a: str(int(np.add(*a))),
    "subtract": lambda a: str(int(np.subtract(*a))),
    "multiply": lambda a: str(int(np.multiply(*a))),
    "divide": lambda a: str(int(np.divide(*a))) if np.divide(*a) == int(np.divide(*a)) else None,
    "remainder": lambda a: str(a[0] - a[1] * (a[0] // a[1])),
    "larger": lambda a: str(a[0] if a[0] > a[1] else a[1]),
    "is_less": lambda a: "yes" if a[1] - a[0] > 0 else "no",
    "even_odd": lambda a: ("even", "odd")[a[0] & 1],
    "is_divisible": lambda a: "yes" if (a[0] / a[1]).is_integer() else "no",
    "reverse_word": lambda a: "".join(reversed(a[0])),
    "uppercase_word": lambda a: "".join(chr(ord(c) - 32) for c in a[0]),
    "lowercase_word": lambda a: "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in a[0]),
    "capitalize_word": lambda a: a[0].capitalize(),
    "word_length": lambda a: str(sum(1 for _ in a[0])),
    "nth_letter": lambda a: list(a[0])[a[1] - 1],
    "last_letter": lambda a: list(a[0]).pop(),
    "replace_letter": lambda a: "".join(a[2] if c == a[1] else c for c in a[0]),
    "count_letter": lambda a: str(sum(c == a[1] for c in a[0])),
    "remove_vowels": lambda a: re.sub("[aeiou]", "", a[0]),
    "join_words": lambda a: f"{a[0]}{a[1]}",
    "repeat_word": lambda a: (a[0] + " ") * (a[1] - 1) + a[0],
    "sort_ascending": lambda a: _csv(np.sort(a[0])),
    "sort_descending": lambda a: _csv(np.sort(a[0])[::-1]),
    "list_max": lambda a: str(np.max(a[0])),
    "list_min": lambda a: str(np.min(a[0])),
    "list_sum": lambda a: str(int(np.sum(a[0]))),
    "list_length": lambda a: str(np.size(a[0])),
    "dedupe": lambda a: _csv(_ordered_unique(a[0])),
    "last_item": lambda a: a[0][len(a[0]) - 1],
    "item_at": lambda a: a[0][a[1] - 1],
    "sort_words": lambda a: _csv(np.sort(np.array(a[0]))),
    "count_words": lambda a: str(len(" ".join(a[0]).split())),
    "count_occurrences": lambda a: str(" ".join(a[0]).split().count(a[1])),
    "cm_to_m": lambda a: str(a[0] // 100) if a[0] % 100 == 0 else None,
    "m_to_cm": lambda a: str(a[0] * 100),
    "minutes_to_hours": lambda a: str(a[0] // 60) if a[0] % 60 == 0 else None,
    "hours_to_minutes": lambda a: str(a[0] * 60),
    "grams_to_kg": lambda a: str(a[0] // 1000) if a[0] % 1000 == 0 else None,
    "kg_to_grams": lambda a: str(a[0] * 1000),
    "lookup_value": lambda a: str(next(age for name, age in a[0] if name == a[1])),
    "lookup_key": lambda a: [name for name, age in a[0] if age == a[1]][0],
    "iso_to_us_date": lambda a: "/".join([str(a[1]).zfill(2), str(a[2]).zfill(2), str(a[0])]),
    "us_to_iso_date": lambda a: "-".join([str(a[0]), str(a[1]).zfill(2), str(a[2]).zfill(2)]),
    "last_name_first": lambda a: a[1] + ", " + a[0],
    "snake_to_camel": _camel,
    "camel_to_snake": lambda a: _snake_from_camel(_camel(a)),
    "is_member": lambda a: "yes" if any(w == a[1] for w in a[0]) else "no",
    "first_alphabetically": lambda a: sorted(a[0])[0],
}


def _atoms(args):
    for a in args:
        if isinstance(a, tuple):
            yield from _atoms(a)
        else:
            yield str(a)


def _prompt_text(item) -> str:
    return item.record.instruction + "\n" + item.record.input


def _prompt(item) -> tuple[str, str]:
    return item.record.instruction, item.record.input


# ---- tests -----------------------------------------------------------------------------------


def test_at_least_30_families_each_with_several_phrasings_and_all_drawn():
    assert len(FAMILIES) >= 30
    assert len(FAMILY_GROUPS) >= 7 and sum(map(len, FAMILY_GROUPS.values())) == len(FAMILIES)
    for name, fam in FAMILIES.items():
        assert len(fam.phrasings) >= 3, name
        assert len(set(fam.phrasings)) == len(fam.phrasings), name
    kinds = [isinstance(p, WithInput) for f in FAMILIES.values() for p in f.phrasings]
    assert any(kinds) and not all(kinds)  # with an input field and inline
    s = splits()
    for split in ("train", "test"):  # every family in train and in test
        assert {i.family for i in getattr(s, split)} == set(FAMILIES), split


def test_every_answer_matches_an_independent_computation():
    assert set(EXPECTED) == set(FAMILIES)  # a new family needs its own checker here
    for item in every_item(splits()):
        want = EXPECTED[item.family](item.args)
        assert want is not None and item.record.output == want, (item.key, item.record)
        text = _prompt_text(item).lower()  # the prompt states every argument
        for atom in _atoms(item.args):
            assert atom.lower() in text, (atom, item.record)


def test_every_phrasing_renders_the_same_answer():
    rng = np.random.default_rng(5)
    for name, fam in FAMILIES.items():
        for _ in range(3):
            args = fam.draw(rng)
            items = [make_item(name, args, k) for k in range(len(fam.phrasings))]
            assert len({i.record.output for i in items}) == 1, name
            assert len({_prompt(i) for i in items}) == len(items), name  # distinct paraphrases
            for i, phrasing in zip(items, fam.phrasings, strict=True):
                assert "{" not in i.record.instruction and "}" not in i.record.instruction
                assert bool(i.record.input) == isinstance(phrasing, WithInput), (name, phrasing)
                assert i.record.output.strip() == i.record.output and i.record.output


def test_unit_conversions_are_exact_integers_and_yes_no_answers_are_balanced():
    items = every_item(splits())
    for item in items:
        if FAMILIES[item.family].group == "units":
            assert re.fullmatch(r"[1-9][0-9]*", item.record.output), item.record
    for family in ("is_less", "is_divisible", "is_member"):
        answers = [i.record.output for i in items if i.family == family]
        assert set(answers) == {"yes", "no"}
        assert 0.25 < answers.count("yes") / len(answers) < 0.75, family


def test_splits_are_disjoint_by_item_paraphrase_and_inverse():
    s = splits()
    parts = {"train": s.train, "val": s.val, "test": s.test}
    keys = {k: {i.key for i in v} for k, v in parts.items()}
    groups = {k: {i.split_key for i in v} for k, v in parts.items()}
    for k, v in parts.items():
        assert len(keys[k]) == len(v)  # one record per item
        assert all(split_of(i.split_key, s.seed) == k for i in v)
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not keys[a] & keys[b] and not groups[a] & groups[b], (a, b)
    # no held-out item appears in train under any of its phrasings
    train_prompts = {_prompt(i) for i in s.train}
    assert len(train_prompts) == len(s.train)
    for item in s.val + s.test:
        for k in range(len(FAMILIES[item.family].phrasings)):
            assert _prompt(make_item(item.family, item.args, k)) not in train_prompts
    # commutative operands and inverse conversions are the same question
    a = make_item("add", (48, 275))
    assert a.split_key == make_item("add", (275, 48)).split_key
    assert make_item("cm_to_m", (300,)).split_key == make_item("m_to_cm", (3,)).split_key
    iso = make_item("iso_to_us_date", (2024, 3, 5), 2)
    us = make_item("us_to_iso_date", (2024, 3, 5), 2)
    assert iso.split_key == us.split_key and iso.record.output == us.record.input
    snake = make_item("snake_to_camel", ("red", "apple"), 2)
    camel = make_item("camel_to_snake", ("red", "apple"), 2)
    assert snake.split_key == camel.split_key and snake.record.output == camel.record.input
    inverse = {
        "cm_to_m": "m_to_cm",
        "minutes_to_hours": "hours_to_minutes",
        "grams_to_kg": "kg_to_grams",
    }
    inverse |= {v: k for k, v in inverse.items()}
    train_answers = {(i.family, i.record.output) for i in s.train}
    for item in s.test:  # no test conversion is answered by a train conversion the other way
        if item.family in inverse:
            assert (inverse[item.family], str(item.args[0])) not in train_answers, item.key

    # nor a word recased, a difference or a quotient by its inverse in train: each item as the
    # fact it states (the word; the addends and their sum; the factors and their product)
    def fact(item):
        a = item.args
        return {
            "uppercase_word": lambda: ("case", a[0].lower()),
            "lowercase_word": lambda: ("case", a[0].lower()),
            "capitalize_word": lambda: ("case", a[0].lower()),
            "add": lambda: ("sum", tuple(sorted(a)), a[0] + a[1]),
            "subtract": lambda: ("sum", tuple(sorted((a[0] - a[1], a[1]))), a[0]),
            "multiply": lambda: ("product", tuple(sorted(a)), a[0] * a[1]),
            "divide": lambda: ("product", tuple(sorted((a[0] // a[1], a[1]))), a[0]),
        }.get(item.family, lambda: None)()

    train_facts = {fact(i) for i in s.train} - {None}
    held_out = [fact(i) for i in s.val + s.test if fact(i) is not None]
    assert len(held_out) > 20 and not train_facts & set(held_out)
    for a, b in [("uppercase_word", "lowercase_word"), ("capitalize_word", "uppercase_word")]:
        assert make_item(a, ("magnet",)).split_key == make_item(b, ("MAGNET",)).split_key
    assert make_item("multiply", (86, 2)).split_key == make_item("divide", (172, 2)).split_key
    assert make_item("add", (48, 275)).split_key == make_item("subtract", (323, 275)).split_key


def test_splits_are_deterministic_by_seed_and_held_out_items_ignore_num_train():
    a, b = splits(0), task_splits(**SIZES, seed=0)
    assert a == b
    other = splits(1)
    assert {i.key for i in other.test} != {i.key for i in a.test}
    small = splits(0, num_train=300)
    assert small.test == a.test and small.val == a.val and small.train == a.train[:300]


def test_sizes_reach_2000_train_and_500_test():
    s = splits()
    assert (len(s.train), len(s.val), len(s.test)) == (2000, 200, 500)
    big = task_splits(4000, 200, 1000, seed=2)
    assert (len(big.train), len(big.test)) == (4000, 1000)
    # no training items (a train split given as a file, --train-data): the same val and test
    none = task_splits(0, 10, 10)
    assert none.train == () and none.test == task_splits(5, 10, 10).test
    with pytest.raises(AlpacaDataError, match="num_train >= 0"):
        task_splits(-1, 10, 10)


def test_exact_answer_is_case_sensitive_and_strips_only_the_ends():
    assert exact_answer("  APPLE\n", "APPLE")
    assert exact_answer("65, 50, 2", " 65, 50, 2 ")
    assert not exact_answer("apple", "APPLE")
    assert not exact_answer("Apple", "apple")
    assert not exact_answer("65,50, 2", "65, 50, 2")
    assert not exact_answer("", "0")
    item = make_item("uppercase_word", ("apple",))
    assert exact_answer(item.record.output, "APPLE") and not exact_answer("apple", "APPLE")


def test_llm_config_selects_the_task_families_and_defaults_to_the_toy_set(tmp_path):
    from cudt.tasks.llm_config import LLMConfig
    from cudt.tasks.llm_data import llm_splits

    sizes = {"num_train": 40, "num_val": 8, "num_test": 12}
    default = LLMConfig(**sizes)
    assert LLMConfig().data is None  # the default is unchanged: the toy set
    toy = toy_splits(**sizes, seed=0)
    assert llm_splits(default) == toy
    assert llm_splits(LLMConfig(data="toy", **sizes)) == toy
    tasks = llm_splits(LLMConfig(data="tasks", seed=3, **sizes))
    want = task_splits(40, 8, 12, seed=3)
    assert tasks.train == want.records("train") and tasks.test == want.records("test")
    assert tasks.val == want.records("val") and tasks.source.startswith("generated tasks")
    for bad in ("task", "Tasks", "alpaca"):
        with pytest.raises(ValueError, match=r"--data .* pass tasks or toy, or the path") as e:
            LLMConfig(data=bad)
        assert len(str(e.value).splitlines()) == 1
    LLMConfig(data=str(tmp_path / "alpaca_data.json"))  # a file path is read at load time


def test_records_go_through_the_word_tokenizer_pipeline():
    s = splits()
    records = [i.record for i in s.train[:200] + s.test[:100]]
    tok = load_tokenizer(build_word_tokenizer(records))
    t = tokenize_alpaca(records, tok, 96)
    assert not t.truncated.any()  # every record fits the task's default --max-length
    for i, r in enumerate(records):
        start = int(t.prompt_length[i])
        ids = t.input_ids[i, start : int(t.attention_mask[i].sum())]
        assert ids[-1] == tok.eos_id and tok.decode(ids[:-1]) == r.output, r
        assert tok.decode(t.input_ids[i, 1:start]) == alpaca_prompt(r)
        assert int(t.loss_mask[i].sum()) == len(ids)


def test_the_llm_task_loads_the_task_families_with_data_tasks():
    from cudt.tasks.llm import LLMTask
    from cudt.tasks.llm_config import LLMConfig

    cfg = LLMConfig(
        data="tasks", num_train=24, num_val=4, num_test=8, layers=1, hidden=16, heads=2,
        kv_heads=1, intermediate=32,
    )  # fmt: skip
    data = LLMTask().load(cfg)
    want = task_splits(24, 4, 8, seed=cfg.seed)
    assert data.records["test"] == want.records("test") and data.source.startswith("generated")
    assert data.tokens["train"].input_ids.shape == (24, cfg.max_length)
    assert not data.tokens["train"].truncated.any()
