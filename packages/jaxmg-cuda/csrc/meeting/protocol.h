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
#include <string>
#include <vector>

#include "base/backend.h"
#include "base/common.h"
#include "base/routines.h"
#include "meeting/rendezvous.h"

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
  // Which HLO instruction of call `call_id` this is (instance.h), the same on every
  // participant of one instruction.
  int64_t instance = 0;
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

// Runs the protocol; returns the same error on every participant when anything fails.
// `max_participants`: the backend's limit (cuSolverMg: 16). With `operands.job != 0` the
// participants are processes (crossprocess.h) instead of threads of this process.
ffi::Error Participate(const Operands& operands, Device& device, Backend& backend,
                       int max_participants);

// The same, for participants that all share this process's memory (the CPU twin, `job` 0),
// without waiting for the others (rendezvous.h, Meeting::Arrive): returns once this
// participant has arrived; `done` gets its outcome, the same on every participant. The last
// to arrive leads and does for everybody what each does on its own device in Participate:
// allocate the workspaces, run the library, write every participant's outputs.
void ParticipateWithoutWaiting(const Operands& operands, Device& device, Backend& backend,
                               Completion done);

// --- the steps both protocols share: the meetings of one process (protocol.cc) and the
// segments of several (crossprocess.cc) ---------------------------------------------------

// What every participant of one call must agree on.
std::string Signature(const Problem& p);
// The checks of step 1 and the copy of the inputs into the (normally aliased) results.
// Returns "" when this participant is ready to publish, else what is wrong.
std::string Prepare(const Operands& o, Device& dev, int max_participants, Problem* p,
                    int32_t* position);
// Bytes of workspace to allocate at `position`: the library's, and at least the relayout's
// staging buffer.
int64_t AllocationBytes(const Problem& p, size_t position, const std::vector<int64_t>& library);
size_t RhsBytes(const Operands& o, const Problem& p);    // b / x; 0 without
size_t PivotBytes(const Operands& o, const Problem& p);  // the pivots; 0 without
// The library call as the leader sees it, from the published slots.
MgCall MakeCall(const Operands& o, const Problem& p, const std::vector<Slot>& slots);
Outcome SameSignatures(const char* target, const std::vector<Slot>& slots);
// The leader's part: the relayout, the library for everybody, x to every position.
Outcome RunLibrary(const Operands& o, const Problem& p, Backend& backend, MgCall& call,
                   std::vector<unsigned char>* w_host, int32_t* info_out);
// This participant's own outputs, once the leader is done: status, eigenvalues, NaN.
Outcome WriteOutputs(const Operands& o, const Problem& p, Device& dev, int32_t info,
                     const std::vector<unsigned char>& w_host);

// What every target has: the matrix, the position, the status and the attributes. The
// operands of each routine are assembled in routines.cc.
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

#endif  // JAXMG_PROTOCOL_H_
