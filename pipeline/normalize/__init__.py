"""Text normalisation: what people write -> what the phonemiser can read aloud.

`normalizer_for(language, config)` gives the function for a voice's language ("en_US"
and "en" both pick the English rules): for a language with rules (English, in
english.py) numbers, money, dates, times, units, abbreviations, URLs and symbols become
words; every language gets the language-neutral clean-up (emoji, pictographs and other
symbols that carry no words are dropped, markup characters become spaces, whitespace runs
become one space, runs of one character and very long tokens are bounded: tokens.py);
a language written without spaces (Japanese, Chinese) keeps its long "tokens" (they are
sentences) and its currency signs (its phonemiser reads them).
`speakable(text)` tells whether anything is left to say.

`StreamNormalizer` applies a normaliser to text that arrives in pieces (a live stream):
it holds back the end of the text until a sentence ends, or until enough words follow,
so that a date or a sum split across two pieces is still read as one.

`normalize_mapped` and `StreamNormalizer` return a `SpokenText` (pipeline/alignment.py):
a str that also says which span of the written text each spoken character stands for
(mapping.py), so that the engine times the text as the client sent it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from pipeline.alignment import SpokenText
from pipeline.config import NormalizeConfig
from pipeline.normalize import tables
from pipeline.normalize.mapping import map_spans
from pipeline.normalize.tokens import bound_tokens, normalize_english_bounded

Normalizer = Callable[[str], str]

# Languages with rules, by their two-letter code.
# Links, e-mail addresses and other long tokens are read short (tokens.py).
LANGUAGE_RULES: dict[str, Normalizer] = {"en": normalize_english_bounded}

_DROPPED_CATEGORIES = frozenset({"So", "Sk", "Sm", "Sc", "Co", "Cn", "Cs", "Cf"})
_DROPPED = frozenset(tables.DROPPED_PUNCTUATION)
_SELECTORS = re.compile("[\ufe00-\ufe0f\u20e3\U000e0000-\U000e01ef]")
_SPACES = re.compile(r"\s+")
_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "\u00a0": " "})


def language_code(language: str) -> str:
    """'en_US', 'en-gb', 'EN' -> 'en'."""
    return re.split(r"[_-]", language.strip().lower(), maxsplit=1)[0]


def drop_symbols(
    text: str, words: dict[str, str] | None = None, keep: frozenset[str] = frozenset()
) -> str:
    """Symbols become their words (`words`) or go (except those in `keep`); markup becomes
    a space."""
    text = _SELECTORS.sub("", text)
    out = []
    for char in text:
        if char in keep:
            out.append(char)
        elif words and char in words:
            out.append(f" {words[char]} ")
        elif char in _DROPPED or unicodedata.category(char) in _DROPPED_CATEGORIES:
            out.append(" ")
        else:
            out.append(char)
    return "".join(out)


def clean(text: str) -> str:
    """The language-neutral part: quotes unified, symbols dropped, whitespace collapsed."""
    text = bound_tokens(unicodedata.normalize("NFC", text).translate(_QUOTES))
    return _SPACES.sub(" ", drop_symbols(text)).strip()


# Languages written without spaces between words (the Japanese and Chinese voices): a
# "long token" is a sentence, never cut; their phonemisers read a currency sign before its
# number (pipeline/backends/kokoro/japanese.py), so it stays.
_UNSPACED = frozenset({"ja", "zh"})
_CURRENCY_SIGNS = frozenset("¥￥$＄")


def clean_unspaced(text: str) -> str:
    """`clean` for a language written without spaces: no token is cut, currency signs stay."""
    text = bound_tokens(unicodedata.normalize("NFC", text).translate(_QUOTES), long_tokens=False)
    return _SPACES.sub(" ", drop_symbols(text, keep=_CURRENCY_SIGNS)).strip()


def _with_rules(rules: Normalizer) -> Normalizer:
    def normalize(text: str) -> str:
        text = unicodedata.normalize("NFC", text).translate(_QUOTES)
        text = rules(bound_tokens(text, keep_addresses=True))  # the rules read addresses
        text = drop_symbols(text, tables.SYMBOL_WORDS)
        return _SPACES.sub(" ", text).strip()

    return normalize


def normalizer_for(language: str, config: NormalizeConfig | None = None) -> Normalizer | None:
    """The normaliser for a voice language, or None when normalisation is off."""
    config = config or NormalizeConfig()
    if not config.enabled:
        return None
    code = language_code(language)
    if code in config.languages and code in LANGUAGE_RULES:
        return _with_rules(LANGUAGE_RULES[code])
    return clean_unspaced if code in _UNSPACED else clean


def normalize_text(text: str, language: str, config: NormalizeConfig | None = None) -> str:
    """`text` normalised for a voice of `language` (as it is when normalisation is off)."""
    normalize = normalizer_for(language, config)
    return normalize(text) if normalize is not None else text


def mapped(written: str, normalize: Normalizer | None) -> SpokenText:
    """`written` normalised by `normalize` (as it is for None), with its map."""
    if normalize is None:
        return SpokenText.verbatim(written)
    spoken = normalize(written)
    return SpokenText(spoken, written, map_spans(written, spoken))


def normalize_mapped(text: str, language: str, config: NormalizeConfig | None = None) -> SpokenText:
    """`normalize_text`, as a SpokenText whose source is `text` (for a stream's alignment)."""
    return mapped(text, normalizer_for(language, config))


# What a Japanese voice can read (OpenJTalk): kana, kanji, Latin letters (by their names)
# and digits; another script (Arabic, Cyrillic...) it reads as nothing.
_JAPANESE_READABLE = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff10-\uff19\uff21-\uff3a"
    "\uff41-\uff5a\uff66-\uff9fA-Za-z0-9]"
)


def speakable(text: str, language: str | None = None) -> bool:
    """Whether `text` has anything to say: a letter, a digit, or (normalisation off) a
    symbol that the phonemiser reads by its name; for a Japanese voice (`language`), a
    character of a script it reads."""
    if language is not None and language_code(language) == "ja":
        return _JAPANESE_READABLE.search(text) is not None
    return any(char.isalnum() or unicodedata.category(char) == "So" for char in text)


# A release point: a sentence end followed by a capital, or a blank line.
# A sentence end: its punctuation, then space and a capital, or space at the end of the text
# so far (a live text's finished sentence speaks at once; an abbreviation's or an initial's
# period is not an end, see _release_point).
_SENTENCE_END = re.compile(r"(?P<word>\S*?)[.!?…]+[\"')\]]*\s+(?=[\"'(]?[A-Z]|$)|\n\s*\n")
_NOT_SENTENCE_ENDS = frozenset(
    [
        *tables.TITLES,
        *tables.ABBREVIATIONS,
        *tables.MONTH_ABBREVIATIONS,
        *tables.WEEKDAY_ABBREVIATIONS,
        "no",
    ]
)


def _release_point(text: str) -> int:
    """Index just after the last sentence end of `text` that is not an abbreviation's
    period ("Dr. Smith", "Jan. 5") nor an initial ("J. Doe"); 0 when none."""
    cut = 0
    for match in _SENTENCE_END.finditer(text):
        word = (match["word"] or "").lower()
        if word in _NOT_SENTENCE_ENDS or (len(word) == 1 and word.isalpha()):
            continue
        cut = match.end()
    return cut


HOLD_WORDS = 4  # words kept back at the end of unfinished text: the longest rule's reach


class StreamNormalizer:
    """A normaliser for text given in pieces: `push` returns the normalised text that is
    settled (up to the last sentence end, or all but the last HOLD_WORDS words), `flush`
    the rest. Each returned piece ends with a space unless it is empty or the last.

    Each piece is a SpokenText whose source is the written text it settled (even when
    nothing in it is said): the sources of the pieces, in order, are exactly the text
    pushed, so the engine's offsets are offsets into everything the client sent."""

    def __init__(self, normalize: Normalizer) -> None:
        self._normalize = normalize
        self._buffer = ""

    def push(self, text: str) -> SpokenText:
        self._buffer += text
        cut = _release_point(self._buffer)
        spaces = [m.start() for m in re.finditer(r"\s+", self._buffer[cut:].rstrip())]
        if len(spaces) >= 2 * HOLD_WORDS:
            cut += spaces[-HOLD_WORDS]
        if cut == 0:
            return SpokenText("", "", ())
        settled, self._buffer = self._buffer[:cut], self._buffer[cut:]
        said = mapped(settled, self._normalize)
        if not said:
            return said
        return said + SpokenText(" ", "", ((len(settled), len(settled)),))

    def flush(self) -> SpokenText:
        rest, self._buffer = self._buffer, ""
        return mapped(rest, self._normalize)


__all__ = [
    "LANGUAGE_RULES",
    "Normalizer",
    "StreamNormalizer",
    "clean",
    "language_code",
    "mapped",
    "normalize_mapped",
    "normalize_text",
    "normalizer_for",
    "speakable",
]
