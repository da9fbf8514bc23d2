"""``calculator``: exact arithmetic on a parsed expression tree. No ``eval``, no names beyond a whitelist.

Integers stay integers of any size and ``/`` is exact (``7/2`` shows ``3.5``, ``1/3`` shows ``1/3``), so the
tool never rounds a large product. ``^`` means power, as on a calculator. Supported: ``+ - * / // % **``,
parentheses, and the functions ``abs round min max sqrt isqrt gcd lcm factorial comb`` plus ``pi`` and ``e``.
Sizes are bounded (expression length, result size, exponent, factorial argument), so a model cannot make
the process compute ``9**9**9``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from agentrl.errors import CalculatorError
from agentrl.protocols import ToolOutput
from agentrl.types import ToolStatus

from .function import tool

__all__ = ["CalculatorError", "calculator", "evaluate", "format_number"]

Number = int | Fraction | float

MAX_EXPRESSION_CHARS = 500
MAX_RESULT_BITS = 20_000  # about 6,000 decimal digits
MAX_FACTORIAL = 2000
MAX_NODES = 200


def _check_size(x: Number) -> Number:
    if isinstance(x, Fraction) and x.denominator == 1:
        x = x.numerator  # keep whole numbers as int
    if isinstance(x, int) and x.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError("result too large")
    if isinstance(x, Fraction) and _bits(x) > MAX_RESULT_BITS:
        raise CalculatorError("result too large")
    if isinstance(x, float) and not math.isfinite(x):
        raise CalculatorError("result is not a finite number")
    return x


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    q = Fraction(a) / Fraction(b)
    return q.numerator if q.denominator == 1 else q


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("modulo by zero")
    return a % b


def _pow(a: Number, b: Number) -> Number:
    if isinstance(b, Fraction) and b.denominator == 1:
        b = b.numerator
    if isinstance(b, int):
        if a == 0 and b < 0:
            raise CalculatorError("division by zero")
        size = abs(b) * max(1, _bits(a))
        if size > MAX_RESULT_BITS and abs(a) != 1:
            raise CalculatorError("result too large")
        if b < 0 and not isinstance(a, float):
            return _div(1, Fraction(a) ** -b)
        return a**b
    result = float(a) ** float(b)
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    return result


def _bits(a: Number) -> int:
    if isinstance(a, int):
        return a.bit_length()
    if isinstance(a, Fraction):
        return max(a.numerator.bit_length(), a.denominator.bit_length())
    return 64


def _int_arg(name: str, x: Number, limit: int | None = None) -> int:
    if isinstance(x, Fraction) and x.denominator == 1:
        x = x.numerator
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    if not isinstance(x, int):
        raise CalculatorError(f"{name} needs integers")
    if limit is not None and abs(x) > limit:
        raise CalculatorError(f"{name} argument too large (at most {limit})")
    return x


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalculatorError("sqrt of a negative number")
    if isinstance(x, int):
        r = math.isqrt(x)
        if r * r == x:
            return r
    return math.sqrt(x)


_BINARY: dict[type, Callable[[Any, Any], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
    ast.BitXor: _pow,  # "^" is power on a calculator
}

_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": lambda x: abs(x),
    "round": lambda x, n=0: round(x, _int_arg("round", n, 100)) if n else round(x),
    "min": lambda *xs: min(xs),
    "max": lambda *xs: max(xs),
    "sqrt": _sqrt,
    "isqrt": lambda x: math.isqrt(_int_arg("isqrt", x)),
    "gcd": lambda *xs: math.gcd(*(_int_arg("gcd", x) for x in xs)),
    "lcm": lambda *xs: math.lcm(*(_int_arg("lcm", x) for x in xs)),
    "factorial": lambda n: math.factorial(_int_arg("factorial", n, MAX_FACTORIAL)),
    "comb": lambda n, k: math.comb(_int_arg("comb", n, 10 * MAX_FACTORIAL), _int_arg("comb", k)),
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression exactly where possible.

    Raises:
        CalculatorError: invalid syntax, an unsupported name or operation, or a result that is too large.
    """
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"invalid syntax: {e.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError("expression too long")
    return _check_size(_eval(tree.body))


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise CalculatorError(f"unsupported value {v!r}")
        # decimals are exact: 0.1 is 1/10, not the nearest binary float
        return Fraction(repr(v)) if isinstance(v, float) and math.isfinite(v) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except OverflowError:
            raise CalculatorError("result too large") from None
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _eval(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise CalculatorError(
                f"unknown function {node.func.id!r}; available: {', '.join(sorted(_FUNCTIONS))}"
            )
        args = [_eval(a) for a in node.args]
        try:
            return _check_size(fn(*args))
        except TypeError:
            raise CalculatorError(f"wrong number of arguments for {node.func.id}()") from None
        except (ValueError, OverflowError) as e:
            if isinstance(e, CalculatorError):
                raise
            raise CalculatorError(f"{node.func.id}(): {e}") from None
    raise CalculatorError(f"unsupported syntax: {ast.unparse(node)[:40]!r}")


def format_number(x: Number) -> str:
    """Integers in full, exact fractions as a terminating decimal or ``p/q``, floats to 12 digits."""
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return str(x.numerator)
        d = x.denominator
        while d % 2 == 0:
            d //= 2
        while d % 5 == 0:
            d //= 5
        if d == 1:  # terminates: print it exactly
            digits = 0
            while (x * 10**digits).denominator != 1:
                digits += 1
            return _decimal(x, digits)
        return f"{x.numerator}/{x.denominator}"
    if isinstance(x, float):
        return repr(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:.12g}"
    return str(x)


def _decimal(x: Fraction, digits: int) -> str:
    scaled = abs(x) * 10**digits
    s = str(int(scaled)).rjust(digits + 1, "0")
    return f"{'-' if x < 0 else ''}{s[:-digits]}.{s[-digits:]}"


@tool(thread=False)
def calculator(expression: str) -> ToolOutput:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports + - * / // % ** (or ^), parentheses, and abs, round, min, max, sqrt, isqrt, gcd, lcm,
    factorial, comb, pi, e.

    Args:
        expression: The expression, for example "(1234 * 5678 - 91) // 7".
    """
    try:
        return ToolOutput(format_number(evaluate(expression)))
    except CalculatorError as e:
        return ToolOutput(f"Error: {e}", ToolStatus.ERROR)
