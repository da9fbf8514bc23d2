r"""agentrl's tools (installed as ``agentrl.tools``): the ``@tool`` decorator, built-in tools, call parsers.

* :func:`tool` turns a typed function with a Google-style docstring into a :class:`~agentrl.protocols.Tool`.
* Built-in tools: :data:`python` (:class:`PythonTool`, runs code in the episode's sandbox),
  :data:`calculator` (exact arithmetic, no ``eval``), :class:`LookupTool` (a small reference table).
* Parsers (:class:`ToolCallParser`): :class:`HermesParser` (``<tool_call>`` JSON),
  :class:`PythonBlockParser` (fenced ```python blocks, tool-integrated reasoning), and the formats of other
  model families: :class:`LlamaJsonParser`, :class:`MistralParser`, :class:`Qwen3CoderParser`,
  :class:`DeepSeekV3Parser`, :class:`HarmonyParser` (gpt-oss); :func:`detect_tool_format`.
* :mod:`agentrl.tools.mcp`: MCP servers as tools (``MCPServer``; needs the ``mcp`` extra).
* :class:`ToolExecutor` runs a parsed turn's calls and records each as a :class:`~agentrl.types.ToolRecord`.
* :func:`extract_answer` / :func:`parse_number` read a final answer (``\boxed{}`` or ``Answer:``) exactly.

Tools receive their sandbox by injection (``ToolContext.sandbox``); this package never imports
``agentrl.sandbox``.
"""

from .answers import extract_answer, parse_number, same_number, strip_code_blocks
from .calculator import CalculatorError, calculator, evaluate
from .executor import ToolExecutor, as_tools
from .formats import (
    DeepSeekV3Parser,
    HarmonyParser,
    LlamaJsonParser,
    MistralParser,
    Qwen3CoderParser,
    detect_tool_format,
)
from .function import FunctionTool, tool
from .lookup import LookupTool
from .parsers import (
    PARSERS,
    CallError,
    HermesParser,
    ParsedTurn,
    PythonBlockParser,
    ToolCallParser,
    get_parser,
)
from .python import PythonTool, format_exec_result, python

__all__ = [
    "PARSERS",
    "CalculatorError",
    "CallError",
    "DeepSeekV3Parser",
    "FunctionTool",
    "HarmonyParser",
    "HermesParser",
    "LlamaJsonParser",
    "LookupTool",
    "MistralParser",
    "ParsedTurn",
    "PythonBlockParser",
    "PythonTool",
    "Qwen3CoderParser",
    "ToolCallParser",
    "ToolExecutor",
    "as_tools",
    "calculator",
    "detect_tool_format",
    "evaluate",
    "extract_answer",
    "format_exec_result",
    "get_parser",
    "parse_number",
    "python",
    "same_number",
    "strip_code_blocks",
    "tool",
]
