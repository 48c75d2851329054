"""Reads the part of TensorRT-LLM's Python API the adapter relies on from the package's source with `ast` into
api_surface.json, which the tests hold the fake to; re-run it on a new release (`--help`, docs/trtllm.md).
Must not import tensorrt_llm (that needs a GPU driver)."""

import argparse
import ast
import importlib.util
import json
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("api_surface.json")

CLASSES = {  # the names the snapshot keeps -> (file in the package, class there)
    "SamplingParams": ("sampling_params.py", "SamplingParams"),
    "GuidedDecodingParams": ("sampling_params.py", "GuidedDecodingParams"),
    "DisaggregatedParams": ("disaggregated_params.py", "DisaggregatedParams"),
    "KvCacheConfig": ("llmapi/llm_args.py", "KvCacheConfig"),
    "CacheTransceiverConfig": ("llmapi/llm_args.py", "CacheTransceiverConfig"),
    "BaseLlmArgs": ("llmapi/llm_args.py", "BaseLlmArgs"),
    "TorchLlmArgs": ("llmapi/llm_args.py", "TorchLlmArgs"),
    "TrtLlmArgs": ("llmapi/llm_args.py", "TrtLlmArgs"),
    "QuantConfig": ("models/modeling_utils.py", "QuantConfig"),
    "QuantAlgo": ("quantization/mode.py", "QuantAlgo"),
    "Logprob": ("executor/result.py", "Logprob"),
    "CompletionOutput": ("executor/result.py", "CompletionOutput"),
    "GenerationResultBase": ("executor/result.py", "GenerationResultBase"),
    "GenerationResult": ("executor/result.py", "GenerationResult"),  # what generate_async returns (as RequestOutput)
    "RequestError": ("executor/utils.py", "RequestError"),
    "BaseLLM": ("llmapi/llm.py", "BaseLLM"),
    "GenerationExecutor": ("executor/executor.py", "GenerationExecutor"),
}
EXPORTS = ("__init__.py", "llmapi/__init__.py", "_tensorrt_engine/__init__.py")  # where api.py imports from
KV_EVENTS = ("_utils.py", "KVCacheEventSerializer")  # turns the executor's KV events into the dicts the adapter reads


class SourceError(Exception):
    """The source given has no file or class the snapshot needs."""


class Source:
    """Text of the package's files, from a directory (a checkout or the package itself) or a wheel."""

    def __init__(self, read: Callable[[str], str]):
        self._read = read

    @classmethod
    def at(cls, path: Path) -> "Source":
        if path.suffix == ".whl":
            archive = zipfile.ZipFile(path)
            return cls(lambda rel: archive.read(f"tensorrt_llm/{rel}").decode())
        package = path / "tensorrt_llm" if (path / "tensorrt_llm").is_dir() else path
        return cls(lambda rel: (package / rel).read_text())

    def tree(self, rel: str) -> ast.Module:
        try:
            return ast.parse(self._read(rel))
        except (FileNotFoundError, KeyError):
            if not rel.endswith("/__init__.py"):
                raise SourceError(f"the source has no tensorrt_llm/{rel}") from None
            return self.tree(rel.removesuffix("/__init__.py") + ".py")  # a package in one release, a module in another

    def version(self) -> str | None:
        try:
            tree = self.tree("version.py")
        except SourceError:
            return None
        return next(
            (
                n.value.value
                for n in tree.body
                if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Constant)
                and _names(n.targets) == ["__version__"]
            ),
            None,
        )


def extract(src: Source, note: str = "") -> dict:
    """The snapshot: each class's fields, members, methods and instance attributes, the names each import site
    binds, and the keys and types of the KV event dicts."""
    trees: dict[str, ast.Module] = {}

    def tree(rel: str) -> ast.Module:
        if rel not in trees:
            trees[rel] = src.tree(rel)
        return trees[rel]

    classes = {name: describe(find_class(tree(rel), cls), rel) for name, (rel, cls) in CLASSES.items()}
    keys, types = kv_event_shape(find_class(tree(KV_EVENTS[0]), KV_EVENTS[1]))
    return {
        "tensorrt_llm_version": src.version(),
        "source": note,
        "classes": classes,
        "exports": {rel: sorted(bound_names(tree(rel))) for rel in EXPORTS},
        "kv_events": {"keys": keys, "types": types},
    }


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SourceError(f"no class {name}")


def describe(cls: ast.ClassDef, rel: str) -> dict:
    fields, members, methods = {}, [], {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            fields[node.target.id] = {"annotation": ast.unparse(node.annotation), "default": node.value is not None}
        elif isinstance(node, ast.Assign):
            members += _names(node.targets)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            methods[node.name] = signature(node)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return {
        "file": rel,
        "bases": [ast.unparse(b) for b in cls.bases],
        "fields": fields,
        "members": members,
        "methods": methods,
        "attributes": sorted(self_attributes(init)) if init else [],
    }


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict:
    a = fn.args
    positional = a.posonlyargs + a.args
    with_default = positional[len(positional) - len(a.defaults) :] if a.defaults else []
    optional = [p.arg for p in with_default] + [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    params = [p.arg for p in positional + a.kwonlyargs if p.arg not in ("self", "cls")]
    return {
        "params": params,
        "optional": optional,
        "var_keyword": a.kwarg is not None,
        "is_async": isinstance(fn, ast.AsyncFunctionDef),
    }


def self_attributes(fn: ast.FunctionDef) -> set[str]:
    found = set()
    for node in ast.walk(fn):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        found |= {
            t.attr
            for t in targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        }
    return found


def bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: imported (as written or aliased), defined, or assigned."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= set(_names(node.targets))
    return names


def kv_event_shape(serializer: ast.ClassDef) -> tuple[list[str], list[str]]:
    """The keys of the dicts the serializer builds (literals and item assignments), and its "type" values."""
    keys, types = set(), set()
    for node in ast.walk(serializer):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    keys.add(key.value)
                    if key.value == "type" and isinstance(value, ast.Constant):
                        types.add(value.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
    return sorted(keys), sorted(types)


def _names(targets: list[ast.expr]) -> list[str]:
    return [t.id for t in targets if isinstance(t, ast.Name)]


def installed() -> Path | None:
    """The installed tensorrt_llm's directory; find_spec locates a top-level package without running it."""
    spec = importlib.util.find_spec("tensorrt_llm")
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def load(path: Path = SNAPSHOT) -> dict:
    return json.loads(path.read_text())


def dump(snapshot: dict) -> str:
    return json.dumps(snapshot, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engines.trtllm.surface",
        description=(
            "Write (or --check) the snapshot of TensorRT-LLM's API that tandem's fake is held to, from its source; "
            "tensorrt_llm is parsed, never imported."
        ),
    )
    parser.add_argument(
        "source",
        type=Path,
        nargs="?",
        help="a TensorRT-LLM checkout, the tensorrt_llm directory, or a wheel (default: the installed package)",
    )
    parser.add_argument("--out", type=Path, default=SNAPSHOT, help="where the snapshot goes (default: %(default)s)")
    parser.add_argument("--note", default="", help="where the source came from (release tag, commit), kept in it")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when --out differs")
    args = parser.parse_args(argv)
    source = args.source or installed()
    if source is None:
        parser.error("tensorrt_llm is not installed here: name a checkout, its directory or a wheel")
    try:
        snapshot = extract(Source.at(source), args.note)
    except SourceError as exc:
        print(f"surface: {exc}", file=sys.stderr)
        return 2
    if args.check:  # NOTE: the note says where a source came from; it is no part of the API
        same = args.out.is_file() and {**load(args.out), "source": ""} == {**snapshot, "source": ""}
        print(f"{args.out}: {'up to date' if same else 'differs from the source'}")
        return 0 if same else 1
    args.out.write_text(dump(snapshot))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
