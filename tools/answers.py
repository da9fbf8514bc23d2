r"""Final-answer extraction and exact number comparison for tasks with a numeric answer.

``extract_answer`` finds what the model committed to: the last ``\boxed{...}`` (braces balanced), or else the
last ``Answer: ...`` line (``Final answer:``, ``**Answer:**`` and a full-width colon also count). Code blocks
are ignored, so ``print("Answer:", x)`` inside a ```python block is not an answer.

``parse_number`` reads that answer as an exact :class:`fractions.Fraction`: integers (``1,234`` too),
decimals, ``a/b``, ``\frac{a}{b}``, a leading sign (unicode minus too), surrounding ``$`` and a trailing
period. When the whole string is not a number, it takes the part after the last ``=``, then a lone number in
the text (``42 apples``); two or more candidate numbers are ambiguous and give ``None``.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["extract_answer", "parse_number", "same_number", "strip_code_blocks"]

_CODE_BLOCK = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_ANSWER_LINE = re.compile(
    r"^[\s>*_#-]*(?:the\s+)?(?:final\s+)?answer\s*[*_]*\s*(?:is\s*[:：]?|[:：=])\s*[*_]*\s*(.+?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_NUMBER = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(rf"^{_NUMBER}$")
_FRACTION_RE = re.compile(rf"^({_NUMBER})\s*/\s*({_NUMBER})$")
_LATEX_FRAC_RE = re.compile(r"^([+-]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_FIND_NUMBERS = re.compile(rf"(?<![\w.]){_NUMBER}(?:\s*/\s*{_NUMBER})?(?![\w]|\.\d)")


def strip_code_blocks(text: str) -> str:
    """``text`` without fenced code blocks (an unclosed final block is dropped too)."""
    return _CODE_BLOCK.sub("", text)


def extract_answer(text: str) -> str | None:
    r"""The final answer in ``text``: the last ``\boxed{}`` content, else the last ``Answer:`` line."""
    prose = strip_code_blocks(text)
    boxed = _last_boxed(prose)
    if boxed is not None:
        return boxed.strip()
    lines = _ANSWER_LINE.findall(prose)
    if lines:
        return str(lines[-1]).strip().strip("*_").strip()
    return None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i != -1 and text[start + len("\\boxed") : i].strip() == "":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


def parse_number(answer: str | None) -> Fraction | None:
    """Read an answer string as an exact number, or ``None`` when it is not (unambiguously) one."""
    if answer is None:
        return None
    s = _normalize(answer)
    value = _parse_exact(s)
    if value is not None:
        return value
    if "=" in s:
        value = _parse_exact(_normalize(s.rsplit("=", 1)[1]))
        if value is not None:
            return value
    found = _FIND_NUMBERS.findall(s)
    if len(found) == 1:
        return _parse_exact(_normalize(found[0]))
    return None


def same_number(answer: str | None, expected: int | Fraction) -> bool:
    """True when ``answer`` parses to exactly ``expected``."""
    value = parse_number(answer)
    return value is not None and value == Fraction(expected)


def _normalize(s: str) -> str:
    s = s.strip().replace("\u2212", "-").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\text\{[^{}]*\}", "", s)
    s = s.strip().strip("$").strip()
    s = re.sub(r"^\\boxed\{(.*)\}$", r"\1", s)
    s = s.rstrip(".").strip()
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:
        s = s[1:-1].strip()
    return s


def _parse_exact(s: str) -> Fraction | None:
    if _NUMBER_RE.match(s):
        return Fraction(s.replace(",", ""))
    m = _FRACTION_RE.match(s)
    if m:
        num, den = (Fraction(g.replace(",", "")) for g in m.groups())
        return None if den == 0 else num / den
    m = _LATEX_FRAC_RE.match(s.replace(" ", ""))
    if m:
        sign, num_s, den_s = m.groups()
        top, bottom = _parse_exact(num_s), _parse_exact(den_s)
        if top is None or bottom is None or bottom == 0:
            return None
        return -top / bottom if sign == "-" else top / bottom
    return None
