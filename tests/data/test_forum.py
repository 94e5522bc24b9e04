"""The forum generator (cudt/data/text/forum.py): a second review source for held-out checks.

Its posts, how they differ from the movie reviews of cudt/data/text/generated.py (measured), that
their stars carry a learnable but imperfect signal, and the aclImdb layout read back by the real
reader (``--dataset aclimdb``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cudt.data.text import generated as movie
from cudt.data.text import imdb_like_reviews, load_text_data, synthetic_sentiment
from cudt.data.text.forum import forum_reviews, opinion_words, write_forum
from cudt.errors import DataError


def test_forum_reviews_are_deterministic_balanced_and_rated():
    split, stars = forum_reviews(60, seed=2)
    again, _ = forum_reviews(61, seed=2)
    assert split.texts == again.texts[:60]  # post i depends on (seed, stream, i) only
    assert split.texts != forum_reviews(60, seed=3)[0].texts
    assert split.texts != forum_reviews(60, seed=2, stream=1)[0].texts
    assert split.labels.tolist() == [i % 2 for i in range(60)]
    assert set(stars[split.labels == 1]) == {4, 5} and set(stars[split.labels == 0]) == {1, 2}
    with pytest.raises(DataError, match="non-negative"):
        forum_reviews(3, seed=-1)


def _words(texts) -> set[str]:
    return {w for t in texts for w in re.findall(r"[a-z']+", t.lower())}


def test_forum_posts_are_short_informal_and_worded_apart_from_the_movie_reviews():
    posts, _ = forum_reviews(400, seed=0)
    words = [len(t.split()) for t in posts.texts]
    assert all(t.isascii() for t in posts.texts) and np.median(words) < 30 and max(words) < 80
    share = lambda pattern: np.mean([bool(re.search(pattern, t)) for t in posts.texts])  # noqa: E731
    assert share(r" /s\b") > 0.02  # sarcasm, marked
    assert share(r"\b\d ?stars?\b|\d/5|out of 5") > 0.1  # ratings in the text
    assert share(r"(?i)\bedit:") > 0.02  # a verdict changed later
    assert share(r":\)|:\(|:/|<3|:D|xD|-_-") > 0.1  # ASCII emoticons
    assert 0.3 < np.mean([t == t.lower() for t in posts.texts]) < 0.8
    # No opinion word in common with the movie generators' lexicons, few words at all.
    pos, neg = opinion_words()
    movie_lexicon = set(movie._REVIEW_POS) | set(movie._REVIEW_NEG) | set(movie._LEXICON)
    assert not (pos | neg) & movie_lexicon and not pos & neg
    imdb_like = _words(imdb_like_reviews(400, seed=0)[0].texts)
    forum = _words(posts.texts)
    jaccard = len(forum & imdb_like) / len(forum | imdb_like)
    between_movies = _words(synthetic_sentiment(400).texts)
    movies = len(imdb_like & between_movies) / len(imdb_like | between_movies)
    assert jaccard < 0.15 and jaccard < movies / 2, (jaccard, movies)


def test_the_stars_are_learnable_from_the_words_but_not_trivially():
    """A Bernoulli naive Bayes on word presence, fitted on 1,000 posts, scored on 400 others."""
    train, _ = forum_reviews(1000, seed=0)
    test, _ = forum_reviews(400, seed=0, stream=1)
    vocab = sorted(_words(train.texts))
    index = {w: i for i, w in enumerate(vocab)}

    def presence(texts):
        x = np.zeros((len(texts), len(vocab)))
        for row, text in enumerate(texts):
            x[row, [index[w] for w in _words([text]) if w in index]] = 1.0
        return x

    x, y = presence(train.texts), train.labels
    p1 = (x[y == 1].sum(0) + 1) / ((y == 1).sum() + 2)
    p0 = (x[y == 0].sum(0) + 1) / ((y == 0).sum() + 2)
    xt = presence(test.texts)
    score = xt @ np.log(p1 / p0) + (1 - xt) @ np.log((1 - p1) / (1 - p0))
    accuracy = float(np.mean((score > 0) == test.labels))
    assert 0.7 < accuracy < 0.97, accuracy


def test_write_forum_is_read_back_by_the_aclimdb_reader(tmp_path):
    top = write_forum(tmp_path, train=40, test=20, seed=1)
    assert top == tmp_path / "aclImdb"
    names = sorted(p.name for p in (top / "train" / "pos").glob("*.txt"))
    _, stars = forum_reviews(40, seed=1)
    assert names == sorted(f"{i}_{2 * stars[i]}.txt" for i in range(1, 40, 2))  # 8 or 10
    data = load_text_data("aclimdb", tmp_path, num_train=None, num_test=None, val_fraction=0.25)
    assert (len(data.train), len(data.val), len(data.test)) == (30, 10, 20)
    assert data.test.labels.sum() == 10 and data.label_names == ("neg", "pos")
    assert set(data.test.texts) == set(forum_reviews(20, seed=1, stream=1)[0].texts)
    with pytest.raises(DataError, match="at least 2 train"):
        write_forum(tmp_path / "x", train=1)
