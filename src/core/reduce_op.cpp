#include "core/reduce_op.h"

namespace dpt {

const char* reduce_op_name(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : (op == ReduceOp::Avg ? "avg" : "max");
}

}  // namespace dpt
