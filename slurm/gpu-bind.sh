#!/bin/bash
# Run a command with the GPU of this rank: none for rank 0 (the parameter server runs on the CPU), one
# per worker rank. srun starts it once per rank, e.g.
#
#   srun --mpi=pmix slurm/gpu-bind.sh python -m ebsp_mpi train ...
#
# The rank's GPU is picked from the GPUs Slurm made visible on its node (CUDA_VISIBLE_DEVICES) by its
# node-local task id SLURM_LOCALID; on the node of rank 0 the workers have local ids 1, 2, ..., so one is
# subtracted there (block distribution, Slurm's default). With --gpus-per-task=1, Slurm already shows
# each task only its own GPU, and this script then only hides it from rank 0.
set -euo pipefail

if [[ "${SLURM_PROCID:-0}" == 0 ]]; then
    export CUDA_VISIBLE_DEVICES=""
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
    slot=${SLURM_LOCALID:-0}
    if [[ "${SLURM_NODEID:-0}" == 0 ]]; then
        slot=$((slot - 1))
    fi
    export CUDA_VISIBLE_DEVICES=${gpus[$((slot % ${#gpus[@]}))]}
fi
exec "$@"
