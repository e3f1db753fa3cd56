"""Offline analysis of finished runs: comparison tables, report figures, Perfetto traces.

The subcommands ``report``, ``compare`` and ``timeline`` of ``python -m ebsp_mpi`` (and the scripts in
``analysis/``, which run them) are thin command-line fronts to these modules:

- :mod:`.runs` — which directories are runs, and the label and seed of each (standard library only);
- :mod:`.compare` — time to each accuracy target, final accuracy, ratios to BSP (standard library only,
  so a sweep can write its comparison without the ``analysis`` extra);
- :mod:`.metrics` — per-run and per-worker statistics from the trace DataFrames (pandas);
- :mod:`.figures` — the report's figures (matplotlib, Agg backend);
- :mod:`.report` — the report: summary table (Markdown, CSV) and figures;
- :mod:`.perfetto` — Chrome Trace Event JSON of a run (standard library and numpy);
- :mod:`.cli` — the three subcommands' parsers and handlers (standard library until one runs).
"""
