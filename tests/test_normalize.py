"""The English normaliser, case by case: written input -> the words that are said."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import NormalizeConfig
from pipeline.normalize import (
    StreamNormalizer,
    normalize_text,
    normalizer_for,
    speakable,
)
from scheduling.errors import ConfigError

CASES = [
    # cardinals, negatives, decimals
    ("I have 3 cats.", "I have three cats."),
    ("0 items", "zero items"),
    ("He is 42.", "He is forty-two."),
    ("It has 101 rooms", "It has one hundred and one rooms"),
    (
        "1,234,567 people",
        "one million two hundred and thirty-four thousand five hundred and sixty-seven people",
    ),
    ("It was -5 outside", "It was minus five outside"),
    ("pi is 3.14", "pi is three point one four"),
    ("0.5 of it", "zero point five of it"),
    ("Boeing 747", "Boeing seven hundred and forty-seven"),
    ("Agent 007", "Agent zero zero seven"),
    ("A4 paper", "A four paper"),
    ("version 3.2.1 is out", "version three point two point one is out"),
    ("Section 4.1.", "Section four point one."),
    ("12345", "twelve thousand three hundred and forty-five"),
    ("10000 steps", "ten thousand steps"),
    # ordinals
    ("the 1st place", "the first place"),
    ("the 2nd time", "the second time"),
    ("the 3rd day", "the third day"),
    ("the 4th wall", "the fourth wall"),
    ("his 21st birthday", "his twenty-first birthday"),
    ("the 103rd floor", "the one hundred and third floor"),
    # money
    ("$3.50", "three dollars and fifty cents"),
    ("$1", "one dollar"),
    ("$0.99", "ninety-nine cents"),
    ("$100", "one hundred dollars"),
    ("$1,000,000", "one million dollars"),
    ("$5m", "five million dollars"),
    ("$2.5 billion", "two point five billion dollars"),
    ("€1.01", "one euro and one cent"),
    ("€20", "twenty euros"),
    ("£5", "five pounds"),
    ("£0.01", "one penny"),
    ("¥500", "five hundred yen"),
    ("USD 500", "five hundred dollars"),
    ("a loss of -$20", "a loss of minus twenty dollars"),
    # percentages
    ("25% off", "twenty-five percent off"),
    ("3.5% interest", "three point five percent interest"),
    ("100 %", "one hundred percent"),
    ("-2% growth", "minus two percent growth"),
    # dates
    ("12/05/2024", "December fifth, twenty twenty-four"),
    ("1/2/2023", "January second, twenty twenty-three"),
    ("7/4/76", "July fourth, twenty seventy-six"),
    ("2024-01-15", "January fifteenth, twenty twenty-four"),
    ("Jan. 5, 2024", "January fifth, twenty twenty-four"),
    ("March 3rd", "March third"),
    ("December 25, 1999", "December twenty-fifth, nineteen ninety-nine"),
    ("on 3 March 2021", "on the third of March twenty twenty-one"),
    ("the 4th of July", "the fourth of July"),
    ("Sept 9", "September ninth"),
    ("13/45/2024", "thirteen slash forty-five slash twenty twenty-four"),
    # years and decades
    ("in 1999", "in nineteen ninety-nine"),
    ("in 2024", "in twenty twenty-four"),
    ("in 2000", "in two thousand"),
    ("in 2008", "in two thousand and eight"),
    ("in 1905", "in nineteen oh-five"),
    ("the 1990s", "the nineteen nineties"),
    ("the 1980's", "the nineteen eighties"),
    # times
    ("at 3:45 PM", "at three forty-five P M"),
    ("at 3:00", "at three o'clock"),
    ("at 9:05 am", "at nine oh five A M"),
    ("at 15:30", "at fifteen thirty"),
    ("at 15:00", "at fifteen hundred"),
    ("at 7pm", "at seven P M"),
    ("at 10 a.m. sharp", "at ten A M sharp"),
    ("12:00:00", "twelve o'clock"),
    # phone numbers
    ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
    ("Call 555-123-4567", "Call five five five, one two three, four five six seven"),
    ("Call +1 555 123 4567", "Call five five five, one two three, four five six seven"),
    ("555.123.4567", "five five five, one two three, four five six seven"),
    ("dial 555-1234", "dial five five five, one two three four"),
    ("COVID-19 cases", "COVID-nineteen cases"),
    ("from 2019-2021", "from twenty nineteen to twenty twenty-one"),
    # titles and abbreviations
    ("Dr. Smith", "Doctor Smith"),
    ("Mr. Jones and Mrs. Jones", "Mister Jones and Missus Jones"),
    ("Ms. Lee", "Miz Lee"),
    ("Prof. Xavier", "Professor Xavier"),
    ("St. Louis", "Saint Louis"),
    ("Main St. is busy", "Main Street is busy"),
    ("Mt. Everest", "Mount Everest"),
    ("Martin Luther King Jr. spoke", "Martin Luther King Junior spoke"),
    ("apples, pears, etc. Then more", "apples, pears, et cetera. Then more"),
    ("fruit, e.g. apples", "fruit, for example apples"),
    ("one thing, i.e. this", "one thing, that is this"),
    ("cats vs. dogs", "cats versus dogs"),
    ("approx. 5 people", "approximately five people"),
    ("Acme Inc. is big", "Acme Incorporated is big"),
    ("No. 5", "number five"),
    ("#7 on the list", "number seven on the list"),
    ("Mon. and Fri.", "Monday and Friday"),
    ("the dr. said", "the dr. said"),
    # units
    ("5 km away", "five kilometers away"),
    ("1 km away", "one kilometer away"),
    ("3 kg of flour", "three kilograms of flour"),
    ("2 lbs", "two pounds"),
    ("6ft tall", "six feet tall"),
    ("12in wide", "twelve inches wide"),
    ("5 in the box", "five in the box"),
    ("100 mph", "one hundred miles per hour"),
    ("60 km/h", "sixty kilometers per hour"),
    ("a 5°C day", "a five degrees Celsius day"),
    ("98.6°F", "ninety-eight point six degrees Fahrenheit"),
    ("16 GB of RAM", "sixteen gigabytes of RAM"),
    ("2.4 GHz", "two point four gigahertz"),
    ("500ms later", "five hundred milliseconds later"),
    ("30 min", "thirty min"),
    ("30min", "thirty minutes"),
    # fractions and ranges
    ("1/2 cup", "one half cup"),
    ("3/4 done", "three quarters done"),
    ("2/3 left", "two thirds left"),
    ("5/8 inch", "five eighths inch"),
    ("pages 10-20", "pages ten to twenty"),
    ("24/7", "twenty-four slash seven"),
    # URLs and e-mail
    ("Visit https://example.com today.", "Visit example dot com today."),
    (
        "Visit https://example.com/docs/getting-started now",
        "Visit example dot com slash docs slash getting dash started now",
    ),
    ("www.example.org", "w w w dot example dot org"),
    ("see github.com/openai", "see github dot com slash openai"),
    ("Mail john.smith@example.com now", "Mail john dot smith at example dot com now"),
    ("help@acme.io", "help at acme dot io"),
    ("http://x.co/aB3", "x dot co slash ay b three"),
    (
        "https://example.com/page?id=42",
        "example dot com slash page question mark id equals forty-two",
    ),
    # symbols and emoji
    ("Tom & Jerry", "Tom and Jerry"),
    ("2 + 2 = 4", "two plus two equals four"),
    ("x > 3", "x greater than three"),
    ("Party 🎉 time!", "Party time!"),
    ("Great job 👍🏽", "Great job"),
    ("👨‍👩‍👧 family", "family"),
    ("🇺🇸 flag", "flag"),
    ("I ❤️ it", "I it"),
    ("**bold** and _it_", "bold and it"),
    ("a → b", "a b"),
    ("© 2024 Acme™", "twenty twenty-four Acme"),
    ("½ a cup", "one half a cup"),
    ("it’s fine", "it's fine"),
    # the sentence, whole
    (
        "Dr. Smith paid $3.50 on 12/05/2024 at 3:45 PM",
        "Doctor Smith paid three dollars and fifty cents on December fifth, twenty twenty-four "
        "at three forty-five P M",
    ),
    # nothing changes in plain text
    ("The quick brown fox.", "The quick brown fox."),
    ("  spaced   out  ", "spaced out"),
]


@pytest.mark.parametrize(("written", "spoken"), CASES, ids=[c[0] for c in CASES])
def test_english_case(written: str, spoken: str) -> None:
    assert normalize_text(written, "en_US") == spoken


def test_there_are_at_least_a_hundred_cases() -> None:
    assert len(CASES) >= 100


def test_normalising_twice_changes_nothing() -> None:
    normalize = normalizer_for("en_US")
    assert normalize is not None
    for _, spoken in CASES:
        assert normalize(spoken) == spoken, spoken


def test_off_by_config_and_other_languages_only_lose_symbols() -> None:
    off = NormalizeConfig(enabled=False)
    assert normalize_text("Dr. Smith paid $3.50 🎉", "en_US", off) == "Dr. Smith paid $3.50 🎉"
    assert normalize_text("Il a payé 3,50 € 🎉", "fr_FR") == "Il a payé 3,50"
    no_english = NormalizeConfig(languages=())
    assert normalize_text("$3 🎉", "en-GB", no_english) == "3"
    assert normalize_text("$3 🎉", "en-GB") == "three dollars"


def test_config_names_the_bad_field() -> None:
    with pytest.raises(ConfigError, match="languages: no normalisation rules for 'xx'"):
        NormalizeConfig(languages=("xx",))
    with pytest.raises(ConfigError, match="enabled"):
        NormalizeConfig(enabled="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("...", False), ("🎉🎉", False), ("?! — …", False), ("a", True), ("7", True)],
)
def test_speakable_after_normalisation(text: str, expected: bool) -> None:
    assert speakable(normalize_text(text, "en")) is expected


def test_symbols_count_as_speakable_when_normalisation_is_off() -> None:
    # espeak reads an emoji by its name, so with the normaliser off it is speech
    assert speakable("🎉")
    assert not speakable("... !")


def test_a_stream_in_pieces_reads_like_the_whole() -> None:
    text = (
        "Dr. Smith paid $3.50 on 12/05/2024 at 3:45 PM. Then he called (555) 123-4567 "
        "and wrote to john.smith@example.com about the 3rd invoice of $1,200.75 on Jan. 5, 2024."
    )
    normalize = normalizer_for("en")
    assert normalize is not None
    for size in (1, 3, 7, 20):
        stream = StreamNormalizer(normalize)
        out = "".join(stream.push(text[i : i + size]) for i in range(0, len(text), size))
        out += stream.flush()
        assert out.split() == normalize(text).split(), size


def test_a_stream_releases_text_before_it_ends() -> None:
    stream = StreamNormalizer(normalizer_for("en") or str)
    assert stream.push("It costs $5") == ""  # may still grow ("$5 million")
    assert stream.push(" today. And") == "It costs five dollars today. "
    words = " ".join(["word"] * 12) + " "
    assert stream.push(" " + words).split() == ["And"] + ["word"] * 8
    assert stream.flush().split() == ["word"] * 4


def test_the_knobs_load_from_yaml_env_and_set_with_errors_naming_the_field(tmp_path: Path) -> None:
    from app.settings import SettingsError, load_settings

    path = tmp_path / "c.yaml"
    path.write_text("normalize:\n  enabled: false\ntext:\n  first_segment_chars: 40\n")
    settings = load_settings(
        path,
        ["text.max_segment_phonemes=250"],
        environ={"PLAYHEAD_NORMALIZE__LANGUAGES": "[]"},
    )
    assert settings.normalize == NormalizeConfig(enabled=False, languages=())
    assert settings.text.first_segment_chars == 40
    assert settings.text.max_segment_phonemes == 250
    assert load_settings(None, environ={}).normalize == NormalizeConfig(True, ("en",))
    with pytest.raises(SettingsError, match=r"normalize.*languages.*'de'"):
        load_settings(None, ["normalize.languages=[de]"], environ={})
    with pytest.raises(SettingsError, match="max_segment_phonemes must be an integer >= 20"):
        load_settings(None, ["text.max_segment_phonemes=5"], environ={})
