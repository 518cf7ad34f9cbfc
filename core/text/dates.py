"""Read dates, years and clock times aloud in Chinese or English."""

import re

from core.text.numbers import en_integer, en_ordinal, en_year, zh_digits, zh_integer

MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_MONTH_BY_NAME = {name: i for i, name in enumerate(MONTHS, 1)} | {name[:3]: i for i, name in enumerate(MONTHS, 1)}
_MONTH_BY_NAME["Sept"] = 9

# "May 1", "Jan. 5th, 2024": only read this way in English context.
MONTH_DATE = re.compile(
    r"(?<![^\W\d_])(?P<month>" + "|".join(sorted(_MONTH_BY_NAME, key=len, reverse=True)) + r")"
    r"\.?\s+(?P<n>\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(?P<year>\d{4}))?(?![\d:])"
)
# What a text needs for MONTH_DATE to match: a month's name, then a number.
MONTH_HINT = re.compile("(?:" + "|".join(sorted(_MONTH_BY_NAME, key=len, reverse=True)) + r")\.?\s++\d")
# 2024-05-01, 2024/5/1, 2024.05.01 and the American 05/01/2024.
NUMERIC_DATE = re.compile(
    r"(?<!\d)(?<!\d[.\-/])(?:(?P<y>\d{4})(?P<sep>[-/.])(?P<m>\d{1,2})(?P=sep)(?P<d>\d{1,2})"
    r"|(?P<m2>\d{1,2})/(?P<d2>\d{1,2})/(?P<y2>\d{4}))(?!\d|[-/.]\d)"
)
# 2024年 is read digit by digit in Chinese.
YEAR_BEFORE_NIAN = re.compile(r"(?<!\d)(?<!\d\.)(?P<n>\d{4})(?=\s*年)")
DECADE = re.compile(r"(?<!\d)(?<!\d\.)(?P<n>\d{0,2}[1-9]0)s(?![^\W\d_])")
YEAR_AFTER_WORD = re.compile(
    r"(?<![^\W\d_])(?P<word>[Ii]n|[Ss]ince|[Bb]y|[Uu]ntil|[Ff]rom|[Bb]efore|[Aa]fter"
    r"|[Aa]round|[Dd]uring|[Yy]ear)(?P<space>\s+)(?P<n>1[1-9]\d\d|20\d\d)(?!\d|[.,:/]\d)"
)
CLOCK_TIME = re.compile(r"(?<!\d)(?<!\d[:.])(?P<h>[01]?\d|2[0-4]):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?(?![\d:])")


def _zh_date(year: str, month: int, day: int) -> str:
    return f"{zh_digits(year)}年{zh_integer(month)}月{zh_integer(day)}日"


def _en_date(year: str, month: int, day: int) -> str:
    return f"{MONTHS[month - 1]} {en_ordinal(day)}, {en_year(int(year))}"


def read_month_date(match: re.Match[str], lang: str) -> str | None:
    """Read "May 1, 2024" as "May first, twenty twenty-four" in English context."""
    day = int(match["n"])
    if lang != "en" or not 1 <= day <= 31:
        return None
    words = f"{MONTHS[_MONTH_BY_NAME[match['month']] - 1]} {en_ordinal(day)}"
    return words + (f", {en_year(int(match['year']))}" if match["year"] else "")


def read_numeric_date(match: re.Match[str], lang: str) -> str | None:
    """Read an all-digit date, or return None when it is not a valid date."""
    year = match["y"] or match["y2"]
    month, day = int(match["m"] or match["m2"]), int(match["d"] or match["d2"])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return _zh_date(year, month, day) if lang == "zh" else _en_date(year, month, day)


def read_year_before_nian(match: re.Match[str], lang: str) -> str:
    """Read the four digits before 年 as a year."""
    return zh_digits(match["n"]) if lang == "zh" else en_year(int(match["n"]))


def read_decade(match: re.Match[str], lang: str) -> str:
    """Read "1990s" as "nineteen nineties" or 一九九零年代."""
    digits = match["n"]
    if lang == "zh":
        return (zh_digits(digits) if len(digits) == 4 else zh_integer(int(digits))) + "年代"
    words = en_year(int(digits))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def read_year_after_word(match: re.Match[str], lang: str) -> str | None:
    """Read "in 1999" as "in nineteen ninety-nine" in English context."""
    if lang != "en":
        return None
    return match["word"] + match["space"] + en_year(int(match["n"]))


def read_clock_time(match: re.Match[str], lang: str) -> str:
    """Read "10:30" as 十点三十分 or "ten thirty"."""
    hour, minute = int(match["h"]), int(match["m"])
    second = int(match["s"]) if match["s"] else 0
    if lang == "zh":
        words = ("两" if hour == 2 else zh_integer(hour)) + "点"
        if minute or second:
            words += ("零" if minute < 10 else "") + (zh_integer(minute) if minute else "") + "分"
        return words + (zh_integer(second) + "秒" if second else "")
    if minute == 0:
        words = f"{en_integer(hour)} o'clock"
    else:
        words = f"{en_integer(hour)} {'oh ' if minute < 10 else ''}{en_integer(minute)}"
    return words + (f" and {en_integer(second)} seconds" if second else "")
