// fakecuda's NCCL and cuSOLVERMp: the functions of
// packages/jaxmg-cuda/csrc/vendor/cusolvermp_api.h, emulated on fake_cuda.cc's host-memory
// devices and streams, so that jaxmg's cuSOLVERMp engine runs under `mpiexec` (MPICH from pip)
// on machines without a GPU. Built into the same library as fake_cuda.cc (its header comment
// has the command), opened as libcusolverMp.so.0 and libnccl.so.2.
//
// THIS IS NOT A MODEL OF cuSOLVERMp's NUMERICS. It checks the plumbing (handles, grids,
// descriptors, pointers on the right device and inside their allocations, workspace sizes,
// stream order) and computes the results with MKL's ScaLAPACK over MPI, which must already be in
// the process: jaxmg_cuda.mp.load() opens MPICH, BLACS and ScaLAPACK (LP64) RTLD_GLOBAL, and
// this file finds them with dlsym(RTLD_DEFAULT) at call time, so it builds without them. MPI
// handles are MPICH's (ints, values from MPICH's mpi.h). Every misuse is a violation of
// fake_cuda.cc's list (fakecuda_violations), printed, and the call fails.
//
// Order. A routine runs where it sits on the handle's stream: at entry the emulator runs what is
// queued on that stream, reads its inputs, computes (ScaLAPACK's collectives with the other
// processes), and queues its outputs (A, B, Q, D, ipiv, info) on the stream as writes, which
// land at the stream's next synchronisation. ncclAllReduce alike on its stream. An operation
// queued on another stream that touches a routine's operands is a race: a violation. The
// workspaces are filled with 0xFF bytes before each routine: their contents must not matter.
// Each routine and ncclAllReduce first agrees with every other process that all of them found
// their arguments right (one MPI_Allreduce), so that a violation on one process fails the call
// everywhere instead of leaving the others in a collective.
//
// Requirements enforced, with their sources:
//  [H] cusolverMp.h 0.9.1 (NVIDIA's header): LLD_A >= max(1, LOCr(M_A)); names d_D, d_Q,
//      d_ipiv, d_work, d_info: device memory; ipiv int64_t.
//  [D] docs.nvidia.com/cuda/cusolvermp/usage/functions.html: one handle per process and GPU;
//      the handle is tied to its device and stream; SetStream's stream must belong to the
//      handle's device (context).
//  [S] NVIDIA's CUDALibrarySamples, cuSOLVERMp/mp_getrf_getrs.c, mp_potrf_potrs.c, helpers.h
//      (2025): RSRC = CSRC = 0 ("current implementation only allows"); (IA-1) % MB_A == 0 and
//      (JA-1) % NB_A == 0 (likewise B, Q); getrs with CUBLAS_OP_N only; potrs and getrs with
//      NRHS == 1 only (FAKECUDA_MP_MULTI_RHS=1 lifts this); d_ipiv holds LOCc(N_A) int64_t;
//      info is device memory (copied back with cudaMemcpyAsync); COL_MAJOR mapping puts rank r
//      at (r % rows, r / rows), ROW_MAJOR at (r / cols, r % cols).
//  [L] ScaLAPACK (p?potrf, p?getrf, p?syevd: MB_A == NB_A; p?potrs, p?getrs: B's row blocks
//      those of A, MB_B == MB_A; p?syevd: Q blocked as A), since cuSOLVERMp keeps its layout.
//  [N] nccl.h and NCCL's behaviour: every rank passes the same ncclUniqueId; two ranks of one
//      communicator on one GPU are an error ("Duplicate GPU detected"); buffers are device
//      memory of the communicator's device, the stream on that device.
//  [Q] ScaLAPACK's p?geqrf / p?orgqr (p?ungqr): d_tau holds LOCc(JA + min(M, N) - 1) elements of
//      A's type (orgqr: LOCc(JA + K - 1)), K <= N <= M for orgqr; p?gels: B's row blocks A's
//      (MB_B == MB_A), B at least max(M, N) x NRHS. Like [L], ScaLAPACK's documented rules
//      carried over because cuSOLVERMp takes ScaLAPACK's descriptors and argument lists; neither
//      NVIDIA's header nor a sample states them, and no GPU has run these routines yet.
//  [V] cusolverMp.h: cusolverMpGetVersion(handle, int* version), version = major * 1000 +
//      minor * 100 + patch (CUSOLVERMP_VERSION). The emulator answers 800 (0.8.0: it has no
//      cusolverMpGesvd, which came in 0.9.0), or FAKECUDA_MP_VERSION when set.
//  [G] the first GPU run of cuSOLVERMp 0.8.0 (H100, benchmarks/results/
//      nvidia-h100-80gb-hbm3_2026-11-27.md): Potrs, Geqrf and Orgqr that succeed leave d_info as
//      it was (jaxmg read the scratch's old contents as an illegal argument), and NVIDIA's
//      samples (mp_gels.c) set d_info to 0 before the call, so every routine here writes d_info
//      only where it fails. Getrf of a matrix whose U(256, 256) is exactly zero (N = 256, tiles
//      of 8) said 8, not LAPACK's 256: here info > 0 is the index within its tile, the one
//      reading that fits what was seen; nothing should depend on more than info > 0. Potrf of
//      a matrix that is not positive definite (N = 256, tiles of 8, A(129, 129) = -1, in a
//      process with no call before) returned CUSOLVER_STATUS_INTERNAL_ERROR, not an info.
//  [E] the emulator's own limits, all jaxmg needs: one communicator over the whole MPI job
//      (nranks == MPI world size, rank == MPI world rank, so the grid's processes are the
//      job's), IA = JA = IB = JB = IQ = JQ = 1, uplo = LOWER, ncclFloat32/ncclFloat64 with
//      ncclSum, the current device equal to the handle's at each call, no null stream.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fake_cuda.h"
#include "vendor/cusolvermp_api.h"  // packages/jaxmg-cuda/csrc/ on the include path

using jaxmg::cuda::cublasFillMode_t;
using jaxmg::cuda::cublasOperation_t;
using jaxmg::cuda::cudaDataType;
using jaxmg::cuda::cusolverMpGrid_t;
using jaxmg::cuda::cusolverMpGridMapping_t;
using jaxmg::cuda::cusolverMpHandle_t;
using jaxmg::cuda::cusolverMpMatrixDescriptor_t;
using jaxmg::cuda::cusolverStatus_t;
using jaxmg::cuda::ncclComm_t;
using jaxmg::cuda::ncclDataType_t;
using jaxmg::cuda::ncclRedOp_t;
using jaxmg::cuda::ncclResult_t;
using jaxmg::cuda::ncclUniqueId;

// The objects behind the opaque handles.
struct jaxmg::cuda::ncclComm {
  int device, rank, nranks;
};
struct jaxmg::cuda::cusolverMpHandle {
  int device;
  const void* stream;
};
struct jaxmg::cuda::cusolverMpGrid {
  cusolverMpHandle* handle;
  ncclComm* comm;
  int rows, cols, mapping;
  int context;   // the BLACS context
  int row, col;  // this process's position
};
struct jaxmg::cuda::cusolverMpMatrixDescriptor {
  cusolverMpGrid* grid;
  int type;
  int64_t m, n, mb, nb, lld;
  int64_t local_rows, local_cols;  // this process's part
  int desc[9];                     // ScaLAPACK's descriptor, on the grid's context
};

namespace {

using jaxmg::cuda::cusolverMpGrid;
using jaxmg::cuda::cusolverMpMatrixDescriptor;
using Int = int;  // MKL's LP64 ScaLAPACK and BLACS

constexpr cusolverStatus_t kSuccess = 0;
constexpr cusolverStatus_t kInvalidValue = 3;   // CUSOLVER_STATUS_INVALID_VALUE
constexpr cusolverStatus_t kInternalError = 7;  // CUSOLVER_STATUS_INTERNAL_ERROR
constexpr ncclResult_t kNcclSystemError = 2;
constexpr ncclResult_t kNcclInvalidArgument = 4;
constexpr ncclResult_t kNcclInvalidUsage = 5;
constexpr char kIdMagic[8] = {'f', 'a', 'k', 'e', 'n', 'c', 'c', 'l'};

// MPICH's handles (mpi.h of MPICH 4 and 5: MPI_COMM_WORLD, MPI_INT, ...).
constexpr int kMpiCommWorld = 0x44000000;
constexpr int kMpiInt = 0x4c000405, kMpiFloat = 0x4c00040a, kMpiDouble = 0x4c00080b;
constexpr int kMpiSum = 0x58000003, kMpiMin = 0x58000002;
void* const kMpiInPlace = reinterpret_cast<void*>(-1);  // MPI_IN_PLACE

template <typename... A>
std::string S(const A&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Collects every problem of one call, then reports them as one violation.
struct Checker {
  const char* fn;
  std::string why;
  bool ok() const { return why.empty(); }
  void Fail(const std::string& s) { why += (why.empty() ? "" : "; ") + s; }
  template <typename Status>
  Status Report(Status status) const {
    fakecuda::RecordViolation(fn, why);
    return status;
  }
};

// --- MPI, BLACS and ScaLAPACK, found in the process -----------------------------------------

template <typename Fn>
Fn Sym(const std::string& name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name.c_str()));
}

struct Mpi {
  int (*initialized)(int*);
  int (*comm_size)(int, int*);
  int (*comm_rank)(int, int*);
  int (*allreduce)(const void*, void*, int, int, int, int);
  int (*allgather)(const void*, int, int, void*, int, int, int);
  int (*get_library_version)(char*, int*);
};

// MPI, or nullptr with the reason in *why: not loaded, not MPICH, or not initialised.
const Mpi* GetMpi(std::string* why) {
  static const Mpi mpi = {
      Sym<int (*)(int*)>("MPI_Initialized"),
      Sym<int (*)(int, int*)>("MPI_Comm_size"),
      Sym<int (*)(int, int*)>("MPI_Comm_rank"),
      Sym<int (*)(const void*, void*, int, int, int, int)>("MPI_Allreduce"),
      Sym<int (*)(const void*, int, int, void*, int, int, int)>("MPI_Allgather"),
      Sym<int (*)(char*, int*)>("MPI_Get_library_version"),
  };
  if (mpi.initialized == nullptr || mpi.comm_size == nullptr || mpi.comm_rank == nullptr ||
      mpi.allreduce == nullptr || mpi.allgather == nullptr || mpi.get_library_version == nullptr)
    return *why = "MPI is not loaded in this process (call jaxmg_cuda.mp.load() first)", nullptr;
  static const bool mpich = [] {
    std::vector<char> text(8192, '\0');  // MPI_MAX_LIBRARY_VERSION_STRING of MPICH
    int len = 0;
    return mpi.get_library_version(text.data(), &len) == 0 &&
           std::string(text.data()).find("MPICH") != std::string::npos;
  }();
  if (!mpich) return *why = "the process's MPI is not MPICH (the emulator uses its ABI)", nullptr;
  int initialized = 0;
  mpi.initialized(&initialized);
  if (initialized == 0) return *why = "MPI is not initialised (import mpi4py's MPI first)", nullptr;
  return &mpi;
}

int WorldSize(const Mpi& mpi) {
  int n = 0;
  mpi.comm_size(kMpiCommWorld, &n);
  return n;
}
int WorldRank(const Mpi& mpi) {
  int r = -1;
  mpi.comm_rank(kMpiCommWorld, &r);
  return r;
}

// Whether every process of the job found its arguments right.
bool AllOk(const Mpi& mpi, bool ok) {
  int v = ok ? 1 : 0;
  mpi.allreduce(kMpiInPlace, &v, 1, kMpiInt, kMpiMin, kMpiCommWorld);
  return v != 0;
}

// The element-wise sum of ints over the job, in place.
void SumInts(const Mpi& mpi, std::vector<int>* v) {
  if (!v->empty())
    mpi.allreduce(kMpiInPlace, v->data(), static_cast<int>(v->size()), kMpiInt, kMpiSum,
                  kMpiCommWorld);
}

const char* const kBlacs[] = {"blacs_get_", "blacs_gridinit_", "blacs_gridinfo_", "blacs_gridexit_",
                              "descinit_"};

std::string MissingScalapack() {
  std::string missing;
  auto need = [&](const std::string& name) {
    if (dlsym(RTLD_DEFAULT, name.c_str()) == nullptr)
      missing += (missing.empty() ? "" : ", ") + name;
  };
  for (const char* name : kBlacs) need(name);
  for (const char* p : {"s", "d", "c", "z"})
    for (const char* r : {"potrf", "potrs", "getrf", "getrs"}) need(S("p", p, r, "_"));
  for (const char* name : {"pssyevd_", "pdsyevd_", "pcheevd_", "pzheevd_"}) need(name);
  for (const char* p : {"s", "d", "c", "z"})
    for (const char* r : {"geqrf", "gels"}) need(S("p", p, r, "_"));
  for (const char* name : {"psorgqr_", "pdorgqr_", "pcungqr_", "pzungqr_"}) need(name);
  return missing;
}

// --- element types --------------------------------------------------------------------------

size_t ElementSize(int type) { return fakecuda::ElementSizeOf(type); }
size_t RealSize(int type) { return type == 0 || type == 4 ? 4 : 8; }
bool IsComplex(int type) { return type == 4 || type == 5; }
std::string Prefix(int type) {
  switch (type) {
    case 0: return "s";
    case 1: return "d";
    case 4: return "c";
    default: return "z";
  }
}

// ScaLAPACK's NUMROC.
int64_t Numroc(int64_t n, int64_t nb, int64_t iproc, int64_t isrc, int64_t nprocs) {
  const int64_t dist = (nprocs + iproc - isrc) % nprocs, blocks = n / nb;
  int64_t count = (blocks / nprocs) * nb;
  const int64_t extra = blocks % nprocs;
  if (dist < extra)
    count += nb;
  else if (dist == extra)
    count += n % nb;
  return count;
}

// The global index (0-based) of local index l on process p of `procs`, in blocks of nb.
int64_t GlobalIndex(int64_t l, int64_t nb, int64_t p, int64_t procs) {
  return ((l / nb) * procs + p) * nb + l % nb;
}

// --- the live objects, guarded by fake_cuda's state lock -------------------------------------

auto* comms = new std::set<ncclComm_t>();
auto* handles = new std::set<cusolverMpHandle_t>();
auto* grids = new std::set<cusolverMpGrid_t>();
auto* descs = new std::set<cusolverMpMatrixDescriptor_t>();
auto* calls = new std::map<std::string, long>();  // NOLINT(runtime/int): completed, by name
std::atomic<uint64_t> id_counter{0};

bool MultiRhs() {
  const char* env = std::getenv("FAKECUDA_MP_MULTI_RHS");
  return env != nullptr && *env == '1';
}

// --- checks shared by the routines ---------------------------------------------------------

// The handle: live, its device current, its stream live on its device.
bool CheckHandle(Checker& c, cusolverMpHandle_t h) {
  if (handles->count(h) == 0) return c.Fail(S("unknown or destroyed handle ", h)), false;
  if (fakecuda::CurrentDevice() != h->device)
    c.Fail(S("the current device is ", fakecuda::CurrentDevice(), ", the handle's ", h->device,
             " (cudaSetDevice to the handle's device first)"));
  if (fakecuda::StreamDeviceLocked(h->stream) != h->device)
    c.Fail(S("the handle's stream ", h->stream, " was destroyed"));
  return c.ok();
}

// A device operand: device memory of `device`, aligned, `bytes` inside one allocation, and
// touched by no operation queued on a stream other than `stream`. A null pointer with nothing
// to hold passes.
void CheckDevice(Checker& c, const char* name, const void* p, size_t bytes, size_t align,
                 int device, const void* stream) {
  if (p == nullptr && bytes == 0) return;
  const int on = fakecuda::DeviceOfLocked(p);
  if (on != device) {
    c.Fail(S(name, "=", p, " is not device memory of device ", device, " (it is on ", on,
             ", -1 = host)"));
  } else if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    c.Fail(S(name, "=", p, " is not aligned to ", align, " bytes"));
  } else if (bytes > 0 && !fakecuda::InOneAllocationLocked(p, bytes)) {
    c.Fail(S(name, "=", p, " needs ", bytes, " bytes inside its allocation"));
  } else if (const long n = fakecuda::QueuedElsewhereLocked(stream, p, std::max<size_t>(bytes, 1));
             n > 0) {  // NOLINT(runtime/int)
    c.Fail(S(name, " is touched by ", n,
             " operations queued on another stream, not ordered "
             "before this call (synchronise, or queue them on the handle's stream)"));
  }
}

void CheckHostOut(Checker& c, const char* name, const void* p) {
  if (p == nullptr || fakecuda::DeviceOfLocked(p) >= 0)
    c.Fail(S(name, "=", p, " must be host memory"));
}

// A descriptor used by a routine: live, of the compute type, on a live grid of this handle.
const cusolverMpMatrixDescriptor* CheckDesc(Checker& c, const char* name, cusolverMpHandle_t h,
                                            cusolverMpMatrixDescriptor_t d, int type) {
  if (descs->count(d) == 0)
    return c.Fail(S("unknown or destroyed descriptor of ", name, " ", d)), nullptr;
  if (d->type != type)
    c.Fail(S("computeType ", type, " but ", name, "'s descriptor has data type ", d->type));
  if (grids->count(d->grid) == 0)
    c.Fail(S(name, "'s grid was destroyed"));
  else if (d->grid->handle != h)
    c.Fail(S(name, "'s grid was made with another handle"));
  return c.ok() ? d : nullptr;
}

// The global offsets: 1 here [E], and at a block boundary anyway [S].
void CheckOffsets(Checker& c, const char* name, int64_t i, int64_t j,
                  const cusolverMpMatrixDescriptor* d) {
  if (i != 1 || j != 1) c.Fail(S(name, "'s offsets are (", i, ", ", j, "): the emulator takes 1"));
  if (d != nullptr && ((i - 1) % d->mb != 0 || (j - 1) % d->nb != 0))
    c.Fail(S(name, "'s offsets (", i, ", ", j, ") are not at a block boundary"));
}

// The local array a descriptor implies on this process, in bytes.
size_t LocalBytes(const cusolverMpMatrixDescriptor& d) {
  return static_cast<size_t>(d.lld * d.local_cols) * ElementSize(d.type);
}

// B (or Q) on A's grid layout, with A's row blocks [L].
void CheckLike(Checker& c, const char* name, const cusolverMpMatrixDescriptor& a,
               const cusolverMpMatrixDescriptor& b) {
  const cusolverMpGrid &ga = *a.grid, &gb = *b.grid;
  if (ga.comm != gb.comm || ga.rows != gb.rows || ga.cols != gb.cols || ga.mapping != gb.mapping)
    c.Fail(S(name, "'s grid is not laid out as A's"));
  if (b.mb != a.mb) c.Fail(S(name, "'s row block ", b.mb, " is not A's ", a.mb));
}

// A's blocks square [L], and the matrix at least n x n (m x n).
void CheckSquareBlocks(Checker& c, const cusolverMpMatrixDescriptor& a, int64_t m, int64_t n) {
  if (a.mb != a.nb) c.Fail(S("A's blocks are ", a.mb, " x ", a.nb, " (need MB_A == NB_A)"));
  if (m < 0 || n < 0 || m > a.m || n > a.n)
    c.Fail(S("the ", m, " x ", n, " problem does not fit A's ", a.m, " x ", a.n));
}

// --- workspace sizes (bytes): arbitrary, deterministic, growing with the problem -------------

size_t DeviceBytes(const char* routine, const cusolverMpMatrixDescriptor& a, int64_t nrhs) {
  const size_t es = ElementSize(a.type), nb = static_cast<size_t>(a.nb);
  const size_t base = es * (4 * nb * nb + 64);
  const size_t local = static_cast<size_t>(a.lld * std::max<int64_t>(a.local_cols, 1));
  if (std::strcmp(routine, "potrf") == 0) return base + es * static_cast<size_t>(a.lld) * nb;
  if (std::strcmp(routine, "potrs") == 0 || std::strcmp(routine, "getrs") == 0)
    return base + es * static_cast<size_t>(a.lld) * static_cast<size_t>(std::max<int64_t>(nrhs, 1));
  if (std::strcmp(routine, "getrf") == 0) return base + 8 * static_cast<size_t>(a.lld + a.nb);
  if (std::strcmp(routine, "geqrf") == 0 || std::strcmp(routine, "orgqr") == 0)
    return base + es * static_cast<size_t>(a.lld) * nb;
  if (std::strcmp(routine, "gels") == 0)
    return base + es * (local + static_cast<size_t>(a.lld * std::max<int64_t>(nrhs, 1)));
  return base + 3 * es * local;  // syevd
}
size_t HostBytes(const cusolverMpMatrixDescriptor& a) {
  return 1024 + 8 * static_cast<size_t>(a.n);
}

void CheckWork(Checker& c, cusolverMpHandle_t h, void* d_work, size_t d_bytes, void* h_work,
               size_t h_bytes, size_t need_d, size_t need_h) {
  if (d_bytes < need_d)
    c.Fail(S("workspaceInBytesOnDevice ", d_bytes, " is below the _bufferSize answer ", need_d));
  if (h_bytes < need_h)
    c.Fail(S("workspaceInBytesOnHost ", h_bytes, " is below the _bufferSize answer ", need_h));
  CheckDevice(c, "d_work", d_work, d_bytes, 1, h->device, h->stream);
  if (h_bytes > 0 && (h_work == nullptr || fakecuda::DeviceOfLocked(h_work) >= 0))
    c.Fail(S("h_work=", h_work, " must be host memory"));
}

void CheckInfo(Checker& c, cusolverMpHandle_t h, int* info) {
  if (info == nullptr) return c.Fail("null info");
  CheckDevice(c, "info", info, sizeof(int), alignof(int), h->device, h->stream);
}

// --- one routine call: checks, agreement, inputs, outputs ------------------------------------

class Call {
 public:
  explicit Call(const char* fn) : c{fn, {}}, lock_(fakecuda::LockState()) {}

  Checker c;

  // After the checks: MPI and ScaLAPACK present, and every process agrees that its arguments
  // are right. Then synchronises the handle's stream and scribbles over the workspaces. The
  // state lock is held on return, for reading the inputs.
  bool Start(cusolverMpHandle_t h, void* d_work, size_t d_bytes, void* h_work, size_t h_bytes) {
    std::string why;
    mpi_ = GetMpi(&why);
    if (mpi_ == nullptr)
      c.Fail(why);
    else if (const std::string missing = MissingScalapack(); !missing.empty())
      c.Fail("ScaLAPACK and BLACS are not loaded (jaxmg_cuda.mp.load()): missing " + missing);
    if (mpi_ == nullptr) return c.Report(false);
    const bool ok_here = c.ok();
    lock_.unlock();
    const bool all = AllOk(*mpi_, ok_here);
    lock_.lock();
    if (!ok_here) return c.Report(false);
    if (!all) {
      c.Fail("another process rejected its arguments of this call");
      return c.Report(false);
    }
    if (fakecuda::StreamDeviceLocked(h->stream) != h->device) {
      c.Fail("the handle's stream was destroyed during the call");
      return c.Report(false);
    }
    stream_ = h->stream;
    fakecuda::SynchronizeStreamLocked(stream_);
    if (d_work != nullptr && d_bytes > 0) std::memset(d_work, 0xFF, d_bytes);
    if (h_work != nullptr && h_bytes > 0) std::memset(h_work, 0xFF, h_bytes);
    return true;
  }

  const Mpi& mpi() const { return *mpi_; }

  std::vector<char> Read(const void* p, size_t bytes) {
    const char* b = static_cast<const char*>(p);
    return bytes > 0 ? std::vector<char>(b, b + bytes) : std::vector<char>();
  }

  void Unlock() { lock_.unlock(); }

  // Queues the outputs on the stream; counts the call.
  void Finish(std::vector<std::pair<void*, std::vector<char>>> writes) {
    lock_.lock();
    for (auto& [dst, bytes] : writes) {
      if (bytes.empty()) continue;
      if (!fakecuda::InOneAllocationLocked(dst, bytes.size())) {
        c.Fail(S("an output at ", dst, " was freed during the call"));
        continue;
      }
      fakecuda::EnqueueWriteLocked(stream_, dst, std::move(bytes));
    }
    if (!c.ok())
      c.Report(0);
    else
      ++(*calls)[c.fn];
  }

  // Fails the call after Start, with the state lock released.
  void Abort() {
    lock_.lock();
    c.Report(0);
  }

 private:
  std::unique_lock<std::mutex> lock_;
  const Mpi* mpi_ = nullptr;
  const void* stream_ = nullptr;
};

// What a routine writes to d_info: its status where it failed, nothing where it succeeded [G].
std::vector<char> InfoBytes(int status) {
  if (status == 0) return {};
  std::vector<char> out(sizeof(status));
  std::memcpy(out.data(), &status, sizeof(status));
  return out;
}

// ScaLAPACK's descriptor of d on the context of `on` (B and Q on A's grid's context, which
// ScaLAPACK requires to be the same).
std::vector<Int> DescOn(const cusolverMpMatrixDescriptor& d, const cusolverMpMatrixDescriptor& on) {
  std::vector<Int> out(d.desc, d.desc + 9);
  out[1] = on.desc[1];
  return out;
}

// The local array of d, at least one element (ScaLAPACK indexes it even when empty).
std::vector<char> Padded(std::vector<char> bytes, const cusolverMpMatrixDescriptor& d) {
  bytes.resize(std::max(bytes.size(), ElementSize(d.type)));
  return bytes;
}
std::vector<char> Trimmed(std::vector<char> bytes, const cusolverMpMatrixDescriptor& d) {
  bytes.resize(LocalBytes(d));
  return bytes;
}

// --- the routines' own checks ------------------------------------------------------------

const cusolverMpMatrixDescriptor* CheckPotrf(Checker& c, cusolverMpHandle_t h, int uplo, int64_t n,
                                             const void* a, int64_t ia, int64_t ja,
                                             cusolverMpMatrixDescriptor_t desc_a, int type) {
  if (!CheckHandle(c, h)) return nullptr;
  if (uplo != 0) c.Fail(S("uplo ", uplo, " (the emulator takes CUBLAS_FILL_MODE_LOWER)"));
  const cusolverMpMatrixDescriptor* d = CheckDesc(c, "A", h, desc_a, type);
  CheckOffsets(c, "A", ia, ja, d);
  if (d == nullptr) return nullptr;
  CheckSquareBlocks(c, *d, n, n);
  CheckDevice(c, "A", a, LocalBytes(*d), RealSize(type), h->device, h->stream);
  return c.ok() ? d : nullptr;
}

// B of potrs and getrs: n x nrhs of a descriptor like A's.
const cusolverMpMatrixDescriptor* CheckB(Checker& c, cusolverMpHandle_t h, int64_t n, int64_t nrhs,
                                         const void* b, int64_t ib, int64_t jb,
                                         cusolverMpMatrixDescriptor_t desc_b, int type,
                                         const cusolverMpMatrixDescriptor* a) {
  if (nrhs < 0 || (nrhs != 1 && !MultiRhs()))
    c.Fail(S("NRHS=", nrhs,
             " (cuSOLVERMp's potrs and getrs take NRHS == 1; "
             "FAKECUDA_MP_MULTI_RHS=1 lifts this)"));
  const cusolverMpMatrixDescriptor* d = CheckDesc(c, "B", h, desc_b, type);
  CheckOffsets(c, "B", ib, jb, d);
  if (d == nullptr) return nullptr;
  if (n > d->m || nrhs > d->n)
    c.Fail(S("B's descriptor is ", d->m, " x ", d->n, " for N=", n, ", NRHS=", nrhs));
  if (a != nullptr) CheckLike(c, "B", *a, *d);
  CheckDevice(c, "B", b, LocalBytes(*d), RealSize(type), h->device, h->stream);
  return c.ok() ? d : nullptr;
}

// d_ipiv: LOCc(N_A) int64_t [S].
void CheckPivots(Checker& c, cusolverMpHandle_t h, const void* ipiv,
                 const cusolverMpMatrixDescriptor& a) {
  if (ipiv == nullptr && a.local_cols > 0) return c.Fail("null d_ipiv");
  CheckDevice(c, "d_ipiv", ipiv, static_cast<size_t>(a.local_cols) * sizeof(int64_t),
              alignof(int64_t), h->device, h->stream);
}

const cusolverMpMatrixDescriptor* CheckGetrf(Checker& c, cusolverMpHandle_t h, int64_t m, int64_t n,
                                             const void* a, int64_t ia, int64_t ja,
                                             cusolverMpMatrixDescriptor_t desc_a, const void* ipiv,
                                             int type) {
  if (!CheckHandle(c, h)) return nullptr;
  const cusolverMpMatrixDescriptor* d = CheckDesc(c, "A", h, desc_a, type);
  CheckOffsets(c, "A", ia, ja, d);
  if (d == nullptr) return nullptr;
  CheckSquareBlocks(c, *d, m, n);
  CheckDevice(c, "A", a, LocalBytes(*d), RealSize(type), h->device, h->stream);
  CheckPivots(c, h, ipiv, *d);
  return c.ok() ? d : nullptr;
}

struct Syevd {
  const cusolverMpMatrixDescriptor *a = nullptr, *q = nullptr;
  bool vectors = false;
};

Syevd CheckSyevd(Checker& c, cusolverMpHandle_t h, const char* jobz, int uplo, int64_t n,
                 const void* a, int64_t ia, int64_t ja, cusolverMpMatrixDescriptor_t desc_a,
                 const void* d, const void* q, int64_t iq, int64_t jq,
                 cusolverMpMatrixDescriptor_t desc_q, int type) {
  Syevd out;
  const cusolverMpMatrixDescriptor* da = CheckPotrf(c, h, uplo, n, a, ia, ja, desc_a, type);
  if (jobz == nullptr || fakecuda::DeviceOfLocked(jobz) >= 0)
    c.Fail(S("jobz=", static_cast<const void*>(jobz), " must be a host string"));
  else if (*jobz != 'V' && *jobz != 'N')
    c.Fail(S("jobz '", *jobz, "' (need 'V' or 'N')"));
  else
    out.vectors = *jobz == 'V';
  if (da == nullptr || !c.ok()) return out;
  CheckDevice(c, "d_D", d, static_cast<size_t>(n) * RealSize(type), RealSize(type), h->device,
              h->stream);
  if (out.vectors) {
    out.q = CheckDesc(c, "Q", h, desc_q, type);
    CheckOffsets(c, "Q", iq, jq, out.q);
    if (out.q != nullptr) {
      CheckLike(c, "Q", *da, *out.q);
      if (out.q->nb != da->nb || n > out.q->m || n > out.q->n)
        c.Fail(S("Q's descriptor (", out.q->m, " x ", out.q->n, " in ", out.q->mb, " x ", out.q->nb,
                 " blocks) does not hold A's ", n, " x ", n, " in A's blocks"));
      CheckDevice(c, "d_Q", q, LocalBytes(*out.q), RealSize(type), h->device, h->stream);
    }
  }
  if (c.ok()) out.a = da;
  return out;
}

// A of geqrf and orgqr: m x n (orgqr: k <= n <= m) on a descriptor with square blocks [L], and
// d_tau's LOCc(JA + k - 1) elements of A's type [Q].
const cusolverMpMatrixDescriptor* CheckQr(Checker& c, cusolverMpHandle_t h, int64_t m, int64_t n,
                                          int64_t k, const void* a, int64_t ia, int64_t ja,
                                          cusolverMpMatrixDescriptor_t desc_a, const void* tau,
                                          int type) {
  if (!CheckHandle(c, h)) return nullptr;
  const cusolverMpMatrixDescriptor* d = CheckDesc(c, "A", h, desc_a, type);
  CheckOffsets(c, "A", ia, ja, d);
  if (d == nullptr) return nullptr;
  CheckSquareBlocks(c, *d, m, n);
  if (k < 0 || k > std::min(m, n)) c.Fail(S("K=", k, " outside 0..min(M, N)=", std::min(m, n)));
  CheckDevice(c, "A", a, LocalBytes(*d), RealSize(type), h->device, h->stream);
  const cusolverMpGrid& g = *d->grid;
  const size_t taus = static_cast<size_t>(Numroc(std::max<int64_t>(k, 0), d->nb, g.col, 0, g.cols));
  if (tau == nullptr && taus > 0) c.Fail("null d_tau");
  CheckDevice(c, "d_tau", tau, taus * ElementSize(type), RealSize(type), h->device, h->stream);
  return c.ok() ? d : nullptr;
}

// ScaLAPACK's workspace query then the call: `run(work, lwork)` with lwork = -1 first.
template <typename Run>
void WithWorkspace(int type, Run run) {
  alignas(16) char size[32] = {};
  run(static_cast<void*>(size), Int{-1});
  const double x = RealSize(type) == 4 ? double{*reinterpret_cast<const float*>(size)}
                                       : *reinterpret_cast<const double*>(size);
  std::vector<char> work((static_cast<size_t>(x) + 64) * ElementSize(type));
  run(static_cast<void*>(work.data()), static_cast<Int>(work.size() / ElementSize(type)));
}

}  // namespace

// =============================================================================================
extern "C" {

// --- NCCL ----------------------------------------------------------------------------------

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr)
    return fakecuda::RecordViolation("ncclGetUniqueId", "null output"), kNcclInvalidArgument;
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
  std::random_device random;
  const uint64_t parts[4] = {
      static_cast<uint64_t>(getpid()), ++id_counter,
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()),
      (uint64_t{random()} << 32) ^ random()};
  std::memcpy(id->internal + sizeof(kIdMagic), parts, sizeof(parts));
  return 0;
}

// One communicator over the whole MPI job [E]: the emulator runs its collectives on
// MPI_COMM_WORLD, so nranks must be the job's size and rank the process's MPI rank.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  Checker c{"ncclCommInitRank", {}};
  std::string why;
  const Mpi* mpi = GetMpi(&why);
  if (mpi == nullptr) return c.Fail(why), c.Report(kNcclSystemError);
  const int device = fakecuda::CurrentDevice();
  if (comm == nullptr) c.Fail("null output");
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0)
    c.Fail("the ncclUniqueId was not made by ncclGetUniqueId");
  if (nranks != WorldSize(*mpi) || rank != WorldRank(*mpi))
    c.Fail(S("nranks=", nranks, ", rank=", rank, " but the MPI job has ", WorldSize(*mpi),
             " processes and this is rank ", WorldRank(*mpi),
             " (the emulator's communicator "
             "spans the job, ranks in MPI order)"));
  // Every process's id digest and device, side by side [N].
  uint64_t digest = 1469598103934665603ull;  // FNV-1a
  for (char ch : id.internal) digest = (digest ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  const int mine[3] = {static_cast<int>(digest), static_cast<int>(digest >> 32), device};
  std::vector<int> all(3 * static_cast<size_t>(WorldSize(*mpi)));
  mpi->allgather(mine, 3, kMpiInt, all.data(), 3, kMpiInt, kMpiCommWorld);
  for (size_t r = 0; r < all.size() / 3; ++r) {
    if (all[3 * r] != mine[0] || all[3 * r + 1] != mine[1])
      c.Fail(S("rank ", r, " passed another ncclUniqueId"));
    if (static_cast<int>(r) != WorldRank(*mpi) && all[3 * r + 2] == device)
      c.Fail(S("rank ", r, " is on this rank's device ", device, " (NCCL: duplicate GPU)"));
  }
  if (!AllOk(*mpi, c.ok())) {
    if (c.ok()) c.Fail("another rank rejected its arguments");
    return c.Report(kNcclInvalidUsage);
  }
  auto lock = fakecuda::LockState();
  *comm = *comms->insert(new jaxmg::cuda::ncclComm{device, rank, nranks}).first;
  return 0;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto lock = fakecuda::LockState();
  Checker c{"ncclCommDestroy", {}};
  if (comms->count(comm) == 0) return c.Fail(S("unknown communicator ", comm)), c.Report(4);
  for (cusolverMpGrid_t g : *grids)
    if (g->comm == comm) c.Fail(S("grid ", g, " still uses the communicator"));
  if (!c.ok()) return c.Report(kNcclInvalidUsage);
  comms->erase(comm);
  delete comm;
  return 0;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  Checker c{"ncclAllReduce", {}};
  std::string why;
  const Mpi* mpi = GetMpi(&why);
  if (mpi == nullptr) return c.Fail(why), c.Report(kNcclSystemError);
  auto lock = fakecuda::LockState();
  const size_t size = datatype == jaxmg::cuda::ncclFloat32   ? 4
                      : datatype == jaxmg::cuda::ncclFloat64 ? 8
                                                             : 0;
  if (size == 0) c.Fail(S("datatype ", datatype, " (the emulator takes ncclFloat32, ncclFloat64)"));
  if (op != jaxmg::cuda::ncclSum) c.Fail(S("op ", op, " (the emulator takes ncclSum)"));
  if (comms->count(comm) == 0) {
    c.Fail(S("unknown or destroyed communicator ", comm));
  } else {
    const int device = comm->device;
    if (fakecuda::StreamDeviceLocked(stream) != device)
      c.Fail(S("stream ", static_cast<void*>(stream),
               " is not a live stream of the "
               "communicator's device ",
               device));
    else if (size > 0 && count > 0 && count <= static_cast<size_t>(INT_MAX))
      CheckDevice(c, "sendbuff", send, count * size, size, device, stream),
          CheckDevice(c, "recvbuff", recv, count * size, size, device, stream);
  }
  if (count > static_cast<size_t>(INT_MAX)) c.Fail(S("count ", count, " above INT_MAX"));
  const bool ok_here = c.ok();
  lock.unlock();
  const bool all = AllOk(*mpi, ok_here);
  if (!ok_here) return c.Report(kNcclInvalidArgument);
  if (!all) return c.Fail("another rank rejected its arguments"), c.Report(kNcclInvalidUsage);
  lock.lock();
  if (count == 0) return ++(*calls)["ncclAllReduce"], 0;
  fakecuda::SynchronizeStreamLocked(stream);
  std::vector<char> data(static_cast<const char*>(send),
                         static_cast<const char*>(send) + count * size);
  lock.unlock();
  mpi->allreduce(kMpiInPlace, data.data(), static_cast<int>(count),
                 size == 4 ? kMpiFloat : kMpiDouble, kMpiSum, kMpiCommWorld);
  lock.lock();
  if (!fakecuda::InOneAllocationLocked(recv, data.size()))
    return c.Fail("recvbuff was freed during the call"), c.Report(kNcclInvalidUsage);
  fakecuda::EnqueueWriteLocked(stream, recv, std::move(data));
  ++(*calls)["ncclAllReduce"];
  return 0;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case 0: return "no error";
    case 2: return "unhandled system error (fakecuda)";
    case 4: return "invalid argument (fakecuda)";
    case 5: return "invalid usage (fakecuda)";
    default: return "unknown result code (fakecuda)";
  }
}

// --- cuSOLVERMp: handles, grids, descriptors ---------------------------------------------

// One handle per process and device [D], made with its device current and a live stream of it.
cusolverStatus_t cusolverMpCreate(cusolverMpHandle_t* handle, int device, cudaStream_t stream) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpCreate", {}};
  if (handle == nullptr) c.Fail("null output");
  if (!fakecuda::ValidDevice(device))
    c.Fail(S("invalid device ", device));
  else if (device != fakecuda::CurrentDevice())
    c.Fail(S("device ", device, " is not the current device ", fakecuda::CurrentDevice()));
  if (fakecuda::StreamDeviceLocked(stream) != device)
    c.Fail(S("stream ", static_cast<void*>(stream), " is not a live stream of device ", device));
  for (cusolverMpHandle_t h : *handles)
    if (h->device == device) c.Fail(S("handle ", h, " of device ", device, " is still alive"));
  if (!c.ok()) return c.Report(kInvalidValue);
  *handle = *handles->insert(new jaxmg::cuda::cusolverMpHandle{device, stream}).first;
  return kSuccess;
}

cusolverStatus_t cusolverMpDestroy(cusolverMpHandle_t handle) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpDestroy", {}};
  if (handles->count(handle) == 0) return c.Fail(S("unknown handle ", handle)), c.Report(3);
  for (cusolverMpGrid_t g : *grids)
    if (g->handle == handle) c.Fail(S("grid ", g, " made with the handle is still alive"));
  if (!c.ok()) return c.Report(kInvalidValue);
  handles->erase(handle);
  delete handle;
  return kSuccess;
}

// The new stream must belong to the handle's device [D].
cusolverStatus_t cusolverMpSetStream(cusolverMpHandle_t handle, cudaStream_t stream) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpSetStream", {}};
  if (handles->count(handle) == 0) return c.Fail(S("unknown handle ", handle)), c.Report(3);
  if (fakecuda::StreamDeviceLocked(stream) != handle->device)
    c.Fail(S("stream ", static_cast<void*>(stream),
             " is not a live stream of the handle's "
             "device ",
             handle->device));
  if (!c.ok()) return c.Report(kInvalidValue);
  handle->stream = stream;
  return kSuccess;
}

// [V]
cusolverStatus_t cusolverMpGetVersion(cusolverMpHandle_t handle, int* version) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpGetVersion", {}};
  if (handles->count(handle) == 0) c.Fail(S("unknown handle ", handle));
  CheckHostOut(c, "version", version);
  if (!c.ok()) return c.Report(kInvalidValue);
  const char* env = std::getenv("FAKECUDA_MP_VERSION");
  *version = env != nullptr && *env != '\0' ? std::atoi(env) : 800;
  return kSuccess;
}

// A BLACS grid over the job: ROW_MAJOR puts rank r at (r / cols, r % cols), BLACS's "R";
// COL_MAJOR at (r % rows, r / rows), "C" [S]. Collective, like the real one.
cusolverStatus_t cusolverMpCreateDeviceGrid(cusolverMpHandle_t handle, cusolverMpGrid_t* grid,
                                            ncclComm_t comm, int32_t rows, int32_t cols,
                                            cusolverMpGridMapping_t mapping) {
  Checker c{"cusolverMpCreateDeviceGrid", {}};
  std::string why;
  const Mpi* mpi = GetMpi(&why);
  if (mpi == nullptr) return c.Fail(why), c.Report(kInternalError);
  if (const std::string missing = MissingScalapack(); !missing.empty())
    return c.Fail("BLACS is not loaded: missing " + missing), c.Report(kInternalError);
  auto lock = fakecuda::LockState();
  if (grid == nullptr) c.Fail("null output");
  if (CheckHandle(c, handle) && comms->count(comm) != 0 && comm->device != handle->device)
    c.Fail(S("the communicator is on device ", comm->device, ", the handle on ", handle->device));
  if (comms->count(comm) == 0)
    c.Fail(S("unknown or destroyed communicator ", comm));
  else if (rows < 1 || cols < 1 || int64_t{rows} * cols != comm->nranks)
    c.Fail(S("a ", rows, " x ", cols, " grid for the communicator's ", comm->nranks, " ranks"));
  if (mapping != jaxmg::cuda::CUSOLVERMP_GRID_MAPPING_ROW_MAJOR &&
      mapping != jaxmg::cuda::CUSOLVERMP_GRID_MAPPING_COL_MAJOR)
    c.Fail(S("mapping ", static_cast<int>(mapping)));
  const bool ok_here = c.ok();
  lock.unlock();
  // Every process must ask for the same grid.
  std::vector<int> shape = {ok_here ? 1 : 0, rows, cols, static_cast<int>(mapping)};
  std::vector<int> all(4 * static_cast<size_t>(WorldSize(*mpi)));
  mpi->allgather(shape.data(), 4, kMpiInt, all.data(), 4, kMpiInt, kMpiCommWorld);
  bool all_ok = true;
  for (size_t r = 0; r < all.size() / 4; ++r) {
    all_ok = all_ok && all[4 * r] == 1;
    if (ok_here && all[4 * r] == 1 && !std::equal(shape.begin() + 1, shape.end(), &all[4 * r + 1]))
      c.Fail(S("rank ", r, " asked for a ", all[4 * r + 1], " x ", all[4 * r + 2],
               " grid, mapping ", all[4 * r + 3]));
  }
  if (!ok_here) return c.Report(kInvalidValue);
  if (!c.ok() || !all_ok) {
    if (c.ok()) c.Fail("another process rejected its arguments");
    return c.Report(kInvalidValue);
  }
  Int context = 0, zero = 0, minus_one = -1, r = rows, q = cols, row = -1, col = -1;
  Sym<void (*)(const Int*, const Int*, Int*)>("blacs_get_")(&minus_one, &zero, &context);
  const char* order = mapping == jaxmg::cuda::CUSOLVERMP_GRID_MAPPING_ROW_MAJOR ? "R" : "C";
  Sym<void (*)(Int*, const char*, const Int*, const Int*)>("blacs_gridinit_")(&context, order, &r,
                                                                              &q);
  Sym<void (*)(const Int*, Int*, Int*, Int*, Int*)>("blacs_gridinfo_")(&context, &r, &q, &row,
                                                                       &col);
  lock.lock();
  *grid = *grids
               ->insert(new jaxmg::cuda::cusolverMpGrid{
                   handle, comm, rows, cols, static_cast<int>(mapping), context, row, col})
               .first;
  return kSuccess;
}

cusolverStatus_t cusolverMpDestroyGrid(cusolverMpGrid_t grid) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpDestroyGrid", {}};
  if (grids->count(grid) == 0) return c.Fail(S("unknown grid ", grid)), c.Report(3);
  for (cusolverMpMatrixDescriptor_t d : *descs)
    if (d->grid == grid) c.Fail(S("descriptor ", d, " on the grid is still alive"));
  if (!c.ok()) return c.Report(kInvalidValue);
  grids->erase(grid);
  lock.unlock();
  Sym<void (*)(const Int*)>("blacs_gridexit_")(&grid->context);
  delete grid;
  return kSuccess;
}

cusolverStatus_t cusolverMpCreateMatrixDesc(cusolverMpMatrixDescriptor_t* desc,
                                            cusolverMpGrid_t grid, cudaDataType type, int64_t m,
                                            int64_t n, int64_t mb, int64_t nb, uint32_t rsrc,
                                            uint32_t csrc, int64_t lld) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpCreateMatrixDesc", {}};
  if (desc == nullptr) c.Fail("null output");
  if (grids->count(grid) == 0) return c.Fail(S("unknown grid ", grid)), c.Report(kInvalidValue);
  if (ElementSize(type) == 0) c.Fail(S("data type ", static_cast<int>(type)));
  if (m < 0 || n < 0 || mb < 1 || nb < 1 || m > INT_MAX || n > INT_MAX || lld > INT_MAX)
    c.Fail(S(m, " x ", n, " in ", mb, " x ", nb, " blocks"));
  if (rsrc != 0 || csrc != 0) c.Fail(S("RSRC=", rsrc, ", CSRC=", csrc, " (need 0, 0)"));
  if (!c.ok()) return c.Report(kInvalidValue);
  const int64_t local_rows = Numroc(m, mb, grid->row, 0, grid->rows);
  const int64_t local_cols = Numroc(n, nb, grid->col, 0, grid->cols);
  if (lld < std::max<int64_t>(1, local_rows))
    c.Fail(S("LLD=", lld, " is below max(1, LOCr(M))=", std::max<int64_t>(1, local_rows)));
  if (!c.ok()) return c.Report(kInvalidValue);
  auto* d = new jaxmg::cuda::cusolverMpMatrixDescriptor{
      grid, static_cast<int>(type), m, n, mb, nb, lld, local_rows, local_cols, {}};
  Int im = static_cast<Int>(m), in = static_cast<Int>(n), imb = static_cast<Int>(mb),
      inb = static_cast<Int>(nb), zero = 0, illd = static_cast<Int>(lld), info = 0;
  Sym<void (*)(Int*, const Int*, const Int*, const Int*, const Int*, const Int*, const Int*,
               const Int*, const Int*, Int*)>("descinit_")(d->desc, &im, &in, &imb, &inb, &zero,
                                                           &zero, &grid->context, &illd, &info);
  if (info != 0) {
    delete d;
    return c.Fail(S("descinit rejected it (info ", info, ")")), c.Report(kInvalidValue);
  }
  *desc = *descs->insert(d).first;
  return kSuccess;
}

cusolverStatus_t cusolverMpDestroyMatrixDesc(cusolverMpMatrixDescriptor_t desc) {
  auto lock = fakecuda::LockState();
  if (descs->erase(desc) == 0)
    return fakecuda::RecordViolation("cusolverMpDestroyMatrixDesc", S("unknown descriptor ", desc)),
           kInvalidValue;
  delete desc;
  return kSuccess;
}

int64_t cusolverMpNUMROC(int64_t n, int64_t nb, uint32_t iproc, uint32_t isrcproc,
                         uint32_t nprocs) {
  if (n < 0 || nb < 1 || nprocs < 1 || iproc >= nprocs || isrcproc >= nprocs) {
    fakecuda::RecordViolation("cusolverMpNUMROC", S("n=", n, ", nb=", nb, ", iproc=", iproc,
                                                    ", isrcproc=", isrcproc, ", nprocs=", nprocs));
    return 0;
  }
  return Numroc(n, nb, iproc, isrcproc, nprocs);
}

// --- cuSOLVERMp: the routines ---------------------------------------------------------------

cusolverStatus_t cusolverMpPotrf_bufferSize(cusolverMpHandle_t h, cublasFillMode_t uplo, int64_t n,
                                            const void* a, int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, cudaDataType type,
                                            size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpPotrf_bufferSize", {}};
  const auto* d = CheckPotrf(c, h, uplo, n, a, ia, ja, desc_a, type);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("potrf", *d, 0);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// A = L L^H, L into A's lower triangle. A matrix that is not positive definite fails the call
// with CUSOLVER_STATUS_INTERNAL_ERROR and info unwritten [G]; A then holds ScaLAPACK's partial
// factor, which nothing may rely on.
cusolverStatus_t cusolverMpPotrf(cusolverMpHandle_t h, cublasFillMode_t uplo, int64_t n, void* a,
                                 int64_t ia, int64_t ja, cusolverMpMatrixDescriptor_t desc_a,
                                 cudaDataType type, void* d_work, size_t d_bytes, void* h_work,
                                 size_t h_bytes, int* info) {
  Call call("cusolverMpPotrf");
  Checker& c = call.c;
  const auto* d = CheckPotrf(c, h, uplo, n, a, ia, ja, desc_a, type);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("potrf", *d, 0), HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  std::vector<char> local = Padded(call.Read(a, LocalBytes(*d)), *d);
  call.Unlock();
  Int status = 0, in = static_cast<Int>(n), one = 1;
  Sym<void (*)(const char*, const Int*, void*, const Int*, const Int*, const Int*, Int*)>(
      "p" + Prefix(type) + "potrf_")("L", &in, local.data(), &one, &one, d->desc, &status);
  call.Finish({{a, Trimmed(std::move(local), *d)}, {info, InfoBytes(status < 0 ? status : 0)}});
  return status > 0 ? kInternalError : kSuccess;
}

cusolverStatus_t cusolverMpPotrs_bufferSize(cusolverMpHandle_t h, cublasFillMode_t uplo, int64_t n,
                                            int64_t nrhs, const void* a, int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, const void* b,
                                            int64_t ib, int64_t jb,
                                            cusolverMpMatrixDescriptor_t desc_b, cudaDataType type,
                                            size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpPotrs_bufferSize", {}};
  const auto* d = CheckPotrf(c, h, uplo, n, a, ia, ja, desc_a, type);
  CheckB(c, h, n, nrhs, b, ib, jb, desc_b, type, d);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("potrs", *d, nrhs);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// A holds L from potrf: solves A X = B for B's first NRHS columns.
cusolverStatus_t cusolverMpPotrs(cusolverMpHandle_t h, cublasFillMode_t uplo, int64_t n,
                                 int64_t nrhs, const void* a, int64_t ia, int64_t ja,
                                 cusolverMpMatrixDescriptor_t desc_a, void* b, int64_t ib,
                                 int64_t jb, cusolverMpMatrixDescriptor_t desc_b, cudaDataType type,
                                 void* d_work, size_t d_bytes, void* h_work, size_t h_bytes,
                                 int* info) {
  Call call("cusolverMpPotrs");
  Checker& c = call.c;
  const auto* d = CheckPotrf(c, h, uplo, n, a, ia, ja, desc_a, type);
  const auto* db = CheckB(c, h, n, nrhs, b, ib, jb, desc_b, type, d);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("potrs", *d, nrhs),
              HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  std::vector<char> la = Padded(call.Read(a, LocalBytes(*d)), *d);
  std::vector<char> lb = Padded(call.Read(b, LocalBytes(*db)), *db);
  call.Unlock();
  const std::vector<Int> desc_b_on_a = DescOn(*db, *d);
  Int status = 0, in = static_cast<Int>(n), ir = static_cast<Int>(nrhs), one = 1;
  Sym<void (*)(const char*, const Int*, const Int*, const void*, const Int*, const Int*, const Int*,
               void*, const Int*, const Int*, const Int*, Int*)>("p" + Prefix(type) + "potrs_")(
      "L", &in, &ir, la.data(), &one, &one, d->desc, lb.data(), &one, &one, desc_b_on_a.data(),
      &status);
  call.Finish({{b, Trimmed(std::move(lb), *db)}, {info, InfoBytes(status)}});
  return kSuccess;
}

cusolverStatus_t cusolverMpGetrf_bufferSize(cusolverMpHandle_t h, int64_t m, int64_t n, void* a,
                                            int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, int64_t* ipiv,
                                            cudaDataType type, size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpGetrf_bufferSize", {}};
  const auto* d = CheckGetrf(c, h, m, n, a, ia, ja, desc_a, ipiv, type);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("getrf", *d, 0);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// A = P L U with partial pivoting. d_ipiv: for each of this process's local columns j of A,
// the 1-based global row that row j was swapped with (as ScaLAPACK's pivots, laid out along
// A's columns [S]), on every process row.
cusolverStatus_t cusolverMpGetrf(cusolverMpHandle_t h, int64_t m, int64_t n, void* a, int64_t ia,
                                 int64_t ja, cusolverMpMatrixDescriptor_t desc_a, int64_t* ipiv,
                                 cudaDataType type, void* d_work, size_t d_bytes, void* h_work,
                                 size_t h_bytes, int* info) {
  Call call("cusolverMpGetrf");
  Checker& c = call.c;
  const auto* d = CheckGetrf(c, h, m, n, a, ia, ja, desc_a, ipiv, type);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("getrf", *d, 0), HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  const cusolverMpGrid& g = *d->grid;
  std::vector<char> local = Padded(call.Read(a, LocalBytes(*d)), *d);
  std::vector<char> piv_bytes = call.Read(ipiv, static_cast<size_t>(d->local_cols) * 8);
  call.Unlock();
  std::vector<Int> sc_piv(static_cast<size_t>(d->local_rows + d->mb));
  Int status = 0, im = static_cast<Int>(m), in = static_cast<Int>(n), one = 1;
  Sym<void (*)(const Int*, const Int*, void*, const Int*, const Int*, const Int*, Int*, Int*)>(
      "p" + Prefix(type) + "getrf_")(&im, &in, local.data(), &one, &one, d->desc, sc_piv.data(),
                                     &status);
  const int64_t k = std::min(m, n);
  // MKL's p?getrf answers 0 for an exactly zero U(j, j) (seen on a 1 x 1 grid): the status
  // is LAPACK's, the first such j, read from the diagonal every process holds a part of.
  std::vector<int> zeros(static_cast<size_t>(k), 0);
  const size_t esize = ElementSize(type), real = RealSize(type);
  for (int64_t l = 0; l < d->local_cols; ++l) {
    const int64_t j = GlobalIndex(l, d->nb, g.col, g.cols);
    for (int64_t r = 0; r < d->local_rows && j < k; ++r) {
      if (GlobalIndex(r, d->mb, g.row, g.rows) != j) continue;
      const char* p = local.data() + static_cast<size_t>(r + l * d->lld) * esize;
      bool zero = true;
      for (size_t part = 0; part < esize / real; ++part)
        zero = zero && (real == 4 ? reinterpret_cast<const float*>(p)[part]
                                  : reinterpret_cast<const double*>(p)[part]) == 0;
      zeros[static_cast<size_t>(j)] = zero ? 1 : 0;
    }
  }
  SumInts(call.mpi(), &zeros);
  status = 0;
  for (int64_t j = k - 1; j >= 0; --j)
    if (zeros[static_cast<size_t>(j)] != 0) status = static_cast<Int>(j + 1);
  // ScaLAPACK's pivots follow A's rows (every process column has them): gather them from
  // process column 0, then lay them out along A's columns.
  std::vector<int> global(static_cast<size_t>(k), 0);
  if (g.col == 0)
    for (int64_t l = 0; l < d->local_rows; ++l)
      if (const int64_t i = GlobalIndex(l, d->mb, g.row, g.rows); i < k) global[i] = sc_piv[l];
  SumInts(call.mpi(), &global);
  for (int64_t l = 0; l < d->local_cols; ++l)
    if (const int64_t j = GlobalIndex(l, d->nb, g.col, g.cols); j < k) {
      const int64_t v = global[j];
      std::memcpy(piv_bytes.data() + 8 * l, &v, 8);
    }
  call.Finish(
      {{a, Trimmed(std::move(local), *d)}, {ipiv, std::move(piv_bytes)},
       {info, InfoBytes(status > 0 ? static_cast<int>((status - 1) % d->mb) + 1 : status)}});
  return kSuccess;
}

cusolverStatus_t cusolverMpGetrs_bufferSize(cusolverMpHandle_t h, cublasOperation_t trans,
                                            int64_t n, int64_t nrhs, const void* a, int64_t ia,
                                            int64_t ja, cusolverMpMatrixDescriptor_t desc_a,
                                            const int64_t* ipiv, void* b, int64_t ib, int64_t jb,
                                            cusolverMpMatrixDescriptor_t desc_b, cudaDataType type,
                                            size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpGetrs_bufferSize", {}};
  if (trans != jaxmg::cuda::CUBLAS_OP_N) c.Fail(S("trans ", trans, " (only CUBLAS_OP_N)"));
  const auto* d = CheckGetrf(c, h, n, n, a, ia, ja, desc_a, ipiv, type);
  CheckB(c, h, n, nrhs, b, ib, jb, desc_b, type, d);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("getrs", *d, nrhs);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// A and d_ipiv from getrf: solves A X = B for B's first NRHS columns. A pivot that is not
// getrf's (row j's must be in j+1..N, 1-based) is a violation.
cusolverStatus_t cusolverMpGetrs(cusolverMpHandle_t h, cublasOperation_t trans, int64_t n,
                                 int64_t nrhs, const void* a, int64_t ia, int64_t ja,
                                 cusolverMpMatrixDescriptor_t desc_a, const int64_t* ipiv, void* b,
                                 int64_t ib, int64_t jb, cusolverMpMatrixDescriptor_t desc_b,
                                 cudaDataType type, void* d_work, size_t d_bytes, void* h_work,
                                 size_t h_bytes, int* info) {
  Call call("cusolverMpGetrs");
  Checker& c = call.c;
  if (trans != jaxmg::cuda::CUBLAS_OP_N) c.Fail(S("trans ", trans, " (only CUBLAS_OP_N)"));
  const auto* d = CheckGetrf(c, h, n, n, a, ia, ja, desc_a, ipiv, type);
  const auto* db = CheckB(c, h, n, nrhs, b, ib, jb, desc_b, type, d);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("getrs", *d, nrhs),
              HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  const cusolverMpGrid& g = *d->grid;
  std::vector<char> la = Padded(call.Read(a, LocalBytes(*d)), *d);
  std::vector<char> lb = Padded(call.Read(b, LocalBytes(*db)), *db);
  std::vector<int64_t> mine(static_cast<size_t>(d->local_cols));
  if (!mine.empty()) std::memcpy(mine.data(), ipiv, mine.size() * 8);
  call.Unlock();
  // The pivots of process row 0, on every process; the last entry counts bad pivots anywhere.
  std::vector<int> global(static_cast<size_t>(n) + 1, 0);
  std::string bad;
  for (int64_t l = 0; l < d->local_cols; ++l)
    if (const int64_t j = GlobalIndex(l, d->nb, g.col, g.cols); j < n) {
      if (mine[l] < j + 1 || mine[l] > n) {
        if (global[n]++ < 4) bad += S(bad.empty() ? "" : ", ", "IPIV(", j + 1, ")=", mine[l]);
      } else if (g.row == 0) {
        global[j] = static_cast<int>(mine[l]);
      }
    }
  const int bad_here = global[n];
  SumInts(call.mpi(), &global);
  if (global[n] > 0) {
    c.Fail(bad_here > 0 ? S(bad_here, " pivots are not getrf's (", bad, bad_here > 4 ? ", ..." : "",
                            "; row j's must be in j..N, 1-based)")
                        : std::string("another process holds pivots that are not getrf's"));
    call.Abort();
    return kInvalidValue;
  }
  std::vector<Int> sc_piv(static_cast<size_t>(d->local_rows + d->mb), 0);
  for (int64_t l = 0; l < d->local_rows; ++l)
    if (const int64_t i = GlobalIndex(l, d->mb, g.row, g.rows); i < n) sc_piv[l] = global[i];
  const std::vector<Int> desc_b_on_a = DescOn(*db, *d);
  Int status = 0, in = static_cast<Int>(n), ir = static_cast<Int>(nrhs), one = 1;
  Sym<void (*)(const char*, const Int*, const Int*, const void*, const Int*, const Int*, const Int*,
               const Int*, void*, const Int*, const Int*, const Int*, Int*)>(
      "p" + Prefix(type) + "getrs_")("N", &in, &ir, la.data(), &one, &one, d->desc, sc_piv.data(),
                                     lb.data(), &one, &one, desc_b_on_a.data(), &status);
  call.Finish({{b, Trimmed(std::move(lb), *db)}, {info, InfoBytes(status)}});
  return kSuccess;
}

cusolverStatus_t cusolverMpSyevd_bufferSize(cusolverMpHandle_t h, char* jobz, cublasFillMode_t uplo,
                                            int64_t n, void* a, int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, void* d, void* q,
                                            int64_t iq, int64_t jq,
                                            cusolverMpMatrixDescriptor_t desc_q, cudaDataType type,
                                            size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpSyevd_bufferSize", {}};
  const Syevd s = CheckSyevd(c, h, jobz, uplo, n, a, ia, ja, desc_a, d, q, iq, jq, desc_q, type);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || s.a == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("syevd", *s.a, 0);
  *h_bytes = HostBytes(*s.a);
  return kSuccess;
}

// Eigenvalues ascending into d_D (N reals, on every process) and, for jobz 'V', eigenvectors
// into Q; A is destroyed (ScaLAPACK's A afterwards).
cusolverStatus_t cusolverMpSyevd(cusolverMpHandle_t h, char* jobz, cublasFillMode_t uplo, int64_t n,
                                 void* a, int64_t ia, int64_t ja,
                                 cusolverMpMatrixDescriptor_t desc_a, void* d, void* q, int64_t iq,
                                 int64_t jq, cusolverMpMatrixDescriptor_t desc_q, cudaDataType type,
                                 void* d_work, size_t d_bytes, void* h_work, size_t h_bytes,
                                 int* info) {
  Call call("cusolverMpSyevd");
  Checker& c = call.c;
  const Syevd s = CheckSyevd(c, h, jobz, uplo, n, a, ia, ja, desc_a, d, q, iq, jq, desc_q, type);
  if (s.a != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("syevd", *s.a, 0),
              HostBytes(*s.a));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  const cusolverMpMatrixDescriptor& da = *s.a;
  const cusolverMpMatrixDescriptor& dz = s.vectors ? *s.q : da;
  std::vector<char> la = Padded(call.Read(a, LocalBytes(da)), da);
  std::vector<char> lz = Padded(std::vector<char>(LocalBytes(dz)), dz);
  call.Unlock();
  const std::vector<Int> desc_z = DescOn(dz, da);
  const size_t rs = RealSize(type);
  std::vector<char> w(static_cast<size_t>(n) * rs + rs);
  Int status = 0, in = static_cast<Int>(n), one = 1, query = -1;
  // Workspace sizes come back as values of the element type (work), its real type (rwork) and
  // int (iwork); 32 bytes hold any of them.
  alignas(16) char work_size[32] = {}, rwork_size[32] = {};
  Int iwork_size = 0;
  auto run = [&](void* work, Int lwork, void* rwork, Int lrwork, Int* iwork, Int liwork) {
    if (IsComplex(type)) {
      Sym<void (*)(const char*, const char*, const Int*, void*, const Int*, const Int*, const Int*,
                   void*, void*, const Int*, const Int*, const Int*, void*, const Int*, void*,
                   const Int*, Int*, const Int*, Int*)>("p" + Prefix(type) + "heevd_")(
          "V", "L", &in, la.data(), &one, &one, da.desc, w.data(), lz.data(), &one, &one,
          desc_z.data(), work, &lwork, rwork, &lrwork, iwork, &liwork, &status);
    } else {
      Sym<void (*)(const char*, const char*, const Int*, void*, const Int*, const Int*, const Int*,
                   void*, void*, const Int*, const Int*, const Int*, void*, const Int*, Int*,
                   const Int*, Int*)>("p" + Prefix(type) + "syevd_")(
          "V", "L", &in, la.data(), &one, &one, da.desc, w.data(), lz.data(), &one, &one,
          desc_z.data(), work, &lwork, iwork, &liwork, &status);
    }
  };
  run(work_size, query, rwork_size, query, &iwork_size, query);
  auto count = [&](const char* v) {  // a workspace size ScaLAPACK returned, plus a margin
    const double x =
        rs == 4 ? double{*reinterpret_cast<const float*>(v)} : *reinterpret_cast<const double*>(v);
    return static_cast<size_t>(x) + 64;
  };
  std::vector<char> work(count(work_size) * ElementSize(type));
  std::vector<char> rwork(count(rwork_size) * rs);
  std::vector<Int> iwork(static_cast<size_t>(iwork_size) + 64);
  status = 0;
  run(work.data(), static_cast<Int>(work.size() / ElementSize(type)), rwork.data(),
      static_cast<Int>(rwork.size() / rs), iwork.data(), static_cast<Int>(iwork.size()));
  w.resize(static_cast<size_t>(n) * rs);
  std::vector<std::pair<void*, std::vector<char>>> out = {
      {a, Trimmed(std::move(la), da)}, {d, std::move(w)}, {info, InfoBytes(status)}};
  if (s.vectors) out.push_back({q, Trimmed(std::move(lz), dz)});
  call.Finish(std::move(out));
  return kSuccess;
}

cusolverStatus_t cusolverMpGeqrf_bufferSize(cusolverMpHandle_t h, int64_t m, int64_t n, void* a,
                                            int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, cudaDataType type,
                                            size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpGeqrf_bufferSize", {}};
  // (no d_tau here: its size is checked by Geqrf itself)
  const auto* d = CheckQr(c, h, m, n, 0, a, ia, ja, desc_a, nullptr, type);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("geqrf", *d, 0);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// A = Q R: R in A's upper triangle (trapezoid), the Householder vectors below it with d_tau.
cusolverStatus_t cusolverMpGeqrf(cusolverMpHandle_t h, int64_t m, int64_t n, void* a, int64_t ia,
                                 int64_t ja, cusolverMpMatrixDescriptor_t desc_a, void* tau,
                                 cudaDataType type, void* d_work, size_t d_bytes, void* h_work,
                                 size_t h_bytes, int* info) {
  Call call("cusolverMpGeqrf");
  Checker& c = call.c;
  const auto* d = CheckQr(c, h, m, n, std::min(m, n), a, ia, ja, desc_a, tau, type);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("geqrf", *d, 0), HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  const cusolverMpGrid& g = *d->grid;
  const size_t taus = static_cast<size_t>(Numroc(std::min(m, n), d->nb, g.col, 0, g.cols));
  std::vector<char> la = Padded(call.Read(a, LocalBytes(*d)), *d);
  call.Unlock();
  std::vector<char> lt((taus + 1) * ElementSize(type));
  Int status = 0, im = static_cast<Int>(m), in = static_cast<Int>(n), one = 1;
  WithWorkspace(type, [&](void* work, Int lwork) {
    Sym<void (*)(const Int*, const Int*, void*, const Int*, const Int*, const Int*, void*, void*,
                 const Int*, Int*)>("p" + Prefix(type) + "geqrf_")(
        &im, &in, la.data(), &one, &one, d->desc, lt.data(), work, &lwork, &status);
  });
  lt.resize(taus * ElementSize(type));
  call.Finish({{a, Trimmed(std::move(la), *d)}, {tau, std::move(lt)}, {info, InfoBytes(status)}});
  return kSuccess;
}

cusolverStatus_t cusolverMpOrgqr_bufferSize(cusolverMpHandle_t h, int64_t m, int64_t n, int64_t k,
                                            const void* a, int64_t ia, int64_t ja,
                                            cusolverMpMatrixDescriptor_t desc_a, const void* tau,
                                            cudaDataType type, size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpOrgqr_bufferSize", {}};
  if (n > m) c.Fail(S("N=", n, " > M=", m, " (orgqr needs M >= N >= K)"));
  const auto* d = CheckQr(c, h, m, n, k, a, ia, ja, desc_a, tau, type);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("orgqr", *d, 0);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// The first N columns of Q = H(1) ... H(K) from geqrf's A and d_tau, over A.
cusolverStatus_t cusolverMpOrgqr(cusolverMpHandle_t h, int64_t m, int64_t n, int64_t k, void* a,
                                 int64_t ia, int64_t ja, cusolverMpMatrixDescriptor_t desc_a,
                                 const void* tau, cudaDataType type, void* d_work, size_t d_bytes,
                                 void* h_work, size_t h_bytes, int* info) {
  Call call("cusolverMpOrgqr");
  Checker& c = call.c;
  if (n > m) c.Fail(S("N=", n, " > M=", m, " (orgqr needs M >= N >= K)"));
  const auto* d = CheckQr(c, h, m, n, k, a, ia, ja, desc_a, tau, type);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("orgqr", *d, 0), HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  const cusolverMpGrid& g = *d->grid;
  const size_t taus = static_cast<size_t>(Numroc(k, d->nb, g.col, 0, g.cols));
  std::vector<char> la = Padded(call.Read(a, LocalBytes(*d)), *d);
  std::vector<char> lt = call.Read(tau, taus * ElementSize(type));
  lt.resize((taus + 1) * ElementSize(type));
  call.Unlock();
  Int status = 0, im = static_cast<Int>(m), in = static_cast<Int>(n), ik = static_cast<Int>(k),
      one = 1;
  const std::string name = "p" + Prefix(type) + (IsComplex(type) ? "ungqr_" : "orgqr_");
  WithWorkspace(type, [&](void* work, Int lwork) {
    Sym<void (*)(const Int*, const Int*, const Int*, void*, const Int*, const Int*, const Int*,
                 const void*, void*, const Int*, Int*)>(name)(
        &im, &in, &ik, la.data(), &one, &one, d->desc, lt.data(), work, &lwork, &status);
  });
  call.Finish({{a, Trimmed(std::move(la), *d)}, {info, InfoBytes(status)}});
  return kSuccess;
}

// A (m x n, square blocks [L]) and B (at least max(M, N) x NRHS, A's row blocks [Q]).
const cusolverMpMatrixDescriptor* CheckGels(Checker& c, cusolverMpHandle_t h, int trans, int64_t m,
                                            int64_t n, int64_t nrhs, const void* a, int64_t ia,
                                            int64_t ja, cusolverMpMatrixDescriptor_t desc_a,
                                            const void* b, int64_t ib, int64_t jb,
                                            cusolverMpMatrixDescriptor_t desc_b, int type,
                                            const cusolverMpMatrixDescriptor** out_b) {
  if (trans != jaxmg::cuda::CUBLAS_OP_N)
    c.Fail(S("trans ", trans, " (the emulator takes CUBLAS_OP_N)"));
  const auto* d = CheckQr(c, h, m, n, 0, a, ia, ja, desc_a, nullptr, type);
  if (d == nullptr) return nullptr;
  const cusolverMpMatrixDescriptor* db = CheckDesc(c, "B", h, desc_b, type);
  CheckOffsets(c, "B", ib, jb, db);
  if (db == nullptr) return nullptr;
  if (nrhs < 0 || db->m < std::max(m, n) || db->n < nrhs)
    c.Fail(S("B's descriptor is ", db->m, " x ", db->n, " for max(M, N)=", std::max(m, n),
             ", NRHS=", nrhs));
  CheckLike(c, "B", *d, *db);
  CheckDevice(c, "B", b, LocalBytes(*db), RealSize(type), h->device, h->stream);
  *out_b = db;
  return c.ok() ? d : nullptr;
}

cusolverStatus_t cusolverMpGels_bufferSize(cusolverMpHandle_t h, cublasOperation_t trans, int64_t m,
                                           int64_t n, int64_t nrhs, void* a, int64_t ia, int64_t ja,
                                           cusolverMpMatrixDescriptor_t desc_a, void* b, int64_t ib,
                                           int64_t jb, cusolverMpMatrixDescriptor_t desc_b,
                                           cudaDataType type, size_t* d_bytes, size_t* h_bytes) {
  auto lock = fakecuda::LockState();
  Checker c{"cusolverMpGels_bufferSize", {}};
  const cusolverMpMatrixDescriptor* db = nullptr;
  const auto* d =
      CheckGels(c, h, trans, m, n, nrhs, a, ia, ja, desc_a, b, ib, jb, desc_b, type, &db);
  CheckHostOut(c, "workspaceInBytesOnDevice", d_bytes);
  CheckHostOut(c, "workspaceInBytesOnHost", h_bytes);
  if (!c.ok() || d == nullptr) return c.Report(kInvalidValue);
  *d_bytes = DeviceBytes("gels", *d, nrhs);
  *h_bytes = HostBytes(*d);
  return kSuccess;
}

// The least-squares solution of min ||A X - B|| (M >= N; the minimum-norm one of A X = B for
// M < N) of a full-rank A, into B's first N rows; A is overwritten by its QR (LQ) factors.
cusolverStatus_t cusolverMpGels(cusolverMpHandle_t h, cublasOperation_t trans, int64_t m, int64_t n,
                                int64_t nrhs, void* a, int64_t ia, int64_t ja,
                                cusolverMpMatrixDescriptor_t desc_a, void* b, int64_t ib,
                                int64_t jb, cusolverMpMatrixDescriptor_t desc_b, cudaDataType type,
                                void* d_work, size_t d_bytes, void* h_work, size_t h_bytes,
                                int* info) {
  Call call("cusolverMpGels");
  Checker& c = call.c;
  const cusolverMpMatrixDescriptor* db = nullptr;
  const auto* d =
      CheckGels(c, h, trans, m, n, nrhs, a, ia, ja, desc_a, b, ib, jb, desc_b, type, &db);
  if (d != nullptr)
    CheckWork(c, h, d_work, d_bytes, h_work, h_bytes, DeviceBytes("gels", *d, nrhs),
              HostBytes(*d));
  if (handles->count(h) != 0) CheckInfo(c, h, info);
  if (!call.Start(h, d_work, d_bytes, h_work, h_bytes)) return kInvalidValue;
  std::vector<char> la = Padded(call.Read(a, LocalBytes(*d)), *d);
  std::vector<char> lb = Padded(call.Read(b, LocalBytes(*db)), *db);
  call.Unlock();
  const std::vector<Int> desc_b_on_a = DescOn(*db, *d);
  Int status = 0, im = static_cast<Int>(m), in = static_cast<Int>(n), ir = static_cast<Int>(nrhs),
      one = 1;
  WithWorkspace(type, [&](void* work, Int lwork) {
    Sym<void (*)(const char*, const Int*, const Int*, const Int*, void*, const Int*, const Int*,
                 const Int*, void*, const Int*, const Int*, const Int*, void*, const Int*, Int*)>(
        "p" + Prefix(type) + "gels_")("N", &im, &in, &ir, la.data(), &one, &one, d->desc,
                                      lb.data(), &one, &one, desc_b_on_a.data(), work, &lwork,
                                      &status);
  });
  call.Finish({{a, Trimmed(std::move(la), *d)},
               {b, Trimmed(std::move(lb), *db)},
               {info, InfoBytes(status)}});
  return kSuccess;
}

// The signatures above are exactly cusolvermp_api.h's.
#define FAKECUDA_SAME_TYPE(ret, name, params) \
  static_assert(std::is_same_v<decltype(&name), ret(*) params>, #name);
JAXMG_NCCL_FUNCTIONS(FAKECUDA_SAME_TYPE)
JAXMG_CUSOLVERMP_FUNCTIONS(FAKECUDA_SAME_TYPE)
#undef FAKECUDA_SAME_TYPE

// --- test hooks -------------------------------------------------------------------------------

long fakecuda_mp_live_handles() {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  return static_cast<long>(handles->size());  // NOLINT(runtime/int)
}
long fakecuda_mp_live_grids() {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  return static_cast<long>(grids->size());  // NOLINT(runtime/int)
}
long fakecuda_mp_live_descriptors() {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  return static_cast<long>(descs->size());  // NOLINT(runtime/int)
}
long fakecuda_mp_live_comms() {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  return static_cast<long>(comms->size());  // NOLINT(runtime/int)
}
// Completed calls of the routines (potrf, potrs, getrf, getrs, syevd, geqrf, orgqr, gels) and
// of ncclAllReduce.
long fakecuda_mp_calls() {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  long n = 0;  // NOLINT(runtime/int)
  for (const auto& entry : *calls) n += entry.second;
  return n;
}
// Completed calls of one function, by name (e.g. "cusolverMpPotrf").
long fakecuda_mp_calls_of(const char* name) {  // NOLINT(runtime/int)
  auto lock = fakecuda::LockState();
  auto it = name != nullptr ? calls->find(name) : calls->end();
  return it != calls->end() ? it->second : 0;
}

}  // extern "C"
