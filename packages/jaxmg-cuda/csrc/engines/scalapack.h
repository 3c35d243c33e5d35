// The distributed engine of backend "mp" on CPUs: ScaLAPACK over MPI, one process per mesh
// position, every process calling the library on its own local array (SPMD), unlike the
// leader of cuSolverMg's protocol. The library is MKL's (pip `mkl`, with BLACS over MPICH's
// `libmpi`), opened by Python with RTLD_GLOBAL before the first call (jaxmg_cuda.mp) and found
// here with dlsym.
#ifndef JAXMG_SCALAPACK_H_
#define JAXMG_SCALAPACK_H_

#include <cstdint>
#include <string>

#include <xla/ffi/api/ffi.h>

#include "base/operands.h"
#include "engines/mp.h"

namespace jaxmg {

// One process's part of a call. The operands are those of the routine's cuSolverMg target
// (ffi/handlers.cc) with these layouts:
//   a     [C, LLD] row-major: the column-major local array of the 2D block-cyclic layout,
//         leading dimension LLD >= the local row count, C >= the local column count
//         (processes pass equal shapes: the largest, padded); with `blocks`, exactly
//         [N/cols, N/rows]: the block, whatever the tile;
//   b / x [nrhs, N], the same on every process (x comes back on every process);
//   ipiv  int32 [>= local rows + tile]: ScaLAPACK's distributed pivots (getrf, getrs);
//   w     [N] real (syevd), on every process.
ffi::Error RunOnScalapack(const Operands& operands, const MpGrid& grid);

// Backend "mp"'s rectangular routines on CPUs, which only ScaLAPACK runs (no routine-table
// row: neither cuSolverMg nor its twin has them; cuSOLVERMp's are not built). A is M x N, any
// M and N, and `a` is this process's block of JAX's block sharding over the `rows x cols`
// grid, [N/cols, M/rows] row-major (the column-major M/rows x N/cols block); the engine
// redistributes it with p?gemr2d into `tile`-square tiles of its own. Every result comes back
// whole on every process, row-major (K = min(M, N)):
//   kGesvd  p?gesvd, JOBU = JOBVT = 'V': out0 U [M, K], out1 s [K] real, out2 VT [K, N];
//   kQr     p?geqrf then p?orgqr / p?ungqr: out0 Q [M, K], out1 R [K, N] (upper trapezoidal);
//   kGels   p?gels 'N': b [M, nrhs] in, out0 x [N, nrhs] (the least-squares solution for
//           M >= N, the minimum-norm one for M < N; A of full rank).
// status: ScaLAPACK's info (> 0: gesvd did not converge), or for gels LAPACK's ?gels's (k > 0:
// the k-th diagonal entry of the triangular factor is exactly zero, which p?gels itself does
// not report), the outputs NaN then.
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
  int32_t* status = nullptr;
};
ffi::Error RunRectOnScalapack(const RectOperands& operands);

// "" when the ScaLAPACK and BLACS symbols are loaded in this process, else what is missing.
std::string ScalapackMissing();

// How many times a call of this process stepped back for a smaller one (scalapack_engine.h; tests).
int64_t ScalapackStepBacks();

}  // namespace jaxmg

#endif  // JAXMG_SCALAPACK_H_
