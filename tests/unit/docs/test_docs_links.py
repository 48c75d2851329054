"""The repository documents itself: README.md stays short, every relative link in README.md, docs/*.md and
bench/RESULTS.md names a file (and heading) inside the checkout, no markdown file links outside it, and every
bench/results path RESULTS.md cites is committed. Reads files only; it never follows a link over the network."""

import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
README_MAX_BYTES = 10 * 1024
# a fenced block or an inline code span shows text, never a link
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_INLINE = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # http:, https:, mailto:, protocol-relative
# a path on the machine that wrote the page (an absolute /work/... path, a sibling ../shared checkout), even in a
# code span: a clone of the repository has neither
_OUTSIDE_PATH = re.compile(r"(?<![\w.~-])/work/\S*|\.\./shared\S*")
_FENCE = re.compile(r"```.*?```", re.S)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def anchors(text: str) -> set[str]:
    """The fragment ids GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a repeated
    heading numbered -1, -2, ..."""
    found, counts = set(), {}
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
        slug = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
        count = counts.get(slug, 0)
        counts[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    prose = _CODE.sub("", text)
    return _INLINE.findall(prose) + _REFERENCE.findall(prose)


def link_problems(doc: Path, repo: Path) -> list[str]:
    """Why each link of `doc` fails: it leaves `repo`, or names a file or a heading that is not there."""
    problems = []
    text = doc.read_text(encoding="utf-8")
    for path in sorted(set(_OUTSIDE_PATH.findall(text))):
        problems.append(f"{doc.name}: mentions {path!r}, which a clone of the repository does not have")
    for target in link_targets(text):
        if _EXTERNAL.match(target):
            continue
        if target.startswith("#"):
            target = doc.name + target  # a heading of this page
        path, _, fragment = target.split("?", 1)[0].partition("#")
        resolved = (repo / path.lstrip("/")) if path.startswith("/") else (doc.parent / path)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(repo):
            problems.append(f"{doc.name}: link {target!r} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{doc.name}: link {target!r} names a missing file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{doc.name}: link {target!r} names a heading {resolved.name} does not have")
    return problems


def documents(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def every_markdown(repo: Path) -> list[Path]:
    """Every markdown file of the checkout, skipping hidden folders (.venv, .cache, .git) and installed packages."""
    return sorted(
        p
        for p in repo.rglob("*.md")
        if not any(part.startswith(".") or part == "node_modules" for part in p.relative_to(repo).parts)
    )


_CITED = re.compile(r"bench/results/(?:[\w./*?-]|\{[^{}\s]*\})+")  # a brace may hold commas and dots
_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """The shell's brace expansion, as RESULTS.md writes runs: `a{,_2}.json`, `run{1,2}`, `step{0..3}`."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    body = match.group(1)
    if re.fullmatch(r"\d+\.\.\d+", body):
        low, high = map(int, body.split(".."))
        options = [str(i) for i in range(low, high + 1)]
    else:
        options = body.split(",")
    return list(
        itertools.chain.from_iterable(
            expand_braces(pattern[: match.start()] + option + pattern[match.end() :]) for option in options
        )
    )


def missing_citations(results: Path, repo: Path) -> list[str]:
    """The bench/results paths (prose, commands and tables alike) that name nothing committed; a glob must match."""
    missing = []
    for cited in sorted(set(_CITED.findall(results.read_text(encoding="utf-8")))):
        for path in expand_braces(cited.rstrip(".")):  # a sentence's full stop is not part of the path
            found = list(repo.glob(path)) if any(c in path for c in "*?") else [repo / path]
            if not any(f.exists() for f in found):
                missing.append(path)
    return missing


def test_readme_is_at_most_10_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"


@pytest.mark.parametrize("doc", documents(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_stays_in_the_repository_and_resolves(doc):
    assert link_problems(doc, REPO) == []


def sections_without_json(results_text: str) -> list[str]:
    """The `## ` sections of RESULTS.md that neither cite a bench/results path nor say "No figure", and those that still
    say "JSON not kept": a figure without its JSON is dropped, not excused."""
    missing = []
    for section in re.split(r"^(?=## )", results_text, flags=re.MULTILINE)[1:]:
        heading = section.splitlines()[0]
        if "JSON not kept" not in section and ("bench/results/" in section or "No figure" in section):
            continue
        missing.append(heading)
    return missing


def test_every_results_section_says_where_its_json_is():
    assert sections_without_json((REPO / "bench" / "RESULTS.md").read_text(encoding="utf-8")) == []


def test_a_section_without_json_is_caught():
    text = (
        "# R\n## A\n`--json bench/results/a.json`\n## B: not measured\nno GPU\n"
        "## C\n**JSON not kept:** scratch\n## D\n```\ntandem bench --json bench/out/d.json\n```\n| 1 |\n"
        "## E\n```\n--json bench/results/e.json\n```\n## F\nNo figure: never run.\n"
        "## G\nbench/results/g.json, and a row whose JSON not kept\n"
    )
    assert sections_without_json(text) == ["## B: not measured", "## C", "## D", "## G"]


def test_results_links_resolve_inside_the_repository():
    assert link_problems(REPO / "bench" / "RESULTS.md", REPO) == []


def test_every_json_results_cites_is_committed():
    assert missing_citations(REPO / "bench" / "RESULTS.md", REPO) == []


@pytest.mark.parametrize("doc", every_markdown(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_no_markdown_file_links_outside_the_repository(doc):
    assert [p for p in link_problems(doc, REPO) if "leaves" in p or "clone" in p] == []


def test_the_citation_check_catches_a_missing_file(tmp_path):
    (tmp_path / "bench" / "results" / "sim").mkdir(parents=True)
    for name in ("a.json", "a_2.json", "run1.json", "run2.json", "sim/x_load.png"):
        (tmp_path / "bench" / "results" / name).write_text("{}")
    results = tmp_path / "bench" / "RESULTS.md"
    results.write_text(
        "`--json bench/results/a{,_2}.json` and bench/results/run{1..2}.json, "
        "bench/results/sim/*_load.png.\nbench/results/sim/ holds bench/results/sim/x{_load.png,.json}\n"
        "| row | bench/results/gone.json | bench/results/run{1,3}.json | bench/results/sim/*_cdf.png\n"
    )
    assert missing_citations(results, tmp_path) == [
        "bench/results/gone.json",
        "bench/results/run3.json",
        "bench/results/sim/*_cdf.png",
        "bench/results/sim/x.json",
    ]
    assert expand_braces("x{0..2}_{a,b}") == ["x0_a", "x0_b", "x1_a", "x1_b", "x2_a", "x2_b"]


def test_readme_links_the_docs_and_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make up" in readme and "make test" in readme
    linked = {Path(t.split("#", 1)[0]).as_posix() for t in link_targets(readme)}
    assert {"docs/architecture.md", "docs/configuration.md"} <= linked


def test_the_checker_catches_what_it_is_for(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "there.md").write_text(
        "# A `tidy` heading (here)\n## Twice\n## Twice\n```\n# not a heading\n```\n"
    )
    doc = repo / "README.md"
    doc.write_text(
        "# Top\n[ok](docs/there.md#a-tidy-heading-here) [again](docs/there.md#twice-1) [web](https://x.org)\n"
        "[top](#top) `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](docs/missing.md) [up](../outside.md) [no heading](docs/there.md#not-a-heading)\n"
        "[self](#nowhere)\n[ref]: ../../etc/passwd\nsee ../shared/DESIGN.md\n"
        "`flock /work/coord/bench.lock` and tandem/work/x.py\n"
    )
    problems = link_problems(doc, repo)
    assert len(problems) == 7, problems
    assert any("missing.md" in p and "missing file" in p for p in problems)
    assert any("../outside.md" in p and "leaves" in p for p in problems)
    assert any("passwd" in p and "leaves" in p for p in problems)
    assert any("../shared/DESIGN.md" in p for p in problems)
    assert any("/work/coord/bench.lock" in p for p in problems)  # a code span hides no machine path
    assert any("#not-a-heading" in p and "heading" in p for p in problems)
    assert any("#nowhere" in p for p in problems)


def test_anchors_follow_githubs_rule():
    text = "# KV transfer: prefill -> decode\n## The TensorRT-LLM engine (engines/trtllm)\n## Notes\n## Notes\n"
    assert anchors(text) == {
        "kv-transfer-prefill---decode",
        "the-tensorrt-llm-engine-enginestrtllm",
        "notes",
        "notes-1",
    }
