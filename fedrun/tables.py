"""Tables as aligned text, GitHub Markdown or a LaTeX ``tabular`` (booktabs), from a header and rows.

One renderer for every table fedrun and its paper scripts print, so a table pasted into a
paper (``--format latex``) or a README (``--format markdown``) looks the same whichever command
wrote it: the sweep's closing table (``fedrun-sweep-table``, :mod:`fedrun.command.sweeps`) and
the paper scripts' tables (``scripts/common/tables.py``).  Cells are strings, already formatted; this
module only lays them out and escapes what the format needs escaped (``|`` in Markdown, LaTeX's
special characters).  It imports nothing of fedrun's (no Hydra, no pandas), so any floor may use it.

Each column is left-aligned (``l``: names, settings, statuses) or right-aligned (``r``: numbers),
given per column by ``align`` or, as the paper scripts lay their tables out, as ``labels`` leading
label columns followed by value columns.  ``groups`` ``[(title, n)]`` puts a title over each run
of ``n`` value columns after the labels (FedNNNN's condition over its two datasets).
"""
from __future__ import annotations

from typing import Callable, Sequence

from fedrun.errors import ConfigError

FORMATS = ("text", "markdown", "latex")

# LaTeX's special characters in text mode, each as it prints itself (and ±, as math: $\pm$).
LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                 "±": r"$\pm$"}

Groups = Sequence[tuple[str, int]] | None


def check_format(fmt: str, setting: str = "format") -> str:
    """``fmt`` if it is one of :data:`FORMATS`, else one line naming ``setting`` and the formats."""
    if fmt not in FORMATS:
        raise ConfigError(setting, fmt, f"choose one of: {', '.join(FORMATS)}")
    return fmt


def alignment(n: int, labels: int = 1, align: str | None = None) -> str:
    """Each of ``n`` columns' alignment, ``l`` or ``r``: ``align`` as given, else ``labels``
    left-aligned label columns and right-aligned values after them."""
    align = "l" * labels + "r" * (n - labels) if align is None else align
    if len(align) != n or set(align) - {"l", "r"}:
        raise ConfigError("align", align, f"give one letter per column ({n}), each l or r")
    return align


def render(head: Sequence[str], body: Sequence[Sequence[str]], fmt: str = "text", *, labels: int = 1,
           align: str | None = None, groups: Groups = None, align_head: Callable[[str, int], str] = str.center) -> str:
    """The table in ``fmt`` (:data:`FORMATS`): :func:`text`, :func:`markdown` or :func:`latex`.
    ``labels``/``align``: the columns' alignment (:func:`alignment`); ``groups`` titles runs of
    value columns after the first ``labels`` columns; ``align_head``: how a right-aligned column's
    header sits in the text format (centred by default)."""
    check_format(fmt)
    align = alignment(len(head), labels, align)
    if fmt == "markdown":
        return markdown(head, body, align, groups, labels)
    if fmt == "latex":
        return latex(head, body, align, groups, labels)
    return text(head, body, align, groups, labels, align_head)


def text(head: Sequence[str], body: Sequence[Sequence[str]], align: str, groups: Groups = None, labels: int = 1,
         align_head: Callable[[str, int], str] = str.center) -> str:
    """Aligned text, ``|`` between the columns and a ``-+-`` rule under the header; a group's
    title is centred over its columns, on a line of its own above the header."""
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]

    def line(cells: Sequence[str], right: Callable[[str, int], str]) -> str:
        return " | ".join(c.ljust(w) if a == "l" else right(c, w) for c, w, a in zip(cells, widths, align))

    lines, rule = [], ["-" * w for w in widths[:labels]]
    if groups:
        top, i = [" " * w for w in widths[:labels]], labels
        for title, n in groups:
            span = sum(widths[i:i + n]) + 3 * (n - 1)
            top.append(title.center(span))
            rule.append("-" * span)
            i += n
        lines.append(" | ".join(top))
    else:
        rule += ["-" * w for w in widths[labels:]]
    lines += [line(head, align_head), "-+-".join(rule)] + [line(b, str.rjust) for b in body]
    return "\n".join(lines)


def spanned(head: Sequence[str], labels: int, groups: Groups) -> list[str]:
    """``head`` with each group's title before its columns' names (``IID - B: MNIST``), for
    Markdown, which has no cell spanning columns."""
    if not groups:
        return list(head)
    out, i = list(head[:labels]), labels
    for title, n in groups:
        out += [f"{title}: {h}" for h in head[i:i + n]]
        i += n
    return out + list(head[i:])


def markdown(head: Sequence[str], body: Sequence[Sequence[str]], align: str, groups: Groups = None,
             labels: int = 1) -> str:
    """A GitHub Markdown pipe table: ``---`` under a left-aligned column, ``---:`` under a
    right-aligned one; a ``|`` inside a cell escaped (it would end the cell)."""
    def row(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = ["---" if a == "l" else "---:" for a in align]
    return "\n".join([row(spanned(head, labels, groups)), row(rule), *(row(b) for b in body)])


def latex_escape(text: str) -> str:
    """``text`` as LaTeX prints it: each of :data:`LATEX_SPECIAL` replaced (``fedavg_seed0`` is
    ``fedavg\\_seed0``), so a run's name or setting never breaks the document."""
    return "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex(head: Sequence[str], body: Sequence[Sequence[str]], align: str, groups: Groups = None,
          labels: int = 1) -> str:
    """A ``tabular`` with booktabs rules (``\\toprule``, ``\\midrule``, ``\\bottomrule``: the
    preamble needs ``\\usepackage{booktabs}``), every cell escaped; a group's title spans its
    columns (``\\multicolumn``) with a ``\\cmidrule`` under it."""
    def row(cells):
        return " & ".join(latex_escape(c) for c in cells) + r" \\"

    lines = [r"\begin{tabular}{" + align + "}", r"\toprule"]
    if groups:
        top, rules, i = [""] * labels, [], labels
        for title, n in groups:
            top.append(rf"\multicolumn{{{n}}}{{c}}{{{latex_escape(title)}}}")
            rules.append(rf"\cmidrule(lr){{{i + 1}-{i + n}}}")
            i += n
        lines += [" & ".join(top) + r" \\", " ".join(rules)]
    lines += [row(head), r"\midrule", *(row(b) for b in body), r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def note(lines: Sequence[str], fmt: str) -> list[str]:
    """Lines that go under a table in ``fmt`` (counts, where the runs are): as they are in text,
    after a blank line in Markdown (a paragraph of their own, not a row), as ``%`` comments in
    LaTeX (a file ``\\input`` into a paper prints the table alone)."""
    check_format(fmt)
    if not lines:
        return []
    if fmt == "latex":
        return ["% " + line for line in lines]
    return ([""] if fmt == "markdown" else []) + list(lines)
