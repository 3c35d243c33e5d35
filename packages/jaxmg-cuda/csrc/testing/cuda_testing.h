// Test and diagnostic entry points of the CUDA path (cuda_testing.cc).
#ifndef JAXMG_CUDA_TESTING_H_
#define JAXMG_CUDA_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace jaxmg {

// One call of the CUDA path outside XLA, on host arrays, for tests. Every buffer is copied to
// its GPU (inside a larger cudaMalloc, at an offset, as XLA's allocator sub-allocates), one
// thread per mesh position of this process runs exactly what the FFI handler runs (check,
// rendezvous or cross-process protocol, cuSolverMg by the leader, outputs) on a stream of its
// own, and the results come back to the host. Only XLA's binding of the handler is left out.
// CI runs it against an emulated CUDA runtime and cuSolverMg (tests/native/fake_cuda); on a GPU
// machine the same test runs it on the real libraries.
struct HostCall {
  std::string op;                   // a target without "jaxmg_": "potrs", "getrs", ...
  std::string dtype;                // "float32", "float64", "complex64" or "complex128"
  int64_t n = 0;                    // N
  int64_t local = 0;                // L: local columns of every position
  int64_t nrhs = 0;                 // routines with a right-hand side
  int64_t tile = 0;                 // T_A
  bool vectors = true;              // syevd
  char trans = 'N';                 // getrs
  bool aliased = true;              // results alias the inputs (as XLA arranges)
  std::vector<int64_t> device_ids;  // the whole mesh axis, in mesh order
  std::vector<int> positions;       // the positions this process runs
  std::vector<std::string> a;       // per position run: [L, N] bytes
  std::vector<std::string> b;       // per position run: [nrhs, N] bytes
  std::vector<std::string> ipiv;    // getrs, per position run: [L] int32 bytes
  int64_t call_id = 0;
  int64_t job = 0;  // != 0: the multi-process protocol (with pids)
  std::vector<int64_t> pids;
  std::vector<int64_t> to_cyclic, from_cyclic;  // in-place relayout moves (base/operands.h)
  // Backend "mp" on GPUs (engines/cusolvermp.h) when `grid` is (rows, cols): one position per
  // process (positions = {this process's}, device_ids = {its GPU}), `a` [local, lld] (the
  // column-major local array of the 2D block-cyclic layout), pivots [ipiv_len], and the
  // communicator's NCCL unique id as 16 int64.
  std::vector<int64_t> grid;
  int64_t lld = 0;       // 0: N
  int64_t ipiv_len = 0;  // 0: L
  std::vector<int64_t> nccl_id;
};
struct HostResult {
  std::vector<std::string> a, x, w, ipiv;  // per position run
  std::vector<int32_t> status;
  std::vector<std::string> errors;  // "" where the handler succeeded
};
// Fails (returns false, `error` set) only when the call cannot be staged at all.
bool RunCudaOnHost(const HostCall& call, HostResult* result, std::string* error);

// One call of backend "mp"'s rectangular routines on GPUs (engines/cusolvermp.h,
// RunRectOnCusolverMp) outside XLA, on host arrays, for this process's one grid position: `a`
// its local array [local_cols, lld] in tile-square tiles (column-major storage), `b` (gels)
// [M, nrhs] row-major; out0 (Q [M, K] or x [N, nrhs]) and out1 (R [K, N]) come back row-major,
// whole, or qr's with `blocks` in the shapes of CusolverMpResultDims.
struct HostRectCall {
  std::string op;     // "qr" or "gels"
  std::string dtype;  // "float32", "float64", "complex64" or "complex128"
  int64_t m = 0, n = 0, tile = 0, nrhs = 0;
  std::vector<int64_t> grid;  // (rows, cols)
  int position = 0;
  int64_t device_id = 0;
  int64_t local_cols = 0, lld = 0;  // a's shape
  bool blocks = false;
  std::string a, b;
  std::vector<int64_t> nccl_id;
};
struct HostRectResult {
  std::string out0, out1;
  int32_t status = -1;
  std::string error;  // "" where the handler succeeded
};
bool RunRectCudaOnHost(const HostRectCall& call, HostRectResult* result, std::string* error);

}  // namespace jaxmg

#endif  // JAXMG_CUDA_TESTING_H_
