// The multi-process mode: one process per device, all on one host. Its transport (segments)
// and its protocol (AcrossProcesses, the counterpart of protocol.cc's meetings).
//
// Each participant of a call owns one POSIX shared-memory segment: a header (state, pid,
// the call's signature, status, an error message) followed by its operands. On CPU the
// operands are copies; on GPU they stay in the participant's device memory and the header
// carries CUDA IPC handles to them, which the leader maps (base/backend.h, SharedMemory). The
// leader (mesh position 0) opens every other participant's segment, unlinks its name at once (so
// nothing outlives the call even if a process dies), runs the library on the segments' memory,
// and marks each segment done or aborted. State changes are atomics in the shared header; waits
// poll with a short back-off, each with a deadline and a liveness check of the peer process.
//
// Names are "/jaxmg-<uid>-<job>-<call>-<sequence>-<position>": `job` is a random token the
// processes agreed on through jax.distributed (two jobs on one node never meet), `sequence`
// counts the runs of one call in this process (every process of a job runs the same calls
// in the same order). Segments are created O_EXCL with mode 0600.
//
// A participant waits here on its own thread, as a participant of the in-process meeting
// once did (rendezvous.h, Arrive). With one device per process it can starve no other device
// of that process; but nothing puts jaxmg's calls and XLA's cross-process collectives in one
// order, so a program in which the processes start an independent jaxmg call and an XLA
// collective in different orders would wait until the deadline. Not seen; not tested.
#ifndef JAXMG_CROSSPROCESS_H_
#define JAXMG_CROSSPROCESS_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/backend.h"
#include "meeting/protocol.h"
#include "meeting/rendezvous.h"

namespace jaxmg {

enum SegmentState : int32_t {
  kWriting = 0,  // created, operands being copied in
  kReady = 1,    // operands in place, waiting for the leader
  kFailed = 2,   // the participant failed before publishing; `message` says why
  kTaken = 3,    // the leader has it and is computing
  kDone = 4,     // results and `info` in place
  kAborted = 5,  // the call failed; `message` says why
};

// A segment's operands, in order.
enum SegmentOperand : int {
  kSegmentA = 0,     // the tiles
  kSegmentB = 1,     // b / x (a right-hand side)
  kSegmentW = 2,     // eigenvalues
  kSegmentIpiv = 3,  // pivots
  kOperands = 4,
};

// What one segment starts with. Lock-free 32-bit atomics are address-free, so they work
// between processes that map the same memory.
struct SegmentHeader {
  std::atomic<int32_t> state;
  int32_t pid;
  int32_t leader_pid;  // written by the leader before it takes the segment (state kTaken)
  int32_t info;
  int32_t position;
  uint64_t total_bytes;
  uint64_t offset[kOperands];  // of each SegmentOperand
  uint64_t bytes[kOperands];
  int32_t by_handle;        // 1: a, b and ipiv stay on the participant's GPU, shared[] maps them
  SharedMemory shared[3];   // a, b, ipiv
  char signature[256];
  char message[2048];
};
static_assert(std::atomic<int32_t>::is_always_lock_free, "needs address-free atomics");

class Segment {
 public:
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // A new segment of `name` with room for operands of the given sizes, state kWriting.
  static Outcome Create(const std::string& name, const uint64_t bytes[kOperands],
                        std::unique_ptr<Segment>* out);
  // Opens `name` if it exists and its creator has sized it; *out stays empty otherwise.
  static Outcome TryOpen(const std::string& name, std::unique_ptr<Segment>* out);

  SegmentHeader* header() { return static_cast<SegmentHeader*>(base_); }
  char* operand(int which) { return static_cast<char*>(base_) + header()->offset[which]; }
  const std::string& name() const { return name_; }
  // Removes the name (idempotent; the memory stays mapped until destruction).
  void Unlink();

  // Sets `state` with `message`; the message is written before the state is published.
  void Finish(int32_t state, const std::string& message);

 private:
  Segment(std::string name, void* base, size_t size) : name_(std::move(name)), base_(base),
                                                        size_(size) {}
  std::string name_;
  void* base_;
  size_t size_;
  bool unlinked_ = false;
};

std::string SegmentName(int64_t job, const std::string& call, int64_t sequence, int position);
// The next run of `call` in this process (0, 1, ...).
int64_t NextSequence(const std::string& call);
// False only when the process is known to be gone.
bool ProcessAlive(int64_t pid);

// The multi-process protocol (protocol.h): the participant at mesh `position` of a call whose
// `job` is set; `error` is what its own checks found ("" when none). Position 0 leads.
ffi::Error AcrossProcesses(const Operands& o, const Problem& p, Device& dev, Backend& backend,
                           int32_t position, std::string error);

// Sleeps a little longer each time, up to 1 ms: short calls stay fast, long waits stay cheap.
class Backoff {
 public:
  void Wait();

 private:
  std::chrono::microseconds delay_{20};
};

}  // namespace jaxmg

#endif  // JAXMG_CROSSPROCESS_H_
