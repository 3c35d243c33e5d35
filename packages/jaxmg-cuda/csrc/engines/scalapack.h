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

// One process's part of a call. The operands are those of the routine's cuSolverMg target
// (routines.cc) with these layouts:
//   a     [C, LLD] row-major: the column-major local array of the 2D block-cyclic layout,
//         leading dimension LLD >= the local row count, C >= the local column count
//         (processes pass equal shapes: the largest, padded); with `blocks`, exactly
//         [N/cols, N/rows]: the block, whatever the tile;
//   b / x [nrhs, N], the same on every process (x comes back on every process);
//   ipiv  int32 [>= local rows + tile]: ScaLAPACK's distributed pivots (getrf, getrs);
//   w     [N] real (syevd), on every process.
ffi::Error RunOnScalapack(const Operands& operands, const MpGrid& grid);

// The checks both engines (this one and cusolvermp.h's) make of one process's operands before
// any collective: "" when they fit the grid, else what is wrong. `position` is the value of
// the position operand (device memory on GPUs, read by the caller); `dtype` gets A's type.
std::string CheckMpOperands(const Operands& operands, const MpGrid& grid, int64_t position,
                            Dtype* dtype);

// "" when the ScaLAPACK and BLACS symbols are loaded in this process, else what is missing.
std::string ScalapackMissing();

// How many times a call of this process stepped back for a smaller one (scalapack.cc; tests).
int64_t ScalapackStepBacks();

}  // namespace jaxmg

#endif  // JAXMG_SCALAPACK_H_
