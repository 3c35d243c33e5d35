#include "meeting/crossprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <vector>
#include <string>
#include <sstream>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace jaxmg {
namespace {

constexpr uint64_t kAlign = 64;
uint64_t Aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

std::string Errno(const std::string& what, const std::string& name) {
  return "jaxmg: " + what + " of shared memory " + name + ": " + std::strerror(errno);
}

// Why `bytes` of shared memory could not be reserved, and what to do about it. POSIX shared
// memory lives in /dev/shm on Linux, a tmpfs that containers often keep small (Docker: 64 MiB).
std::string NoRoom(const std::string& name, uint64_t bytes, int error) {
  std::string free_space = "an unknown amount";
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t unit = fs.f_frsize != 0 ? fs.f_frsize : fs.f_bsize;
    free_space = std::to_string(static_cast<uint64_t>(fs.f_bavail) * unit) + " bytes free of " +
                 std::to_string(static_cast<uint64_t>(fs.f_blocks) * unit);
  }
  return "jaxmg: cannot reserve " + std::to_string(bytes) + " bytes of shared memory for " +
         name + ": " + std::strerror(error) + "; /dev/shm has " + free_space +
         ". Give /dev/shm more room (e.g. docker run --shm-size=..., or remount /dev/shm with a "
         "larger size=), or make fewer or smaller jaxmg calls at a time across processes.";
}

// Closes a file descriptor on every path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

Segment::~Segment() {
  if (base_ != nullptr) munmap(base_, size_);
}

Outcome Segment::Create(const std::string& name, const uint64_t bytes[kOperands],
                        std::unique_ptr<Segment>* out) {
  uint64_t offset = Aligned(sizeof(SegmentHeader));
  uint64_t offsets[kOperands];
  for (int i = 0; i < kOperands; ++i) {
    offsets[i] = offset;
    offset += Aligned(bytes[i]);
  }
  Fd fd{shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (fd.fd < 0) return Outcome::Fail(Errno("creation", name));
  // Reserved, not merely sized: ftruncate would make a sparse file that a full /dev/shm turns
  // into SIGBUS at the first touch of a page. tmpfs allocates every page first and sets the
  // size last, all or nothing, so a reader that sees a nonzero size sees the final one.
  int error;
  do {
    error = posix_fallocate(fd.fd, 0, static_cast<off_t>(offset));  // returns, not errno
  } while (error == EINTR);
  if (error != 0) {
    shm_unlink(name.c_str());
    return Outcome::Fail(NoRoom(name, offset, error));
  }
  void* base = mmap(nullptr, offset, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) {
    Outcome failed = Outcome::Fail(Errno("mapping", name));
    shm_unlink(name.c_str());
    return failed;
  }
  std::unique_ptr<Segment> segment(new Segment(name, base, offset));
  // The memory is zero-filled, so the state already reads kWriting (0) to an early reader.
  SegmentHeader* h = segment->header();
  h->pid = static_cast<int32_t>(getpid());
  h->total_bytes = offset;
  for (int i = 0; i < kOperands; ++i) {
    h->offset[i] = offsets[i];
    h->bytes[i] = bytes[i];
  }
  *out = std::move(segment);
  return {};
}

Outcome Segment::TryOpen(const std::string& name, std::unique_ptr<Segment>* out) {
  out->reset();
  Fd fd{shm_open(name.c_str(), O_RDWR, 0600)};
  if (fd.fd < 0) {
    return errno == ENOENT ? Outcome{} : Outcome::Fail(Errno("opening", name));
  }
  struct stat st;
  if (fstat(fd.fd, &st) != 0) return Outcome::Fail(Errno("fstat", name));
  if (st.st_uid != geteuid())
    return Outcome::Fail("jaxmg: shared memory " + name + " belongs to another user");
  if (static_cast<uint64_t>(st.st_size) < sizeof(SegmentHeader)) return {};  // not sized yet
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) return Outcome::Fail(Errno("mapping", name));
  out->reset(new Segment(name, base, size));
  return {};
}

void Segment::Unlink() {
  if (!unlinked_) shm_unlink(name_.c_str());  // ENOENT: the leader removed it already
  unlinked_ = true;
}

void Segment::Finish(int32_t state, const std::string& message) {
  std::snprintf(header()->message, sizeof(header()->message), "%s", message.c_str());
  header()->state.store(state, std::memory_order_release);
}

std::string SegmentName(int64_t job, const std::string& call, int64_t sequence, int position) {
  // The call key holds characters that are not allowed in a name: use its hash.
  char name[128];
  std::snprintf(name, sizeof(name), "/jaxmg-%u-%016llx-%016zx-%lld-%d",
                static_cast<unsigned>(geteuid()), static_cast<unsigned long long>(job),
                std::hash<std::string>()(call), static_cast<long long>(sequence), position);
  return name;
}

int64_t NextSequence(const std::string& call) {
  static std::mutex mu;
  static auto* counters = new std::map<std::string, int64_t>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  return (*counters)[call]++;
}

bool ProcessAlive(int64_t pid) {
  if (pid <= 0) return true;  // unknown: rely on the deadline
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A killed process that its parent has not reaped yet is a zombie: it exists, but it is
  // gone for us. Linux tells by the state letter after the command name in /proc/PID/stat.
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no procfs: rely on kill() and the deadline
  char text[512];
  const size_t got = std::fread(text, 1, sizeof(text) - 1, f);
  std::fclose(f);
  text[got] = '\0';
  const char* end = std::strrchr(text, ')');
  return end == nullptr || end[1] != ' ' || (end[2] != 'Z' && end[2] != 'X');
}

void Backoff::Wait() {
  std::this_thread::sleep_for(delay_);
  delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
}

// --- the protocol of the multi-process mode ------------------------------------------------

namespace {

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
    slot->a = segment.operand(kSegmentA);
    slot->b = segment.operand(kSegmentB);
    slot->ipiv = segment.operand(kSegmentIpiv);
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
  if (r.ok && PivotBytes(o, p) > 0) {
    int device_ipiv = -1;
    keep->emplace_back();
    r = backend.MapShared(h->shared[2], &device_ipiv, &slot->ipiv, &keep->back());
    if (r.ok && device_ipiv != slot->device)
      r = Outcome::Fail("the pivots and A of " + Who(o, q) + " are on different GPUs");
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
  slots[0].ipiv = o.ipiv;
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
      if (o.routine->eigenvalues)
        std::memcpy(segments[q]->operand(kSegmentW), w_host.data(), w_host.size());
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
  const uint64_t ipiv_bytes = PivotBytes(o, p);
  SharedMemory shared[3] = {};
  if (error.empty() && by_handle) {
    Outcome r = dev.Share(o.a_out, a_bytes, &shared[0]);
    if (r.ok && b_bytes > 0) r = dev.Share(o.x_out, b_bytes, &shared[1]);
    if (r.ok && ipiv_bytes > 0) r = dev.Share(o.ipiv, ipiv_bytes, &shared[2]);
    if (!r.ok) error = std::string(o.target) + ": mesh position " + std::to_string(position) +
                       ": " + r.message;
  }
  const bool ok = error.empty();
  const bool copies = ok && !by_handle;
  uint64_t bytes[kOperands] = {copies ? a_bytes : 0, copies ? b_bytes : 0, 0,
                               copies ? ipiv_bytes : 0};
  if (ok && o.routine->eigenvalues)
    bytes[kSegmentW] = static_cast<uint64_t>(p.n) * RealElementSize(p.dtype);
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
    std::memcpy(segment->operand(kSegmentA), o.a_out, bytes[kSegmentA]);
    if (bytes[kSegmentB] > 0) std::memcpy(segment->operand(kSegmentB), o.x_out, bytes[kSegmentB]);
    if (bytes[kSegmentIpiv] > 0)
      std::memcpy(segment->operand(kSegmentIpiv), o.ipiv, bytes[kSegmentIpiv]);
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
    if (o.routine->result != Result::kUnchanged)
      std::memcpy(o.a_out, segment->operand(kSegmentA), bytes[kSegmentA]);
    if (bytes[kSegmentB] > 0) std::memcpy(o.x_out, segment->operand(kSegmentB), bytes[kSegmentB]);
    if (o.routine->pivots == Pivots::kOut)
      std::memcpy(o.ipiv, segment->operand(kSegmentIpiv), bytes[kSegmentIpiv]);
  }
  const char* w = segment->operand(kSegmentW);
  std::vector<unsigned char> w_host(w, w + bytes[kSegmentW]);
  Outcome r = WriteOutputs(o, p, dev, h->info, w_host);
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

}  // namespace

ffi::Error AcrossProcesses(const Operands& o, const Problem& p, Device& dev, Backend& backend,
                           int32_t position, std::string error) {
  const std::string call = MeetingKey(o.target, o.device_ids, o.call_id, o.instance);
  const int64_t sequence = NextSequence(call);  // on every path: the processes stay in step
  if (position < 0 || position >= static_cast<int32_t>(o.device_ids.size()) ||
      o.pids.size() != o.device_ids.size()) {
    return Fail(error.empty() ? std::string(o.target) + ": malformed multi-process call" : error);
  }
  if (position == 0) return LeadAcrossProcesses(o, p, dev, backend, call, sequence, error);
  return JoinAcrossProcesses(o, p, dev, position, call, sequence, error);
}

}  // namespace jaxmg
