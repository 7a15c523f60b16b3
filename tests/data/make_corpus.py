"""Writes tokenizer_corpus.jsonl: strings that stress a byte-level BPE pre-tokenizer.

Run `python tests/data/make_corpus.py` to regenerate; the output is committed and seeded,
so it only changes when this script does. Characters whose UTF-8 needs a byte SmolLM2 has no
token for (\\x04 \\x06 \\x13 \\x14 \\x16 \\x1d, U+40000..U+BFFFF) are left out on purpose: the
reference tokenizer drops them silently and ours replaces them, which test_bpe checks apart.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "What is the capital of France?",
    "I'm sure you'll see they've done it, haven't they? He'd say we're fine.",
    "IT'S LOUD, ISN'T IT? YOU'LL SEE.", "O'Brien's dog's bone", "rock 'n' roll", "'tis the season",
    "Hello, world!", "e-mail me at jane.doe@example.com or visit https://example.org/a?b=1&c=2#x",
    "Mr. Smith paid $1,234.56 on 2024-03-15 at 10:45pm (+5% tax).", "Call +1 (555) 010-9999 ext. 42",
]
DIGITS = ["0", "7", "42", "123", "2024", "3.14159", "1,000,000", "1e-10", "0x1F", "v2.13.0", "a1b2c3",
          "١٢٣", "१२३", "１２３", "²³", "½ ¾", "Ⅻ", "12abc", "abc12", " 9", "  99", "\t7", "x=10;y=20"]
CODE = [
    "def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "const x = {a: 1, 'b': [2, 3]};", '{"key": "value", "n": 12, "ok": true}', "SELECT * FROM t WHERE id=7;",
    "if __name__ == '__main__':\n        main()", "#include <stdio.h>\nint main(void){return 0;}",
    "ls -la | grep '\\.py$' && echo done", "<div class=\"x\">&amp;&lt;</div>", "a->b->c; x >>= 2; y ??= z",
    "    \n        \n", "lambda: (yield)", "```python\nprint('hi')\n```", "$ pip install -e '.[test]'",
]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2002",
              "\u2009", "\u200a", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u200b", "\ufeff",
              "\u180e", "\u202f", "\u205f", "\u1680"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🏳️‍🌈", "❤️", "✨", "🤖", "☕", "🧑🏿‍💻", "1️⃣", "©", "™"]
SCRIPTS = ["naïve café résumé", "Zürich Straße", "Ελληνικά γράμματα", "Русский текст", "中文测试句子",
           "日本語のテキスト、カタカナ", "한국어 문장입니다", "العربية نص", "עברית טקסט", "हिन्दी वाक्य", "ภาษาไทย",
           "e\u0301 a\u0308 n\u0303", "Ａ Ｂ ｃ", "ﬁ ﬂ", "ǅ ǈ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𐍈 𓀀", "Ꭰ Ꮳ"]
SPECIALS = ["<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>", "<repo_name>", "<file_sep>",
            "<|im_", "im_end|>", "< |im_end| >", "<<|im_end|>>", "<|IM_END|>", "</s>", "<s>", "[INST]",
            "<jupyter_code>", "<|assistant|>", "<issue_start>x<issue_comment>"]
CONTROL = ["\x00", "\x01", "\x07", "\x1b[31mred\x1b[0m", "\x7f", "\x08", "\x1f", "\x15"]
# Where the Llama 3 / Qwen2 regexes, NFC and the added tokens matched in text are tested.
FAMILIES = [
    "DON'T", "WE'LL SEE", "I'M", "SHE'D", "THEY'RE", "YOU'VE", "IT'S", "'S'T'RE", "'ſ", "x'ſt", "don'T",
    "O'NEIL'S", "12345678", "1234567890123", " 12345", "３４５６", "a\r\nb", "\r\n\r\n", " \r\n",
    "x \r\n\t y", "\r", "a\rb", "\n\r", "  \r\n  ", "a.\r\n", "?!\n\n",
    "<think>", "</think>", "<think>\n\n</think>\n\n", "<think>x</think>", "<thinking>", "<think", "<<think>>",
    " <think> ", "<think>\u0338", "<\u0338think>", '<tool_call>\n{"name": "f"}\n</tool_call>', "<|eot_id|>",
    "<|begin_of_text|>", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|end_of_text|>",
    "<|im_start|>assistant\n<think>\n\n</think>\n\n", "A\u030a", "\u1100\u1161\u11a8", "a\u0323\u0302",
    "a\u0302\u0323", "\u212b", "\u2126", "e\u0301\u0301", "\u0958", "\u00c5\u0323", "\u0627\u0644\u0633\u064e\u0651",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u6f22\u5b57\u304b\u306a",
    "\u1112\u1161\u11ab \uae00",
]
POOLS = [SENTENCES, DIGITS, CODE, WHITESPACE, EMOJI, SCRIPTS, SPECIALS, CONTROL, FAMILIES]


def mixed(rng: random.Random) -> str:
    parts = [rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(2, 6))]
    return "".join(p if rng.random() < 0.5 else rng.choice(["", " ", "  ", "\n", "\t"]) + p for p in parts)


def random_chars(rng: random.Random) -> str:
    alphabet = "aZ09 '\t\n.,-_!?'sdmtlrve" + "".join(DIGITS) + "".join(WHITESPACE) + "".join(EMOJI[:4])
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))


def corpus() -> list[str]:
    rng = random.Random(20250207)
    fixed = [s for pool in POOLS for s in pool]
    # Each whitespace char next to letters, digits and more whitespace: where regexes disagree.
    fixed += [f"a{w}b" for w in WHITESPACE] + [f"x{w}{w}1" for w in WHITESPACE] + [f"{w} y" for w in WHITESPACE]
    fixed += [f"{d} {d}{d}" for d in DIGITS[:12]]
    out = fixed + [mixed(rng) for _ in range(260)] + [random_chars(rng) for _ in range(120)]
    seen: set[str] = set()
    return [s for s in out if not (s in seen or seen.add(s))]


def main() -> None:
    path = Path(__file__).with_name("tokenizer_corpus.jsonl")
    lines = corpus()
    path.write_text("".join(json.dumps({"text": s}, ensure_ascii=True) + "\n" for s in lines), encoding="utf-8")
    print(f"wrote {len(lines)} strings to {path}")


if __name__ == "__main__":
    main()
