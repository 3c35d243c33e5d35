// What backend "mp"'s GPU engine shares between its square routines (cusolvermp.cc) and its
// rectangular ones (cusolvermp_rect.cc): the loaded libraries (cuSOLVERMp 0.8.0 to 0.9.1 and
// NCCL), the process's communicators, handle and grids, and the error macros of their calls
// (cusolvermp_engine.cc). Internal to the engine's files: namespace jaxmg::cusolvermp.
#ifndef JAXMG_CUSOLVERMP_ENGINE_H_
#define JAXMG_CUSOLVERMP_ENGINE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/common.h"
#include "engines/cuda_internal.h"
#include "vendor/cusolvermp_api.h"
#include "vendor/loader.h"

namespace jaxmg::cusolvermp {

struct Libraries {
  const Api* rt = nullptr;  // the CUDA runtime (vendor/cuda_api.h's loader)
  cuda::MpApi mp;           // the GESVD members null where the library lacks them
  bool gesvd = false;       // whether it has all of JAXMG_CUSOLVERMP_GESVD_FUNCTIONS
};

// The libraries, loaded once per process (nullptr with `error` when they cannot be: which
// library, which symbol, which versions would work).
const Libraries* Load(std::string* error);

// "0.9.1" for cuSOLVERMp's 901.
std::string VersionName(int version);

// Held for a whole call: the process's state below is shared by every call, and one GPU per
// process brings its calls one at a time anyway.
std::mutex& StateMutex();

// The communicator, handle and grid of one call. The first call with an NCCL id builds the
// communicator over the grid's rows * cols ranks (rank = flat grid position); the handle is
// this GPU's (one per GPU, as the library allows), set to `stream`; the grid (row-major: rank
// r * cols + c at (r, c), jaxmg's flat position) one per communicator and shape. All are kept
// for the life of the process. With StateMutex() held.
struct Connection {
  cuda::ncclComm_t comm = nullptr;
  cuda::cusolverMpHandle_t handle = nullptr;
  cuda::cusolverMpGrid_t grid = nullptr;
};
Outcome Connect(const Libraries* libs, const std::string& nccl_id, int64_t rows, int64_t cols,
                int32_t position, int32_t ordinal, cudaStream_t stream, Connection* out);

// One call's memory beyond its operands, all from XLA's scratch allocator (freed when the
// handler returns): buffers, the library's info, and the device and host workspaces of the
// library call about to run (the largest device workspace asked for so far is reused).
class CallMemory {
 public:
  CallMemory(const Api* rt, cudaStream_t stream, int32_t ordinal, ScratchFn scratch)
      : rt_(rt), stream_(stream), ordinal_(ordinal), scratch_(std::move(scratch)) {}

  Outcome Allocate(size_t bytes, void** out);
  // The library's info (device memory), allocated on first use and set to 0 each time it is
  // handed out: cuSOLVERMp writes it only where a routine fails (docs/gpu.md), so a call that
  // succeeds leaves what was there.
  Outcome Info(int** out);
  // The info the last library call wrote, on the host (synchronises the stream).
  Outcome ReadInfo(int* info);
  // The workspaces `size(&device_bytes, &host_bytes)` asks for (a library's _bufferSize).
  template <typename SizeFn>
  Outcome Workspaces(SizeFn size) {
    size_t device_bytes = 0, host_bytes = 0;
    if (Outcome r = size(&device_bytes, &host_bytes); !r.ok) return r;
    if (device_bytes > device_bytes_ || device_ == nullptr) {
      if (Outcome r = Allocate(device_bytes, &device_); !r.ok) return r;
      device_bytes_ = device_bytes;
    }
    host_.assign(std::max<size_t>(host_bytes, 1), 0);
    return {};
  }
  void* device() const { return device_; }
  size_t device_bytes() const { return device_bytes_; }
  void* host() { return host_.data(); }
  size_t host_bytes() const { return host_.size(); }

 private:
  const Api* rt_;
  cudaStream_t stream_;
  int32_t ordinal_;
  ScratchFn scratch_;
  int* info_ = nullptr;
  void* device_ = nullptr;
  size_t device_bytes_ = 0;
  std::vector<char> host_;
};

// The start of a call: the libraries, and the communicator's id from the handler's `nccl_id`
// attribute (its 128 bytes as 16 int64).
Outcome Begin(ffi::Span<const int64_t> nccl_id, const Libraries** libs, std::string* id);

// The end of a call that returned LAPACK's `info` (the same on every process): an illegal
// argument (info < 0) is an error; info > 0 fills `outputs` (pointer, bytes) with NaN; the
// status (info) goes to `status_out`.
Outcome Finish(const Libraries* libs, int info,
               const std::vector<std::pair<void*, size_t>>& outputs, int32_t* status_out,
               cudaStream_t stream);

// What the loaded library's cusolverMpGetVersion said (0 until the first handle exists).
int LoadedVersion();

// The flat grid position, an int32 scalar on the device.
Outcome ReadPosition(const Api* rt, const int32_t* position, size_t count, cudaStream_t stream,
                     int32_t* out);

// `bytes` of `dtype` elements summed over the communicator, in place (complex values as pairs
// of reals).
Outcome SumOverGrid(const Libraries* libs, void* data, size_t bytes, Dtype dtype,
                    cuda::ncclComm_t comm, cudaStream_t stream);

}  // namespace jaxmg::cusolvermp

// Every cuSOLVERMp and NCCL call goes through these (cuda_internal.h's JAXMG_VENDOR for the
// runtime): a failure returns an Outcome naming the call and the library's message.
#define JAXMG_CUSOLVERMP(libs, expr)                                                        \
  do {                                                                                      \
    const int jaxmg_status_ = (libs)->mp.expr;                                              \
    if (jaxmg_status_ != 0) {                                                               \
      std::ostringstream jaxmg_m_;                                                          \
      jaxmg_m_ << __FILE__ << ":" << __LINE__ << ": " << #expr                              \
               << " failed: " << CusolverStatusName(jaxmg_status_) << " (" << jaxmg_status_ \
               << ")";                                                                      \
      return Outcome::Fail(jaxmg_m_.str());                                                 \
    }                                                                                       \
  } while (0)
#define JAXMG_NCCL(libs, expr)                                                        \
  do {                                                                                \
    const int jaxmg_status_ = (libs)->mp.expr;                                        \
    if (jaxmg_status_ != cuda::ncclSuccess) {                                         \
      std::ostringstream jaxmg_m_;                                                    \
      jaxmg_m_ << __FILE__ << ":" << __LINE__ << ": " << #expr                        \
               << " failed: " << (libs)->mp.ncclGetErrorString(jaxmg_status_) << " (" \
               << jaxmg_status_ << ")";                                               \
      return Outcome::Fail(jaxmg_m_.str());                                           \
    }                                                                                 \
  } while (0)

#endif  // JAXMG_CUSOLVERMP_ENGINE_H_
