#include "train/plan_context.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "models/decoder_config.h"
#include "models/model.h"
#include "train/rank_setup.h"

namespace dpt {

namespace {

bool same_point(const PlanPoint& a, const PlanPoint& b) {
  return a.strategy.name() == b.strategy.name() && a.precision == b.precision && a.checkpoint == b.checkpoint &&
         a.offload == b.offload && a.tp == b.tp && a.pp == b.pp && a.cp == b.cp;
}

}  // namespace

bool fits_at_context(const PlanRequest& r, const PlanPoint& point, const std::string& mode, int64_t T) {
  PlanRequest q = r;
  q.run.model_config = model_hparams(r.run);
  q.run.model_config["block_size"] = std::to_string(T);
  q.run.attention = mode == "unfused" ? "unfused" : "fused";
  q.run.tp = point.tp;
  q.run.pp = point.pp;
  q.run.cp = point.cp;
  q.all_meshes = false;
  q.strategies = {point.strategy};
  PlanPoint p = point;
  p.checkpoint = mode == "fused+ckpt";
  auto model = make_model(model_hparams(q.run));
  set_attention(q.run, *model);
  const Plan plan = make_plan(q, *model);
  for (const PlanRow& row : plan.rows)
    if (same_point(row.point, p)) return row.fits;
  return false;  // not a row the plan makes (checkpointing that drops nothing)
}

std::vector<ContextLimit> largest_contexts(const PlanRequest& r, const PlanPoint& point) {
  std::vector<ContextLimit> out;
  if (r.run.model == "mlp") return out;
  // Under --cp a context is a whole number of 2 x cp chunks: the search
  // counts in chunks' worth (one token without --cp).
  const int64_t unit = point.cp > 1 ? 2 * point.cp : 1;
  const int64_t now = std::max<int64_t>(1, DecoderConfig::from(model_hparams(r.run)).context / unit);
  const int64_t cap = kMaxPlannedContext / unit;
  for (const char* mode : {"unfused", "fused", "fused+ckpt"}) {
    if (std::string(mode) != "unfused" && r.run.device != Device::CPU) continue;  // no fused kernel there
    if (std::string(mode) == "unfused" && point.cp > 1) continue;                // ring attention is fused
    auto fits = [&](int64_t k) { return fits_at_context(r, point, mode, k * unit); };
    ContextLimit limit{mode};
    // lo fits (or is 0), hi does not (or is past the cap), in units.
    int64_t lo = 0, hi = 0;
    if (fits(now)) {
      lo = now;
      for (hi = now * 2; hi <= cap && fits(hi); hi *= 2) lo = hi;
      if (hi > cap) {
        limit.context = lo * unit, limit.capped = true;
        out.push_back(limit);
        continue;
      }
    } else {
      hi = now;
      for (lo = now / 2; lo > 0 && !fits(lo); lo /= 2) hi = lo;
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    limit.context = lo * unit;
    out.push_back(limit);
  }
  return out;
}

nlohmann::json context_limits_json(const PlanPoint& point, const std::vector<ContextLimit>& limits) {
  nlohmann::json j = {{"row", row_name(point)}, {"strategy", point.strategy.name()}, {"precision", point.precision},
                      {"offload", point.offload}, {"tp", point.tp}, {"pp", point.pp},
                      {"cp", point.cp}};
  for (const ContextLimit& l : limits) j[l.mode] = {{"context", l.context}, {"capped", l.capped}};
  return j;
}

}  // namespace dpt
