// "Every rank agrees on a local error": a check that one rank can fail (its
// disk, its memory, its file) must end the run on every rank, or the others
// wait in the next collective for a rank that has left.
#pragma once

#include <string>

#include "comm/process_group.h"
#include "core/error.h"

namespace dpt::comm {

// Collective: "" when no rank of pg has a problem, else the message to
// throw here: the first failing rank's (cut to 511 bytes on the others).
std::string agreed_error(ProcessGroup& pg, const std::string& problem);

// Collective: throws E with agreed_error's message on every rank when any
// rank's `problem` is not empty.
template <typename E = IoError>
void agree_on_error(ProcessGroup& pg, const std::string& problem) {
  if (const std::string m = agreed_error(pg, problem); !m.empty()) throw E(m);
}

// Collective: every rank's bf16_dot_over_fma() (core/dot_rate.h) becomes
// rank 0's (where both cores have AVX-512 BF16). The figure times each
// rank's own core, and --bf16-gemm auto widens bf16 GEMMs by it: ranks that
// chose differently would compute their gradients with different roundings.
void agree_on_bf16_dot_rate(ProcessGroup& pg);

}  // namespace dpt::comm
