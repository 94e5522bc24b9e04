"""Text classification data for the perturbed-embedding experiments: synthetic, IMDb, MNLI.

A split is a :class:`TextSplit` of raw strings (one text, or a premise/hypothesis pair, per
example) and int32 labels; :func:`tokenize_split` turns it into ``(ids, mask)`` with the encoder's
tokenizer, the encoder maps ids to the embeddings that get perturbed.

Pipeline::

    source train split --seeded subset (num_train)--> pool --seeded val_fraction--> train / val
    source test split  --seeded subset (num_test)-->  test
    TextSplit --tokenize_split(encoder, split, max_length)--> ids [N, T] int32, mask [N, T] int32

Sources (``load_text_data(dataset=...)``):

* ``"synthetic"`` (default, no download): :func:`synthetic_sentiment`, generated mini movie
  reviews whose binary label follows from their content by the rule in
  :func:`synthetic_sentiment_score` (negation, intensifiers, contrast clauses, neutral filler).
* ``"imdb"``: TFDS ``imdb_reviews/plain_text`` (25k train / 25k test reviews, neg/pos).
* ``"mnli"``: TFDS ``glue/mnli`` (premise/hypothesis pairs; entailment/neutral/contradiction);
  *test* is ``validation_matched`` (the GLUE test labels are hidden).
* ``"aclimdb"``: the raw Stanford folder ``aclImdb/{train,test}/{pos,neg}/*.txt``, the same
  reviews as ``"imdb"`` without TFDS.

TFDS data is read from a prepared ``data_dir`` (``DATA_DIR/imdb_reviews/plain_text/1.0.0/``,
``DATA_DIR/glue/mnli/2.0.0/``) without TensorFlow: ``array_record`` and ``parquet`` through
``tfds``' own data sources, and ``tfrecord`` (what ``tfds build`` writes by default) through a
small TFRecord reader here; the serialized examples are decoded by ``tfds``' numpy parser either
way. Nothing is downloaded unless ``download=True``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cudt.data.video import DataError

__all__ = [
    "TEXT_DATASETS",
    "TextSplit",
    "TextSplits",
    "imdb_like_review",
    "imdb_like_reviews",
    "load_text_data",
    "load_tfds_text",
    "read_aclimdb",
    "synthetic_sentiment",
    "synthetic_sentiment_score",
    "tokenize_split",
    "write_aclimdb",
]

TEXT_DATASETS: tuple[str, ...] = ("synthetic", "imdb", "mnli", "aclimdb")

# Default sizes when num_train / num_test are not given: synthetic always, the real datasets use
# everything when None is passed explicitly.
_DEFAULT_NUM_TRAIN = 4000
_DEFAULT_NUM_TEST = 1000
_SYNTHETIC_LABEL_NAMES = ("negative", "positive")


# --------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class TextSplit:
    """One split: raw texts (and second segments for pair tasks) with int32 labels.

    ``texts``: the first segment (a review, an MNLI premise). ``pairs``: the second segment (MNLI
    hypothesis), ``None`` for single-text tasks. ``labels``: ``[N]`` int32 in
    ``[0, num_classes)``.
    """

    texts: tuple[str, ...]
    pairs: tuple[str, ...] | None
    labels: np.ndarray  # [N] int32

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", tuple(self.texts))
        if self.pairs is not None:
            object.__setattr__(self, "pairs", tuple(self.pairs))
        labels = np.asarray(self.labels)
        if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
            raise DataError(
                f"TextSplit labels must be a 1-D integer array, got shape {labels.shape} and "
                f"dtype {labels.dtype}: pass one class index per text"
            )
        object.__setattr__(self, "labels", labels.astype(np.int32))
        if len(self.labels) != len(self.texts) or (
            self.pairs is not None and len(self.pairs) != len(self.texts)
        ):
            n_pairs = None if self.pairs is None else len(self.pairs)
            raise DataError(
                f"TextSplit has {len(self.texts)} texts, {n_pairs} pairs and {len(self.labels)} "
                "labels: pass the same number of each"
            )

    def __len__(self) -> int:
        return len(self.texts)

    def inputs(self) -> list[str] | list[tuple[str, str]]:
        """Exactly what ``Encoder.tokenize`` takes: texts, or ``(text, pair)`` tuples."""
        if self.pairs is None:
            return list(self.texts)
        return list(zip(self.texts, self.pairs, strict=True))

    def take(self, indices: Sequence[int] | np.ndarray) -> TextSplit:
        """The examples at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return TextSplit(
            texts=tuple(self.texts[i] for i in idx),
            pairs=None if self.pairs is None else tuple(self.pairs[i] for i in idx),
            labels=self.labels[idx],
        )


@dataclasses.dataclass(frozen=True, eq=False)
class TextSplits:
    """Train / val / test splits of one source, its classes and a description of the source."""

    train: TextSplit
    val: TextSplit
    test: TextSplit
    num_classes: int
    label_names: tuple[str, ...]
    source: str


def tokenize_split(
    encoder: Any, split: TextSplit, max_length: int, *, return_token_type_ids: bool = False
) -> tuple[np.ndarray, ...]:
    """``encoder.tokenize(split.inputs(), max_length)``: ``(ids, mask)``, each ``[N, max_length]``.

    Pairs use the tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``), truncated
    longest-first. With ``return_token_type_ids`` a third ``[N, max_length]`` array gives the
    segment of each token (pass it to the encoder so a hypothesis gets its type embedding).
    """
    if len(split) == 0:
        raise DataError("cannot tokenize an empty TextSplit: load or generate some examples first")
    out = encoder.tokenize(split.inputs(), max_length, return_token_type_ids=return_token_type_ids)
    return tuple(np.asarray(a, dtype=np.int32) for a in out)


# --------------------------------------------------------------------------------------------------
# Synthetic sentiment
# --------------------------------------------------------------------------------------------------

_POS_ADJ = (
    "good", "great", "excellent", "wonderful", "brilliant", "superb", "delightful", "charming",
    "moving", "gripping", "beautiful", "clever", "funny", "touching", "memorable", "enjoyable",
    "fantastic", "impressive", "outstanding", "engaging", "thoughtful", "stunning", "masterful",
    "riveting", "heartfelt", "witty", "compelling", "lovely", "solid", "terrific", "refreshing",
    "inventive", "powerful", "elegant", "satisfying", "gorgeous", "hilarious", "tender",
)  # fmt: skip
_NEG_ADJ = (
    "bad", "terrible", "awful", "boring", "dull", "weak", "poor", "clumsy", "tedious", "bland",
    "forgettable", "disappointing", "messy", "lifeless", "predictable", "shallow", "confusing",
    "pointless", "dreadful", "horrible", "mediocre", "tiresome", "flat", "sloppy", "lazy",
    "painful", "unconvincing", "annoying", "silly", "uninspired", "overlong", "stale", "clunky",
    "muddled", "grating", "hollow",
)  # fmt: skip
# (past, base): "I loved it" / "I did not love it".
_POS_VERBS = (
    ("loved", "love"), ("enjoyed", "enjoy"), ("liked", "like"), ("adored", "adore"),
    ("admired", "admire"), ("appreciated", "appreciate"), ("treasured", "treasure"),
)  # fmt: skip
_NEG_VERBS = (
    ("hated", "hate"), ("disliked", "dislike"), ("loathed", "loathe"), ("despised", "despise"),
    ("resented", "resent"), ("regretted", "regret"), ("detested", "detest"),
)  # fmt: skip
# Noun phrases after "a": the first word carries the polarity, the rest is neutral.
_POS_NOUNS = (
    "masterpiece", "triumph", "gem", "delight", "treat", "joy to watch", "marvel",
    "pleasure to watch", "revelation",
)  # fmt: skip
_NEG_NOUNS = (
    "disaster", "mess", "letdown", "chore to sit through", "bore", "failure", "waste of time",
    "slog", "dud", "flop",
)  # fmt: skip

_LEXICON: dict[str, int] = {}
for _words, _sign in (
    (_POS_ADJ, 1),
    (_NEG_ADJ, -1),
    ([w for pair in _POS_VERBS for w in pair], 1),
    ([w for pair in _NEG_VERBS for w in pair], -1),
    ([n.split()[0] for n in _POS_NOUNS], 1),
    ([n.split()[0] for n in _NEG_NOUNS], -1),
):
    for _w in _words:
        _LEXICON[_w] = _sign

_STRONG = (
    "very", "extremely", "truly", "incredibly", "remarkably", "really", "genuinely", "absolutely",
)  # fmt: skip
_WEAK = ("somewhat", "fairly", "rather", "mildly", "slightly", "moderately")
_NEGATORS = frozenset(
    {"not", "never", "hardly", "barely", "no", "wasn't", "isn't", "weren't", "aren't", "didn't"}
)
_STRONG_WEIGHT, _WEAK_WEIGHT = 2.0, 0.5

# (aspect, plural)
_ASPECTS = (
    ("acting", False), ("plot", False), ("script", False), ("dialogue", False),
    ("soundtrack", False), ("score", False), ("cinematography", False), ("pacing", False),
    ("ending", False), ("direction", False), ("story", False), ("characters", True),
    ("performances", True), ("cast", False), ("visuals", True), ("editing", False),
    ("humor", False), ("finale", False), ("first half", False), ("second act", False),
    ("lead performance", False), ("special effects", True), ("costumes", True),
    ("villain", False), ("screenplay", False), ("set design", False), ("camera work", False),
    ("jokes", True), ("action scenes", True), ("romance", False),
)  # fmt: skip
_FILM = ("it", "the film", "the movie", "this film", "this movie", "the whole thing")
_OPENERS = (
    "Overall, ", "Honestly, ", "In the end, ", "Frankly, ", "To be honest, ", "For me, ",
    "All in all, ",
)  # fmt: skip

# Neutral filler: plot, cast, setting, when and how it was watched. No lexicon word may appear
# here (a test checks); some carry a negator on purpose, which the rule ignores (no sentiment
# word in the clause), so "not" alone is no cue.
_PEOPLE = (
    "a retired detective", "two estranged sisters", "a young teacher", "a struggling musician",
    "a small-town mayor", "an aging boxer", "a ship's cook", "three college friends",
    "a widowed farmer", "a night-shift nurse", "a runaway teenager", "a veteran pilot",
)  # fmt: skip
_PLACES = (
    "Lisbon", "a coastal village", "rural Montana", "a mining town", "Berlin", "an old hotel",
    "a crowded apartment block", "a remote island", "Chicago", "a border town", "Osaka",
    "the Scottish highlands",
)  # fmt: skip
_WHEN = (
    "in the 1950s", "in the late seventies", "during the war", "in the near future",
    "over one summer", "across three decades", "in 1987", "during a heat wave",
)  # fmt: skip
_GOALS = (
    "to find a missing brother", "to reopen a family restaurant", "to win a local election",
    "to deliver a package across the country", "to repair an old boat",
    "to solve a string of thefts", "to get back home before winter",
)  # fmt: skip
_COMPANIONS = ("my parents", "a friend", "my kids", "my roommate", "my partner", "my uncle")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_TOPICS = ("beekeeping", "jazz drummers", "a chess tournament", "deep-sea fishing", "trains")
_LANGUAGES = ("French", "Korean", "Spanish", "Danish", "Italian", "Japanese")
_FILLER = (
    "The story follows {person} in {place} {when}.",
    "It follows {person} who tries {goal}.",
    "The film is set in {place} {when}.",
    "Most of it was shot on location in {place}.",
    "It runs about {minutes} minutes.",
    "I watched it on a {day} evening with {companion}.",
    "The lead is played by an actor I had not heard of before.",
    "It came out in {year} and I only caught it recently.",
    "The director also made a documentary about {topic} a few years ago.",
    "There is a subplot about {person} and an old letter.",
    "The second half moves to {place}.",
    "{Companion} picked it for movie night.",
    "I never read the novel it is based on.",
    "It was not released in theaters here.",
    "It is in {language} with subtitles.",
    "The soundtrack uses a lot of old records from {when_short}.",
    "Halfway through, the action moves to {place}.",
    "I saw it at a late screening in {year}.",
)


def synthetic_sentiment_score(text: str) -> float:
    """The labelling rule of :func:`synthetic_sentiment`: ``label = int(score > 0)``.

    The text is cut into sentences (at ``.``, ``!``, ``?``). In each sentence only the *dominant*
    clause counts: the part after the last ``" but "``; the main clause of ``"Although A, B"``
    (``B``) and of ``"B, even though A"`` (``B``). In that clause every sentiment word (a fixed
    lexicon of adjectives, verbs and nouns, e.g. *superb* +1, *tedious* -1, *loved* +1,
    *mess* -1) contributes its polarity

    * times ``-1`` for each negator before it in the clause (*not, never, hardly, barely, no,
      wasn't, isn't, weren't, aren't, didn't*), so "not bad" is positive,
    * times 2 if a strong intensifier (*very, extremely, truly, ...*) is among the two words
      before it, or times 0.5 for a weak one (*somewhat, fairly, slightly, ...*).

    The score is the sum over sentences; neutral sentences (plot, cast, setting) add 0.
    """
    score = 0.0
    for sentence in re.split(r"(?<=[.!?])\s+", text.strip()):
        clause = sentence.lower().strip().rstrip(".!?")
        if clause.startswith(("although ", "though ", "even though ")):
            clause = clause.split(", ", 1)[1] if ", " in clause else ""
        clause = re.split(r",\s*(?:even though|although|though)\s", clause)[0]
        if " but " in clause:
            clause = clause.rsplit(" but ", 1)[1]
        tokens = re.findall(r"[a-z']+", clause)
        negations = 0
        for i, token in enumerate(tokens):
            if token in _NEGATORS:
                negations += 1
            elif token in _LEXICON:
                before = tokens[max(0, i - 2) : i]
                weight = 1.0
                if any(t in _STRONG for t in before):
                    weight = _STRONG_WEIGHT
                elif any(t in _WEAK for t in before):
                    weight = _WEAK_WEIGHT
                score += _LEXICON[token] * (-1) ** negations * weight
    return score


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _opinion_clause(rng: np.random.Generator, polarity: int) -> str:
    """A lowercase clause whose rule score has sign ``polarity`` (negation flips the word)."""
    negate = rng.random() < 0.3
    sign = -polarity if negate else polarity  # polarity of the sentiment word itself
    form = _pick(rng, ("copula", "copula", "copula", "verb", "verb", "noun", "noun"))
    if form == "copula":
        aspect, plural = _pick(rng, _ASPECTS)
        be = _pick(rng, ("were", "are") if plural else ("was", "is"))
        adj = _pick(rng, _POS_ADJ if sign > 0 else _NEG_ADJ)
        if negate:
            neg = _pick(rng, ("not", "never", "hardly", "n't"))
            if neg == "n't":
                return f"the {aspect} {be}n't {adj}"
            return f"the {aspect} {be} {neg} {adj}"
        if rng.random() < 0.4:
            adj = f"{_pick(rng, _STRONG if rng.random() < 0.6 else _WEAK)} {adj}"
        return f"the {aspect} {be} {adj}"
    if form == "verb":
        subject = _pick(rng, ("I", "I", "we"))
        past, base = _pick(rng, _POS_VERBS if sign > 0 else _NEG_VERBS)
        aspect, _ = _pick(rng, _ASPECTS)
        obj = _pick(
            rng,
            (
                "it",
                "the film",
                "the movie",
                "this one",
                f"the {aspect}",
                f"the {aspect}",
                "every minute of it",
            ),
        )
        if negate:
            neg = _pick(rng, ("did not", "didn't", "never", "hardly", "barely"))
            verb = base if neg in ("did not", "didn't") else past
            return f"{subject} {neg} {verb} {obj}"
        if rng.random() < 0.35:
            past = f"{_pick(rng, ('really', 'truly', 'genuinely', 'somewhat', 'mildly'))} {past}"
        return f"{subject} {past} {obj}"
    subject = _pick(rng, _FILM)
    be = _pick(rng, ("was", "is"))
    noun = _pick(rng, _POS_NOUNS if sign > 0 else _NEG_NOUNS)
    if negate:
        neg = _pick(rng, ("not", "never", "no"))
        return f"{subject} {be} no {noun}" if neg == "no" else f"{subject} {be} {neg} a {noun}"
    if rng.random() < 0.25:
        return f"{subject} {be} {_pick(rng, ('truly', 'really', 'absolutely'))} a {noun}"
    return f"{subject} {be} a {noun}"


def _capitalize(s: str) -> str:
    return s[:1].upper() + s[1:]


def _opinion_sentence(rng: np.random.Generator) -> str:
    """One opinion sentence of random polarity: simple, contrast (but / although / even though)
    or exclamation."""
    polarity = 1 if rng.random() < 0.5 else -1
    # The discounted clause has the opposite polarity most of the time (a real contrast).
    other = -polarity if rng.random() < 0.8 else polarity
    kind = rng.random()
    if kind < 0.5:
        opener = _pick(rng, _OPENERS) if rng.random() < 0.25 else ""
        clause = _opinion_clause(rng, polarity)
        return f"{opener}{clause}." if opener else f"{_capitalize(clause)}."
    if kind < 0.75:
        first, second = _opinion_clause(rng, other), _opinion_clause(rng, polarity)
        return f"{_capitalize(first)}, but {second}."
    if kind < 0.87:
        first, second = _opinion_clause(rng, other), _opinion_clause(rng, polarity)
        return f"Although {first}, {second}."
    if kind < 0.95:
        main, sub = _opinion_clause(rng, polarity), _opinion_clause(rng, other)
        return f"{_capitalize(main)}, even though {sub}."
    if rng.random() < 0.5:
        return f"What a {_pick(rng, _POS_NOUNS if polarity > 0 else _NEG_NOUNS)}!"
    adj = _pick(rng, _POS_ADJ if polarity > 0 else _NEG_ADJ)
    return f"{_capitalize(_pick(rng, _STRONG))} {adj} from start to finish!"


def _filler_sentence(rng: np.random.Generator, template: str | None = None) -> str:
    companion = _pick(rng, _COMPANIONS)
    template = _pick(rng, _FILLER) if template is None else template
    return template.format(
        person=_pick(rng, _PEOPLE),
        place=_pick(rng, _PLACES),
        when=_pick(rng, _WHEN),
        when_short=_pick(rng, ("the sixties", "the eighties", "the forties")),
        goal=_pick(rng, _GOALS),
        minutes=int(rng.integers(84, 161)),
        day=_pick(rng, _DAYS),
        companion=companion,
        Companion=_capitalize(companion),
        year=int(rng.integers(1962, 2024)),
        topic=_pick(rng, _TOPICS),
        language=_pick(rng, _LANGUAGES),
    )


def _synthetic_review(rng: np.random.Generator, label: int) -> str:
    """Rejection-sample a review whose rule label is ``label`` (|score| >= 0.5, no ties)."""
    for _ in range(1000):
        opinions = [_opinion_sentence(rng) for _ in range(_pick(rng, (1, 1, 2, 2, 2, 3, 4)))]
        templates = rng.choice(len(_FILLER), size=_pick(rng, (0, 0, 1, 1, 2, 3)), replace=False)
        fillers = [_filler_sentence(rng, _FILLER[t]) for t in templates]  # no repeated template
        # Plot summary tends to come first; the rest is interleaved at random.
        lead = int(rng.integers(0, len(fillers) + 1))
        rest = fillers[lead:] + opinions
        order = rng.permutation(len(rest))
        text = " ".join(fillers[:lead] + [rest[i] for i in order])
        score = synthetic_sentiment_score(text)
        if abs(score) >= 0.5 and int(score > 0) == label:
            return text
    raise AssertionError("synthetic review sampling did not converge")  # pragma: no cover


def synthetic_sentiment(num_examples: int, *, seed: int = 0, stream: int = 0) -> TextSplit:
    """Generated English mini movie reviews for binary sentiment (0 negative, 1 positive).

    Each review has 1-4 opinion sentences and 0-3 neutral sentences (plot, actors, setting, when
    it was watched). Opinion clauses use a lexicon of ~38 positive and ~36 negative adjectives,
    verbs (*loved, despised, ...*) and nouns (*a masterpiece, a waste of time, ...*) about an
    aspect (acting, plot, score, ...), with negation (*not, never, hardly, barely, no, didn't*,
    ...), intensifiers (*very, extremely, truly* x2; *somewhat, fairly, slightly* x0.5) and
    contrast (*"A, but B"*, *"Although A, B"*, *"B, even though A"*: B dominates).

    The label follows from the text by :func:`synthetic_sentiment_score` (``score > 0`` is
    positive): example ``i`` targets label ``i % 2`` (balanced) and is sampled until its content
    has that label with ``|score| >= 0.5``. A bag-of-words model cannot be exact: the same words
    flip meaning under negation and in discounted clauses.

    Example ``i`` depends only on ``(seed, stream, i)``: a longer run extends a shorter one.
    Different ``stream`` values give independent example streams (``load_text_data`` draws the
    train pool from stream 0 and the test set from stream 1).
    """
    if num_examples < 0:
        raise DataError(
            f"synthetic_sentiment needs num_examples >= 0, got {num_examples}: pass a count"
        )
    if seed < 0 or stream < 0:
        raise DataError(
            f"synthetic_sentiment needs seed >= 0 and stream >= 0, got {seed} and {stream}: "
            "pass non-negative values"
        )
    labels = np.arange(num_examples, dtype=np.int32) % 2
    texts = tuple(
        _synthetic_review(np.random.default_rng([seed, stream, i]), int(labels[i]))
        for i in range(num_examples)
    )
    return TextSplit(texts=texts, pairs=None, labels=labels)


def _unique_synthetic(n: int, seed: int, stream: int, exclude: set[str]) -> TextSplit:
    """The first ``n`` examples of a synthetic stream whose text is new (not in ``exclude``, not
    seen earlier in the stream), so splits never share a review."""
    m = n + n // 50 + 8
    while True:
        full = synthetic_sentiment(m, seed=seed, stream=stream)
        seen = set(exclude)
        keep = []
        for i, t in enumerate(full.texts):
            if t not in seen:
                seen.add(t)
                keep.append(i)
                if len(keep) == n:
                    return full.take(keep)
        m *= 2


# --------------------------------------------------------------------------------------------------
# IMDb-like long reviews (for the aclImdb folder layout)
# --------------------------------------------------------------------------------------------------

# Opinion words, most frequent first: a review draws them with Zipf weights, so a few are common
# and most are rare (a bag of words trained on a few thousand reviews sees many of them once or
# never). Single words, so a negator before one flips it.
_REVIEW_POS = (
    "good", "great", "excellent", "wonderful", "best", "beautiful", "brilliant", "enjoyable",
    "fun", "amazing", "perfect", "superb", "funny", "touching", "moving", "memorable", "solid",
    "entertaining", "impressive", "fantastic", "charming", "clever", "powerful", "gripping",
    "delightful", "engaging", "outstanding", "lovely", "stunning", "terrific", "compelling",
    "witty", "heartfelt", "riveting", "refreshing", "masterful", "elegant", "inventive",
    "satisfying", "gorgeous", "hilarious", "tender", "superior", "marvelous", "splendid",
    "fabulous", "exceptional", "magnificent", "exquisite", "remarkable", "sublime", "pleasant",
    "smart", "fresh", "thoughtful", "absorbing", "poignant", "luminous", "sharp", "sincere",
    "graceful", "haunting", "inspired", "joyous", "lively", "nuanced", "rewarding", "sparkling",
    "stirring", "uplifting", "vivid", "wise", "dazzling", "flawless", "enchanting", "captivating",
)  # fmt: skip
_REVIEW_NEG = (
    "bad", "boring", "worst", "terrible", "awful", "stupid", "dull", "poor", "weak", "waste",
    "predictable", "silly", "ridiculous", "pointless", "disappointing", "annoying", "horrible",
    "mediocre", "lame", "cheap", "tedious", "bland", "pathetic", "clumsy", "forgettable",
    "messy", "lifeless", "shallow", "confusing", "dreadful", "tiresome", "flat", "sloppy",
    "lazy", "painful", "unconvincing", "uninspired", "overlong", "stale", "clunky", "muddled",
    "grating", "hollow", "laughable", "inept", "amateurish", "idiotic", "embarrassing",
    "insulting", "unwatchable", "atrocious", "abysmal", "lousy", "horrendous", "unfunny",
    "incoherent", "plodding", "wooden", "contrived", "dreary", "hackneyed", "irritating",
    "juvenile", "listless", "monotonous", "nonsensical", "obnoxious", "pretentious", "sluggish",
    "trite", "vapid", "witless", "cringeworthy", "derivative", "disjointed", "excruciating",
)  # fmt: skip
_REVIEW_NEGATORS = ("not", "never", "hardly", "not really", "far from", "anything but")
_REVIEW_ASPECTS = (
    "acting", "plot", "script", "dialogue", "soundtrack", "score", "cinematography", "pacing",
    "ending", "direction", "story", "cast", "editing", "humor", "finale", "lead performance",
    "screenplay", "set design", "camera work", "romance", "villain", "first hour", "last act",
    "photography", "music", "costume design", "sound design", "supporting cast",
)  # fmt: skip
_FIRST_NAMES = (
    "Anna", "Jack", "Maria", "Tom", "Helen", "Frank", "Lucy", "Paul", "Rosa", "Victor", "Ellen",
    "Sam", "Nora", "Leo", "Grace", "Hugo", "Iris", "Walter", "Clara", "Martin", "Vera", "Eddie",
)  # fmt: skip
_LAST_NAMES = (
    "Miller", "Novak", "Brennan", "Castillo", "Hart", "Lindqvist", "Okafor", "Marsh", "Dubois",
    "Keller", "Sato", "Price", "Romano", "Walsh", "Fischer", "Moreau", "Quinn", "Adler",
)  # fmt: skip
_ROLES = (
    "detective", "schoolteacher", "widow", "boxer", "pilot", "nurse", "journalist", "lawyer",
    "farmer", "musician", "priest", "cook", "soldier", "thief", "doctor", "student", "sheriff",
    "painter", "mechanic", "diplomat", "smuggler", "professor", "waitress", "fisherman",
)  # fmt: skip
_GENRES = (
    "thriller", "western", "comedy", "drama", "horror movie", "war film", "musical", "romance",
    "science fiction film", "crime story", "period piece", "mystery", "family film", "biopic",
)  # fmt: skip
_EVENTS = (
    "a letter arrives from an old friend", "the family business is about to close",
    "a stranger moves in next door", "a storm cuts the town off for a week",
    "the money from a robbery goes missing", "an old photograph turns up in the attic",
    "a trial divides the whole village", "the factory announces it will shut down",
    "a child disappears on the way to school", "two brothers inherit a farm",
    "a ship is stranded off the coast", "an election is only days away",
    "a rival band arrives for the same contest", "the war ends and the soldiers come home",
)  # fmt: skip
_ACTIONS = (
    "travels to", "returns to", "hides in", "opens a shop in", "takes a job in",
    "searches for a brother in", "falls in love in", "gets stuck in", "moves the family to",
)  # fmt: skip
_TIMES = (
    "in 1953", "in the late seventies", "during the war", "in the near future", "one summer",
    "over three decades", "in 1987", "during a heat wave", "in the twenties", "one winter",
)  # fmt: skip
_INTROS = (
    "I rented this {genre} on a whim after seeing the cover in the store.",
    "I watched this {genre} last night with {companion}.",
    "I caught this on late-night television a few weeks ago.",
    "This {genre} came out in {year} and I finally got around to it.",
    "A friend lent me the DVD of this {genre} and insisted I watch it.",
    "I saw this at a small festival screening in {year}.",
    "I went in knowing nothing about this {genre} except the title.",
    "My expectations for this {genre} were shaped by the trailer.",
)
_PLOT = (
    "The story follows {name}, a {role} who {action} {place} {time}.",
    "{first} is a {role} whose life changes when {event}.",
    "Meanwhile {name2}, a {role2}, has secrets of {pronoun} own.",
    "Most of the film takes place in {place}, where {event}.",
    "Halfway through, {first} {action} {place2} and meets {name2}.",
    "The {role} and the {role2} spend most of the second half looking for answers.",
    "There is a subplot about {name2} and an old debt that goes back years.",
    "The film runs about {minutes} minutes and is shot mostly on location in {place}.",
    "It was directed by {name3}, who also wrote the screenplay.",
    "{name3} plays the {role2}, and {name} plays {first}'s younger sibling.",
    "The events are told partly in flashback, starting {time}.",
    "By the end {first} has to decide whether to stay in {place} or leave for good.",
)
_OPINIONS = (
    "The {aspect} is {neg}{word}.",
    "I thought the {aspect} was {neg}{word}.",
    "The {aspect} was {neg}{word}, and {first}'s scenes especially.",
    "Honestly, the {aspect} felt {neg}{word} to me.",
    "{name} is {neg}{word} as the {role}.",
    "As for the {aspect}, it is {neg}{word} most of the time.",
    "The {aspect} in the second half is {neg}{word}.",
)
_VERDICTS = (
    "Overall the film is {neg}{word}.",
    "All in all, {neg}{word}.",
    "In the end I found it {neg}{word}.",
    "Bottom line: {neg}{word}.",
    "{Neg2}recommended.",
    "I would {rec} it to anyone who likes a {genre}.",
    "{score} out of 10.",
)
_COMPANION_WORDS = ("my wife", "my brother", "a friend", "my parents", "my roommate", "my kids")
_ASIDES = (
    "The DVD has a commentary track by the director and a short documentary.",
    "It reminded me of the films my father used to watch on Sunday afternoons.",
    "Some scenes were apparently cut for the television version.",
    "The cast includes a few faces you will recognize from television.",
    "I had to look up the novel it is based on afterwards.",
    "The version I saw had subtitles for the scenes in {language}.",
    "There is a cameo by {name3} about twenty minutes in.",
    "Apparently it was shot in only six weeks on a small budget.",
    "Keep an eye out for the scene at the train station.",
    "It was released the same year as two other films about {place}.",
)


def _zipf_pick(rng: np.random.Generator, words: Sequence[str], exponent: float = 1.0) -> str:
    weights = 1.0 / np.arange(1, len(words) + 1) ** exponent
    return words[int(rng.choice(len(words), p=weights / weights.sum()))]


def _review_opinion(rng: np.random.Generator, polarity: int, template: str, fill: dict) -> str:
    """An opinion of sign ``polarity``: an opinion word of that sign, or (30 %) a negated word
    of the other sign ("not bad" is mildly positive, "not great" mildly negative)."""
    negate = rng.random() < 0.25
    word_sign = -polarity if negate else polarity
    word = _zipf_pick(rng, _REVIEW_POS if word_sign > 0 else _REVIEW_NEG)
    neg = f"{_pick(rng, _REVIEW_NEGATORS)} " if negate else ""
    return template.format(neg=neg, word=word, **fill)


def imdb_like_review(rng: np.random.Generator, rating: int, *, short: bool = False) -> str:
    """One long review (about 120-300 words, ``<br /><br />`` between paragraphs) of ``rating``
    1-4 (negative) or 7-10 (positive); see :func:`imdb_like_reviews`."""
    label = 1 if rating >= 7 else -1
    strength = abs(rating - 5.5) / 4.5  # 1 for ratings 1 and 10, 1/3 for 4 and 7
    agree = 0.65 + 0.3 * strength  # chance that an aspect opinion has the review's sign
    name = lambda: f"{_pick(rng, _FIRST_NAMES)} {_pick(rng, _LAST_NAMES)}"  # noqa: E731
    lead = name()
    fill = dict(
        first=lead.split()[0],
        name=lead,
        name2=name(),
        name3=name(),
        role=_pick(rng, _ROLES),
        role2=_pick(rng, _ROLES),
        pronoun=_pick(rng, ("his", "her")),
        genre=_pick(rng, _GENRES),
        companion=_pick(rng, _COMPANION_WORDS),
        year=int(rng.integers(1950, 2010)),
        minutes=int(rng.integers(80, 170)),
        language=_pick(rng, _LANGUAGES),
        place=_pick(rng, _PLACES),
    )

    def plot_sentence(template: str) -> str:
        return template.format(
            action=_pick(rng, _ACTIONS),
            place2=_pick(rng, _PLACES),
            time=_pick(rng, _TIMES),
            event=_pick(rng, _EVENTS),
            **fill,
        )

    intro = _pick(rng, _INTROS).format(**fill)
    n_plot = int(rng.integers(1, 3) if short else rng.integers(4, 9))
    order = rng.choice(len(_PLOT), n_plot + 2, replace=False)
    plot = [plot_sentence(_PLOT[i]) for i in order[:n_plot]]
    # Filler between opinions: what the reviewer noticed (no opinion words).
    extra = [plot_sentence(_PLOT[order[-1]])] + [
        plot_sentence(_ASIDES[i]) for i in rng.choice(len(_ASIDES), 2, replace=False)
    ]
    opinions = []
    for _ in range(int(rng.integers(3, 7))):
        polarity = label if rng.random() < agree else -label
        aspect = _pick(rng, _REVIEW_ASPECTS)
        sentence = _review_opinion(rng, polarity, _pick(rng, _OPINIONS), dict(fill, aspect=aspect))
        opinions.append(_capitalize(sentence))
    # Opinions are spread as in real reviews: half of them open with one, the rest sit among
    # the plot and the asides of the middle paragraph.
    opening = opinions[:1] if rng.random() < 0.5 else []
    first = [intro] + opening + plot[: n_plot // 2]
    middle = plot[n_plot // 2 :] + opinions[len(opening) :] + ([] if short else extra[:2])
    paragraphs = [" ".join(first), " ".join(middle[i] for i in rng.permutation(len(middle)))]
    if rng.random() < 0.85:  # most reviews end with a verdict of the review's own sign
        template = _pick(rng, _VERDICTS)
        if template.startswith("{score}"):
            verdict = template.format(score=rating)
        elif template.startswith("{Neg2}"):
            verdict = template.format(Neg2="" if label > 0 else "Not ")
        elif "{rec}" in template:
            rec = "recommend" if label > 0 else _pick(rng, ("not recommend", "never recommend"))
            verdict = template.format(rec=rec, genre=fill["genre"])
        else:
            verdict = _review_opinion(rng, label, template, fill)
        paragraphs.append(_capitalize(verdict) + ("" if short else " " + extra[2]))
    elif not short:
        paragraphs.append(extra[2])
    return "<br /><br />".join(paragraphs)


def imdb_like_reviews(
    num_examples: int, *, seed: int = 0, stream: int = 0, short: bool = False
) -> tuple[TextSplit, np.ndarray]:
    """Generated long movie reviews in the style of IMDb's, and their ratings ``[N]`` (1-10).

    NOT real reviews: a stand-in with the properties that make real ones hard, for tests and
    runs in the aclImdb folder layout (:func:`write_aclimdb`) when the real data is not at
    hand. Example ``i`` has label ``i % 2`` (balanced) and a rating drawn from 1-4 (negative)
    or 7-10 (positive); a review is 3 paragraphs, about 120-300 words joined by
    ``<br /><br />``:

    * most words are neutral: how it was watched, a plot summary with names, roles, places
      and events, and filler sentences;
    * sentiment sits in 2-4 aspect opinions and (85 %) a closing verdict, each one opinion word
      from a lexicon of 76 positive and 76 negative words drawn with Zipf weights, so most
      opinion words are rare;
    * 30 % of opinions are negated ("not bad", "far from perfect");
    * mixed reviews: an aspect opinion agrees with the label with probability 0.55 + 0.3·s,
      ``s`` = 1 for ratings 1 and 10 and 1/3 for 4 and 7, so mild reviews are often mixed and
      some are genuinely ambiguous (no model reaches 100 %).

    A bag-of-words logistic regression trained on 1,800 of them scores about 0.75 on held-out
    ones (``tests/test_text_learns.py`` computes one); example ``i`` depends only on
    ``(seed, stream, i)``.
    """
    if num_examples < 0 or seed < 0 or stream < 0:
        raise DataError(
            f"imdb_like_reviews needs num_examples, seed and stream >= 0, got {num_examples}, "
            f"{seed} and {stream}: pass non-negative values"
        )
    labels = np.arange(num_examples, dtype=np.int32) % 2
    texts, ratings = [], []
    for i in range(num_examples):
        rng = np.random.default_rng([seed, stream, i, 7])
        rating = int(rng.integers(7, 11)) if labels[i] else int(rng.integers(1, 5))
        texts.append(imdb_like_review(rng, rating, short=short))
        ratings.append(rating)
    return TextSplit(texts=tuple(texts), pairs=None, labels=labels), np.asarray(ratings)


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
    """
    base = Path(root).expanduser() / "aclImdb"
    for name, split, split_ratings in (
        ("train", train, None if ratings is None else ratings[0]),
        ("test", test, None if ratings is None else ratings[1]),
    ):
        if split.pairs is not None or (len(split) and int(split.labels.max()) > 1):
            raise DataError(
                f"write_aclimdb writes binary single-text splits; the {name} split has pairs or "
                "labels above 1: pass neg (0) / pos (1) reviews"
            )
        for folder in ("neg", "pos"):
            (base / name / folder).mkdir(parents=True, exist_ok=True)
        for i, (text, label) in enumerate(zip(split.texts, split.labels, strict=True)):
            rating = (10 if label else 1) if split_ratings is None else int(split_ratings[i])
            path = base / name / ("pos" if label else "neg") / f"{i}_{rating}.txt"
            path.write_text(text, encoding="utf-8")
    return base


# --------------------------------------------------------------------------------------------------
# aclImdb folder
# --------------------------------------------------------------------------------------------------

_ACLIMDB_HINT = (
    "download aclImdb_v1.tar.gz from https://ai.stanford.edu/~amaas/data/sentiment/ and extract "
    "it, then pass the aclImdb folder (or its parent) as data_dir"
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
        raise DataError(
            f"no {split}/ folder in '{root}' (expected aclImdb/{split}/{{neg,pos}}): "
            f"{_ACLIMDB_HINT}"
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
    keep = _subsample(len(files), max_examples, seed)
    texts = []
    for i in keep:
        try:
            raw = files[i].read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"'{files[i]}' is not UTF-8 ({err.reason} at byte {err.start}): re-extract "
                "aclImdb_v1.tar.gz or re-save the file as UTF-8"
            ) from err
        texts.append(_clean_review(raw))
    return TextSplit(texts=tuple(texts), pairs=None, labels=np.asarray(labels)[keep])


# --------------------------------------------------------------------------------------------------
# TFDS (no TensorFlow)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TfdsSpec:
    name: str  # TFDS builder name
    config: str
    version: str  # the version TFDS prepares today (preferred; other versions on disk are read too)
    text: str  # feature holding the first segment
    pair: str | None  # feature holding the second segment
    label_names: tuple[str, ...]
    train: str  # TFDS split -> our train/val pool
    test: str  # TFDS split -> our test
    clean: bool  # strip IMDb's <br /> tags


_TFDS: dict[str, _TfdsSpec] = {
    "imdb": _TfdsSpec(
        name="imdb_reviews",
        config="plain_text",
        version="1.0.0",
        text="text",
        pair=None,
        label_names=("neg", "pos"),
        train="train",
        test="test",
        clean=True,
    ),
    "mnli": _TfdsSpec(
        name="glue",
        config="mnli",
        version="2.0.0",
        text="premise",
        pair="hypothesis",
        label_names=("entailment", "neutral", "contradiction"),
        train="train",
        test="validation_matched",
        clean=False,
    ),
}


def _default_tfds_dir() -> Path:
    return Path(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser()


def _prepare_hint(spec: _TfdsSpec, root: Path) -> str:
    return (
        "run the experiment with --download (download=True) on a machine with internet, or run "
        f"`tfds build {spec.name}/{spec.config} --data_dir {root} --file_format array_record` "
        f"(on another machine, then copy its {spec.name}/ folder into '{root}')"
    )


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".")) if re.fullmatch(r"\d+(\.\d+)*", name) else (-1,)


def _find_variant(spec: _TfdsSpec, root: Path) -> Path | None:
    """``root/name/config/<version>`` holding a ``dataset_info.json``: the version TFDS builds today
    if prepared, else the newest one there; ``root`` itself when it is such a folder."""
    if (root / "dataset_info.json").is_file():
        return root
    config_dir = root / spec.name / spec.config
    if not config_dir.is_dir():
        return None
    if (config_dir / spec.version / "dataset_info.json").is_file():
        return config_dir / spec.version
    versions = [d for d in config_dir.iterdir() if (d / "dataset_info.json").is_file()]
    if not versions:
        return None
    return max(versions, key=lambda d: _version_key(d.name))


def _download_and_prepare(spec: _TfdsSpec, root: Path) -> None:
    """Build the dataset into ``root`` as array_record (readable here without TensorFlow)."""
    import tensorflow_datasets as tfds

    if spec.name == "glue":
        import tensorflow_datasets.text.glue  # noqa: F401  (registers the legacy GLUE builder)
    try:
        builder = tfds.builder(
            f"{spec.name}/{spec.config}", data_dir=str(root), file_format="array_record"
        )
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False)
        )
    except Exception as err:  # network, disk, TFDS: all mean "could not prepare"
        raise DataError(
            f"could not download and prepare {spec.name}/{spec.config} into '{root}' "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}): check the "
            f"internet connection and disk space, or prepare it elsewhere with `tfds build "
            f"{spec.name}/{spec.config} --data_dir {root} --file_format array_record` and copy it"
        ) from err


# TFRecord framing: uint64 length, uint32 masked CRC32C of the length, data, uint32 masked CRC32C
# of the data (little-endian). https://www.tensorflow.org/tutorials/load_data/tfrecord
def _crc32c_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as used by TFRecord; pure Python, meant for short inputs."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc32c(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord_records(path: Path, keep: set[int] | None = None, first: int = 0) -> Iterator[bytes]:
    """The records of one TFRecord file (those whose global index ``first + i`` is in ``keep``).

    The length header's CRC is checked (catches truncation and misframing); the data CRC is not
    (pure-Python CRC over the whole file would be slow); a corrupt record then fails to parse.
    """
    with open(path, "rb") as f:
        i = first
        while True:
            header = f.read(12)
            if not header:
                return
            if len(header) < 12:
                raise DataError(f"'{path}' is truncated: re-prepare the dataset")
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc32c(header[:8]) != length_crc:
                raise DataError(
                    f"'{path}' is not a TFRecord file or is corrupt (bad length checksum at "
                    f"record {i - first}): re-prepare the dataset"
                )
            if keep is None or i in keep:
                data = f.read(length)
                if len(data) < length:
                    raise DataError(f"'{path}' is truncated: re-prepare the dataset")
                yield data
            else:
                f.seek(length, os.SEEK_CUR)
            if len(f.read(4)) < 4:
                raise DataError(f"'{path}' is truncated: re-prepare the dataset")
            i += 1


def _read_tfrecord_split(builder: Any, split: str, keep: np.ndarray) -> list[Any]:
    """Decoded examples ``keep`` (sorted global indices) of a TFRecord split, in that order."""
    info = builder.info
    split_info = info.splits[split]
    variant = Path(str(builder.data_dir))
    shards = sorted(variant.glob(f"{info.name}-{split}.tfrecord-*"))
    n_shards = len(split_info.shard_lengths)
    if len(shards) != n_shards:
        raise DataError(
            f"found {len(shards)} {info.name}-{split}.tfrecord-* files in '{variant}' but "
            f"dataset_info.json lists {n_shards} shards: re-prepare the dataset"
        )
    wanted = {int(i) for i in keep}
    features = info.features
    out: list[Any] = []
    first = 0
    for shard, shard_len in zip(shards, split_info.shard_lengths, strict=True):
        count = 0
        for record in _tfrecord_records(shard, wanted, first):
            out.append(features.deserialize_example_np(record))
            count += 1
        first += int(shard_len)
    if len(out) != len(wanted):
        raise DataError(
            f"read {len(out)} of {len(wanted)} requested {split} records from '{variant}' (shard "
            "lengths in dataset_info.json do not match the files): re-prepare the dataset"
        )
    return out


def _decode_text(value: Any, where: str) -> str:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{where} is not UTF-8 text: re-prepare the dataset") from err
    return str(value)


def _load_tfds(
    dataset: str,
    data_dir: str | Path | None,
    split: str,
    *,
    download: bool,
    max_examples: int | None,
    seed: int,
) -> tuple[TextSplit, str, int]:
    """:func:`load_tfds_text` plus where it was read from and the size of the whole split."""
    if dataset not in _TFDS:
        raise DataError(f"TFDS text dataset must be one of {', '.join(_TFDS)}, got {dataset!r}")
    spec = _TFDS[dataset]
    root = Path(data_dir).expanduser() if data_dir is not None else _default_tfds_dir()
    variant = _find_variant(spec, root)
    if variant is None and download:
        _download_and_prepare(spec, root)
        variant = _find_variant(spec, root)
    if variant is None:
        raise DataError(
            f"no prepared {spec.name}/{spec.config} in '{root}' (expected "
            f"{root}/{spec.name}/{spec.config}/<version>/dataset_info.json): "
            f"{_prepare_hint(spec, root)}"
        )

    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder_from_directory(str(variant))
    except Exception as err:
        raise DataError(
            f"cannot read the TFDS metadata in '{variant}' ({type(err).__name__}): delete the "
            f"folder and {_prepare_hint(spec, root)}"
        ) from err
    info = builder.info
    features = info.features
    wanted = [spec.text, "label"] + ([spec.pair] if spec.pair else [])
    missing = [k for k in wanted if k not in features]
    label = features["label"] if "label" in features else None
    if missing or getattr(label, "num_classes", None) != len(spec.label_names):
        raise DataError(
            f"'{variant}' does not hold {spec.name}/{spec.config} (features {sorted(features)}, "
            f"need {wanted} with {len(spec.label_names)} classes): point data_dir at the right "
            "folder"
        )
    if split not in info.splits:
        raise DataError(
            f"{spec.name}/{spec.config} in '{variant}' has no split {split!r} (has "
            f"{', '.join(sorted(info.splits))}): pass one of those"
        )

    n = info.splits[split].num_examples
    keep = _subsample(n, max_examples, seed)
    formats = info.available_file_formats() or {tfds.core.FileFormat.TFRECORD}
    readable = [
        f for f in (tfds.core.FileFormat.ARRAY_RECORD, tfds.core.FileFormat.PARQUET) if f in formats
    ]
    if readable:
        fmt = readable[0]
        source = builder.as_data_source(split, file_format=fmt)
        examples: list[Any] = []
        for start in range(0, len(keep), 1024):
            examples += source.__getitems__([int(i) for i in keep[start : start + 1024]])
    elif tfds.core.FileFormat.TFRECORD in formats:
        fmt = tfds.core.FileFormat.TFRECORD
        examples = _read_tfrecord_split(builder, split, keep)
    else:
        names = ", ".join(sorted(f.value for f in formats))
        raise DataError(
            f"{spec.name}/{spec.config} in '{variant}' is stored as {names}, which cannot be read "
            f"without TensorFlow: re-prepare it with `tfds build {spec.name}/{spec.config} "
            f"--data_dir DIR --file_format array_record` (or install tensorflow and convert)"
        )

    texts, pairs, labels = [], [], []
    for i, ex in zip(keep, examples, strict=True):
        y = int(ex["label"])
        if not 0 <= y < len(spec.label_names):  # e.g. -1: unlabelled (GLUE test splits)
            continue
        text = _decode_text(ex[spec.text], f"{split}[{i}].{spec.text}")
        texts.append(_clean_review(text) if spec.clean else text.strip())
        if spec.pair:
            pairs.append(_decode_text(ex[spec.pair], f"{split}[{i}].{spec.pair}").strip())
        labels.append(y)
    out = TextSplit(
        texts=tuple(texts),
        pairs=tuple(pairs) if spec.pair else None,
        labels=np.asarray(labels, dtype=np.int32),
    )
    where = f"{info.name}/{info.config_name}:{info.version} ({fmt.value}) at {variant}"
    return out, where, n


def load_tfds_text(
    dataset: str,
    data_dir: str | Path | None,
    split: str,
    *,
    download: bool = False,
    max_examples: int | None = None,
    seed: int = 0,
) -> TextSplit:
    """Read one split of a prepared TFDS text dataset, without TensorFlow.

    ``dataset``: ``"imdb"`` (``imdb_reviews/plain_text``; text, label neg/pos) or ``"mnli"``
    (``glue/mnli``; premise + hypothesis pairs, label entailment/neutral/contradiction).
    ``split``: a TFDS split name (``"train"``, ``"test"``, ``"validation_matched"``, ...).

    ``data_dir`` is the TFDS data folder (holding ``imdb_reviews/plain_text/1.0.0/``), or the
    version folder itself; ``None`` means ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``. The
    current TFDS version (``1.0.0``, ``2.0.0``) is read if prepared, else the newest one there. Formats: ``array_record`` and ``parquet`` (TFDS data
    sources), ``tfrecord`` (the ``tfds build`` default, read by a TFRecord reader in this
    module); ``riegeli`` raises :class:`DataError` asking to re-prepare as array_record.

    Missing data raises :class:`DataError` at once, saying how to prepare it; only
    ``download=True`` downloads (and prepares as array_record, which needs no TensorFlow).
    ``max_examples`` keeps a seeded random subset (only those records are decoded); examples come
    in file order. IMDb ``<br />`` tags are replaced by spaces; unlabelled examples (label -1)
    are dropped.
    """
    out, _, _ = _load_tfds(
        dataset, data_dir, split, download=download, max_examples=max_examples, seed=seed
    )
    return out


# --------------------------------------------------------------------------------------------------
# All splits
# --------------------------------------------------------------------------------------------------


def _split_val(pool: TextSplit, val_fraction: float, seed: int) -> tuple[TextSplit, TextSplit]:
    """Seeded random ``(train, val)`` split of ``pool``: ``round(val_fraction * N)`` go to val (at
    least one when ``val_fraction > 0``), each part keeps the pool's order."""
    n = len(pool)
    n_val = int(round(val_fraction * n))
    if val_fraction > 0:
        n_val = max(n_val, 1)
    if n - n_val < 1:
        raise DataError(
            f"a training pool of {n} examples is too small to hold out val_fraction="
            f"{val_fraction}: use more training examples or a smaller val_fraction"
        )
    perm = np.random.default_rng([seed, 1]).permutation(n)
    return pool.take(np.sort(perm[n_val:])), pool.take(np.sort(perm[:n_val]))


def load_text_data(
    dataset: str = "synthetic",
    data_dir: str | Path | None = None,
    *,
    download: bool = False,
    num_train: int | None = _DEFAULT_NUM_TRAIN,
    num_test: int | None = _DEFAULT_NUM_TEST,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> TextSplits:
    """Train / val / test text splits of one source.

    ``num_train`` examples are drawn (seeded) from the source's training split into a pool, of
    which ``val_fraction`` (rounded) is held out as *val* and the rest is *train* (so
    ``num_train=2000, val_fraction=0.1`` gives 1800 / 200). ``num_test`` examples are drawn from
    the source's test split. ``None`` means all of it (``synthetic``: the defaults, 4000 / 1000).

    * ``"synthetic"``: :func:`synthetic_sentiment`, pool from stream 0 and test from stream 1
      with repeated texts skipped, so no review is in two splits; ``data_dir`` is not used.
    * ``"imdb"`` / ``"mnli"``: :func:`load_tfds_text` from ``data_dir``; IMDb ``train`` ->
      train/val, ``test`` -> test; MNLI ``train`` -> train/val, ``validation_matched`` -> test.
      ``download=True`` downloads and prepares missing data (otherwise missing data is a
      :class:`DataError` naming the fix).
    * ``"aclimdb"``: :func:`read_aclimdb` on ``data_dir``: ``train`` -> train/val, ``test`` ->
      test.
    """
    if dataset not in TEXT_DATASETS:
        raise DataError(f"unknown dataset {dataset!r}: valid names are {', '.join(TEXT_DATASETS)}")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}: pass e.g. 0.1")
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value is not None and value < 1:
            raise DataError(f"{name} must be >= 1 or None, got {value}: pass a positive count")

    if dataset == "synthetic":
        n_train = _DEFAULT_NUM_TRAIN if num_train is None else num_train
        n_test = _DEFAULT_NUM_TEST if num_test is None else num_test
        pool = _unique_synthetic(n_train, seed, 0, set())
        test = _unique_synthetic(n_test, seed, 1, set(pool.texts))
        label_names = _SYNTHETIC_LABEL_NAMES
        source = f"synthetic sentiment reviews (seed={seed}, pool={n_train}, test={n_test})"
    elif dataset == "aclimdb":
        if data_dir is None:
            raise DataError(f"dataset 'aclimdb' needs data_dir: {_ACLIMDB_HINT}")
        pool = read_aclimdb(data_dir, "train", max_examples=num_train, seed=seed)
        test = read_aclimdb(data_dir, "test", max_examples=num_test, seed=seed)
        label_names = ("neg", "pos")
        source = f"aclImdb folder {data_dir}: train {len(pool)}, test {len(test)} (seed={seed})"
    else:
        spec = _TFDS[dataset]
        pool, where, n_pool = _load_tfds(
            dataset, data_dir, spec.train, download=download, max_examples=num_train, seed=seed
        )
        test, _, n_test = _load_tfds(
            dataset, data_dir, spec.test, download=download, max_examples=num_test, seed=seed
        )
        label_names = spec.label_names
        source = (
            f"TFDS {where}: {spec.train} {len(pool)} of {n_pool} -> train/val, {spec.test} "
            f"{len(test)} of {n_test} -> test (seed={seed})"
        )
    train, val = _split_val(pool, val_fraction, seed)
    return TextSplits(
        train=train,
        val=val,
        test=test,
        num_classes=len(label_names),
        label_names=label_names,
        source=source,
    )
