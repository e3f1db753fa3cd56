"""The runs whose training diverged, as ``compare`` and ``report`` mark them: the summary's
``divergence`` (:mod:`ebsp_mpi.divergence`), one line a run, after the tables."""

from __future__ import annotations

from ..safe_text import clean_text


def diverged_lines(infos) -> list[str]:
    """Markdown lines naming each finished run whose summary records a divergence (none: no lines)."""
    marked = []
    for info in infos:
        finding = info.summary.get("divergence") if info.finished else None
        if isinstance(finding, dict):
            message = clean_text(str(finding.get("message") or finding.get("seen") or "diverged"))
            marked.append(f"- **{clean_text(info.path.name)}** ({clean_text(info.label)}): {message}")
    return ["### Diverged", "", *marked] if marked else []
