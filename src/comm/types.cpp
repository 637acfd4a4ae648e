#include "comm/types.h"

#include <cstdlib>

namespace dpt::comm {

Algo parse_algo(const std::string& s) {
  if (s == "ring") return Algo::Ring;
  if (s == "mpi") return Algo::Mpi;
  throw InputError(fmt::format("unknown collective algorithm '{}' (expected ring or mpi)", s));
}

Transport parse_transport(const std::string& s) {
  if (s == "auto") return Transport::Auto;
  if (s == "shm") return Transport::Shm;
  if (s == "mpi") return Transport::Mpi;
  throw InputError(fmt::format("unknown transport '{}' (expected auto, shm or mpi)", s));
}

const char* algo_name(Algo a) { return a == Algo::Ring ? "ring" : "mpi"; }

DeviceComm parse_device_comm(const std::string& s) {
  if (s == "auto") return DeviceComm::Auto;
  if (s == "nccl") return DeviceComm::Nccl;
  if (s == "staged") return DeviceComm::Staged;
  throw InputError(fmt::format("unknown GPU collective path '{}' (expected auto, nccl or staged)", s));
}

Config Config::from_env() {
  Config c;
  if (const char* v = std::getenv("DPT_COMM_ALGO")) c.algo = parse_algo(v);
  if (const char* v = std::getenv("DPT_COMM_TRANSPORT")) c.transport = parse_transport(v);
  if (const char* v = std::getenv("DPT_COMM_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0))
      throw InputError(fmt::format("DPT_COMM_TIMEOUT='{}' is not a positive number of seconds", v));
    c.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
  }
  if (const char* v = std::getenv("DPT_COMM_CHECK")) c.check_order = std::string(v) == "1";
  if (const char* v = std::getenv("DPT_COMM_IN_PLACE")) {
    const std::string s = v;
    if (s != "0" && s != "1") throw InputError(fmt::format("DPT_COMM_IN_PLACE='{}' is not 0 or 1", s));
    c.in_place = s == "1";
  }
  if (const char* v = std::getenv("DPT_DEVICE_COMM")) c.device_comm = parse_device_comm(v);
  return c;
}

}  // namespace dpt::comm
