"""Spell numbers as Chinese or English words."""

import re

ZH_DIGITS = "零一二三四五六七八九"
_EN_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_EN_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (10**3, "thousand"))
_EN_IRREGULAR_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_DECIMAL = re.compile(r"(-)?(\d+)(?:\.(\d+))?", re.ASCII)
_ZH_DIGIT_TABLE = str.maketrans("0123456789", ZH_DIGITS)
_EN_DIGIT_TABLE = str.maketrans({str(d): _EN_ONES[d] + " " for d in range(10)})


def _check_digits(digits: str) -> str:
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"expected ASCII digits, got {digits!r}")
    return digits


def _parse(value: int | str) -> tuple[bool, int, str]:
    match = _DECIMAL.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"not a decimal number: {value!r}")
    sign, whole, fraction = match.groups()
    return sign is not None, int(whole), fraction or ""


def zh_digits(digits: str) -> str:
    """Read a string of ASCII digits one by one in Chinese."""
    return _check_digits(digits).translate(_ZH_DIGIT_TABLE)


def _zh_below_10000(n: int) -> str:
    out: list[str] = []
    gap = False
    for value, unit in ((1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit = n // value % 10
        if digit == 0:
            gap = bool(out)
            continue
        if gap:
            out.append("零")
            gap = False
        out.append(("两" if digit == 2 and unit == "千" else ZH_DIGITS[digit]) + unit)
    return "".join(out)


def _zh_grouped(n: int) -> str:
    for value, unit in ((10**8, "亿"), (10**4, "万")):
        if n >= value:
            high, low = divmod(n, value)
            text = ("两" if high == 2 else _zh_grouped(high)) + unit
            if low == 0:
                return text
            return text + ("零" if low < value // 10 else "") + _zh_grouped(low)
    return _zh_below_10000(n)


def zh_integer(n: int) -> str:
    """Spell an integer in Chinese with 万/亿 grouping."""
    if n < 0:
        return "负" + zh_integer(-n)
    if n == 0:
        return ZH_DIGITS[0]
    text = _zh_grouped(n)
    # 10–19 at the head of a number are said 十…, not 一十….
    return text[1:] if text.startswith("一十") else text


def zh_number(value: int | str) -> str:
    """Spell an integer or decimal such as "-3.14" in Chinese."""
    negative, whole, fraction = _parse(value)
    text = zh_integer(whole) + ("点" + zh_digits(fraction) if fraction else "")
    return ("负" if negative else "") + text


def zh_fraction(numerator: int, denominator: int) -> str:
    """Spell a fraction in Chinese, denominator first."""
    return f"{zh_integer(denominator)}分之{zh_integer(numerator)}"


def en_digits(digits: str) -> str:
    """Read a string of ASCII digits one by one in English."""
    return _check_digits(digits).translate(_EN_DIGIT_TABLE)[:-1]  # each word brings its space


def _en_below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    parts = [f"{_EN_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        parts.append(_EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else ""))
    elif rest:
        parts.append(_EN_ONES[rest])
    return " ".join(parts)


def en_integer(n: int) -> str:
    """Spell an integer in English with thousand/million/billion scales."""
    if n < 0:
        return "minus " + en_integer(-n)
    if n == 0:
        return "zero"
    parts: list[str] = []
    for value, name in _EN_SCALES:
        if n >= value:
            high, n = divmod(n, value)
            parts.append(f"{en_integer(high)} {name}")
    if n:
        parts.append(_en_below_1000(n))
    return " ".join(parts)


def en_number(value: int | str) -> str:
    """Spell an integer or decimal such as "-3.14" in English."""
    negative, whole, fraction = _parse(value)
    text = en_integer(whole) + (" point " + en_digits(fraction) if fraction else "")
    return ("minus " if negative else "") + text


def _ordinal_word(word: str) -> str:
    if word in _EN_IRREGULAR_ORDINALS:
        return _EN_IRREGULAR_ORDINALS[word]
    return word[:-1] + "ieth" if word.endswith("y") else word + "th"


def en_ordinal(n: int) -> str:
    """Spell a non-negative integer as an English ordinal ("twenty-first")."""
    if n < 0:
        raise ValueError(f"ordinals are non-negative, got {n}")
    head, _, last = en_integer(n).rpartition(" ")
    stem, hyphen, unit = last.rpartition("-")
    last = stem + hyphen + _ordinal_word(unit)
    return f"{head} {last}" if head else last


def en_year(n: int) -> str:
    """Spell a year the way English speakers say it ("nineteen oh five")."""
    if not 1000 <= n <= 9999 or n % 1000 < 10 or n % 1000 == 0:
        return en_integer(n)
    century, rest = divmod(n, 100)
    if rest == 0:
        return f"{en_integer(century)} hundred"
    tail = f"oh {_EN_ONES[rest]}" if rest < 10 else en_integer(rest)
    return f"{en_integer(century)} {tail}"


def en_fraction(numerator: int, denominator: int) -> str:
    """Spell a fraction in English ("three quarters", "two fifths")."""
    if denominator < 2 or denominator > 100:
        return f"{en_integer(numerator)} over {en_integer(denominator)}"
    singular = {2: "half", 4: "quarter"}.get(denominator) or en_ordinal(denominator)
    if numerator == 1:
        return f"one {singular}"
    plural = "halves" if denominator == 2 else singular + "s"
    return f"{en_integer(numerator)} {plural}"
