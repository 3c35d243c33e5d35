// The distributed engine of backend "mp" on GPUs: NVIDIA's cuSOLVERMp over an NCCL
// communicator of jaxmg's own, one process per GPU, every process calling the library on its
// own local array (SPMD), the twin of scalapack.h's engine: the same operands, the same 2D
// block-cyclic local arrays, the same results.
//
// CI checks its declarations against NVIDIA's headers and libraries (nox -s cuda_abi) and
// runs it under mpiexec against an emulator of the CUDA runtime, NCCL and cuSOLVERMp built on
// ScaLAPACK (tests/native/fake_cuda). What has run on GPU hardware: docs/gpu.md.
//
// What differs from the CPU engine:
//  - Order: no agreement is needed. XLA runs a GPU program's custom calls in program order on
//    the device's stream, and every process runs the same program, so every process enters
//    the library's collectives in the same order.
//  - Communicator: process 0 makes an NCCL unique id (NcclUniqueId), the processes share it
//    before the call (jaxmg_cuda.mp_gpu), and the call brings it as an attribute; the first
//    call with an id builds the communicator (ncclCommInitRank, rank = grid position), later
//    calls reuse it, one per id for the life of the process. NCCL's waits have no deadline of
//    jaxmg's: a process that never arrives leaves the others in NCCL, as with XLA's own
//    collectives; the job's launcher ends them.
//  - `blocks` (a block of P(r, c) relayed by p?gemr2d) has no cuSOLVERMp counterpart: callers
//    relayout in JAX first. potri has no cuSOLVERMp routine: the inverse is the solve with the
//    identity (Potrs with N right-hand sides, one more local array while it runs).
//  - cuSOLVERMp's pivots are int64 on the device; jaxmg's operand stays ScaLAPACK's int32
//    (converted on the host: a process's pivots are its local rows plus a tile).
#ifndef JAXMG_CUSOLVERMP_H_
#define JAXMG_CUSOLVERMP_H_

#include <cstdint>
#include <string>
#include <vector>

#include <xla/ffi/api/ffi.h>

#include "base/operands.h"
#include "engines/cuda_internal.h"
#include "engines/mp.h"

namespace jaxmg {

// One process's part of a call on its GPU `ordinal`, on XLA's `stream`. The operands and their
// layouts are RunOnScalapack's (scalapack.h), in device memory. `nccl_id` is the unique id of
// the communicator over the grid's processes: its 128 bytes as 16 int64.
ffi::Error RunOnCusolverMp(const Operands& operands, const MpGrid& grid,
                           ffi::Span<const int64_t> nccl_id, cudaStream_t stream, int32_t ordinal,
                           ScratchFn scratch);

// The rectangular routines (mp.h, RectOperands): kQr by Geqrf then Orgqr, kGels by Gels (M >=
// N, one right-hand side per call); `a` is this process's local array in `tile`-square tiles
// (cusolvermp_rect.cc). kGesvd is refused: cusolverMpGesvd came in 0.9.0 and is not bound.
// With `blocks`, kQr's Q and R come back as A goes in (CusolverMpResultDims).
ffi::Error RunRectOnCusolverMp(const RectOperands& operands, ffi::Span<const int64_t> nccl_id,
                               cudaStream_t stream, int32_t ordinal, ScratchFn scratch);

// The shape an `r x c` result of kQr comes back in: whole, row-major [r, c]; or, with
// `operands.blocks` where the grid divides it (r by its rows, c by its columns), this process's
// local array of the result in `tile`-square tiles, transposed: [Lc, Lr], each the block's
// extent rounded up to whole tiles (jaxmg_layout.BlockCyclic2D.padded_local_shape), zeros past
// the process's own rows and columns, which JAX's inverse relayout takes back to its blocks.
std::vector<int64_t> CusolverMpResultDims(const RectOperands& operands, int64_t r, int64_t c);

// The version cusolverMpGetVersion gave (0.9.1 is 901) once a call has made this process's
// handle, else 0.
int CusolverMpVersion();

// Whether the loaded cuSOLVERMp has cusolverMpGesvd (0.9.0 on); false with `error` when the
// libraries cannot be loaded.
bool CusolverMpHasGesvd(std::string* error);

// ncclGetUniqueId's 128 bytes in `id`; false with `error` when NCCL cannot be loaded.
bool NcclUniqueId(std::string* id, std::string* error);

}  // namespace jaxmg

#endif  // JAXMG_CUSOLVERMP_H_
