#include "comm/mpi_transport.h"

#include <algorithm>

#include "comm/mpi_env.h"
#include "comm/types.h"

namespace dpt::comm {

namespace {
void check(int rc, const char* what, int peer) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CommError(fmt::format("{} with rank {} failed: {}", what, peer, std::string(msg, static_cast<size_t>(len))));
  }
}
}  // namespace

MpiPeer::MpiPeer(MPI_Comm comm, int peer_rank) : comm_(comm), peer_(peer_rank) {
  staging_[0].resize(kPiece);
  staging_[1].resize(kPiece);
}

MpiPeer::~MpiPeer() {
  // Requests still posted belong to an operation that failed; cancel them so
  // MPI does not write into freed memory.
  std::lock_guard<std::mutex> lock(mpi_mutex());
  for (MPI_Request* r : {&send_req_[0], &send_req_[1], &recv_req_[0], &recv_req_[1]})
    if (*r != MPI_REQUEST_NULL) {
      MPI_Cancel(r);
      MPI_Request_free(r);
    }
}

size_t MpiPeer::piece_bytes(size_t total, size_t k) const { return std::min(kPiece, total - k * kPiece); }

void MpiPeer::start_send(const void* src, size_t bytes) {
  send_src_ = static_cast<const char*>(src);
  send_bytes_ = bytes;
  send_posted_ = send_done_ = 0;
}

Transfer MpiPeer::progress_send() {
  const size_t total = pieces(send_bytes_);
  const size_t before = send_done_;
  std::lock_guard<std::mutex> lock(mpi_mutex());
  while (send_done_ < total) {
    // Keep two pieces posted.
    while (send_posted_ < total && send_posted_ < send_done_ + 2) {
      size_t k = send_posted_;
      check(MPI_Isend(send_src_ + k * kPiece, static_cast<int>(piece_bytes(send_bytes_, k)), MPI_BYTE,
                      peer_, 0, comm_, &send_req_[k % 2]),
            "MPI_Isend", peer_);
      ++send_posted_;
    }
    int flag = 0;
    check(MPI_Test(&send_req_[send_done_ % 2], &flag, MPI_STATUS_IGNORE), "MPI_Test", peer_);
    if (!flag) return send_done_ != before ? Transfer::Moved : Transfer::Idle;
    ++send_done_;
  }
  return Transfer::Done;
}

void MpiPeer::start_recv(void* dst, size_t bytes, Combine c) {
  recv_dst_ = static_cast<char*>(dst);
  recv_bytes_ = bytes;
  recv_posted_ = recv_done_ = 0;
  recv_combine_ = c;
}

void MpiPeer::post_recv(size_t k) {
  char* into = recv_combine_ == Combine::Copy ? recv_dst_ + k * kPiece : staging_[k % 2].data();
  check(MPI_Irecv(into, static_cast<int>(piece_bytes(recv_bytes_, k)), MPI_BYTE, peer_, 0, comm_,
                  &recv_req_[k % 2]),
        "MPI_Irecv", peer_);
}

Transfer MpiPeer::progress_recv() {
  const size_t total = pieces(recv_bytes_);
  const size_t before = recv_done_;
  while (recv_done_ < total) {
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      while (recv_posted_ < total && recv_posted_ < recv_done_ + 2) post_recv(recv_posted_++);
      int flag = 0;
      check(MPI_Test(&recv_req_[recv_done_ % 2], &flag, MPI_STATUS_IGNORE), "MPI_Test", peer_);
      if (!flag) return recv_done_ != before ? Transfer::Moved : Transfer::Idle;
    }
    const size_t k = recv_done_;
    if (recv_combine_ != Combine::Copy)
      combine_bytes(recv_dst_ + k * kPiece, staging_[k % 2].data(), piece_bytes(recv_bytes_, k),
                    recv_combine_);
    ++recv_done_;
  }
  return Transfer::Done;
}

}  // namespace dpt::comm
