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

// The checks both engines make of one process's operands before any collective: "" when they
// fit the grid, else what is wrong. `position` is the value of the position operand (device
// memory on GPUs, read by the caller); `dtype` gets A's type.
std::string CheckMpOperands(const Operands& operands, const MpGrid& grid, int64_t position,
                            Dtype* dtype);

}  // namespace jaxmg

#endif  // JAXMG_MP_H_
