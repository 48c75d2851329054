"""Holds the fake tensorrt_llm (fake_trtllm.py), and the adapter's own TensorRT-LLM names, to a snapshot of the
release's source (engines/trtllm/api_surface.json): every class, field, enum member, method parameter, LLM
argument, attribute and KV event key they use must exist there, with a default where the fake gives one."""

import ast
import dataclasses
import enum

from engines.trtllm import build
from services.common.worker_settings import TRTLLM_TRANSCEIVERS
from tests.unit.engines.trtllm import fake_trtllm as fake


def mismatches(snapshot: dict) -> list[str]:
    """What the fake or the adapter uses that the snapshot does not have (empty: they agree)."""
    classes = snapshot["classes"]
    problems = []
    for name in fake.FAKED:
        real = classes.get(name)
        problems += [f"no class {name}"] if real is None else _class_problems(name, getattr(fake, name), real)
    llm = classes.get("BaseLLM", {"methods": {}, "attributes": []})
    problems += _method_problems("LLM", fake.LLM_METHODS, llm["methods"])
    problems += [f"LLM has no attribute {a}" for a in fake.LLM_ATTRIBUTES if a not in llm["attributes"]]
    executor = classes.get("GenerationExecutor", {"methods": {}})
    problems += _method_problems("GenerationExecutor", fake.EXECUTOR_METHODS, executor["methods"])
    problems += [
        f"GenerationExecutor has no attribute {a}"
        for a in fake.EXECUTOR_ATTRIBUTES
        if a not in executor.get("attributes", [])
    ]
    problems += [f"LLM(...) takes no {arg}" for arg in fake.LLM_ARGS if arg not in llm_arguments(classes)]
    results = result_names(classes)
    problems += [f"GenerationResult has no {n}" for n in fake.RESULT_NAMES if n not in results]
    for rel, names in fake.EXPORTS.items():
        bound = snapshot["exports"].get(rel, [])
        problems += [f"{rel} does not export {n}" for n in names if n not in bound]
    events = snapshot["kv_events"]
    problems += [f"KV events have no key {k!r}" for k in fake.KV_EVENT_KEYS if k not in events["keys"]]
    problems += [f"KV events have no type {t!r}" for t in fake.KV_EVENT_TYPES if t not in events["types"]]
    return problems + adapter_mismatches(classes)


def adapter_mismatches(classes: dict) -> list[str]:
    """The names the adapter spells itself: quantization algorithms and cache transceiver backends."""
    members = classes.get("QuantAlgo", {}).get("members", [])
    problems = [f"QuantAlgo has no {algo}" for algo in sorted(set(build._QUANT.values())) if algo not in members]
    backend = classes.get("CacheTransceiverConfig", {}).get("fields", {}).get("backend")
    allowed = literal_values(backend["annotation"]) if backend else set()
    return problems + [
        f"CacheTransceiverConfig.backend takes no {b!r}" for b in TRTLLM_TRANSCEIVERS if b != "off" and b not in allowed
    ]


def llm_arguments(classes: dict) -> set[str]:
    """What LLM(...) accepts: its own parameters and every field of the LlmArgs models it validates them with."""
    init = classes.get("BaseLLM", {}).get("methods", {}).get("__init__", {"params": []})
    args = set(init["params"])
    for name in ("BaseLlmArgs", "TorchLlmArgs", "TrtLlmArgs"):
        args |= set(classes.get(name, {}).get("fields", {}))
    return args


def result_names(classes: dict) -> set[str]:
    """Methods, properties and instance attributes of a GenerationResult, its base's included."""
    names: set[str] = set()
    for name in ("GenerationResultBase", "GenerationResult"):
        cls = classes.get(name, {"methods": {}, "attributes": [], "fields": {}})
        names |= set(cls["methods"]) | set(cls["attributes"]) | set(cls["fields"])
    return names


def literal_values(annotation: str) -> set[str]:
    """The strings of every Literal[...] in a type annotation's source text."""
    found = set()
    for node in ast.walk(ast.parse(annotation, mode="eval")):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            found |= {n.value for n in ast.walk(node.slice) if isinstance(n, ast.Constant)}
    return found


def _class_problems(name: str, faked, real: dict) -> list[str]:
    if isinstance(faked, type) and issubclass(faked, enum.Enum):
        return [f"{name} has no member {m}" for m in faked.__members__ if m not in real["members"]]
    if isinstance(faked, type) and issubclass(faked, BaseException):
        bases = [b.__name__ for b in faked.__bases__]
        return [f"{name} is not a {b}" for b in bases if b not in real["bases"]]
    if not dataclasses.is_dataclass(faked):
        return []
    problems = []
    for f in dataclasses.fields(faked):
        field = real["fields"].get(f.name)
        if field is None:
            problems.append(f"{name} has no field {f.name}")
        elif _has_default(f) and not field["default"]:
            problems.append(f"{name}.{f.name} has no default in the release")
    return problems


def _method_problems(owner: str, wanted: dict, methods: dict) -> list[str]:
    problems = []
    for method, params in wanted.items():
        real = methods.get(method)
        if real is None:
            problems.append(f"{owner} has no method {method}")
            continue
        problems += [
            f"{owner}.{method} takes no {p}" for p in params if p not in real["params"] and not real["var_keyword"]
        ]
        required = [p for p in real["params"] if p not in real["optional"]]
        problems += [
            f"{owner}.{method} needs {p}, which the adapter does not pass" for p in required if p not in params
        ]
    return problems


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
