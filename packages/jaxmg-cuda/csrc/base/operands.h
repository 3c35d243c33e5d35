// One participant's operands, as its FFI handler received them (ffi/handlers.cc): what the
// meeting (meeting/protocol.h) and backend "mp"'s engines (engines/scalapack.h,
// engines/cusolvermp.h) start from.
#ifndef JAXMG_OPERANDS_H_
#define JAXMG_OPERANDS_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include <xla/ffi/api/ffi.h>

#include "base/common.h"
#include "base/routines.h"

namespace jaxmg {

// One participant's operands, as its handler received them.
struct Operands {
  const Routine* routine = nullptr;
  const char* target = "";
  const ffi::AnyBuffer* a = nullptr;  // [L, N] local tiles
  void* a_out = nullptr;              // result aliasing a: factor / inverse / eigenvectors
  const ffi::AnyBuffer* b = nullptr;  // rhs: [nrhs, N]
  void* x_out = nullptr;              // rhs: result aliasing b
  ffi::AnyBuffer::Dimensions x_dims;  // rhs
  int32_t* ipiv = nullptr;            // pivots: int32 [L], the result (kOut) or operand (kIn)
  size_t ipiv_count = 0;
  char trans = 'N';                   // attr trans (getrs): 'N', 'T' or 'C'
  void* w_out = nullptr;              // syevd: [N] real
  ffi::DataType w_type = ffi::DataType::INVALID;
  ffi::AnyBuffer::Dimensions w_dims;
  const int32_t* position = nullptr;  // int32 scalar, lax.axis_index (device memory on GPU)
  size_t position_count = 0;
  int32_t* status_out = nullptr;      // int32 [1]
  size_t status_count = 0;
  int64_t tile = 0;                   // attr T_A
  ffi::Span<const int64_t> device_ids;  // attr device_ids (mesh order; its length = ndev)
  int64_t call_id = 0;                // attr call_id
  // Which HLO instruction of call `call_id` this is (ffi/instance.h), the same on every
  // participant of one instruction.
  int64_t instance = 0;
  // XLA's RunId of this execution (ffi::RunId), the same for every device of one execution:
  // with it a meeting is exactly one call of one execution (meeting/rendezvous.h). Absent when the
  // handler does not bind it; the meeting is then identified by the key alone.
  std::optional<int64_t> run_id;
  bool vectors = true;                // attr vectors (syevd)
  // Multi-process mode (one device per process, one host): `job` is the token the processes
  // agreed on (0: every participant is in this process) and `pids` the process of each mesh
  // position. See meeting/crossprocess.h.
  int64_t job = 0;                    // attr job
  ffi::Span<const int64_t> pids;      // attr pids
  // In-place relayout (jaxmg_layout.in_place_moves): flattened (round, source, destination,
  // width) column-range moves over positions `d * L + j` (local column j of mesh position d)
  // and `(ndev + d) * L + j` (column j of position d's staging buffer, at the start of its
  // workspace). Empty: `a` is already in the block-cyclic layout. The leader runs `to_cyclic`
  // before the library and `from_cyclic` after it, on the result potri and syevd (vectors)
  // return (potrs leaves its factor cyclic), a round at a time: the moves of one round touch
  // disjoint ranges and may run at once.
  ffi::Span<const int64_t> to_cyclic;    // attr to_cyclic
  ffi::Span<const int64_t> from_cyclic;  // attr from_cyclic
};

// What every target has: the matrix, the position, the status and the attributes. The
// operands of each routine are assembled in ffi/handlers.cc.
inline Operands CommonOperands(Op op, ffi::AnyBuffer& a, void* a_out,
                               ffi::Buffer<ffi::S32>& position,
                               ffi::Result<ffi::Buffer<ffi::S32>>& status, int64_t tile,
                               ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Operands o;
  o.routine = &RoutineOf(op);
  o.target = o.routine->target.c_str();
  o.a = &a;
  o.a_out = a_out;
  o.position = position.typed_data();
  o.position_count = position.element_count();
  o.status_out = status->typed_data();
  o.status_count = status->element_count();
  o.tile = tile;
  o.device_ids = device_ids;
  o.call_id = call_id;
  return o;
}

}  // namespace jaxmg

#endif  // JAXMG_OPERANDS_H_
