// Where every named tensor of a model lives inside one flat buffer.
//
// Parameters, gradients and optimizer state are each one allocation; a
// Layout maps names to {shape, offset} inside it (llm.c's
// malloc_and_point_parameters). Slots are grouped into units (an embedding,
// one transformer block, a head), which are contiguous ranges, so a DDP
// bucket is a range of the buffer and a ZeRO shard a slice of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dpt {

struct Slot {
  std::string name;            // PyTorch's name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // PyTorch's layout: Linear weights are [out, in]
  size_t offset = 0;           // in elements from the start of the buffer
  size_t numel = 0;
  int unit = 0;                // index into Layout::units()
  bool decay = false;          // AdamW weight decay applies (matrices only)
};

struct Unit {
  std::string name;  // e.g. "transformer.h.0"
  size_t offset = 0;
  size_t numel = 0;
  int first_slot = 0;
  int slot_count = 0;
};

class Layout {
 public:
  // Starts a new unit; the slots added next belong to it.
  void begin_unit(const std::string& name);
  // Appends a slot at the end of the buffer and returns its index.
  int add(const std::string& name, std::vector<int64_t> shape, bool decay);

  const std::vector<Slot>& slots() const { return slots_; }
  const std::vector<Unit>& units() const { return units_; }
  const Slot& slot(int i) const { return slots_.at(static_cast<size_t>(i)); }
  // Index of the slot with this name, or -1.
  int find(const std::string& name) const;
  size_t numel() const { return numel_; }

 private:
  std::vector<Slot> slots_;
  std::vector<Unit> units_;
  size_t numel_ = 0;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[3, 4]"

}  // namespace dpt
