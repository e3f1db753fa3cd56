"""Help text from docstrings: the reStructuredText marks a docstring carries, taken out for a terminal.

A command's ``--help`` shows the first paragraph of its module's docstring; what reads well in the
rendered API docs (````x````, ``:mod:`x```, a literal block's ``::``) shows raw in a terminal.
Standard library only: every command's parser uses it at start-up.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :mod:`~ebsp_mpi.sim` -> ebsp_mpi.sim
_LITERAL = re.compile(r"``([^`]+)``")  # ``x`` -> x


def plain(text: str) -> str:
    """`text` without reStructuredText marks: roles and double backticks give their content, and a
    paragraph that ends in ``::`` (a literal block follows) ends in ``:``."""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)
