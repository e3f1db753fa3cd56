#!/usr/bin/env bash
# A CUDA-aware MPI for a GPU machine that reaches no package index: Intel MPI from PyPI (impi-rt), whose
# "GPU buffers" support takes CUDA device pointers (I_MPI_OFFLOAD=1, I_MPI_OFFLOAD_MODE=cuda). The
# PyPI wheels of MPICH and Open MPI are not CUDA-aware: MPICH's library says "CUDA not enabled", and
# Open MPI's has no CUDA accelerator component and no UCX CUDA transport.
#
#   bash .ci/impi-bundle.sh [DIR]      (default DIR: .whl; writes DIR/impi-min.tgz, about 12 MB)
#
# The wheel is 129 MB; the bundle keeps what a run needs: Hydra's launcher and proxies, libmpi.so.12
# (the MPICH ABI, which mpi4py loads when MPI4PY_LIBMPI names it) and libfabric with its providers,
# taken from the mpich wheel (impi-rt asks for a libfabric that PyPI does not have). On the GPU machine
# .ci/gpu-check.sh's cuda-aware step unpacks it and sets the variables; by hand:
#
#   tar xzf impi-min.tgz -C /tmp && export I_MPI_ROOT=/tmp/impi LD_LIBRARY_PATH=/tmp/impi/lib \
#     FI_PROVIDER_PATH=/tmp/impi/lib/libfabric MPI4PY_LIBMPI=/tmp/impi/lib/libmpi.so.12 \
#     I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda
#   /tmp/impi/bin/mpiexec -n 3 python -m ebsp_mpi train --set backend=cupy --set runtime.cuda_aware_mpi=true
set -euo pipefail
DIR=$(realpath -m "${1:-.whl}")
mkdir -p "$DIR"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pip_download() {  # the manylinux x86_64 wheel of $1, whatever Python runs this
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$T/whl" "$1"
}
pip_download impi-rt
pip_download mpich
mkdir -p "$T/x" "$T/impi/bin" "$T/impi/lib"
for w in "$T"/whl/*.whl; do unzip -q -o "$w" -d "$T/x"; done
impi=$(echo "$T"/x/impi_rt-*.data/data)
mpich=$(echo "$T"/x/mpich-*.data/data)
cp "$impi"/bin/{mpiexec.hydra,hydra_pmi_proxy,hydra_bstrap_proxy,cpuinfo,impi_info} "$T/impi/bin/"
ln -s mpiexec.hydra "$T/impi/bin/mpiexec"
cp "$impi/lib/libmpi.so.12" "$T/impi/lib/"
cp -r "$mpich/lib/mpich/libfabric.so.1" "$mpich/lib/mpich/libfabric" "$T/impi/lib/"
tar czf "$DIR/impi-min.tgz" -C "$T" impi
echo "wrote $DIR/impi-min.tgz ($(du -h "$DIR/impi-min.tgz" | cut -f1)): $(unzip -p "$T"/whl/impi_rt-*.whl '*/METADATA' | grep -m1 '^Version')"
