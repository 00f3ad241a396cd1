"""Sentence splitting for BERT's pre-training data: raw document text -> a list of sentences.

google-research/bert's ``create_pretraining_data.py`` reads one sentence per line ("actual sentences, not entire
paragraphs"), since NSP cuts segments at sentence boundaries; real corpora come as paragraphs.

Rules of our own, because NLTK's Punkt downloads ``punkt_tab`` at run time and pysbd 0.3.4 is slow (8 s/MB),
super-linear and breaks at every hard wrap. These run in linear time on the standard library, the same everywhere,
so the data is reproducible byte for byte. A wrong boundary only moves the A/B cut point; it loses no text.

Our departure: text without sentence punctuation is one giant "sentence", which the reference truncates to one
example, losing the rest. A sentence over ``MAX_SENTENCE_CHARS`` is cut into pieces of at most
``SENTENCE_PIECE_CHARS`` instead (``max_sentence_chars=None``: the reference's behaviour).
"""

from __future__ import annotations

import re

__all__ = [
    "ABBREVIATIONS",
    "MAX_SENTENCE_CHARS",
    "SENTENCE_END_CHARS",
    "SENTENCE_PIECE_CHARS",
    "bound_sentences",
    "cut_long_sentence",
    "looks_like_binary",
    "split_sentences",
]

#: A "sentence" longer than this many characters is cut into pieces (the module's departure).
MAX_SENTENCE_CHARS = 1_000
#: Longest piece of a cut sentence, in characters.
SENTENCE_PIECE_CHARS = 250
#: Punctuation that can end a sentence (Latin script and full-width CJK).
SENTENCE_END_CHARS = ".!?\u2026\u3002\uff01\uff1f"

#: Words that are followed by a period without ending a sentence (compared lower-cased, without the period).
#: Only abbreviations that almost never end a sentence are listed: "etc." or "Inc." often do.
ABBREVIATIONS: frozenset[str] = frozenset(
    """
    mr mrs ms mssrs messrs dr prof rev revd fr sr jr st mt ft gen col capt cpt lt sgt maj adm cmdr gov sen
    rep hon pres supt insp det cf vs viz approx fig figs eq eqs no nos vol vols ch chap sec pp p op art ed
    eds esq dept univ assn bros corp ltd co jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)

# Blank line (possibly holding spaces): a paragraph break.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")
_LINE_BREAK = re.compile(r"\n")
_WHITESPACE = re.compile(r"\s+")
# Candidate sentence end: terminal punctuation, optional closing quotes or brackets, one space, a non-space.
# The look-behind anchors a match at the start of a punctuation run: linear on a line of 100,000 periods.
_CANDIDATE = re.compile(r"(?<![.!?\u2026])([.!?\u2026]+)[\"'\u201d\u2019)\]]* (?=\S)")
# Full-width terminal punctuation (CJK) ends a sentence without a following space.
_CJK_END = re.compile(r"[\u3002\uff01\uff1f]+[\u300d\u300f\u201d\u2019\uff09]*")
_OPENERS = "\"'\u201c\u2018([{"
# Control characters other than white space, private-use code points, and U+FFFD (left by decoding non-UTF-8).
_JUNK = re.compile("[\x00-\x08\x0e-\x1f\x7f\ufffd\ue000-\uf8ff]")


def split_sentences(
    text: str, *, split_lines: bool = False, max_sentence_chars: int | None = MAX_SENTENCE_CHARS
) -> list[str]:
    """One document's sentences, white space runs collapsed to one space, no empty strings.

    A blank line ends a sentence; single line breaks are hard wrapping unless ``split_lines`` (one paragraph per
    line, as in Wikipedia dumps). Sentences over ``max_sentence_chars`` are cut (``None``: never, as the reference).
    """
    if not text:
        return []
    pattern = _LINE_BREAK if split_lines else _PARAGRAPH_BREAK
    sentences: list[str] = []
    for paragraph in pattern.split(text):
        paragraph = _WHITESPACE.sub(" ", paragraph).strip()
        if paragraph:
            sentences.extend(_split_paragraph(paragraph))
    return sentences if max_sentence_chars is None else bound_sentences(sentences, max_sentence_chars)[0]


def bound_sentences(sentences: list[str], max_sentence_chars: int = MAX_SENTENCE_CHARS) -> tuple[list[str], int]:
    """``(sentences, cut)``: each sentence over ``max_sentence_chars`` replaced by its pieces, and how many were."""
    if all(len(s) <= max_sentence_chars for s in sentences):
        return sentences, 0
    bounded: list[str] = []
    cut = 0
    for sentence in sentences:
        if len(sentence) > max_sentence_chars:
            bounded.extend(cut_long_sentence(sentence))
            cut += 1
        else:
            bounded.append(sentence)
    return bounded, cut


def cut_long_sentence(sentence: str, piece_chars: int = SENTENCE_PIECE_CHARS) -> list[str]:
    """Pieces of at most ``piece_chars`` characters, cut at the last space within reach (dropped), else in a word."""
    if piece_chars < 1:
        raise ValueError(f"piece_chars must be at least 1, got {piece_chars}")
    pieces: list[str] = []
    start, n = 0, len(sentence)
    while n - start > piece_chars:
        cut = sentence.rfind(" ", start + 1, start + piece_chars + 1)
        if cut == -1:
            pieces.append(sentence[start : start + piece_chars])
            start += piece_chars
        else:
            pieces.append(sentence[start:cut])
            start = cut + 1
        while start < n and sentence[start] == " ":
            start += 1
    if start < n:
        pieces.append(sentence[start:])
    return pieces


def _split_paragraph(paragraph: str) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in _CANDIDATE.finditer(paragraph):
        if _is_boundary(paragraph, start, match):
            pieces.append(paragraph[start : match.end() - 1])
            start = match.end()
    pieces.append(paragraph[start:])
    return [s for piece in pieces for s in _split_cjk(piece)]


def _is_boundary(paragraph: str, sentence_start: int, match: re.Match[str]) -> bool:
    """Whether the candidate ``match`` (terminal punctuation + space) really ends a sentence."""
    if not _starts_like_sentence(paragraph, match.end()):
        return False
    if match.group(1) != ".":
        return True  # "!", "?", "...", "?!": a boundary whenever a capital or digit follows.
    return not _is_abbreviation(_word_before(paragraph, sentence_start, match.start()))


def _starts_like_sentence(paragraph: str, position: int) -> bool:
    """Opening quotes or brackets, then a digit or a letter that is not lower-case (or of a script without case)."""
    end = min(len(paragraph), position + 8)
    while position < end and paragraph[position] in _OPENERS:
        position += 1
    if position >= len(paragraph):
        return False
    first = paragraph[position]
    return first.isdigit() or (first.isalpha() and not first.islower())


def _word_before(paragraph: str, sentence_start: int, period: int) -> str:
    word_start = paragraph.rfind(" ", sentence_start, period) + 1
    if word_start == 0:
        word_start = sentence_start
    return paragraph[word_start:period].lstrip(_OPENERS)


def _is_abbreviation(word: str) -> bool:
    """Initials ("J."), dotted acronyms ("U.S.", "e.g.") and listed abbreviations ("Mr.") end no sentence."""
    if len(word) == 1 and word.isalpha():
        return True
    if "." in word and any(c.isalpha() for c in word):
        return True
    return word.lower() in ABBREVIATIONS


def _split_cjk(piece: str) -> list[str]:
    """Chinese and Japanese put no space after full-width terminal punctuation."""
    if not _CJK_END.search(piece):
        return [piece] if piece else []
    out: list[str] = []
    start = 0
    for match in _CJK_END.finditer(piece):
        out.append(piece[start : match.end()])
        start = match.end()
    out.append(piece[start:])
    return [s.strip() for s in out if s.strip()]


def looks_like_binary(text: str, max_junk_share: float = 0.05) -> bool:
    """Whether ``text`` looks like decoded binary data: a NUL, or over ``max_junk_share`` of ``_JUNK`` characters."""
    if "\x00" in text:
        return True
    if not text:
        return False
    return len(_JUNK.findall(text)) > max_junk_share * len(text)
