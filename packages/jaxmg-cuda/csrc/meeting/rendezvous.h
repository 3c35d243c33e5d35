// The multi-device meeting point of jaxmg's FFI handlers.
//
// XLA calls a handler once per device, on distinct threads, concurrently. The handlers of one
// call meet here: each publishes its pointers (a Slot) at its mesh position, then one leader
// -- whichever participant arrives last at a phase -- runs the library for all of them while
// the others wait. A call may have several phases (the CUDA path: publish -> workspace size ->
// allocate -> run). Rules (see ../README.md):
//   * every wait for the *arrival* of the others has a deadline (JAXMG_TIMEOUT_S, default 60s,
//     read per call); on expiry every waiting participant returns an error naming what it
//     waited for, and the meeting is retired so the next call starts fresh;
//   * once everyone has arrived the leader works with the others' buffers, so nobody returns
//     before the leader is done (that wait is for computation, not for a peer);
//   * an error seen by any participant reaches all of them;
//   * a meeting is identified by the call (its device ids and trace-time call id) and by the
//     XLA execution it belongs to (its RunId, shared by every device of one execution and
//     unique per execution), so a participant that arrives after the others gave up can never
//     meet a later run of the same program, nor two programs that lower to the same key
//     (device ids unknown at trace time) meet each other. Within one execution a call may run
//     several times (a loop, a function called twice): every participant runs them in the same
//     order, and a meeting leaves the registry once all have joined, so the next one is new.
//     Nothing depends on which thread serves which device.
//
// Two ways to meet. Phase() blocks each participant's thread until the phase completes: the
// CUDA path and the cross-process path, where each participant must act on its own device or
// in its own process between phases. Arrive() never blocks: the CPU twin, whose participants
// all share this process's memory, so that the leader can do everything for everybody. It
// must not block: XLA:CPU runs a program's independent operations (a jaxmg call, an XLA
// all-to-all) concurrently on one pool of threads, each device in an order of its own
// (xla/backends/cpu/runtime/thunk_executor.cc), and XLA's collectives block their threads
// until every device has joined. A participant that blocked while waiting for the others
// could hold a thread another device needs to reach this call, while the others wait for it
// in an XLA collective; XLA then aborts the process (its rendezvous' 40 s termination
// timeout). The pool has a thread per device (or per core, if more), enough for XLA's own
// collectives, which every device runs in one program order; jaxmg's calls are not in that
// order. With Arrive() a participant's handler returns an unfinished ffi::Future instead.
#ifndef JAXMG_RENDEZVOUS_H_
#define JAXMG_RENDEZVOUS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/outcome.h"
#include "base/timeout.h"

namespace jaxmg {

// What one participant publishes. Pointers are device pointers on GPU, host pointers on CPU.
struct Slot {
  bool arrived = false;
  int device = -1;             // device ordinal (CUDA) or -1 (CPU)
  void* a = nullptr;           // the local tile array (the `a` result buffer)
  void* b = nullptr;           // rhs: this device's copy of B (the `x` result buffer)
  void* ipiv = nullptr;        // pivots: this device's [L] int32 (getrf, getrs)
  void* workspace = nullptr;   // this device's workspace (phase 1)
  void* w = nullptr;           // eigenvalues: this device's `w` result (Arrive() only)
  int32_t* status = nullptr;   // this device's status result (Arrive() only)
  uint64_t thread = 0;         // a token of the publishing thread (diagnostics only)
  std::string signature;       // the call's shape as this participant sees it
};

// Called exactly once with the outcome of a participant's call (Meeting::Arrive).
using Completion = std::function<void(const Outcome&)>;

class Meeting : public std::enable_shared_from_this<Meeting> {
 public:
  Meeting(std::string key, int participants, bool exact)
      : key_(std::move(key)), n_(participants), exact_(exact), slots_(participants) {}

  int participants() const { return n_; }
  const std::string& key() const { return key_; }

  // Claim `position` with `slot` (phase 0); false if another participant already holds it.
  bool Claim(int position, const Slot& slot);
  // Update this participant's slot (later phases).
  void Publish(int position, const Slot& slot);
  Slot Get(int position);
  std::vector<Slot> Slots();  // a snapshot, in mesh order

  // Arrive at `phase`; the last to arrive runs `leader` (with the lock released) and its
  // outcome becomes everyone's. `own` carries this participant's own failure, if any: it is
  // reported to everybody. Blocks until the phase completes, fails, or the arrival deadline
  // passes.
  Outcome Phase(int phase, Outcome own, const std::function<Outcome()>& leader);

  // Arrive without waiting (see the file comment; a meeting uses Phase() or Arrive(), never
  // both). The last to arrive runs `leader` for everybody, with the others' buffers still
  // theirs to use: XLA keeps them until their futures complete. Then every participant's
  // `done` gets the outcome (`own` failures and the leader's reach everybody): the caller's
  // own `done` on the caller's thread before Arrive returns, the others' each on a thread of
  // its own (RunAlone), since a participant's continuation is the rest of its device's
  // program, which may block in an XLA collective until the others' continuations reach it.
  // A participant that arrives after the meeting failed gets the error at once. The arrival
  // deadline starts with the first arrival; when it passes, every participant that arrived
  // gets the timeout error and the meeting is retired.
  void Arrive(Outcome own, Completion done, const std::function<Outcome()>& leader);

  // What a phase's leader computes for everybody. Written by the leader only while it leads,
  // read by the others only after the phase completed (the meeting's mutex orders the two).
  std::vector<int64_t> workspace_bytes;  // per mesh position
  std::vector<unsigned char> host_result;  // e.g. eigenvalues
  int32_t info = 0;                      // the library's status

 private:
  friend class Registry;
  std::string key_;
  int n_;
  bool exact_;  // the key names one execution (Registry::Join)
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::map<int, int> arrived_;          // phase -> arrivals
  std::map<int, bool> done_;            // phase -> leader finished
  bool failed_ = false;
  std::string error_;
  // Arrive(): arrivals so far, and the completions of those still waiting for the outcome.
  int arrivals_ = 0;
  std::vector<Completion> waiting_;
  double seconds_ = 0;     // the arrival deadline: JAXMG_TIMEOUT_S at the first arrival
  std::chrono::steady_clock::time_point deadline_at_;  // and when it passes
  uint64_t deadline_ = 0;  // its entry in Deadlines (rendezvous.cc); 0: none

  friend class Deadlines;
  void Expire();  // the arrival deadline of Arrive() passed
  std::string TimeoutMessage(double seconds, int arrived, const std::string& where) const;
};

// Runs `task` at once on a thread that runs nothing else meanwhile: an idle thread of a pool
// that grows as needed, never a queue behind another task.
void RunAlone(std::function<void()> task);

// Hands out the open meeting of a call; a meeting leaves the registry once full (all
// participants joined) or when it times out, so the next run of the same call gets a new one.
class Registry {
 public:
  static Registry& Get();
  // `exact`: the key names one execution (it holds its RunId). A participant that arrives
  // after the others of such a meeting timed out then gets that meeting, failed, and returns
  // its error at once instead of waiting a deadline for peers that are gone. (Only the last
  // kGone such meetings are remembered; an older one's late participant times out alone.)
  std::shared_ptr<Meeting> Join(const std::string& key, int participants, bool exact);
  void Retire(const std::shared_ptr<Meeting>& meeting);
  size_t open_meetings();

 private:
  static constexpr size_t kGone = 64;
  struct Open {
    std::shared_ptr<Meeting> meeting;
    int joined = 0;
  };
  std::mutex mu_;
  std::map<std::string, Open> open_;
  std::deque<Open> gone_;  // exact meetings that timed out before everyone joined, oldest first
};

}  // namespace jaxmg

#endif  // JAXMG_RENDEZVOUS_H_
