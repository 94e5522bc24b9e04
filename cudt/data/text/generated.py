"""Generated English text for the text experiments: no download, deterministic in the seed.

* :func:`synthetic_sentiment`: mini movie reviews whose binary label follows from their content by
  the rule in :func:`synthetic_sentiment_score` (negation, intensifiers, contrast clauses, neutral
  filler);
* :func:`imdb_like_reviews`: long reviews in the style of IMDb's (Zipf-distributed opinion words,
  negation, mixed reviews), for runs in the aclImdb folder layout
  (:func:`cudt.data.text.aclimdb.write_aclimdb`).

The word lists of both generators live here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = [
    "imdb_like_review",
    "imdb_like_reviews",
    "synthetic_sentiment",
    "synthetic_sentiment_score",
]


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
    """One of ``options``, drawn uniformly (every text generator's one-choice draw)."""
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
    """An opinion of sign ``polarity``: an opinion word of that sign, or (25 %) a negated word
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
    * sentiment sits in 3-6 aspect opinions and (85 %) a closing verdict, each one opinion word
      from a lexicon of 76 positive and 76 negative words drawn with Zipf weights, so most
      opinion words are rare;
    * 25 % of opinions are negated ("not bad", "far from perfect");
    * mixed reviews: an aspect opinion agrees with the label with probability 0.65 + 0.3·s,
      ``s`` = 1 for ratings 1 and 10 and 1/3 for 4 and 7, so mild reviews are often mixed and
      some are genuinely ambiguous (no model reaches 100 %).

    A bag-of-words logistic regression trained on 1,800 of them scores about 0.75 on held-out
    ones (``tests/tasks/test_text_learns.py`` computes one); example ``i`` depends only on
    ``(seed, stream, i)``.
    """

    def rate(rng, positive):
        return int(rng.integers(7, 11) if positive else rng.integers(1, 5))

    def write(rng, rating):
        return imdb_like_review(rng, rating, short=short)

    return rated_reviews("imdb_like_reviews", num_examples, seed, stream, 7, rate, write)


def rated_reviews(
    name: str,
    num_examples: int,
    seed: int,
    stream: int,
    tag: int,
    rate: Callable[[np.random.Generator, bool], int],
    write: Callable[[np.random.Generator, int], str],
) -> tuple[TextSplit, np.ndarray]:
    """The reviews of a rated-review generator ``name`` and their ratings ``[N]``: example ``i``
    has label ``i % 2`` (balanced), and from ``np.random.default_rng([seed, stream, i, tag])``
    a rating ``rate(rng, label == 1)``, then its text ``write(rng, rating)``."""
    if num_examples < 0 or seed < 0 or stream < 0:
        raise DataError(
            f"{name} needs num_examples, seed and stream >= 0, got {num_examples}, "
            f"{seed} and {stream}: pass non-negative values"
        )
    labels = np.arange(num_examples, dtype=np.int32) % 2
    texts, ratings = [], []
    for i in range(num_examples):
        rng = np.random.default_rng([seed, stream, i, tag])
        rating = rate(rng, bool(labels[i]))
        texts.append(write(rng, rating))
        ratings.append(rating)
    return TextSplit(texts=tuple(texts), pairs=None, labels=labels), np.asarray(ratings)
