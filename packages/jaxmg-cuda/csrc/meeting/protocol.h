// One participant of one call, for every target and platform (see base/backend.h, rendezvous.h):
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
#include "base/operands.h"
#include "base/routines.h"
#include "meeting/rendezvous.h"

namespace jaxmg {

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

}  // namespace jaxmg

#endif  // JAXMG_PROTOCOL_H_
