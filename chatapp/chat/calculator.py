"""nanochat's calculator tool, without eval.

nanochat's engine (use_calculator) drops commas, then evaluates with Python's eval either
an arithmetic expression (digits, + - * / . ( ) and spaces; no **) or, for its
spelling tasks, an expression calling str.count on string literals. We take the same
two gates, then parse with `ast` and walk a whitelist of node types ourselves. Results
are formatted as nanochat formats them: str() of the Python value. Anything else,
including results past our size bound, is None: no output block, as in nanochat.

Deliberate differences from eval, all on inputs no nanochat model is trained to write:
only .count is callable (eval would also run other str methods, `not`, `if`), and a
bare `...` is refused rather than printed as "Ellipsis".
"""

from __future__ import annotations

import ast
import operator
import string
import time
import warnings

MATH_CHARS = frozenset("0123456789*+-/.() ")
STRING_CHARS = frozenset(string.ascii_letters + string.digits + "'\"()._ ")
# nanochat's own blocklist for the string form, matched on the lowercased expression.
BLOCKED = ("__", "import", "exec", "eval", "compile", "open", "file", "input", "raw_input", "globals",
           "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr")
MAX_CHARS = 10_000
MAX_INT_BITS = 3322  # about 1000 decimal digits: far past any answer, far below a slow one
TIME_LIMIT_S = 0.5

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
VALUE_TYPES = (int, float, str, bytes, tuple)


class Refused(Exception):
    """The expression leaves the whitelist or the bounds."""


def passes_gates(expr: str) -> bool:
    """nanochat's character gates: arithmetic without **, or a .count() on strings."""
    if all(c in MATH_CHARS for c in expr):
        return "**" not in expr
    if not all(c in STRING_CHARS for c in expr):
        return False
    lowered = expr.lower()
    return not any(p in lowered for p in BLOCKED) and ".count(" in expr


class _Evaluator:
    def __init__(self, time_limit: float):
        self.deadline = time.monotonic() + time_limit

    def value(self, node: ast.AST):
        if time.monotonic() > self.deadline:
            raise Refused("out of time")
        result = self._value(node)
        if type(result) is int and result.bit_length() > MAX_INT_BITS:
            raise Refused("number too large")
        return result

    def _value(self, node: ast.AST):
        if isinstance(node, ast.Constant):
            if type(node.value) not in VALUE_TYPES:  # bool, None, complex, Ellipsis
                raise Refused(f"constant {node.value!r}")
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            return BINARY[type(node.op)](self.value(node.left), self.value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            return UNARY[type(node.op)](self.value(node.operand))
        if isinstance(node, ast.Tuple) and not node.elts:
            return ()
        if isinstance(node, ast.Call):
            return self._count(node)
        raise Refused(type(node).__name__)

    def _count(self, node: ast.Call):
        f = node.func
        if not (isinstance(f, ast.Attribute) and f.attr == "count") or node.keywords or len(node.args) != 1:
            raise Refused("only s.count(x) may be called")
        target, needle = self.value(f.value), self.value(node.args[0])
        if type(target) not in (str, bytes):
            raise Refused("count on a non-string")
        return target.count(needle)  # a TypeError for a mismatched needle means None


def evaluate(expr: str, time_limit: float = TIME_LIMIT_S) -> str | None:
    """The text nanochat would force between <|output_start|> and <|output_end|>, or None."""
    expr = expr.replace(",", "")
    if len(expr) > MAX_CHARS or not passes_gates(expr):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for "2(3)"
            tree = ast.parse(expr.lstrip(" \t"), mode="eval")  # eval() strips leading blanks too
        result = _Evaluator(time_limit).value(tree.body)
        return str(result)
    except (Refused, SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError,
            MemoryError):
        return None
