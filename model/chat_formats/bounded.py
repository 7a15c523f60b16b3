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
- `%` formatting, `str.format`, and the filters and string methods whose result can dwarf their
  input (`format`, `center`, `indent`, `wordwrap`, `truncate`, `join`, `replace`, `expandtabs`,
  `translate`) have their result's size worked out from their arguments before they run;
- the rendered output is counted chunk by chunk; compile-time and render-time recursion errors
  become budget errors.

Compiling runs under a budget too (issue 45): jinja2 evaluates constant expressions while it
compiles (`{{ "x"|center(10**9) }}` took 69 s and 4 GB before any render began). The optimizer is
off, and what jinja2 still folds (each output expression) meets the same checks; one that fails is
left for the render, which refuses it in one line.

A limit reached raises `TemplateBudgetError`, a `jinja2.TemplateError`, in one line naming the
limit; any other exception a template raises (`1//0`, `"%d" % "x"`, a filter given an int) becomes
`TemplateFailed`, also a `jinja2.TemplateError`: callers that handle template errors handle both.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from model.chat_formats.sizes import filter_size, format_size, printf_size, str_method_size, text_size


@dataclass(frozen=True)
class Limits:
    output_bytes: int = 16 << 20   # plus 4x the input's size: a chat holding a 64 MB file still renders
    steps: int = 2_000_000         # attribute/item reads, calls, filters, loop steps (a vendor template: ~1e3)
    seconds: float = 2.0


class TemplateBudgetError(jinja2.exceptions.SecurityError):
    """The template went past one of its render limits."""


class TemplateFailed(jinja2.exceptions.TemplateError):
    """The template raised something else (a division by zero, a filter given the wrong type)."""


def failed(e: BaseException) -> TemplateFailed:
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return TemplateFailed(f"the chat template failed: {type(e).__name__}{': ' + first if first else ''}")


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
            if type(a) in (int, float) and abs(a) > self.size:
                raise TemplateBudgetError(f"the chat template passed {what} a number of {abs(a):,.0f} "
                                          f"(at most {self.size:,})")

    def makes(self, n: int, what: str) -> None:
        """Refuse a result of `n` characters or items before it is made."""
        if n > self.size:
            raise TemplateBudgetError(f"the chat template's {what} would make {n:,} characters (at most {self.size:,})")


CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("template_budget", default=None)


def budget() -> Budget | None:
    return CURRENT.get()


@contextlib.contextmanager
def budgeted(b: Budget) -> Iterator[Budget]:
    token = CURRENT.set(b)
    try:
        yield b
    finally:
        CURRENT.reset(token)


class BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` calls `environment.concat(...)`, which checks the joined size first."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})   # intercepted ones are never folded at compile time

    def __init__(self, **options):
        super().__init__(optimized=False, finalize=bounded_text, **options)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals["range"] = counted_range
        self.globals["lipsum"] = bounded_lipsum

    def concat(self, parts) -> str:
        b = budget()
        if b is not None:
            b.step()
            if sum(text_size(p, b.size) for p in parts) > b.size:
                raise TemplateBudgetError(f"the chat template joined a string past {b.size:,} characters")
        return "".join(map(str, parts))

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
            if isinstance(text := getattr(__obj, "__self__", None), str) and \
                    (n := str_method_size(text, __obj.__name__, args, kwargs, b.size)) is not None:
                b.makes(n, f"str.{__obj.__name__}")
        value = super().call(__context, __obj, *args, **kwargs)
        return b.sized(value, "a call's result") if b is not None else value

    def wrap_str_format(self, value):
        """`"{:>999999999}".format(x)`: sized from its fields before jinja2's formatter runs."""
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None

        @functools.wraps(wrapper)
        def bounded_format(*args, **kwargs):
            b = budget()
            if b is not None:
                b.makes(format_size(value.__self__, args, kwargs, b.size), "str.format")
            return wrapper(*args, **kwargs)
        return bounded_format


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
    elif op == "%" and isinstance(left, str):
        b.makes(printf_size(left, right, b.size), "% formatting")
    elif op == "**" and type(left) is int and type(right) is int:
        if right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > 1 << 16:
            raise TemplateBudgetError(f"the chat template raised a number to the power {right:,}")


WIDTH_FILTERS = ("indent", "center", "tojson")  # their numbers are widths repeated per line or item
MAX_WIDTH = 4096


def bounded_text(value):
    """Every `{{ ... }}` before it becomes text: a list of big strings prints as all of them."""
    b = budget()
    if b is not None and not isinstance(value, str):
        b.makes(text_size(value, b.size), "output")
    return value


# Filters that turn their value into text: a container's text is sized before they make it.
STRINGIFYING = frozenset({"string", "tojson", "pprint", "escape", "e", "forceescape", "safe", "lower", "upper",
                          "title", "capitalize", "trim", "striptags", "urlize", "urlencode", "wordcount"})


def bounded_filter(name: str, f):
    try:
        signature = inspect.signature(f)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(f)  # keeps jinja2's pass_context / pass_eval_context marks
    def run(*args, **kwargs):
        b = budget()
        if b is not None:
            b.step()
            if name == "join":   # a generator (map, select) is joined whole anyway: listed first, so it is sized
                args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
            b.ints(args[1:] if args else (), f"the {name} filter")
            b.ints(kwargs.values(), f"the {name} filter")
            if name in WIDTH_FILTERS:
                numbers = [a for a in (*args[1:], *kwargs.values()) if type(a) in (int, float)]
                if any(abs(n) > MAX_WIDTH for n in numbers):
                    raise TemplateBudgetError(f"the chat template passed the {name} filter a width over {MAX_WIDTH:,}")
            if name in STRINGIFYING and args:
                value = args[1] if isinstance(args[0], jinja2.nodes.EvalContext) and len(args) > 1 else args[0]
                b.makes(text_size(value, b.size), f"{name} filter")
            bound = bound_arguments(signature, args, kwargs)
            if bound is not None and (n := filter_size(name, bound, b.size)) is not None:
                b.makes(n, f"{name} filter")
        value = f(*args, **kwargs)
        if b is not None and isinstance(value, str | list | tuple):
            b.sized(value, f"the {name} filter's result")
        return value
    return run


def bound_arguments(signature: inspect.Signature | None, args: tuple, kwargs: dict) -> dict | None:
    """The filter's arguments by name (None when they do not fit: the filter raises that itself)."""
    if signature is None:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


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
