// MPI point-to-point links, for peers on other hosts (or every peer with
// --transport mpi). Messages go in pieces of kPiece bytes with two in flight
// each way, so a reducing receive adds piece k while piece k+1 is on the
// wire.
#pragma once

#include <mpi.h>

#include <vector>

#include "comm/peer.h"

namespace dpt::comm {

class MpiPeer : public Peer {
 public:
  static constexpr size_t kPiece = 1 << 20;
  MpiPeer(MPI_Comm comm, int peer_rank);
  ~MpiPeer() override;
  void start_send(const void* src, size_t bytes) override;
  Transfer progress_send() override;
  void start_recv(void* dst, size_t bytes, Combine c) override;
  Transfer progress_recv() override;
  const char* kind() const override { return "mpi"; }

 private:
  static size_t pieces(size_t bytes) { return (bytes + kPiece - 1) / kPiece; }
  size_t piece_bytes(size_t total, size_t k) const;
  void post_recv(size_t k);

  MPI_Comm comm_;
  int peer_;
  // Send side: pieces posted and completed.
  const char* send_src_ = nullptr;
  size_t send_bytes_ = 0, send_posted_ = 0, send_done_ = 0;
  MPI_Request send_req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  // Receive side; a reducing receive lands pieces in staging first.
  char* recv_dst_ = nullptr;
  size_t recv_bytes_ = 0, recv_posted_ = 0, recv_done_ = 0;
  Combine recv_combine_ = Combine::Copy;
  MPI_Request recv_req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<char> staging_[2];
};

}  // namespace dpt::comm
