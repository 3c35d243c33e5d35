// The CPU twin: the backend of backend.h with LAPACK (scipy's cython_lapack capsules,
// registered at import) as the library. The leader gathers every position's tiles into one
// column-major N x N matrix in position 0's workspace, calls LAPACK on the lower triangle and
// scatters the result back. Everything else is the shared protocol (protocol.cc), so CI runs
// the multi-device machinery of the GPU path on simulated CPU devices.
#include "cpu_twin.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include "backend.h"
#include "common.h"
#include "protocol.h"

namespace jaxmg {
namespace {

// --- LAPACK entry points, one table filled at import, typed per dtype once ---------------

std::map<std::string, void*>& LapackTable() {
  static auto* table = new std::map<std::string, void*>();
  return *table;
}

template <typename T> struct Prefix;
template <> struct Prefix<float> { static constexpr char value = 's'; };
template <> struct Prefix<double> { static constexpr char value = 'd'; };
template <> struct Prefix<std::complex<float>> { static constexpr char value = 'c'; };
template <> struct Prefix<std::complex<double>> { static constexpr char value = 'z'; };

template <typename T> struct RealOf { using type = T; };
template <typename R> struct RealOf<std::complex<R>> { using type = R; };
template <typename T>
constexpr bool kIsComplex = !std::is_same_v<T, typename RealOf<T>::type>;

template <typename T>
struct Lapack {
  using R = typename RealOf<T>::type;
  using Potrf = void (*)(char*, int*, T*, int*, int*);  // also potri
  using Potrs = void (*)(char*, int*, int*, T*, int*, T*, int*, int*);
  using Syevd = void (*)(char*, char*, int*, T*, int*, R*, T*, int*, int*, int*, int*);
  using Heevd = void (*)(char*, char*, int*, T*, int*, R*, T*, int*, R*, int*, int*, int*,
                         int*);

  template <typename Fn>
  static Outcome Get(const char* stem, Fn* fn) {
    const std::string name = std::string(1, Prefix<T>::value) + stem;
    auto it = LapackTable().find(name);
    if (it == LapackTable().end() || it->second == nullptr)
      return Outcome::Fail("jaxmg: LAPACK routine " + name +
                           " is not registered (jaxmg_cuda registers scipy's LAPACK at import)");
    *fn = reinterpret_cast<Fn>(it->second);
    return {};
  }
};

// LAPACK's workspace for ?syevd / ?heevd, in elements of T, R and int.
struct EigWork {
  int lwork = 0, lrwork = 0, liwork = 0;
};

// A workspace size LAPACK's query returned as a floating-point number, rounded up (a float
// may round it down), plus one, narrowed to LAPACK's int.
template <typename R>
Outcome QueriedSize(R value, const std::string& what, int* out) {
  const double size = std::ceil(static_cast<double>(value)) + 1;
  if (size >= 0 && size < 9.2e18) return NarrowToInt(static_cast<int64_t>(size), what, out);
  // NaN, negative or beyond int64_t: no conversion is defined, say so directly.
  return Outcome::Fail(what + "=" + std::to_string(size) + " from LAPACK's workspace query " +
                       "does not fit the library's 32-bit int argument");
}

template <typename T>
Outcome QueryEig(int n, bool vectors, EigWork* out) {
  using L = Lapack<T>;
  using R = typename L::R;
  char jobz = vectors ? 'V' : 'N', uplo = 'L';
  int lda = std::max(n, 1), info = 0, lwork = -1, lrwork = -1, liwork = -1, iwork = 0;
  T work{};
  R rwork{};
  if constexpr (kIsComplex<T>) {
    typename L::Heevd heevd = nullptr;
    if (Outcome r = L::Get("heevd", &heevd); !r.ok) return r;
    heevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &lwork, &rwork, &lrwork, &iwork,
          &liwork, &info);
    if (Outcome r = QueriedSize(rwork, std::string(1, Prefix<T>::value) + "heevd lrwork",
                                &out->lrwork);
        !r.ok)
      return r;
  } else {
    typename L::Syevd syevd = nullptr;
    if (Outcome r = L::Get("syevd", &syevd); !r.ok) return r;
    syevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &lwork, &iwork, &liwork, &info);
  }
  if (info != 0) return Outcome::Fail("jaxmg: LAPACK workspace query failed, info " +
                                      std::to_string(info));
  const char* routine = kIsComplex<T> ? "heevd" : "syevd";
  if (Outcome r = QueriedSize(std::real(work), Prefix<T>::value + std::string(routine) + " lwork",
                              &out->lwork);
      !r.ok)
    return r;
  out->liwork = std::max(iwork, 1);
  return {};
}

constexpr size_t kAlign = 64;
size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Position 0's workspace: the gathered N x N matrix, then LAPACK's own work arrays.
template <typename T>
Outcome WorkspaceLayout(const MgCall& c, size_t* total, EigWork* eig) {
  using R = typename RealOf<T>::type;
  size_t bytes = Aligned(sizeof(T) * static_cast<size_t>(c.n) * c.n);
  if (c.op == Op::kSyevd) {
    if (Outcome r = QueryEig<T>(c.n, c.vectors, eig); !r.ok) return r;
    bytes += Aligned(sizeof(T) * eig->lwork) + Aligned(sizeof(R) * eig->lrwork) +
             Aligned(sizeof(int) * eig->liwork);
  }
  *total = bytes;
  return {};
}

template <typename T>
void Gather(const MgCall& c, T* full) {
  const int64_t ndev = static_cast<int64_t>(c.a.size());
  for (int64_t d = 0; d < ndev; ++d) {
    const T* local = static_cast<const T*>(c.a[d]);
    ForEachTile(c.n, c.tile, ndev, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(full + g * c.lda, local + l * c.lda, sizeof(T) * w * c.lda);
    });
  }
}

template <typename T>
void Scatter(const MgCall& c, const T* full) {
  const int64_t ndev = static_cast<int64_t>(c.a.size());
  for (int64_t d = 0; d < ndev; ++d) {
    T* local = static_cast<T*>(c.a[d]);
    ForEachTile(c.n, c.tile, ndev, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(local + l * c.lda, full + g * c.lda, sizeof(T) * w * c.lda);
    });
  }
}

// LAPACK's info < 0: argument -info of the routine was illegal. That is a fault of jaxmg's
// call, not of the user's matrix, so it is an error on every participant, never a status.
template <typename T>
Outcome IllegalArgument(const char* routine, int info) {
  return Outcome::Fail("jaxmg: LAPACK " + std::string(1, Prefix<T>::value) + routine +
                       " rejected argument " + std::to_string(-info) + " as illegal (info=" +
                       std::to_string(info) + "): a bug in jaxmg, please report it");
}

// The typed implementation: one library call for all positions.
template <typename T>
Outcome RunImpl(const MgCall& c, int* info) {
  using L = Lapack<T>;
  using R = typename L::R;
  T* full = static_cast<T*>(c.work[0]);
  char uplo = 'L';
  int n = c.n, lda = c.lda;
  // Test hook: an illegal leading dimension for the library call, to provoke info < 0.
  const char* bad_lda = std::getenv("JAXMG_TEST_ILLEGAL_LDA");
  int lib_lda = bad_lda != nullptr && std::strcmp(bad_lda, "1") == 0 ? 0 : lda;
  *info = 0;
  Gather<T>(c, full);
  if (c.op == Op::kPotrs || c.op == Op::kPotri) {
    typename L::Potrf potrf = nullptr;
    if (Outcome r = L::Get("potrf", &potrf); !r.ok) return r;
    potrf(&uplo, &n, full, &lib_lda, info);
    if (*info < 0) return IllegalArgument<T>("potrf", *info);
    if (*info == 0 && c.op == Op::kPotrs && c.nrhs > 0) {
      typename L::Potrs potrs = nullptr;
      if (Outcome r = L::Get("potrs", &potrs); !r.ok) return r;
      int nrhs = c.nrhs;
      potrs(&uplo, &n, &nrhs, full, &lib_lda, static_cast<T*>(c.b[0]), &lda, info);
      if (*info < 0) return IllegalArgument<T>("potrs", *info);
    }
    if (*info == 0 && c.op == Op::kPotri) {
      typename L::Potrf potri = nullptr;
      if (Outcome r = L::Get("potri", &potri); !r.ok) return r;
      potri(&uplo, &n, full, &lib_lda, info);
      if (*info < 0) return IllegalArgument<T>("potri", *info);
    }
  } else {
    EigWork eig;
    size_t total = 0;
    if (Outcome r = WorkspaceLayout<T>(c, &total, &eig); !r.ok) return r;
    char* next = reinterpret_cast<char*>(full) + Aligned(sizeof(T) * static_cast<size_t>(n) * n);
    T* work = reinterpret_cast<T*>(next);
    next += Aligned(sizeof(T) * eig.lwork);
    R* rwork = reinterpret_cast<R*>(next);
    next += Aligned(sizeof(R) * eig.lrwork);
    int* iwork = reinterpret_cast<int*>(next);
    char jobz = c.vectors ? 'V' : 'N';
    R* w = static_cast<R*>(c.w);
    if constexpr (kIsComplex<T>) {
      typename L::Heevd heevd = nullptr;
      if (Outcome r = L::Get("heevd", &heevd); !r.ok) return r;
      heevd(&jobz, &uplo, &n, full, &lib_lda, w, work, &eig.lwork, rwork, &eig.lrwork, iwork,
            &eig.liwork, info);
    } else {
      typename L::Syevd syevd = nullptr;
      if (Outcome r = L::Get("syevd", &syevd); !r.ok) return r;
      syevd(&jobz, &uplo, &n, full, &lib_lda, w, work, &eig.lwork, iwork, &eig.liwork, info);
    }
    if (*info < 0) return IllegalArgument<T>(kIsComplex<T> ? "heevd" : "syevd", *info);
    if (!c.vectors) return {};  // values only: the eigenvector output is unspecified
  }
  // potrs: the factor; potri: the inverse (lower triangle); syevd: the eigenvectors. On
  // failure the protocol overwrites what it must with NaN.
  Scatter<T>(c, full);
  return {};
}

// --- sharing by handle, for tests ---------------------------------------------------------
// With JAXMG_TEST_SHARE_BY_HANDLE=1 the CPU twin takes the GPU branch of the cross-process
// protocol (crossprocess.h): a participant shares its buffers by handle instead of by copy,
// and the leader "maps" them. Here a handle is (pid, address); mapping reads the other
// process's memory with process_vm_readv into a buffer of the leader's, and unmapping writes
// it back with process_vm_writev, as CUDA IPC would leave the results in place. It lets CI run
// the by-handle code (attach, per-device workspace, release before the end is announced, no
// copy back) that the GPU path shares; CUDA's own calls are not exercised.

bool ShareByHandleForTests() {
  const char* value = std::getenv("JAXMG_TEST_SHARE_BY_HANDLE");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

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
    const ssize_t moved = write ? process_vm_writev(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0)
                                : process_vm_readv(static_cast<pid_t>(pid), &mine, 1, &theirs, 1, 0);
    if (moved <= 0) return false;
    done += static_cast<size_t>(moved);
  }
  return true;
}

class CpuBackend final : public Backend {
 public:
  Outcome WorkspaceBytes(const MgCall& c, std::vector<int64_t>* bytes) override {
    size_t total = 0;
    EigWork eig;
    Outcome r;
    switch (c.dtype) {
      case Dtype::kF32: r = WorkspaceLayout<float>(c, &total, &eig); break;
      case Dtype::kF64: r = WorkspaceLayout<double>(c, &total, &eig); break;
      case Dtype::kC64: r = WorkspaceLayout<std::complex<float>>(c, &total, &eig); break;
      case Dtype::kC128: r = WorkspaceLayout<std::complex<double>>(c, &total, &eig); break;
    }
    bytes->assign(c.a.size(), 0);
    (*bytes)[0] = static_cast<int64_t>(total);  // LAPACK runs on position 0's memory
    return r;
  }

  Outcome Run(const MgCall& c, int* info) override {
    switch (c.dtype) {
      case Dtype::kF32: return RunImpl<float>(c, info);
      case Dtype::kF64: return RunImpl<double>(c, info);
      case Dtype::kC64: return RunImpl<std::complex<float>>(c, info);
      case Dtype::kC128: return RunImpl<std::complex<double>>(c, info);
    }
    return Outcome::Fail("jaxmg: unknown dtype");
  }

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

ffi::Error Run(const Operands& o) {
  CpuDevice device;
  CpuBackend backend;
  return Participate(o, device, backend, /*max_participants=*/0);
}

}  // namespace

void RegisterLapack(const std::string& name, void* fn) { LapackTable()[name] = fn; }

// --- handlers: operands in the order the Python wrappers pass them --------------------------

ffi::Error PotrsCpu(ffi::RunId run, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Buffer<ffi::S32> position,
                    ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::AnyBuffer> x,
                    ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                    ffi::Span<const int64_t> device_ids, int64_t call_id, int64_t job,
                    ffi::Span<const int64_t> pids, ffi::Span<const int64_t> to_cyclic,
                    ffi::Span<const int64_t> from_cyclic) {
  Operands o = PotrsOperands(a, b, position, a_out, x, status, tile, device_ids, call_id);
  return Run(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run));
}

ffi::Error PotriCpu(ffi::RunId run, ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                    ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::Buffer<ffi::S32>> status,
                    int64_t tile, ffi::Span<const int64_t> device_ids, int64_t call_id,
                    int64_t job, ffi::Span<const int64_t> pids,
                    ffi::Span<const int64_t> to_cyclic, ffi::Span<const int64_t> from_cyclic) {
  Operands o = PotriOperands(a, position, a_out, status, tile, device_ids, call_id);
  return Run(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run));
}

ffi::Error SyevdCpu(ffi::RunId run, ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                    ffi::Result<ffi::AnyBuffer> v, ffi::Result<ffi::AnyBuffer> w,
                    ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                    ffi::Span<const int64_t> device_ids, int64_t call_id, bool vectors,
                    int64_t job, ffi::Span<const int64_t> pids,
                    ffi::Span<const int64_t> to_cyclic, ffi::Span<const int64_t> from_cyclic) {
  Operands o = SyevdOperands(a, position, v, w, status, tile, device_ids, call_id, vectors);
  return Run(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run));
}

// A diagnostic target: all participants meet; out = [participants, distinct threads seen].
// Used by the tests to show that XLA runs the handlers of one call concurrently.
ffi::Error ProbeCpu(ffi::RunId run, ffi::Buffer<ffi::S32> position,
                    ffi::Result<ffi::Buffer<ffi::S32>> out,
                    ffi::Span<const int64_t> device_ids, int64_t call_id) {
  const int ndev = static_cast<int>(std::max<size_t>(device_ids.size(), 1));
  auto meeting = Registry::Get().Join(MeetingKey("jaxmg_probe", device_ids, call_id, run.run_id),
                                      ndev, /*exact=*/true);
  const int32_t pos = position.typed_data()[0];
  Slot slot;
  slot.thread = std::hash<std::thread::id>()(std::this_thread::get_id());
  Outcome own;
  if (pos < 0 || pos >= ndev || !meeting->Claim(pos, slot))
    own = Outcome::Fail("jaxmg_probe: bad or duplicate position " + std::to_string(pos));
  Outcome r = meeting->Phase(0, own, [&] {
    std::set<uint64_t> threads;
    for (const Slot& s : meeting->Slots()) threads.insert(s.thread);
    meeting->info = static_cast<int32_t>(threads.size());
    return Outcome{};
  });
  if (!r.ok) return Fail(r.message);
  out->typed_data()[0] = ndev;
  out->typed_data()[1] = meeting->info;
  return ffi::Error::Success();
}

}  // namespace jaxmg

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotrsCpu, jaxmg::PotrsCpu,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()                  // the execution
                                  .Arg<xla::ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<xla::ffi::AnyBuffer>()              // b [nrhs, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // position []
                                  .Ret<xla::ffi::AnyBuffer>()              // factor, aliases a
                                  .Ret<xla::ffi::AnyBuffer>()              // x, aliases b
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()  // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<int64_t>("job")                    // 0: one process
                                  .Attr<xla::ffi::Span<const int64_t>>("pids")
                                  .Attr<xla::ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<xla::ffi::Span<const int64_t>>("from_cyclic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotriCpu, jaxmg::PotriCpu,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()                  // the execution
                                  .Arg<xla::ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // position []
                                  .Ret<xla::ffi::AnyBuffer>()              // inverse, aliases a
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()  // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<int64_t>("job")                    // 0: one process
                                  .Attr<xla::ffi::Span<const int64_t>>("pids")
                                  .Attr<xla::ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<xla::ffi::Span<const int64_t>>("from_cyclic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgSyevdCpu, jaxmg::SyevdCpu,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()                  // the execution
                                  .Arg<xla::ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // position []
                                  .Ret<xla::ffi::AnyBuffer>()              // vectors, aliases a
                                  .Ret<xla::ffi::AnyBuffer>()              // w [N] real
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()  // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<bool>("vectors")
                                  .Attr<int64_t>("job")                    // 0: one process
                                  .Attr<xla::ffi::Span<const int64_t>>("pids")
                                  .Attr<xla::ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<xla::ffi::Span<const int64_t>>("from_cyclic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgProbeCpu, jaxmg::ProbeCpu,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()                  // the execution
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // position []
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()  // [ndev, threads]
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));
