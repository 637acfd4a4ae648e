#!/usr/bin/env bash
# The main job: install what is needed, build, and train W-MLP on the bundled
# Fashion-MNIST with DDP on 2 ranks for 3 epochs, ending with the test
# accuracy and each rank's step breakdown.
# Extra arguments go to `dpt train`, e.g. ./run.sh --model gpt; RANKS=4 ./run.sh
# changes the number of ranks. With --model gpt and no --data, the fortunes
# corpus is first written as llm.c token shards (`dpt tokens`, once, into
# build/data/fortunes) and W-GPT trains from them (docs/data.md).
set -euo pipefail
cd "$(dirname "$0")"
scripts/install-deps.sh
scripts/build.sh
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--model mlp --eval-every 234)
if [[ " ${args[*]} " == *" --model gpt "* && " ${args[*]} " != *" --data "* ]]; then
  shards=build/data/fortunes
  [ -e "$shards/fortunes_train_000000.bin" ] || build/dpt tokens --out "$shards" --name fortunes
  args+=(--data "$shards")
fi
exec build/dpt launch -n "${RANKS:-2}" -- build/dpt train "${args[@]}"
