"""``python -m ebsp_mpi simulate``: the sync policies the server runs, driven by virtual workers.

- :mod:`.events`: the discrete-event loop (:func:`~.events.simulate`; pure, no I/O): virtual workers
  whose pushes the coordinator decides on, and the :class:`~.events.Simulation` that carries its
  actions out (:mod:`.restarts` is one that restarts where a resumed run did);
- :mod:`.workers`: iteration times from the job's straggler model or replayed from a recorded run;
- :mod:`.run`: one simulated run, written as a run directory in ``train``'s schema;
- :mod:`.study`: a sweep of simulations (``simulate --sweep FILE``) and its scaling table and figure;
- :mod:`.cli`: the command line.
"""
