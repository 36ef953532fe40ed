"""Tool calling: the tools shown to the model (its chat template's own way where it has one, else a system prompt
in the Hermes/SmolLM2 format), the grammar that makes a forced call valid, and the model's calls parsed back."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InvalidRequestError
from engine.types import StructuredOutput

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALLS = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. Based on "
    "the question, you will need to make one or more function/tool calls to achieve the purpose. If none of the "
    "functions can be used, answer in plain text.\n\nYou have access to the following tools:\n<tools>{tools}</tools>"
    "\n\nTo call tools, answer with exactly this format and no other text:\n"
    '<tool_call>[\n{{"name": "func_name1", "arguments": {{"argument1": "value1"}}}}\n]</tool_call>'
)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (the OpenAI API's form)
    call_id: str

    def openai(self, index: int | None = None) -> dict:
        call = {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def check_tools(tools: object) -> list[dict]:
    """OpenAI `tools`: a list of {"type": "function", "function": {"name", "description"?, "parameters"?}}."""
    if not isinstance(tools, list) or not tools:
        raise InvalidRequestError("'tools' must be a non-empty list of {type: function, function: {...}} objects")
    names = set()
    for number, tool in enumerate(tools, 1):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise InvalidRequestError(f"tool {number} must be {{type: function, function: {{name, parameters}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name in names:
            raise InvalidRequestError(f"tool {number} needs a unique name of letters, digits, _ . - (64 at most)")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidRequestError(f"tool {name!r}: 'parameters' must be a JSON schema object")
        names.add(name)
    return tools


def _call_schema(function: dict) -> dict:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def call_grammar(tools: Sequence[dict], only: str | None = None, parallel: bool = False) -> StructuredOutput:
    """A grammar for `<tool_call>[ ... ]</tool_call>` holding one call (several when parallel) of the given tools (or
    only the named one), each with arguments valid against its parameters' schema."""
    functions = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    if not functions:
        raise InvalidRequestError(f"tool_choice names {only!r}, which is not in 'tools'")
    compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    item = json.dumps({"anyOf": [_call_schema(f) for f in functions], "x-guidance": compact})
    more = f' (",\\n" %json {item})*' if parallel else ""
    lark = f'start: "{OPEN}[\\n" call "\\n]{CLOSE}"\ncall: %json {item}{more}\n'
    return StructuredOutput("grammar", lark)


def template_knows_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def messages_with_tools(messages: list[dict], tools: Sequence[dict], tokenizer) -> tuple[list[dict], bool]:
    """The conversation for a model whose template lacks tools: the tools in a system prompt, earlier calls and
    results written as the model writes them. Returns (messages, whether the template takes `tools` itself)."""
    if template_knows_tools(tokenizer):
        return messages, True
    described = INSTRUCTIONS.format(tools=json.dumps([t["function"] for t in tools], ensure_ascii=False))
    out: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system":
            described = f"{content}\n\n{described}"
            continue
        if role == "assistant" and message.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": _arguments(c["function"])} for c in message["tool_calls"]
            ]
            content = (content + "\n" if content else "") + f"{OPEN}{json.dumps(calls, ensure_ascii=False)}{CLOSE}"
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    return [{"role": "system", "content": described}, *out], False


def _arguments(function: dict) -> object:
    arguments = function.get("arguments", {})
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def parse_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The text outside tool calls, and the calls in it (a JSON list or a single object between the tags)."""
    calls: list[ToolCall] = []
    for block in CALLS.findall(text):
        try:
            found = json.loads(block.strip())
        except json.JSONDecodeError:
            continue  # not a call after all: it stays in the text
        for call in found if isinstance(found, list) else [found]:
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                arguments = call.get("arguments", {})
                text_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                calls.append(ToolCall(call["name"], text_arguments, f"call_{uuid.uuid4().hex[:24]}"))
    rest = CALLS.sub("", text).strip() if calls else text
    return rest, calls
