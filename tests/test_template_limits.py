"""Issue 27 item 1: chat templates render under limits on output size, steps (loop iterations,
calls), time and nesting. The hostile templates the campaign found fail fast, in one line, and
within a small memory bound; the vendors' templates stay far inside the limits."""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import pytest

from model.chat_formats.bounded import Limits, TemplateBudgetError
from model.chat_formats.jinja_env import compile_template, render
from model.chat_formats.recognize import recognize, template_for

HOSTILE = {
    "repeat": ("{{ 'ab' * 3000000000 }}", "repeated a value"),
    "join": ("{{ (['x' * 1000000] * 100000) | join }}", "join filter would make"),
    "namespace": ("{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}"
                  "{% endfor %}{{ ns.x | length }}", "joined a string"),
    "doubling": ("{% set x = 'ab' * 1000 %}" + "{% set x = x ~ x %}" * 40 + "{{ x | length }}", "joined a string"),
    "nested-range": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    "lipsum": ("{{ lipsum(n=100000, min=1000, max=10000) }}", "lipsum"),
    "range-1e9": ("{{ range(10**9) | list }}", "a number of 1,000,000,000"),
    "recursive-macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "nested-ifs": ("{% if true %}" * 1000 + "x" + "{% endif %}" * 1000, "nested too deeply"),
    "center": ("{{ 'x' | center(10**9) }}", "center filter"),
    "indent": ("{{ ('x\n' * 100000) | indent(10000) }}", "indent filter"),
    "replace": ("{{ ('x' * 1000000) | replace('x', 'y' * 32) }}", "replace filter"),
}
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_fail_fast_in_one_line_with_bounded_memory(name):
    source, words = HOSTILE[name]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(TemplateBudgetError, match=words) as e:
        render(source, USER, lambda f: "")
    assert time.perf_counter() - t0 < 2.5 and "\n" not in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KiB: far under 1 GB


def test_a_hostile_template_in_a_model_is_refused_at_load_naming_it(tiny):
    with pytest.raises(ValueError, match="chat template refused: the chat template repeated a value") as e:
        recognize(tiny.tokenizer, "<|im_start|>{{ 'ab' * 3000000000 }}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "data" / "chat_templates").glob("*.jinja")))
def test_vendor_templates_stay_far_inside_the_limits(path):
    """A hundredth of the steps and output and a fifth of the time still render them."""
    tight = Limits(output_bytes=Limits.output_bytes // 100, steps=Limits.steps // 100, seconds=Limits.seconds / 5)
    msgs = [{"role": r, "content": f"message {i}"} for i, r in enumerate(["user", "assistant"] * 20 + ["user"])]
    out = render(path.read_text(encoding="utf-8"), msgs, lambda f: "01 Dec 2026", tight, bos_token="<s>",
                 eos_token="</s>")
    assert "message 40" in out



# Issue 45: jinja2 folded constants while compiling, with no budget (center: 69 s, 4.3 GB), and
# `%` was not intercepted; ten more templates raised at load with a traceback.
COMPILE_TIME = {
    "center": ('{{ "x"|center(1000000000) }}', "center filter"),
    "indent-float": ('{{ "x"|indent(3e8) }}', "indent filter"),
    "percent-width": ('{{ "%1500000000s" % "x" }}', "% formatting would make 1,500,000,0"),
    "percent-precision": ('{{ "%.1000000000f" % 1.0 }}', "% formatting"),
    "format-filter": ('{{ "%1500000000s"|format("x") }}', "format filter would make"),
    "str-format": ('{{ "{:>1000000000}".format("x") }}', "str.format would make"),
    "join-separator": ("{{ ([''] * 1000000)|join('y' * 100) }}", "join filter would make"),
    "join-generator": ("{{ (['x' * 1000000] * 100)|map('trim')|join }}", "join filter would make"),
    "wordwrap": ('{{ ("x " * 1000000)|wordwrap(1, wrapstring="y" * 100) }}', "wordwrap filter would make"),
    "expandtabs": ('{{ ("\t" * 1000000).expandtabs(1000) }}', "str.expandtabs would make"),
    "str-join": ('{{ ",".join(["x" * 1000000] * 100) }}', "str.join would make"),
    "list-printed": ("{{ ['x' * 1000000] * 1000000 }}", "output would make"),
}
RAISING = {  # each failed at load with a traceback
    "floordiv": ("{{ 1//0 }}", "ZeroDivisionError"),
    "percent-c": ('{{ "%c" % 1114112 }}', "OverflowError"),
    "percent-d": ('{{ "%d" % "x" }}', "TypeError"),
    "format": ("{{ '{}'|format(1, 2) }}", "TypeError"),
    "encode": ('{{ "x".encode("nope") }}', "LookupError"),
    "slice": ("{{ [1, 2]|slice(0)|list }}", "ZeroDivisionError"),
    "sum": ("{{ 5|sum }}", "TypeError"),
    "sort": ("{{ 5|sort }}", "TypeError"),
    "first": ("{{ 5|first }}", "TypeError"),
}


@pytest.mark.parametrize("name", list(COMPILE_TIME))
def test_compile_time_and_formatting_are_bounded(name, tiny):
    source, words = COMPILE_TIME[name]
    compile_template.cache_clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"chat template not supported: .*{re.escape(words)}") as e:
        template_for(tiny.tokenizer, source)
    assert time.perf_counter() - t0 < 1.0 and "\n" not in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KiB


@pytest.mark.parametrize("name", list(RAISING))
def test_a_template_that_raises_is_refused_at_load_in_one_line(name, tiny):
    source, kind = RAISING[name]
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"chat template not supported: it fails on a plain chat .*{kind}") as e:
        template_for(tiny.tokenizer, source)
    assert time.perf_counter() - t0 < 1.0 and "\n" not in str(e.value)


def test_a_template_that_renders_nothing_is_refused_at_load(tiny):
    with pytest.raises(ValueError, match="chat template not supported: it renders a chat as nothing"):
        template_for(tiny.tokenizer, "{% if false %}x{% endif %}")
