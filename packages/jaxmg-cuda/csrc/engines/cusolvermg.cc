// cuSolverMg: the leader's calls for all devices (the Backend of base/backend.h for GPUs), one
// function per library step (base/routines.h). A handle and 1 x ndev grid per device list (cached,
// RAII), workspace sizes from the _bufferSize queries (lwork elements of the compute type, on
// every device), right-hand sides in column chunks of at most min(T_A, 256) with B as one tile
// on mesh position 0, eigenvalues on the host, pivots distributed like A's columns.
// What has run on GPU hardware and what has not: see platforms/cuda_targets.cc.
#include "engines/cusolvermg.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/backend.h"
#include "base/common.h"
#include "engines/cuda_internal.h"

namespace jaxmg {
namespace {

cuda::cudaDataType MgRealType(Dtype d) {
  return RealElementSize(d) == 4 ? cuda::CUDA_R_32F : cuda::CUDA_R_64F;
}

// A cuSolverMg handle and 1 x ndev grid for one device list, plus matrix descriptors per
// shape. RAII; cached for the life of the process.
class MgContext {
 public:
  ~MgContext() {
    for (auto& entry : descs_) api_->cusolverMgDestroyMatrixDesc(entry.second);
    if (grid_ != nullptr) api_->cusolverMgDestroyGrid(grid_);
    if (handle_ != nullptr) api_->cusolverMgDestroy(handle_);
  }
  MgContext(const MgContext&) = delete;
  MgContext& operator=(const MgContext&) = delete;

  static Outcome Make(const Api* api, std::vector<int> devices, std::unique_ptr<MgContext>* out) {
    std::unique_ptr<MgContext> ctx(new MgContext(api));
    JAXMG_MG(api, cusolverMgCreate(&ctx->handle_));
    JAXMG_MG(api, cusolverMgDeviceSelect(ctx->handle_, static_cast<int>(devices.size()),
                                         devices.data()));
    std::vector<int32_t> ids(devices.begin(), devices.end());
    JAXMG_MG(api, cusolverMgCreateDeviceGrid(&ctx->grid_, 1, static_cast<int32_t>(ids.size()),
                                             ids.data(), cuda::CUDALIBMG_GRID_MAPPING_COL_MAJOR));
    *out = std::move(ctx);
    return {};
  }

  // A column-major rows x cols matrix whose row block is all rows (so each local array has
  // leading dimension `rows`), split into column tiles of width `tile` over the grid.
  Outcome Desc(int64_t rows, int64_t cols, int64_t tile, cuda::cudaDataType type,
               cuda::cudaLibMgMatrixDesc_t* desc) {
    const auto key = std::make_tuple(rows, cols, tile, static_cast<int>(type));
    auto it = descs_.find(key);
    if (it == descs_.end()) {
      cuda::cudaLibMgMatrixDesc_t d = nullptr;
      JAXMG_MG(api_, cusolverMgCreateMatrixDesc(&d, rows, cols, rows, tile, type, grid_));
      it = descs_.emplace(key, d).first;
    }
    *desc = it->second;
    return {};
  }

  cuda::cusolverMgHandle_t handle() const { return handle_; }
  std::mutex& mu() { return mu_; }

 private:
  explicit MgContext(const Api* api) : api_(api) {}
  const Api* api_;
  cuda::cusolverMgHandle_t handle_ = nullptr;
  cuda::cudaLibMgGrid_t grid_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, cuda::cudaLibMgMatrixDesc_t> descs_;
  std::mutex mu_;  // one leader at a time per device list
};

std::mutex contexts_mu;
auto* contexts = new std::map<std::vector<int>, std::unique_ptr<MgContext>>();
auto* peers = new std::set<std::pair<int, int>>();

// The leader's stream for copies into `device` (the current device), created once per GPU and
// kept for the process like the cuSolverMg contexts: never XLA's streams, which belong to the
// participants' threads.
Outcome CopyStream(const Api* api, int device, cudaStream_t* out) {
  static std::mutex mu;
  static auto* streams = new std::map<int, cudaStream_t>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams->find(device);
  if (it == streams->end()) {
    cudaStream_t stream = nullptr;
    JAXMG_CUDART(api, cudaStreamCreate(&stream));
    it = streams->emplace(device, stream).first;
  }
  *out = it->second;
  return {};
}

// Peer access between every ordered pair of the call's distinct devices (a GPU listed twice
// needs none with itself), tried once per pair. It is a performance option (NVIDIA's samples
// enable it; copies and cuSolverMg work without it, through host memory): a pair that cannot
// have it, e.g. cudaErrorTooManyPeers past 8 PCIe GPUs, is used without it, and the process
// says so once.
Outcome EnablePeers(const Api* api, const std::vector<int>& devices) {
  static bool told = false;
  for (int i : devices) {
    for (int j : devices) {
      if (i == j || peers->count({i, j}) != 0) continue;
      int can = 0;
      JAXMG_CUDART(api, cudaDeviceCanAccessPeer(&can, i, j));
      if (can != 0) {
        JAXMG_CUDART(api, cudaSetDevice(i));
        const int err = api->cudaDeviceEnablePeerAccess(j, 0);
        api->cudaGetLastError();  // clear a sticky "already enabled" or the failure
        if (err != cuda::cudaSuccess && err != cuda::cudaErrorPeerAccessAlreadyEnabled && !told) {
          told = true;
          std::fprintf(stderr,
                       "jaxmg: peer access from GPU %d to GPU %d is unavailable (%s); jaxmg "
                       "goes on without it where it fails, through host memory, which is "
                       "slower. Said once per process.\n",
                       i, j, VendorMessage(api, Library::kCudart, err).c_str());
        }
      }
      peers->insert({i, j});
    }
  }
  return {};
}

// What a cuSolverMg compute call's status and info mean. info < 0 (an illegal argument) is
// jaxmg's bug: an error, as on CPU. A failing status together with info > 0 is read as the
// info: cuSolverMg may flag a numerical failure through both. A matrix that is not positive
// definite was seen on GPU as cusolverMgPotrf returning CUSOLVER_STATUS_INTERNAL_ERROR (the
// cuSolverMg-era jaxmg's tests); whether info is then set is unknown, so INTERNAL_ERROR with
// info == 0 from the factorisation becomes status N + 1, "not positive definite, order
// unknown" (README, status codes). The CPU twin returns LAPACK's info, 1..N. Any other failing
// status is an error.
Outcome LibraryOutcome(const Api* api, const char* routine, int status, int* info,
                       bool factorisation, int64_t n) {
  if (*info < 0)
    return Outcome::Fail(std::string("jaxmg: ") + routine + " rejected argument " +
                         std::to_string(-*info) + " as illegal (info=" + std::to_string(*info) +
                         "): a bug in jaxmg, please report it");
  if (status == cuda::CUSOLVER_STATUS_SUCCESS || *info > 0) return {};
  if (factorisation && status == cuda::CUSOLVER_STATUS_INTERNAL_ERROR) {
    *info = static_cast<int>(n + 1);
    return {};
  }
  return Outcome::Fail(std::string(routine) +
                       " failed: " + VendorMessage(api, Library::kCusolverMg, status));
}

// --- the steps: one cuSolverMg routine each, its workspace query and its call --------------

// What a step works on: the call, its context, A's descriptor and the pointer arrays.
struct Matrix {
  const Api* api;
  const MgCall& c;
  MgContext* ctx;
  cuda::cudaDataType type;
  cuda::cudaLibMgMatrixDesc_t desc_a;
  std::vector<void*> a;
  std::vector<void*> work;
  std::vector<int*> ipiv;
};

constexpr int64_t kMaxRhsChunk = 256;

// Right-hand sides go to the library in chunks of at most min(T_A, 256) columns.
int RhsChunk(const MgCall& c) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({c.tile, kMaxRhsChunk, std::max(c.nrhs, 1)})));
}

cuda::cusolverEigMode_t EigMode(const MgCall& c) {
  return c.vectors ? cuda::CUSOLVER_EIG_MODE_VECTOR : cuda::CUSOLVER_EIG_MODE_NOVECTOR;
}

// Getrs takes CUBLAS_OP_N alone (T and C gave info -1 on an H100); the protocol refuses a
// call with another trans before the library (meeting/protocol.cc).
constexpr auto kOpN = cuda::CUBLAS_OP_N;

// The same size on every device (WorkspaceBytes); the library counts elements.
int64_t LworkElements(const MgCall& c) {
  return c.work_bytes.empty() ? 0 : c.work_bytes[0] / static_cast<int64_t>(ElementSize(c.dtype));
}

// B (N x nrhs, ld N) is one tile on mesh position 0: `fn(b, desc_b, width)` for each chunk of
// columns, while `*info` stays 0.
template <typename Fn>
Outcome ForEachRhsChunk(Matrix& m, int* info, Fn&& fn) {
  const MgCall& c = m.c;
  const int chunk = RhsChunk(c);
  const size_t esize = ElementSize(c.dtype);
  for (int c0 = 0; c0 < c.nrhs && *info == 0; c0 += chunk) {
    const int width = std::min(chunk, c.nrhs - c0);
    cuda::cudaLibMgMatrixDesc_t desc_b = nullptr;
    if (Outcome o = m.ctx->Desc(c.n, width, width, m.type, &desc_b); !o.ok) return o;
    std::vector<void*> b;
    for (void* p : c.b)
      b.push_back(static_cast<char*>(p) + static_cast<size_t>(c0) * c.lda * esize);
    if (Outcome o = fn(b, desc_b, width); !o.ok) return o;
  }
  return {};
}

// The first chunk's descriptor and pointers, for a workspace query.
Outcome FirstRhsChunk(Matrix& m, std::vector<void*>* b, cuda::cudaLibMgMatrixDesc_t* desc_b,
                      int* width) {
  *width = RhsChunk(m.c);
  *b = m.c.b;
  return m.ctx->Desc(m.c.n, *width, *width, m.type, desc_b);
}

constexpr auto kLower = cuda::CUBLAS_FILL_MODE_LOWER;

Outcome PotrfBytes(Matrix& m, int64_t* size) {
  JAXMG_MG(m.api, cusolverMgPotrf_bufferSize(m.ctx->handle(), kLower, m.c.n, m.a.data(), 1, 1,
                                             m.desc_a, m.type, size));
  return {};
}
Outcome Potrf(Matrix& m, int* info) {
  // A matrix that is not positive definite is a status, never an error.
  const int status =
      m.api->cusolverMgPotrf(m.ctx->handle(), kLower, m.c.n, m.a.data(), 1, 1, m.desc_a, m.type,
                             m.work.data(), LworkElements(m.c), info);
  return LibraryOutcome(m.api, "cusolverMgPotrf", status, info, true, m.c.n);
}

Outcome PotrsBytes(Matrix& m, int64_t* size) {
  if (m.c.nrhs == 0) return {};
  std::vector<void*> b;
  cuda::cudaLibMgMatrixDesc_t desc_b = nullptr;
  int width = 0;
  if (Outcome o = FirstRhsChunk(m, &b, &desc_b, &width); !o.ok) return o;
  JAXMG_MG(m.api, cusolverMgPotrs_bufferSize(m.ctx->handle(), kLower, m.c.n, width, m.a.data(), 1,
                                             1, m.desc_a, b.data(), 1, 1, desc_b, m.type, size));
  return {};
}
Outcome Potrs(Matrix& m, int* info) {
  return ForEachRhsChunk(
      m, info, [&](std::vector<void*>& b, cuda::cudaLibMgMatrixDesc_t desc_b, int width) {
        const int status = m.api->cusolverMgPotrs(m.ctx->handle(), kLower, m.c.n, width, m.a.data(),
                                                  1, 1, m.desc_a, b.data(), 1, 1, desc_b, m.type,
                                                  m.work.data(), LworkElements(m.c), info);
        return LibraryOutcome(m.api, "cusolverMgPotrs", status, info, false, m.c.n);
      });
}

Outcome PotriBytes(Matrix& m, int64_t* size) {
  JAXMG_MG(m.api, cusolverMgPotri_bufferSize(m.ctx->handle(), kLower, m.c.n, m.a.data(), 1, 1,
                                             m.desc_a, m.type, size));
  return {};
}
Outcome Potri(Matrix& m, int* info) {
  const int status =
      m.api->cusolverMgPotri(m.ctx->handle(), kLower, m.c.n, m.a.data(), 1, 1, m.desc_a, m.type,
                             m.work.data(), LworkElements(m.c), info);
  return LibraryOutcome(m.api, "cusolverMgPotri", status, info, false, m.c.n);
}

Outcome SyevdBytes(Matrix& m, int64_t* size) {
  std::vector<unsigned char> w(static_cast<size_t>(m.c.n) * RealElementSize(m.c.dtype));
  JAXMG_MG(m.api,
           cusolverMgSyevd_bufferSize(m.ctx->handle(), EigMode(m.c), kLower, m.c.n, m.a.data(), 1,
                                      1, m.desc_a, w.data(), MgRealType(m.c.dtype), m.type, size));
  return {};
}
Outcome Syevd(Matrix& m, int* info) {
  const int status = m.api->cusolverMgSyevd(
      m.ctx->handle(), EigMode(m.c), kLower, m.c.n, m.a.data(), 1, 1, m.desc_a, m.c.w,
      MgRealType(m.c.dtype), m.type, m.work.data(), LworkElements(m.c), info);
  return LibraryOutcome(m.api, "cusolverMgSyevd", status, info, false, m.c.n);
}

// The pivots: int32 per device, distributed like A's columns (base/routines.h, Pivots).
Outcome GetrfBytes(Matrix& m, int64_t* size) {
  JAXMG_MG(m.api, cusolverMgGetrf_bufferSize(m.ctx->handle(), m.c.n, m.c.n, m.a.data(), 1, 1,
                                             m.desc_a, m.ipiv.data(), m.type, size));
  return {};
}
Outcome Getrf(Matrix& m, int* info) {
  // An exactly singular U is a status (info = k > 0), never an error.
  const int status =
      m.api->cusolverMgGetrf(m.ctx->handle(), m.c.n, m.c.n, m.a.data(), 1, 1, m.desc_a,
                             m.ipiv.data(), m.type, m.work.data(), LworkElements(m.c), info);
  return LibraryOutcome(m.api, "cusolverMgGetrf", status, info, false, m.c.n);
}

Outcome GetrsBytes(Matrix& m, int64_t* size) {
  if (m.c.nrhs == 0) return {};
  std::vector<void*> b;
  cuda::cudaLibMgMatrixDesc_t desc_b = nullptr;
  int width = 0;
  if (Outcome o = FirstRhsChunk(m, &b, &desc_b, &width); !o.ok) return o;
  JAXMG_MG(m.api, cusolverMgGetrs_bufferSize(m.ctx->handle(), kOpN, m.c.n, width, m.a.data(),
                                             1, 1, m.desc_a, m.ipiv.data(), b.data(), 1, 1, desc_b,
                                             m.type, size));
  return {};
}
Outcome Getrs(Matrix& m, int* info) {
  return ForEachRhsChunk(
      m, info, [&](std::vector<void*>& b, cuda::cudaLibMgMatrixDesc_t desc_b, int width) {
        const int status = m.api->cusolverMgGetrs(
            m.ctx->handle(), kOpN, m.c.n, width, m.a.data(), 1, 1, m.desc_a, m.ipiv.data(),
            b.data(), 1, 1, desc_b, m.type, m.work.data(), LworkElements(m.c), info);
        return LibraryOutcome(m.api, "cusolverMgGetrs", status, info, false, m.c.n);
      });
}

Outcome StepBytes(Step step, Matrix& m, int64_t* size) {
  switch (step) {
    case Step::kPotrf: return PotrfBytes(m, size);
    case Step::kPotrs: return PotrsBytes(m, size);
    case Step::kPotri: return PotriBytes(m, size);
    case Step::kSyevd: return SyevdBytes(m, size);
    case Step::kGetrf: return GetrfBytes(m, size);
    case Step::kGetrs: return GetrsBytes(m, size);
  }
  return Outcome::Fail("jaxmg: unknown library step");
}

Outcome RunStep(Step step, Matrix& m, int* info) {
  switch (step) {
    case Step::kPotrf: return Potrf(m, info);
    case Step::kPotrs: return Potrs(m, info);
    case Step::kPotri: return Potri(m, info);
    case Step::kSyevd: return Syevd(m, info);
    case Step::kGetrf: return Getrf(m, info);
    case Step::kGetrs: return Getrs(m, info);
  }
  return Outcome::Fail("jaxmg: unknown library step");
}

// Tiles cuSolverMg refuses, checked before any library call (the jaxmg package caps its tiles
// on GPUs first; this protects direct users of jaxmg_cuda). getrf: an H100 answered a tile of
// 1024 or more with info -6 (descrA) at N = 2048, 4096 and 8192, while 256 and 512 worked.
// syevd: tiles up to 1024 ran there; larger ones were reported rejected by the cuSolverMg-era
// jaxmg.
constexpr int kRefusedGetrfTile = 1024;
constexpr int kMaxSyevdTile = 1024;

Outcome CheckTile(const MgCall& c) {
  for (Step step : c.routine->steps) {
    if (step == Step::kGetrf && c.tile >= kRefusedGetrfTile)
      return Outcome::Fail(Cat(c.routine->target, ": cuSolverMg's getrf refuses a column tile of ",
                               kRefusedGetrfTile, " or more (an H100 answered info -6 at N = ",
                               "2048 to 8192; 256 and 512 work), got T_A=", c.tile,
                               ": use T_A <= 512"));
    if (step == Step::kSyevd && c.tile > kMaxSyevdTile)
      return Outcome::Fail(Cat(c.routine->target, ": cuSolverMg's syevd takes a column tile of ",
                               "at most ", kMaxSyevdTile, ", got T_A=", c.tile));
  }
  return {};
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Api* api) : api_(api) {}

  Outcome WorkspaceBytes(const MgCall& c, std::vector<int64_t>* bytes) override {
    if (Outcome o = CheckTile(c); !o.ok) return o;
    return WithMatrix(c, [&](Matrix& m) -> Outcome {
      int64_t need = 0;
      for (Step step : c.routine->steps) {
        int64_t size = 0;
        if (Outcome o = StepBytes(step, m, &size); !o.ok) return o;
        need = std::max(need, size);
      }
      // lwork counts elements of the compute type, on every device.
      bytes->assign(c.a.size(), std::max<int64_t>(need, 1) * ElementSize(c.dtype));
      return {};
    });
  }

  Outcome Run(const MgCall& c, int* info) override {
    if (Outcome o = CheckTile(c); !o.ok) return o;
    return WithMatrix(c, [&](Matrix& m) -> Outcome {
      *info = 0;
      for (Step step : c.routine->steps) {
        if (Outcome o = RunStep(step, m, info); !o.ok) return o;
        if (*info != 0) break;  // the protocol fills what the caller gets with NaN
      }
      return {};
    });
  }

  // Each copy on its destination GPU's copy stream (peer to peer), all at once; then every
  // stream used is waited for, so nothing is in flight when the leader goes on (the next round
  // of the relayout may read what this one wrote).
  Outcome CopyAll(const std::vector<Copy>& copies) override {
    DeviceGuard guard(api_);
    std::map<int, cudaStream_t> used;
    for (const Copy& c : copies) {
      cudaStream_t& stream = used[c.dst_device];
      JAXMG_CUDART(api_, cudaSetDevice(c.dst_device));
      if (stream == nullptr) {
        if (Outcome o = CopyStream(api_, c.dst_device, &stream); !o.ok) return o;
      }
      JAXMG_CUDART(api_, cudaMemcpyAsync(c.dst, c.src, c.bytes, cuda::cudaMemcpyDefault, stream));
    }
    for (const auto& [device, stream] : used) {
      JAXMG_CUDART(api_, cudaSetDevice(device));
      JAXMG_CUDART(api_, cudaStreamSynchronize(stream));
    }
    return {};
  }

  // --- the leader of a multi-process call ---

  Outcome AllocateOn(int device, size_t bytes, void** out, Keep* keep) override {
    DeviceGuard guard(api_);
    JAXMG_CUDART(api_, cudaSetDevice(device));
    void* memory = nullptr;
    JAXMG_VENDOR_STATUS(kCudart, api_, api_->cudaMalloc(&memory, bytes),
                        "cudaMalloc(" + std::to_string(bytes) + " bytes) on GPU " +
                            std::to_string(device) + " (cuSolverMg workspace)");
    const Api* api = api_;
    *out = memory;
    *keep = Keep(memory, [api, device](void* m) {
      DeviceGuard restore(api);
      api->cudaSetDevice(device);
      api->cudaFree(m);
    });
    return {};
  }

  Outcome MapShared(const SharedMemory& shared, int* device, void** out, Keep* keep) override {
    char bus_id[sizeof(shared.bus_id) + 1] = {};
    std::memcpy(bus_id, shared.bus_id, sizeof(shared.bus_id));
    if (api_->cudaDeviceGetByPCIBusId(device, bus_id) != cuda::cudaSuccess) {
      api_->cudaGetLastError();
      return Outcome::Fail(std::string("its GPU (PCI ") + bus_id + ") is not visible to the " +
                           "leader's process. The multi-process mode needs every process to "
                           "see every GPU of the node: do not give each process its own "
                           "CUDA_VISIBLE_DEVICES; pick devices with "
                           "jax.distributed.initialize(local_device_ids=...) instead");
    }
    DeviceGuard guard(api_);
    JAXMG_CUDART(api_, cudaSetDevice(*device));
    cuda::cudaIpcMemHandle_t handle;
    std::memcpy(handle.reserved, shared.handle, sizeof(handle.reserved));
    void* base = nullptr;
    JAXMG_CUDART(api_, cudaIpcOpenMemHandle(&base, handle, cuda::kIpcMemLazyEnablePeerAccess));
    const Api* api = api_;
    const int on = *device;
    *keep = Keep(base, [api, on](void* b) {
      DeviceGuard restore(api);
      api->cudaSetDevice(on);
      api->cudaIpcCloseMemHandle(b);
    });
    *out = static_cast<char*>(base) + shared.offset;
    return {};
  }

  Outcome SynchronizeAll(const std::vector<int>& devices) override {
    DeviceGuard guard(api_);
    for (int device : devices) {
      JAXMG_CUDART(api_, cudaSetDevice(device));
      JAXMG_CUDART(api_, cudaDeviceSynchronize());
    }
    return {};
  }

 private:
  // Runs `fn(matrix)` with the call's cached context locked, the caller's current device
  // restored afterwards, and the descriptor of A in its 1D block-cyclic layout.
  template <typename Fn>
  Outcome WithMatrix(const MgCall& c, Fn&& fn) {
    MgContext* ctx = nullptr;
    if (Outcome o = Context(c, &ctx); !o.ok) return o;
    std::lock_guard<std::mutex> lock(ctx->mu());
    DeviceGuard guard(api_);
    Matrix m{api_,    c,   ctx,    CudaDataType(c.dtype),
             nullptr, c.a, c.work, std::vector<int*>(c.ipiv.begin(), c.ipiv.end())};
    if (Outcome o = ctx->Desc(c.n, c.n, c.tile, m.type, &m.desc_a); !o.ok) return o;
    return fn(m);
  }

  // The device list in mesh order, checked; the cached context for it. A GPU may be listed
  // more than once: cuSolverMg computed right on one H100 listed 2, 3, 4 and 8 times.
  Outcome Context(const MgCall& c, MgContext** ctx) {
    if (static_cast<int>(c.devices.size()) > kMaxCudaDevices)
      return Outcome::Fail("jaxmg: cuSolverMg accepts at most 16 GPUs, the call has " +
                           std::to_string(c.devices.size()));
    if (c.devices.empty() || *std::min_element(c.devices.begin(), c.devices.end()) < 0)
      return Outcome::Fail("jaxmg: a mesh position of the call has no GPU");
    std::lock_guard<std::mutex> lock(contexts_mu);
    DeviceGuard guard(api_);
    if (Outcome o = EnablePeers(api_, c.devices); !o.ok) return o;
    std::unique_ptr<MgContext>& slot = (*contexts)[c.devices];
    if (!slot) {
      if (Outcome o = MgContext::Make(api_, c.devices, &slot); !o.ok) return o;
    }
    *ctx = slot.get();
    return {};
  }

  const Api* api_;
};

}  // namespace

std::unique_ptr<Backend> MakeCudaBackend(const Api* api) {
  return std::make_unique<CudaBackend>(api);
}

}  // namespace jaxmg
