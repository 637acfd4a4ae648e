// The decoder's backward split in B and W (Decoder::set_split_backward,
// models/decoder_split.cpp), in one process, against the unsplit backward:
//  - two micro-batches in two arenas, run as a zero-bubble schedule runs
//    them (F0 F1 B0 B1 W0 W1): every gradient bitwise F0 BW0 F1 BW1's, and
//    the same gradient-ready reports in the same order, for GPT-2 (LayerNorm,
//    GELU) and Llama (RMSNorm, SwiGLU, rotary, GQA), fp32 and bf16, fused
//    and unfused attention, with and without checkpointing, with B x T
//    above and below the width (the norms' gradients over their statistics,
//    the attention's state, or partly in the block's own keep), on 2
//    threads (the norm kernels' partial sums);
//  - B writes no block gradient (a strategy that reduces per micro-batch
//    may still hold an earlier micro-batch's buffer when B runs), and W
//    reports every block slot;
//  - the keep over dead forward buffers: without checkpointing, a split
//    arena is exactly an unsplit one but for the norms' vectors no dead
//    piece has room for (none at B x T >= C).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "compare.h"
#include "core/threads.h"
#include "data/batches.h"
#include "models/decoder.h"

namespace dpt {
namespace {

struct Case {
  std::string name;
  DecoderConfig config;
  int64_t B = 2;
  DType precision = DType::F32;
  bool fused = false, checkpoint = false;
};

DecoderConfig gpt() { return DecoderConfig{13, 3, 2, 16, 8}; }  // vocab, layers, heads, width, context

DecoderConfig llama() {
  DecoderConfig c = DecoderConfig::llama();
  c.vocab = 32;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 16;
  c.head_size = 4;
  c.intermediate = 24;
  c.context = 8;
  return c;
}

struct Result {
  std::vector<float> grads;
  std::vector<std::pair<size_t, size_t>> ready;  // (offset, numel) as reported
  size_t arena = 0;
};

std::unique_ptr<Decoder> make(const Case& c, bool split) {
  auto m = std::make_unique<Decoder>(c.config);
  m->init_params(3);
  m->set_precision(c.precision);
  m->set_fused_attention(c.fused);
  m->set_checkpoint_activations(c.checkpoint);
  m->set_split_backward(split);
  m->zero_grads();
  return m;
}

Batch batch_of(const Decoder& m, int64_t B, int micro) {
  Batch b;
  fill_synthetic(m, B, static_cast<uint64_t>(11 + micro), b);
  return b;
}

// The blocks' gradients [begin, end) of the flat buffer (units 1 .. layers).
std::pair<size_t, size_t> block_range(const Decoder& m) {
  const auto& units = m.layout().units();
  const Unit& first = units[1];
  const Unit& last = units[static_cast<size_t>(m.config().layers)];
  return {first.offset, last.offset + last.numel};
}

Result unsplit(const Case& c) {
  auto m = make(c, false);
  Result r;
  m->on_grads_ready = [&](size_t o, size_t n) { r.ready.emplace_back(o, n); };
  for (int micro = 0; micro < 2; ++micro) {
    m->forward(batch_of(*m, c.B, micro));
    m->backward(0.5f);
  }
  r.grads.assign(m->grads(), m->grads() + m->param_count());
  r.arena = m->activation_bytes_for(c.B);
  return r;
}

Result split(const Case& c) {
  auto m = make(c, true);
  Result r;
  std::vector<std::pair<size_t, size_t>> b_reports, w_reports[2];
  std::vector<std::pair<size_t, size_t>>* into = &b_reports;
  m->on_grads_ready = [&](size_t o, size_t n) { into->emplace_back(o, n); };
  for (int micro = 0; micro < 2; ++micro) {
    m->use_slot(micro);
    m->forward(batch_of(*m, c.B, micro));
  }
  const auto [lo, hi] = block_range(*m);
  for (int micro = 0; micro < 2; ++micro) {
    m->use_slot(micro);
    m->backward_input(0.5f);
  }
  for (size_t i = lo; i < hi; ++i)
    if (m->grads()[i] != 0.0f) {
      ADD_FAILURE() << c.name << ": B wrote block gradient element " << i;
      break;
    }
  for (const auto& [o, n] : b_reports)
    EXPECT_FALSE(o < hi && o + n > lo) << c.name << ": B reported block gradients ready";
  for (int micro = 0; micro < 2; ++micro) {
    m->use_slot(micro);
    into = &w_reports[micro];
    m->backward_weights();
  }
  // The order backward() reports in: per micro-batch the head's, the
  // blocks' (W's), the embedding's; B reported the head's and embedding's
  // of both micro-batches, in micro-batch order.
  const size_t per_b = b_reports.size() / 2;
  for (int micro = 0; micro < 2; ++micro) {
    const auto at = b_reports.begin() + static_cast<std::ptrdiff_t>(micro * per_b);
    std::vector<std::pair<size_t, size_t>> head_embed(at, at + static_cast<std::ptrdiff_t>(per_b));
    size_t heads = 0;
    while (heads < head_embed.size() && head_embed[heads].first >= hi) ++heads;
    r.ready.insert(r.ready.end(), head_embed.begin(), head_embed.begin() + static_cast<std::ptrdiff_t>(heads));
    r.ready.insert(r.ready.end(), w_reports[micro].begin(), w_reports[micro].end());
    r.ready.insert(r.ready.end(), head_embed.begin() + static_cast<std::ptrdiff_t>(heads), head_embed.end());
  }
  r.grads.assign(m->grads(), m->grads() + m->param_count());
  r.arena = m->activation_bytes_for(c.B);
  return r;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const bool llama_family : {false, true})
    for (const DType p : {DType::F32, DType::BF16})
      for (const bool checkpoint : {false, true})
        for (const int64_t B : {1, 3})  // B x T = 8 < 16 = C, and 24 >= C
          for (const bool fused : {false, true}) {
            Case c;
            c.config = llama_family ? llama() : gpt();
            c.B = B;
            c.precision = p;
            c.checkpoint = checkpoint;
            c.fused = fused;
            c.name = std::string(llama_family ? "llama" : "gpt") + (p == DType::BF16 ? " bf16" : " fp32") +
                     (checkpoint ? " checkpointed" : "") + (c.fused ? " fused" : "") + " B " + std::to_string(B);
            out.push_back(c);
          }
  return out;
}

TEST(SplitBackward, BitwiseTheUnsplitBackwardWithTheSameReports) {
  set_threads(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Result want = unsplit(c), got = split(c);
    ASSERT_EQ(got.grads.size(), want.grads.size());
    const test::Diff d = test::diff(got.grads.data(), want.grads.data(), want.grads.size());
    EXPECT_TRUE(d.bitwise()) << d.describe();
    EXPECT_EQ(got.ready, want.ready);
  }
}

// What W keeps lies over forward buffers B leaves dead: q/k/v, the MLP's
// pre-activation, the two residual-stream tensors, and the norms'
// statistics and attention state where they have room. Checkpointing (the
// block's buffers are one shared scratch) keeps the rest in the arena.
TEST(SplitBackward, KeepLiesOverDeadBuffers) {
  set_threads(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const size_t plain = make(c, false)->activation_bytes_for(c.B), kept = make(c, true)->activation_bytes_for(c.B);
    const DecoderConfig& d = c.config;
    const int64_t C = d.width, L = d.layers, N = c.B * d.context, hd = d.head_dim();
    const int64_t att = d.heads * hd, qkv = (d.heads + 2 * d.kv()) * hd, inner = d.ffn();
    const int64_t fc = d.mlp == MlpKind::SwiGlu ? 2 * inner : inner;
    const int64_t norm_params = d.norm == NormKind::LayerNorm ? 4 * C : 2 * C;  // both norms' per block
    // A GEMM operand of n values in floats: fp32, or bf16 rounded up to 64 bytes.
    auto operand = [&](int64_t n) { return c.precision == DType::BF16 ? (n + 31) / 32 * 16 : n; };
    const int vectors = d.norm == NormKind::LayerNorm ? 4 : 2;
    if (c.checkpoint) {
      // Per block its linears' inputs (the block's own, no longer the
      // scratch block's: one block's fewer there), three output gradients
      // (the fourth over the block's output) and the norms'.
      const int64_t operands = operand(N * C) + operand(N * att) + operand(N * C) + operand(N * inner);
      const int64_t per_block = operands + N * (fc + C + qkv) + norm_params;
      EXPECT_EQ(kept, plain + static_cast<size_t>(L * per_block - operands) * sizeof(float));
    } else {
      // The norms' C-float vectors over whole C-float pieces of the dead
      // statistics (N floats each: 4 LayerNorm, 2 RMSNorm) and attention
      // state; the rest the block's own.
      const int64_t att_floats = c.B * d.heads * (c.fused ? d.context : d.context * d.context) +
                                 (c.fused && c.precision == DType::BF16 ? N * att : 0);
      const int64_t room = vectors * (N / C) + att_floats / C;
      const int64_t own = std::max<int64_t>(0, vectors - room);
      if (N >= C) {
        EXPECT_EQ(own, 0);
      }
      EXPECT_EQ(kept, plain + static_cast<size_t>(L * own * C) * sizeof(float));
    }
  }
}

}  // namespace
}  // namespace dpt
