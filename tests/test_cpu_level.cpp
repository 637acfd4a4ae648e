// The elementwise kernels' two copies (core/cpu_level.h): AVX-512 code only
// inside the x86-64-v4 clones, so the binary still runs on a CPU without
// AVX-512, and every kernel that should have a clone has one.
#include <cstdio>
#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "core/cpu_level.h"

namespace {

// Functions of `binary` (mangled names) that use AVX-512 registers (zmm, or
// the mask registers k0-k7), from objdump's disassembly.
std::set<std::string> functions_using_avx512(const std::string& binary) {
  std::set<std::string> found;
  FILE* p = ::popen(("objdump -d --no-show-raw-insn '" + binary + "' 2>/dev/null").c_str(), "r");
  if (!p) return found;
  const std::regex header(R"(^[0-9a-f]+ <(.+)>:$)");
  const std::regex avx512(R"(%zmm[0-9]|%k[0-7]\b)");
  std::string current, line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    line = buf;
    if (!line.empty() && line.back() == '\n') line.pop_back();
    std::smatch m;
    if (std::regex_match(line, m, header))
      current = m[1];
    else if (line.find('%') != std::string::npos && std::regex_search(line, avx512))
      found.insert(current);
  }
  ::pclose(p);
  return found;
}

TEST(CpuLevel, AvxOnlyInsideTheClonesAndEveryKernelCloned) {
  if (!dpt::cpu_kernels_cloned()) GTEST_SKIP() << "this build has no x86-64-v4 copies (" << dpt::cpu_kernel_level() << ")";
  const std::set<std::string> fns = functions_using_avx512(DPT_BINARY_DIR "/dpt");
  ASSERT_FALSE(fns.empty()) << "objdump found no AVX-512 code in " DPT_BINARY_DIR "/dpt (is binutils installed?)";
  // The exceptions: code for AVX-512 BF16 (no x86-64 level holds it),
  // compiled for that target alone and called only where the CPU has it:
  // the fused attention's vdpbf16ps copies (nn/flash_attention.cpp,
  // has_dpbf16), the bf16 activations (nn/activations_avx512.cpp,
  // enabled()) and the probe of the dot products' rate (core/dot_rate.cpp).
  const auto dpbf16_copy = [](const std::string& f) {
    return f.find("15forward_tile_dp") != std::string::npos || f.find("17backward_group_dp") != std::string::npos ||
           f.find("18avx512_activations") != std::string::npos || f.find("dot_rate_probe_") != std::string::npos;
  };
  for (const std::string& f : fns)
    EXPECT_TRUE(f.find(".arch_x86_64_v4") != std::string::npos || dpbf16_copy(f))
        << f << " uses AVX-512 outside the clones";
  // Kernels of every kind (conversion, activation, normalization, softmax,
  // optimizer): a loop GCC vectorises uses zmm registers in its v4 copy.
  for (const char* kernel : {"_ZN3dpt7convertEPNS_4bf16EPKfm", "_ZN3dpt13gelu_backwardEPfPKfS2_l",
                             "_ZN3dpt18layernorm_backwardEPfS0_S0_PKfS2_S2_S2_S2_ll",
                             "_ZN3dpt21cross_entropy_forwardEPfPKfPKillPl", "_ZN3dpt12adamw_updateEPfS0_S0_S0_mffffffbPNS_4bf16E",
                             "_ZN3dpt10sgd_updateEPfS0_S0_mfffbbPNS_4bf16E"}) {
    bool cloned = false;
    for (const std::string& f : fns) cloned |= f.rfind(kernel, 0) == 0;
    EXPECT_TRUE(cloned) << kernel << " has no AVX-512 copy";
  }
}

TEST(CpuLevel, NamesTheCopyThisCpuRuns) {
  const std::string level = dpt::cpu_kernel_level();
  if (!dpt::cpu_kernels_cloned()) GTEST_SKIP() << level;
  EXPECT_EQ(level, __builtin_cpu_supports("x86-64-v4") ? "x86-64-v4 (AVX-512)" : "x86-64-v3 (AVX2)");
}

}  // namespace
