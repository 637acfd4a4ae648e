#!/usr/bin/env bash
# The main job: install what is needed, build, and train W-MLP on the bundled
# Fashion-MNIST for 3 epochs, ending with the test accuracy.
# Extra arguments go to `dpt train`, e.g. ./run.sh --model gpt.
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
scripts/build.sh
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--model mlp --eval-every 234)
exec build/dpt train "${args[@]}"
