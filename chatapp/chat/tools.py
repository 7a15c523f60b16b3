"""nanochat's calculator as a state machine over the token stream.

The model writes <|python_start|>expr<|python_end|>; we evaluate expr safely and force
<|output_start|>result<|output_end|> into the stream. The forced tokens go through the
model into the cache like any others, so the cache invariant is untouched.
"""

from __future__ import annotations

from chatapp.chat.calculator import evaluate
from chatapp.chat.events import ToolCall
from model.chat_formats.templates import ChatTemplate
from model.tokenizers.tokenizer import Tokenizer


class ToolRunner:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer):
        self.ids = template.tool_tokens
        self.tokenizer = tokenizer
        self.expr: list[int] | None = None  # tokens since <|python_start|>, while inside a call
        self.calls: list[ToolCall] = []
        self.new_call: ToolCall | None = None

    def after(self, token: int) -> list[int]:
        """Called for each generated token; returns the tokens to force next (maybe none)."""
        self.new_call = None
        if not self.ids:
            return []
        if token == self.ids["python_start"]:
            self.expr = []
        elif token == self.ids["python_end"] and self.expr:  # an empty call is ignored, as nanochat does
            expr = self.tokenizer.decode(self.expr)
            self.expr = None
            self.new_call = ToolCall(expr, evaluate(expr))
            self.calls.append(self.new_call)
            if self.new_call.result is not None:
                return [self.ids["output_start"], *self.tokenizer.encode(self.new_call.result), self.ids["output_end"]]
        elif token == self.ids["python_end"]:
            self.expr = None
        elif self.expr is not None:
            self.expr.append(token)
        return []
