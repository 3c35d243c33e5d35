// The library line. Everything above it -- validation, the rendezvous, pointer tables,
// workspace bookkeeping, status, NaN fill, broadcasting x -- is one code path (meeting/protocol.cc,
// meeting/crossprocess.cc) that the CPU twin runs in CI on 1..8 simulated devices. Below it are two
// implementations of each library step (routines.h): LAPACK (engines/lapack_twin.cc, run by
// platforms/cpu_twin.cc) and cuSolverMg (engines/cusolvermg.cc, run by platforms/cuda_targets.cc).
//
//   Device   what one participant does to its *own* device, on its own thread.
//   Backend  what the leader does for *all* devices: the shape of one cusolverMg call
//            (per-device tile pointer arrays in mesh order, N, T_A, leading dimension, dtype,
//            per-device workspace, status out).
#ifndef JAXMG_BACKEND_H_
#define JAXMG_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/common.h"
#include "base/outcome.h"
#include "base/routines.h"

namespace jaxmg {

// One library call over all participants, in mesh order.
struct MgCall {
  const Routine* routine = nullptr;
  Dtype dtype = Dtype::kF64;
  int n = 0;        // global order N
  int tile = 0;     // T_A, the column tile width
  int lda = 0;      // leading dimension of every local tile array (== N)
  int nrhs = 0;     // potrs: right-hand sides
  bool vectors = true;           // syevd: eigenvectors too
  std::vector<int> devices;      // device ordinals (-1 on CPU)
  std::vector<void*> a;          // each position's local tile array (tile m = global tile
                                 // position + m * ndev)
  std::vector<void*> b;          // rhs: each position's copy of B (N x nrhs, ld N); the
                                 // library solves into b[0]
  std::vector<int32_t*> ipiv;    // pivots: each position's [L] (routines.h, Pivots)
  std::vector<void*> work;       // each position's workspace (phase 1 only)
  std::vector<int64_t> work_bytes;  // and its size in bytes
  void* w = nullptr;             // syevd: N real eigenvalues, on the host
};

// Multi-process mode on GPUs: one participant's buffer as another process can map it (CUDA
// IPC of the allocation that holds it, and the buffer's offset in that allocation). Plain
// bytes: it travels in a shared-memory segment header (meeting/crossprocess.h).
struct SharedMemory {
  unsigned char handle[64];  // cudaIpcMemHandle_t of the allocation's base
  uint64_t offset;           // of the buffer from that base
  uint64_t bytes;            // of the buffer
  char bus_id[32];           // PCI bus id of the GPU that holds it
};

// One copy of `bytes` from `src` on `src_device` to `dst` on `dst_device` (-1 on CPU).
struct Copy {
  int dst_device;
  void* dst;
  int src_device;
  const void* src;
  size_t bytes;
};

// Keeps something (a mapping, an allocation) alive; releasing it undoes it.
using Keep = std::shared_ptr<void>;

class Backend {
 public:
  virtual ~Backend() = default;
  // Bytes of workspace each mesh position must provide (positions may differ: the CPU twin
  // needs it only where it runs). Called by the leader of phase 0.
  virtual Outcome WorkspaceBytes(const MgCall& call, std::vector<int64_t>* bytes) = 0;
  // The factorisation/solve/eigensolve for all devices; `info` is LAPACK-style. Called by the
  // leader of phase 1, while every participant waits with its buffers published.
  virtual Outcome Run(const MgCall& call, int* info) = 0;
  // Copies between participants' buffers (potrs: x from position 0 to the others; the
  // in-place relayout's moves, one round at a time). No copy of one batch touches what another
  // writes, so they may run at once; all have landed when this returns.
  virtual Outcome CopyAll(const std::vector<Copy>& copies) = 0;

  // --- the leader of a multi-process call (meeting/crossprocess.h) ---
  // Workspace on `device` of the call (any device, not only the leader's own).
  virtual Outcome AllocateOn(int device, size_t bytes, void** out, Keep* keep) = 0;
  // GPU: maps memory another process shared; `device` is its GPU as this process numbers it.
  // The mapping lasts as long as `keep`.
  virtual Outcome MapShared(const SharedMemory& shared, int* device, void** out, Keep* keep) = 0;
  // Everything the library queued on these devices has finished.
  virtual Outcome SynchronizeAll(const std::vector<int>& devices) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int ordinal() const = 0;  // -1 on CPU
  virtual Outcome ReadPosition(const int32_t* src, int32_t* out) = 0;  // device -> host
  virtual Outcome Copy(void* dst, const void* src, size_t bytes) = 0;    // on this device
  virtual Outcome Upload(void* dst, const void* host, size_t bytes) = 0;  // host -> device
  virtual Outcome FillBytes(void* dst, int byte, size_t bytes) = 0;
  // Memory that stays valid until this participant returns.
  virtual Outcome Allocate(size_t bytes, void** out) = 0;
  // Everything queued so far on this device has finished.
  virtual Outcome Synchronize() = 0;
  // Multi-process mode: true when the leader maps this participant's buffers (GPU, CUDA IPC)
  // instead of reading copies of them in shared memory (CPU).
  virtual bool SharesByHandle() const = 0;
  virtual Outcome Share(void* data, size_t bytes, SharedMemory* out) = 0;
};

}  // namespace jaxmg

#endif  // JAXMG_BACKEND_H_
