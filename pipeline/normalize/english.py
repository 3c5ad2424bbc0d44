"""English text normalisation: written forms -> the words a person would say.

`normalize_english(text)` runs the rules below in order, each a regular expression whose
match is replaced by spoken words; numbers become words through num2words, and every
other word comes from the tables in tables.py. The order matters: URLs and e-mail
addresses first (their dots and digits are not sentences or numbers), then phone
numbers, dates, times, money, percentages, measures, ordinals, fractions and ranges,
titles and abbreviations, years and plain numbers, and last the symbols.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

from pipeline.normalize import tables

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"


def _plain(words: str) -> str:
    """num2words output without its commas (no pauses inside a number)."""
    return words.replace(",", "")


# Longer whole numbers are read digit by digit (num2words stops below 10^30; nobody says
# a 20-digit number as one).
MAX_CARDINAL_DIGITS = 15


def _whole(number: str) -> str:
    if len(number.lstrip("0")) > MAX_CARDINAL_DIGITS:
        return digits(number)
    return _plain(num2words(int(number or "0")))


def cardinal(number: str) -> str:
    """'1,234.5' -> 'one thousand two hundred and thirty-four point five'."""
    number = number.replace(",", "")
    if "." in number:
        whole, _, fraction = number.partition(".")
        fraction_digits = " ".join(tables.DIGIT_WORDS[int(d)] for d in fraction)
        return f"{_whole(whole)} point {fraction_digits}"
    return _whole(number)


def ordinal(number: int) -> str:
    if number >= 10**MAX_CARDINAL_DIGITS:
        return digits(str(number))
    return _plain(num2words(number, to="ordinal"))


def year(number: int) -> str:
    return _plain(num2words(number, to="year"))


def digits(text: str) -> str:
    return " ".join(tables.DIGIT_WORDS[int(d)] for d in text if d.isdigit())


def spell(text: str) -> str:
    """Letters and digits one by one ('a' is said as the letter, not the article)."""
    out = []
    for char in text:
        if char.isdigit():
            out.append(tables.DIGIT_WORDS[int(char)])
        elif char.isalpha():
            out.append("ay" if char.lower() == "a" else char.lower())
    return " ".join(out)


# --- URLs and e-mail addresses ------------------------------------------------------

_VOWELS = set("aeiouy")


def _read_url_part(part: str) -> str:
    """One run between separators: a word when it looks like one, else spelled."""
    out = []
    for run in re.findall(r"[^\W\d_]+|\d+", part):
        if run.isdigit():
            out.append(cardinal(run) if len(run) <= 4 and run[0] != "0" else digits(run))
        elif run.lower() in tables.SPOKEN_DOMAIN_WORDS:
            out.append(tables.SPOKEN_DOMAIN_WORDS[run.lower()])
        elif (
            len(run) >= 2
            and (run.islower() or run.istitle() or (run.isupper() and len(run) <= 3))
            and set(run.lower()) & _VOWELS
            and len(run) <= 20
        ):
            out.append(run.lower() if not run.isupper() else spell(run))
        else:
            out.append(spell(run))
    return " ".join(out)


def read_address(address: str) -> str:
    """A URL, host name or e-mail address as said aloud: 'example dot com slash docs'."""
    address = re.sub(r"^[a-zA-Z][\w+.-]*://", "", address).rstrip("/")
    words = []
    for token in re.split(r"([./\-_:?=&#~%+@])", address):
        if not token:
            continue
        if token == "@":
            words.append("at")
        elif token in tables.URL_SEPARATORS:
            words.append(tables.URL_SEPARATORS[token])
        else:
            words.append(_read_url_part(token))
    return " " + " ".join(w for w in words if w) + " "


_TLD = r"(?:com|org|net|edu|gov|io|ai|dev|app|co|uk|de|fr|info|biz|us|ca|me|tv)"
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_URL = re.compile(
    r"\b(?:[a-zA-Z][\w+.-]*://|www\.)[^\s<>\"']*[^\s<>\"'.,;:!?)\]]"
    rf"|\b(?:[a-zA-Z0-9-]+\.)+{_TLD}\b(?:/[^\s<>\"']*[^\s<>\"'.,;:!?)\]])?"
)


# --- numbers in context ---------------------------------------------------------------


def _phone(match: re.Match[str]) -> str:
    groups = [g for g in match.groups() if g]
    return ", ".join(digits(g) for g in groups)


def _month_day(month: int, day: int) -> str:
    return f"{tables.MONTHS[month - 1]} {ordinal(day)}"


def _valid_date(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


def _slash_date(match: re.Match[str]) -> str:
    month, day, year_text = int(match["m"]), int(match["d"]), match["y"]
    if not _valid_date(month, day):
        parts = [cardinal(match["m"]), cardinal(match["d"]), _year_or_number_text(year_text)]
        return " slash ".join(parts)
    number = int(year_text) if len(year_text) == 4 else 2000 + int(year_text)
    return f"{_month_day(month, day)}, {year(number)}"


def _iso_date(match: re.Match[str]) -> str:
    month, day = int(match["m"]), int(match["d"])
    if not _valid_date(month, day):
        return match.group()
    return f"{_month_day(month, day)}, {year(int(match['y']))}"


def _month_index(name: str) -> int:
    key = name.lower().rstrip(".")
    for i, month in enumerate(tables.MONTHS, start=1):
        if month.lower() == key:
            return i
    return tables.MONTH_ABBREVIATIONS[key]


_MONTH_NAMES = "|".join([*tables.MONTHS, *(f"{a.title()}\\.?" for a in tables.MONTH_ABBREVIATIONS)])


def _month_name_date(match: re.Match[str]) -> str:
    said = _month_day(_month_index(match["month"]), int(match["day"]))
    return f"{said}, {year(int(match['year']))}" if match["year"] else said


def _day_month_date(match: re.Match[str]) -> str:
    month = tables.MONTHS[_month_index(match["month"]) - 1]
    said = f"{match['the'] or 'the'} {ordinal(int(match['day']))} of {month}"
    return f"{said} {year(int(match['year']))}" if match["year"] else said


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match["h"]), int(match["min"])
    suffix = (match["ampm"] or "").replace(".", "").strip().lower()
    if hour > 24 or minute > 59:
        return match.group()
    if minute == 0:
        said = cardinal(str(hour)) + ("" if suffix or hour > 12 else " o'clock")
        if hour > 12 and not suffix:
            said += " hundred"
    elif minute < 10:
        said = f"{cardinal(str(hour))} oh {cardinal(str(minute))}"
    else:
        said = f"{cardinal(str(hour))} {cardinal(str(minute))}"
    if suffix:
        said += " " + " ".join(suffix.upper())
    return said


def _money_amount(amount: str, names: tuple[str, str, str, str], scale: str | None) -> str:
    one, many, sub_one, sub_many = names
    amount = amount.replace(",", "")
    if scale:
        return f"{cardinal(amount)} {tables.SCALE_WORDS[scale.lower()]} {many}"
    whole, _, cents_text = amount.partition(".")
    units = int(whole or "0")
    cents = int((cents_text + "00")[:2]) if cents_text else 0
    if cents_text and len(cents_text) > 2:
        return f"{cardinal(amount)} {many}"
    parts = []
    if units or not cents:
        parts.append(f"{cardinal(str(units))} {one if units == 1 else many}")
    if cents:
        parts.append(f"{cardinal(str(cents))} {sub_one if cents == 1 else sub_many}")
    return " and ".join(parts)


_SCALES = "|".join(sorted(tables.SCALE_WORDS, key=len, reverse=True))


def _money_symbol(match: re.Match[str]) -> str:
    said = _money_amount(match["amount"], tables.CURRENCY_SYMBOLS[match["symbol"]], match["scale"])
    return f"minus {said}" if match["sign"] else said


def _money_code(match: re.Match[str]) -> str:
    return _money_amount(match["amount"], tables.CURRENCY_CODES[match["code"].lower()], None)


def _percent(match: re.Match[str]) -> str:
    sign = "minus " if match["sign"] else ""
    return f"{sign}{cardinal(match['n'])} percent"


def _unit(match: re.Match[str]) -> str:
    number = match["n"]
    singular, plural = tables.UNITS[match["unit"].lower()]
    is_one = number.replace(",", "") in ("1", "1.0")
    return f"{cardinal(number)} {singular if is_one else plural}"


def _ordinal(match: re.Match[str]) -> str:
    return ordinal(int(match["n"].replace(",", "")))


def _fraction(match: re.Match[str]) -> str:
    numerator, denominator = int(match["a"]), int(match["b"])
    if denominator in tables.FRACTION_DENOMINATORS and 0 < numerator < denominator:
        one, many = tables.FRACTION_DENOMINATORS[denominator]
        return f"{cardinal(str(numerator))} {one if numerator == 1 else many}"
    if 0 < numerator < denominator <= 12:
        name = ordinal(denominator)
        return f"{cardinal(str(numerator))} {name if numerator == 1 else name + 's'}"
    return f"{cardinal(str(numerator))} slash {cardinal(str(denominator))}"


def _range(match: re.Match[str]) -> str:
    return f"{match['a']} to {match['b']}"


def _title(match: re.Match[str]) -> str:
    return tables.TITLES[match["t"].lower()] + " "


def _street(match: re.Match[str]) -> str:
    return f"{match['name']} {tables.STREET_AFTER_NAME}"


def _abbreviation(match: re.Match[str]) -> str:
    """The words; the period stays when it also ends the sentence."""
    said = tables.ABBREVIATIONS[match["a"].lower()]
    return said + "." + match["end"] if match["end"] is not None else said


def _number_sign(match: re.Match[str]) -> str:
    return f"{tables.NUMBER_WORD} {match['n']}"


def _year_or_number_text(text: str) -> str:
    """A year when it looks like one (four digits, 1100-2099), else the number; a code or
    a zero-padded number digit by digit."""
    value = int(text)
    if len(text) == 4 and 1100 <= value <= 2099:
        return year(value)
    if len(text) > 1 and text[0] == "0":
        return digits(text)
    return cardinal(text)


def _year_or_number(match: re.Match[str]) -> str:
    if match["sign"]:
        return "minus " + cardinal(match["n"])
    return _year_or_number_text(match["n"])


def _number(match: re.Match[str]) -> str:
    return ("minus " if match["sign"] else "") + cardinal(match["n"])


def _dotted(match: re.Match[str]) -> str:
    """A version or section number, '3.2.1': each part, 'point' between."""
    return " point ".join(cardinal(part) for part in match.group().split("."))


def _decade(match: re.Match[str]) -> str:
    words = year(int(match["n"]))
    if words.endswith("y"):
        return words[:-1] + "ies"
    return words + "s"


def _alternatives(words: list[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


# Units written right after the number ("5km") are read as units; after a space only
# those that are not also common words or letters ("5 in the box" stays as it is).
_GLUED_UNITS = _alternatives(list(tables.UNITS))
_SPACED_UNITS = _alternatives([u for u in tables.UNITS if u not in tables.UNITS_NEEDING_NO_SPACE])

_WEEKDAYS = _alternatives([day.title() for day in tables.WEEKDAY_ABBREVIATIONS])
_TITLES = _alternatives([title.title() for title in tables.TITLES])

_B = r"(?<![\w.,])"  # a number starts here (not inside a word or another number)
_E = r"(?![\w]|[.,]\d)"  # and ends here

RULES: tuple[Rule, ...] = (
    (_EMAIL, lambda m: read_address(m.group())),
    (_URL, lambda m: read_address(m.group())),
    (
        re.compile(r"(?<![\w+])(?:\+?1[\s.-]?)?\(?(\d{3})\)?[\s.-]?(\d{3})[\s.-](\d{4})\b"),
        _phone,
    ),
    (re.compile(r"(?<![\w+-])(\d{3})-(\d{4})(?![\w-])"), _phone),  # 555-1234
    (re.compile(rf"{_B}(?P<m>\d{{1,2}})/(?P<d>\d{{1,2}})/(?P<y>\d{{4}}|\d{{2}}){_E}"), _slash_date),
    (re.compile(rf"{_B}(?P<y>\d{{4}})-(?P<m>\d{{2}})-(?P<d>\d{{2}}){_E}"), _iso_date),
    (
        re.compile(
            rf"\b(?P<month>{_MONTH_NAMES})\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b"
            r"(?:,?\s+(?P<year>\d{4})\b)?"
        ),
        _month_name_date,
    ),
    (
        re.compile(
            rf"(?:\b(?P<the>[Tt]he)\s+)?{_B}(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?"
            rf"(?P<month>{_MONTH_NAMES})"
            r"(?:,?\s+(?P<year>\d{4})\b)?"
        ),
        _day_month_date,
    ),
    (
        re.compile(
            rf"{_B}(?P<h>\d{{1,2}}):(?P<min>\d{{2}})(?::\d{{2}})?"
            r"(?P<ampm>\s*(?:[AaPp]\.?[Mm]\.?)(?![\w]))?(?!\d)"
        ),
        _time,
    ),
    (
        re.compile(r"\b(?P<h>\d{1,2})(?P<min>)(?P<ampm>\s*(?:[AaPp]\.[Mm]\.|[AaPp][Mm]))(?![\w])"),
        lambda m: _time_hour(m),
    ),
    (
        re.compile(
            rf"(?P<sign>-)?(?P<symbol>[$€£¥₹])\s?(?P<amount>{_NUMBER})"
            rf"(?:\s?(?P<scale>{_SCALES})\b)?"
        ),
        _money_symbol,
    ),
    (
        re.compile(rf"\b(?P<code>USD|EUR|GBP|JPY|INR)\s?(?P<amount>{_NUMBER}){_E}"),
        _money_code,
    ),
    (re.compile(rf"(?<![\w.,])(?P<sign>-)?(?P<n>{_NUMBER})\s?%"), _percent),
    (re.compile(rf"{_B}(?P<n>\d{{4}})'?s\b"), _decade),
    (re.compile(rf"{_B}(?P<n>{_NUMBER})(?P<unit>{_GLUED_UNITS})(?![\w/])", re.IGNORECASE), _unit),
    (
        re.compile(rf"{_B}(?P<n>{_NUMBER})\s(?P<unit>{_SPACED_UNITS})(?![\w/])", re.IGNORECASE),
        _unit,
    ),
    (re.compile(rf"{_B}(?P<n>\d{{1,3}}(?:,\d{{3}})*|\d+)(?:st|nd|rd|th)\b"), _ordinal),
    (re.compile(rf"{_B}\d+(?:\.\d+){{2,}}{_E}"), _dotted),
    (re.compile(rf"{_B}(?P<a>\d{{1,3}})/(?P<b>\d{{1,3}}){_E}"), _fraction),
    (re.compile(rf"{_B}(?P<a>\d+(?:\.\d+)?)\s?[-–](?P<b>\d+(?:\.\d+)?){_E}"), _range),
    (re.compile(r"(?P<name>\b[A-Z][a-z]+)\s+St\.?(?=\W|$)"), _street),
    (
        re.compile(rf"\b(?P<t>{_TITLES})\.?\s+(?=[A-Z])"),
        _title,
    ),
    (re.compile(r"\b(?:No|no|Nr|#)\.?\s?(?P<n>\d+)\b"), _number_sign),
    (
        re.compile(
            r"(?<![\w.])(?P<a>"
            + "|".join(re.escape(a) for a in sorted(tables.ABBREVIATIONS, key=len, reverse=True))
            + r")\.(?!\w)(?P<end>\s+(?=(?-i:[A-Z]))|\s*$)?",
            re.IGNORECASE,
        ),
        _abbreviation,
    ),
    (
        re.compile(
            rf"\b(?P<a>{_alternatives([d.title() for d in tables.WEEKDAY_ABBREVIATIONS])})\.(?!\w)"
        ),
        lambda m: tables.WEEKDAY_ABBREVIATIONS[m["a"].lower()],
    ),
    (re.compile(rf"(?<![\w.,])(?P<sign>-)?(?P<n>\d+){_E}"), _year_or_number),
    (re.compile(rf"(?<![\w.,])(?P<sign>-)?(?P<n>{_NUMBER}){_E}"), _number),
    (re.compile(r"\d+"), lambda m: f" {cardinal(m.group())} "),  # glued to letters: "A4"
)


def _time_hour(match: re.Match[str]) -> str:
    hour = int(match["h"])
    if not 1 <= hour <= 12:
        return match.group()
    suffix = match["ampm"].replace(".", "").strip().upper()
    return f"{cardinal(str(hour))} {' '.join(suffix)}"


num2words(1)  # loads its English module now (~0.2 s), not on the first request


def normalize_english(text: str) -> str:
    for pattern, replace in RULES:
        text = pattern.sub(replace, text)
    return text
