"""The claims themselves: :func:`claim` registers a phrase of docs/reproductions.md (or of another doc
that states measured numbers: docs/configuration.md's result tables) with the function that computes its fields; rendering a section, checking a text against the doc, rewriting the doc's marked
claims (``--write``), and which sections a table script prints for the folders it reads."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from scripts.common.claims_core import DOC, Data, HEADING, ROOT, RUNS


# ----------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Claim:
    """A phrase of ``doc`` (``template``, with format fields) and the function that computes its
    fields from the runs (its docstring says what it checks)."""

    id: str
    section: str
    template: str
    compute: Callable[[Data], dict]
    doc: str = str(DOC)  # the doc that states it, from the repository root

    def render(self, data: Data) -> str:
        return self.template.format(**self.compute(data))

    @property
    def checks(self) -> str:
        return " ".join((self.compute.__doc__ or "").split())


CLAIMS: dict[str, Claim] = {}


def claim(id: str, section: str, template: str, doc: str = str(DOC)):
    """Register the decorated function as the claim ``id`` of ``section``, stated in ``doc``."""
    def register(compute: Callable[[Data], dict]) -> Callable[[Data], dict]:
        if id in CLAIMS:
            raise ValueError(f"claim {id} registered twice")
        CLAIMS[id] = Claim(id, section, template, compute, doc)
        return compute
    return register


def sections() -> list[str]:
    return list(dict.fromkeys(c.section for c in CLAIMS.values()))


def docs() -> list[str]:
    """The docs that state claims, docs/reproductions.md first."""
    return list(dict.fromkeys([str(DOC), *(c.doc for c in CLAIMS.values())]))


def render_section(section: str, data: Data) -> list[tuple[Claim, str | None, str | None]]:
    """``(claim, text, error)`` for each claim of ``section``; a claim that cannot be computed (its
    runs missing or damaged) has ``text`` None and the error's line."""
    out = []
    for c in CLAIMS.values():
        if c.section != section:
            continue
        try:
            out.append((c, c.render(data), None))
        except Exception as e:  # noqa: BLE001 - a table script prints the table whatever a claim does
            out.append((c, None, f"{type(e).__name__}: {e}"))
    return out


def print_section(section: str, root: str | Path = ROOT, file=None, data: Data | None = None) -> bool:
    """Print ``[section]`` and each of its claims' text, one line each, its id first; True when
    every claim could be computed."""
    file = file or sys.stdout
    if section not in sections():
        raise ValueError(f"no section {section!r}; the sections: {', '.join(sections())}")
    print(f"[{section}]", file=file)
    ok = True
    for c, text, error in render_section(section, data or Data(root)):
        print(f"{c.id}: {text if error is None else 'CANNOT BE COMPUTED: ' + error}", file=file)
        ok = ok and error is None
    return ok


def print_sections(names: Iterable[str], root: str | Path = ROOT, file=None) -> bool:
    """:data:`HEADING`, then :func:`print_section` for each of ``names`` (one reading of the runs)."""
    file = file or sys.stdout
    data = Data(root)
    print(f"\n{HEADING}", file=file)
    return all([print_section(name, root, file, data) for name in names])


def root_of(path: str | Path, below: str) -> Path | None:
    """The repository root of ``path`` if it lies at or under ``<root>/outputs/reproductions/<below>``
    (``below`` may name several levels, ``fedlap/fmnist``), else None."""
    parts = Path(path).resolve().parts
    want = (*RUNS.parts, *Path(below).parts)
    for i in range(len(parts) - len(want) + 1):
        if parts[i:i + len(want)] == want:
            return Path(*parts[:i]) if i else Path("/")
    return None


def sections_of(dirs: Iterable[str | Path], by_folder: dict[str, tuple[str, ...]]) -> tuple[Path | None, list[str]]:
    """The repository root and the sections to print for a table script's DIRs: those of
    ``by_folder`` (the sections a paper's script prints, by the folder below outputs/reproductions
    its DIRs lie in) whose folder holds a DIR; no root (print nothing) unless every DIR lies in one
    of the folders of one checkout's outputs/reproductions."""
    roots, names = set(), []
    for d in dirs:
        found = [(root_of(d, folder), folder) for folder in by_folder]
        found = [(root, folder) for root, folder in found if root is not None]
        if not found:
            return None, []
        roots.add(found[0][0])
        names += [n for n in by_folder[found[0][1]] if n not in names]
    return (roots.pop(), names) if len(roots) == 1 else (None, [])


def normalized(text: str) -> str:
    """Markdown text with its line breaks joined and its white space collapsed to one space."""
    return " ".join(text.split())


def in_doc(text: str, doc: str) -> bool:
    return normalized(text) in normalized(doc)


# A claim the data owns outright (a table that fills as runs finish) stands in the doc between two
# HTML comments, invisible on the rendered page; `--write` puts its rendered text between them.
MARKED = re.compile(r"<!-- claim (?P<id>[\w.]+) -->(?P<body>.*?)<!-- end claim -->", re.S)


def write_marked(doc: str, data: Data, only: Iterable[str] | None = None) -> tuple[str, list[str]]:
    """``doc`` with every marked claim's text rendered afresh from ``data`` (the white space around
    the old text kept, so a table stays a block of its own), and the ids whose text changed;
    ``only``: the claims of these sections alone, the others left as they stand.  An unknown id,
    or a claim that cannot be computed, raises: the doc is then left as it was."""
    changed = []
    only = None if only is None else set(only)

    def fresh(match: re.Match) -> str:
        id_, body = match["id"], match["body"]
        if id_ not in CLAIMS:
            raise ValueError(f"the doc marks an unknown claim {id_!r}")
        if only is not None and CLAIMS[id_].section not in only:
            return match[0]
        text = CLAIMS[id_].render(data)
        lead, trail = body[: len(body) - len(body.lstrip())], body[len(body.rstrip()):]
        if body.strip() != text:
            changed.append(id_)
        return f"<!-- claim {id_} -->{lead}{text}{trail}<!-- end claim -->"

    return MARKED.sub(fresh, doc), changed
