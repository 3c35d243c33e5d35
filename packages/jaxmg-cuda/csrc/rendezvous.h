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

namespace jaxmg {

// What one participant publishes. Pointers are device pointers on GPU, host pointers on CPU.
struct Slot {
  bool arrived = false;
  int device = -1;             // device ordinal (CUDA) or -1 (CPU)
  void* a = nullptr;           // the local tile array (the `a` result buffer)
  void* b = nullptr;           // rhs: this device's copy of B (the `x` result buffer)
  void* ipiv = nullptr;        // pivots: this device's [L] int32 (getrf, getrs)
  void* workspace = nullptr;   // this device's workspace (phase 1)
  uint64_t thread = 0;         // a token of the publishing thread (diagnostics only)
  std::string signature;       // the call's shape as this participant sees it
};

// Result of a meeting phase for one participant.
struct Outcome {
  bool ok = true;
  std::string message;
  static Outcome Fail(std::string m) { return Outcome{false, std::move(m)}; }
};

double TimeoutSeconds();  // JAXMG_TIMEOUT_S, default 60

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
};

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
