#!/bin/bash
# Packs what the GPU routine runs into one archive that travels with a device
# call (`carry: [".devbundle"]`): the GPU targets of a build made here, and
# the host libraries they need that the lent machine's image may lack
# (OpenBLAS, fmt, Open MPI with mpirun, its plugins and PMIx). gpu.sh's build
# stage unpacks it, checks that everything loads, and builds from source
# there only when it does not (docs/gpu.md, "The routine's time").
# Usage: scripts/device/bundle.sh BUILD_DIR [OUT_DIR]
# BUILD_DIR is configured here, where it is not yet, as gpu.sh's build is
# (Ninja, Release, no oneDNN, no benchmarks); then the targets are built.
set -euo pipefail
B=${1:?usage: bundle.sh BUILD_DIR [OUT_DIR]}
command -v nvcc >/dev/null || { echo "bundle.sh: nvcc is not on the PATH: the GPU targets need the CUDA toolkit" >&2; exit 1; }
D=${2:-.devbundle}
TARGETS="test_cuda_kernels test_cuda_comm test_decoder_layers test_cuda_flash_attention"
if [ ! -f "$B/build.ninja" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDPT_ONEDNN=OFF -DDPT_OPENBLAS_ANY=ON \
    -DDPT_BUILD_BENCH=OFF >/dev/null
fi
ninja -C "$B" dpt dpt_cuda $TARGETS >/dev/null
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin/tests" "$S/lib" "$S/root"
cp "$B/dpt" "$B/libdpt_cuda.so" "$S/bin/"
for t in $TARGETS; do cp "$B/tests/$t" "$S/bin/tests/"; done
# The libraries the loader resolves here, less glibc, the C++ runtime (the
# image's is newer) and CUDA's own (the image's match its driver).
for f in "$S"/bin/dpt "$S"/bin/libdpt_cuda.so "$S"/bin/tests/*; do ldd "$f"; done |
  awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libmvec|libstdc\+\+|libgcc_s)\.so|ld-linux|/cuda' |
  while read -r lib; do cp -L "$lib" "$S/lib/"; done
# Open MPI's runtime as Debian installs it, under root/ (gpu.sh relocates it
# with OPAL_PREFIX): mpirun, the MCA plugins, help texts, PMIx and its plugins.
for p in openmpi-bin libopenmpi3 openmpi-common libpmix2; do dpkg -L "$p"; done |
  grep -v -E '/share/(doc|man|lintian)/|/include/|java' | sort -u |
  while read -r f; do if [ -f "$f" ]; then cp -L --parents "$f" "$S/root/"; fi; done
mkdir -p "$D"
tar -cJf "$D/bundle.tar.xz" -C "$S" .
git rev-parse HEAD >"$D/commit" 2>/dev/null || true
du -h "$D/bundle.tar.xz"
