"""The repository's import graph read from its source with ast (nothing is imported): which module imports which,
its circles, and the arrows from services/ and engines/ up into tandem/. A pure reader for the layering test."""

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("engines", "services", "tandem")
GENERATED = "tandem.v1"  # protoc's stubs, named by the proto package: built by `make protos`, never in git


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the repository's packages by dotted name (a package by its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name != GENERATED and not name.startswith(GENERATED + "."):
                modules[name] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str:
    """The module `name` lives in (itself, or the nearest package above it); "" outside the repository."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, `level - 1` packages up
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    yield base  # NOTE: `from pkg import name` runs pkg/__init__.py and reads from it, even when name is a submodule
    yield from (f"{base}.{alias.name}" for alias in node.names)


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name the module at `path` imports, inside or outside the repository, lazily or not."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update(_imported(node, module, path.name == "__init__.py"))
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the repository's modules it imports, at the top or inside a function alike (a lazy import still
    ties two modules together)."""
    modules = module_files(root)
    graph = {}
    for module, path in modules.items():
        targets = {name if name in modules else _owner(name, modules) for name in imported_names(path, module)}
        graph[module] = targets - {"", module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each import from services/ or engines/ of a tandem/ module (the tooling on top)."""
    return sorted(
        (module, target)
        for module, targets in graph.items()
        if module.split(".")[0] in ("services", "engines")
        for target in targets
        if target.split(".")[0] == "tandem"
    )
