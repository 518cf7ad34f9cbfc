"""Unit tests of text normalisation, sentence splitting and segment planning."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest

from core.text import count_speakable, normalize, plan_segments, split_sentences
from core.text.chars import has_speakable
from core.text.numbers import en_integer, en_number, en_ordinal, en_year, zh_integer, zh_number
from core.text.plan import paragraphs
from core.text.split import clause_spans, sentence_spans, word_spans


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- numbers as words -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "零"),
        (7, "七"),
        (10, "十"),
        (15, "十五"),
        (20, "二十"),
        (101, "一百零一"),
        (110, "一百一十"),
        (1001, "一千零一"),
        (1010, "一千零一十"),
        (2000, "两千"),
        (10001, "一万零一"),
        (20000, "两万"),
        (120000, "十二万"),
        (100100, "十万零一百"),
        (123456789, "一亿两千三百四十五万六千七百八十九"),
        (100010000, "一亿零一万"),
        (1000000000, "十亿"),
        (-42, "负四十二"),
    ],
)
def test_chinese_numbers_use_wan_and_yi_grouping(n: int, words: str) -> None:
    assert zh_integer(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (21, "twenty-one"),
        (100, "one hundred"),
        (105, "one hundred five"),
        (1000, "one thousand"),
        (1234, "one thousand two hundred thirty-four"),
        (1000000, "one million"),
        (2500000000, "two billion five hundred million"),
        (-7, "minus seven"),
    ],
)
def test_english_numbers_use_thousand_million_billion(n: int, words: str) -> None:
    assert en_integer(n) == words


@pytest.mark.parametrize(
    ("value", "zh", "en"),
    [
        ("3.14", "三点一四", "three point one four"),
        ("0.5", "零点五", "zero point five"),
        ("-2.05", "负二点零五", "minus two point zero five"),
        (12, "十二", "twelve"),
    ],
)
def test_decimals_and_negative_numbers_are_spelled(value: str | int, zh: str, en: str) -> None:
    assert zh_number(value) == zh
    assert en_number(value) == en


@pytest.mark.parametrize("value", ["", "abc", "1.2.3", "--1", "١٢"])
def test_malformed_numbers_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a decimal number"):
        zh_number(value)


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (4, "fourth"),
        (11, "eleventh"),
        (12, "twelfth"),
        (20, "twentieth"),
        (21, "twenty-first"),
        (101, "one hundred first"),
    ],
)
def test_english_ordinals_are_spelled(n: int, words: str) -> None:
    assert en_ordinal(n) == words


@pytest.mark.parametrize(
    ("year", "words"),
    [
        (1999, "nineteen ninety-nine"),
        (1905, "nineteen oh five"),
        (1900, "nineteen hundred"),
        (2000, "two thousand"),
        (2005, "two thousand five"),
        (2024, "twenty twenty-four"),
    ],
)
def test_english_years_are_read_in_pairs(year: int, words: str) -> None:
    assert en_year(year) == words


# --- normalisation: numbers in context -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("我有3个苹果", "我有三个苹果"),
        ("第1章", "第一章"),
        ("共有123456789人", "共有一亿两千三百四十五万六千七百八十九人"),
        ("温度是-5度", "温度是负五度"),
        ("圆周率约为3.14", "圆周率约为三点一四"),
        ("2个人", "两个人"),
        ("5-10人", "五到十人"),
        ("版本1.2.3发布了", "版本一点二点三发布了"),
        ("有3,000人", "有三千人"),
    ],
)
def test_digits_become_chinese_words_in_chinese_context(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I have 3 apples.", "I have three apples."),
        ("It is -5 outside.", "It is minus five outside."),
        (
            "There are 1,234,567 people.",
            "There are one million two hundred thirty-four thousand five hundred sixty-seven people.",
        ),
        ("Pi is 3.14.", "Pi is three point one four."),
        ("COVID-19 spread.", "COVID-nineteen spread."),
        ("Read pages 5-10.", "Read pages five to ten."),
        ("Add 3/4 of a cup.", "Add three quarters of a cup."),
        ("Take 2billion", "Take two billion"),
    ],
)
def test_digits_become_english_words_in_english_context(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("language", "expected"),
    [("zh", "一百二十三"), ("en", "one hundred twenty-three"), ("auto", "one hundred twenty-three")],
)
def test_language_choice_decides_how_a_lone_number_is_read(language: str, expected: str) -> None:
    assert normalize("123", language=language) == expected


@pytest.mark.parametrize(("text", "expected"), [("٣ apples", "three apples"), ("४२ रुपये", "forty-two रुपये")])
def test_digits_of_other_scripts_are_read(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_auto_language_is_decided_per_number() -> None:
    assert normalize("我买了3个苹果, and 5 pears.") == "我买了三个苹果，and five pears."


def test_forced_english_numbers_are_spaced_from_chinese() -> None:
    assert normalize("我有3个", language="en") == "我有 three 个"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("增长了50%。", "增长了百分之五十。"),
        ("下降了-2.5%", "下降了负百分之二点五"),
        ("气温25℃", "气温二十五摄氏度"),
    ],
)
def test_percentages_are_read_in_chinese(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Sales grew 50%.", "Sales grew fifty percent."),
        ("It fell 0.5 %", "It fell zero point five percent"),
        ("It is 1°C.", "It is one degree Celsius."),
    ],
)
def test_percentages_are_read_in_english(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        ("2024-05-01", "zh", "二零二四年五月一日"),
        ("今天是2024年5月1日", "auto", "今天是二零二四年五月一日"),
        ("会议在2024/5/1举行", "auto", "会议在二零二四年五月一日举行"),
        ("2024-05-01", "en", "May first, twenty twenty-four"),
        ("Born on May 1, 2024.", "auto", "Born on May first, twenty twenty-four."),
        ("Due Jan. 21st", "auto", "Due January twenty-first"),
        ("Due 05/01/2024.", "auto", "Due May first, twenty twenty-four."),
        ("In 1999 and the 1990s.", "auto", "In nineteen ninety-nine and the nineteen nineties."),
        ("八十年代是80年代", "auto", "八十年代是八十年代"),
    ],
)
def test_dates_are_read_as_dates(text: str, language: str, expected: str) -> None:
    assert normalize(text, language=language) == expected


@pytest.mark.parametrize(("text", "expected"), [("2024年", "二零二四年"), ("1998年夏天", "一九九八年夏天")])
def test_years_are_read_digit_by_digit_in_chinese(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("会议在10:30开始", "会议在十点三十分开始"),
        ("2:05出发", "两点零五分出发"),
        ("8:00到", "八点到"),
        ("Meet at 10:30.", "Meet at ten thirty."),
        ("Meet at 9:05.", "Meet at nine oh five."),
        ("Meet at 7:00.", "Meet at seven o'clock."),
    ],
)
def test_clock_times_are_read(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the 1st, 2nd, 3rd and 4th", "the first, second, third and fourth"),
        ("my 21st birthday", "my twenty-first birthday"),
    ],
)
def test_english_ordinals_are_read(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("电话13812345678", "电话一三八一二三四五六七八"),
        ("拨打010-12345678", "拨打零一零，一二三四五六七八"),
        ("Call 138-1234-5678.", "Call one three eight, one two three four, five six seven eight."),
        ("Call +44 20 7946 0958", "Call four four, two zero, seven nine four six, zero nine five eight"),
        ("Agent 007", "Agent zero zero seven"),
        ("一千亿是100000000000", "一千亿是一千亿"),
    ],
)
def test_phone_like_digit_runs_are_read_digit_by_digit(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("价格$5", "价格五美元"),
        ("价格¥3.50", "价格三点五元"),
        ("It costs $1.", "It costs one dollar."),
        ("It costs $3.50.", "It costs three dollars and fifty cents."),
        ("It costs €20.", "It costs twenty euros."),
        ("Only $0.99!", "Only ninety-nine cents!"),
        ("Revenue hit $3.5 billion.", "Revenue hit three point five billion dollars."),
        ("营收¥3.5亿", "营收三点五亿元"),
        ("¥100元", "一百元"),
    ],
)
def test_currency_amounts_are_read_with_their_unit(text: str, expected: str) -> None:
    assert normalize(text) == expected


# --- normalisation: characters, punctuation and spacing --------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ＡＢＣ ｈｅｌｌｏ", "ABC hello"),
        ("ｉＰｈｏｎｅ　１５", "iPhone fifteen"),
        ("买了１２３个", "买了一百二十三个"),
    ],
)
def test_fullwidth_letters_become_halfwidth(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("你好,世界!你好吗?", "你好，世界！你好吗？"),
        ("注意;小心:危险", "注意；小心：危险"),
        ("Hello，world！How are you？", "Hello, world! How are you?"),
        ("Yes。No、maybe", "Yes. No, maybe"),
        ("我用Python.", "我用Python。"),
        ("我用Node.js写代码.", "我用Node.js写代码。"),
        ("见到Mr. Smith了吗?", "见到Mr. Smith了吗？"),
    ],
)
def test_punctuation_follows_the_script_of_its_clause(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello😀 world 🎉", "Hello world"),
        ("你好😀世界", "你好世界"),
        ("I ❤️ TTS", "I TTS"),
        ("👍🏽 ok", "ok"),
        ("a → b ★ c © d", "a b c d"),
        ("😀🎉", ""),
    ],
)
def test_emoji_are_dropped(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\u200bb", "ab"),
        ("\ufeffhello", "hello"),
        ("你\u200d好", "你好"),
        ("x\x00y\x07z", "xyz"),
        ("left\u200eright", "leftright"),
    ],
)
def test_control_and_zero_width_characters_are_removed(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  hello \t  world  ", "hello world"),
        ("你 好 ， 世 界", "你好，世界"),
        ("我喜欢 Python 语言", "我喜欢 Python 语言"),
        ("Chapter 1\r\n\r\n  It began.", "Chapter one\nIt began."),
        ("Hello , world !", "Hello, world!"),
    ],
)
def test_whitespace_is_collapsed_and_line_breaks_are_kept_once(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What!!!", "What!"),
        ("真的吗？？？！！", "真的吗？！"),
        ("Wait... what", "Wait... what"),
        ("Wait…… what", "Wait... what"),
        ("等等。。。", "等等……"),
        ("等等...", "等等……"),
        ("He said — well — no.", "He said, well, no."),
        ("well-known don’t", "well-known don't"),
    ],
)
def test_punctuation_is_squeezed_and_unified(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_normalize_rejects_an_unknown_language() -> None:
    with pytest.raises(ValueError, match="language"):
        normalize("hi", language="fr")


# --- sentence splitting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("你好。我很好！你呢？", ["你好。", "我很好！", "你呢？"]),
        ("先这样；再那样", ["先这样；", "再那样"]),
        ("Hi there. How are you? Fine!", ["Hi there.", "How are you?", "Fine!"]),
        ("One; two", ["One;", "two"]),
        ("Really?! Yes.", ["Really?!", "Yes."]),
    ],
)
def test_text_is_split_after_sentence_ends(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Mr. Smith met Dr. Who.",
        "Use a tool, e.g. a hammer.",
        "Pi is 3.14 or so.",
        "J. K. Rowling wrote it.",
        "See example.com for more.",
        "Wait... then go.",
        '"Stop!" she said.',
        "It ends etc. and more.",
    ],
)
def test_abbreviations_and_decimals_do_not_end_sentences(text: str) -> None:
    assert split_sentences(text) == [text]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("他说：“走吧。”我们就走了。", ["他说：“走吧。”", "我们就走了。"]),
        ("“真的吗？”他问。", ["“真的吗？”", "他问。"]),
        ('She said "Go." Then left.', ['She said "Go."', "Then left."]),
        ("(Hello.) (World.)", ["(Hello.)", "(World.)"]),
        ("《书名》很好。「对。」", ["《书名》很好。", "「对。」"]),
    ],
)
def test_closing_quotes_and_brackets_stay_with_their_sentence(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_mixed_chinese_and_english_text() -> None:
    text = "我喜欢Python. It is great! 你呢？I use it every day."
    assert split_sentences(text) == ["我喜欢Python.", "It is great!", "你呢？", "I use it every day."]
    assert normalize("我喜欢Python. It is great!你呢?I use it 2 hours a day.") == (
        "我喜欢Python。It is great! 你呢？I use it two hours a day."
    )


def test_line_breaks_end_sentences() -> None:
    assert split_sentences("Chapter one\nIt was dark.\n\nThe end") == ["Chapter one", "It was dark.", "The end"]


@pytest.mark.parametrize("text", ["", "   ", "。。。", "!?", "\n\n", "“”", "……"])
def test_split_never_returns_empty_or_punctuation_only_pieces(text: str) -> None:
    assert split_sentences(text) == []


def test_punctuation_only_pieces_join_their_neighbour() -> None:
    assert split_sentences("……你好。！！ 再见。") == ["……你好。！！", "再见。"]


@pytest.mark.parametrize("splitter", [sentence_spans, clause_spans, word_spans])
def test_spans_concatenate_back_to_the_text(splitter: Callable[[str], list[str]]) -> None:
    text = "他说：“走吧。”Then, e.g. Mr. Lee left... 好的，再见！  Bye?"
    assert "".join(splitter(text)) == text


# --- segment planning ------------------------------------------------------------------------


def test_short_text_is_one_segment() -> None:
    assert plan_segments("你好，世界。") == ["你好，世界。"]


def test_sentences_are_packed_up_to_the_cap() -> None:
    text = "这是第一句。" + "这是一个普通的句子。" * 30
    segments = plan_segments(text, max_chars=50, first_max_chars=20)
    assert all(len(s) <= 50 for s in segments)
    assert all(s.endswith("。") for s in segments)
    # The ramp: the first cap again (the first segment is 16 characters), then all before it (36 characters:
    # three whole ten-character sentences), then the full cap (five sentences).
    assert [len(s) for s in segments[:4]] == [16, 20, 30, 50]


def test_no_segment_is_longer_than_all_the_segments_before_it() -> None:
    text = "Word " * 400
    segments = plan_segments(text, max_chars=120, first_max_chars=24)
    for i, segment in enumerate(segments[1:], start=1):
        assert len(segment) <= max(24, sum(map(len, segments[:i])))
    assert len(segments[0]) <= 24 and max(map(len, segments)) > 100, "it ramps up to the full cap"


def test_first_segment_is_short() -> None:
    text = "Once upon a time there was a king. He ruled a small and quiet land far away. " * 5
    segments = plan_segments(text, max_chars=120, first_max_chars=40)
    assert len(segments[0]) <= 40
    assert all(len(s) <= 120 for s in segments[1:])
    assert max(len(s) for s in segments[1:]) > 40


def test_a_short_lead_clause_takes_the_long_clause_after_it_so_the_second_segment_is_not_longer_than_it_plays() -> None:
    text = "专家建议，长时间使用电脑的人应该每隔一小时起身活动一下，让眼睛和颈椎得到休息。"
    segments = plan_segments(text, max_chars=60, first_max_chars=24, language="zh")
    assert segments[0] == "专家建议，长时间使用电脑的人应该每隔一小时起身活动一下，"
    assert len(segments[0]) <= 24 * 3 // 2
    # A lead clause the next one does not dwarf stays short; so does one that could only go past the bound.
    market = "清晨的菜市场格外热闹，摊主们忙着摆放新鲜的蔬菜和水果。"
    assert plan_segments(market, first_max_chars=24, language="zh")[0] == "清晨的菜市场格外热闹，"
    assert plan_segments("截至目前，" + "志愿者" * 12 + "。", first_max_chars=24, language="zh")[0] == "截至目前，"


def test_first_segment_is_cut_at_a_clause_boundary() -> None:
    text = "人工智能正在改变世界，它影响着医疗、教育和交通，也带来了新的挑战和机遇，我们需要认真思考。"
    segments = plan_segments(text, max_chars=120, first_max_chars=15)
    assert segments[0] == "人工智能正在改变世界，"
    assert "".join(segments) == text


def test_long_sentence_is_split_at_commas() -> None:
    clause = "this clause has about forty characters,"
    text = " ".join([clause] * 6) + " end."
    segments = plan_segments(text, max_chars=100, first_max_chars=100)
    assert all(s.endswith(",") for s in segments[:-1])
    assert all(len(s) <= 100 for s in segments)


@pytest.mark.parametrize(
    ("text", "cap"),
    [
        ("word " * 100, 50),
        ("没有标点的中文句子" * 40, 60),
        ("混合mixed文本text" * 40, 45),
    ],
)
def test_long_sentence_without_punctuation_is_split_under_the_cap(text: str, cap: int) -> None:
    segments = plan_segments(text, max_chars=cap, first_max_chars=cap)
    assert len(segments) > 1
    assert all(0 < len(s) <= cap for s in segments)
    assert _squash("".join(segments)) == _squash(normalize(text))


def test_english_is_split_at_word_boundaries() -> None:
    text = " ".join(["alpha", "beta", "gamma", "delta"] * 30)
    segments = plan_segments(text, max_chars=37, first_max_chars=20)
    words = set(text.split())
    assert all(set(s.split()) <= words for s in segments)


def test_cjk_without_punctuation_is_cut_hard_at_the_cap() -> None:
    segments = plan_segments("字" * 300, max_chars=120, first_max_chars=40)
    assert [len(s) for s in segments] == [40, 40, 80, 120, 20]  # the caps: 40, 40, then all before (80), 120


@pytest.mark.parametrize(
    "text",
    ["", "   ", "😀😀😀", "。。。！！！", "“”（）", "\u200b\u200b", "$%^&*", "\n\n\n"],
)
def test_text_with_nothing_speakable_plans_no_segments(text: str) -> None:
    assert plan_segments(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "。你好。。。！！！世界",
        "Hi!!! ... ??? ok",
        "“”“”你好",
        "a" + "!" * 200,
        "，，，，，a，，，，，b",
        "😀 Hello 😀",
    ],
)
def test_empty_segments_are_never_produced(text: str) -> None:
    segments = plan_segments(text, max_chars=12, first_max_chars=5)
    assert segments
    assert all(s and s == s.strip() and has_speakable(s) for s in segments)
    assert all(len(s) <= 12 for s in segments)
    assert len(segments[0]) <= 5 * 3 // 2, "the first cap, or half as much again for a short lead clause"


def test_numbers_are_words_in_every_segment() -> None:
    segments = plan_segments("今天是2024年5月1日，气温25℃，湿度60%。会议10:30开始。", first_max_chars=20)
    assert segments == ["今天是二零二四年五月一日，", "气温二十五摄氏度，湿度百分之六十。", "会议十点三十分开始。"]


@pytest.mark.parametrize(("max_chars", "first"), [(0, 10), (10, 0), (-5, -5)])
def test_plan_rejects_non_positive_caps(max_chars: int, first: int) -> None:
    with pytest.raises(ValueError, match="caps"):
        plan_segments("hello", max_chars=max_chars, first_max_chars=first)


def test_first_cap_larger_than_the_cap_is_clamped() -> None:
    segments = plan_segments("hello world " * 20, max_chars=30, first_max_chars=100)
    assert all(len(s) <= 30 for s in segments)


def test_speakable_characters_are_counted() -> None:
    assert count_speakable("你好, world! 😀") == 7
    assert count_speakable("。。。") == 0


# --- properties over random text ---------------------------------------------------------------

_POOL = (
    ["你好", "世界", "我们", "今天", "天气", "很好", "人工智能", "的", "了", "是", "这个"],
    ["hello", "world", "the", "quick", "brown", "fox", "Mr.", "e.g.", "Python", "don't", "well-known"],
    ["3", "42", "-7", "3.14", "1,000", "50%", "2024-05-01", "10:30", "13812345678", "1st", "$5", "5-10", "1/2"],
    ["，", "。", "！", "？", "、", "：", "；", ",", ".", "!", "?", ";", ":", "...", "……", "“", "”", '"', "(", ")"],
    [" ", " ", "  ", "\n", "\t", "\u3000"],
    ["😀", "🎉", "❤️", "\u200b", "\x07", "©", "→", "#", "*", "ＡＢＣ", "１２", "—"],
)
_WEIGHTS = (5, 5, 2, 3, 4, 1)


def _random_text(rng: random.Random) -> str:
    count = rng.randint(0, 80)
    pools = rng.choices(_POOL, weights=_WEIGHTS, k=count)
    return "".join(rng.choice(pool) for pool in pools)


def _random_cases(count: int, seed: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    return [(_random_text(rng), rng.randint(12, 160), rng.randint(12, 60)) for _ in range(count)]


@pytest.mark.parametrize(("text", "max_chars", "first"), _random_cases(400, seed=20240501))
def test_plan_segments_holds_its_promises_on_random_text(text: str, max_chars: int, first: int) -> None:
    segments = plan_segments(text, max_chars=max_chars, first_max_chars=first)
    normalized = "".join(normalize(p) for p in paragraphs(text))
    if not count_speakable(normalized):
        assert segments == []
        return
    assert all(s and s == s.strip() and has_speakable(s) for s in segments)
    assert len(segments[0]) <= min(first * 3 // 2, max_chars), "a short lead clause may take the next with it"
    assert all(len(s) <= max_chars for s in segments)
    assert _squash("".join(segments)) == _squash(normalized)
    assert not any(ch.isdigit() for s in segments for ch in s)


@pytest.mark.parametrize(("text", "max_chars", "first"), _random_cases(100, seed=7))
def test_tiny_caps_still_keep_every_spoken_character(text: str, max_chars: int, first: int) -> None:
    max_chars, first = max_chars % 6 + 1, first % 4 + 1
    segments = plan_segments(text, max_chars=max_chars, first_max_chars=first)
    spoken = [ch for p in paragraphs(text) for ch in normalize(p) if count_speakable(ch)]
    assert [ch for s in segments for ch in s if count_speakable(ch)] == spoken
    assert all(has_speakable(s) and len(s) <= max_chars for s in segments)


@pytest.mark.parametrize(("text", "_max", "_first"), _random_cases(200, seed=11))
def test_normalize_is_idempotent_and_leaves_no_digits(text: str, _max: int, _first: int) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert not re.search(r"\d", once)


@pytest.mark.parametrize(("text", "_max", "_first"), _random_cases(200, seed=3))
def test_split_sentences_keeps_every_character_on_random_text(text: str, _max: int, _first: int) -> None:
    sentences = split_sentences(text)
    assert all(s and s == s.strip() and has_speakable(s) for s in sentences)
    if has_speakable(text):
        assert _squash("".join(sentences)) == _squash(text)


def test_segments_never_span_a_blank_line_so_an_edit_stays_local() -> None:
    before = ["First paragraph here. It has two sentences.", "Second one. Short.", "Third paragraph ends it."]
    after = [before[0], "Second one, now edited and a little longer. Short.", before[2]]
    old = plan_segments("\n\n".join(before), max_chars=120, first_max_chars=40)
    new = plan_segments("\n\n".join(after), max_chars=120, first_max_chars=40)
    assert old[-1] == new[-1] == "Third paragraph ends it."
    assert old[0] == new[0]
