"""The forum generator: short informal user reviews, a second text source for held-out checks,
never used to choose anything.

Where :mod:`cudt.data.text.generated` writes movie reviews in tidy English (long IMDb-like
paragraphs, or mini reviews labelled by a lexicon rule), these are app-store and forum posts
about products: apps, earbuds, games, takeout and robot vacuums. Their label comes from a star
rating (1-2 negative, 4-5 positive), not from a rule on the words, and the text carries it the
way such posts do:

* **informal style**: mostly lowercase, dropped apostrophes (``dont``, ``its``), slang
  (``ngl``, ``tbh``, ``legit``, ``mid``), typos (swapped, dropped, doubled or mistyped letters),
  stretched words (``sooo``), shouting (``WORST``), ``!!!``, ASCII emoticons (``:)``, ``:/``);
* **facts instead of opinion words**: "battery lasts like 2 hours", "delivery took 90 minutes";
* **negation**: "cant complain", "not worth it", "isnt bad at all";
* **sarcasm** in negative posts, marked as posters mark it: "oh great, another update that
  logs me out. love that for me /s";
* **star ratings in the text** ("2/5", "giving it 4 stars", "0 stars if i could"), and edits
  that change the verdict ("EDIT: support fixed it, bumping to 4 stars");
* **mixed aspects**: mild ratings (2 and 4) praise one aspect and pan another more often;
* **label noise**: one post in 25 (p = 0.04) is written for the other end of the scale (a misclicked
  rating: the text pans what the stars praise), so no reader can be right on all of them;
* **odd intensifiers**: "way too" strengthens praise as the other intensifiers do ("way too
  crispy noodles"), which reads as a complaint in English: about 2 % of posts have such a
  clause. Kept, not mended, so the forum numbers in docs/results/text.md stay this
  generator's.

Its word lists are its own: no opinion word is shared with :mod:`cudt.data.text.generated`'s
lexicons (a test checks). :func:`forum_reviews` returns a split and its star ratings;
:func:`write_forum` writes train and test splits in the aclImdb folder layout
(:func:`cudt.data.text.aclimdb.write_aclimdb`, files ``<id>_<2 x stars>.txt``), read back by
``--dataset aclimdb``. ``python -m experiments.held_out_data forum DIR`` does the same from the
command line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cudt.data.text.aclimdb import write_aclimdb
from cudt.data.text.generated import _pick, rated_reviews
from cudt.data.text.tokenized import TextSplit
from cudt.errors import DataError

__all__ = ["forum_review", "forum_reviews", "opinion_words", "write_forum"]

_TAG = 0x464F5255  # "FORU": apart from every stream of generated.py

# Opinion words of this style: single words (a typo or a negator can hit them), general ones
# and each domain's own (a burger is not "laggy").
_GENERAL_POS = (
    "awesome", "legit", "nice", "cool", "stellar", "goated", "clutch", "epic", "fire", "dope",
    "decent", "underrated", "sweet", "neat", "quality",
)  # fmt: skip
_GENERAL_NEG = (
    "trash", "garbage", "useless", "junk", "mid", "meh", "overpriced", "worthless", "rubbish",
    "whack", "horrid", "crappy", "jank", "scammy", "sketchy",
)  # fmt: skip
_TECH_POS = ("smooth", "snappy", "reliable", "responsive", "intuitive", "slick", "speedy", "handy")
_TECH_NEG = ("buggy", "laggy", "janky", "glitchy", "unusable", "bloated", "faulty", "busted")

# Each domain: how posters name the thing, its aspects, and facts that praise or pan it with
# no opinion word ({n} a number).
_DOMAINS = {
    "app": {
        "thing": ("this app", "the app", "the new version", "this update"),
        "pos": _TECH_POS,
        "neg": _TECH_NEG,
        "verdicts": (("telling all my friends to get it.", "5 stars from me."),
                     ("uninstalled.", "deleted my account.")),
        "aspects": ("the ui", "notifications", "dark mode", "sync", "the widget", "login",
                    "search", "the ads", "offline mode", "the settings"),
        "good": ("syncs between my phone and laptop instantly", "opens in like a second",
                 "hasnt crashed once in {n} months", "the widget shows everything i need",
                 "support answered in {n} minutes", "no ads unless you go looking"),
        "bad": ("crashes every time i open the camera", "logs me out every other day",
                "ads pop up every {n} seconds", "drains {m}% battery overnight",
                "lost all my notes after the update", "takes {n} seconds to load a page"),
    },
    "earbuds": {
        "thing": ("these earbuds", "the buds", "these", "this pair"),
        "pos": ("comfy", "sturdy", "crisp", "punchy", "snappy", "reliable"),
        "neg": ("flimsy", "tinny", "muffled", "faulty", "busted", "glitchy"),
        "verdicts": (("buying another pair for my {who}.", "10/10 would buy again."),
                     ("returning them tomorrow.", "refund requested.")),
        "aspects": ("the bass", "noise cancelling", "the mic", "battery life", "the case",
                    "bluetooth", "the fit", "call quality", "the touch controls"),
        "good": ("battery lasts a full {n} hour flight", "they stay in during my runs",
                 "pair with my laptop and phone at once", "cancel out the whole subway",
                 "people on calls say i sound clear"),
        "bad": ("battery lasts like {n} hours", "the left one keeps disconnecting",
                "fall out every time i turn my head", "the case hinge cracked after {n} weeks",
                "everyone on calls says i sound like a robot"),
    },
    "game": {
        "thing": ("this game", "the game", "this season", "the new patch"),
        "pos": ("addictive", "smooth", "polished", "balanced", "responsive", "chill"),
        "neg": ("laggy", "buggy", "grindy", "unbalanced", "janky", "unplayable"),
        "verdicts": (("goty for me.", "see you in game."),
                     ("uninstalled.", "refunded it on steam.")),
        "aspects": ("the graphics", "matchmaking", "the servers", "the grind", "the story",
                    "the controls", "load times", "the soundtrack", "co-op", "the store"),
        "good": ("sunk {m} hours into it and still going", "finds a match in under a minute",
                 "runs at a steady {m} fps on my old laptop", "every boss fight felt different",
                 "no pay to win stuff at all"),
        "bad": ("disconnected {n} times in one evening", "stuck on the loading screen again",
                "everything good is locked behind a {m} dollar pass",
                "froze right before the final boss", "queue times of {m} minutes"),
    },
    "takeout": {
        "thing": ("this place", "the food", "my order", "this spot"),
        "pos": ("tasty", "crispy", "juicy", "generous", "speedy", "friendly"),
        "neg": ("soggy", "greasy", "lukewarm", "rude", "skimpy", "nasty"),
        "verdicts": (("my new go-to.", "ordering again friday."),
                     ("never ordering again.", "asked for a refund.")),
        "aspects": ("the fries", "the burger", "delivery", "portions", "the staff",
                    "prices", "packaging", "the sauce", "the noodles"),
        "good": ("arrived hot in {m} minutes", "portions last me two meals",
                 "they remembered my allergy note", "the driver called when he got lost",
                 "been ordering every friday for {n} months"),
        "bad": ("took {m} minutes and arrived cold", "half my order was missing",
                "charged me {n} dollars for extra sauce", "the bag was leaking all over",
                "found a hair in the rice"),
    },
    "vacuum": {
        "thing": ("this vacuum", "the robot", "this thing", "my new vac"),
        "pos": ("handy", "quiet", "thorough", "reliable", "sturdy", "efficient"),
        "neg": ("clueless", "noisy", "flimsy", "faulty", "busted", "dumb"),
        "verdicts": (("buying another one for my {who}.", "10/10 would buy again."),
                     ("returning it tomorrow.", "refund requested.")),
        "aspects": ("suction", "the app", "mapping", "the dock", "the noise level",
                    "the brushes", "battery", "obstacle detection", "the mop"),
        "good": ("picks up all the dog hair", "cleans the whole flat on one charge",
                 "goes back to the dock by itself every time", "maps {n} rooms without help",
                 "quiet enough to run at night"),
        "bad": ("gets stuck under the couch every day", "ate {n} phone chargers already",
                "the app loses the map after every update", "dies after {m} minutes",
                "just spins in circles in the hallway"),
    },
}  # fmt: skip

_STRONG = ("super", "really", "so", "hella", "crazy", "mad", "way too", "insanely")
_MILD = ("kinda", "pretty", "a bit", "somewhat", "lowkey", "fairly")
_OPENERS = (
    "ok so", "been using {thing} for {n} {span}.", "long time lurker, first review.",
    "bought {thing} on sale.", "my {who} got me {thing}.", "second time trying {thing}.",
    "quick review:", "gonna keep this short.", "so i finally caved and tried {thing}.",
)  # fmt: skip
_FILLERS = ("ngl", "tbh", "imo", "honestly", "lol", "fr", "idk", "lowkey", "btw")
_WHO = ("sister", "bf", "gf", "roommate", "dad", "coworker", "kid")
_SPANS = ("days", "weeks", "months")
# Verdicts of every domain (each domain adds its own: "uninstalled" is for apps and games).
_POS_VERDICTS = (
    "would recommend.", "worth it.", "keeper.", "no regrets.", "take my money.",
    "cant complain.", "does the job.", "highly recommend!!", "100% worth the price.",
)  # fmt: skip
_NEG_VERDICTS = (
    "save your money.", "never again.", "dont bother.", "stay away.", "not worth it.",
    "total ripoff.", "back to my old one.",
)  # fmt: skip
_SARCASM = (
    "oh great, {fact}. love that for me /s",
    "wow, {fact}. amazing job guys /s",
    "{fact}. 10/10 experience, truly.",
    "yeah right, {fact}. just what i needed",
    "thanks a lot, {fact} :)",
    "cool cool cool, {fact}. very cool.",
)
_EMOTICONS_POS = (":)", ":D", "<3", "xD", ":-)")
_EMOTICONS_NEG = (":(", ":/", ">:(", ":-(", "-_-")
_QWERTY = "qwertyuiop asdfghjkl zxcvbnm"


def opinion_words() -> tuple[frozenset[str], frozenset[str]]:
    """The positive and negative opinion words of every domain (for checks on the data)."""
    pos = set(_GENERAL_POS).union(*(d["pos"] for d in _DOMAINS.values()))
    neg = set(_GENERAL_NEG).union(*(d["neg"] for d in _DOMAINS.values()))
    return frozenset(pos), frozenset(neg)


def _stars(rating: int, rng: np.random.Generator) -> str:
    if rating == 1 and rng.random() < 0.3:
        return "would give 0 stars if i could."
    form = _pick(rng, ("{r}/5.", "{r} stars.", "giving it {r} stars.", "{r} out of 5."))
    return form.format(r=rating).replace("1 stars", "1 star")


def _be(noun: str, singular: str = "is", plural: str = "are") -> str:
    """``noun is`` or ``nouns are``: plural when it ends in s (not "the bass") or is "these"."""
    many = noun == "these" or (noun.endswith("s") and not noun.endswith("ss"))
    return f"{noun} {plural if many else singular}"


def _words(dom: dict, polarity: int) -> tuple[str, ...]:
    return (_GENERAL_POS + dom["pos"]) if polarity > 0 else (_GENERAL_NEG + dom["neg"])


def _opinion(rng: np.random.Generator, polarity: int, dom: dict, fill: dict) -> str:
    """One clause about an aspect (or a fact) whose sense is ``polarity``."""
    aspect = _pick(rng, dom["aspects"])
    form = rng.random()
    if form < 0.3:  # a fact, no opinion word
        return _pick(rng, dom["good" if polarity > 0 else "bad"]).format(**fill)
    if form < 0.5:  # a negated word of the other sense
        word = _pick(rng, _words(dom, -polarity))
        if polarity > 0:
            return _pick(
                rng,
                (
                    f"{_be(aspect, 'isnt', 'arent')} {word} at all",
                    f"{_be(aspect)} not {word}",
                    f"no complaints about {aspect}",
                    f"never had {aspect} act up",
                ),
            )
        return _pick(
            rng,
            (
                f"{_be(aspect)} not {word}",
                f"{_be(aspect, 'isnt', 'arent')} exactly {word}",
                f"wouldnt call {aspect} {word}",
                f"{_be(aspect)} far from {word}",
            ),
        )
    word = _pick(rng, _words(dom, polarity))
    degree = rng.random()
    if degree < 0.35:
        word = f"{_pick(rng, _STRONG)} {word}"
    elif degree < 0.5:
        word = f"{_pick(rng, _MILD)} {word}"
    return _pick(
        rng,
        (
            f"{_be(aspect)} {word}",
            f"{aspect} = {word}",
            f"{word} {aspect.removeprefix('the ')}",
            f"{_be(aspect, 'feels', 'feel')} {word}",
            f"{_be(fill['thing'])} {word}",
        ),
    )


def _typo(rng: np.random.Generator, word: str) -> str:
    """A swapped, dropped, doubled or neighbouring-key letter (not the first or last)."""
    i = int(rng.integers(1, len(word) - 1))
    kind = rng.random()
    if kind < 0.3:
        return word[: i - 1] + word[i] + word[i - 1] + word[i + 1 :]
    if kind < 0.55:
        return word[:i] + word[i + 1 :]
    if kind < 0.75:
        return word[:i] + word[i] + word[i:]
    row = next((r for r in _QWERTY.split() if word[i] in r), None)
    if row is None:
        return word
    k = row.index(word[i])
    near = row[k - 1] if k and (k == len(row) - 1 or rng.random() < 0.5) else row[k + 1]
    return word[:i] + near + word[i + 1 :]


def _style(rng: np.random.Generator, text: str, polarity: int) -> str:
    """Informal surface: typos, stretched and shouted words, ``!!!``, emoticons, case."""
    opinion = frozenset().union(*opinion_words())
    typo_rate = rng.uniform(0.0, 0.06)
    stretch = rng.random() < 0.2
    shout = rng.random() < 0.15
    words = text.split(" ")
    for i, w in enumerate(words):
        core = w.strip(".,!?:/=")
        if len(core) >= 4 and core.isalpha() and rng.random() < typo_rate:
            words[i] = w.replace(core, _typo(rng, core), 1)
        elif stretch and core in opinion | {"so", "really"} and core[-1] in "aeiouy":
            words[i] = w.replace(core, core + core[-1] * int(rng.integers(2, 5)), 1)
            stretch = False
        elif shout and core in opinion:
            words[i] = w.upper()
            shout = False
    text = " ".join(words)
    if rng.random() < 0.15:
        text = text.rstrip(".") + "!!!"
    if rng.random() < 0.25:
        text += " " + _pick(rng, _EMOTICONS_POS if polarity > 0 else _EMOTICONS_NEG)
    if rng.random() < 0.55:
        text = text.lower()
    else:
        text = text[:1].upper() + text[1:]
    return text


def forum_review(rng: np.random.Generator, rating: int) -> str:
    """One post of ``rating`` stars (1, 2: negative; 4, 5: positive); see :func:`forum_reviews`."""
    label = 1 if rating >= 4 else -1
    agree = 0.85 if rating in (1, 5) else 0.6  # mild ratings mix their aspects more often
    misclick = rng.random() < 0.04  # a post written for the other end of the scale
    if misclick:
        label = -label
    dom = _DOMAINS[_pick(rng, tuple(_DOMAINS))]
    fill = {
        "thing": _pick(rng, dom["thing"]),
        "n": int(rng.integers(2, 13)),
        "m": int(rng.integers(20, 96)),
        "span": _pick(rng, _SPANS),
        "who": _pick(rng, _WHO),
    }
    sentences = []
    if rng.random() < 0.45:
        sentences.append(_pick(rng, _OPENERS).format(**fill))
    edit = rating in (2, 4) and not misclick and rng.random() < 0.12  # a verdict changed later
    body = -label if edit else label
    clauses = []
    for _ in range(int(rng.integers(1, 4))):
        clause = _opinion(rng, body if rng.random() < agree else -body, dom, fill)
        if rng.random() < 0.2:
            clause = f"{_pick(rng, _FILLERS)} {clause}"
        clauses.append(clause)
    text = clauses[0]
    for clause in clauses[1:]:
        text += _pick(rng, (". ", ", ", " and ", "! ")) + clause
    sentences.append(text + _pick(rng, (".", ".", "!", "")))
    if body < 0 and rng.random() < 0.3:
        fact = _pick(rng, dom["bad"]).format(**fill)
        sentences.append(_pick(rng, _SARCASM).format(fact=fact))
    if not edit and not misclick and rating == 4 and rng.random() < 0.15:
        sentences.append(f"would be 5 stars but {_pick(rng, dom['bad']).format(**fill)}.")
    elif not edit and rng.random() < 0.6:
        verdicts = (_POS_VERDICTS, _NEG_VERDICTS)[label < 0] + dom["verdicts"][label < 0]
        sentences.append(_pick(rng, verdicts).format(**fill))
    if not edit and not misclick and rng.random() < 0.25:
        sentences.append(_stars(rating, rng))
    if edit:
        why = _pick(rng, dom["good" if label > 0 else "bad"]).format(**fill)
        move = "bumping" if label > 0 else "dropping"
        sentences.append(f"EDIT: {why} now, {move} it to {rating} stars.")
    return _style(rng, " ".join(sentences), label)


def forum_reviews(
    num_examples: int, *, seed: int = 0, stream: int = 0
) -> tuple[TextSplit, np.ndarray]:
    """Generated forum posts about products and their star ratings ``[N]`` (1, 2, 4 or 5).

    NOT real reviews: a second generator in another style than :mod:`cudt.data.text.generated`
    (see the module docstring), for held-out checks. Example ``i`` has label ``i % 2``
    (balanced) and rating 1 or 2 (label 0) or 4 or 5 (label 1); it depends only on
    ``(seed, stream, i)``.
    """

    def rate(rng, positive):
        return int(_pick(rng, (4, 5) if positive else (1, 2)))

    return rated_reviews("forum_reviews", num_examples, seed, stream, _TAG, rate, forum_review)


def write_forum(root: str | Path, *, train: int = 2000, test: int = 400, seed: int = 0) -> Path:
    """``train`` and ``test`` posts (streams 0 and 1 of :func:`forum_reviews`) in the aclImdb
    layout ``root/aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt``, the rating on aclImdb's
    1-10 scale (twice the stars: 2, 4, 8, 10); returns the ``aclImdb`` folder (a ``--data-dir``
    for ``--dataset aclimdb``)."""
    if train < 2 or test < 2:
        raise DataError(
            f"write_forum needs at least 2 train and 2 test posts (one of each label), got "
            f"{train} and {test}: pass larger counts"
        )
    train_split, train_stars = forum_reviews(train, seed=seed, stream=0)
    test_split, test_stars = forum_reviews(test, seed=seed, stream=1)
    return write_aclimdb(root, train_split, test_split, ratings=(2 * train_stars, 2 * test_stars))
