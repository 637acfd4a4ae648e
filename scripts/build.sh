#!/usr/bin/env bash
# Configures and builds into build/ (Release, portable x86-64-v3 code).
# Extra arguments go to CMake, e.g. scripts/build.sh -DDPT_NATIVE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j "$(nproc)" 2>&1 | tee -a build.log | grep -E "warning|error" || true
test -x build/dpt || { echo "build failed: see build.log" >&2; exit 1; }
