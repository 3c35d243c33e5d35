// One participant of one call, for every target and platform (see backend.h, rendezvous.h):
//
//   check operands, copy inputs into the (normally aliased) results, synchronise
//   -> phase 0: publish {device, buffers}; the leader sizes every position's workspace
//   -> allocate this position's workspace on this thread; publish it
//   -> phase 1: the leader runs the library for all devices (and broadcasts x)
//   -> write this device's own outputs: status, eigenvalues, NaN on failure.
#ifndef JAXMG_PROTOCOL_H_
#define JAXMG_PROTOCOL_H_

#include <cstdint>
#include <optional>

#include "backend.h"
#include "common.h"

namespace jaxmg {

// One participant's operands, as its handler received them.
struct Operands {
  Op op = Op::kPotrs;
  const char* target = "";
  const ffi::AnyBuffer* a = nullptr;  // [L, N] local tiles
  void* a_out = nullptr;              // result aliasing a: factor / inverse / eigenvectors
  const ffi::AnyBuffer* b = nullptr;  // potrs: [nrhs, N]
  void* x_out = nullptr;              // potrs: result aliasing b
  ffi::AnyBuffer::Dimensions x_dims;  // potrs
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
  // XLA's RunId of this execution (ffi::RunId), the same for every device of one execution:
  // with it a meeting is exactly one call of one execution (rendezvous.h). Absent when the
  // handler does not bind it; the meeting is then identified by the key alone.
  std::optional<int64_t> run_id;
  bool vectors = true;                // attr vectors (syevd)
  // Multi-process mode (one device per process, one host): `job` is the token the processes
  // agreed on (0: every participant is in this process) and `pids` the process of each mesh
  // position. See crossprocess.h.
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

// The attributes every handler passes on as they are: the job's and the relayout's.
inline Operands WithAttrs(Operands o, int64_t job, ffi::Span<const int64_t> pids,
                          ffi::Span<const int64_t> to_cyclic,
                          ffi::Span<const int64_t> from_cyclic) {
  o.job = job;
  o.pids = pids;
  o.to_cyclic = to_cyclic;
  o.from_cyclic = from_cyclic;
  return o;
}

// The execution this participant belongs to (Ctx<ffi::RunId>).
inline Operands WithRun(Operands o, ffi::RunId run) {
  o.run_id = run.run_id;
  return o;
}

// Runs the protocol; returns the same error on every participant when anything fails.
// `max_participants`: the backend's limit (cuSolverMg: 16). With `operands.job != 0` the
// participants are processes (crossprocess.h) instead of threads of this process.
ffi::Error Participate(const Operands& operands, Device& device, Backend& backend,
                       int max_participants);

// The operands of each target, shared by the CPU and CUDA handlers.
// What every target has: the matrix, the position, the status and the attributes.
inline Operands CommonOperands(Op op, const char* target, ffi::AnyBuffer& a, void* a_out,
                               ffi::Buffer<ffi::S32>& position,
                               ffi::Result<ffi::Buffer<ffi::S32>>& status, int64_t tile,
                               ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Operands o;
  o.op = op;
  o.target = target;
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

inline Operands PotrsOperands(ffi::AnyBuffer& a, ffi::AnyBuffer& b,
                              ffi::Buffer<ffi::S32>& position,
                              ffi::Result<ffi::AnyBuffer>& a_out, ffi::Result<ffi::AnyBuffer>& x,
                              ffi::Result<ffi::Buffer<ffi::S32>>& status, int64_t tile,
                              ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Operands o = CommonOperands(Op::kPotrs, "jaxmg_potrs", a, a_out->untyped_data(), position,
                              status, tile, device_ids, call_id);
  o.b = &b;
  o.x_out = x->untyped_data();
  o.x_dims = x->dimensions();
  return o;
}

inline Operands PotriOperands(ffi::AnyBuffer& a, ffi::Buffer<ffi::S32>& position,
                              ffi::Result<ffi::AnyBuffer>& a_out,
                              ffi::Result<ffi::Buffer<ffi::S32>>& status, int64_t tile,
                              ffi::Span<const int64_t> device_ids, int64_t call_id) {
  return CommonOperands(Op::kPotri, "jaxmg_potri", a, a_out->untyped_data(), position, status,
                        tile, device_ids, call_id);
}

inline Operands SyevdOperands(ffi::AnyBuffer& a, ffi::Buffer<ffi::S32>& position,
                              ffi::Result<ffi::AnyBuffer>& v, ffi::Result<ffi::AnyBuffer>& w,
                              ffi::Result<ffi::Buffer<ffi::S32>>& status, int64_t tile,
                              ffi::Span<const int64_t> device_ids, int64_t call_id,
                              bool vectors) {
  Operands o = CommonOperands(Op::kSyevd, "jaxmg_syevd", a, v->untyped_data(), position, status,
                              tile, device_ids, call_id);
  o.w_out = w->untyped_data();
  o.w_type = w->element_type();
  o.w_dims = w->dimensions();
  o.vectors = vectors;
  return o;
}

}  // namespace jaxmg

#endif  // JAXMG_PROTOCOL_H_
