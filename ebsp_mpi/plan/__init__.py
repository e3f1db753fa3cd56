"""Per-layer decisions made before a run, from a cost model: pure, no MPI.

- :mod:`.hybcomm` — Poseidon's hybrid communication (USENIX ATC 2017, Sec. 3.2): per dense layer, the
  dense gradient through the parameter servers (``ps``) or its sufficient factors (``sfb``), whichever
  moves fewer bytes on the busiest rank.
- :mod:`.osdp` — OSDP (IJCAI 2023): per layer resident, on-demand or on-demand in slices, the most
  samples per second under a per-worker memory limit (exact search); :mod:`.osdp_authors` solves the
  authors' own problem on their profile; :mod:`.osdp_files` reads and writes profiles and plans.

The ``profile`` and ``plan`` subcommands, which build the job's model and time it on the device, are
not pure and live outside, in :mod:`ebsp_mpi.plan_cli`; nothing here imports them.

See docs/design.md, "Hybrid communication" and "OSDP".
"""

from .hybcomm import (
    FLOAT_BYTES, MODES, SCHEMES, SFB_OVERHEAD_BYTES, Cost, HybCommPlan, LayerChoice, choose, crossover_batch,
    crossover_batch_timed, crossover_workers, poseidon_ps_bytes, poseidon_sfb_bytes, ps_bytes, sfb_bytes, sfb_overhead,
)

__all__ = ["FLOAT_BYTES", "MODES", "SCHEMES", "Cost", "HybCommPlan", "LayerChoice", "choose",
           "ps_bytes", "sfb_bytes", "crossover_batch", "SFB_OVERHEAD_BYTES", "sfb_overhead", "crossover_batch_timed",
           "poseidon_ps_bytes", "poseidon_sfb_bytes", "crossover_workers"]
