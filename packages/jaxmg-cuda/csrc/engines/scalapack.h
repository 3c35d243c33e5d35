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

// Backend "mp"'s rectangular routines on CPUs (mp.h, RectOperands): `a` is this process's
// block of JAX's block sharding, which the engine redistributes with p?gemr2d into its tiles;
// kGesvd, kQr and kGels. status: ScaLAPACK's info, or for gels LAPACK's ?gels's (k > 0: the
// k-th diagonal entry of the triangular factor is exactly zero, which p?gels itself does not
// report).
ffi::Error RunRectOnScalapack(const RectOperands& operands);

// "" when the ScaLAPACK and BLACS symbols are loaded in this process, else what is missing.
std::string ScalapackMissing();

// How many times a call of this process stepped back for a smaller one (scalapack_engine.h; tests).
int64_t ScalapackStepBacks();

}  // namespace jaxmg

#endif  // JAXMG_SCALAPACK_H_
