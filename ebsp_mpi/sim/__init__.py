"""``python -m ebsp_mpi simulate``: the sync policies the server runs, driven by virtual workers.

- :mod:`.workers`: iteration times from the job's straggler model or replayed from a recorded run;
- :mod:`.run`: one simulated run, written as a run directory in ``train``'s schema;
- :mod:`.study`: a sweep of simulations (``simulate --sweep FILE``) and its scaling table and figure;
- :mod:`.cli`: the command line.

The event loop itself is :func:`ebsp_mpi.sync.simulate.simulate` (pure, no I/O).
"""
