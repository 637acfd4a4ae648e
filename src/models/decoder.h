// The decoder-only transformer, one class for every architecture its
// config describes (models/decoder_config.h): GPT-2 (W-GPT) and the Llama
// family (W-LLAMA, Hugging Face's Llama, Qwen2 and Mistral checkpoints).
// Token embedding (+ learned positions), pre-norm blocks of causal
// self-attention and an MLP, a final norm, and an output head tied to the
// embedding or its own. Parameter names are nanoGPT's for GPT-2
// ("transformer.h.0.attn.c_attn.weight") and Hugging Face's for the Llama
// family ("model.layers.0.self_attn.q_proj.weight").
//
// Units: the embedding ("transformer.embed" | "model.embed_tokens"), one
// per block ("transformer.h.{i}" | "model.layers.{i}"), and the final norm
// with an untied head ("transformer.ln_f" | "model.norm").
//
// Fused operands: a block's q, k and v projections are consecutive slots,
// so their rows form one [(H + 2 KV) hd, C] matrix and one GEMM computes
// them (GPT-2's c_attn is that matrix already); SwiGLU's gate and up
// likewise form one [2 I, C] matrix.
//
// The vocabulary may be padded in memory (padded_vocab > vocab, GPT-2's
// 50257 held as 50304 rows, a multiple of 64, as llm.c does for its GEMMs):
// the embedding (and an untied head) then has padded_vocab rows, the pad
// rows start at zero and stay there (their logits are left out of the
// softmax, so no gradient reaches them), tokens must still be below vocab,
// and weight files hold only the vocab true rows (models/weights.h).
#pragma once

#include <algorithm>
#include <functional>
#include <type_traits>
#include <map>
#include <string>
#include <vector>

#include "models/decoder_config.h"
#include "models/model.h"
#include "nn/ring_attention.h"

namespace dpt {

// The part of the model one pipeline rank holds (train/pipeline_executor.h):
// one or more chunks of consecutive blocks (a schedule with virtual stages
// gives a rank several: docs/pipeline.md), in increasing block order, the
// embedding if the rank has the model's first chunk, the final norm, the
// head and the loss if it has the last. The default is the whole model.
// Names stay the whole model's ("transformer.h.5" on a rank that starts at
// block 4), and init_range gives every element the value it has in the
// whole model, so every split starts from the same weights.
struct BlockRange {
  int64_t first = 0, last = -1;  // blocks [first, last); -1: to the last block
  bool operator==(const BlockRange&) const = default;
};
struct DecoderStage {
  std::vector<BlockRange> chunks = {BlockRange{}};
  bool embed = true;  // wte and wpe (with the rank's first chunk)
  bool head = true;   // the final norm, the head and the loss (with its last)
};

// The slice of the model one tensor-parallel rank holds (Megatron-LM;
// docs/tensor_parallel.md), as the decoder's tensor-parallel plan says
// (decoder.cpp, `build`): column-parallel slots (q, k, v or c_attn; c_fc or
// gate and up) keep rows [rank, rank + 1) x rows/size of each of their
// parts: query heads and key/value heads split in contiguous groups, so a
// rank's query heads read its own key/value heads (Hugging Face's
// repeat_kv); row-parallel slots (o_proj or c_proj; down_proj or
// mlp.c_proj) the same columns; norms, the row-parallel biases and wpe are
// replicated. The embedding and an untied head are whole too, or with
// `vocab` rows [rank, rank + 1) x rows/size of them: the
// vocabulary-parallel embedding and cross-entropy (nn/vocab_parallel.h),
// rows padded up to a multiple of size (pad rows are zero and take no
// part in the loss, as a padded vocabulary's).
// With `sequence` (Megatron's sequence parallelism, docs/tensor_parallel.md)
// the residual stream and the norms hold only rows [rank, rank + 1) x N/size
// of the N = B x T rows: the norm outputs are all-gathered before the
// column-parallel linears and the row-parallel outputs reduce-scattered in
// place of TP's all-reduces (a batch whose N size does not divide runs as
// plain TP: the same sums).
struct DecoderTp {
  int size = 1, rank = 0;
  bool vocab = false;
  bool sequence = false;
};

// The collectives a tensor-parallel decoder asks of its TP group, in place
// on n floats: an all-reduce (Sum, Max), or under sequence parallelism a
// reduce-scatter (sum; rank r's chunk of n / size is its result) and an
// all-gather (rank r's chunk in, every chunk out; AllGatherBf16: of n bf16
// values at x, the norms' outputs in a bf16 run).
enum class TpReduce { Sum, Max, ReduceScatter, AllGather, AllGatherBf16 };

class Decoder : public Model {
 public:
  // A block's slots; an absent bias or norm bias is -1. qkv_w is the first
  // of the fused q/k/v weight slots and qkv_end the last slot of the group
  // (its last weight or bias); fc_w and fc_end likewise for c_fc or
  // gate/up. Backward reports each group's slots final at once.
  struct BlockSlots {
    int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, qkv_end = -1, proj_w = -1, proj_b = -1;
    int ln2_w = -1, ln2_b = -1, fc_w = -1, fc_b = -1, fc_end = -1, fcproj_w = -1, fcproj_b = -1;
  };
  explicit Decoder(DecoderConfig config, DecoderStage stage = {}, DecoderTp tp = {});

  std::string kind() const override { return config_.family; }
  std::map<std::string, std::string> metadata() const override;
  void init_range(uint64_t seed, size_t begin, size_t n, float* out) const override;
  ForwardStats forward(const Batch& batch) override;
  void backward(float loss_scale) override;
  double train_flops(int64_t B) const override;
  double recompute_flops(int64_t B) const override;
  double non_gemm_flops(int64_t B) const override;
  std::vector<int> unit_order() const override;
  int64_t positions() const override { return config_.context; }
  size_t activation_bytes_for(int64_t B) const override;  // one micro-batch through every chunk
  size_t activation_bytes_for(int64_t B, int chunk) const;
  const DecoderConfig& config() const { return config_; }
  const DecoderStage& stage() const { return stage_; }
  // The whole model (not one pipeline stage of it).
  bool tied() const { return config_.tied; }
  // Fused causal attention (nn/flash_attention.h): a log-sum-exp per row
  // kept for backward instead of every head's T x T probabilities. fp32 on
  // the CPU; InputError, one sentence, otherwise (checked at forward).
  void set_fused_attention(bool on) { fused_attention_ = on; }
  // The fused attention's products on bf16 copies of their inputs (fp32
  // sums, softmax and outputs; nn/flash_attention.h): --attention-products
  // bf16, for bf16 runs on the CPU (run_checks refuses the rest).
  void set_bf16_attention_products(bool on) { bf16_attention_products_ = on; }
  // Context parallelism (docs/context_parallel.md): of every sequence's 2 x
  // size chunks this rank holds chunks rank and 2 size - 1 - rank. forward
  // takes whole sequences and keeps its chunks' rows (their positions for
  // wpe and the rotary tables); attention passes keys and values round
  // ring's group (nn/ring_attention.h; fused attention, on the CPU). Set
  // before the first forward; the loss is the mean over this rank's rows
  // (the data-parallel average over the CP ranks makes it the sequence's).
  void set_context_parallel(int size, int rank, ContextRing* ring);
  int context_parallel() const { return cp_size_; }
  // The rows of a sequence of T tokens this rank computes.
  int64_t local_rows(int64_t T) const { return T / cp_size_; }
  // The embedding's and the untied head's names: vocabulary rows.
  static bool vocab_matrix(const std::string& name);
  std::string embedding_name() const {
    return config_.family == "gpt" ? "transformer.wte.weight" : "model.embed_tokens.weight";
  }
  bool whole() const {
    return stage_.chunks.size() == 1 && stage_.chunks[0] == BlockRange{0, config_.layers} && stage_.embed &&
           stage_.head;
  }
  int chunks() const { return static_cast<int>(stage_.chunks.size()); }
  const DecoderTp& tp() const { return tp_; }
  // Tensor parallelism: the sum over the TP group, in place, of the row-
  // parallel projections' partial outputs (forward) and the column-parallel
  // ones' partial input gradients (backward): two all-reduces of B x T x C
  // each way per block. With a vocabulary-parallel wte also the embedding's
  // partial lookups and the head's partial input gradient (B x T x C each),
  // and the cross-entropy's maxima (Max) and sums (2 B x T). Needed before
  // the first forward when tp.size > 1.
  void set_tensor_reduce(std::function<void(float*, size_t, TpReduce)> reduce) { tp_reduce_ = std::move(reduce); }
  // Whether wte (and an untied head) is split by vocabulary rows over the
  // TP group (DecoderTp::vocab at tp > 1).
  bool vocab_parallel() const { return tp_.vocab && tp_.size > 1; }
  // Sequence parallelism: the TP group gathers a norm's output rows (the
  // compute type's N x C values at p) in place.
  template <typename CT>
  void gather_operand(void* p, int64_t N) const {
    tensor_sum(static_cast<float*>(p), static_cast<size_t>(N * config_.width),
               std::is_same_v<CT, float> ? TpReduce::AllGather : TpReduce::AllGatherBf16);
  }
  // Whether a batch of N = B x T rows runs sequence-parallel.
  bool sequence_parallel(int64_t N) const { return tp_.sequence && tp_.size > 1 && N % tp_.size == 0; }
  // wte's rows on this rank (all of them unless vocabulary-parallel), and
  // the first of them.
  int64_t wte_rows() const { return config_.rows() / (vocab_parallel() ? tp_.size : 1); }
  int64_t wte_first_row() const { return vocab_parallel() ? tp_.rank * wte_rows() : 0; }
  // A TP rank counts a tensor it holds whole as 1/size of its squares, so
  // the sum over the TP group counts every element of the model once.
  double grad_squares(const float* g, size_t begin, size_t n) const override;

  // The logits of a batch, [B*T, vocab] row-major, on the host: a forward
  // that stops before the loss (the whole model on one rank; not
  // vocabulary-parallel). The batch's targets are not read.
  std::vector<float> logits(const Batch& batch);

  // Generation (docs/generate.md): incremental decoding over a key/value
  // cache, one forward per new token over the cache instead of one over the
  // whole sequence. prefill empties the cache and runs `tokens` through it
  // (chunks of up to kPrefillChunk tokens, each one pass); step appends one
  // token. Each returns the logits [vocab] (the pad columns of a padded
  // vocabulary dropped) of the position after the last token given: what a
  // full forward (logits()) gives at that position, within rounding. The
  // whole model on one rank, on the CPU, in the model's precision (fp32, or
  // bf16 with its bf16 compute copies); anything else, a token outside the
  // vocabulary or more positions than the context is an InputError.
  std::vector<float> prefill(const std::vector<int32_t>& tokens);
  std::vector<float> step(int32_t token);
  // Positions the cache holds.
  int64_t cached() const { return infer_.pos; }
  // Bytes generation allocates for a prompt of `rows` tokens: the cache at
  // the full context, the rotary tables, a chunk's activations and the logits.
  size_t generation_bytes(int64_t rows) const;
  static constexpr int64_t kPrefillChunk = 256;

  // Pipeline stages. A stage keeps several micro-batches' activations at
  // once, one arena per (chunk, slot); use_slot(slot, chunk) makes that
  // arena the one forward and backward work on, over that chunk's blocks
  // (slot 0 of chunk 0 is the one a model starts with).
  void use_slot(int slot, int chunk = 0);
  // Lays the current slot's arena out for B sequences of T tokens (this CP
  // rank's rows of them; forward does it too).
  void prepare(int64_t B, int64_t T) { plan_activations(B, local_rows(T)); }
  // The backward split in two (zero-bubble schedules, docs/pipeline.md):
  // backward_input (B) computes the gradient of the chunk's input and the
  // norms' parameter gradients, and keeps, per block, each linear's output
  // gradient and the norms' parameter gradients for backward_weights (W),
  // which later computes the linears' parameter gradients from them with
  // the very kernels backward() runs, adds the norms' in, in backward()'s
  // order, and reports them ready. The keep lives in forward buffers B
  // leaves dead, so without checkpointing a split arena is no larger than
  // an unsplit one (but at the fewest rows: docs/memory.md). B overwrites the chunk's stage_output().
  // The embedding and the head do all of their backward in B. Set before
  // the first forward (activation_bytes_for counts what W needs).
  void set_split_backward(bool on) { split_backward_ = on; }
  void backward_input(float loss_scale);
  void backward_weights();
  // Without the embedding, forward reads its input (the residual stream
  // entering block `first`, B x T x C) from stage_input(); without the head,
  // backward reads the gradient of its output from output_grad(). After
  // them: stage_output() is the output of forward, input_grad() the
  // gradient of the input after backward. All in the current slot.
  float* stage_input() { return act_.encoded; }
  const float* stage_output() const { return act_.blocks.back().res3; }  // (a chunk has a block at least)
  float* output_grad() { return act_.dres; }
  const float* input_grad() const { return act_.dres; }
  // Another arena's stage_output() and output_grad() (a pipeline passes
  // between two chunks of one rank by copying).
  const float* stage_output_of(int slot, int chunk) const;
  float* output_grad_of(int slot, int chunk);
  // A head without the embedding in its chunk computes with this copy of
  // wte, which the pipeline keeps in the compute type (fp32, or bf16 in a
  // bf16 run: what the head's GEMM reads), and adds its gradient into
  // tied_grad (fp32, as every weight gradient). Call after set_precision.
  void set_tied_head(const void* wte, float* tied_grad);
  // The embedding's backward adds this gradient into wte's before its own
  // (the head's contribution, computed on the last stage), when set.
  void set_tied_grad_in(const float* g) { tied_in_ = g; }
  // Bytes of every slot's arena, and the arenas laid out (slots used).
  size_t arena_bytes_held() const;
  int arenas_held() const;

 private:
  // This rank's widths, from the tensor-parallel plan: query and key/value
  // heads, the fused q/k/v row width, the attention output width, the MLP's
  // inner width (I) and its first GEMM's output (4C for GELU, 2 I for
  // SwiGLU).
  struct Widths {
    int64_t heads = 0, kv = 0, hd = 0, qkv = 0, att = 0, inner = 0, fc = 0;
  };
  // Activations of one block for the current batch (pointers into acts_).
  // ln1, atty, ln2 and fch_gelu only feed GEMMs, so they are held in the
  // compute type (float, or bf16 in a bf16 run: void* here, typed by the
  // passes, which are templates on it). With checkpointing, every block's
  // res3 (its output: the next block's input) is its own, and all the rest
  // point to one scratch block shared by all blocks, refilled by
  // recomputation before each block's backward.
  struct BlockActs {
    float *ln1_mean, *ln1_rstd, *qkv, *res2;  // mean: LayerNorm only
    float* att;  // the probabilities [B, heads, T, T]; fused attention: the log-sum-exp [B, heads, T]
    float *ln2_mean, *ln2_rstd, *fch, *res3;
    void *ln1, *atty, *ln2, *fch_gelu;
    // A split backward's keep for W (lay_out_keep): the output gradients of
    // the MLP's projection (dy2) and first linear (d4C), of the attention's
    // projection (dy1) and q/k/v (d3C), each in a forward buffer B leaves
    // dead (res3, fch, res2; the next block's qkv, the last block the
    // arena's scratch d3C) or, with checkpointing (those but res3 are the
    // scratch block's), the block's own; the norms' parameter gradients B
    // computed (ln2's weight and bias, ln1's weight and bias: C floats
    // each, the biases LayerNorm's only), over the norms' dead statistics
    // and attention state where they fit, else the block's own; and the
    // linears' inputs W reads (the block's own, with checkpointing too).
    float *w_dy2 = nullptr, *w_d4C = nullptr, *w_dy1 = nullptr, *w_d3C = nullptr;
    float* w_norm[4] = {};
    void *w_ln1 = nullptr, *w_atty = nullptr, *w_ln2 = nullptr, *w_fch_gelu = nullptr;
  };
  // Every pointer into the arena for one (B, T).
  struct Acts {
    std::vector<BlockActs> blocks;
    float *encoded = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;
    float* logits = nullptr;  // [B*T, padded V]; [B*T, V] probabilities after forward
                              // (vocabulary-parallel: [B*T, wte_rows()], this rank's columns)
    float* ce = nullptr;      // vocabulary-parallel: the cross-entropy's maxima, then its sums [3 B*T]
    void* lnf = nullptr;      // compute type
    // Backward scratch, reused by every block.
    float *dres = nullptr, *dC = nullptr, *d3C = nullptr, *d4C = nullptr;
    float* dI = nullptr;      // SwiGLU: the gradient of its output [N, I]
    float *rope_cos = nullptr, *rope_sin = nullptr;  // rotary: [T, hd/2] each
    float* atty32 = nullptr;  // bf16 runs: attention's fp32 output before conversion
    void* dout16 = nullptr;   // bf16 runs: an output gradient converted for the GEMMs
    float* ring = nullptr;    // context parallelism: ring attention's scratch (RingShape::scratch)
  };
  // The TP group's collective `op` on x[0, n), in place (TpReduce: a sum or
  // max, or sequence parallelism's reduce-scatter and all-gathers); nothing
  // at tp 1. The name is from when sums were all it did.
  void tensor_sum(float* x, size_t n, TpReduce op = TpReduce::Sum) const;
  // The loss over this rank's vocabulary columns (vocabulary-parallel).
  float vocab_parallel_loss(int64_t N, int64_t* correct);
  // Of this rank's wte rows, those of the vocabulary (the rest are pad).
  int64_t vocab_live() const { return std::clamp<int64_t>(config_.vocab - wte_first_row(), 0, wte_rows()); }
  // Lays the arena out for (B, T) from base, or only counts when base is
  // null; returns the floats it takes. The one description of the arena:
  // activation_bytes_for asks it too.
  int64_t lay_out(int64_t B, int64_t T, float* base, Acts& a, int chunk) const;
  struct Cursor;
  // A split backward's keep for W of one block, from the cursor.
  void lay_out_keep(BlockActs& b, Cursor& c, int64_t att_floats) const;
  // The current chunk: whether it has the embedding or the head, its
  // blocks (indices into blocks_), and its block l's slots and unit.
  bool embeds() const { return stage_.embed && chunk_ == 0; }
  bool heads() const { return stage_.head && chunk_ + 1 == chunks(); }
  size_t chunk_blocks(int c) const { return chunk_first_[static_cast<size_t>(c) + 1] - chunk_first_[static_cast<size_t>(c)]; }
  const BlockSlots& slots_of(size_t l) const { return blocks_[chunk_first_[static_cast<size_t>(chunk_)] + l]; }
  int unit_of(size_t l) const { return block_unit0_ + static_cast<int>(chunk_first_[static_cast<size_t>(chunk_)] + l); }
  // A pass's part for the store (UnitStore::begin_pass): a forward and a
  // backward of chunk c are part c, a split backward's W part chunks + c.
  int part(bool weights = false) const { return weights ? chunks() + chunk_ : chunk_; }
  void plan_activations(int64_t B, int64_t T);
  // With a padded vocabulary the head's GEMM writes [N, padded_vocab]
  // logits; the loss reads [N, vocab]: pack_logits drops the pad columns in
  // place after forward, unpack_logit_grads puts them back (as zeros) before
  // the head's backward.
  void pack_logits(int64_t N);
  void unpack_logit_grads(int64_t N);
  // The passes, on compute type CT (float or bf16).
  template <typename CT>
  ForwardStats forward_as(int64_t B, int64_t T);
  template <typename CT>
  void backward_as(float loss_scale);
  template <typename CT>
  void backward_input_as(float loss_scale);
  template <typename CT>
  void backward_weights_as();
  // A split backward's halves of one block (B: from dres to the block
  // input's gradient and the norms' parameter gradients, keeping what W
  // needs; W: the linears' parameter gradients, the norms' added in).
  template <typename CT>
  void block_backward_input(size_t l, const float* x, int64_t B, int64_t T);
  template <typename CT>
  void block_backward_weights(size_t l, int64_t N);
  // The embedding's forward (token rows, learned positions) and backward.
  template <typename CT>
  void embed_forward(int64_t B, int64_t T);
  void embed_backward(int64_t B, int64_t T);
  // The loss, the head and ln_f backward (the last stage's start of backward).
  template <typename CT>
  void head_backward(float loss_scale);
  // The pipeline's copy of wte as the head's GEMM reads it.
  template <typename CT>
  const CT* tied_weight() const;
  // Block l's forward from its input x into act_.blocks[l] (with unit l + 1 open).
  template <typename CT>
  void block_forward(size_t l, const float* x, int64_t B, int64_t T);
  // Its attention (q/k/v projection to the attention's output) and MLP
  // (the second norm's output to the MLP's, before the residual add).
  template <typename CT>
  void attention_forward(const BlockSlots& s, const BlockActs& a, int64_t B, int64_t T);
  template <typename CT>
  void mlp_forward(const BlockSlots& s, const BlockActs& a, int64_t N);
  // Their backward, from the residual stream's gradient dres to the
  // norm's output gradient in dC (this rank's part of it under TP).
  template <typename CT>
  void attention_backward(const BlockSlots& s, const BlockActs& b, int64_t B, int64_t T);
  // From the attention's q/k/v gradient d3C (rotary's turn taken back, in
  // place) through the q/k/v projection's backward: the whole backward's
  // (dweight, and dbias where there is a bias) or a split backward's B
  // (both null).
  template <typename CT>
  void qkv_backward(float* dinp, float* dweight, float* dbias, float* d3C, const CT* inp, const CT* weight, int64_t B,
                    int64_t T);
  template <typename CT>
  void mlp_backward(const BlockSlots& s, const BlockActs& b, int64_t N);
  // The attention kernel the run computes with (decoder_attention.cpp):
  // ring attention across the CP group, the fused kernel or the unfused
  // layer; att is the log-sum-exps (fused, ring) or the probabilities.
  // out16 (a bf16 run's; null in fp32): out's bf16 copy, which the fused
  // kernel writes with out and the other paths convert after.
  void attend_forward(float* out, bf16* out16, float* att, const float* qkv, int64_t B, int64_t T);
  void attend_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* att, int64_t B,
                       int64_t T);
  // The attention's fp32 output, which the fused and ring backward read:
  // the block's own in an fp32 run, kept after the log-sum-exps in a bf16
  // one (lay_out).
  template <typename CT>
  float* fused_out(const BlockActs& b, int64_t B, int64_t T) const {
    if constexpr (std::is_same_v<CT, float>)
      return static_cast<float*>(b.atty);
    else
      return b.att + B * w_.heads * T;
  }
  RingShape ring_shape(int64_t B, int64_t T) const {
    return {B, T, w_.heads, w_.kv, w_.hd, bf16_attention_products_ ? FlashProducts::BF16 : FlashProducts::F32};
  }
  // Context parallelism: the position in its sequence of local row t of T,
  // this rank's rows of a batch of whole sequences, and the learned
  // positions' forward and backward over the local rows.
  int64_t position(int64_t t, int64_t T) const { return context_position(t, T, cp_rank_, cp_size_); }
  void keep_local_rows(const Batch& batch, int64_t T);
  // InputError, one sentence, for whole sequences of T tokens context
  // parallelism cannot run.
  void check_context_parallel(int64_t T) const;
  template <typename CT>
  void positions_forward(int64_t B, int64_t T);
  void positions_backward(int64_t B, int64_t T);
  // The norm of the config (LayerNorm or RMSNorm) and its backward.
  template <typename CT>
  void norm_forward(CT* out, float* mean, float* rstd, const float* x, int w, int b, int64_t N);
  // dres: where the input's gradient is added (act_.dres, or this rank's
  // rows of it under sequence parallelism, whose norm weight gradients are
  // then summed over the TP group: each rank saw only its rows).
  void norm_backward(float* dres, const float* dout, const float* x, int w, int b, const float* mean,
                     const float* rstd, int64_t N, bool sequence);
  // A slot's parameters / gradients, or nullptr for an absent slot (-1).
  const float* param_or_null(int slot) const { return slot < 0 ? nullptr : param(slot); }
  float* grad_or_null(int slot) { return slot < 0 ? nullptr : grad(slot); }
  // The rotary tables for T positions, into the arena (CPU-computed, then
  // placed on the device).
  void fill_rope_tables(int64_t T);

  // Generation's state (decoder_infer.cpp): the key/value cache and the
  // activations of one chunk of new tokens, apart from the training arena.
  // GEMM operands (ln, atty16, act) hold the compute type in float storage.
  struct Infer {
    std::vector<float> k, v;               // [layers, context, kv hd] each
    std::vector<float> rope_cos, rope_sin;  // rotary: [context, hd/2]
    std::vector<float> x, ln, mean, rstd, qkv, atty, atty16, res, fch, act, logits;
    int64_t pos = 0;                        // positions cached
    int64_t n = 0;                          // rows the buffers hold
  };
  // Runs tokens[0, n) at positions pos .. pos + n - 1 into the cache and
  // returns the last one's next-token logits [vocab].
  std::vector<float> extend(const int32_t* tokens, int64_t n);
  void check_generation() const;
  void size_infer(int64_t n);
  template <typename CT>
  void extend_as(const int32_t* tokens, int64_t n);
  template <typename CT>
  void infer_attention(size_t l, int64_t n);
  template <typename CT>
  void infer_block(size_t l, int64_t n);
  template <typename CT>
  void infer_head(int64_t n);

  // The arena moves with the model: forget its layout so the next forward
  // lays it out again (pointers into the new memory, ids_ reserved).
  void place_buffers(Device d) override {
    ids_.place(d);
    batch_ = seq_ = 0;
  }
  // The batch's token ids and targets where the kernels read them: the
  // host vectors on the CPU, ids_ (tokens, then targets) on a GPU.
  const int32_t* tok() const {
    return device_ == Device::CPU ? tokens_.data() : reinterpret_cast<const int32_t*>(ids_.f32());
  }
  const int32_t* tgt() const {
    return device_ == Device::CPU ? targets_.data() : reinterpret_cast<const int32_t*>(ids_.f32()) + batch_ * seq_;
  }

  DecoderConfig config_;
  DecoderStage stage_;
  DecoderTp tp_;
  std::function<void(float*, size_t, TpReduce)> tp_reduce_;
  // Per slot: each slot's offset in the whole model's flat buffer.
  std::vector<size_t> whole_offset_;
  const void* tied_w_ = nullptr;  // in tied_dtype_
  DType tied_dtype_ = DType::F32;
  float* tied_g_ = nullptr;
  const float* tied_in_ = nullptr;
  // The arenas of the slots not in use (the current one lives in the
  // members below), swapped in by use_slot.
  struct Arena {
    FlatBuffer acts, ids;
    Acts act;
    std::vector<int32_t> tokens, targets;
    int64_t batch = 0, seq = 0;
    bool planned_checkpoint = false;
    DType planned_precision = DType::F32;
    bool planned_fused = false;
    bool planned_split = false;
  };
  std::vector<Arena> arenas_{1};
  int slot_ = 0;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  bool stop_at_logits_ = false;  // logits(): forward ends with the packed logits
  bool fused_attention_ = false;
  bool bf16_attention_products_ = false;
  int cp_size_ = 1, cp_rank_ = 0;
  ContextRing* ring_ = nullptr;
  int head_ = -1;  // an untied head's slot (lm_head.weight), on the last stage
  Widths w_;
  std::vector<float> inv_freq_;  // rotary: [hd/2] (nn/rope.h)
  int embed_unit_ = -1, lnf_unit_ = -1;  // -1: not on this stage
  int block_unit0_ = 0;                 // block i of the stage is unit block_unit0_ + i
  std::vector<BlockSlots> blocks_;  // every chunk's, in order
  std::vector<size_t> chunk_first_;  // chunk c: blocks_[chunk_first_[c], chunk_first_[c + 1])
  int chunk_ = 0;
  bool split_backward_ = false;
  int64_t batch_ = 0, seq_ = 0;  // the arena's layout (B, T)
  bool planned_checkpoint_ = false;  // ... whether it was planned for checkpointing
  DType planned_precision_ = DType::F32;  // ... and for which compute type
  bool planned_fused_ = false;             // ... and attention
  bool planned_split_ = false;             // ... and a split backward
  Acts act_;
  std::vector<int32_t> tokens_, targets_;
  FlatBuffer ids_;
  Infer infer_;
  std::vector<float> sp_grads_;  // sequence parallelism: a norm's earlier gradients while its new part is summed
};

}  // namespace dpt
