"""Print pyproject.toml's [project] dependencies, one per line, for `pip install -r -` in an image.

Images install the dependencies in a layer of their own (rebuilt only when pyproject.toml changes),
then the project itself with --no-deps; --exclude leaves out what the base image already provides
(torch in the TensorRT-LLM image, whose build must not be replaced).
"""

import argparse
import re
import sys
import tomllib
from pathlib import Path


def dependencies(pyproject: Path, exclude: frozenset[str] = frozenset()) -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if _name(d) not in exclude]


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalized (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--exclude", action="append", default=[], help="a distribution to leave out (repeatable)")
    args = parser.parse_args(argv)
    exclude = frozenset(_name(e) for e in args.exclude)
    print("\n".join(dependencies(args.pyproject, exclude)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
