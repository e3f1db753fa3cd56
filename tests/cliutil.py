"""Running the command line in the test's own process, for the errors a user fixes."""

from __future__ import annotations

from ebsp_mpi.cli import main


def one_line_error(capsys, args: list[str]) -> str:
    """``main(args)`` exits 2 with one line on stderr, ``ebsp_mpi: error: ...``; that line."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ebsp_mpi: error:"), err
    return err[0]
