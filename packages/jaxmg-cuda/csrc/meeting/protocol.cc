#include "meeting/protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/test_hooks.h"
#include "meeting/crossprocess.h"
#include "meeting/relayout.h"

namespace jaxmg {
namespace {

// The "dispatch" checks: every shape and dtype, before anything is touched. Returns "" when
// the call is well formed, else a message naming the target and what would be accepted.
std::string CheckOperands(const Operands& o, int32_t position, int max_participants,
                          Problem* p) {
  std::string error = CheckMatrix(o.target, o.a->dimensions(), o.a->element_type(), o.tile,
                                  o.device_ids, position, p);
  if (!error.empty()) return error;
  const std::string err = Cat(o.target, ": ");
  if (max_participants > 0 && p->ndev > max_participants)
    return err + Cat("the call has ", p->ndev, " participants (len(device_ids)); this backend ",
                     "accepts at most ", max_participants);
  if (o.status_count != 1) return err + "status must be int32 [1]";
  const Routine& r = *o.routine;
  if (r.rhs) {
    auto b = o.b->dimensions();
    if (b.size() != 2 || b[1] != p->n || o.b->element_type() != o.a->element_type())
      return err + Cat("b must be [nrhs, N=", p->n, "] with A's dtype");
    if (std::string sizes = CheckLibrarySizes(p->n, p->local, p->tile, b[0]); !sizes.empty())
      return err + sizes;
    p->nrhs = b[0];
  }
  if (r.pivots != Pivots::kNone && static_cast<int64_t>(o.ipiv_count) != p->local)
    return err + Cat("the pivots must be int32 [L=", p->local, "], got ", o.ipiv_count,
                     " elements");
  // cuSolverMg's getrs solves with A alone: an H100 answered trans 'T' and 'C' with info -1.
  // The CPU twin refuses them alike, so that it runs what the GPU runs.
  if (r.op == Op::kGetrs && o.trans != 'N')
    return err + Cat("trans must be 'N' (as its character code), got ", int{o.trans},
                     o.trans == 'T' || o.trans == 'C' ? Cat(" ('", o.trans, "')") : "",
                     ": cuSolverMg solves only with A itself (its getrs refuses A^T and A^H), "
                     "and the CPU twin does as it does; jaxmg.lu_solve solves with A^T or A^H "
                     "(trans=1, 2) through a factor of the transpose");
  // A factor is block-cyclic already: to_cyclic moves would scramble it, and one that is only
  // read has no result to move back.
  if (r.StartsFromFactor() && o.to_cyclic.size() != 0)
    return err + "takes its factor in the block-cyclic layout: no to_cyclic moves";
  if (r.result == Result::kUnchanged && o.from_cyclic.size() != 0)
    return err + "takes its factor in the block-cyclic layout: no from_cyclic moves";
  error = CheckMoves(o.target, "to_cyclic", o.to_cyclic, p);
  if (error.empty()) error = CheckMoves(o.target, "from_cyclic", o.from_cyclic, p);
  if (!error.empty()) return error;
  if (r.eigenvalues) {
    if (o.w_dims.size() != 1 || o.w_dims[0] != p->n || o.w_type != RealTypeOf(p->dtype))
      return err + Cat("w must be [N=", p->n, "] of A's real dtype");
  }
  return "";
}

uint64_t ThreadToken() { return std::hash<std::thread::id>()(std::this_thread::get_id()); }

// The meeting of this call: its key, and the execution when the handler knows it.
std::shared_ptr<Meeting> JoinMeeting(const Operands& o, int participants) {
  return Registry::Get().Join(MeetingKey(o.target, o.device_ids, o.call_id, o.instance, o.run_id),
                              participants, o.run_id.has_value());
}

}  // namespace

// --- shared with the cross-process protocol (crossprocess.cc) ------------------------------

// What every participant of one call must agree on.
std::string Signature(const Problem& p) {
  return Cat("N=", p.n, " T_A=", p.tile, " L=", p.local, " nrhs=", p.nrhs,
             " dtype=", static_cast<int>(p.dtype), " staging=", p.staging);
}

// Bytes of workspace to allocate at `position`: the library's, and at least the relayout's
// staging buffer (used only before and after the library runs).
int64_t AllocationBytes(const Problem& p, size_t position, const std::vector<int64_t>& library) {
  const int64_t staging = p.staging * p.n * static_cast<int64_t>(ElementSize(p.dtype));
  return std::max(library[position], staging);
}

// Bytes of b / x (0 without a right-hand side) and of the pivots (0 without).
size_t RhsBytes(const Operands& o, const Problem& p) {
  return o.routine->rhs ? static_cast<size_t>(p.n * p.nrhs) * ElementSize(p.dtype) : 0;
}
size_t PivotBytes(const Operands& o, const Problem& p) {
  return o.routine->pivots != Pivots::kNone ? static_cast<size_t>(p.local) * sizeof(int32_t) : 0;
}

bool ReturnsMatrix(const Operands& o) {
  return o.routine->result == Result::kMatrix && (!o.routine->eigenvalues || o.vectors);
}

// The library call as the leader sees it, from the published slots.
MgCall MakeCall(const Operands& o, const Problem& p, const std::vector<Slot>& slots) {
  MgCall call;
  call.routine = o.routine;
  call.dtype = p.dtype;
  // CheckOperands verified that these fit an int (CheckLibrarySizes).
  call.n = static_cast<int>(p.n);
  call.tile = static_cast<int>(p.tile);
  call.lda = static_cast<int>(p.n);
  call.nrhs = static_cast<int>(p.nrhs);
  call.vectors = o.vectors;
  for (const Slot& s : slots) {
    call.devices.push_back(s.device);
    call.a.push_back(s.a);
    call.b.push_back(s.b);
    call.ipiv.push_back(static_cast<int32_t*>(s.ipiv));
    call.work.push_back(s.workspace);
  }
  return call;
}

// NaN (all bits set) over this position's real tiles of `data`; padding is left alone. After
// an in-place relayout (`whole`) the real columns are where the caller's block put them: the
// whole buffer is filled.
Outcome FillTiles(Device& dev, const Problem& p, void* data, bool whole) {
  const size_t esize = ElementSize(p.dtype);
  if (whole) return dev.FillBytes(data, 0xFF, static_cast<size_t>(p.local * p.n) * esize);
  Outcome result;
  ForEachTile(p.n, p.tile, p.ndev, p.position, [&](int64_t, int64_t local, int64_t width) {
    if (!result.ok) return;
    result = dev.FillBytes(static_cast<char*>(data) + static_cast<size_t>(local * p.n) * esize,
                           0xFF, static_cast<size_t>(width * p.n) * esize);
  });
  return result;
}

// This participant's own outputs, once the leader is done.
Outcome WriteOutputs(const Operands& o, const Problem& p, Device& dev, int32_t info,
                     const std::vector<unsigned char>& w_host) {
  if (o.routine->eigenvalues) {
    const size_t w_bytes = static_cast<size_t>(p.n) * RealElementSize(p.dtype);
    Outcome r = info == 0 ? dev.Upload(o.w_out, w_host.data(), w_bytes)
                          : dev.FillBytes(o.w_out, 0xFF, w_bytes);
    if (!r.ok) return r;
  }
  // A failed call leaves NaN in every floating result (pivots and a factor read only stay).
  if (info != 0 && o.routine->rhs) {
    if (Outcome r = dev.FillBytes(o.x_out, 0xFF, RhsBytes(o, p)); !r.ok) return r;
  }
  if (info != 0 && o.routine->result != Result::kUnchanged) {
    if (Outcome r = FillTiles(dev, p, o.a_out, o.to_cyclic.size() != 0); !r.ok) return r;
  }
  if (Outcome r = dev.Upload(o.status_out, &info, sizeof(info)); !r.ok) return r;
  return dev.Synchronize();
}

// The checks of step 1 and the copy of the inputs into the (normally aliased) results.
// Returns "" when this participant is ready to publish, else what is wrong.
std::string Prepare(const Operands& o, Device& dev, int max_participants, Problem* p,
                    int32_t* position) {
  if (o.position == nullptr || o.position_count != 1)
    return std::string(o.target) + ": position must be an int32 scalar (lax.axis_index)";
  if (Outcome r = dev.ReadPosition(o.position, position); !r.ok) return r.message;
  std::string error = CheckOperands(o, *position, max_participants, p);
  if (!error.empty()) return error;
  if (o.job != 0) {
    if (o.pids.size() != o.device_ids.size())
      return std::string(o.target) + ": pids must name the process of every mesh position";
    // 0: not known to the caller (an abstract mesh); the leader's is learnt when it arrives.
    if (o.pids[*position] != 0 && o.pids[*position] != static_cast<int64_t>(getpid()))
      return std::string(o.target) + ": mesh position " + std::to_string(*position) +
             " belongs to process " + std::to_string(o.pids[*position]) + ", not to this one (" +
             std::to_string(getpid()) + ")";
  }
  if (o.a->untyped_data() != o.a_out) {
    if (Outcome r = dev.Copy(o.a_out, o.a->untyped_data(), o.a->size_bytes()); !r.ok)
      return r.message;
  }
  if (o.routine->rhs && o.b->untyped_data() != o.x_out) {
    if (Outcome r = dev.Copy(o.x_out, o.b->untyped_data(), o.b->size_bytes()); !r.ok)
      return r.message;
  }
  // The leader reads these buffers from another thread (and, on GPU, other streams).
  Outcome r = dev.Synchronize();
  return r.ok ? "" : r.message;
}

Outcome SameSignatures(const char* target, const std::vector<Slot>& slots) {
  for (size_t d = 0; d < slots.size(); ++d) {
    if (slots[d].signature != slots[0].signature)
      return Outcome::Fail(std::string(target) + ": participants disagree on the call: " +
                           "position 0 has " + slots[0].signature + ", position " +
                           std::to_string(d) + " has " + slots[d].signature);
  }
  return {};
}

// The leader's library call for everybody, then x (a right-hand side) from position 0 to the
// others.
Outcome RunLibrary(const Operands& o, const Problem& p, Backend& backend, MgCall& call,
                   std::vector<unsigned char>* w_host, int32_t* info_out) {
  if (o.routine->eigenvalues) {
    w_host->assign(static_cast<size_t>(p.n) * RealElementSize(p.dtype), 0);
    call.w = w_host->data();
  }
  int info = 0;
  if (Outcome r = ApplyMoves(o.to_cyclic, p, backend, call); !r.ok) return r;
  Outcome run = backend.Run(call, &info);
  // The library may still be working on its own streams when it returns (NVIDIA's samples
  // synchronise every device after each cuSolverMg call): nothing reads or moves the blocks,
  // and no participant hands them back to XLA, before every device is done. Also on failure.
  Outcome sync = backend.SynchronizeAll(call.devices);
  if (!run.ok) return run;
  if (!sync.ok) return sync;
  *info_out = info;
  if (ReturnsMatrix(o) && info == 0) {
    if (Outcome r = ApplyMoves(o.from_cyclic, p, backend, call); !r.ok) return r;
  }
  if (o.routine->rhs && info == 0) {
    std::vector<Copy> x;
    for (size_t d = 1; d < call.b.size(); ++d)
      x.push_back(Copy{call.devices[d], call.b[d], call.devices[0], call.b[0], RhsBytes(o, p)});
    if (Outcome r = backend.CopyAll(x); !r.ok) return r;
  }
  return {};
}


namespace {

// Fills `slot` with this participant's buffers and the call's shape as it sees it, and claims
// its mesh position with it. The outcome so far: `error` (from Prepare), or a position that
// another participant claimed already.
Outcome ClaimPosition(const Operands& o, const Problem& p, Device& dev, int32_t position,
                      const std::string& error, Meeting& meeting, Slot* slot) {
  slot->device = dev.ordinal();
  slot->a = o.a_out;
  slot->b = o.x_out;
  slot->ipiv = o.ipiv;
  slot->w = o.w_out;
  slot->status = o.status_out;
  slot->thread = ThreadToken();
  slot->signature = Signature(p);
  if (!error.empty()) return Outcome::Fail(error);
  if (meeting.Claim(position, *slot)) return {};
  return Outcome::Fail(std::string(o.target) + ": two participants claim mesh position " +
                       std::to_string(position) + " of call " + meeting.key());
}

}  // namespace

ffi::Error Participate(const Operands& o, Device& dev, Backend& backend, int max_participants) {
  // 1. Check, and bring the inputs into the result buffers (XLA normally aliases them).
  Problem p;
  int32_t position = -1;
  std::string error = Prepare(o, dev, max_participants, &p, &position);
  if (o.job != 0) return AcrossProcesses(o, p, dev, backend, position, error);

  // 2. Phase 0: meet, publish, the leader sizes the workspace.
  const int ndev = static_cast<int>(std::max<size_t>(o.device_ids.size(), 1));
  DelayForTests(position);
  std::shared_ptr<Meeting> meeting = JoinMeeting(o, ndev);
  Slot slot;
  Outcome own = ClaimPosition(o, p, dev, position, error, *meeting, &slot);
  Outcome r = meeting->Phase(0, own, [&] {
    const std::vector<Slot> slots = meeting->Slots();
    if (Outcome same = SameSignatures(o.target, slots); !same.ok) return same;
    MgCall call = MakeCall(o, p, slots);
    std::vector<int64_t> bytes;
    Outcome q = backend.WorkspaceBytes(call, &bytes);
    if (q.ok && bytes.size() != call.a.size())
      q = Outcome::Fail(std::string(o.target) + ": internal error: workspace sizes per position");
    meeting->workspace_bytes = std::move(bytes);
    return q;
  });
  if (!r.ok) return Fail(r.message);

  // 3. This position's workspace, allocated on this participant's own thread and device.
  Outcome mine;
  const int64_t bytes = AllocationBytes(p, position, meeting->workspace_bytes);
  if (bytes > 0) {
    mine = dev.Allocate(static_cast<size_t>(bytes), &slot.workspace);
    if (mine.ok) {
      meeting->Publish(position, slot);
    } else {
      mine.message = std::string(o.target) + ": " + o.routine->name + " workspace of " +
                     std::to_string(bytes) + " bytes at mesh position " +
                     std::to_string(position) + ": " + mine.message;
    }
  }

  // 4. Phase 1: the leader runs the library for everybody.
  r = meeting->Phase(1, mine, [&] {
    MgCall call = MakeCall(o, p, meeting->Slots());
    call.work_bytes = meeting->workspace_bytes;
    int32_t info = 0;
    Outcome run = RunLibrary(o, p, backend, call, &meeting->host_result, &info);
    meeting->info = info;
    return run;
  });
  if (!r.ok) return Fail(r.message);

  // 5. Outputs on this device.
  r = WriteOutputs(o, p, dev, meeting->info, meeting->host_result);
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

namespace {

// The leader of ParticipateWithoutWaiting, for everybody: Participate's steps 2 to 5 with
// every position's buffers in this process's memory.
Outcome LeadInHostMemory(const Operands& o, const Problem& p, Device& dev, Backend& backend,
                         Meeting& meeting) {
  const std::vector<Slot> slots = meeting.Slots();  // in mesh order
  if (Outcome same = SameSignatures(o.target, slots); !same.ok) return same;
  MgCall call = MakeCall(o, p, slots);
  std::vector<int64_t> library;
  if (Outcome r = backend.WorkspaceBytes(call, &library); !r.ok) return r;
  if (library.size() != slots.size())
    return Outcome::Fail(std::string(o.target) + ": internal error: workspace sizes per position");
  std::vector<Keep> workspaces(slots.size());  // freed when the leader is done
  for (size_t d = 0; d < slots.size(); ++d) {
    const int64_t bytes = AllocationBytes(p, d, library);
    if (bytes <= 0) continue;
    Outcome r = backend.AllocateOn(slots[d].device, static_cast<size_t>(bytes), &call.work[d],
                                   &workspaces[d]);
    if (!r.ok)
      return Outcome::Fail(Cat(o.target, ": ", o.routine->name, " workspace of ", bytes,
                               " bytes at mesh position ", d, ": ", r.message));
  }
  call.work_bytes = library;
  int32_t info = 0;
  std::vector<unsigned char> w_host;
  if (Outcome r = RunLibrary(o, p, backend, call, &w_host, &info); !r.ok) return r;
  // Each position's outputs, as that participant would write them (Participate, step 5). The
  // call's shape is everybody's (SameSignatures); only the buffers and the position differ.
  for (size_t d = 0; d < slots.size(); ++d) {
    Operands theirs = o;
    theirs.a_out = slots[d].a;
    theirs.x_out = slots[d].b;
    theirs.w_out = slots[d].w;
    theirs.status_out = slots[d].status;
    Problem where = p;
    where.position = static_cast<int64_t>(d);
    if (Outcome r = WriteOutputs(theirs, where, dev, info, w_host); !r.ok) return r;
  }
  return {};
}

}  // namespace

void ParticipateWithoutWaiting(const Operands& o, Device& dev, Backend& backend,
                               Completion done) {
  Problem p;
  int32_t position = -1;
  std::string error = Prepare(o, dev, /*max_participants=*/0, &p, &position);
  const int ndev = static_cast<int>(std::max<size_t>(o.device_ids.size(), 1));
  DelayForTests(position);
  std::shared_ptr<Meeting> meeting = JoinMeeting(o, ndev);
  Slot slot;
  Outcome own = ClaimPosition(o, p, dev, position, error, *meeting, &slot);
  meeting->Arrive(own, std::move(done),
                  [&] { return LeadInHostMemory(o, p, dev, backend, *meeting); });
}

}  // namespace jaxmg
