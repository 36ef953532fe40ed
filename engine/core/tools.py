"""Tool calling: the tools shown to the model (its chat template's own way where it has one, else a system prompt
in the Hermes/SmolLM2 format), the grammar that makes a forced call valid, and the model's calls parsed back."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from engine.errors import InvalidRequestError
from engine.types import StructuredKind, StructuredOutput

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()
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


def _call_schema(function: dict, defs: dict) -> dict:
    """One call's schema: {"name": its name, "arguments": its parameters}. Parameters that refer within themselves
    (pydantic's nested models: "$ref": "#/$defs/Address") move into `defs` under the function's name, their references
    rewritten to where they now are: inside the call's schema "#/$defs/..." would point at the grammar's root."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if '"$ref"' in json.dumps(parameters):
        key = f"parameters_of_{function['name']}"
        defs[key] = _moved_refs(parameters, f"#/$defs/{key}")
        parameters = {"$ref": f"#/$defs/{key}"}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _moved_refs(schema: object, base: str) -> object:
    """The schema with every local reference ("#...") made relative to `base`, where the schema now sits."""
    if isinstance(schema, dict):
        return {
            k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _moved_refs(v, base)
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_moved_refs(item, base) for item in schema]
    return schema


def call_grammar(tools: Sequence[dict], only: str | None = None, parallel: bool = False) -> StructuredOutput:
    """A grammar for `<tool_call>[ ... ]</tool_call>` holding one call (several when parallel) of the given tools (or
    only the named one), each with arguments valid against its parameters' schema."""
    functions = [t["function"] for t in tools if only is None or t["function"]["name"] == only]
    if not functions:
        raise InvalidRequestError(f"tool_choice names {only!r}, which is not in 'tools'")
    compact = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    defs: dict = {}
    schema: dict = {"anyOf": [_call_schema(f, defs) for f in functions], "x-guidance": compact}
    if defs:
        schema["$defs"] = defs
    item = json.dumps(schema)
    more = f' (",\\n" %json {item})*' if parallel else ""
    lark = f'start: "{OPEN}[\\n" call "\\n]{CLOSE}"\ncall: %json {item}{more}\n'
    return StructuredOutput(StructuredKind.GRAMMAR, lark)


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


def parse_calls(text: str, cut: bool = False) -> tuple[str, list[ToolCall]]:
    """The text outside tool calls, and the calls in it (a JSON list or a single object between the tags). cut: the
    reply was cut off (max tokens); a call block it left open is still a call, with the arguments written so far,
    and never text (the same as ToolCallStream streams it)."""
    calls: list[ToolCall] = []
    open_block = ""
    if cut and (start := text.rfind(OPEN)) >= 0 and text.find(CLOSE, start) < 0:
        text, open_block = text[:start], text[start + len(OPEN) :]
    elif cut:  # cut inside the opening tag itself ("<tool_c"): markup all the same
        text = text[: len(text) - open_tag_overlap(text)]
    for block in CALLS.findall(text):
        try:
            found = json.loads(block.strip())
        except json.JSONDecodeError:
            continue  # not a call after all: it stays in the text
        for call in found if isinstance(found, list) else [found]:
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                arguments = call.get("arguments", {})
                text_arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                calls.append(ToolCall(call["name"], text_arguments, new_call_id()))
    rest = CALLS.sub("", text).strip() if calls else text
    for name, arguments in scan_calls(open_block):
        if name is not None:
            calls.append(ToolCall(name, arguments or "", new_call_id()))
    return (rest.strip() if open_block else rest), calls


def open_tag_overlap(text: str, marker: str = OPEN) -> int:
    """How many characters at the end of text could begin the marker (a stream holds them back until the next piece
    decides)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def scan_calls(block: str) -> list[tuple[str | None, str | None]]:
    """The calls in a (partial) block: each one's name once complete, and its arguments' text so far (all of it
    once closed). Reads {"name": "...", "arguments": {...}} objects, in a list or alone."""
    calls: list[tuple[str | None, str | None]] = []
    position = 0
    while (key := block.find('"name"', position)) >= 0:
        colon = block.find(":", key)
        quote = block.find('"', colon + 1) if colon >= 0 else -1
        try:
            name, after = _DECODER.raw_decode(block, quote) if quote >= 0 else (None, 0)
        except json.JSONDecodeError:
            name = None
        if not isinstance(name, str):
            calls.append((None, None))
            return calls
        key = block.find('"arguments"', after)
        colon = block.find(":", key) if key >= 0 else -1
        if colon < 0:
            calls.append((name, None))
            return calls
        start = colon + 1
        while start < len(block) and block[start] in " \t\r\n":
            start += 1
        end = _value_end(block, start)
        calls.append((name, block[start : len(block) if end is None else end]))
        if end is None:
            return calls
        position = end
    return calls


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON object (or string) starting at `start` ends, or None while it is still open."""
    if start >= len(text):
        return None
    if text[start] != "{":
        try:
            return _DECODER.raw_decode(text, start)[1]
        except json.JSONDecodeError:
            return None
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None
