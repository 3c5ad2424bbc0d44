"""Long tokens read as a person reads them aloud: links, e-mail addresses, runs of one
character, and any other very long token.

Nobody reads a link's 1,000-character path or 4,096 repetitions of a letter aloud, and
a voice asked to takes minutes of audio (and its first segment, all of that, is slow to
start: a text-to-speech talker encodes a whole segment before its first frame).

- `bound_tokens(text, keep_addresses=...)`, for every language, before any other rule:
  a run of one character longer than MAX_RUN becomes MAX_RUN of it ("éééé…" -> "ééé",
  "!!!!!!" -> "!!!"; a digit only past MAX_DIGIT_RUN, where no number is read as one:
  "1000000" keeps its zeros); then a token (a run of non-space characters) longer than
  MAX_TOKEN_CHARS keeps its first MAX_TOKEN_CHARS characters, except, with
  `keep_addresses`, a link or an e-mail address (the language's address rules bound
  those).
- `read_addresses(text)`, English: a link is read as its host and at most a short rest
  ("https://example.com/docs" -> "example dot com slash docs"): the rest after the host
  (path, query, fragment) whole when it has at most MAX_REST_CHARS characters, else only
  its first path segments that look like words or short numbers, at most
  MAX_PATH_SEGMENTS of them within MAX_REST_CHARS, and never its query; a host keeps its
  last MAX_HOST_LABELS labels, each at most MAX_LABEL_CHARS characters (its first parts
  between . _ - that fit). An e-mail address: its local part likewise, "at", its host.
  The words themselves come from english.read_address (words, else spelled).

The normaliser's offset map (mapping.py) needs nothing from these rules: what they say
for a token replaces that token, so the words said stand for the token's whole span.
"""

from __future__ import annotations

import re

from pipeline.normalize import english

MAX_RUN = 3  # one character repeated: at most this many
MAX_DIGIT_RUN = 15  # one digit repeated: longer runs (no number a person reads) -> MAX_RUN
MAX_TOKEN_CHARS = 48  # longer tokens keep this many characters (longest English words fit)
MAX_REST_CHARS = 24  # a link's path, query and fragment: read whole up to this long
MAX_PATH_SEGMENTS = 2  # a longer rest: at most this many of its first path segments
MAX_HOST_LABELS = 4  # a host's last labels read ("docs.python.org": three)
MAX_LABEL_CHARS = 24  # characters read of one host label or an e-mail's local part

_RUN = re.compile(rf"([^\d\s])\1{{{MAX_RUN},}}")
_DIGIT_RUN = re.compile(rf"(\d)\1{{{MAX_DIGIT_RUN},}}")
_LONG_TOKEN = re.compile(rf"\S{{{MAX_TOKEN_CHARS + 1},}}")
_SCHEME = re.compile(r"^[a-zA-Z][\w+.-]*://")
# a path segment said when the rest is long: a word (hyphens, an extension) or a number
_SAID_SEGMENT = re.compile(r"[A-Za-z][A-Za-z_-]*(?:\.[A-Za-z]{1,5})?|\d{1,4}")


def _is_address(token: str) -> bool:
    return bool(english._URL.search(token) or english._EMAIL.search(token) or _SCHEME.match(token))


def bound_tokens(text: str, *, keep_addresses: bool = False, long_tokens: bool = True) -> str:
    """Runs of one character collapsed and long tokens cut (see the module doc).
    `long_tokens` False: no token is cut (text written without spaces, as Japanese: a
    token is then a whole sentence)."""
    text = _RUN.sub(lambda m: m.group(1) * MAX_RUN, text)
    text = _DIGIT_RUN.sub(lambda m: m.group(1) * MAX_RUN, text)
    if not long_tokens:
        return text

    def cut(match: re.Match[str]) -> str:
        token = match.group()
        if keep_addresses and _is_address(token):
            return token
        return token[:MAX_TOKEN_CHARS]

    return _LONG_TOKEN.sub(cut, text)


def _first_parts(text: str, max_chars: int) -> str:
    """The leading parts of `text` (split at . _ -) that fit in `max_chars`; at least the
    first part's first `max_chars` characters."""
    if len(text) <= max_chars:
        return text
    kept = ""
    for match in re.finditer(r"[^._-]+|[._-]", text):
        if len(kept) + len(match.group()) > max_chars:
            break
        kept += match.group()
    return kept.rstrip("._-") or text[:max_chars]


def _short_host(host: str) -> str:
    labels = host.split(".")[-MAX_HOST_LABELS:]
    return ".".join(_first_parts(label, MAX_LABEL_CHARS) for label in labels)


def _short_rest(rest: str) -> str:
    """What is said of a link after its host: all of a short rest, else its first
    word-like path segments."""
    if len(rest) <= MAX_REST_CHARS:
        return rest
    said = ""
    for segment in re.split(r"[?#]", rest, maxsplit=1)[0].split("/")[1:]:
        if (
            not _SAID_SEGMENT.fullmatch(segment)
            or said.count("/") == MAX_PATH_SEGMENTS
            or len(said) + 1 + len(segment) > MAX_REST_CHARS
        ):
            break
        said += "/" + segment
    return said


def read_link(url: str) -> str:
    """A link as said aloud: its host and at most a short path."""
    address = _SCHEME.sub("", url)
    split = re.search(r"[/?#]", address)
    host, rest = (address[: split.start()], address[split.start() :]) if split else (address, "")
    host = host.rpartition("@")[2]  # user:password@ is not said
    host = re.sub(r":\d+$", "", host)  # nor a port
    return english.read_address(_short_host(host) + _short_rest(rest))


def read_email(address: str) -> str:
    local, _, host = address.rpartition("@")
    return english.read_address(f"{_first_parts(local, MAX_LABEL_CHARS)}@{_short_host(host)}")


def read_addresses(text: str) -> str:
    """English: e-mail addresses, then links, read as the module doc says."""
    text = english._EMAIL.sub(lambda m: read_email(m.group()), text)
    return english._URL.sub(lambda m: read_link(m.group()), text)


def normalize_english_bounded(text: str) -> str:
    """The English rules, addresses read short (this module's) before all the others."""
    return english.normalize_english(read_addresses(text))
