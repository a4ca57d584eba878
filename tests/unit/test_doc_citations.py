"""Every module, name and file the docs cite exists (issue 52: docs say today's truth)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
PACKAGES = ("coordinator", "events", "spark_tasks")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
FOLDERS = (*PACKAGES, "bench", "tests", "examples", "schemas", "compose", "docs")
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w./-]*\w)")


@functools.cache
def module_tree(dotted: str) -> ast.Module | None:
    """The parsed source of module ``dotted``, or None when no such module file exists."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return ast.parse(candidate.read_text())
    return None


def defined_names(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body binds at its top level."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try):
            names |= defined_names(node.body)
            for handler in getattr(node, "handlers", []):
                names |= defined_names(handler.body)
            names |= defined_names(node.orelse)
    return names


def class_body(tree: ast.Module, name: str) -> list[ast.stmt] | None:
    """The body of the class ``name`` defined at the top of ``tree``, if there is one."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.body
    return None


def dotted_problem(reference: str) -> str | None:
    """Why ``reference`` (``package.module[.Name[.member]]``) names nothing in the code, or None."""
    parts = reference.split(".")
    for split in range(len(parts), 0, -1):
        tree = module_tree(".".join(parts[:split]))
        if tree is None:
            continue
        rest = parts[split:]
        if not rest:
            return None
        if rest[0] not in defined_names(tree.body):
            return f"{'.'.join(parts[:split])} defines no {rest[0]!r}"
        body = class_body(tree, rest[0])
        if len(rest) > 1 and body is not None and rest[1] not in defined_names(body):
            return f"{'.'.join(parts[: split + 1])} defines no {rest[1]!r}"
        return None
    return f"no module {parts[0]}.{parts[1]} (nor {parts[0]})" if len(parts) > 1 else f"no module {parts[0]}"


def citations() -> list[tuple[str, str]]:
    """(document, reference) for every module path and dotted name in the documents' code spans."""
    found: list[tuple[str, str]] = []
    for document in DOCUMENTS:
        for span in CODE_SPAN.findall(document.read_text()):
            if any(mark in span for mark in "*<{$"):
                continue  # a pattern or a placeholder, not one name
            found += [(document.name, match) for match in DOTTED.findall(span)]
            found += [(document.name, match) for match in PATH.findall(span)]
    return found


def problems() -> list[str]:
    """Each citation that names nothing in today's code, with what is missing."""
    stale = []
    for document, reference in citations():
        if "/" in reference:
            if not (ROOT / reference).exists():
                stale.append(f"{document}: `{reference}` does not exist")
        elif (problem := dotted_problem(reference)) is not None:
            stale.append(f"{document}: `{reference}`: {problem}")
    return sorted(set(stale))


def test_every_cited_module_name_and_file_exists() -> None:
    """A doc that cites `coordinator.core.decider.decide` or `coordinator/service/runtime.py` cites code
    that is there today; a move or a rename updates the docs with it."""
    assert [] == problems()


def test_the_docs_cite_code_at_all() -> None:
    """The scan finds the citations it checks (a broken pattern would find none and pass)."""
    cited = {reference for _, reference in citations()}

    assert "coordinator/core/decider.py" in cited
    assert "coordinator.service.writer.Writer" in cited


def test_a_stale_citation_is_named_with_what_is_missing() -> None:
    assert "coordinator.core.decider defines no 'decide_everything'" == dotted_problem(
        "coordinator.core.decider.decide_everything"
    )
    assert dotted_problem("coordinator.core.decider.decide") is None
    assert dotted_problem("events.wire.vocabulary.Rejection.NOT_A_REASON") == (
        "events.wire.vocabulary.Rejection defines no 'NOT_A_REASON'"
    )
    assert dotted_problem("coordinator.no_such_module") == "coordinator defines no 'no_such_module'"
    assert dotted_problem("nowhere.at_all") == "no module nowhere.at_all (nor nowhere)"
