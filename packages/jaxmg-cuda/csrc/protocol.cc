#include "protocol.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "crossprocess.h"

namespace jaxmg {
namespace {

const char* OpName(Op op) {
  switch (op) {
    case Op::kPotrs: return "potrs";
    case Op::kPotri: return "potri";
    case Op::kSyevd: return "syevd";
  }
  return "?";
}

// The in-place relayout's moves (protocol.h): whole (round, source, destination, width) rows
// in round order, positive widths, every range inside one position's block or one position's
// staging buffer, no move onto its own source. Sets p->staging.
std::string CheckMoves(const char* target, const char* name, ffi::Span<const int64_t> moves,
                       Problem* p) {
  std::ostringstream err;
  err << target << ": " << name << ": ";
  if (moves.size() % 4 != 0) {
    err << "expected (round, source, destination, width) rows, got " << moves.size()
        << " values";
    return err.str();
  }
  const int64_t ends = p->ndev * p->local;  // each position's staging buffer follows
  for (size_t m = 0; m < moves.size(); m += 4) {
    const int64_t round = moves[m], src = moves[m + 1], dst = moves[m + 2], width = moves[m + 3];
    auto inside = [&](int64_t at) {
      if (at < 0 || at >= 2 * ends || at / p->local != (at + width - 1) / p->local) return false;
      if (at >= ends) p->staging = std::max(p->staging, (at - ends) % p->local + width);
      return true;
    };
    const bool ordered = round >= 0 && (m == 0 || round >= moves[m - 4]);
    if (!ordered || width < 1 || !inside(src) || !inside(dst) ||
        (src < dst + width && dst < src + width)) {
      err << "move " << m / 4 << " (" << round << ", " << src << ", " << dst << ", " << width
          << ") is out of round order or not a column range of one block (L=" << p->local
          << ", positions [0, " << ends << ")) or staging buffer ([" << ends << ", "
          << 2 * ends << ")) to a disjoint one";
      return err.str();
    }
  }
  return "";
}

// The "dispatch" checks: every shape and dtype, before anything is touched. Returns "" when
// the call is well formed, else a message naming the target and what would be accepted.
std::string CheckOperands(const Operands& o, int32_t position, int max_participants,
                          Problem* p) {
  std::string error = CheckMatrix(o.target, o.a->dimensions(), o.a->element_type(), o.tile,
                                  o.device_ids, position, p);
  if (!error.empty()) return error;
  std::ostringstream err;
  err << o.target << ": ";
  if (max_participants > 0 && p->ndev > max_participants) {
    err << "the call has " << p->ndev << " participants (len(device_ids)); this backend "
        << "accepts at most " << max_participants;
    return err.str();
  }
  if (o.status_count != 1) return err.str() + "status must be int32 [1]";
  if (o.op == Op::kPotrs) {
    auto b = o.b->dimensions();
    if (b.size() != 2 || b[1] != p->n || o.b->element_type() != o.a->element_type()) {
      err << "b must be [nrhs, N=" << p->n << "] with A's dtype";
      return err.str();
    }
    if (std::string sizes = CheckLibrarySizes(p->n, p->local, p->tile, b[0]); !sizes.empty())
      return err.str() + sizes;
    p->nrhs = b[0];
  }
  error = CheckMoves(o.target, "to_cyclic", o.to_cyclic, p);
  if (error.empty()) error = CheckMoves(o.target, "from_cyclic", o.from_cyclic, p);
  if (!error.empty()) return error;
  if (o.op == Op::kSyevd) {
    if (o.w_dims.size() != 1 || o.w_dims[0] != p->n || o.w_type != RealTypeOf(p->dtype)) {
      err << "w must be [N=" << p->n << "] of A's real dtype";
      return err.str();
    }
  }
  return "";
}

// What every participant of one call must agree on.
std::string Signature(const Problem& p) {
  std::ostringstream s;
  s << "N=" << p.n << " T_A=" << p.tile << " L=" << p.local << " nrhs=" << p.nrhs
    << " dtype=" << static_cast<int>(p.dtype) << " staging=" << p.staging;
  return s.str();
}

// Bytes of workspace to allocate at `position`: the library's, and at least the relayout's
// staging buffer (used only before and after the library runs).
int64_t AllocationBytes(const Problem& p, size_t position, const std::vector<int64_t>& library) {
  const int64_t staging = p.staging * p.n * static_cast<int64_t>(ElementSize(p.dtype));
  return std::max(library[position], staging);
}

// Bytes of b / x (potrs; 0 for the other targets).
size_t RhsBytes(const Operands& o, const Problem& p) {
  return o.op == Op::kPotrs ? static_cast<size_t>(p.n * p.nrhs) * ElementSize(p.dtype) : 0;
}

uint64_t ThreadToken() { return std::hash<std::thread::id>()(std::this_thread::get_id()); }

// The library call as the leader sees it, from the published slots.
MgCall MakeCall(const Operands& o, const Problem& p, const std::vector<Slot>& slots) {
  MgCall call;
  call.op = o.op;
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
  if (o.op == Op::kSyevd) {
    const size_t w_bytes = static_cast<size_t>(p.n) * RealElementSize(p.dtype);
    Outcome r = info == 0 ? dev.Upload(o.w_out, w_host.data(), w_bytes)
                          : dev.FillBytes(o.w_out, 0xFF, w_bytes);
    if (!r.ok) return r;
  }
  if (info != 0) {
    if (o.op == Op::kPotrs) {
      Outcome r = dev.FillBytes(o.x_out, 0xFF, RhsBytes(o, p));
      if (!r.ok) return r;
    } else {
      Outcome r = FillTiles(dev, p, o.a_out, o.to_cyclic.size() != 0);
      if (!r.ok) return r;
    }
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
  if (o.op == Op::kPotrs && o.b->untyped_data() != o.x_out) {
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

// The leader moves column ranges between the positions' blocks and staging buffers (at the
// start of each position's workspace), one round at a time.
Outcome ApplyMoves(ffi::Span<const int64_t> moves, const Problem& p, Backend& backend,
                   const MgCall& call) {
  const size_t column = static_cast<size_t>(p.n) * ElementSize(p.dtype);
  const int64_t ends = p.ndev * p.local;
  auto at = [&](int64_t position, int* device) -> char* {
    const bool staged = position >= ends;
    const int64_t q = (staged ? position - ends : position) / p.local;
    *device = call.devices[q];
    char* base = static_cast<char*>(staged ? call.work[q] : call.a[q]);
    return base + static_cast<size_t>(position % p.local) * column;
  };
  std::vector<Copy> round;
  for (size_t m = 0; m < moves.size(); m += 4) {
    Copy c{};
    c.src = at(moves[m + 1], &c.src_device);
    c.dst = at(moves[m + 2], &c.dst_device);
    c.bytes = static_cast<size_t>(moves[m + 3]) * column;
    round.push_back(c);
    if (m + 4 == moves.size() || moves[m + 4] != moves[m]) {
      if (Outcome r = backend.CopyAll(round); !r.ok) return r;
      round.clear();
    }
  }
  return {};
}

// The leader's library call for everybody, then x from position 0 to the others (potrs).
Outcome RunLibrary(const Operands& o, const Problem& p, Backend& backend, MgCall& call,
                   std::vector<unsigned char>* w_host, int32_t* info_out) {
  if (o.op == Op::kSyevd) {
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
  const bool returns_a = o.op == Op::kPotri || (o.op == Op::kSyevd && o.vectors);
  if (returns_a && info == 0) {
    if (Outcome r = ApplyMoves(o.from_cyclic, p, backend, call); !r.ok) return r;
  }
  if (o.op == Op::kPotrs && info == 0) {
    std::vector<Copy> x;
    for (size_t d = 1; d < call.b.size(); ++d)
      x.push_back(Copy{call.devices[d], call.b[d], call.devices[0], call.b[0], RhsBytes(o, p)});
    if (Outcome r = backend.CopyAll(x); !r.ok) return r;
  }
  return {};
}

// Test hook JAXMG_TEST_DELAY="POSITION:SECONDS[:TIMES]": the participant at mesh position
// POSITION sleeps SECONDS before it joins its meeting, in its first TIMES calls of this
// process (every call without TIMES). Lets tests make one participant arrive late.
void DelayForTests(int32_t position) {
  static std::atomic<int64_t> delayed{0};
  const char* text = std::getenv("JAXMG_TEST_DELAY");
  if (text == nullptr || *text == '\0') return;
  long long at = -1, times = -1;
  double seconds = 0;
  const int got = std::sscanf(text, "%lld:%lf:%lld", &at, &seconds, &times);
  if (got < 2 || at != position || seconds <= 0) return;
  if (got == 3 && delayed.fetch_add(1) >= times) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The meeting of this call: its key, and the execution when the handler knows it.
std::shared_ptr<Meeting> JoinMeeting(const Operands& o, int participants) {
  return Registry::Get().Join(MeetingKey(o.target, o.device_ids, o.call_id, o.run_id),
                              participants, o.run_id.has_value());
}

// --- participants in other processes (crossprocess.h) -------------------------------------

double Elapsed(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string Who(const Operands& o, int position, int64_t pid = 0) {
  if (pid == 0) pid = o.pids[position];
  return "mesh position " + std::to_string(position) +
         (pid != 0 ? " (process " + std::to_string(pid) + ")" : "");
}

// The leader's view of position q's operands: the copies in its segment (CPU), or its own
// GPU memory mapped into this process (CUDA IPC). Returns "" or what is wrong.
std::string Attach(const Operands& o, const Problem& p, Device& dev, Backend& backend, int q,
                   Segment& segment, Slot* slot, std::vector<Keep>* keep) {
  SegmentHeader* h = segment.header();
  const uint64_t a_bytes = o.a->size_bytes();
  const uint64_t b_bytes = RhsBytes(o, p);
  const bool by_handle = h->by_handle != 0;
  if (by_handle != dev.SharesByHandle()) {
    auto how = [](bool handle) { return handle ? "by handle (GPU)" : "by copy (CPU)"; };
    return std::string(o.target) + ": " + Who(o, q) + " shares its buffers " + how(by_handle) +
           " but the leader shares " + how(dev.SharesByHandle()) +
           "; every position must be on one platform (and JAXMG_TEST_SHARE_BY_HANDLE alike)";
  }
  const uint64_t got = by_handle ? h->shared[0].bytes : h->bytes[0];
  if (got != a_bytes) {
    return std::string(o.target) + ": " + Who(o, q) + " shared a block of " +
           std::to_string(got) + " bytes, expected " + std::to_string(a_bytes);
  }
  if (!by_handle) {
    slot->a = segment.operand(0);
    slot->b = segment.operand(1);
    return "";
  }
  keep->emplace_back();
  Outcome r = backend.MapShared(h->shared[0], &slot->device, &slot->a, &keep->back());
  if (r.ok && b_bytes > 0) {
    int device_b = -1;
    keep->emplace_back();
    r = backend.MapShared(h->shared[1], &device_b, &slot->b, &keep->back());
    if (r.ok && device_b != slot->device)
      r = Outcome::Fail("b and A of " + Who(o, q) + " are on different GPUs");
  }
  return r.ok ? "" : std::string(o.target) + ": " + Who(o, q) + ": " + r.message;
}

// Position 0: collect every other position's segment, run the library on their memory.
ffi::Error LeadAcrossProcesses(const Operands& o, const Problem& p, Device& dev,
                               Backend& backend, const std::string& call, int64_t sequence,
                               const std::string& own_error) {
  const int ndev = static_cast<int>(o.device_ids.size());
  const double seconds = TimeoutSeconds();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Segment>> segments(ndev);
  std::vector<bool> joined(ndev, false);
  joined[0] = true;
  int arrived = 1;
  std::string reported;  // the first failure a participant reported in its segment
  std::string fatal;     // why collecting cannot go on: a dead or missing process
  Backoff backoff;
  // Collect everybody, even after a failure, so that every participant gets the error.
  while (fatal.empty() && arrived < ndev) {
    for (int q = 1; q < ndev && fatal.empty(); ++q) {
      if (joined[q]) continue;
      if (!segments[q]) {
        Outcome r = Segment::TryOpen(SegmentName(o.job, call, sequence, q), &segments[q]);
        if (!r.ok) fatal = r.message;
        if (segments[q]) segments[q]->Unlink();  // from now on the leader owns its removal
      }
      if (segments[q]) {
        int32_t state = kReady;
        SegmentHeader* h = segments[q]->header();
        h->leader_pid = static_cast<int32_t>(getpid());  // published by the exchange below
        if (h->state.compare_exchange_strong(state, kTaken, std::memory_order_acq_rel) ||
            state == kFailed) {
          joined[q] = true;
          ++arrived;
          if (state == kFailed && reported.empty()) reported = h->message;
        } else if (state == kAborted) {
          fatal = h->message;  // it gave up waiting for us
        }
      }
      // Its process: from the caller, else from its segment once it has one.
      const int64_t pid = o.pids[q] != 0 ? o.pids[q] : segments[q] ? segments[q]->header()->pid : 0;
      if (!joined[q] && fatal.empty() && !ProcessAlive(pid))
        fatal = std::string(o.target) + ": " + Who(o, q, pid) + " exited before joining call " +
                call;
    }
    if (fatal.empty() && arrived < ndev) {
      if (Elapsed(start) > seconds) {
        std::ostringstream m;
        m << "jaxmg: timed out after " << seconds << " s (JAXMG_TIMEOUT_S) waiting for the "
          << "processes of call " << call << ": " << arrived << " of " << ndev
          << " arrived; missing:";
        for (int q = 1; q < ndev; ++q)
          if (!joined[q]) m << " " << Who(o, q);
        m << ". Every process of the mesh axis must run the same jaxmg calls in the same order.";
        fatal = m.str();
      } else {
        backoff.Wait();
      }
    }
  }
  std::string error = !own_error.empty() ? own_error : !reported.empty() ? reported : fatal;

  std::vector<Slot> slots(ndev);
  slots[0].device = dev.ordinal();
  slots[0].a = o.a_out;
  slots[0].b = o.x_out;
  slots[0].signature = Signature(p);
  std::vector<Keep> keep;  // mappings and workspace: released before anyone is told the end
  for (int q = 1; q < ndev && error.empty(); ++q) {
    SegmentHeader* h = segments[q]->header();
    slots[q].signature = std::string(h->signature, strnlen(h->signature, sizeof(h->signature)));
    error = Attach(o, p, dev, backend, q, *segments[q], &slots[q], &keep);
  }
  if (error.empty()) error = SameSignatures(o.target, slots).message;

  int32_t info = 0;
  std::vector<unsigned char> w_host;
  if (error.empty()) {
    MgCall mg = MakeCall(o, p, slots);
    std::vector<int64_t> bytes;
    Outcome r = backend.WorkspaceBytes(mg, &bytes);
    // Every position's workspace is allocated by this process, on that position's device.
    for (size_t d = 0; r.ok && d < bytes.size(); ++d) {
      const int64_t allocate = AllocationBytes(p, d, bytes);
      if (allocate <= 0) continue;
      const size_t size = static_cast<size_t>(allocate);
      if (d == 0) {
        r = dev.Allocate(size, &mg.work[d]);
      } else {
        keep.emplace_back();
        r = backend.AllocateOn(mg.devices[d], size, &mg.work[d], &keep.back());
      }
    }
    mg.work_bytes = bytes;
    if (r.ok) r = RunLibrary(o, p, backend, mg, &w_host, &info);
    // Nothing may still be running on another process's memory once it is told the end.
    if (Outcome s = backend.SynchronizeAll(mg.devices); r.ok && !s.ok) r = s;
    if (!r.ok) error = r.message;
  }
  keep.clear();  // unmap the other processes' memory (GPU) before they may free it

  // Tell everyone who joined; the others time out on their own.
  for (int q = 1; q < ndev; ++q) {
    if (!segments[q]) continue;
    SegmentHeader* h = segments[q]->header();
    if (error.empty()) {
      h->info = info;
      if (o.op == Op::kSyevd) std::memcpy(segments[q]->operand(2), w_host.data(), w_host.size());
      h->state.store(kDone, std::memory_order_release);
    } else {
      segments[q]->Finish(kAborted, error);
    }
  }
  if (!error.empty()) return Fail(error);
  Outcome r = WriteOutputs(o, p, dev, info, w_host);
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

// Positions > 0: publish the operands in a segment, wait for the leader, copy results back.
ffi::Error JoinAcrossProcesses(const Operands& o, const Problem& p, Device& dev, int position,
                               const std::string& call, int64_t sequence, std::string error) {
  // GPU: the buffers stay where they are; the leader maps them through CUDA IPC handles.
  const bool by_handle = dev.SharesByHandle();
  const uint64_t a_bytes = o.a->size_bytes();
  const uint64_t b_bytes = RhsBytes(o, p);
  SharedMemory shared[2] = {};
  if (error.empty() && by_handle) {
    Outcome r = dev.Share(o.a_out, a_bytes, &shared[0]);
    if (r.ok && b_bytes > 0) r = dev.Share(o.x_out, b_bytes, &shared[1]);
    if (!r.ok) error = std::string(o.target) + ": mesh position " + std::to_string(position) +
                       ": " + r.message;
  }
  const bool ok = error.empty();
  uint64_t bytes[3] = {ok && !by_handle ? a_bytes : 0, ok && !by_handle ? b_bytes : 0, 0};
  if (ok && o.op == Op::kSyevd) bytes[2] = static_cast<uint64_t>(p.n) * RealElementSize(p.dtype);
  std::unique_ptr<Segment> segment;
  if (Outcome r = Segment::Create(SegmentName(o.job, call, sequence, position), bytes, &segment);
      !r.ok) {
    return Fail(r.message);  // the leader times out on this position and says so
  }
  SegmentHeader* h = segment->header();
  h->position = position;
  if (!ok) {
    segment->Finish(kFailed, error);
    segment->Unlink();  // unless the leader got it first, nobody else will
    return Fail(error);
  }
  if (by_handle) {
    h->by_handle = 1;
    std::memcpy(h->shared, shared, sizeof(shared));
  } else {
    std::memcpy(segment->operand(0), o.a_out, bytes[0]);
    if (bytes[1] > 0) std::memcpy(segment->operand(1), o.x_out, bytes[1]);
  }
  std::snprintf(h->signature, sizeof(h->signature), "%s", Signature(p).c_str());
  int32_t state = kWriting;  // the leader may have given up on this call meanwhile
  h->state.compare_exchange_strong(state, kReady, std::memory_order_acq_rel);

  const double seconds = TimeoutSeconds();
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff;
  while (true) {
    state = h->state.load(std::memory_order_acquire);
    if (state == kDone || state == kAborted) break;
    // The leader's process: from the caller, else from the leader itself once it has taken
    // this segment (until then the deadline below bounds the wait).
    const int64_t leader = o.pids[0] != 0 ? o.pids[0] : state == kTaken ? h->leader_pid : 0;
    if (!ProcessAlive(leader)) {
      error = std::string(o.target) + ": " + Who(o, 0, leader) + ", the leader of call " + call +
              ", exited " + (state == kTaken ? "while computing" : "before joining");
      break;
    }
    if (state == kReady && Elapsed(start) > seconds) {
      int32_t expected = kReady;  // withdraw, unless the leader takes it at this very moment
      if (h->state.compare_exchange_strong(expected, kAborted, std::memory_order_acq_rel)) {
        std::ostringstream m;
        m << "jaxmg: timed out after " << seconds << " s (JAXMG_TIMEOUT_S) waiting for "
          << Who(o, 0) << ", the leader of call " << call << ". Every process of the mesh "
          << "axis must run the same jaxmg calls in the same order.";
        error = m.str();
        break;
      }
    }
    backoff.Wait();  // once taken, the wait is for the computation, bounded by its liveness
  }
  segment->Unlink();
  if (error.empty() && state == kAborted)
    error = std::string(h->message, strnlen(h->message, sizeof(h->message)));
  if (!error.empty()) return Fail(error);

  if (!by_handle) {  // else the leader wrote the results into this process's memory itself
    std::memcpy(o.a_out, segment->operand(0), bytes[0]);
    if (bytes[1] > 0) std::memcpy(o.x_out, segment->operand(1), bytes[1]);
  }
  std::vector<unsigned char> w_host(segment->operand(2), segment->operand(2) + bytes[2]);
  Outcome r = WriteOutputs(o, p, dev, h->info, w_host);
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

ffi::Error AcrossProcesses(const Operands& o, const Problem& p, Device& dev, Backend& backend,
                           int32_t position, std::string error) {
  const std::string call = MeetingKey(o.target, o.device_ids, o.call_id);
  const int64_t sequence = NextSequence(call);  // on every path: the processes stay in step
  if (position < 0 || position >= static_cast<int32_t>(o.device_ids.size()) ||
      o.pids.size() != o.device_ids.size()) {
    return Fail(error.empty() ? std::string(o.target) + ": malformed multi-process call" : error);
  }
  if (position == 0) return LeadAcrossProcesses(o, p, dev, backend, call, sequence, error);
  return JoinAcrossProcesses(o, p, dev, position, call, sequence, error);
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
  Outcome own = error.empty() ? Outcome{} : Outcome::Fail(error);
  Slot slot;
  slot.device = dev.ordinal();
  slot.a = o.a_out;
  slot.b = o.x_out;
  slot.thread = ThreadToken();
  slot.signature = Signature(p);
  if (own.ok && !meeting->Claim(position, slot)) {
    own = Outcome::Fail(std::string(o.target) + ": two participants claim mesh position " +
                        std::to_string(position) + " of call " + meeting->key());
  }
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
      mine.message = std::string(o.target) + ": " + OpName(o.op) + " workspace of " +
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

}  // namespace jaxmg
