#include "core/cpu_level.h"

namespace dpt {

#ifdef DPT_CPU_CLONES_ON
namespace {
// Two versions of one function (GCC's function multi-versioning): the
// loader picks between them by the rule that picks the kernels' clones.
// Calls dispatch only where every version is declared, hence this file's
// own function behind the plain one below.
__attribute__((target("default"))) const char* level() { return "x86-64-v3 (AVX2)"; }
__attribute__((target("arch=x86-64-v4"))) const char* level() { return "x86-64-v4 (AVX-512)"; }
}  // namespace

const char* cpu_kernel_level() { return level(); }
bool cpu_kernels_cloned() { return true; }
#else
const char* cpu_kernel_level() {
#if defined(DPT_NATIVE_BUILD)
  return "native";
#elif defined(__x86_64__)
  return "x86-64-v3 (AVX2)";
#else
  return "baseline";
#endif
}
bool cpu_kernels_cloned() { return false; }
#endif

}  // namespace dpt
