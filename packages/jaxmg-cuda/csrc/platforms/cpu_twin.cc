// The CPU twin: the backend of base/backend.h with the LAPACK twin (engines/lapack_twin.cc) as the
// library, so CI runs the multi-device machinery of the GPU path (meeting/protocol.cc,
// meeting/crossprocess.cc) on simulated CPU devices.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/backend.h"
#include "base/common.h"
#include "base/test_hooks.h"
#include "engines/lapack_twin.h"
#include "meeting/protocol.h"
#include "platforms/platforms.h"

namespace jaxmg {
namespace {

// --- sharing by handle, for tests ---------------------------------------------------------
// With JAXMG_TEST_SHARE_BY_HANDLE=1 the CPU twin takes the GPU branch of the cross-process
// protocol (meeting/crossprocess.h): a participant shares its buffers by handle instead of by copy,
// and the leader "maps" them. Here a handle is (pid, address); mapping reads the other
// process's memory with process_vm_readv into a buffer of the leader's, and unmapping writes
// it back with process_vm_writev, as CUDA IPC would leave the results in place. It lets CI run
// the by-handle code (attach, per-device workspace, release before the end is announced, no
// copy back) that the GPU path shares; CUDA's own calls are not exercised.

struct TestHandle {
  int64_t pid;
  uint64_t address;
};
static_assert(sizeof(TestHandle) <= sizeof(SharedMemory::handle));

// Moves `bytes` between this process's `local` and `remote` in process `pid`, whole.
bool MoveAcross(bool write, int64_t pid, unsigned char* local, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec mine{local + done, bytes - done};
    iovec theirs{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t moved = write
                              ? process_vm_writev(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0)
                              : process_vm_readv(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0);
    if (moved <= 0) return false;
    done += static_cast<size_t>(moved);
  }
  return true;
}

class CpuBackend final : public Backend {
 public:
  Outcome WorkspaceBytes(const MgCall& c, std::vector<int64_t>* bytes) override {
    bytes->assign(c.a.size(), 0);
    return LapackWorkspaceBytes(c, &(*bytes)[0]);  // LAPACK runs on position 0's memory
  }

  Outcome Run(const MgCall& c, int* info) override { return LapackRun(c, info); }

  Outcome CopyAll(const std::vector<Copy>& copies) override {
    for (const Copy& c : copies) std::memcpy(c.dst, c.src, c.bytes);
    return {};
  }

  Outcome AllocateOn(int, size_t bytes, void** out, Keep* keep) override {
    std::shared_ptr<unsigned char[]> memory(new (std::nothrow) unsigned char[bytes]);
    if (!memory) return Outcome::Fail("out of host memory");
    *out = memory.get();
    *keep = memory;
    return {};
  }
  Outcome MapShared(const SharedMemory& shared, int* device, void** out, Keep* keep) override {
    TestHandle h;
    std::memcpy(&h, shared.handle, sizeof(h));
    const size_t bytes = static_cast<size_t>(shared.bytes);
    std::shared_ptr<unsigned char[]> local(new (std::nothrow) unsigned char[bytes]);
    if (!local) return Outcome::Fail("out of host memory");
    const uint64_t remote = h.address + shared.offset;
    if (!MoveAcross(false, h.pid, local.get(), remote, bytes))
      return Outcome::Fail(std::string("process_vm_readv: ") + std::strerror(errno));
    *device = -1;
    *out = local.get();
    const int64_t pid = h.pid;
    *keep = Keep(local.get(), [local, pid, remote, bytes](void*) {
      MoveAcross(true, pid, local.get(), remote, bytes);  // a failure shows as wrong results
    });
    return {};
  }
  Outcome SynchronizeAll(const std::vector<int>&) override { return {}; }
};

class CpuDevice final : public Device {
 public:
  int ordinal() const override { return -1; }
  Outcome ReadPosition(const int32_t* src, int32_t* out) override {
    *out = *src;
    return {};
  }
  Outcome Copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  Outcome Upload(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
    return {};
  }
  Outcome FillBytes(void* dst, int byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
    return {};
  }
  Outcome Allocate(size_t bytes, void** out) override {
    std::unique_ptr<unsigned char[]> memory(new (std::nothrow) unsigned char[bytes]);
    if (!memory) return Outcome::Fail("out of host memory");
    *out = memory.get();
    memory_.push_back(std::move(memory));
    return {};
  }
  Outcome Synchronize() override { return {}; }
  bool SharesByHandle() const override { return by_handle_; }
  Outcome Share(void* data, size_t bytes, SharedMemory* out) override {
    const TestHandle h{static_cast<int64_t>(getpid()), reinterpret_cast<uint64_t>(data)};
    std::memcpy(out->handle, &h, sizeof(h));
    out->offset = 0;
    out->bytes = bytes;
    std::snprintf(out->bus_id, sizeof(out->bus_id), "cpu-%d", static_cast<int>(getpid()));
    return {};
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> memory_;  // freed when the handler returns
  bool by_handle_ = ShareByHandleForTests();
};

}  // namespace

ffi::Future RunOnCpu(const Operands& o) {
  ffi::Promise promise;
  ffi::Future future(promise);
  CpuDevice device;
  CpuBackend backend;
  if (o.job != 0) {
    // One participant per process (meeting/crossprocess.h): it waits on its own thread.
    ffi::Error error = Participate(o, device, backend, /*max_participants=*/0);
    if (error.success()) {
      promise.SetAvailable();
    } else {
      promise.SetError(std::move(error));
    }
    return future;
  }
  ParticipateWithoutWaiting(o, device, backend, [promise](const Outcome& r) mutable {
    if (r.ok) {
      promise.SetAvailable();
    } else {
      promise.SetError(Fail(r.message));
    }
  });
  return future;
}

}  // namespace jaxmg
