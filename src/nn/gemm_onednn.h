// The oneDNN backend of nn/gemm.h (only gemm.cpp includes this).
#pragma once

#include <cstdint>
#include <string>

#include "nn/gemm.h"

namespace dpt::onednn {

// C = alpha op(A) op(B) + beta C with A and B fp32 (bf16 = false) or bf16
// (bf16 = true), C fp32; the arguments as in dpt::gemm. With a bias (N fp32
// values, alpha 1, beta 0) the kernel adds it to every row of C as it writes
// C: C = op(A) op(B) + bias.
void matmul(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
            const void* B, int64_t ldb, float beta, float* C, int64_t ldc, bool bf16,
            const float* bias = nullptr);

// Whether this CPU has a bf16 matmul kernel (AVX512-BF16, AMX); without one
// gemm.cpp widens bf16 operands to fp32 before calling matmul.
bool bf16_supported();

// Whether oneDNN runs AVX-512 (or newer) kernels on this CPU.
bool avx512();
// Whether it runs AMX kernels (bf16 tiles) on this CPU.
bool amx();

// "oneDNN 2.6.3 (avx2, <bf16>)", bf16 saying how bf16 GEMMs run (gemm.cpp
// decides).
std::string describe(const std::string& bf16);
GemmCacheStats stats();

}  // namespace dpt::onednn
