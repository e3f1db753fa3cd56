#!/bin/bash
# Run a command with the GPU of this rank: none for the server ranks (0..k-1, k = $EBSP_SERVERS, default
# 1: they run on the CPU), one per worker rank. srun starts it once per rank, e.g.
#
#   srun --mpi=pmi2 slurm/gpu-bind.sh python -m ebsp_mpi train ...   (--mpi: python -m ebsp_mpi.slurm mpi)
#
# The rank's GPU is picked from the GPUs Slurm made visible on its node (CUDA_VISIBLE_DEVICES) by its
# node-local task id SLURM_LOCALID; on the node of the servers the workers have local ids k, k+1, ..., so
# k is subtracted there (block distribution, Slurm's default, puts the k servers on the first node).
# With --gpus-per-task=1, Slurm already shows each task only its own GPU, and this script then only
# hides it from the servers. slurm/train.sbatch and the sweep runner set EBSP_SERVERS from the job.
set -euo pipefail

servers=${EBSP_SERVERS:-1}
if (( ${SLURM_PROCID:-0} < servers )); then
    export CUDA_VISIBLE_DEVICES=""
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
    slot=${SLURM_LOCALID:-0}
    if [[ "${SLURM_NODEID:-0}" == 0 ]]; then
        slot=$((slot - servers))
    fi
    export CUDA_VISIBLE_DEVICES=${gpus[$((slot % ${#gpus[@]}))]}
fi
exec "$@"
