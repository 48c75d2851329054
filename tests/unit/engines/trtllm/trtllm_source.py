"""Reads the real tensorrt_llm package's source without importing it (importing needs a GPU driver): from an
installed package, or from TANDEM_TRTLLM_SOURCE (a source checkout, the package directory, or a downloaded
wheel). Never downloads anything. Used by test_trtllm_fake_matches_real.py to hold the fake to the release."""
import ast
import importlib.util
import os
import zipfile
from pathlib import Path


class TrtllmSource:
    def __init__(self, read):
        self._read = read

    @classmethod
    def find(cls) -> "TrtllmSource | None":
        given = os.environ.get("TANDEM_TRTLLM_SOURCE", "")
        if given:
            return cls.at(Path(given))
        spec = importlib.util.find_spec("tensorrt_llm")
        if spec is not None and spec.submodule_search_locations:
            return cls.at(Path(list(spec.submodule_search_locations)[0]))
        return None

    @classmethod
    def at(cls, path: Path) -> "TrtllmSource":
        if path.suffix == ".whl":
            archive = zipfile.ZipFile(path)
            return cls(lambda rel: archive.read(f"tensorrt_llm/{rel}").decode())
        package = path / "tensorrt_llm" if (path / "tensorrt_llm").is_dir() else path
        return cls(lambda rel: (package / rel).read_text())

    def text(self, rel: str) -> str:
        try:
            return self._read(rel)
        except (FileNotFoundError, KeyError):
            if not rel.endswith("/__init__.py"):
                raise
            return self._read(rel.removesuffix("/__init__.py") + ".py")  # a package in one release, a module in another

    def tree(self, rel: str) -> ast.Module:
        return ast.parse(self.text(rel))

    def version(self) -> str:
        namespace: dict = {}
        exec(self.text("version.py"), namespace)  # one assignment: __version__ = "..."
        return namespace["__version__"]


def classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def class_names(cls: ast.ClassDef) -> set[str]:
    """Fields (annotated or assigned at class level, enum members included) and __init__'s parameters."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.FunctionDef) and node.name == "__init__":
            names |= set(parameters(node))
    return names


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def methods(tree: ast.Module, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every definition of method `name` in any class of the module (LLM inherits most of its API)."""
    return [node for cls in classes(tree).values() for node in cls.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]


def string_constants(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: imported (as written or aliased), defined, or assigned."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names
