// Two small helpers the decoder's passes share (decoder_passes.cpp, the
// whole backward; decoder_split.cpp, the backward split in B and W).
#pragma once

namespace dpt::decoder_pass {

// An arena pointer as the compute type's buffer (float, or bf16 in a bf16 run).
template <typename CT>
CT* as(void* p) {
  return static_cast<CT*>(p);
}

// The last slot of a weight and its optional bias (-1 when absent).
inline int last_of(int weight, int bias) { return bias >= 0 ? bias : weight; }

}  // namespace dpt::decoder_pass
