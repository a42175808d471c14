r"""GPT-2's letter and number classes, pinned to Unicode 16.0 so that the from-scratch tokenizer and
tiktoken give the same ids for every text.

GPT-2's pre-tokenizer (openai/gpt-2 `src/encoder.py`) splits text with the Unicode classes \p{L}
(letters) and \p{N} (numbers), and each regex engine answers from its own Unicode tables:
tiktoken 0.14 (Rust's regex crate) has Unicode 16.0, the `regex` module 2026.11 has 18.0. The
letters and numbers assigned in 17.0 and 18.0 (17,144 letters and 336 numbers, e.g. CJK Extension J
at U+323B0..U+33479) are \p{L}/\p{N} to `regex` and "other" to tiktoken, which changes the ids:
with X = U+323B0, "X's" would be "X" + "'s" by `regex`'s tables but "X'" + "s" in tiktoken. We take
tiktoken's side: these code points are taken out of our letter and number classes, and `regex`
must know at least Unicode 16.0 (version 2024.9.11 on, as requirements.txt asks).

The list comes from probing all 1,114,112 code points with both libraries; tests/tokenizer/test_tokenizer.py
repeats the probe and prints what to change here if either library moves to a newer Unicode.
>>> import regex
>>> [bool(regex.fullmatch(LETTER, c, regex.VERSION1)) for c in "a\U000323B0"]  # a, CJK Extension J
[True, False]
"""
NEWER_THAN_UNICODE_16 = {
    "letters": "0558 058B-058C 088F 0C5C 0CDC 208F 209D-209F A7CE-A7CF A7D2 A7D4 A7DD A7E2 A7F1 AB6C-AB6D "
               "107BB-107BF 10940-10959 10EC5-10EC7 10ED9-10EEE 11B0A 11DB0-11DDB 11DF1 16EA0-16EB8 "
               "16EBB-16ED3 16FF2-16FF3 187F8-187FF 18CD6-18CDA 18D09-18D20 18D80-18DF2 18E00-19191 "
               "191A0-191D2 1B123-1B128 1B168 1D6A6 1DF1F-1DF24 1DF2B-1DF81 1DF90-1DF96 1DFCD-1DFFF "
               "1E6C0-1E6DE 1E6E0-1E6E2 1E6E4-1E6E5 1E6E7-1E6ED 1E6F0-1E6F4 1E6FE-1E6FF 2B73A-2B73F "
               "2B81E 2CEA2-2CEAD 323B0-33479 3D000-3FC3F",
    "numbers": "11DE0-11DE9 1246F 12475-1247F 12550-12686 16FF4-16FF6",
}


def code_point_ranges(ranges):
    """ "0558 058B-058C" (hex code points and ranges) -> the inside of a regex character class.

    >>> print(code_point_ranges("0558 058B-058C"))
    \\U00000558\\U0000058B-\\U0000058C
    """
    return "".join("-".join(rf"\U{int(c, 16):08X}" for c in r.split("-")) for r in ranges.split())


# Letters and numbers as tiktoken sees them: `regex`'s set difference A--B (VERSION1 syntax).
LETTER = rf"[\p{{L}}--[{code_point_ranges(NEWER_THAN_UNICODE_16['letters'])}]]"
NUMBER = rf"[\p{{N}}--[{code_point_ranges(NEWER_THAN_UNICODE_16['numbers'])}]]"

