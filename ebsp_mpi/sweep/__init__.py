"""``python -m ebsp_mpi sweep FILE -n N``: run every member of a sweep with mpiexec, then compare them.

A sweep file (``jobs/sweeps/*.toml``) is a base job plus a list of override sets, optionally repeated
over seeds::

    name = "stragglers"              # default: the file's stem
    base = "../stragglers/base.toml" # a job file, relative to the sweep file (default: the embedded job)
    set = ["stop.seconds=8"]         # overrides for every member (optional)
    seeds = [0, 1, 2]                # each member once per seed, as NAME-seedS (optional)
    ranks = 5                        # default of -n (optional)
    timeout_s = 180                  # per member, seconds (optional, default 600)

    [[member]]
    name = "ssp-s3"
    set = ["sync.model=ssp", "sync.staleness=3"]   # or a table: { sync = { model = "ssp", staleness = 3 } }

Every member's job is loaded and checked (:func:`ebsp_mpi.config.load_job`) before anything runs. The
members then run one after the other, each as
``MPIEXEC -n N python -m ebsp_mpi train BASE --set ... --out OUT/MEMBER -q`` with its output in
``OUT/logs/MEMBER.log``; a member that fails or times out is reported and the sweep goes on (exit code 1
at the end). ``OUT/sweep.json`` records the plan and each member's outcome; at the end the comparison
(:mod:`ebsp_mpi.analysis.compare`) goes to ``OUT/compare.md`` and the report with figures to
``OUT/report/`` when the ``analysis`` extra is installed.

On a Slurm cluster, ``--sbatch FILE`` writes ``slurm/sweep.sbatch`` rendered for the sweep (a job array,
one task per member), and ``--member K`` runs member K alone (what each array task does).
"""

from .cli import add_parser, main
from .runner import (MANIFEST, Outcome, child_env, default_out, member_command, plan, run_member, run_sweep,
                     write_comparison, write_figures, write_manifest)
from .sbatch import default_template, render_sbatch
from .spec import (DEFAULT_TIMEOUT_S, MEMBER_KEYS, SWEEP_KEYS, Member, Sweep, SweepError, check_members, load_sweep,
                   resolve_ranks)

__all__ = ["add_parser", "main", "Outcome", "child_env", "default_out", "member_command",
           "plan", "run_member", "run_sweep", "write_comparison", "write_figures", "write_manifest",
           "default_template", "render_sbatch", "DEFAULT_TIMEOUT_S", "MANIFEST", "MEMBER_KEYS", "SWEEP_KEYS",
           "Member", "Sweep", "SweepError", "check_members", "load_sweep", "resolve_ranks"]
