#include "crossprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
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

Outcome Segment::Create(const std::string& name, const uint64_t bytes[3],
                        std::unique_ptr<Segment>* out) {
  uint64_t offset = Aligned(sizeof(SegmentHeader));
  uint64_t offsets[3];
  for (int i = 0; i < 3; ++i) {
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
  for (int i = 0; i < 3; ++i) {
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

}  // namespace jaxmg
