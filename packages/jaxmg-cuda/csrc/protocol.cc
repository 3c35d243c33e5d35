#include "protocol.h"

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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
    if (!CheckedInt(b[0]) || !CheckedInt(b[0] * p->n)) {
      err << "nrhs=" << b[0] << " is beyond the library's 32-bit range";
      return err.str();
    }
    p->nrhs = b[0];
  }
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
    << " dtype=" << static_cast<int>(p.dtype);
  return s.str();
}

uint64_t ThreadToken() { return std::hash<std::thread::id>()(std::this_thread::get_id()); }

// The library call as the leader sees it, from the published slots.
MgCall MakeCall(const Operands& o, const Problem& p, const std::vector<Slot>& slots) {
  MgCall call;
  call.op = o.op;
  call.dtype = p.dtype;
  // CheckOperands verified that these fit an int.
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

// NaN (all bits set) over this position's real tiles of `data`; padding is left alone.
Outcome FillTiles(Device& dev, const Problem& p, void* data) {
  const size_t esize = ElementSize(p.dtype);
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
  const size_t esize = ElementSize(p.dtype);
  if (o.op == Op::kSyevd) {
    const size_t w_bytes = static_cast<size_t>(p.n) * RealElementSize(p.dtype);
    Outcome r = info == 0 ? dev.Upload(o.w_out, w_host.data(), w_bytes)
                          : dev.FillBytes(o.w_out, 0xFF, w_bytes);
    if (!r.ok) return r;
  }
  if (info != 0) {
    if (o.op == Op::kPotrs) {
      Outcome r = dev.FillBytes(o.x_out, 0xFF, static_cast<size_t>(p.n * p.nrhs) * esize);
      if (!r.ok) return r;
    } else {
      Outcome r = FillTiles(dev, p, o.a_out);
      if (!r.ok) return r;
    }
  }
  if (Outcome r = dev.Upload(o.status_out, &info, sizeof(info)); !r.ok) return r;
  return dev.Synchronize();
}

}  // namespace

ffi::Error Participate(const Operands& o, Device& dev, Backend& backend, int max_participants) {
  // 1. Check, and bring the inputs into the result buffers (XLA normally aliases them).
  Problem p;
  std::string error;
  int32_t position = -1;
  if (o.position == nullptr || o.position_count != 1) {
    error = std::string(o.target) + ": position must be an int32 scalar (lax.axis_index)";
  } else if (Outcome r = dev.ReadPosition(o.position, &position); !r.ok) {
    error = r.message;
  } else {
    error = CheckOperands(o, position, max_participants, &p);
  }
  if (error.empty() && o.a->untyped_data() != o.a_out) {
    if (Outcome r = dev.Copy(o.a_out, o.a->untyped_data(), o.a->size_bytes()); !r.ok)
      error = r.message;
  }
  if (error.empty() && o.op == Op::kPotrs && o.b->untyped_data() != o.x_out) {
    if (Outcome r = dev.Copy(o.x_out, o.b->untyped_data(), o.b->size_bytes()); !r.ok)
      error = r.message;
  }
  if (error.empty()) {
    // The leader reads these buffers from another thread (and, on GPU, other streams).
    if (Outcome r = dev.Synchronize(); !r.ok) error = r.message;
  }

  // 2. Phase 0: meet, publish, the leader sizes the workspace.
  const int ndev = static_cast<int>(std::max<size_t>(o.device_ids.size(), 1));
  std::shared_ptr<Meeting> meeting =
      Registry::Get().Join(MeetingKey(o.target, o.device_ids, o.call_id), ndev);
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
    for (size_t d = 0; d < slots.size(); ++d) {
      if (slots[d].signature != slots[0].signature)
        return Outcome::Fail(std::string(o.target) + ": participants disagree on the call: " +
                             "position 0 has " + slots[0].signature + ", position " +
                             std::to_string(d) + " has " + slots[d].signature);
    }
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
  const int64_t bytes = meeting->workspace_bytes[position];
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
    if (o.op == Op::kSyevd) {
      meeting->host_result.assign(static_cast<size_t>(p.n) * RealElementSize(p.dtype), 0);
      call.w = meeting->host_result.data();
    }
    int info = 0;
    Outcome run = backend.Run(call, &info);
    if (!run.ok) return run;
    meeting->info = info;
    if (o.op == Op::kPotrs && info == 0) {
      const size_t x_bytes = static_cast<size_t>(p.n * p.nrhs) * ElementSize(p.dtype);
      for (size_t d = 1; d < call.b.size(); ++d) {
        Outcome c = backend.CopyAcross(call.devices[d], call.b[d], call.devices[0], call.b[0],
                                       x_bytes);
        if (!c.ok) return c;
      }
    }
    return Outcome{};
  });
  if (!r.ok) return Fail(r.message);

  // 5. Outputs on this device.
  r = WriteOutputs(o, p, dev, meeting->info, meeting->host_result);
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

}  // namespace jaxmg
