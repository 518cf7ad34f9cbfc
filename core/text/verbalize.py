"""Replace the digits in text with words, choosing Chinese or English per number."""

import functools
import re

from core.text import dates
from core.text.chars import is_cjk
from core.text.clean import unify_digits
from core.text.numbers import (
    en_digits,
    en_fraction,
    en_integer,
    en_number,
    en_ordinal,
    zh_digits,
    zh_fraction,
    zh_integer,
    zh_number,
)
from core.text.passes import Pass, plus_starts, run_passes, run_starts, signed_currency_starts, signed_run_starts

_CURRENCIES = {"$": ("美元", "dollar"), "€": ("欧元", "euro"), "£": ("英镑", "pound"), "¥": ("元", "yuan")}
_SUBUNITS = {"dollar": ("cent", "cents"), "euro": ("cent", "cents"), "pound": ("penny", "pence")}
# Measure words after which a lone 2 is said 两 ("两个人"), not 二.
_MEASURE_WORDS = frozenset("个只位本张条件次天岁名种把辆台块双对份句首篇套间家支根颗座人倍")
_ZH_SCALES = {"thousand": "千", "million": "百万", "billion": "十亿", "trillion": "万亿", "万": "万", "亿": "亿"}
_EN_SCALES = {
    "thousand": "thousand ",
    "million": "million ",
    "billion": "billion ",
    "trillion": "trillion ",
    "万": "ten thousand ",
    "亿": "hundred million ",
}
_NUMBER = r"\d+(?:\.\d+)?"

INTERNATIONAL_PHONE = re.compile(r"(?<![\w+])\+(?P<n>\d[\d -]{5,}\d)(?!\d)")
HYPHENATED = re.compile(r"(?<!\d)(?<!\d[.\-])\d+(?:-\d+)+(?!\d|-\d)")
RANGE = re.compile(rf"(?<!\d)(?<!\d\.)(?P<a>{_NUMBER})\s*[~–]\s*(?P<b>{_NUMBER})(?!\d|\.\d)")
CURRENCY = re.compile(
    rf"(?P<sign>-)?(?P<unit>[$€£¥])\s?(?P<n>{_NUMBER})(?:\s?(?P<scale>(?:thousand|million|billion|trillion)\b|万|亿))?"
)
# The digits start where their run starts: tried from every digit, a long run was quadratic.
SUFFIX_UNIT = re.compile(rf"(?P<sign>-)?(?<!\d)(?P<n>{_NUMBER})\s?(?P<unit>%|‰|°(?:[CF](?![^\W\d_]))?)")
ORDINAL = re.compile(r"(?<!\d)(?P<n>\d+)(?:st|nd|rd|th)(?![^\W\d_])")
FRACTION = re.compile(r"(?<!\d)(?<!\d[/.])(?P<a>\d+)/(?P<b>\d+)(?![\d/]|\.\d)")
DOTTED = re.compile(r"(?<!\d)(?<!\d\.)\d+(?:\.\d+){2,}(?!\d|\.\d)")
PLAIN = re.compile(r"(?P<sign>-)?(?P<n>\d+)(?:\.(?P<frac>\d+))?")


def _reads_as_digits(digits: str) -> bool:
    # Leading zeros and long non-round runs are codes or phone numbers.
    long_and_precise = len(digits) >= 11 and len(digits.rstrip("0")) > 4
    return (len(digits) > 1 and digits[0] == "0") or long_and_precise or len(digits) > 16


def integer_words(digits: str, lang: str) -> str:
    """Spell a run of digits as a number, or digit by digit when it looks like a code."""
    if len(digits) <= _CACHED_NUMBER_LENGTH:
        return _short_integer_words(digits, lang)
    return _integer_words(digits, lang)


def _integer_words(digits: str, lang: str) -> str:
    if _reads_as_digits(digits):
        return zh_digits(digits) if lang == "zh" else en_digits(digits)
    return zh_integer(int(digits)) if lang == "zh" else en_integer(int(digits))


def number_words(number: str, lang: str) -> str:
    """Spell an unsigned integer or decimal such as "3.14"."""
    if len(number) <= _CACHED_NUMBER_LENGTH:
        return _short_number_words(number, lang)
    return _number_words(number, lang)


def _number_words(number: str, lang: str) -> str:
    whole, _, fraction = number.partition(".")
    if _reads_as_digits(whole):
        head = integer_words(whole, lang)
        tail = (zh_digits(fraction) if lang == "zh" else en_digits(fraction)) if fraction else ""
        return head + (("点" if lang == "zh" else " point ") + tail if tail else "")
    return zh_number(number) if lang == "zh" else en_number(number)


# A text of ten thousand numbers often repeats them; only short ones are kept, so the cache stays small.
_CACHED_NUMBER_LENGTH = 24
_short_number_words = functools.lru_cache(maxsize=4096)(_number_words)
_short_integer_words = functools.lru_cache(maxsize=4096)(_integer_words)


def _is_minus(match: re.Match[str]) -> bool:
    index = match.start("sign")
    if index < 0:
        return False
    before = match.string[index - 1] if index else " "
    return not (before.isalnum() and not is_cjk(before))


def _sign(match: re.Match[str], lang: str) -> str:
    if match["sign"] is None:
        return ""
    if _is_minus(match):
        return "负" if lang == "zh" else "minus "
    return "-"


def _read_digit_groups(groups: list[str], lang: str) -> str:
    read = zh_digits if lang == "zh" else en_digits
    return ("，" if lang == "zh" else ", ").join(read(group) for group in groups if group)


def read_international_phone(match: re.Match[str], lang: str) -> str:
    """Read "+86 138 1234 5678" digit by digit, group by group."""
    return _read_digit_groups(re.split(r"[ -]", match["n"]), lang)


def read_hyphenated(match: re.Match[str], lang: str) -> str:
    """Read "5-10" as a range and longer hyphenated runs as phone-like codes."""
    groups = match.group(0).split("-")
    if len(groups) == 2 and all(len(g) <= 4 for g in groups) and int(groups[0]) <= int(groups[1]):
        return _range(groups[0], groups[1], lang)
    return _read_digit_groups(groups, lang)


def _range(low: str, high: str, lang: str) -> str:
    if lang == "zh":
        return f"{number_words(low, lang)}到{number_words(high, lang)}"
    return f"{number_words(low, lang)} to {number_words(high, lang)}"


def read_range(match: re.Match[str], lang: str) -> str:
    """Read "5~10" as 五到十 or "five to ten"."""
    return _range(match["a"], match["b"], lang)


def read_currency(match: re.Match[str], lang: str) -> str:
    """Read "$5" as "five dollars" or 五美元, and "$3.5 billion" as "three point five billion dollars"."""
    zh_name, en_name = _CURRENCIES[match["unit"]]
    sign, amount, scale = _sign(match, lang), match["n"], match["scale"] or ""
    if lang == "zh":
        trimmed = amount.rstrip("0").rstrip(".") if "." in amount else amount
        named = match.string.startswith(zh_name, match.end())  # "¥100元"
        return sign + number_words(trimmed, lang) + _ZH_SCALES.get(scale, "") + ("" if named else zh_name)
    whole, _, cents = amount.partition(".")
    subunit = _SUBUNITS.get(en_name) if len(cents) == 2 and not scale else None
    if subunit:
        amount = whole
    unit = en_name if (amount == "1" and not scale) or en_name == "yuan" else en_name + "s"
    words = f"{sign}{number_words(amount, lang)} {_EN_SCALES.get(scale, '')}{unit}"
    if not (subunit and int(cents)):
        return words
    change = f"{en_integer(int(cents))} {subunit[0] if cents == '01' else subunit[1]}"
    return sign + change if whole == "0" else f"{words} and {change}"


def read_suffix_unit(match: re.Match[str], lang: str) -> str:
    """Read percentages, per mille and degrees ("50%" → 百分之五十, "fifty percent")."""
    sign, words, unit = _sign(match, lang), number_words(match["n"], lang), match["unit"]
    if lang == "zh":
        prefix = {"%": "百分之", "‰": "千分之"}.get(unit, "")
        suffix = {"°C": "摄氏度", "°F": "华氏度", "°": "度"}.get(unit, "")
        return sign + prefix + words + suffix
    degrees = "degree" if match["n"] == "1" else "degrees"
    names = {"%": "percent", "‰": "per mille", "°C": f"{degrees} Celsius", "°F": f"{degrees} Fahrenheit"}
    return f"{sign}{words} {names.get(unit, degrees)}"


def read_ordinal(match: re.Match[str], lang: str) -> str:
    """Read "21st" as "twenty-first"."""
    return en_ordinal(int(match["n"]))


def read_fraction(match: re.Match[str], lang: str) -> str | None:
    """Read "3/4" as 四分之三 or "three quarters"."""
    numerator, denominator = int(match["a"]), int(match["b"])
    if denominator == 0:
        return None
    return zh_fraction(numerator, denominator) if lang == "zh" else en_fraction(numerator, denominator)


def read_dotted(match: re.Match[str], lang: str) -> str:
    """Read a version or address such as "1.2.3" group by group."""
    separator = "点" if lang == "zh" else " point "
    return separator.join(integer_words(group, lang) for group in match.group(0).split("."))


def read_plain(match: re.Match[str], lang: str) -> str:
    """Read an integer or decimal, with its sign when the hyphen is a minus."""
    digits, fraction = match["n"], match["frac"]
    after = match.string[match.end() : match.end() + 1]
    if lang == "zh" and digits == "2" and not fraction and not match["sign"] and after in _MEASURE_WORDS:
        return "两"
    return _sign(match, lang) + number_words(digits + (f".{fraction}" if fraction else ""), lang)


# Order matters: specific shapes (dates, times, phone numbers) go before the
# generic number so that their digits are read as a whole.
PASSES: tuple[Pass, ...] = (
    Pass(dates.MONTH_DATE, dates.read_month_date, dates.MONTH_HINT),
    Pass(dates.NUMERIC_DATE, dates.read_numeric_date, re.compile("[0-9][-/.][0-9]"), run_starts),
    Pass(dates.YEAR_BEFORE_NIAN, dates.read_year_before_nian, re.compile("年"), run_starts),
    Pass(dates.DECADE, dates.read_decade, re.compile("0s"), run_starts),
    Pass(dates.YEAR_AFTER_WORD, dates.read_year_after_word, re.compile(r"\s(?:1[1-9]|20)[0-9][0-9]")),
    Pass(dates.CLOCK_TIME, dates.read_clock_time, re.compile("[0-9]:[0-9]"), run_starts),
    Pass(INTERNATIONAL_PHONE, read_international_phone, re.compile(r"\+[0-9]"), plus_starts),
    Pass(HYPHENATED, read_hyphenated, re.compile("[0-9]-[0-9]"), run_starts),
    Pass(RANGE, read_range, re.compile("[~–]"), run_starts),
    Pass(CURRENCY, read_currency, re.compile("[$€£¥]"), signed_currency_starts),
    Pass(SUFFIX_UNIT, read_suffix_unit, re.compile("[%‰°]"), signed_run_starts),
    Pass(ORDINAL, read_ordinal, re.compile("[0-9](?:st|nd|rd|th)"), run_starts),
    Pass(FRACTION, read_fraction, re.compile("[0-9]/[0-9]"), run_starts),
    Pass(DOTTED, read_dotted, re.compile(r"[0-9]\.[0-9]++\.[0-9]"), run_starts),
    Pass(PLAIN, read_plain, None, signed_run_starts),
)


def verbalize_numbers(text: str, *, language: str) -> str:
    """Replace every digit in text with words in "zh", "en" or, per number, "auto"."""
    return run_passes(unify_digits(text), PASSES, language=language)
