#!/usr/bin/env bash
# Activation checkpointing under every strategy: `dpt train` with and
# without --checkpoint-activations must save byte-identical weights (the
# gradients are bitwise equal, so every update is), for the GPT and the MLP,
# locally and on 2 ranks under DDP and ZeRO-3, in fp32 and in bf16.
# Usage: checkpoint_activations.sh DPT MPIEXEC
set -euo pipefail
dpt=$1 mpirun=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export OMP_NUM_THREADS=1
gpt=(--model gpt --layers 2 --heads 2 --width 32 --context 16 --batch 4)
mlp=(--model mlp --batch 16)
fail=0
for precision in fp32 bf16; do
for model in gpt mlp; do
  for strategy in local ddp zero3; do
    declare -n args=$model
    name=$model-$strategy-$precision
    for ck in off on; do
      flag=(); [[ $ck == on ]] && flag=(--checkpoint-activations)
      run=("$dpt" train "${args[@]}" --synthetic --steps 2 --seed 3 --strategy "$strategy" --quiet
           --precision "$precision" --save "$dir/$name-$ck.safetensors" "${flag[@]}")
      if [[ $strategy == local ]]; then "${run[@]}"
      else "$mpirun" --allow-run-as-root --oversubscribe -n 2 "${run[@]}"; fi
    done
    if cmp -s "$dir/$name-off.safetensors" "$dir/$name-on.safetensors"; then
      echo "ok: $model $strategy $precision weights identical with checkpointing"
    else
      echo "FAIL: $model $strategy $precision weights differ with --checkpoint-activations"; fail=1
    fi
  done
done
done
exit $fail
