"""A StructuredSpec as llguidance's grammar text, checked: what the gateway runs to refuse a bad grammar with a 400
and what an engine compiles. llguidance alone (no torch); holds no state."""

import json

import llguidance

from engines.base.errors import InvalidRequestError
from engines.base.structured import StructuredSpec

_ANY_JSON_OBJECT = json.dumps({"type": "object"})


def grammar_text(spec: StructuredSpec) -> str:
    """llguidance's grammar for `spec`; InvalidRequestError (naming the field) for one it cannot compile."""
    kind, value = spec.kind, spec.value
    if kind == "json_object":
        kind, value = "json_schema", _ANY_JSON_OBJECT
    try:
        grammar = llguidance.grammar_from("lark" if kind == "grammar" else kind, value)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"the {spec.kind} grammar does not compile: {exc}", param=spec.field) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise InvalidRequestError(f"the {spec.kind} grammar does not compile: {'; '.join(messages)}", param=spec.field)
    return grammar
