// Backend "mp": what its two engines share, ScaLAPACK over MPI on CPUs (scalapack.h) and
// cuSOLVERMp over NCCL on GPUs (cusolvermp.h): the process grid of a call and the checks of one
// process's operands.
#ifndef JAXMG_MP_H_
#define JAXMG_MP_H_

#include <cstdint>
#include <string>

#include "base/common.h"
#include "base/operands.h"

namespace jaxmg {

// The process grid of one call: `rows x cols` processes, each at the grid position its
// `position` operand names (row-major: r * cols + c; lax.axis_index of the mesh), which the
// processes tell each other at the call: no process needs to know the others' MPI ranks. The
// matrix is N x N in square tiles of `tile` (2D block-cyclic from grid position (0, 0),
// ScaLAPACK's descriptor with RSRC = CSRC = 0).
struct MpGrid {
  int64_t n = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  // `a` holds this process's block of JAX's block sharding P(r, c) (N/rows x N/cols, a 2D
  // block-cyclic layout whose tiles are the blocks) instead of its local array in `tile`-square
  // tiles: the engine redistributes it with p?gemr2d into a local array of its own before the
  // routine, and its result back into `a` after it.
  bool blocks = false;
  // With `blocks`: whether the routine's result (the factor, inverse or eigenvectors that
  // replace `a`) goes back into `a`. A caller that discards it (potrs without its factor)
  // saves a redistribution; `a` then keeps its input.
  bool result_back = true;
};

// Backend "mp"'s rectangular routines (no routine-table row: neither cuSolverMg nor its twin has
// them). A is M x N, any M and N, on a `rows x cols` grid; every result comes back whole on
// every process, row-major (K = min(M, N)), except with `blocks` (below):
//   kGesvd  JOBU = JOBVT = 'V': out0 U [M, K], out1 s [K] real, out2 VT [K, N] (CPUs only);
//   kQr     geqrf then orgqr / ungqr: out0 Q [M, K], out1 R [K, N] (upper trapezoidal);
//   kGels   'N': b [M, nrhs] in, out0 x [N, nrhs] (the least-squares solution for M >= N, the
//           minimum-norm one for M < N on CPUs; A of full rank).
// What `a` holds differs by engine: on CPUs this process's block of JAX's block sharding,
// [N/cols, M/rows] row-major (the column-major M/rows x N/cols block), redistributed by the
// engine (scalapack.h); on GPUs its local array in `tile`-square tiles, [local columns, LLD]
// (cusolvermp.h). With `blocks` (CPUs only), each of U, VT, Q and R whose R_ x C_ the grid
// divides (R_ by its rows, C_ by its columns) comes back as A goes in: this process's block of
// JAX's block sharding, [C_/cols, R_/rows] row-major (column-major R_/rows x C_/cols),
// redistributed from the routine's tiles by p?gemr2d; s and x stay whole. The outputs are NaN
// when status (the library's info) is not 0.
enum class RectOp { kGesvd, kQr, kGels };
struct RectOperands {
  RectOp op = RectOp::kGesvd;
  const char* target = "";
  const ffi::AnyBuffer* a = nullptr;
  const ffi::AnyBuffer* b = nullptr;  // kGels
  const int32_t* position = nullptr;
  size_t position_count = 0;
  int64_t m = 0, n = 0, rows = 0, cols = 0, tile = 0;
  int64_t call_id = 0, instance = 0;
  void* out0 = nullptr;
  void* out1 = nullptr;
  void* out2 = nullptr;
  ffi::AnyBuffer::Dimensions out0_dims;  // checked against M, N, K, nrhs
  ffi::AnyBuffer::Dimensions out2_dims;  // kGesvd's VT, checked on CPUs
  ffi::AnyBuffer::Dimensions out1_dims;  // kQr's R, checked on CPUs
  bool blocks = false;
  int32_t* status = nullptr;

  // Whether an r x c result comes back as this process's part (`blocks` and the grid divides
  // it: r by its rows, c by its columns), the one rule of both engines and of JAX's side.
  bool InBlocks(int64_t r, int64_t c) const {
    return blocks && rows > 0 && cols > 0 && r % rows == 0 && c % cols == 0;
  }
};

// The checks both engines make of one process's operands before any collective: "" when they
// fit the grid, else what is wrong. `position` is the value of the position operand (device
// memory on GPUs, read by the caller); `dtype` gets A's type.
std::string CheckMpOperands(const Operands& operands, const MpGrid& grid, int64_t position,
                            Dtype* dtype);

}  // namespace jaxmg

#endif  // JAXMG_MP_H_
