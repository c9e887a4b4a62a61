"""The Porter stemmer as NLTK's `PorterStemmer()` applies it by default (its NLTK_EXTENSIONS mode), which
LoCoMo's official QA score stems every token with (memrl.rewards.locomo). Written from the published
algorithm (M. F. Porter, 1980) and the points where NLTK's default mode departs from it:

- a handful of irregular forms map to fixed stems (skies / sky -> sky, dying -> die, lying -> lie,
  tying -> tie, innings -> inning, outings -> outing, cannings -> canning; news, howe, proceed, exceed,
  succeed stay);
- words of one or two letters are not stemmed;
- step 1a: a four-letter word in -ies becomes -ie (ties -> tie); step 1b: -ied becomes -ie in a four-letter
  word, else -i;
- step 1c: y -> i only after a consonant that is not the word's first letter;
- a two-letter stem vowel + consonant counts as *o (the cvc test of step 1b / 5a);
- step 2: -alli -> -al is tried first and the result goes through step 2 again; -bli -> -ble (not
  -abli -> -able); also -fulli -> -ful and -logi -> -log (measured with the l).

No dependency: `stem("running") == "run"`. Input is lowercased first, as NLTK does.
"""

from __future__ import annotations

from collections.abc import Callable

_IRREGULAR = {"skies": "sky", "sky": "sky", "dying": "die", "lying": "lie", "tying": "tie", "news": "news",
              "innings": "inning", "inning": "inning", "outings": "outing", "outing": "outing",
              "cannings": "canning", "canning": "canning", "howe": "howe", "proceed": "proceed",
              "exceed": "exceed", "succeed": "succeed"}
_VOWELS = frozenset("aeiou")
Rule = tuple[str, str, Callable[[str], bool] | None]


def _consonant(word: str, i: int) -> bool:
    c = word[i]
    if c in _VOWELS:
        return False
    if c == "y":
        return i == 0 or not _consonant(word, i - 1)
    return True


def measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in `stem`."""
    pattern = "".join("c" if _consonant(stem, i) else "v" for i in range(len(stem)))
    return pattern.count("vc")


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _consonant(word, len(word) - 1)


def _cvc(word: str) -> bool:
    n = len(word)
    if n >= 3:
        return (_consonant(word, n - 3) and not _consonant(word, n - 2) and _consonant(word, n - 1)
                and word[-1] not in "wxy")
    return n == 2 and not _consonant(word, 0) and _consonant(word, 1)


def _positive(stem: str) -> bool:
    return measure(stem) > 0


def _apply(word: str, rules: list[Rule]) -> str:
    """The first rule whose suffix `word` ends with decides: its replacement when its condition holds on the
    stem, else the word unchanged. The suffix "*d" means a double consonant (its stem drops both letters)."""
    for suffix, replacement, condition in rules:
        if suffix == "*d":
            if _double_consonant(word):
                stem = word[:-2]
                return stem + replacement if condition is None or condition(stem) else word
            continue
        if word.endswith(suffix):
            stem = word[: len(word) - len(suffix)]
            return stem + replacement if condition is None or condition(stem) else word
    return word


def _step1a(word: str) -> str:
    if word.endswith("ies") and len(word) == 4:
        return word[:-3] + "ie"
    return _apply(word, [("sses", "ss", None), ("ies", "i", None), ("ss", "ss", None), ("s", "", None)])


def _step1b(word: str) -> str:
    if word.endswith("ied"):
        return word[:-3] + ("ie" if len(word) == 4 else "i")
    if word.endswith("eed"):
        stem = word[:-3]
        return stem + "ee" if measure(stem) > 0 else word
    for suffix in ("ed", "ing"):
        if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
            mid = word[: -len(suffix)]
            break
    else:
        return word
    return _apply(mid, [("at", "ate", None), ("bl", "ble", None), ("iz", "ize", None),
                        ("*d", mid[-1], lambda stem: mid[-1] not in "lsz"),
                        ("", "e", lambda stem: measure(stem) == 1 and _cvc(stem))])


def _step1c(word: str) -> str:
    return _apply(word, [("y", "i", lambda stem: len(stem) > 1 and _consonant(stem, len(stem) - 1))])


def _step2(word: str) -> str:
    if word.endswith("alli") and _positive(word[:-4]):
        return _step2(word[:-4] + "al")
    rules: list[Rule] = [(s, r, _positive) for s, r in (
        ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
        ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"), ("ization", "ize"),
        ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"),
        ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("fulli", "ful"))]
    rules.append(("logi", "log", lambda stem: _positive(word[:-3])))
    return _apply(word, rules)


def _step3(word: str) -> str:
    return _apply(word, [(s, r, _positive) for s, r in (
        ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""),
        ("ness", ""))])


def _m_gt_1(stem: str) -> bool:
    return measure(stem) > 1


def _step4(word: str) -> str:
    rules: list[Rule] = [(s, "", _m_gt_1) for s in (
        "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent")]
    rules.append(("ion", "", lambda stem: measure(stem) > 1 and stem[-1] in "st"))
    rules += [(s, "", _m_gt_1) for s in ("ou", "ism", "ate", "iti", "ous", "ive", "ize")]
    return _apply(word, rules)


def _step5a(word: str) -> str:
    if word.endswith("e"):
        stem = word[:-1]
        m = measure(stem)
        if m > 1 or (m == 1 and not _cvc(stem)):
            return stem
    return word


def _step5b(word: str) -> str:
    return _apply(word, [("ll", "l", lambda stem: measure(word[:-1]) > 1)])


def stem(word: str) -> str:
    """`word`'s Porter stem (lowercased), as NLTK's default PorterStemmer gives it."""
    w = word.lower()
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if len(w) <= 2:
        return w
    for step in (_step1a, _step1b, _step1c, _step2, _step3, _step4, _step5a, _step5b):
        w = step(w)
    return w
