#!/bin/bash
# Records what the lent GPU machine has (compilers, libraries, the GPU), so
# the GPU build configuration can be checked against it. Usage: env.sh FILE
exec >"${1:-/dev/stdout}" 2>&1
set -x
cat /etc/os-release | head -3; uname -a; nproc; free -g; df -h / /tmp
nvidia-smi; nvcc --version; cmake --version; ninja --version; g++ --version; ldd --version | head -1
which python3 mpirun mpiexec compute-sanitizer ncu
python3 -c "import torch, numpy; print(torch.__version__, torch.version.cuda, numpy.__version__)"
ldconfig -p | grep -Ei "openblas|gomp|libz\.|mpi|nccl|cublas|dnnl|fmt|gtest" 
ls /usr/local/cuda/lib64 | head -80; ls /usr/local/cuda/include | grep -i -E "nccl|cublas|cuda_bf16" 
find / -xdev \( -name "nccl.h" -o -name "libnccl.so*" -o -name "libopenblas*.so*" -o -name "mpi.h" -o -name "libmpi.so*" -o -name "zlib.h" -o -name "CLI.hpp" -o -name "json.hpp" \) 2>/dev/null | head -40
ls /usr/include | head -100
