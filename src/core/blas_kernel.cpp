#include "core/blas_kernel.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace dpt {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string better_blas_core(const std::string& current, bool avx512, bool avx512bf16, bool user_set) {
  if (user_set || !avx512) return "";
  std::string lower = current;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // Kernel sets that already use AVX-512: leave them alone.
  for (const char* fast : {"skylakex", "cooperlake", "sapphirerapids"})
    if (lower == fast) return "";
  return avx512bf16 ? "Cooperlake" : "SkylakeX";
}

void prefer_avx512_blas(char** argv) {
#if defined(__x86_64__)
  const char* keep = std::getenv("DPT_KEEP_BLAS_CORE");
  if (keep && *keep && std::string(keep) != "0") return;
  // __builtin_cpu_supports checks that the OS saves the AVX-512 registers too.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  const std::string core = better_blas_core(blas_core(), avx512, bf16,
                                            std::getenv("OPENBLAS_CORETYPE") != nullptr);
  if (core.empty()) return;
  // The variable stays set in the new image, so this happens at most once.
  if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on as we were
#else
  (void)argv;
#endif
}

}  // namespace dpt
