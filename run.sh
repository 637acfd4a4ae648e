#!/usr/bin/env bash
# The main job: install what is needed, build, and train W-MLP on the bundled
# Fashion-MNIST with DDP on 2 ranks for 3 epochs, ending with the test
# accuracy and each rank's step breakdown.
# Extra arguments go to `dpt train`, e.g. ./run.sh --model gpt; RANKS=4 ./run.sh
# changes the number of ranks. With --model gpt and no --data, the fortunes
# corpus is first written as llm.c token shards (`dpt tokens`, once, into
# build/data/fortunes) and W-GPT trains from them (docs/data.md); unless
# --save is given it saves the weights to build/data/w-gpt.safetensors and
# ends with a sample of what the model writes (`dpt generate`,
# docs/generate.md).
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
sample=
if [[ " ${args[*]} " == *" --model gpt "* && " ${args[*]} " != *" --save "* ]]; then
  sample=build/data/w-gpt.safetensors
  args+=(--save "$sample")
fi
build/dpt launch -n "${RANKS:-2}" -- build/dpt train "${args[@]}"
if [ -n "$sample" ]; then
  echo "sample (dpt generate --weights $sample --prompt 'The ' --max-new-tokens 200 --seed 1):"
  build/dpt generate --weights "$sample" --prompt "The " --max-new-tokens 200 --seed 1
fi
