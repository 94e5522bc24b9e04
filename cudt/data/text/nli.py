"""Generated NLI data (MNLI-like premise/hypothesis pairs) and a writer of generated text
datasets in the prepared-TFDS layout of ``imdb_reviews/plain_text`` and ``glue/mnli``.

:func:`generated_nli` labels its pairs by construction; :func:`tiny_splits` makes the source
splits of a tiny IMDb (generated sentiment reviews) or MNLI (generated pairs) named as TFDS names
them, and :func:`tfds_builder` a TFDS builder with the real dataset's name, config, version and
features whose content they are, so the TFDS reader (:mod:`cudt.data.text.tfds`) reads them like
the real ones.
"""

from __future__ import annotations

import functools

import numpy as np

from cudt.data.text.generated import _pick, synthetic_sentiment
from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = ["NLI_LABELS", "generated_nli", "tfds_builder", "tiny_splits"]

# (noun phrase, head noun, a hypernym phrase that it entails)
_NLI_PEOPLE = (
    ("a young teacher", "teacher", "a person"),
    ("an old fisherman", "fisherman", "a man"),
    ("a tall woman", "woman", "a person"),
    ("a small boy", "boy", "a child"),
    ("a tired nurse", "nurse", "a worker"),
    ("a street musician", "musician", "a performer"),
    ("a retired pilot", "pilot", "a person"),
    ("a teenage girl", "girl", "a young person"),
    ("a bearded chef", "chef", "a cook"),
    ("an elderly farmer", "farmer", "a man"),
    ("a college student", "student", "a young person"),
    ("a police officer", "officer", "a worker"),
)
# (activity, what it entails)
_NLI_ACTIVITIES = (
    ("playing the guitar", "playing an instrument"),
    ("playing the violin", "playing an instrument"),
    ("reading a newspaper", "reading something"),
    ("reading a thick novel", "reading something"),
    ("eating a sandwich", "eating"),
    ("eating a bowl of soup", "eating"),
    ("painting a fence", "painting something"),
    ("painting a portrait", "painting something"),
    ("fixing a bicycle", "repairing something"),
    ("fixing an old radio", "repairing something"),
    ("writing a letter", "writing"),
    ("drinking a cup of coffee", "drinking something"),
    ("cooking dinner", "preparing food"),
    ("knitting a scarf", "making something"),
)
# Activities none of the above can be done during (the contradiction of any of them).
_NLI_EXCLUSIVE = (
    "sleeping",
    "swimming in a lake",
    "running a marathon",
    "taking a nap",
    "skiing down a slope",
    "lying unconscious",
)
# Activities compatible with any of the above (neither entailed nor contradicted).
_NLI_COMPATIBLE = ("singing", "smiling", "wearing a hat", "listening to the radio", "humming")
# (place, indoors)
_NLI_PLACES = (
    ("in a park", False),
    ("on a beach", False),
    ("on a busy street", False),
    ("in a garden", False),
    ("on a balcony", False),
    ("in a library", True),
    ("in a kitchen", True),
    ("in a small cafe", True),
    ("in a hospital hallway", True),
    ("in a classroom", True),
)
# (time, its opposite)
_NLI_TIMES = (
    ("early in the morning", "late at night"),
    ("late at night", "early in the morning"),
    ("at noon", "at midnight"),
    ("at midnight", "at noon"),
)
_NLI_PURPOSES = ("for a friend", "for money", "for the first time", "for a school project")
_NLI_EXTRAS = (
    "is happy",
    "is on vacation",
    "is late for work",
    "is very talented",
    "is waiting for a bus",
    "has two brothers",
)
_NLI_COMPANIONS = ("a neighbour", "an old friend", "a cousin", "two colleagues")
_NLI_DAYS = ("Monday", "Friday", "Sunday", "a holiday")
NLI_LABELS = ("entailment", "neutral", "contradiction")


def _nli_pair(rng: np.random.Generator, label: int) -> tuple[str, str]:
    """One premise and a hypothesis that it entails (0), leaves open (1) or contradicts (2),
    by construction."""

    pick = functools.partial(_pick, rng)
    person, head, hyper = pick(_NLI_PEOPLE)
    activity, general = pick(_NLI_ACTIVITIES)
    place, indoors = pick(_NLI_PLACES)
    timed = rng.random() < 0.5
    when, opposite_when = pick(_NLI_TIMES)
    premise = f"{person} {'is'} {activity} {place}" + (f" {when}" if timed else "")
    premise = premise[0].upper() + premise[1:] + "."
    doors = "indoors" if indoors else "outdoors"
    other_doors = "outdoors" if indoors else "indoors"
    other_place = pick([p for p, inside in _NLI_PLACES if inside != indoors])
    the = f"The {head}"
    if label == 0:
        options = [
            f"{hyper} is {general}.",
            f"{hyper} is {doors}.",
            f"{person} is {activity}.",
            f"Someone is {activity} {place}.",
            f"{the} is not {pick(_NLI_EXCLUSIVE)}.",
            f"{the} is {general} {place}.",
        ]
        if timed:
            options.append(f"{hyper} is {general} {when}.")
    elif label == 1:
        options = [
            f"{the} is {activity} {pick(_NLI_PURPOSES)}.",
            f"{the} {pick(_NLI_EXTRAS)}.",
            f"{person} is {activity} with {pick(_NLI_COMPANIONS)}.",
            f"{the} is {activity} {place} on {pick(_NLI_DAYS)}.",
            f"{the} is not {pick(_NLI_COMPATIBLE)}.",
            f"{hyper} is {general} and {pick(_NLI_COMPATIBLE)}.",
        ]
        if not timed:
            options.append(f"{the} is {activity} {when}.")
    else:
        options = [
            f"{the} is {pick(_NLI_EXCLUSIVE)}.",
            f"{the} is {other_doors}.",
            f"Nobody is {activity}.",
            f"{the} is not {activity}.",
            f"{person} is {activity} {other_place}.",
            f"{hyper} is {pick(_NLI_EXCLUSIVE)} {place}.",
        ]
        if timed:
            options.append(f"{the} is {activity} {opposite_when}.")
    hypothesis = pick(options)
    return premise, hypothesis[0].upper() + hypothesis[1:]


def generated_nli(num_examples: int, *, seed: int = 0, stream: int = 0) -> TextSplit:
    """Generated premise/hypothesis pairs labelled like MNLI (0 entailment, 1 neutral, 2
    contradiction), balanced (example ``i`` has label ``i % 3``).

    A premise says who does what, where and (half the time) when: *"A tired nurse is fixing a
    bicycle in a garden early in the morning."* The hypothesis of each label is drawn from
    several forms, so no single word gives the label away: entailment generalises (*"A worker
    is repairing something."*, *"... is outdoors."*) or denies an incompatible activity (*"The
    nurse is not sleeping."*); neutral adds what the premise leaves open (a purpose, a
    companion, a day, a feeling) or denies a compatible activity (*"The nurse is not
    singing."*); contradiction claims an incompatible activity, place, time, or denies the
    premise (*"Nobody is fixing a bicycle."*). Example ``i`` depends only on
    ``(seed, stream, i)``.
    """
    if num_examples < 0:
        raise DataError(f"generated_nli needs num_examples >= 0, got {num_examples}")
    labels = np.arange(num_examples, dtype=np.int32) % 3
    pairs = [
        _nli_pair(np.random.default_rng([seed, stream, i]), int(labels[i]))
        for i in range(num_examples)
    ]
    return TextSplit(
        texts=tuple(p for p, _ in pairs), pairs=tuple(h for _, h in pairs), labels=labels
    )


def _keys(split: TextSplit) -> list[tuple[str, str | None]]:
    return list(zip(split.texts, split.pairs or [None] * len(split), strict=True))


def _distinct(make, n: int, exclude: set) -> TextSplit:
    """The first ``n`` examples of ``make(m)`` not in ``exclude`` nor repeated (no example in
    two splits: the test set stays held out)."""
    m = n + n // 10 + 8
    while True:
        split = make(m)
        keys = _keys(split)
        seen, keep = set(exclude), []
        for i, key in enumerate(keys):
            if key not in seen:
                seen.add(key)
                keep.append(i)
                if len(keep) == n:
                    return split.take(keep)
        if m > 20 * n + 100:
            raise DataError(f"could not generate {n} distinct examples: ask for fewer")
        m *= 2


def tiny_splits(dataset: str, num_train: int, num_test: int) -> dict[str, TextSplit]:
    """The generated source splits of ``dataset``, named as TFDS names them."""
    if dataset == "imdb":

        def make(stream):
            return lambda m: synthetic_sentiment(m, seed=0, stream=stream)

        train = _distinct(make(0), num_train, set())
        test = _distinct(make(1), num_test, set(_keys(train)))
        unsup = synthetic_sentiment(4, seed=0, stream=2)  # unlabelled, as in the real archive
        return {"train": train, "test": test, "unsupervised": unsup}

    def make_nli(stream):
        return lambda m: generated_nli(m, seed=0, stream=stream)

    train = _distinct(make_nli(0), num_train, set())
    test = _distinct(make_nli(1), num_test, set(_keys(train)))
    mismatched = generated_nli(max(num_test // 4, 3), seed=0, stream=2)
    unlabelled = generated_nli(3, seed=0, stream=3)  # GLUE's test labels are hidden: -1
    return {
        "train": train,
        "validation_matched": test,
        "validation_mismatched": mismatched,
        "test_matched": unlabelled,
    }


def tfds_builder(dataset: str, splits: dict[str, TextSplit]):
    """A TFDS builder with the name, config, version and features of ``imdb_reviews`` /
    ``glue`` (mnli) whose content is ``splits``."""
    import tensorflow_datasets as tfds

    unlabelled = ("unsupervised", "test_matched")
    if dataset == "imdb":
        name, config, version = "imdb_reviews", "plain_text", "1.0.0"
        features = {
            "text": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["neg", "pos"]),
        }
    else:
        name, config, version = "glue", "mnli", "2.0.0"
        features = {
            "premise": tfds.features.Text(),
            "hypothesis": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=list(NLI_LABELS)),
            "idx": np.int32,
        }

    def examples(split: str):
        s = splits[split]
        for i in range(len(s)):
            label = -1 if split in unlabelled else int(s.labels[i])
            if dataset == "imdb":
                yield i, {"text": s.texts[i], "label": label}
            else:
                ex = {"premise": s.texts[i], "hypothesis": s.pairs[i], "label": label, "idx": i}
                yield i, ex

    class Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version(version)
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config, version=VERSION)]

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict(features)
            )

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in splits}

        def _generate_examples(self, split):
            yield from examples(split)

    Builder.name = name
    return Builder
