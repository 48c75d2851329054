"""The grammar a request's output must follow, as the engine contract carries it: what kind of grammar, its text,
and the request field that asked for it (named in any refusal). Pure data; compiling it is the engine's job."""

import json
from dataclasses import dataclass

from engines.base.errors import InvalidRequestError

# json_object: any JSON object; json_schema: a JSON schema (text); regex; choice: a JSON list of strings;
# grammar: a Lark (or GBNF) grammar, which may embed JSON schemas with %json (how tool calls are constrained)
KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 1 << 20  # 1 MiB: larger grammars are refused before anything compiles them


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    kind: str
    value: str = ""
    field: str = "response_format"  # the request field that asked for it

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"unknown structured output kind {self.kind!r}", param=self.field)
        if len(self.value) > MAX_SPEC_CHARS:
            raise InvalidRequestError(f"the grammar is larger than {MAX_SPEC_CHARS} characters", param=self.field)
        if self.kind == "choice":
            choices = json.loads(self.value) if self.value else None
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
                raise InvalidRequestError("choice takes a non-empty list of strings", param=self.field)
        elif self.kind != "json_object" and not self.value:
            raise InvalidRequestError(f"an empty {self.kind} is not a grammar", param=self.field)


def refuse_structured(spec: StructuredSpec | None) -> None:
    """For engines that cannot constrain their output: a structured request is refused, never run unconstrained."""
    if spec is not None:
        raise InvalidRequestError(
            f"`{spec.field}` is not supported by this engine: it does not constrain its "
            "output to a grammar (the native and trtllm engines do)",
            param=spec.field,
        )
