"""The calculator evaluates what nanochat's eval-based use_calculator would, without eval.

Python's own eval serves as the oracle here, on inputs from the arithmetic alphabet only
(no names can appear in them, so evaluating them in a test is harmless).
"""

import string
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatapp.chat.calculator import MATH_CHARS, STRING_CHARS, evaluate


def oracle(expr: str) -> str | None:
    """What nanochat's use_calculator returns for an arithmetic-alphabet input, as text."""
    expr = expr.replace(",", "")
    assert set(expr) <= MATH_CHARS
    if "**" in expr:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = eval(expr, {"__builtins__": {}}, {})  # noqa: S307 - the oracle, on digits and operators only
    except Exception:
        return None
    return None if value is Ellipsis else str(value)  # "..." is the one documented difference


def number() -> st.SearchStrategy[str]:
    ints = st.integers(0, 10**7).map(str)
    grouped = st.integers(1000, 10**9).map(lambda n: f"{n:,}")  # models write 12,345
    decimals = st.tuples(st.integers(0, 999), st.integers(0, 999)).map(lambda p: f"{p[0]}.{p[1]}")
    bare = st.sampled_from([".5", "2.", "0.25", "00", "0"])
    return st.one_of(ints, grouped, decimals, bare)


def arithmetic() -> st.SearchStrategy[str]:
    sp = st.sampled_from(["", " ", "  "])

    def grow(inner):
        binop = st.tuples(inner, sp, st.sampled_from(["+", "-", "*", "/", "//"]), sp, inner)
        unary = st.tuples(st.sampled_from(["-", "+"]), inner)
        return st.one_of(binop.map("".join), unary.map("".join), inner.map(lambda e: f"({e})"))

    return st.recursive(number(), grow, max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(arithmetic())
def test_arithmetic_matches_python(expr):
    assert evaluate(expr) == oracle(expr)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=sorted(MATH_CHARS | {","}), max_size=40))
def test_any_text_of_the_arithmetic_alphabet_matches_python(expr):
    assert evaluate(expr) == oracle(expr)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=sorted(STRING_CHARS | MATH_CHARS | set("%@[]{}<>=!~^&|;:,\\\n\t#$?`")), max_size=60))
def test_never_raises_on_anything(expr):
    out = evaluate(expr)
    assert out is None or isinstance(out, str)
    if out is not None and not set(expr.replace(",", "")) <= MATH_CHARS:
        assert ".count(" in expr  # the only other door nanochat opens


# nanochat's engine refuses string expressions containing any of these, anywhere.
NANOCHAT_BLOCKLIST = ("__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input", "globals",
                      "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr")
words = st.text(alphabet=string.ascii_lowercase, min_size=0, max_size=12)


@settings(max_examples=200, deadline=None)
@given(words, words, st.sampled_from(["'", '"']))
def test_count_matches_str_count(word, sub, q):
    expr = f"{q}{word}{q}.count({q}{sub}{q})"
    blocked = any(b in expr.lower() for b in NANOCHAT_BLOCKLIST)
    assert evaluate(expr) == (None if blocked else str(word.count(sub)))


@pytest.mark.parametrize("expr, want", [
    ("12*7", "84"),
    ("10/2", "5.0"),                 # true division prints a float, as eval does
    ("0.1+0.2", "0.30000000000000004"),
    ("1,234 * 2", "2468"),           # commas are dropped first, as in nanochat
    ("7//2", "3"),
    ("-(3-5)", "2"),
    ("  1+1", "2"),                  # eval strips leading blanks
    ("'strawberry'.count('r')", "3"),
    ('"banana".count("an")', "2"),
    ("'a,b,c'.count(',')", "4"),     # commas go even inside strings: this is 'abc'.count('')
])
def test_examples(expr, want):
    assert evaluate(expr) == want


@pytest.mark.parametrize("expr", [
    "2**10",                          # the power operator is refused outright
    "9**9**9",
    "1/0",
    "",
    "12 34",
    "__import__('os').system('ls')",
    "'dir'.count('d')",               # nanochat's blocklist matches substrings
    "'abc'.upper().count('A')",       # only .count may be called
    "x.count('a')",                   # names are never looked up
    "'abc'.count('a') + 1",           # the string form has no operators
    "open('f').read().count('a')",
    "(1)(2)",
    "...",
])
def test_refused(expr):
    assert evaluate(expr) is None


def test_numbers_and_time_are_bounded():
    huge = "*".join(["9" * 900] * 6)   # 5400 digits: refused, quickly
    t0 = time.perf_counter()
    assert evaluate(huge) is None
    assert evaluate("9" * 2000) is None
    assert evaluate("(" * 150 + "1" + ")" * 150) == "1"
    assert evaluate("(" * 300 + "1" + ")" * 300) is None  # past the parser's nesting limit
    assert evaluate("1+" * 6000 + "1") is None            # past the length bound
    assert time.perf_counter() - t0 < 1.0
    assert evaluate("*".join(["9" * 300] * 3)) == str(int("9" * 300) ** 3)
