#!/bin/bash
# PyTorch weights evaluated on the GPU give PyTorch's loss (issue 17): a
# GPT-2 in Hugging Face's layout from tests/parity/hf_gpt2_reference.py
# (PyTorch, float64 loss), evaluated by `dpt eval --device cuda`, within 1e-5
# relative. Usage: hf_eval.sh DPT WORKDIR. Exit 77 where no GPU or no torch
# (a missing GPU fails with DPT_REQUIRE_GPU=1).
set -u
DPT=$1 W=$2
mkdir -p "$W"
python3 "$(dirname "$0")/../parity/hf_gpt2_reference.py" --out "$W" >/dev/null 2>"$W/ref.err" || {
  echo "skipped: PyTorch reference could not run: $(tail -1 "$W/ref.err")"; exit 77; }
out=$("$DPT" eval --device cuda --weights "$W/hf/model.safetensors" --data "$W/tokens.bin" --batch 20 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  if [ "${DPT_REQUIRE_GPU:-}" != 1 ]; then
    case $out in *"no CUDA device"*|*"built without CUDA"*) echo "skipped: $out"; exit 77 ;; esac
  fi
  echo "dpt eval failed ($rc): $out"; exit 1
fi
python3 - "$W/hf_loss.json" "$out" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["loss"]
got = float(sys.argv[2].split()[1])
rel = abs(got - ref) / abs(ref)
print(f"PyTorch loss {ref:.8f}, dpt eval --device cuda {got:.6f}: relative {rel:.2e} (bar 1e-5)")
sys.exit(0 if rel <= 1e-5 else 1)
PY
