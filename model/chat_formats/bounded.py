"""A jinja2 sandbox that also bounds what a template may cost: output size, steps, time, nesting.

jinja2's sandbox stops attribute escapes, not CPU or memory: `{{ 'ab' * 3000000000 }}`, a `join`
over a huge list, a namespace string doubled in a loop, nested `range` loops and recursive macros
ran to 10 GB or past a minute (issue 27). Here every way a template can grow a value or spin is
routed through a check against the render's `Budget`:

- the binary operators that build big values (`*`, `+`, `**`) and `~` (the code generator is
  ours, so concatenation calls `environment.concat`) check the size before computing it;
- every attribute and item read, call, filter and `range` step counts a step and checks the
  clock; values read back and filter results are size-checked (a doubled string is caught at
  its next read), and integer arguments larger than the output budget are refused;
- the rendered output is counted chunk by chunk; compile-time and render-time recursion errors
  become budget errors.

A limit reached raises `TemplateBudgetError`, a `jinja2.TemplateError`, in one line naming the
limit: callers that handle template errors handle it too.
"""

from __future__ import annotations

import contextvars
import functools
import math
import time
from collections.abc import Sized
from dataclasses import dataclass

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment


@dataclass(frozen=True)
class Limits:
    output_bytes: int = 16 << 20   # plus 4x the input's size: a chat holding a 64 MB file still renders
    steps: int = 2_000_000         # attribute/item reads, calls, filters, loop steps (a vendor template: ~1e3)
    seconds: float = 2.0


class TemplateBudgetError(jinja2.exceptions.SecurityError):
    """The template went past one of its render limits."""


@dataclass
class Budget:
    limits: Limits
    size: int           # the largest string or sequence any step may make
    deadline: float
    steps: int = 0
    output: int = 0

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.limits.steps:
            raise TemplateBudgetError(f"the chat template ran past {self.limits.steps:,} steps")
        if not self.steps & 255 and time.perf_counter() > self.deadline:
            raise TemplateBudgetError(f"the chat template ran past {self.limits.seconds:g} s")

    def sized(self, value, what: str = "a value"):
        if isinstance(value, str | bytes | list | tuple | dict) and len(value) > self.size:
            raise TemplateBudgetError(f"the chat template made {what} of {len(value):,} items "
                                      f"(at most {self.size:,})")
        return value

    def ints(self, args, what: str) -> None:
        for a in args:
            if type(a) is int and abs(a) > self.size:
                raise TemplateBudgetError(f"the chat template passed {what} a number of {abs(a):,} "
                                          f"(at most {self.size:,})")


CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("template_budget", default=None)


def budget() -> Budget | None:
    return CURRENT.get()


class BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` calls `environment.concat(...)`, which checks the joined size first."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def length(x) -> int:
    return len(x) if isinstance(x, Sized) else len(str(x))


class BoundedSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "+", "**"})

    def __init__(self, **options):
        super().__init__(**options)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals["range"] = counted_range
        self.globals["lipsum"] = bounded_lipsum

    def concat(self, parts) -> str:
        b = budget()
        parts = [str(p) for p in parts]
        if b is not None:
            b.step()
            if sum(map(len, parts)) > b.size:
                raise TemplateBudgetError(f"the chat template joined a string past {b.size:,} characters")
        return "".join(parts)

    def call_binop(self, context, operator, left, right):
        b = budget()
        if b is not None:
            b.step()
            check_binop(b, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj, attribute):
        b = budget()
        value = super().getattr(obj, attribute)
        if b is not None:
            b.step()
            b.sized(value, f"a value ({attribute})")
        return value

    def getitem(self, obj, argument):
        b = budget()
        value = super().getitem(obj, argument)
        if b is not None:
            b.step()
            b.sized(value)
        return value

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own signature)
        b = budget()
        if b is not None:
            b.step()
            b.ints([*args, *kwargs.values()], "a call")
        value = super().call(__context, __obj, *args, **kwargs)
        return b.sized(value, "a call's result") if b is not None else value


def check_binop(b: Budget, op: str, left, right) -> None:
    """Refuse before computing: a repeat, a join or a power whose result would be too large."""
    if op == "*":
        seq, n = (left, right) if type(right) is int else (right, left) if type(left) is int else (None, 0)
        if isinstance(seq, str | list | tuple) and len(seq) * max(n, 0) > b.size:
            raise TemplateBudgetError(f"the chat template repeated a value {n:,} times (past {b.size:,} items)")
        if type(left) is int and type(right) is int and left.bit_length() + right.bit_length() > 1 << 16:
            raise TemplateBudgetError("the chat template multiplied numbers too large")
    elif op == "+":
        if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple) \
                and len(left) + len(right) > b.size:
            raise TemplateBudgetError(f"the chat template joined values past {b.size:,} items")
    elif op == "**" and type(left) is int and type(right) is int:
        if right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > 1 << 16:
            raise TemplateBudgetError(f"the chat template raised a number to the power {right:,}")


def bounded_filter(name: str, f):
    @functools.wraps(f)  # keeps jinja2's pass_context / pass_eval_context marks
    def run(*args, **kwargs):
        b = budget()
        if b is not None:
            b.step()
            b.ints(args[1:] if args else (), f"the {name} filter")
            b.ints(kwargs.values(), f"the {name} filter")
            expanding(b, name, args, kwargs)
            if name == "join":  # [big] * 100000 | join: the result's size is known before it is made
                seq = next((a for a in args if isinstance(a, list | tuple)), ())
                if sum(length(x) for x in seq) > b.size:
                    raise TemplateBudgetError(f"the chat template joined a list past {b.size:,} characters")
        value = f(*args, **kwargs)
        if b is not None and isinstance(value, str | list | tuple):
            b.sized(value, f"the {name} filter's result")
        return value
    return run


WIDTH_FILTERS = ("indent", "center", "tojson")  # their numbers are widths repeated per line or item
MAX_WIDTH = 4096


def expanding(b: Budget, name: str, args: tuple, kwargs: dict) -> None:
    """The filters whose result can be far larger than their input: bounded before they run."""
    if name in WIDTH_FILTERS:
        numbers = [a for a in (*args[1:], *kwargs.values()) if type(a) is int]
        if any(abs(n) > MAX_WIDTH for n in numbers):
            raise TemplateBudgetError(f"the chat template passed the {name} filter a width over {MAX_WIDTH:,}")
    text = next((a for a in args if isinstance(a, str)), None)
    if text is None:
        return
    if name == "indent":
        width = next((a for a in (*args[args.index(text) + 1:], *kwargs.values()) if type(a) is int), 4)
        grows = text.count("\n") * abs(width)
    elif name == "replace" and len(args) >= args.index(text) + 3:
        old, new = (str(x) for x in args[args.index(text) + 1:args.index(text) + 3])
        grows = (text.count(old) if old else len(text) + 1) * max(len(new) - len(old), 0)
    else:
        return
    if len(text) + grows > b.size:
        raise TemplateBudgetError(f"the chat template's {name} filter would make {len(text) + grows:,} characters "
                                  f"(at most {b.size:,})")


def counted_range(*args: int):
    """`range` whose every step counts (nested loops of 100,000 each are 10**10 steps)."""
    b = budget()
    r = range(*args)
    if b is None:
        return r
    if len(r) > b.limits.steps:
        raise TemplateBudgetError(f"the chat template asked for a range of {len(r):,} (at most {b.limits.steps:,})")
    return counting(b, r)


def counting(b: Budget, r: range):
    for i in r:
        b.step()
        yield i


def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 (jinja2's names)
    from jinja2.utils import generate_lorem_ipsum

    if not (0 <= n <= 100 and 0 <= min <= max <= 1000):
        raise TemplateBudgetError("the chat template asked lipsum for more than 100 paragraphs of 1,000 words")
    return generate_lorem_ipsum(n, html, min, max)


def render_bounded(template: jinja2.Template, limits: Limits, input_size: int, **context) -> str:
    """Render under a fresh budget: output, steps and time bounded; recursion caught."""
    b = Budget(limits, limits.output_bytes + 4 * input_size, time.perf_counter() + limits.seconds)
    token = CURRENT.set(b)
    try:
        out = []
        for chunk in template.generate(**context):
            b.output += len(chunk)
            if b.output > b.size:
                raise TemplateBudgetError(f"the chat template's output passed {b.size:,} characters")
            b.step()
            out.append(chunk)
        return "".join(out)
    except RecursionError:
        raise TemplateBudgetError("the chat template recursed too deeply") from None
    except MemoryError:
        raise TemplateBudgetError("the chat template ran out of memory") from None
    finally:
        CURRENT.reset(token)
