"""Recall scorers over past memories, with values computed by hand in the comments."""

from __future__ import annotations

import math

import pytest

from memrl.workflows.recall import (
    Recalled,
    bm25_scores,
    recall_top1,
    score,
    tfidf_scores,
    word_overlap_scores,
    words,
)


def test_words_are_lowercase_word_runs():
    assert words("Red-Apple, 3 PIES!\nx_y") == ["red", "apple", "3", "pies", "x_y"]
    assert words("") == []


def test_tfidf_cosine_matches_sklearn_defaults_by_hand():
    # docs "a b", "b c c"; N = 2; df: a=1, b=2, c=1
    # smooth idf: a = c = ln(3/2) + 1 = 1.4054651081, b = ln(3/3) + 1 = 1
    # doc0 = (a 1.40547, b 1) / sqrt(1.40547^2 + 1) = / 1.7249150
    # doc1 = (b 1, c 2*1.40547 = 2.8109302) / sqrt(1 + 2.81093^2) = / 2.9835089
    # query "a c" = (a 1.40547, c 1.40547) -> unit (1/sqrt2, 1/sqrt2)
    # cos0 = (1/sqrt2) * 1.40547 / 1.72492 = 0.5761524
    # cos1 = (1/sqrt2) * 2.81093 / 2.98351 = 0.6662046
    got = tfidf_scores("a c", ["a b", "b c c"])
    assert got == pytest.approx([0.5761524, 0.6662046], abs=1e-6)


def test_tfidf_ignores_query_words_outside_the_memories_and_refits_per_call():
    # "zzz" is not in the fitted vocabulary: the query vector is just "a"
    assert tfidf_scores("a zzz", ["a b", "c"]) == pytest.approx(tfidf_scores("a", ["a b", "c"]))
    # a query with no known word scores 0 everywhere
    assert tfidf_scores("zzz", ["a b", "c"]) == [0.0, 0.0]
    # refit: with one doc idf is constant (ln(2/2)+1 = 1), "a b" vs query "a": 1/sqrt(2)
    assert tfidf_scores("a", ["a b"]) == pytest.approx([1 / math.sqrt(2)])


def test_word_overlap_is_recall_of_query_words():
    # query words {red, apple, pie}; "the red apple" has 2 of 3; "Pie!" has 1 of 3
    assert word_overlap_scores("red apple pie", ["the red apple", "Pie!"]) == pytest.approx([2 / 3, 1 / 3])
    # repeated query words count once: {a} found -> 1.0
    assert word_overlap_scores("a a a", ["a"]) == [1.0]
    assert word_overlap_scores("", ["a"]) == [0.0]


def test_bm25_by_hand_with_k1_and_b():
    # docs "a b" (dl 2), "a a c" (dl 3); N = 2, avgdl = 2.5; k1 = 1.2, b = 0.75
    # idf(a) = ln(1 + (2-2+0.5)/(2+0.5)) = ln 1.2 = 0.1823216; idf(c) = ln(1 + 1.5/1.5) = ln 2 = 0.6931472
    # doc0: K = 1.2*(0.25 + 0.75*2/2.5) = 1.02; a: 0.1823216 * 1*2.2/(1+1.02) = 0.1985680
    # doc1: K = 1.2*(0.25 + 0.75*3/2.5) = 1.38; a: 0.1823216 * 2*2.2/(2+1.38) = 0.2373415
    #       c: 0.6931472 * 1*2.2/(1+1.38) = 0.6407244; total 0.8780660
    got = bm25_scores("a c", ["a b", "a a c"], k1=1.2, b=0.75)
    assert got == pytest.approx([0.1985680, 0.8780660], abs=1e-6)
    # b = 0 drops length normalization: doc1 a: 0.1823216 * 2*2.2/(2+1.2) = 0.2506922
    assert bm25_scores("a", ["a b", "a a c"], k1=1.2, b=0.0)[1] == pytest.approx(0.2506922, abs=1e-6)
    with pytest.raises(ValueError, match="k1 >= 0 and 0 <= b <= 1"):
        bm25_scores("a", ["a"], k1=1.2, b=2.0)


def test_unknown_scorer_is_named():
    with pytest.raises(ValueError, match="unknown recall scorer 'dense'"):
        score("a", ["a"], "dense")


def test_top1_returns_text_step_and_score():
    mems = [(0, "the sky is blue"), (1, "grass is green"), (2, "the sea is blue and deep")]
    got = recall_top1("green grass", mems, scorer="word_overlap")
    assert got == Recalled("grass is green", 1, 1.0)


def test_top1_ties_go_to_the_most_recent_memory_and_duplicates_collapse():
    # both memories contain "blue" (overlap 1.0): the later one wins
    got = recall_top1("blue", [(0, "blue sky"), (1, "blue sea")], scorer="word_overlap")
    assert got is not None and got.step == 1
    # identical texts are one candidate, credited to the latest step that wrote it
    got = recall_top1("blue", [(0, "blue"), (3, "blue")], scorer="tfidf")
    assert got is not None and (got.text, got.step) == ("blue", 3)


def test_top1_nothing_in_common_or_no_candidates_recalls_nothing():
    assert recall_top1("zebra", [(0, "blue sky")], scorer="tfidf") is None
    assert recall_top1("zebra", [(0, "blue sky")], scorer="bm25") is None
    assert recall_top1("blue", [], scorer="tfidf") is None
    assert recall_top1("  ", [(0, "blue")], scorer="tfidf") is None
    # min_score: overlap 1/2 is not above 0.5
    assert recall_top1("blue red", [(0, "blue")], scorer="word_overlap", min_score=0.5) is None


class ThreeCharPieces:
    """A stand-in for a byte-level BPE tokenizer: each word cut into 3-character pieces, the first piece
    of every word after the first marked with "Ġ" (the space mark), as GPT-2 / Qwen tokenizers show it."""

    def tokenize(self, text: str) -> list[str]:
        out = []
        for n, word in enumerate(text.split(" ")):
            pieces = [word[i:i + 3] for i in range(0, len(word), 3)]
            out += [("Ġ" if n and k == 0 else "") + p for k, p in enumerate(pieces)]
        return out


def test_released_terms_are_the_tokenizers_pieces_without_the_space_mark():
    from memrl.workflows.recall import subword_terms

    terms = subword_terms(ThreeCharPieces())
    # lowercased first: "Paris Is" -> pieces "par", "is", "Ġis" -> "Ġ" removed
    assert terms("Paris Is") == ["par", "is", "is"]


def test_released_tfidf_on_subword_pieces_by_hand():
    """syr-cn/ReMemR1 @ 43e69f38, recurrent/impls/tf_idf_retriever.py TfidfRetriever: sklearn's
    TfidfVectorizer(tokenizer=<the policy's pieces, "Ġ" removed>), cosine, top 1 of np.argsort."""
    from memrl.workflows.recall import subword_terms

    mems = [(0, "paris is big"), (1, "rome")]
    # memrl's words: "parisian" is no memory's word -> every score 0 -> nothing recalled (min_score 0)
    assert recall_top1("parisian", mems, scorer="tfidf") is None
    # released pieces: "parisian" -> par, isi, an; "paris is big" -> par, is, is, big; "rome" -> rom, e.
    # N = 2, every term in one memory: idf = ln(3/2) + 1 for all, so it cancels in the cosine. Query
    # vector = par alone (isi, an unknown); memory 0 = (par 1, is 2, big 1) -> cos = 1 / sqrt(1 + 4 + 1)
    # = 1/sqrt(6) = 0.4082483; memory 1 shares nothing: 0.
    got = recall_top1("parisian", mems, scorer="tfidf", rule="released", tokenize=subword_terms(ThreeCharPieces()))
    assert got is not None and (got.text, got.step) == ("paris is big", 0)
    assert got.score == pytest.approx(1 / math.sqrt(6), abs=1e-7)


def test_released_candidates_and_tie_order():
    # A query sharing no term with any memory: every score 0, recalled only with min_score below 0.
    mems = [(0, ""), (1, "red"), (2, "blue")]
    # memrl: the empty memory is no candidate; the tie between "red" and "blue" goes to the latest, step 2
    got = recall_top1("green", mems, scorer="tfidf", min_score=-1.0)
    assert got is not None and (got.text, got.step) == ("blue", 2)
    # released: "" is a candidate (score 0). The stand-in for the set order sorts by SHA-256 digest:
    # sha256("blue") = 16477688..., sha256("red") = b1f51a51..., sha256("") = e3b0c442... -> the last tied
    # candidate is "" (step 0)
    got = recall_top1("green", mems, scorer="tfidf", min_score=-1.0, rule="released")
    assert got is not None and (got.text, got.step, got.score) == ("", 0, 0.0)
    # without the empty memory: order blue, red -> "red" (step 1), where memrl says "blue"
    got = recall_top1("green", mems[1:], scorer="tfidf", min_score=-1.0, rule="released")
    assert got is not None and (got.text, got.step) == ("red", 1)
    # no candidate has a term (sklearn: "empty vocabulary", caught): nothing, whatever min_score says
    assert recall_top1("green", [(0, ""), (1, "")], scorer="tfidf", min_score=-1.0, rule="released") is None
    # a blank query is still a query there ("  " is truthy), but has no term: score 0 -> min_score decides
    assert recall_top1("  ", [(0, "red")], scorer="tfidf", rule="released") is None
    got = recall_top1("  ", [(0, "red")], scorer="tfidf", min_score=-1.0, rule="released")
    assert got is not None and got.text == "red"
    with pytest.raises(ValueError, match="recall rule must be one of memrl, released"):
        recall_top1("a", [(0, "a")], rule="sklearn")
