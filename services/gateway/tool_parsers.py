"""Tool-call formats, one class per model family: how a call is written in the prompt's history, the grammar that
forces calls (tool_choice required or a named function), and how calls are read back from generated text. Pure
string work: no tokenizer, no I/O. Chosen by name (--tool-parser) or from the chat template."""

import json
from dataclasses import dataclass

from services.gateway.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it


class ToolParser:
    name = ""
    marker = ""  # text that opens the calls; what comes before it is content
    args_key = "arguments"

    def render_call(self, name: str, arguments: str) -> str:
        raise NotImplementedError

    def calls_grammar(self, schemas: list[str], parallel: bool) -> str:
        """A Lark grammar (llguidance dialect) for one call, or several when `parallel`; `schemas` are the JSON
        schemas of each tool's {name, arguments} object."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content, calls) of a whole output; text that does not parse as calls stays content."""
        raise NotImplementedError

    def call_schema(self, name: str, parameters: dict | None) -> dict:
        """A forced call's JSON. NOTE: arguments stay within the declared properties unless the schema says
        otherwise (as OpenAI's strict mode requires): a small model would otherwise invent keys without end."""
        args = {"type": "object", "additionalProperties": False} | (parameters or {})
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", self.args_key],
            "properties": {"name": {"const": name}, self.args_key: args},
        }


def _json_body(schemas: list[str]) -> str:
    # NOTE: no free whitespace inside a forced call: a small model may otherwise emit blank lines until max_tokens
    options = {"whitespace_flexible": False}
    return "%json " + json.dumps({"x-guidance": options, "anyOf": [json.loads(s) for s in schemas]})


def _calls_from(objects: list) -> list[ParsedCall] | None:
    calls = []
    for obj in objects:
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(ParsedCall(obj["name"], args if isinstance(args, str) else json.dumps(args)))
    return calls


class HermesParser(ToolParser):
    """Hermes / Qwen 2.5+: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one block per call."""

    name, marker = "hermes", "<tool_call>"

    def render_call(self, name: str, arguments: str) -> str:
        return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'

    def calls_grammar(self, schemas: list[str], parallel: bool) -> str:
        more = ' ("\\n" call)*' if parallel else ""
        return f'start: call{more}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: {_json_body(schemas)}\n'

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.marker)
        if start < 0:
            return text, []
        # NOTE: each call's JSON is decoded whole, so a string holding "</tool_call>" does not end it early
        decoder, objects, pos = json.JSONDecoder(), [], start
        try:
            while (pos := text.find(self.marker, pos)) >= 0:
                body = pos + len(self.marker)
                body += len(text[body:]) - len(text[body:].lstrip())
                obj, pos = decoder.raw_decode(text, body)
                objects.append(obj)
        except json.JSONDecodeError:
            return text, []
        calls = _calls_from(objects)
        return (text, []) if not calls else (text[:start].strip(), calls)


class Llama3JsonParser(ToolParser):
    """Llama 3.1+ JSON tool calls: {"name": ..., "parameters": {...}}, several separated by "; "."""

    name, marker, args_key = "llama3_json", "{", "parameters"

    def render_call(self, name: str, arguments: str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": {arguments}}}'

    def calls_grammar(self, schemas: list[str], parallel: bool) -> str:
        more = ' ("; " body)*' if parallel else ""
        return f"start: body{more}\nbody: {_json_body(schemas)}\n"

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        decoder, objects, pos = json.JSONDecoder(), [], 0
        try:
            while pos < len(body):
                obj, pos = decoder.raw_decode(body, pos)
                objects.append(obj)
                pos = len(body) - len(body[pos:].lstrip().removeprefix(";").lstrip())
        except json.JSONDecodeError:
            return text, []
        calls = _calls_from(objects)
        return (text, []) if not calls else ("", calls)


class MistralParser(ToolParser):
    """Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]."""

    name, marker = "mistral", "[TOOL_CALLS]"

    def render_call(self, name: str, arguments: str) -> str:
        return f'[TOOL_CALLS][{{"name": {json.dumps(name)}, "arguments": {arguments}}}]'

    def calls_grammar(self, schemas: list[str], parallel: bool) -> str:
        more = ' (", " body)*' if parallel else ""
        return f'start: "[TOOL_CALLS][" body{more} "]"\nbody: {_json_body(schemas)}\n'

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        start = text.find(self.marker)
        if start < 0:
            return text, []
        try:
            objects = json.loads(text[start + len(self.marker) :].strip())
        except json.JSONDecodeError:
            return text, []
        calls = _calls_from(objects if isinstance(objects, list) else [objects])
        return (text, []) if not calls else (text[:start].strip(), calls)


PARSERS = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}
PARSER_NAMES = ("auto", *PARSERS)


def parser_for(name: str, chat_template: str | None) -> ToolParser:
    """The parser named (--tool-parser), or for "auto" the one the chat template's own tool syntax names."""
    if name != "auto":
        if name not in PARSERS:
            raise InvalidRequestError(f"unknown tool parser {name!r}; one of {', '.join(PARSER_NAMES)}")
        return PARSERS[name]()
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return MistralParser()
    if "<|python_tag|>" in template or "ipython" in template:
        return Llama3JsonParser()
    return HermesParser()  # NOTE: also for templates with no tool syntax (SmolLM2): the default system prompt's
