"""Chat templates rendered the way transformers' `apply_chat_template` renders them.

The environment copies transformers' (utils/chat_template_utils.py): an immutable sandbox
(templates come from model files: untrusted code), trim_blocks and lstrip_blocks, the
loopcontrols extension, a `tojson` that does not escape HTML, `raise_exception`,
`strftime_now`, and the special tokens' strings as variables. tests/test_chat_formats.py
checks it renders every stored vendor template as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def render(source: str, messages: list[dict], strftime: Callable[[str], str], add_generation_prompt: bool = True,
           **special: str | None) -> str:
    """The template over `messages` with the generation prompt added (by default), as the model
    sees it before it answers. `special` holds bos_token, eos_token, ... (their strings)."""
    return compile_template(source).render(messages=messages, tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, strftime_now=strftime,
                                           **special)
