"""The word tables of the English normaliser: what each abbreviation, unit, currency,
symbol and month is called when it is said aloud. Rules in english.py look words up here."""

from __future__ import annotations

# Titles before a name ("Dr. Smith"): the period is optional.
TITLES = {
    "mr": "Mister",
    "mrs": "Missus",
    "ms": "Miz",
    "dr": "Doctor",
    "prof": "Professor",
    "rev": "Reverend",
    "hon": "Honorable",
    "gen": "General",
    "capt": "Captain",
    "lt": "Lieutenant",
    "sgt": "Sergeant",
    "gov": "Governor",
    "sen": "Senator",
    "rep": "Representative",
    "pres": "President",
    "st": "Saint",
    "mt": "Mount",
    "ft": "Fort",
}

# Abbreviations written with their period, read the same anywhere (lower-cased key,
# without the final period).
ABBREVIATIONS = {
    "e.g": "for example",
    "i.e": "that is",
    "etc": "et cetera",
    "vs": "versus",
    "approx": "approximately",
    "appt": "appointment",
    "dept": "department",
    "est": "established",
    "jr": "Junior",
    "sr": "Senior",
    "inc": "Incorporated",
    "ltd": "Limited",
    "corp": "Corporation",
    "co": "Company",
    "ave": "Avenue",
    "blvd": "Boulevard",
    "rd": "Road",
    "ln": "Lane",
    "hwy": "Highway",
    "apt": "apartment",
    "min": "minutes",
    "max": "maximum",
    "tel": "telephone",
    "fig": "figure",
    "cf": "compare",
    "a.m": "A M",
    "p.m": "P M",
    "u.s": "U S",
    "u.k": "U K",
    "ph.d": "P H D",
}
# "St." after a name is Street; "No." before a number is "number".
STREET_AFTER_NAME = "Street"
NUMBER_WORD = "number"

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
MONTH_ABBREVIATIONS = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "sept": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}
WEEKDAY_ABBREVIATIONS = {
    "mon": "Monday",
    "tue": "Tuesday",
    "tues": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "thur": "Thursday",
    "thurs": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
    "sun": "Sunday",
}

# symbol -> (singular, plural, sub-unit singular, sub-unit plural)
CURRENCY_SYMBOLS = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "sen", "sen"),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
CURRENCY_CODES = {
    "usd": CURRENCY_SYMBOLS["$"],
    "eur": CURRENCY_SYMBOLS["€"],
    "gbp": CURRENCY_SYMBOLS["£"],
    "jpy": CURRENCY_SYMBOLS["¥"],
    "inr": CURRENCY_SYMBOLS["₹"],
}
# "$5m", "$2.5 billion"
SCALE_WORDS = {
    "k": "thousand",
    "thousand": "thousand",
    "m": "million",
    "mn": "million",
    "million": "million",
    "b": "billion",
    "bn": "billion",
    "billion": "billion",
    "t": "trillion",
    "trillion": "trillion",
}

# unit as written after a number -> (singular, plural). Case matters for a few (M, m).
UNITS = {
    "km": ("kilometer", "kilometers"),
    "m": ("meter", "meters"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "in": ("inch", "inches"),
    "yd": ("yard", "yards"),
    "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "l": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"),
    "gal": ("gallon", "gallons"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
    "kb": ("kilobyte", "kilobytes"),
    "mb": ("megabyte", "megabytes"),
    "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"),
    "hz": ("hertz", "hertz"),
    "khz": ("kilohertz", "kilohertz"),
    "mhz": ("megahertz", "megahertz"),
    "ghz": ("gigahertz", "gigahertz"),
    "w": ("watt", "watts"),
    "kw": ("kilowatt", "kilowatts"),
    "kwh": ("kilowatt hour", "kilowatt hours"),
    "v": ("volt", "volts"),
    "ms": ("millisecond", "milliseconds"),
    "s": ("second", "seconds"),
    "sec": ("second", "seconds"),
    "secs": ("second", "seconds"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "h": ("hour", "hours"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
}

# Units that are also words or letters: read as units only when glued to the number.
UNITS_NEEDING_NO_SPACE = frozenset({"in", "m", "s", "h", "g", "l", "w", "v", "min", "sec", "mi"})

# Symbols that carry words. Everything else of Unicode category S* (emoji, dingbats,
# arrows, box drawing) and the joiners and selectors of emoji sequences is dropped.
SYMBOL_WORDS = {
    "&": "and",
    "+": "plus",
    "=": "equals",
    "@": "at",
    "%": "percent",
    "°": "degrees",
    "×": "times",
    "÷": "divided by",
    "±": "plus or minus",
    "≈": "about",
    "<": "less than",
    ">": "greater than",
    "#": "number",
    "½": "one half",
    "¼": "one quarter",
    "¾": "three quarters",
}
# Dropped outright: markup and decoration that nobody reads aloud.
DROPPED_PUNCTUATION = "*_~^|\\`[]{}"

# Fractions read by name: denominator -> (singular, plural)
FRACTION_DENOMINATORS = {
    2: ("half", "halves"),
    3: ("third", "thirds"),
    4: ("quarter", "quarters"),
}

# Top-level domains and hosts spoken as words, not spelled.
SPOKEN_DOMAIN_WORDS = {"com": "com", "org": "org", "net": "net", "www": "w w w"}
URL_SEPARATORS = {
    ".": "dot",
    "/": "slash",
    "-": "dash",
    "_": "underscore",
    ":": "colon",
    "?": "question mark",
    "=": "equals",
    "&": "and",
    "#": "hash",
    "~": "tilde",
    "%": "percent",
    "+": "plus",
}

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
