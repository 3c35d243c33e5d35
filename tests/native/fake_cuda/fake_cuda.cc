// fakecuda: a strict host-memory emulator of the CUDA runtime, driver and cuSolverMg entry
// points that jaxmg dlopens (packages/jaxmg-cuda/csrc/vendor/cuda_api.h), for CI machines
// without a GPU.
//
// THIS IS NOT A MODEL OF WHAT REAL CUDA OR cuSolverMg DO. It runs jaxmg's CUDA plumbing and
// flags plumbing bugs: a pointer on the wrong device, a missing stream synchronisation (async
// work runs only at a sync point), a descriptor that does not match its pointer arrays, a
// workspace that is too small or whose contents are relied on, leaks, unbalanced IPC
// open/close. Every misuse is a "violation": recorded, printed to stderr, and the call fails.
// The numbers come from naive dense algorithms in double precision (Cholesky, triangular
// inverse, cyclic Jacobi, unblocked LU with partial pivoting): good enough to check results,
// not cuSolverMg's rounding. Only the lower triangle (uplo = LOWER) and square getrf (M == N)
// are emulated, because that is all jaxmg uses.
//
// Where real cuSolverMg refuses a call, the emulator refuses it the same way; each such rule
// names its source: NVIDIA's documentation or samples, or what cuSolverMg 12.0.4 (CUDA 13) did
// on an H100 (issue 24, design.md section 9):
// - getrs takes CUBLAS_OP_N alone: T and C gave info = -1 (the H100);
// - getrf refuses a column tile (T_A) of 1024 or more: info = -6, descrA (the H100, at N = 2048,
//   4096 and 8192; 256 and 512 worked);
// - syevd takes tiles up to 1024 (the H100 ran 256 to 1024; the cuSolverMg-era jaxmg reported
//   that it rejects larger ones, design.md section 5; how is not known: a violation here);
// - the fill mode is CUBLAS_FILL_MODE_LOWER (NVIDIA's cuSolverMg samples use LOWER only);
// - one GPU may be listed several times in a device list (the H100: listed 2, 3, 4 and 8
//   times, 54 of 54 cases right).
// XLA's scratch allocator refusing alignments over 16 is emulated by jaxmg's own test hook
// (RunCudaOnHost, csrc/testing/cuda_testing.cc), since XLA, not CUDA, hands that memory out.
//
// fake_cusolvermp.cc, built into the same library, emulates the NCCL and cuSOLVERMp functions
// (csrc/vendor/cusolvermp_api.h) on these devices and streams, with MKL's ScaLAPACK over MPI
// for the numbers;
// it reaches this file's state through fake_cuda.h.
//
// Build as one library and make libcudart.so.13, libcusolverMg.so.12, libcuda.so.1,
// libcusolverMp.so.0 and libnccl.so.2 links to it:
//   c++ -std=c++17 -O1 -g -shared -fPIC -Wl,-soname,libfakecuda.so -o libfakecuda.so
//       -I ../../../packages/jaxmg-cuda/csrc fake_cuda.cc fake_cusolvermp.cc -lpthread -ldl
// FAKECUDA_DEVICES (1..16, default 16) sets the number of emulated devices.
// FAKECUDA_NOT_PD_STATUS, FAKECUDA_NOT_PD_ZERO_INFO: see cusolverMgPotrf below.
// FAKECUDA_PEER_ERROR=e: cudaDeviceEnablePeerAccess fails with cudaError e (e.g. 711,
// cudaErrorTooManyPeers), and copies between devices without peer access are allowed, as real
// CUDA stages them through host memory.
#include "fake_cuda.h"

#include <fcntl.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using cplx = std::complex<double>;
using Mat = std::vector<cplx>;  // dense, column-major

constexpr int kMaxDevices = 16;
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;          // cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE
constexpr int kMemoryAllocation = 2;      // cudaErrorMemoryAllocation
constexpr int kInvalidDevice = 101;       // cudaErrorInvalidDevice
constexpr int kPeerAlreadyEnabled = 704;  // cudaErrorPeerAccessAlreadyEnabled
constexpr int kMgInvalidValue = 3;        // CUSOLVER_STATUS_INVALID_VALUE
constexpr int64_t kMaxSyevdTile = 1024;   // see the rules above
constexpr int64_t kMinRefusedGetrfTile = 1024;
constexpr int kH2D = 1, kD2H = 2, kDefault = 4;        // the cudaMemcpyKinds jaxmg uses
constexpr uint64_t kIpcMagic = 0x66616b6563756461ull;  // "fakecuda"

int NumDevices() {
  static const int n = [] {
    const char* env = std::getenv("FAKECUDA_DEVICES");
    return std::clamp(env != nullptr ? std::atoi(env) : kMaxDevices, 1, kMaxDevices);
  }();
  return n;
}
bool ValidDevice(int d) { return d >= 0 && d < NumDevices(); }

thread_local int current = 0;     // cudaSetDevice
thread_local int last_error = 0;  // cudaGetLastError

// Concatenates anything streamable (pass pointers as void*: they print in hex).
template <typename... A>
std::string S(const A&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// Violations: recorded for the test hooks and printed. Callable with or without `mu` held.
std::mutex violations_mu;
auto* violations = new std::vector<std::string>();

void Violation(const char* fn, const std::string& what) {
  std::lock_guard<std::mutex> lock(violations_mu);
  violations->push_back(S(fn, ": ", what));
  std::fprintf(stderr, "fakecuda violation: %s\n", violations->back().c_str());
}

// Collects every problem of one call, then reports them as one violation.
struct Checker {
  const char* fn;
  std::string why;
  bool ok() const { return why.empty(); }
  void Fail(const std::string& s) { why += (why.empty() ? "" : "; ") + s; }
  int Report(int status) const { return Violation(fn, why), status; }
};

// A cudart status, remembered as the thread's last error when it is one.
int Rt(int status) {
  if (status != kSuccess) last_error = status;
  return status;
}
int RtViolation(const char* fn, const std::string& what) { return Violation(fn, what), Rt(1); }

// ---------------------------------------------------------------------------------------------
// Device memory: memfd-backed shared mappings, so another process can map them through
// /proc/<pid>/fd/<fd>. Streams: async work waits in its queue until a sync point runs it.
// Everything here is guarded by `mu`.
struct Alloc {
  size_t size;
  int device;
  int fd;           // own allocations: the memfd; IPC mappings: -1
  pid_t owner;      // the process that called cudaMalloc
  bool own;         // cudaMalloc'd by this process (else an IPC mapping)
  uint64_t serial;  // tells allocations apart across processes
};
struct IpcHandle {  // what the 64 bytes of a cudaIpcMemHandle_t hold
  uint64_t magic, serial, size, base;
  int32_t pid, fd, device;
};
struct HandleBytes {
  char reserved[64];
};
static_assert(sizeof(IpcHandle) <= sizeof(HandleBytes), "IPC handle too large");

struct Op {  // one queued async operation, arguments captured at enqueue
  bool memset;
  char* dst;
  const char* src;             // a device source, read when the op runs
  std::vector<char> snapshot;  // a host source, read at enqueue
  size_t bytes;
  int value;
  std::vector<std::pair<uintptr_t, size_t>> device_ranges;
};
struct Stream {
  int device;
  std::deque<Op> queue;
};

std::mutex mu;
auto* registry = new std::map<uintptr_t, Alloc>();                       // base -> allocation
auto* opens = new std::map<uintptr_t, long>();                           // base -> IPC opens
auto* ipc_maps = new std::map<std::pair<pid_t, uint64_t>, uintptr_t>();  // (pid, serial) -> base
auto* peers = new std::set<std::pair<int, int>>();                       // (device, peer)
auto* streams = new std::set<Stream*>();
uint64_t next_serial = 1;
long solver_calls = 0;
// Devices on which a cuSolverMg call may still be running: the library works on streams of its
// own, so its results are only safe to touch after cudaDeviceSynchronize on each device.
auto* library_busy = new std::set<int>();

int PeerError() {
  static const int e = [] {
    const char* env = std::getenv("FAKECUDA_PEER_ERROR");
    return env != nullptr ? std::atoi(env) : 0;
  }();
  return e;
}

// The allocation holding p, or nullptr (host memory).
const Alloc* Find(const void* p, uintptr_t* base = nullptr) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = registry->upper_bound(addr);
  if (it == registry->begin() || addr >= std::prev(it)->first + std::prev(it)->second.size)
    return nullptr;
  if (base != nullptr) *base = std::prev(it)->first;
  return &std::prev(it)->second;
}
int DeviceOf(const void* p) {
  const Alloc* a = Find(p);
  return a != nullptr ? a->device : -1;
}
bool InOne(const void* p, size_t bytes) {  // [p, p + bytes) inside one allocation
  uintptr_t base = 0;
  const Alloc* a = Find(p, &base);
  return a != nullptr && reinterpret_cast<uintptr_t>(p) - base + bytes <= a->size;
}
long PendingOn(uintptr_t base, size_t size) {  // queued ops that touch [base, base + size)
  long n = 0;
  for (Stream* s : *streams)
    for (const Op& op : s->queue)
      n += std::any_of(op.device_ranges.begin(), op.device_ranges.end(), [&](auto& r) {
        return r.first < base + size && base < r.first + r.second;
      });
  return n;
}
void Drain(Stream* s) {
  for (; !s->queue.empty(); s->queue.pop_front()) {
    const Op& op = s->queue.front();
    if (op.memset)
      std::memset(op.dst, op.value, op.bytes);
    else
      std::memmove(op.dst, op.snapshot.empty() ? op.src : op.snapshot.data(), op.bytes);
  }
}
Stream* LiveStream(const char* fn, void* stream) {
  auto* s = static_cast<Stream*>(stream);
  if (s == nullptr) Violation(fn, "null (legacy default) stream; jaxmg always passes XLA's");
  else if (streams->count(s) == 0) Violation(fn, S("unknown or destroyed stream ", stream));
  else return s;
  return nullptr;
}

// The checks of cudaMemcpy and cudaMemcpyAsync; stream_device < 0 for the synchronous copy.
bool CheckCopy(Checker& c, void* dst, const void* src, size_t bytes, int kind, int stream_device) {
  const int dd = DeviceOf(dst), sd = DeviceOf(src);
  const std::string where = S(" (dst ", dst, " on ", dd, ", src ", src, " on ", sd,
                              ", -1 = host, ", bytes, " bytes)");
  if (dst == nullptr || src == nullptr) c.Fail("null pointer" + where);
  if (kind == kH2D && (dd < 0 || sd >= 0))
    c.Fail("HostToDevice needs a host source and a device destination" + where);
  if (kind == kD2H && (sd < 0 || dd >= 0))
    c.Fail("DeviceToHost needs a device source and a host destination" + where);
  if (kind != kH2D && kind != kD2H && kind != kDefault) c.Fail(S("cudaMemcpyKind ", kind));
  if (dd >= 0 && !InOne(dst, bytes)) c.Fail("destination runs past its allocation" + where);
  if (sd >= 0 && !InOne(src, bytes)) c.Fail("source runs past its allocation" + where);
  for (int dev : {dd, sd})
    if (library_busy->count(dev) != 0)
      c.Fail(S("memory of device ", dev, " touched while a cuSolverMg call may still run there ",
               "(no cudaDeviceSynchronize on that device after the call)", where));
  if (stream_device < 0 || !c.ok()) return c.ok();
  if (kind == kDefault && dd >= 0 && sd >= 0 && dd != sd) {  // a peer copy
    if (dd != stream_device && sd != stream_device)
      c.Fail(S("peer copy between two devices other than the stream's ", stream_device, where));
    else if (PeerError() == 0 && peers->count({dd, sd}) == 0 && peers->count({sd, dd}) == 0)
      c.Fail("peer copy without cudaDeviceEnablePeerAccess between the devices" + where);
  } else if ((dd >= 0 && dd != stream_device) || (sd >= 0 && sd != stream_device)) {
    c.Fail(S("device memory not on the stream's device ", stream_device, where));
  }
  return c.ok();
}

// ---------------------------------------------------------------------------------------------
// cuSolverMg objects, and element access in their layout.
struct MgHandle {
  std::vector<int> devices;  // cusolverMgDeviceSelect
};
struct Grid {
  std::vector<int> ids;
};
struct Desc {
  int64_t rows, cols, nb;
  int type;
  std::vector<int> ids;  // the grid's devices, copied at creation
};
auto* handles = new std::set<void*>();
auto* grids = new std::set<void*>();
auto* descs = new std::set<void*>();

size_t ElementSize(int type) {
  switch (type) {
    case 0: return 4;   // CUDA_R_32F
    case 1: return 8;   // CUDA_R_64F
    case 4: return 8;   // CUDA_C_32F
    case 5: return 16;  // CUDA_C_64F
    default: return 0;
  }
}

// The four element types, converted to and from complex<double> by one template each.
template <typename T>
cplx LoadT(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return cplx(v);
}
template <typename T>
void StoreT(char* p, cplx v) {
  T out;
  if constexpr (std::is_floating_point_v<T>) out = static_cast<T>(v.real());
  else out = T(v);
  std::memcpy(p, &out, sizeof(T));
}
cplx Load(int type, const char* p) {
  switch (type) {
    case 0: return LoadT<float>(p);
    case 1: return LoadT<double>(p);
    case 4: return LoadT<std::complex<float>>(p);
    default: return LoadT<std::complex<double>>(p);
  }
}
void Store(int type, char* p, cplx v) {
  switch (type) {
    case 0: return StoreT<float>(p, v);
    case 1: return StoreT<double>(p, v);
    case 4: return StoreT<std::complex<float>>(p, v);
    default: return StoreT<std::complex<double>>(p, v);
  }
}

// Element (i, j) of a 1-D column block-cyclic matrix: tile t = j / NB on grid position t % P,
// local column (t / P) * NB + j % NB, leading dimension = rows.
char* At(const Desc& d, void* const* arrays, int64_t i, int64_t j) {
  const int64_t P = static_cast<int64_t>(d.ids.size()), t = j / d.nb;
  const int64_t local = (t / P) * d.nb + j % d.nb;
  return static_cast<char*>(arrays[t % P]) + (i + local * d.rows) * ElementSize(d.type);
}

enum class Part { kLower, kHermitian, kFull };
// The first `ncols` columns, dense. kLower reads the lower triangle and zeroes the rest;
// kHermitian mirrors it into the upper triangle (real diagonal); kFull reads everything.
Mat Gather(const Desc& d, void* const* arrays, int64_t ncols, Part part) {
  const int64_t n = d.rows;
  Mat m(n * ncols);
  for (int64_t j = 0; j < ncols; ++j)
    for (int64_t i = part == Part::kFull ? 0 : j; i < n; ++i) {
      m[i + j * n] = Load(d.type, At(d, arrays, i, j));
      if (part == Part::kHermitian)
        m[j + i * n] = i == j ? m[i + j * n].real() : std::conj(m[i + j * n]);
    }
  return m;
}
void Scatter(const Desc& d, void* const* arrays, int64_t ncols, const Mat& m, bool lower) {
  for (int64_t j = 0; j < ncols; ++j)
    for (int64_t i = lower ? j : 0; i < d.rows; ++i)
      Store(d.type, At(d, arrays, i, j), m[i + j * d.rows]);
}

// ---------------------------------------------------------------------------------------------
// The checks of the solver calls.

// A descriptor and its pointer array: its grid devices selected on the handle, entry p device
// memory on device ids[p] holding every local column p owns among the first `ncols` columns.
const Desc* CheckMatrix(Checker& c, const char* name, void* handle, void* desc,
                        void* const* arrays, int64_t ncols, int type) {
  if (descs->count(desc) == 0)
    return c.Fail(S("unknown or destroyed descriptor of ", name)), nullptr;
  const Desc& d = *static_cast<Desc*>(desc);
  if (d.type != type) c.Fail(S("computeType ", type, " but ", name, " has data type ", d.type));
  if (handles->count(handle) != 0) {
    const std::vector<int>& sel = static_cast<MgHandle*>(handle)->devices;
    for (int id : d.ids)
      if (std::find(sel.begin(), sel.end(), id) == sel.end())
        c.Fail(S(name, "'s grid device ", id, " was not selected on the handle"));
  }
  if (arrays == nullptr) return c.Fail(S("null pointer array for ", name)), &d;
  const int64_t P = static_cast<int64_t>(d.ids.size()), tiles = (ncols + d.nb - 1) / d.nb;
  for (int64_t p = 0; p < P; ++p) {
    const std::string who = S(name, "[", p, "]=", arrays[p]);
    if (DeviceOf(arrays[p]) != d.ids[p]) {
      c.Fail(S(who, " is not device memory on grid device ", d.ids[p], " (it is on ",
               DeviceOf(arrays[p]), ", -1 = host)"));
    } else if (p < tiles) {
      const int64_t last = p + ((tiles - 1 - p) / P) * P;  // the last tile p owns
      const int64_t local = (last / P) * d.nb + (std::min((last + 1) * d.nb, ncols) - 1) % d.nb;
      const size_t need = static_cast<size_t>((local + 1) * d.rows) * ElementSize(d.type);
      if (!InOne(arrays[p], need))
        c.Fail(S(who, " needs ", need, " bytes (", local + 1, " local columns of ", d.rows,
                 ") inside its allocation"));
    }
  }
  return &d;
}

// Every routine's handle, scalars and square A (N x N).
const Desc* CheckSquareA(Checker& c, void* handle, int n, void* const* a, int ia, int ja,
                         void* desc, int type) {
  if (handles->count(handle) == 0) c.Fail(S("unknown or destroyed handle ", handle));
  else if (static_cast<MgHandle*>(handle)->devices.empty()) c.Fail("no cusolverMgDeviceSelect");
  if (ia != 1 || ja != 1) c.Fail(S("IA=", ia, ", JA=", ja, " (must be 1)"));
  if (ElementSize(type) == 0) c.Fail(S("computeType ", type));
  const Desc* d = descs->count(desc) != 0 ? static_cast<Desc*>(desc) : nullptr;
  if (d != nullptr && (n != d->rows || n != d->cols))
    c.Fail(S("N=", n, " but descA is ", d->rows, " x ", d->cols));
  d = CheckMatrix(c, "A", handle, desc, a, d != nullptr ? d->cols : 0, type);
  return c.ok() ? d : nullptr;
}

// The same for the Cholesky and eigen routines, which take uplo = LOWER only: NVIDIA's
// cuSolverMg samples (cuSolverMg_potrf_example, cuSolverMg_syevd_example) use nothing else.
const Desc* CheckA(Checker& c, void* handle, int uplo, int n, void* const* a, int ia, int ja,
                   void* desc, int type) {
  if (uplo != 0) c.Fail(S("uplo ", uplo, " (LOWER only, as NVIDIA's samples)"));
  const Desc* d = CheckSquareA(c, handle, n, a, ia, ja, desc, type);
  return c.ok() ? d : nullptr;
}

void CheckHost(Checker& c, const char* name, const void* p) {
  if (p == nullptr || DeviceOf(p) >= 0) c.Fail(S(name, "=", p, " must be a host pointer"));
}

const Desc* CheckPotrs(Checker& c, void* h, int uplo, int n, int nrhs, void** a, int ia, int ja,
                       void* desc_a, void** b, int ib, int jb, void* desc_b, int type,
                       const Desc** db) {
  const Desc* d = CheckA(c, h, uplo, n, a, ia, ja, desc_a, type);
  if (ib != 1 || jb != 1) c.Fail(S("IB=", ib, ", JB=", jb, " (must be 1)"));
  const Desc* bd = descs->count(desc_b) != 0 ? static_cast<Desc*>(desc_b) : nullptr;
  if (bd != nullptr && (bd->rows != n || bd->cols < nrhs || nrhs < 0))
    c.Fail(S("descB is ", bd->rows, " x ", bd->cols, " for N=", n, ", NRHS=", nrhs));
  *db = CheckMatrix(c, "B", h, desc_b, b, std::max(nrhs, 0), type);
  return c.ok() ? d : nullptr;
}

const Desc* CheckSyevd(Checker& c, void* h, int jobz, int uplo, int n, void** a, int ia, int ja,
                       void* desc, void* w, int type_w, int type) {
  const Desc* d = CheckA(c, h, uplo, n, a, ia, ja, desc, type);
  // Tiles up to 1024 ran on the H100; larger ones were reported rejected by the cuSolverMg-era
  // jaxmg (design.md section 5), in a way not recorded: a call jaxmg must never make.
  if (d != nullptr && d->nb > kMaxSyevdTile)
    c.Fail(S("column tile ", d->nb, " of descA (syevd takes tiles up to ", kMaxSyevdTile, ")"));
  if (jobz != 0 && jobz != 1) c.Fail(S("jobz ", jobz));
  const int real = type == 0 || type == 4 ? 0 : 1;
  if (type_w != real)
    c.Fail(S("dataTypeW ", type_w, " for computeType ", type, " (need ", real, ")"));
  CheckHost(c, "W", w);
  return c.ok() ? d : nullptr;
}

// The local columns grid position p holds among the first `ncols` columns of d's layout.
int64_t LocalColumns(const Desc& d, int64_t ncols, int64_t p) {
  const int64_t P = static_cast<int64_t>(d.ids.size()), tiles = (ncols + d.nb - 1) / d.nb;
  if (p >= tiles) return 0;
  const int64_t last = p + ((tiles - 1 - p) / P) * P;  // the last tile p owns
  return (last / P) * d.nb + (std::min((last + 1) * d.nb, ncols) - 1) % d.nb + 1;
}

// Pivot j of an IPIV array laid out like A's columns: a 1 x N matrix with A's column tile, on
// A's grid, leading dimension 1.
int* PivotAt(const Desc& a, int* const* ipiv, int64_t j) {
  const int64_t P = static_cast<int64_t>(a.ids.size()), t = j / a.nb;
  return ipiv[t % P] + (t / P) * a.nb + j % a.nb;
}

bool Overlap(const void* x, size_t x_bytes, const void* y, size_t y_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(y);
  return x_bytes > 0 && y_bytes > 0 && a < b + y_bytes && b < a + x_bytes;
}

// IPIV: entry p int32 device memory on A's grid device ids[p], 4-byte aligned, holding one
// pivot per local column of A that p owns, and not overlapping A's (or B's) local columns.
void CheckPivots(Checker& c, const Desc* a_desc, void* const* a, int* const* ipiv,
                 const Desc* b_desc = nullptr, void* const* b = nullptr, int64_t nrhs = 0) {
  if (ipiv == nullptr) return c.Fail("null pointer array for IPIV");
  if (a_desc == nullptr) return;  // A's own checks failed: its layout is unknown
  const Desc& d = *a_desc;
  for (size_t p = 0; p < d.ids.size(); ++p) {
    const std::string who = S("IPIV[", p, "]=", static_cast<void*>(ipiv[p]));
    const size_t need = static_cast<size_t>(LocalColumns(d, d.cols, p)) * sizeof(int);
    if (DeviceOf(ipiv[p]) != d.ids[p]) {
      c.Fail(S(who, " is not device memory on A's grid device ", d.ids[p], " (it is on ",
               DeviceOf(ipiv[p]), ", -1 = host)"));
    } else if (reinterpret_cast<uintptr_t>(ipiv[p]) % alignof(int) != 0) {
      c.Fail(S(who, " is not aligned for int32"));
    } else if (need > 0 && !InOne(ipiv[p], need)) {
      c.Fail(S(who, " needs ", need, " bytes (", need / sizeof(int),
               " local pivots) inside its allocation"));
    } else {
      const size_t a_bytes = static_cast<size_t>(LocalColumns(d, d.cols, p) * d.rows) *
                             ElementSize(d.type);
      if (Overlap(ipiv[p], need, a[p], a_bytes)) c.Fail(S(who, " overlaps A[", p, "]"));
      for (size_t q = 0; b_desc != nullptr && q < b_desc->ids.size(); ++q) {
        const size_t b_bytes = static_cast<size_t>(LocalColumns(*b_desc, nrhs, q) *
                                                   b_desc->rows) * ElementSize(b_desc->type);
        if (Overlap(ipiv[p], need, b[q], b_bytes)) c.Fail(S(who, " overlaps B[", q, "]"));
      }
    }
  }
}

// getrf: square A only (M == N), as jaxmg uses it.
const Desc* CheckGetrf(Checker& c, void* h, int m, int n, void** a, int ia, int ja, void* desc,
                       int** ipiv, int type) {
  if (m != n) c.Fail(S("M=", m, ", N=", n, " (the emulator supports square A only)"));
  const Desc* d = CheckSquareA(c, h, n, a, ia, ja, desc, type);
  CheckPivots(c, d, a, ipiv);
  return c.ok() ? d : nullptr;
}

// getrs: A and IPIV from getrf; B (N x NRHS) laid out by descB, as for potrs.
const Desc* CheckGetrs(Checker& c, void* h, int trans, int n, int nrhs, void** a, int ia, int ja,
                       void* desc_a, int** ipiv, void** b, int ib, int jb, void* desc_b,
                       int type, const Desc** db) {
  const Desc* d = CheckSquareA(c, h, n, a, ia, ja, desc_a, type);
  if (trans < 0 || trans > 2) c.Fail(S("TRANS ", trans, " (need CUBLAS_OP_N, _T or _C)"));
  if (ib != 1 || jb != 1) c.Fail(S("IB=", ib, ", JB=", jb, " (must be 1)"));
  const Desc* bd = descs->count(desc_b) != 0 ? static_cast<Desc*>(desc_b) : nullptr;
  if (bd != nullptr && (bd->rows != n || bd->cols < nrhs || nrhs < 0))
    c.Fail(S("descB is ", bd->rows, " x ", bd->cols, " for N=", n, ", NRHS=", nrhs));
  *db = CheckMatrix(c, "B", h, desc_b, b, std::max(nrhs, 0), type);
  CheckPivots(c, c.ok() ? d : nullptr, a, ipiv, *db, b, std::max(nrhs, 0));
  return c.ok() ? d : nullptr;
}

// The pivots getrf wrote (0-based), or a violation when one is not a row index k..N-1, as
// getrf's pivot k always is: IPIV not written by getrf (cudaMalloc'd memory is 0xA5...).
std::vector<int64_t> ReadPivots(Checker& c, const Desc& a, int** ipiv) {
  std::vector<int64_t> piv(a.cols);
  std::string bad;
  int nbad = 0;
  for (int64_t k = 0; k < a.cols; ++k) {
    int v = 0;
    std::memcpy(&v, PivotAt(a, ipiv, k), sizeof(v));
    piv[k] = int64_t{v} - 1;
    if (piv[k] < k || piv[k] >= a.cols) {
      if (nbad++ < 4) bad += S(bad.empty() ? "" : ", ", "IPIV(", k + 1, ")=", v);
    }
  }
  if (nbad > 0)
    c.Fail(S(nbad, " pivots are not getrf's (", bad, nbad > 4 ? ", ..." : "",
             "; pivot k must be in k..N, 1-based)"));
  return piv;
}

// Shared by every compute call after its own checks: info on the host; lwork at least the
// bufferSize answer and work[p] that many elements on device ids[p]; nothing queued on the
// devices' streams (cuSolverMg runs on its own streams and would race with it). On success,
// counts the call and scribbles over the workspace: its contents must not matter.
int Run(Checker& c, const Desc* d, const Desc* db, void** work, int64_t lwork, int64_t need,
        int* info) {
  CheckHost(c, "info", info);
  // FAKECUDA_ILLEGAL_ARGUMENT=k: reject argument k, as the library does: info = -k with
  // CUSOLVER_STATUS_INVALID_VALUE.
  if (const char* k = std::getenv("FAKECUDA_ILLEGAL_ARGUMENT"); k != nullptr && info != nullptr) {
    *info = -std::atoi(k);
    return kMgInvalidValue;
  }
  if (d == nullptr) return c.Report(kMgInvalidValue);
  if (lwork < need) c.Fail(S("lwork=", lwork, " is below the bufferSize answer ", need));
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(lwork, 0)) * ElementSize(d->type);
  for (size_t p = 0; work != nullptr && p < d->ids.size(); ++p)
    if (DeviceOf(work[p]) != d->ids[p] || !InOne(work[p], bytes))
      c.Fail(S("work[", p, "]=", work[p], " is not ", bytes, " bytes on device ", d->ids[p]));
  if (work == nullptr) c.Fail("null workspace array");
  std::set<int> devices(d->ids.begin(), d->ids.end());
  if (db != nullptr) devices.insert(db->ids.begin(), db->ids.end());
  std::map<int, size_t> queued;
  for (Stream* s : *streams)
    if (devices.count(s->device) != 0) queued[s->device] += s->queue.size();
  for (const auto& [dev, count] : queued)
    if (count > 0)
      c.Fail(S("cuSolverMg called while stream of device ", dev, " has ", count,
               " queued operations: the caller did not synchronise"));
  if (!c.ok()) return c.Report(kMgInvalidValue);
  ++solver_calls;
  library_busy->insert(devices.begin(), devices.end());
  for (size_t p = 0; p < d->ids.size(); ++p) std::memset(work[p], 0x5A, bytes);
  *info = 0;
  return kSuccess;
}

// Workspace sizes, in elements of the compute type.
int64_t PotrfLwork(const Desc& a) { return a.rows * a.nb + 64; }
int64_t PotriLwork(const Desc& a) {
  return a.rows * a.rows / static_cast<int64_t>(a.ids.size()) + a.rows * a.nb + 64;
}
int64_t PotrsLwork(int n, int nrhs) { return int64_t{n} * nrhs + 64; }
int64_t SyevdLwork(int n) { return int64_t{n} * n + 64; }
int64_t GetrfLwork(const Desc& a) { return a.rows * a.nb + 2 * a.nb + 64; }
int64_t GetrsLwork(int n, int nrhs) { return int64_t{n} * nrhs + n + 64; }

// ---------------------------------------------------------------------------------------------
// Dense kernels on n x n matrices.

// In-place lower Cholesky; returns LAPACK's info (0, or the order of the failing minor).
int Cholesky(Mat& m, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = m[j + j * n].real();
    for (int64_t k = 0; k < j; ++k) d -= std::norm(m[j + k * n]);
    if (!(d > 0.0) || !std::isfinite(d)) return static_cast<int>(j + 1);
    m[j + j * n] = std::sqrt(d);
    for (int64_t i = j + 1; i < n; ++i) {
      for (int64_t k = 0; k < j; ++k) m[i + j * n] -= m[i + k * n] * std::conj(m[j + k * n]);
      m[i + j * n] /= m[j + j * n];
    }
  }
  return 0;
}

// Solves L L^H X = B in place, B n x nrhs.
void CholeskySolve(const Mat& l, int64_t n, Mat& b, int64_t nrhs) {
  for (int64_t r = 0; r < nrhs; ++r) {
    cplx* x = &b[r * n];
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < i; ++k) x[i] -= l[i + k * n] * x[k];
      x[i] /= l[i + i * n];
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      for (int64_t k = i + 1; k < n; ++k) x[i] -= std::conj(l[k + i * n]) * x[k];
      x[i] /= std::conj(l[i + i * n]);
    }
  }
}

// inv(L L^H) = inv(L)^H inv(L), lower triangle.
Mat CholeskyInverse(const Mat& l, int64_t n) {
  Mat li(n * n), out(n * n);
  for (int64_t j = 0; j < n; ++j) {
    li[j + j * n] = 1.0 / l[j + j * n];
    for (int64_t i = j + 1; i < n; ++i) {
      cplx s = 0.0;
      for (int64_t k = j; k < i; ++k) s += l[i + k * n] * li[k + j * n];
      li[i + j * n] = -s / l[i + i * n];
    }
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = j; i < n; ++i)
      for (int64_t k = i; k < n; ++k) out[i + j * n] += std::conj(li[k + i * n]) * li[k + j * n];
  return out;
}

// In-place LU with partial pivoting, unblocked right-looking (LAPACK's getf2): the pivot of
// column k is its first entry of largest |re| + |im| on or below the diagonal (LAPACK's
// i?amax), whole rows are swapped, L unit lower below the diagonal, U on and above. Returns
// LAPACK's info: 0, or k when U(k, k) is exactly zero (the factorization still completes).
int Lu(Mat& m, int64_t n, std::vector<int64_t>* piv) {
  const auto abs1 = [](cplx z) { return std::abs(z.real()) + std::abs(z.imag()); };
  int info = 0;
  piv->assign(n, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < n; ++i)
      if (abs1(m[i + k * n]) > abs1(m[p + k * n])) p = i;
    (*piv)[k] = p;
    if (p != k)
      for (int64_t j = 0; j < n; ++j) std::swap(m[k + j * n], m[p + j * n]);
    const cplx pivot = m[k + k * n];
    if (pivot == 0.0) {  // the whole column below is zero too: nothing to eliminate
      if (info == 0) info = static_cast<int>(k + 1);
      continue;
    }
    for (int64_t i = k + 1; i < n; ++i) m[i + k * n] /= pivot;
    for (int64_t j = k + 1; j < n; ++j) {
      const cplx u = m[k + j * n];
      for (int64_t i = k + 1; i < n; ++i) m[i + j * n] -= m[i + k * n] * u;
    }
  }
  return info;
}

// Solves A X = B in place with A = P L U from Lu: L U x = P^T b.
void LuSolve(const Mat& lu, int64_t n, const std::vector<int64_t>& piv, Mat& b, int64_t nrhs) {
  for (int64_t r = 0; r < nrhs; ++r) {
    cplx* x = &b[r * n];
    for (int64_t k = 0; k < n; ++k) std::swap(x[k], x[piv[k]]);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < i; ++k) x[i] -= lu[i + k * n] * x[k];
    for (int64_t i = n - 1; i >= 0; --i) {
      for (int64_t k = i + 1; k < n; ++k) x[i] -= lu[i + k * n] * x[k];
      x[i] /= lu[i + i * n];
    }
  }
}

// Cyclic Jacobi for a Hermitian matrix. Each rotation is V = diag(1, conj(u)) G on rows and
// columns p, q: u, the phase of a_pq, makes the 2 x 2 block real symmetric, and G is its real
// Jacobi rotation. Returns the eigenvalues ascending, the eigenvectors as the columns of *v.
std::vector<double> Jacobi(Mat a, int64_t n, Mat* v) {
  v->assign(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) (*v)[i + i * n] = 1.0;
  double norm = 0.0;
  for (const cplx& x : a) norm += std::norm(x);
  norm = std::sqrt(norm);
  for (int sweep = 0; sweep < 100 && norm > 0.0; ++sweep) {
    double off = 0.0;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < n; ++i) off += i != j ? std::norm(a[i + j * n]) : 0.0;
    if (std::sqrt(off) <= 1e-14 * norm) break;
    bool rotated = false;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        const double r = std::abs(a[p + q * n]);
        const double app = a[p + p * n].real(), aqq = a[q + q * n].real();
        if (r <= 1e-300 || r <= 1e-17 * std::sqrt(std::abs(app * aqq))) continue;
        rotated = true;
        const cplx u = a[p + q * n] / r;
        const double tau = (aqq - app) / (2.0 * r);
        const double t = (tau >= 0 ? 1.0 : -1.0) / (std::abs(tau) + std::sqrt(1.0 + tau * tau));
        const double c = 1.0 / std::sqrt(1.0 + t * t), s = t * c;
        const cplx v00 = c, v01 = s, v10 = -s * std::conj(u), v11 = c * std::conj(u);
        for (Mat* m : {&a, v})  // A V, and the accumulated vectors V_total V
          for (int64_t k = 0; k < n; ++k) {
            const cplx xp = (*m)[k + p * n], xq = (*m)[k + q * n];
            (*m)[k + p * n] = xp * v00 + xq * v10;
            (*m)[k + q * n] = xp * v01 + xq * v11;
          }
        for (int64_t k = 0; k < n; ++k) {  // V^H (A V)
          const cplx xp = a[p + k * n], xq = a[q + k * n];
          a[p + k * n] = std::conj(v00) * xp + std::conj(v10) * xq;
          a[q + k * n] = std::conj(v01) * xp + std::conj(v11) * xq;
        }
        a[p + q * n] = a[q + p * n] = 0.0;
        a[p + p * n] = a[p + p * n].real();
        a[q + q * n] = a[q + q * n].real();
      }
    if (!rotated) break;
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return a[x + x * n].real() < a[y + y * n].real();
  });
  std::vector<double> w(n);
  Mat sorted(n * n);
  for (int64_t k = 0; k < n; ++k) {
    w[k] = a[order[k] + order[k] * n].real();
    std::copy_n(&(*v)[order[k] * n], n, &sorted[k * n]);
  }
  *v = std::move(sorted);
  return w;
}

// potrf (inverse = false) and potri (inverse = true) share their arguments.
int PotrfPotriSize(const char* fn, bool inverse, void* h, int uplo, int n, void** a, int ia,
                   int ja, void* desc, int type, int64_t* lwork) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{fn, {}};
  const Desc* d = CheckA(c, h, uplo, n, a, ia, ja, desc, type);
  CheckHost(c, "lwork", lwork);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  *lwork = inverse ? PotriLwork(*d) : PotrfLwork(*d);
  return kSuccess;
}
int PotrfPotri(const char* fn, bool inverse, void* h, int uplo, int n, void** a, int ia, int ja,
               void* desc, int type, void** work, int64_t lwork, int* info) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{fn, {}};
  const Desc* d = CheckA(c, h, uplo, n, a, ia, ja, desc, type);
  const int64_t need = d == nullptr ? 0 : inverse ? PotriLwork(*d) : PotrfLwork(*d);
  if (const int status = Run(c, d, nullptr, work, lwork, need, info); status != kSuccess)
    return status;
  if (inverse) {  // A holds L from potrf
    Scatter(*d, a, n, CholeskyInverse(Gather(*d, a, n, Part::kLower), n), true);
  } else {  // a failure leaves a partial factor, as LAPACK does
    Mat m = Gather(*d, a, n, Part::kHermitian);
    *info = Cholesky(m, n);
    Scatter(*d, a, n, m, true);
    // FAKECUDA_NOT_PD_STATUS=s: report a matrix that is not positive definite through a
    // failing status s as well as info > 0, or, with FAKECUDA_NOT_PD_ZERO_INFO=1, through the
    // status alone (info 0). Which of the three real cuSolverMg does is not known.
    if (const char* s = std::getenv("FAKECUDA_NOT_PD_STATUS"); s != nullptr && *info > 0) {
      if (const char* z = std::getenv("FAKECUDA_NOT_PD_ZERO_INFO"); z != nullptr && *z == '1')
        *info = 0;
      return std::atoi(s);
    }
  }
  return kSuccess;
}

// Every id of a device list must be an emulated device.
template <typename Int>
void CheckDevices(Checker& c, const Int* ids, int count) {
  for (int i = 0; c.ok() && i < count; ++i)
    if (!ValidDevice(ids[i])) c.Fail(S("invalid device ", ids[i]));
}

// Destroys one of the objects a cusolverMgCreate* call made; an unknown one is a violation.
template <typename T>
int DestroyObject(std::set<void*>* live, void* object, const char* fn, const char* what) {
  std::lock_guard<std::mutex> lock(mu);
  if (live->erase(object) == 0)
    return Violation(fn, S("unknown ", what, " ", object)), kMgInvalidValue;
  delete static_cast<T*>(object);
  return kSuccess;
}
}  // namespace

// =============================================================================================
// The state that fake_cusolvermp.cc shares (fake_cuda.h).
namespace fakecuda {

std::unique_lock<std::mutex> LockState() { return std::unique_lock<std::mutex>(mu); }
void RecordViolation(const char* fn, const std::string& what) { Violation(fn, what); }
size_t ElementSizeOf(int type) { return ElementSize(type); }
int CurrentDevice() { return current; }
bool ValidDevice(int device) { return ::ValidDevice(device); }
int DeviceOfLocked(const void* p) { return DeviceOf(p); }
bool InOneAllocationLocked(const void* p, size_t bytes) { return InOne(p, bytes); }

int StreamDeviceLocked(const void* stream) {
  auto* s = static_cast<Stream*>(const_cast<void*>(stream));
  return s != nullptr && streams->count(s) != 0 ? s->device : -1;
}

void SynchronizeStreamLocked(const void* stream) {
  Drain(static_cast<Stream*>(const_cast<void*>(stream)));
}

long QueuedElsewhereLocked(const void* stream, const void* p, size_t bytes) {  // NOLINT
  const auto base = reinterpret_cast<uintptr_t>(p);
  long n = 0;  // NOLINT(runtime/int)
  for (Stream* s : *streams) {
    if (s == stream) continue;
    for (const Op& op : s->queue)
      n += std::any_of(op.device_ranges.begin(), op.device_ranges.end(), [&](auto& r) {
        return r.first < base + bytes && base < r.first + r.second;
      });
  }
  return n;
}

void EnqueueWriteLocked(const void* stream, void* dst, std::vector<char> bytes) {
  auto* s = static_cast<Stream*>(const_cast<void*>(stream));
  const size_t n = bytes.size();
  Op op{false, static_cast<char*>(dst), nullptr, std::move(bytes), n, 0, {}};
  op.device_ranges.push_back({reinterpret_cast<uintptr_t>(dst), n});
  s->queue.push_back(std::move(op));
}

}  // namespace fakecuda

// =============================================================================================
// CUDA runtime.
extern "C" {

int cudaGetDevice(int* device) {
  if (device == nullptr) return RtViolation("cudaGetDevice", "null output");
  *device = current;
  return kSuccess;
}

int cudaSetDevice(int device) {
  if (!ValidDevice(device)) return Rt(kInvalidDevice);
  current = device;
  return kSuccess;
}

int cudaGetLastError() {
  const int e = last_error;
  last_error = kSuccess;
  return e;
}

const char* cudaGetErrorString(int error) {
  switch (error) {
    case kSuccess: return "no error";
    case kInvalidValue: return "invalid argument";
    case kMemoryAllocation: return "out of memory";
    case kInvalidDevice: return "invalid device ordinal";
    case kPeerAlreadyEnabled: return "peer access is already enabled";
    default: return "unrecognized error code (fakecuda)";
  }
}

int cudaMalloc(void** out, size_t size) {
  if (out == nullptr) return RtViolation("cudaMalloc", "null output");
  const size_t bytes = std::max<size_t>(size, 1);
  const int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd < 0) return Rt(kMemoryAllocation);
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return close(fd), Rt(kMemoryAllocation);
  std::memset(p, 0xA5, bytes);  // cudaMalloc'd memory is uninitialised: never rely on zeros
  std::lock_guard<std::mutex> lock(mu);
  (*registry)[reinterpret_cast<uintptr_t>(p)] = {bytes, current, fd, getpid(), true, next_serial++};
  *out = p;
  return kSuccess;
}

int cudaFree(void* p) {
  if (p == nullptr) return kSuccess;
  std::lock_guard<std::mutex> lock(mu);
  auto it = registry->find(reinterpret_cast<uintptr_t>(p));
  if (it == registry->end() || !it->second.own)
    return RtViolation("cudaFree", S(p, " is not a base returned by cudaMalloc"));
  if (const long n = PendingOn(it->first, it->second.size); n > 0)
    return RtViolation("cudaFree", S(p, " still has ", n, " queued operations touching it"));
  munmap(p, it->second.size);
  close(it->second.fd);
  opens->erase(it->first);
  registry->erase(it);
  return kSuccess;
}

int cudaStreamCreate(void** stream) {
  if (stream == nullptr) return RtViolation("cudaStreamCreate", "null output");
  std::lock_guard<std::mutex> lock(mu);
  *stream = *streams->insert(new Stream{current, {}}).first;
  return kSuccess;
}

int cudaStreamDestroy(void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = LiveStream("cudaStreamDestroy", stream);
  if (s == nullptr) return Rt(kInvalidValue);
  Drain(s);
  streams->erase(s);
  delete s;
  return kSuccess;
}

int cudaStreamSynchronize(void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = LiveStream("cudaStreamSynchronize", stream);
  if (s == nullptr) return Rt(kInvalidValue);
  Drain(s);
  return kSuccess;
}

int cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(mu);
  for (Stream* s : *streams)
    if (s->device == current) Drain(s);
  library_busy->erase(current);
  return kSuccess;
}

int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cudaMemcpy", {}};
  if (bytes > 0 && !CheckCopy(c, dst, src, bytes, kind, -1)) return Rt(c.Report(kInvalidValue));
  if (bytes > 0) std::memmove(dst, src, bytes);
  return kSuccess;
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = LiveStream("cudaMemcpyAsync", stream);
  if (s == nullptr) return Rt(kInvalidValue);
  Checker c{"cudaMemcpyAsync", {}};
  if (bytes == 0) return kSuccess;
  if (!CheckCopy(c, dst, src, bytes, kind, s->device)) return Rt(c.Report(kInvalidValue));
  Op op{false, static_cast<char*>(dst), static_cast<const char*>(src), {}, bytes, 0, {}};
  if (DeviceOf(src) < 0) op.snapshot.assign(op.src, op.src + bytes);  // pageable host memory
  else op.device_ranges.push_back({reinterpret_cast<uintptr_t>(src), bytes});
  if (DeviceOf(dst) >= 0) op.device_ranges.push_back({reinterpret_cast<uintptr_t>(dst), bytes});
  s->queue.push_back(std::move(op));
  return kSuccess;
}

int cudaMemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  std::lock_guard<std::mutex> lock(mu);
  Stream* s = LiveStream("cudaMemsetAsync", stream);
  if (s == nullptr) return Rt(kInvalidValue);
  if (bytes == 0) return kSuccess;
  if (DeviceOf(dst) != s->device || !InOne(dst, bytes))
    return RtViolation("cudaMemsetAsync", S(dst, " + ", bytes, " bytes is not inside memory of "
                                            "the stream's device ", s->device, " (pointer on ",
                                            DeviceOf(dst), ", -1 = host)"));
  if (library_busy->count(s->device) != 0)
    return RtViolation("cudaMemsetAsync", S("memory of device ", s->device, " set while a ",
                                            "cuSolverMg call may still run there (no ",
                                            "cudaDeviceSynchronize on that device after it)"));
  s->queue.push_back(Op{true, static_cast<char*>(dst), nullptr, {}, bytes, value,
                        {{reinterpret_cast<uintptr_t>(dst), bytes}}});
  return kSuccess;
}

int cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (can == nullptr) return RtViolation("cudaDeviceCanAccessPeer", "null output");
  if (!ValidDevice(device) || !ValidDevice(peer)) return Rt(kInvalidDevice);
  *can = device != peer ? 1 : 0;
  return kSuccess;
}

int cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (!ValidDevice(peer)) return Rt(kInvalidDevice);
  if (flags != 0 || peer == current)
    return RtViolation("cudaDeviceEnablePeerAccess", S("peer ", peer, " from device ", current,
                                                       ", flags ", flags, " (need 0)"));
  if (PeerError() != 0) return Rt(PeerError());
  std::lock_guard<std::mutex> lock(mu);
  return peers->insert({current, peer}).second ? kSuccess : Rt(kPeerAlreadyEnabled);
}

int cudaDeviceGetPCIBusId(char* buf, int len, int device) {
  if (!ValidDevice(device)) return Rt(kInvalidDevice);
  if (buf == nullptr || len < 13)
    return RtViolation("cudaDeviceGetPCIBusId", S("buffer of ", len, " bytes (need 13)"));
  std::snprintf(buf, static_cast<size_t>(len), "0000:%02x:00.0", 0x10 + device);
  return kSuccess;
}

int cudaDeviceGetByPCIBusId(int* device, const char* bus_id) {
  if (device == nullptr || bus_id == nullptr)
    return RtViolation("cudaDeviceGetByPCIBusId", "null argument");
  for (int d = 0; d < NumDevices(); ++d) {
    char mine[16];
    std::snprintf(mine, sizeof(mine), "0000:%02x:00.0", 0x10 + d);
    if (strcasecmp(mine, bus_id) == 0) return *device = d, kSuccess;
  }
  return Rt(kInvalidDevice);
}

// IPC: the handle names the owner's memfd; another process maps /proc/<pid>/fd/<fd>.
int cudaIpcGetMemHandle(HandleBytes* out, void* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = registry->find(reinterpret_cast<uintptr_t>(p));
  if (out == nullptr || it == registry->end() || !it->second.own)
    return RtViolation("cudaIpcGetMemHandle", S(p, " is not the base of a cudaMalloc "
                                                   "allocation of this process"));
  const Alloc& a = it->second;
  const IpcHandle h{kIpcMagic, a.serial, a.size, it->first, a.owner, a.fd, a.device};
  std::memset(out->reserved, 0, sizeof(out->reserved));
  std::memcpy(out->reserved, &h, sizeof(h));
  return kSuccess;
}

int cudaIpcOpenMemHandle(void** out, HandleBytes bytes, unsigned int flags) {
  const char* fn = "cudaIpcOpenMemHandle";
  IpcHandle h;
  std::memcpy(&h, bytes.reserved, sizeof(h));
  if (out == nullptr || h.magic != kIpcMagic || flags != 1)
    return RtViolation(fn, S("null output, bad handle or flags ", flags,
                             " (need cudaIpcMemLazyEnablePeerAccess = 1)"));
  std::lock_guard<std::mutex> lock(mu);
  uintptr_t base = 0;
  if (h.pid == getpid()) {  // real CUDA refuses this; allowed for single-process tests
    auto it = registry->find(h.base);
    if (it == registry->end() || it->second.serial != h.serial)
      return RtViolation(fn, "the handle's allocation was freed");
    base = h.base;
  } else if (auto it = ipc_maps->find({h.pid, h.serial}); it != ipc_maps->end()) {
    base = it->second;  // opened before: the same mapping, one more reference
  } else {
    const std::string path = S("/proc/", h.pid, "/fd/", h.fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return RtViolation(fn, "cannot open " + path + " (owner gone or memory freed?)");
    void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return RtViolation(fn, "cannot map " + path);
    base = reinterpret_cast<uintptr_t>(p);
    (*registry)[base] = {h.size, h.device, -1, h.pid, false, h.serial};
    (*ipc_maps)[{h.pid, h.serial}] = base;
  }
  ++(*opens)[base];
  *out = reinterpret_cast<void*>(base);
  return kSuccess;
}

int cudaIpcCloseMemHandle(void* p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = opens->find(reinterpret_cast<uintptr_t>(p));
  if (it == opens->end())
    return RtViolation("cudaIpcCloseMemHandle", S(p, " is not open (cudaIpcOpenMemHandle)"));
  auto reg = registry->find(it->first);
  if (it->second == 1 && !reg->second.own) {  // the last reference: unmap
    if (const long n = PendingOn(it->first, reg->second.size); n > 0)
      return RtViolation("cudaIpcCloseMemHandle", S(p, " still has ", n, " queued operations"));
    munmap(p, reg->second.size);
    ipc_maps->erase({reg->second.owner, reg->second.serial});
    registry->erase(reg);
  }
  if (--it->second == 0) opens->erase(it);
  return kSuccess;
}

// =============================================================================================
// CUDA driver: the attributes of the allocation holding a pointer (any current device).
int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {  // NOLINT
  std::lock_guard<std::mutex> lock(mu);
  uintptr_t base = 0;
  const Alloc* a = Find(reinterpret_cast<void*>(ptr), &base);
  if (data == nullptr || a == nullptr) return kInvalidValue;
  switch (attribute) {
    case 9: return *static_cast<int*>(data) = a->device, kSuccess;  // DEVICE_ORDINAL
    case 10: return *static_cast<int*>(data) = 1, kSuccess;  // IS_LEGACY_CUDA_IPC_CAPABLE
    case 11: return *static_cast<unsigned long long*>(data) = base, kSuccess;  // NOLINT: START
    case 12: return *static_cast<size_t*>(data) = a->size, kSuccess;           // RANGE_SIZE
    default:
      return Violation("cuPointerGetAttribute", S("attribute ", attribute, " is not emulated")),
             kInvalidValue;
  }
}

// =============================================================================================
// cuSolverMg: handles, 1 x P grids, 1-D column block-cyclic descriptors.

int cusolverMgCreate(void** handle) {
  if (handle == nullptr) return Violation("cusolverMgCreate", "null output"), kMgInvalidValue;
  std::lock_guard<std::mutex> lock(mu);
  *handle = *handles->insert(new MgHandle()).first;
  return kSuccess;
}

int cusolverMgDestroy(void* handle) {
  return DestroyObject<MgHandle>(handles, handle, "cusolverMgDestroy", "handle");
}

// A device may be listed more than once, in the handle's list and in a grid: cuSolverMg
// computed right with one H100 listed 2, 3, 4 and 8 times (issue 24).
int cusolverMgDeviceSelect(void* handle, int count, int devices[]) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgDeviceSelect", {}};
  if (handles->count(handle) == 0) c.Fail(S("unknown handle ", handle));
  if (count < 1 || count > kMaxDevices || devices == nullptr) c.Fail(S("nbDevices ", count));
  if (c.ok()) CheckDevices(c, devices, count);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  static_cast<MgHandle*>(handle)->devices.assign(devices, devices + count);
  return kSuccess;
}

int cusolverMgCreateDeviceGrid(void** grid, int32_t rows, int32_t cols, const int32_t ids[],
                               int mapping) {
  Checker c{"cusolverMgCreateDeviceGrid", {}};
  if (grid == nullptr || ids == nullptr) c.Fail("null argument");
  if (rows != 1 || mapping != 0 || cols < 1 || cols > kMaxDevices)
    c.Fail(S(rows, " x ", cols, " grid, mapping ", mapping, " (only 1 x P, COL_MAJOR)"));
  if (c.ok()) CheckDevices(c, ids, cols);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  std::lock_guard<std::mutex> lock(mu);
  *grid = *grids->insert(new Grid{std::vector<int>(ids, ids + cols)}).first;
  return kSuccess;
}

int cusolverMgDestroyGrid(void* grid) {
  return DestroyObject<Grid>(grids, grid, "cusolverMgDestroyGrid", "grid");
}

int cusolverMgCreateMatrixDesc(void** desc, int64_t rows, int64_t cols, int64_t row_block,
                               int64_t col_block, int type, void* grid) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgCreateMatrixDesc", {}};
  if (desc == nullptr) c.Fail("null output");
  if (grids->count(grid) == 0) c.Fail(S("unknown grid ", grid));
  if (rows < 1 || cols < 1 || col_block < 1 || row_block != rows)
    c.Fail(S(rows, " x ", cols, " in blocks of ", row_block, " x ", col_block,
             " (need 1-D column block-cyclic: rowBlockSize == numRows)"));
  if (ElementSize(type) == 0) c.Fail(S("data type ", type));
  if (!c.ok()) return c.Report(kMgInvalidValue);
  const std::vector<int>& ids = static_cast<Grid*>(grid)->ids;
  *desc = *descs->insert(new Desc{rows, cols, col_block, type, ids}).first;
  return kSuccess;
}

int cusolverMgDestroyMatrixDesc(void* desc) {
  return DestroyObject<Desc>(descs, desc, "cusolverMgDestroyMatrixDesc", "descriptor");
}

// potrf: A = L L^H, L into the lower triangle. potri: A holds L; inv(A) into the lower triangle.
int cusolverMgPotrf_bufferSize(void* h, int uplo, int n, void** a, int ia, int ja, void* desc,
                               int type, int64_t* lwork) {
  return PotrfPotriSize("cusolverMgPotrf_bufferSize", false, h, uplo, n, a, ia, ja, desc, type,
                        lwork);
}
int cusolverMgPotrf(void* h, int uplo, int n, void** a, int ia, int ja, void* desc, int type,
                    void** work, int64_t lwork, int* info) {
  return PotrfPotri("cusolverMgPotrf", false, h, uplo, n, a, ia, ja, desc, type, work, lwork,
                    info);
}
int cusolverMgPotri_bufferSize(void* h, int uplo, int n, void** a, int ia, int ja, void* desc,
                               int type, int64_t* lwork) {
  return PotrfPotriSize("cusolverMgPotri_bufferSize", true, h, uplo, n, a, ia, ja, desc, type,
                        lwork);
}
int cusolverMgPotri(void* h, int uplo, int n, void** a, int ia, int ja, void* desc, int type,
                    void** work, int64_t lwork, int* info) {
  return PotrfPotri("cusolverMgPotri", true, h, uplo, n, a, ia, ja, desc, type, work, lwork, info);
}

// potrs: A holds L; solves L L^H X = B for B's first NRHS columns (B laid out by descB).
int cusolverMgPotrs_bufferSize(void* h, int uplo, int n, int nrhs, void** a, int ia, int ja,
                               void* desc_a, void** b, int ib, int jb, void* desc_b, int type,
                               int64_t* lwork) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgPotrs_bufferSize", {}};
  const Desc* db = nullptr;
  CheckPotrs(c, h, uplo, n, nrhs, a, ia, ja, desc_a, b, ib, jb, desc_b, type, &db);
  CheckHost(c, "lwork", lwork);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  *lwork = PotrsLwork(n, nrhs);
  return kSuccess;
}

int cusolverMgPotrs(void* h, int uplo, int n, int nrhs, void** a, int ia, int ja, void* desc_a,
                    void** b, int ib, int jb, void* desc_b, int type, void** work, int64_t lwork,
                    int* info) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgPotrs", {}};
  const Desc* db = nullptr;
  const Desc* d = CheckPotrs(c, h, uplo, n, nrhs, a, ia, ja, desc_a, b, ib, jb, desc_b, type, &db);
  if (const int status = Run(c, d, db, work, lwork, PotrsLwork(n, nrhs), info); status != kSuccess)
    return status;
  Mat x = Gather(*db, b, nrhs, Part::kFull);
  CholeskySolve(Gather(*d, a, n, Part::kLower), n, x, nrhs);
  Scatter(*db, b, nrhs, x, false);
  return kSuccess;
}

// getrf: A = P L U with partial pivoting, L (unit diagonal) and U over A; IPIV[p] receives the
// 1-based global pivot row of each of p's local columns. info = k > 0 when U(k, k) is exactly
// zero. Square A only (M == N). A column tile of 1024 or more is refused with info = -6 (descrA),
// as on the H100 at N = 2048, 4096 and 8192 (its status was not recorded:
// CUSOLVER_STATUS_INVALID_VALUE here); its bufferSize took those tiles (jaxmg asked it first,
// and the failure that came back was getrf's info).
int cusolverMgGetrf_bufferSize(void* h, int m, int n, void** a, int ia, int ja, void* desc,
                               int** ipiv, int type, int64_t* lwork) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgGetrf_bufferSize", {}};
  const Desc* d = CheckGetrf(c, h, m, n, a, ia, ja, desc, ipiv, type);
  CheckHost(c, "lwork", lwork);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  *lwork = GetrfLwork(*d);
  return kSuccess;
}

int cusolverMgGetrf(void* h, int m, int n, void** a, int ia, int ja, void* desc, int** ipiv,
                    int type, void** work, int64_t lwork, int* info) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgGetrf", {}};
  const Desc* d = CheckGetrf(c, h, m, n, a, ia, ja, desc, ipiv, type);
  if (d != nullptr && d->nb >= kMinRefusedGetrfTile) {
    if (info != nullptr) *info = -6;
    return kMgInvalidValue;
  }
  const int64_t need = d == nullptr ? 0 : GetrfLwork(*d);
  if (const int status = Run(c, d, nullptr, work, lwork, need, info); status != kSuccess)
    return status;
  Mat lu = Gather(*d, a, n, Part::kFull);
  std::vector<int64_t> piv;
  *info = Lu(lu, n, &piv);
  Scatter(*d, a, n, lu, false);
  for (int64_t k = 0; k < n; ++k) {
    const int v = static_cast<int>(piv[k] + 1);
    std::memcpy(PivotAt(*d, ipiv, k), &v, sizeof(v));
  }
  return kSuccess;
}

// getrs: A and IPIV from getrf; solves A X = B for B's first NRHS columns (B laid out by descB).
// TRANS must be CUBLAS_OP_N (0): on the H100, _T (1) and _C (2) made getrs answer info = -1
// (the status it returned was not recorded: CUSOLVER_STATUS_INVALID_VALUE here, as for any
// illegal argument). Its bufferSize took them: jaxmg asked it with the same TRANS first, and
// the failure that came back was getrs's info. Any other TRANS is a violation.
int cusolverMgGetrs_bufferSize(void* h, int trans, int n, int nrhs, void** a, int ia, int ja,
                               void* desc_a, int** ipiv, void** b, int ib, int jb, void* desc_b,
                               int type, int64_t* lwork) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgGetrs_bufferSize", {}};
  const Desc* db = nullptr;
  CheckGetrs(c, h, trans, n, nrhs, a, ia, ja, desc_a, ipiv, b, ib, jb, desc_b, type, &db);
  CheckHost(c, "lwork", lwork);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  *lwork = GetrsLwork(n, nrhs);
  return kSuccess;
}

int cusolverMgGetrs(void* h, int trans, int n, int nrhs, void** a, int ia, int ja, void* desc_a,
                    int** ipiv, void** b, int ib, int jb, void* desc_b, int type, void** work,
                    int64_t lwork, int* info) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgGetrs", {}};
  const Desc* db = nullptr;
  const Desc* d =
      CheckGetrs(c, h, trans, n, nrhs, a, ia, ja, desc_a, ipiv, b, ib, jb, desc_b, type, &db);
  if (c.ok() && trans != 0) {
    if (info != nullptr) *info = -1;
    return kMgInvalidValue;
  }
  std::vector<int64_t> piv;
  if (d != nullptr) piv = ReadPivots(c, *d, ipiv);
  if (!c.ok()) d = nullptr;
  if (const int status = Run(c, d, db, work, lwork, GetrsLwork(n, nrhs), info); status != kSuccess)
    return status;
  Mat x = Gather(*db, b, nrhs, Part::kFull);
  LuSolve(Gather(*d, a, n, Part::kFull), n, piv, x, nrhs);
  Scatter(*db, b, nrhs, x, false);
  return kSuccess;
}

// syevd: eigenvalues ascending into the host array W; jobz VECTOR writes the eigenvectors as
// the full matrix A, NOVECTOR overwrites A's lower triangle with 7777 (LAPACK destroys it).
int cusolverMgSyevd_bufferSize(void* h, int jobz, int uplo, int n, void** a, int ia, int ja,
                               void* desc, void* w, int type_w, int type, int64_t* lwork) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgSyevd_bufferSize", {}};
  CheckSyevd(c, h, jobz, uplo, n, a, ia, ja, desc, w, type_w, type);
  CheckHost(c, "lwork", lwork);
  if (!c.ok()) return c.Report(kMgInvalidValue);
  *lwork = SyevdLwork(n);
  return kSuccess;
}

int cusolverMgSyevd(void* h, int jobz, int uplo, int n, void** a, int ia, int ja, void* desc,
                    void* w, int type_w, int type, void** work, int64_t lwork, int* info) {
  std::lock_guard<std::mutex> lock(mu);
  Checker c{"cusolverMgSyevd", {}};
  const Desc* d = CheckSyevd(c, h, jobz, uplo, n, a, ia, ja, desc, w, type_w, type);
  if (const int status = Run(c, d, nullptr, work, lwork, SyevdLwork(n), info); status != kSuccess)
    return status;
  Mat v;
  const std::vector<double> values = Jacobi(Gather(*d, a, n, Part::kHermitian), n, &v);
  for (int k = 0; k < n; ++k)
    Store(type_w, static_cast<char*>(w) + k * ElementSize(type_w), values[k]);
  if (jobz == 1) Scatter(*d, a, n, v, false);
  else Scatter(*d, a, n, Mat(static_cast<size_t>(n) * n, 7777.0), true);
  return kSuccess;
}

// =============================================================================================
// Test hooks.
int fakecuda_violations(char* buf, int len) {
  std::lock_guard<std::mutex> lock(violations_mu);
  std::string all;
  for (const std::string& v : *violations) all += (all.empty() ? "" : "\n") + v;
  if (buf != nullptr && len > 0) {
    const size_t n = std::min(all.size(), static_cast<size_t>(len) - 1);
    std::memcpy(buf, all.data(), n);
    buf[n] = '\0';
  }
  return static_cast<int>(violations->size());
}

long fakecuda_live_allocations() {  // NOLINT(runtime/int): cudaMalloc'd here, not freed
  std::lock_guard<std::mutex> lock(mu);
  return std::count_if(registry->begin(), registry->end(),
                       [](auto& e) { return e.second.own && e.second.owner == getpid(); });
}

long fakecuda_open_ipc() {  // NOLINT(runtime/int): cudaIpcOpenMemHandle not yet closed
  std::lock_guard<std::mutex> lock(mu);
  long n = 0;  // NOLINT(runtime/int)
  for (const auto& entry : *opens) n += entry.second;
  return n;
}

long fakecuda_queued_ops() {  // NOLINT(runtime/int): queued on all streams, not yet run
  std::lock_guard<std::mutex> lock(mu);
  long n = 0;  // NOLINT(runtime/int)
  for (Stream* s : *streams) n += static_cast<long>(s->queue.size());  // NOLINT(runtime/int)
  return n;
}

long fakecuda_library_busy() {  // NOLINT(runtime/int): devices not synchronised after a call
  std::lock_guard<std::mutex> lock(mu);
  return static_cast<long>(library_busy->size());  // NOLINT(runtime/int)
}

long fakecuda_solver_calls() {  // NOLINT(runtime/int): potrf/potrs/potri/syevd/getrf/getrs
  std::lock_guard<std::mutex> lock(mu);
  return solver_calls;
}

}  // extern "C"
