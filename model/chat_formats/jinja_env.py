"""Chat templates rendered the way transformers' `apply_chat_template` renders them.

The environment copies transformers' (utils/chat_template_utils.py): an immutable sandbox
(templates come from model files: untrusted code), trim_blocks and lstrip_blocks, the
loopcontrols extension, a `tojson` that does not escape HTML, `raise_exception`,
`strftime_now`, and the special tokens' strings as variables. tests/test_chat_formats.py
checks it renders every stored vendor template as transformers does. Unlike transformers' it is
bounded: output size, steps, time and nesting (chat_formats/bounded.py), while it compiles as
while it renders; and whatever a template raises is one line, a jinja2.TemplateError.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import lru_cache

import jinja2
import jinja2.ext

from model.chat_formats.bounded import (
    BoundedSandbox,
    Budget,
    Limits,
    TemplateBudgetError,
    bounded_filter,
    budgeted,
    failed,
)

LIMITS = Limits()
MAX_SOURCE = 1 << 20  # characters of template source (the largest vendor template we know: ~20 KB)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """TemplateError (one line) for a template that cannot compile, a nesting too deep included;
    what jinja2 evaluates while compiling is bounded (bounded.py)."""
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = bounded_filter("tojson", tojson)
    env.globals["raise_exception"] = raise_exception
    if len(source) > MAX_SOURCE:
        raise TemplateBudgetError(f"the chat template is {len(source):,} characters (at most {MAX_SOURCE:,})")
    return compile_bounded(env, source, LIMITS)


def render(source: str, messages: list[dict], strftime: Callable[[str], str], add_generation_prompt: bool = True,
           limits: Limits = LIMITS, **special: str | None) -> str:
    """The template over `messages` with the generation prompt added (by default), as the model
    sees it before it answers. `special` holds bos_token, eos_token, ... (their strings). Bounded
    (chat_formats/bounded.py): past `limits`, TemplateBudgetError, a jinja2.TemplateError."""
    size = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
    return render_bounded(compile_template(source), limits, size, messages=messages, tools=None, documents=None,
                          add_generation_prompt=add_generation_prompt, strftime_now=strftime, **special)


def render_bounded(template: jinja2.Template, limits: Limits, input_size: int, **context) -> str:
    """Render under a fresh budget: output, steps and time bounded; recursion caught; any other
    exception the template raises is TemplateFailed (one line)."""
    b = Budget(limits, limits.output_bytes + 4 * input_size, time.perf_counter() + limits.seconds)
    with budgeted(b):
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
        except jinja2.TemplateError:
            raise
        except Exception as e:  # the template's own code failed: 1//0, "%d" % "x", sum over an int
            raise failed(e) from None


def compile_bounded(env: jinja2.Environment, source: str, limits: Limits) -> jinja2.Template:
    """Compile under a budget: what jinja2 evaluates while compiling is bounded as a render is."""
    with budgeted(Budget(limits, limits.output_bytes, time.perf_counter() + limits.seconds)):
        try:
            return env.from_string(source)
        except (RecursionError, SyntaxError, MemoryError, OverflowError) as e:  # 1,000 nested ifs
            raise TemplateBudgetError(f"the chat template is nested too deeply to compile ({type(e).__name__})") \
                from None
        except jinja2.TemplateError:
            raise
        except Exception as e:
            raise failed(e) from None
