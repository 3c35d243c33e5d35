// The cuSolverMg targets: the backend of backend.h for NVIDIA GPUs, plus the dlopen loader.
// NOT YET RUN ON GPU HARDWARE: this layer compiles in CI (no GPU there), its lowering is
// tested on CPU and its body (RunCudaOnHost) runs in CI against an emulator of the CUDA
// runtime and cuSolverMg (tests/native/fake_cuda), but no GPU has executed it yet.
//
// Everything above the library line is the shared protocol (protocol.cc), tested on CPU. What
// is CUDA-specific: a participant's own-device operations on its XLA stream (CudaDevice), and
// the leader's cuSolverMg calls for all devices (CudaBackend): a handle and 1 x ndev grid per
// device list (cached, RAII), workspace sizes from the _bufferSize queries (lwork elements of
// the compute type, on every device), potrs in column chunks of at most min(T_A, 256)
// right-hand sides with B as one tile on mesh position 0, eigenvalues on the host.
#include "cuda_targets.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "common.h"
#include "cuda_api.h"
#include "protocol.h"

namespace jaxmg {
namespace cuda {
namespace {

std::mutex load_mu;
std::vector<std::string>* library_dirs = new std::vector<std::string>();

// One library by soname: the first of the candidate folders, else the loader's own search path.
void* Open(const std::string& name, std::string* tried) {
  for (const std::string& dir : *library_dirs) {
    const std::string path = dir + "/" + name;
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  }
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  const char* why = dlerror();
  *tried += "\n  " + name + ": " + (why != nullptr ? why : "not found");
  return nullptr;
}

// The CUDA versions jaxmg knows: a runtime and the cuSolverMg built against it.
struct Version {
  const char* name;
  const char* runtime;
  const char* solver;
  const char* wheels;
};
constexpr Version kVersions[] = {
    {"CUDA 13", "libcudart.so.13", "libcusolverMg.so.12", "nvidia-cuda-runtime nvidia-cusolver"},
    {"CUDA 12", "libcudart.so.12", "libcusolverMg.so.11",
     "nvidia-cuda-runtime-cu12 nvidia-cusolver-cu12"},
};

// The runtime and its cuSolverMg, as a matched pair. A runtime already in the process (jax's
// CUDA plugin loads one) decides the version: a second runtime beside it would not share its
// contexts. Otherwise the newest pair that loads whole; a runtime whose cuSolverMg is missing
// is released again.
bool OpenPair(void** rt, void** mg, std::string* error) {
  std::string tried;
  for (const Version& v : kVersions) {
    void* loaded = dlopen(v.runtime, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (loaded == nullptr) continue;
    *mg = Open(v.solver, &tried);
    if (*mg != nullptr) {
      *rt = loaded;
      return true;
    }
    dlclose(loaded);  // drops only the reference taken here
    *error = std::string("jaxmg: the process already runs the ") + v.name + " runtime (" +
             v.runtime + ", loaded by jax's CUDA plugin), but its cuSolverMg (" + v.solver +
             ") was not found:" + tried + "\nInstall it (pip install " + v.wheels +
             ") or add its folder to LD_LIBRARY_PATH; jaxmg never loads a second CUDA runtime.";
    return false;
  }
  for (const Version& v : kVersions) {
    void* runtime = Open(v.runtime, &tried);
    if (runtime == nullptr) continue;
    *mg = Open(v.solver, &tried);
    if (*mg != nullptr) {
      *rt = runtime;
      return true;
    }
    dlclose(runtime);
  }
  std::string dirs;
  for (const std::string& dir : *library_dirs) dirs += " " + dir;
  *error = "jaxmg: could not load the CUDA runtime and cuSolverMg (CUDA 13: libcudart.so.13 + "
           "libcusolverMg.so.12; CUDA 12: libcudart.so.12 + libcusolverMg.so.11). Looked in" +
           dirs + " and on the loader's path:" + tried +
           "\nInstall NVIDIA's wheels (e.g. pip install nvidia-cusolver-cu12 "
           "nvidia-cuda-runtime-cu12, or the CUDA 13 set) or add the folder to LD_LIBRARY_PATH.";
  return false;
}

}  // namespace

void SetLibraryDirs(const std::vector<std::string>& dirs) {
  std::lock_guard<std::mutex> lock(load_mu);
  *library_dirs = dirs;
}

const Api* Load(std::string* error) {
  std::lock_guard<std::mutex> lock(load_mu);
  static Api* api = nullptr;
  static std::string failure;
  if (api != nullptr) return api;
  if (!failure.empty()) {
    *error = failure;
    return nullptr;
  }
  // The handles stay open for the life of the process.
  void* rt = nullptr;
  void* mg = nullptr;
  if (!OpenPair(&rt, &mg, &failure)) {
    *error = failure;
    return nullptr;
  }
  auto table = std::make_unique<Api>();
  std::string missing;
  auto bind = [&](void* lib, const char* name, auto& slot) {
    void* sym = lib != nullptr ? dlsym(lib, name) : nullptr;
    if (sym == nullptr) missing += std::string(" ") + name;
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(sym);
  };
#define JAXMG_BIND_RT(ret, name, params) bind(rt, #name, table->name);
#define JAXMG_BIND_MG(ret, name, params) bind(mg, #name, table->name);
  JAXMG_CUDART_FUNCTIONS(JAXMG_BIND_RT)
  JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_BIND_MG)
#undef JAXMG_BIND_RT
#undef JAXMG_BIND_MG
  if (!missing.empty()) {
    failure = "jaxmg: the CUDA libraries lack symbols:" + missing;
    *error = failure;
    return nullptr;
  }
  // Optional: the driver, which the runtime has loaded by the time a GPU call runs.
  std::string unused;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  if (driver == nullptr) driver = Open("libcuda.so.1", &unused);
  if (driver != nullptr) {
#define JAXMG_BIND_DRIVER(ret, name, params) \
  table->name = reinterpret_cast<decltype(table->name)>(dlsym(driver, #name));
    JAXMG_DRIVER_FUNCTIONS(JAXMG_BIND_DRIVER)
#undef JAXMG_BIND_DRIVER
  }
  api = table.release();
  return api;
}

}  // namespace cuda

void SetCudaLibraryDirs(const std::vector<std::string>& dirs) { cuda::SetLibraryDirs(dirs); }

bool LoadCudaLibraries(std::string* error) { return cuda::Load(error) != nullptr; }

namespace {

using cuda::Api;

const char* CusolverStatusName(int status) {
  switch (status) {
    case 1: return "CUSOLVER_STATUS_NOT_INITIALIZED";
    case 2: return "CUSOLVER_STATUS_ALLOC_FAILED";
    case 3: return "CUSOLVER_STATUS_INVALID_VALUE";
    case 4: return "CUSOLVER_STATUS_ARCH_MISMATCH";
    case 5: return "CUSOLVER_STATUS_MAPPING_ERROR";
    case 6: return "CUSOLVER_STATUS_EXECUTION_FAILED";
    case 7: return "CUSOLVER_STATUS_INTERNAL_ERROR";
    case 8: return "CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED";
    case 9: return "CUSOLVER_STATUS_NOT_SUPPORTED";
    default: return "cusolverStatus";
  }
}

enum class Library { kCudart, kCusolverMg, kDriver };

std::string VendorMessage(const Api* api, Library lib, int status) {
  std::ostringstream m;
  if (lib == Library::kCudart) {
    m << api->cudaGetErrorString(status) << " (cudaError " << status << ")";
  } else if (lib == Library::kDriver) {
    m << "CUresult " << status;
  } else {
    m << CusolverStatusName(status) << " (" << status << ")";
  }
  return m.str();
}

// Every vendor call goes through this macro: a failure returns an Outcome naming the file,
// line, the call's text and the vendor's message (the protocol turns it into ffi::Error on
// every participant).
#define JAXMG_VENDOR_STATUS(lib, api, status, text)                                   \
  do {                                                                                \
    const int jaxmg_status_ = (status);                                               \
    if (jaxmg_status_ != 0) {                                                         \
      std::ostringstream jaxmg_m_;                                                    \
      jaxmg_m_ << __FILE__ << ":" << __LINE__ << ": " << text << " failed: "          \
               << VendorMessage((api), Library::lib, jaxmg_status_);                  \
      return Outcome::Fail(jaxmg_m_.str());                                           \
    }                                                                                 \
  } while (0)
#define JAXMG_VENDOR(lib, api, expr) JAXMG_VENDOR_STATUS(lib, api, (api)->expr, #expr)
#define JAXMG_CUDART(api, expr) JAXMG_VENDOR(kCudart, api, expr)
#define JAXMG_MG(api, expr) JAXMG_VENDOR(kCusolverMg, api, expr)

cuda::cudaDataType MgType(Dtype d) {
  switch (d) {
    case Dtype::kF32: return cuda::CUDA_R_32F;
    case Dtype::kF64: return cuda::CUDA_R_64F;
    case Dtype::kC64: return cuda::CUDA_C_32F;
    case Dtype::kC128: return cuda::CUDA_C_64F;
  }
  return cuda::CUDA_R_64F;
}

cuda::cudaDataType MgRealType(Dtype d) {
  return RealElementSize(d) == 4 ? cuda::CUDA_R_32F : cuda::CUDA_R_64F;
}

// Restores the calling thread's current device (the leader visits every device).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Api* api) : api_(api) { api_->cudaGetDevice(&device_); }
  ~DeviceGuard() { api_->cudaSetDevice(device_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const Api* api_;
  int device_ = 0;
};

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

  static Outcome Make(const Api* api, std::vector<int> devices,
                      std::unique_ptr<MgContext>* out) {
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

// Peer access between every ordered pair of the call's devices, tried once per pair. It is a
// performance option (NVIDIA's samples enable it; copies and cuSolverMg work without it,
// through host memory): a pair that cannot have it, e.g. cudaErrorTooManyPeers past 8 PCIe
// GPUs, is used without it, and the process says so once.
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
        if (err != cuda::cudaSuccess && err != cuda::cudaErrorPeerAccessAlreadyEnabled &&
            !told) {
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
  return Outcome::Fail(std::string(routine) + " failed: " +
                       VendorMessage(api, Library::kCusolverMg, status));
}

constexpr int64_t kMaxRhsChunk = 256;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Api* api) : api_(api) {}

  Outcome WorkspaceBytes(const MgCall& c, std::vector<int64_t>* bytes) override {
    return WithMatrix(c, [&](MgContext* ctx, cuda::cudaDataType type,
                             cuda::cudaLibMgMatrixDesc_t desc_a,
                             std::vector<void*>& a) -> Outcome {
      int64_t need = 0, size = 0;
      if (c.op == Op::kPotrs || c.op == Op::kPotri) {
        JAXMG_MG(api_, cusolverMgPotrf_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER,
                                                  c.n, a.data(), 1, 1, desc_a, type, &size));
        need = std::max(need, size);
      }
      if (c.op == Op::kPotrs && c.nrhs > 0) {
        const int chunk = RhsChunk(c);
        cuda::cudaLibMgMatrixDesc_t desc_b = nullptr;
        if (Outcome o = ctx->Desc(c.n, chunk, chunk, type, &desc_b); !o.ok) return o;
        std::vector<void*> b = c.b;
        JAXMG_MG(api_, cusolverMgPotrs_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER,
                                                  c.n, chunk, a.data(), 1, 1, desc_a, b.data(), 1,
                                                  1, desc_b, type, &size));
        need = std::max(need, size);
      }
      if (c.op == Op::kPotri) {
        JAXMG_MG(api_, cusolverMgPotri_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER,
                                                  c.n, a.data(), 1, 1, desc_a, type, &size));
        need = std::max(need, size);
      }
      if (c.op == Op::kSyevd) {
        std::vector<unsigned char> w(static_cast<size_t>(c.n) * RealElementSize(c.dtype));
        JAXMG_MG(api_, cusolverMgSyevd_bufferSize(ctx->handle(), EigMode(c),
                                                  cuda::CUBLAS_FILL_MODE_LOWER, c.n, a.data(), 1,
                                                  1, desc_a, w.data(), MgRealType(c.dtype), type,
                                                  &size));
        need = std::max(need, size);
      }
      // lwork counts elements of the compute type, on every device.
      bytes->assign(c.a.size(), std::max<int64_t>(need, 1) * ElementSize(c.dtype));
      return {};
    });
  }

  Outcome Run(const MgCall& c, int* info) override {
    return WithMatrix(c, [&](MgContext* ctx, cuda::cudaDataType type,
                             cuda::cudaLibMgMatrixDesc_t desc_a,
                             std::vector<void*>& a) -> Outcome {
      std::vector<void*> work = c.work;
      // The same size on every device (WorkspaceBytes); the library counts elements.
      const int64_t lwork = LworkElements(c);
      *info = 0;
      if (c.op == Op::kPotrs || c.op == Op::kPotri) {
        // A matrix that is not positive definite is a status, never an error.
        const int status = api_->cusolverMgPotrf(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, c.n,
                                                 a.data(), 1, 1, desc_a, type, work.data(), lwork,
                                                 info);
        if (Outcome o = LibraryOutcome(api_, "cusolverMgPotrf", status, info, true, c.n); !o.ok)
          return o;
      }
      if (c.op == Op::kPotrs && *info == 0) {
        // B is one tile on mesh position 0, solved in chunks of columns (no cap on nrhs).
        const int chunk = RhsChunk(c);
        const size_t esize = ElementSize(c.dtype);
        for (int c0 = 0; c0 < c.nrhs && *info == 0; c0 += chunk) {
          const int width = std::min(chunk, c.nrhs - c0);
          cuda::cudaLibMgMatrixDesc_t desc_b = nullptr;
          if (Outcome o = ctx->Desc(c.n, width, width, type, &desc_b); !o.ok) return o;
          std::vector<void*> b;
          for (void* p : c.b)
            b.push_back(static_cast<char*>(p) + static_cast<size_t>(c0) * c.lda * esize);
          const int status = api_->cusolverMgPotrs(
              ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, c.n, width, a.data(), 1, 1, desc_a,
              b.data(), 1, 1, desc_b, type, work.data(), lwork, info);
          if (Outcome o = LibraryOutcome(api_, "cusolverMgPotrs", status, info, false, c.n); !o.ok)
            return o;
        }
      }
      if (c.op == Op::kPotri && *info == 0) {
        const int status = api_->cusolverMgPotri(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, c.n,
                                                 a.data(), 1, 1, desc_a, type, work.data(), lwork,
                                                 info);
        if (Outcome o = LibraryOutcome(api_, "cusolverMgPotri", status, info, false, c.n); !o.ok)
          return o;
      }
      if (c.op == Op::kSyevd) {
        const int status = api_->cusolverMgSyevd(
            ctx->handle(), EigMode(c), cuda::CUBLAS_FILL_MODE_LOWER, c.n, a.data(), 1, 1, desc_a,
            c.w, MgRealType(c.dtype), type, work.data(), lwork, info);
        if (Outcome o = LibraryOutcome(api_, "cusolverMgSyevd", status, info, false, c.n); !o.ok)
          return o;
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

  // --- the leader of a multi-process call. NOT YET RUN ON GPU HARDWARE. ---

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
    JAXMG_CUDART(api_,
                 cudaIpcOpenMemHandle(&base, handle, cuda::kIpcMemLazyEnablePeerAccess));
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
  // Runs `fn(ctx, type, desc_a, a)` with the call's cached context locked, the caller's
  // current device restored afterwards, and the descriptor of A in its 1D block-cyclic layout.
  template <typename Fn>
  Outcome WithMatrix(const MgCall& c, Fn&& fn) {
    MgContext* ctx = nullptr;
    if (Outcome o = Context(c, &ctx); !o.ok) return o;
    std::lock_guard<std::mutex> lock(ctx->mu());
    DeviceGuard guard(api_);
    const auto type = MgType(c.dtype);
    cuda::cudaLibMgMatrixDesc_t desc_a = nullptr;
    if (Outcome o = ctx->Desc(c.n, c.n, c.tile, type, &desc_a); !o.ok) return o;
    std::vector<void*> a = c.a;
    return fn(ctx, type, desc_a, a);
  }

  static int RhsChunk(const MgCall& c) {
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>({c.tile, kMaxRhsChunk, std::max(c.nrhs, 1)})));
  }
  static cuda::cusolverEigMode_t EigMode(const MgCall& c) {
    return c.vectors ? cuda::CUSOLVER_EIG_MODE_VECTOR : cuda::CUSOLVER_EIG_MODE_NOVECTOR;
  }
  static int64_t LworkElements(const MgCall& c) {
    return c.work_bytes.empty() ? 0 : c.work_bytes[0] / static_cast<int64_t>(ElementSize(c.dtype));
  }

  // The device list in mesh order, checked; the cached context for it.
  Outcome Context(const MgCall& c, MgContext** ctx) {
    if (static_cast<int>(c.devices.size()) > kMaxCudaDevices)
      return Outcome::Fail("jaxmg: cuSolverMg accepts at most 16 GPUs, the call has " +
                           std::to_string(c.devices.size()));
    std::set<int> unique(c.devices.begin(), c.devices.end());
    if (unique.size() != c.devices.size() || *unique.begin() < 0)
      return Outcome::Fail("jaxmg: the call's mesh axis lists a GPU twice (or no GPU); "
                           "cuSolverMg needs distinct GPUs");
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

// Memory that stays valid until the participant returns (XLA's scratch allocator in a handler).
using ScratchFn = std::function<std::optional<void*>(size_t bytes)>;

// One participant's own GPU: everything runs on its XLA stream.
class CudaDevice final : public Device {
 public:
  CudaDevice(const Api* api, std::string load_error, cudaStream_t stream, int32_t ordinal,
             ScratchFn scratch)
      : api_(api), load_error_(std::move(load_error)), stream_(stream), ordinal_(ordinal),
        scratch_(std::move(scratch)) {}

  int ordinal() const override { return ordinal_; }
  Outcome ReadPosition(const int32_t* src, int32_t* out) override {
    if (api_ == nullptr) return Outcome::Fail(load_error_);
    JAXMG_CUDART(api_, cudaSetDevice(ordinal_));
    JAXMG_CUDART(api_, cudaMemcpyAsync(out, src, sizeof(int32_t), cuda::cudaMemcpyDeviceToHost,
                                       stream_));
    JAXMG_CUDART(api_, cudaStreamSynchronize(stream_));
    return {};
  }
  Outcome Copy(void* dst, const void* src, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemcpyAsync(dst, src, bytes, cuda::cudaMemcpyDefault, stream_));
    return {};
  }
  Outcome Upload(void* dst, const void* host, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemcpyAsync(dst, host, bytes, cuda::cudaMemcpyHostToDevice, stream_));
    return {};
  }
  Outcome FillBytes(void* dst, int byte, size_t bytes) override {
    JAXMG_CUDART(api_, cudaMemsetAsync(dst, byte, bytes, stream_));
    return {};
  }
  Outcome Allocate(size_t bytes, void** out) override {
    std::optional<void*> memory = scratch_(bytes);
    if (!memory.has_value())
      return Outcome::Fail("XLA's scratch allocator could not provide it on GPU " +
                           std::to_string(ordinal_));
    *out = *memory;
    return {};
  }
  Outcome Synchronize() override {
    JAXMG_CUDART(api_, cudaStreamSynchronize(stream_));
    return {};
  }

  // NOT YET RUN ON GPU HARDWARE. The allocation that holds `data` (XLA's allocator
  // sub-allocates, hence the offset) as a CUDA IPC handle, and this GPU's PCI bus id.
  bool SharesByHandle() const override { return true; }
  Outcome Share(void* data, size_t bytes, SharedMemory* out) override {
    if (api_ == nullptr) return Outcome::Fail(load_error_);
    if (api_->cuPointerGetAttribute == nullptr)
      return Outcome::Fail("the CUDA driver's cuPointerGetAttribute was not found (libcuda.so.1)");
    const auto address = reinterpret_cast<cuda::CUdeviceptr>(data);
    JAXMG_CUDART(api_, cudaSetDevice(ordinal_));  // a current context for the driver's queries
    int capable = 0;
    cuda::CUdeviceptr base = 0;
    size_t range = 0;
    JAXMG_VENDOR_STATUS(kDriver, api_,
                        api_->cuPointerGetAttribute(
                            &capable, cuda::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                            address),
                        "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)");
    if (capable == 0)
      return Outcome::Fail("XLA's allocator gave a buffer that CUDA IPC cannot share "
                           "(not a cudaMalloc-style allocation); the multi-process mode on GPUs "
                           "needs XLA's default (BFC) allocator");
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&base, cuda::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address),
        "cuPointerGetAttribute(RANGE_START_ADDR)");
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&range, cuda::CU_POINTER_ATTRIBUTE_RANGE_SIZE, address),
        "cuPointerGetAttribute(RANGE_SIZE)");
    if (address < base || address - base + bytes > range)
      return Outcome::Fail("a buffer of " + std::to_string(bytes) + " bytes does not lie in "
                           "one allocation");
    // The GPU that holds the memory, as the driver sees it (not XLA's numbering of devices).
    int holder = ordinal_;
    JAXMG_VENDOR_STATUS(
        kDriver, api_,
        api_->cuPointerGetAttribute(&holder, cuda::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address),
        "cuPointerGetAttribute(DEVICE_ORDINAL)");
    cuda::cudaIpcMemHandle_t handle;
    if (holder != ordinal_) JAXMG_CUDART(api_, cudaSetDevice(holder));
    JAXMG_CUDART(api_, cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)));
    std::memcpy(out->handle, handle.reserved, sizeof(out->handle));
    out->offset = address - base;
    out->bytes = bytes;
    JAXMG_CUDART(api_, cudaDeviceGetPCIBusId(out->bus_id, sizeof(out->bus_id), holder));
    return {};
  }

 private:
  const Api* api_;
  std::string load_error_;
  cudaStream_t stream_;
  int32_t ordinal_;
  ScratchFn scratch_;
};

ffi::Error RunCuda(const Operands& o, cudaStream_t stream, int32_t ordinal,
                   ffi::ScratchAllocator& scratch) {
  std::string load_error;
  const Api* api = cuda::Load(&load_error);
  CudaDevice device(api, load_error, stream, ordinal,
                    [&scratch](size_t bytes) { return scratch.Allocate(bytes, 256); });
  CudaBackend backend(api);
  return Participate(o, device, backend, kMaxCudaDevices);
}

}  // namespace

// nox -s gpu asks this once (issue 5): two processes on one GPU would need cuSolverMg to take a
// device list that names one GPU twice. Tries a Cholesky of diag(1..8), tile 2, on `device`
// listed twice and reports every status. NOT YET RUN ON GPU HARDWARE.
std::string ProbeRepeatedGpu(int device) {
  std::string load_error;
  const Api* api = cuda::Load(&load_error);
  if (api == nullptr) return load_error;
  std::ostringstream report;
  report << "cuSolverMg with GPU " << device << " listed twice:";
  auto step = [&](const char* what, int status) {
    report << " " << what << "=" << status;
    if (status != 0) report << " (" << CusolverStatusName(status) << ")";
    return status == 0;
  };
  constexpr int kN = 8, kTile = 2, kLocal = kN / 2;  // 2 "devices" x 2 tiles of 2 columns
  int devices[2] = {device, device};
  const int32_t ids[2] = {device, device};
  cuda::cusolverMgHandle_t handle = nullptr;
  cuda::cudaLibMgGrid_t grid = nullptr;
  cuda::cudaLibMgMatrixDesc_t desc = nullptr;
  void* a[2] = {nullptr, nullptr};
  void* work[2] = {nullptr, nullptr};
  DeviceGuard guard(api);
  api->cudaSetDevice(device);
  bool ok = step("cusolverMgCreate", api->cusolverMgCreate(&handle)) &&
            step("DeviceSelect", api->cusolverMgDeviceSelect(handle, 2, devices)) &&
            step("CreateDeviceGrid",
                 api->cusolverMgCreateDeviceGrid(&grid, 1, 2, ids,
                                                 cuda::CUDALIBMG_GRID_MAPPING_COL_MAJOR)) &&
            step("CreateMatrixDesc", api->cusolverMgCreateMatrixDesc(
                                         &desc, kN, kN, kN, kTile, cuda::CUDA_R_64F, grid));
  // Global column j: tile j / 2 on "device" (j / 2) % 2, local column (j / 4) * 2 + j % 2.
  std::vector<double> local[2] = {std::vector<double>(kN * kLocal, 0.0),
                                  std::vector<double>(kN * kLocal, 0.0)};
  for (int j = 0; j < kN; ++j)
    local[(j / kTile) % 2][((j / (2 * kTile)) * kTile + j % kTile) * kN + j] = j + 1.0;
  for (int d = 0; ok && d < 2; ++d) {
    ok = step("cudaMalloc", api->cudaMalloc(&a[d], local[d].size() * sizeof(double))) &&
         step("cudaMemcpy", api->cudaMemcpy(a[d], local[d].data(), local[d].size() * sizeof(double),
                                            cuda::cudaMemcpyHostToDevice));
  }
  int64_t lwork = 0;
  int info = -1;
  if (ok)
    ok = step("Potrf_bufferSize", api->cusolverMgPotrf_bufferSize(
                                      handle, cuda::CUBLAS_FILL_MODE_LOWER, kN, a, 1, 1, desc,
                                      cuda::CUDA_R_64F, &lwork));
  for (int d = 0; ok && d < 2; ++d)
    ok = step("cudaMalloc(work)",
              api->cudaMalloc(&work[d], static_cast<size_t>(std::max<int64_t>(lwork, 1)) * 8));
  if (ok) {
    ok = step("Potrf", api->cusolverMgPotrf(handle, cuda::CUBLAS_FILL_MODE_LOWER, kN, a, 1, 1, desc,
                                            cuda::CUDA_R_64F, work, lwork, &info));
    report << " info=" << info;
    // The library may still run on its own streams: wait for the device before reading.
    if (ok) ok = step("cudaDeviceSynchronize", api->cudaDeviceSynchronize());
  }
  if (ok) {
    double worst = 0.0;  // L = diag(sqrt(1..8))
    for (int d = 0; d < 2; ++d)
      api->cudaMemcpy(local[d].data(), a[d], local[d].size() * sizeof(double),
                      cuda::cudaMemcpyDeviceToHost);
    for (int j = 0; j < kN; ++j) {
      const double got = local[(j / kTile) % 2][((j / (2 * kTile)) * kTile + j % kTile) * kN + j];
      worst = std::max(worst, std::abs(got - std::sqrt(j + 1.0)));
    }
    report << " max |L_jj - sqrt(j+1)|=" << worst << (worst < 1e-12 ? " (correct)" : " (WRONG)");
  }
  for (void* p : work)
    if (p != nullptr) api->cudaFree(p);
  for (void* p : a)
    if (p != nullptr) api->cudaFree(p);
  if (desc != nullptr) api->cusolverMgDestroyMatrixDesc(desc);
  if (grid != nullptr) api->cusolverMgDestroyGrid(grid);
  if (handle != nullptr) api->cusolverMgDestroy(handle);
  return report.str();
}

namespace {

// --- RunCudaOnHost (cuda_targets.h): the handler's body on host arrays, for tests -----------

// One mesh position's buffers on its GPU: one cudaMalloc, every buffer at an aligned offset
// past a gap, so none starts at the allocation's base (as under XLA's allocator).
class StagedPosition {
 public:
  StagedPosition(const Api* api, int ordinal) : api_(api), ordinal_(ordinal) {}
  ~StagedPosition() {
    DeviceGuard guard(api_);
    api_->cudaSetDevice(ordinal_);
    for (void* m : scratch_) api_->cudaFree(m);
    if (base_ != nullptr) api_->cudaFree(base_);
    if (stream_ != nullptr) api_->cudaStreamDestroy(stream_);
  }
  StagedPosition(const StagedPosition&) = delete;
  StagedPosition& operator=(const StagedPosition&) = delete;

  // Reserves `bytes` in the allocation to come; returns its offset.
  size_t Reserve(size_t bytes) {
    const size_t at = size_;
    size_ += (bytes + 255) / 256 * 256 + 256;
    return at;
  }
  Outcome Allocate() {
    JAXMG_CUDART(api_, cudaSetDevice(ordinal_));
    JAXMG_CUDART(api_, cudaStreamCreate(&stream_));
    JAXMG_CUDART(api_, cudaMalloc(&base_, size_));
    return {};
  }
  char* at(size_t offset) const { return static_cast<char*>(base_) + offset; }
  cudaStream_t stream() const { return stream_; }
  // Scratch memory on this GPU, freed with the position (the handler's ScratchAllocator).
  std::optional<void*> Scratch(size_t bytes) {
    DeviceGuard guard(api_);
    void* m = nullptr;
    if (api_->cudaSetDevice(ordinal_) != cuda::cudaSuccess ||
        api_->cudaMalloc(&m, bytes) != cuda::cudaSuccess)
      return std::nullopt;
    scratch_.push_back(m);
    return m;
  }

 private:
  const Api* api_;
  int ordinal_;
  size_t size_ = 256;  // the leading gap
  void* base_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> scratch_;
};

Outcome Download(const Api* api, const char* src, size_t bytes, std::string* out) {
  out->assign(bytes, '\0');
  if (bytes > 0)
    JAXMG_CUDART(api, cudaMemcpy(out->data(), src, bytes, cuda::cudaMemcpyDeviceToHost));
  return {};
}

// Position i of `c` (mesh position c.positions[i]) on its own thread; fills result slot i.
void RunPositionOnHost(const Api* api, const HostCall& c, ffi::DataType type, Dtype dtype,
                       size_t i, HostResult* out) {
  const int position = c.positions[i];
  const int ordinal = static_cast<int>(c.device_ids[position]);
  const size_t esize = ElementSize(dtype);
  const bool potrs = c.op == "potrs", syevd = c.op == "syevd";
  const size_t a_bytes = static_cast<size_t>(c.local * c.n) * esize;
  const size_t b_bytes = potrs ? static_cast<size_t>(c.nrhs * c.n) * esize : 0;
  const size_t w_bytes = syevd ? static_cast<size_t>(c.n) * RealElementSize(dtype) : 0;

  StagedPosition staged(api, ordinal);
  const size_t a_in = staged.Reserve(a_bytes), a_out = c.aliased ? a_in : staged.Reserve(a_bytes);
  const size_t b_in = staged.Reserve(b_bytes), x_out = c.aliased ? b_in : staged.Reserve(b_bytes);
  const size_t w_out = staged.Reserve(w_bytes);
  const size_t pos_at = staged.Reserve(sizeof(int32_t));
  const size_t status_at = staged.Reserve(sizeof(int32_t));
  const int32_t position32 = position, unset = -12345;
  Outcome staging = [&]() -> Outcome {
    if (Outcome o = staged.Allocate(); !o.ok) return o;
    auto up = [&](size_t offset, const void* host, size_t bytes) -> Outcome {
      if (bytes > 0)
        JAXMG_CUDART(api, cudaMemcpy(staged.at(offset), host, bytes, cuda::cudaMemcpyHostToDevice));
      return {};
    };
    if (Outcome o = up(a_in, c.a[i].data(), a_bytes); !o.ok) return o;
    if (potrs) {
      if (Outcome o = up(b_in, c.b[i].data(), b_bytes); !o.ok) return o;
    }
    if (Outcome o = up(pos_at, &position32, sizeof(position32)); !o.ok) return o;
    return up(status_at, &unset, sizeof(unset));
  }();
  if (!staging.ok) {  // the other positions fail at their deadline
    out->errors[i] = "staging mesh position " + std::to_string(position) + ": " + staging.message;
    return;
  }

  int64_t a_dims[2] = {c.local, c.n}, b_dims[2] = {c.nrhs, c.n}, w_dims[1] = {c.n};
  XLA_FFI_Buffer a_buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                          static_cast<XLA_FFI_DataType>(type), staged.at(a_in), 2, a_dims};
  XLA_FFI_Buffer b_buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr,
                          static_cast<XLA_FFI_DataType>(type), staged.at(b_in), 2, b_dims};
  ffi::AnyBuffer a(&a_buffer), b(&b_buffer);
  Operands o;
  o.op = potrs ? Op::kPotrs : syevd ? Op::kSyevd : Op::kPotri;
  o.target = potrs ? "jaxmg_potrs" : syevd ? "jaxmg_syevd" : "jaxmg_potri";
  o.a = &a;
  o.a_out = staged.at(a_out);
  o.position = reinterpret_cast<const int32_t*>(staged.at(pos_at));
  o.position_count = 1;
  o.status_out = reinterpret_cast<int32_t*>(staged.at(status_at));
  o.status_count = 1;
  o.tile = c.tile;
  o.device_ids = ffi::Span<const int64_t>(c.device_ids);
  o.call_id = c.call_id;
  if (potrs) {
    o.b = &b;
    o.x_out = staged.at(x_out);
    o.x_dims = ffi::AnyBuffer::Dimensions(b_dims, 2);
  }
  if (syevd) {
    o.w_out = staged.at(w_out);
    o.w_type = RealTypeOf(dtype);
    o.w_dims = ffi::AnyBuffer::Dimensions(w_dims, 1);
    o.vectors = c.vectors;
  }
  o.job = c.job;
  o.pids = ffi::Span<const int64_t>(c.pids);
  o.to_cyclic = ffi::Span<const int64_t>(c.to_cyclic);
  o.from_cyclic = ffi::Span<const int64_t>(c.from_cyclic);

  CudaDevice device(api, "", staged.stream(), ordinal,
                    [&staged](size_t bytes) { return staged.Scratch(bytes); });
  CudaBackend backend(api);
  ffi::Error e = Participate(o, device, backend, kMaxCudaDevices);
  if (e.failure()) out->errors[i] = e.message();

  Outcome back = [&]() -> Outcome {
    JAXMG_CUDART(api, cudaStreamSynchronize(staged.stream()));
    if (Outcome r = Download(api, staged.at(a_out), a_bytes, &out->a[i]); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(x_out), b_bytes, &out->x[i]); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(w_out), w_bytes, &out->w[i]); !r.ok) return r;
    JAXMG_CUDART(api, cudaMemcpy(&out->status[i], staged.at(status_at), sizeof(int32_t),
                                 cuda::cudaMemcpyDeviceToHost));
    return {};
  }();
  if (!back.ok && out->errors[i].empty()) out->errors[i] = back.message;
}

}  // namespace

bool RunCudaOnHost(const HostCall& c, HostResult* out, std::string* error) {
  static const std::map<std::string, std::pair<ffi::DataType, Dtype>> kTypes = {
      {"float32", {ffi::DataType::F32, Dtype::kF32}},
      {"float64", {ffi::DataType::F64, Dtype::kF64}},
      {"complex64", {ffi::DataType::C64, Dtype::kC64}},
      {"complex128", {ffi::DataType::C128, Dtype::kC128}}};
  const auto type = kTypes.find(c.dtype);
  const size_t count = c.positions.size();
  const size_t esize = type != kTypes.end() ? ElementSize(type->second.second) : 0;
  std::ostringstream bad;
  if (c.op != "potrs" && c.op != "potri" && c.op != "syevd")
    bad << "op must be potrs, potri or syevd";
  else if (type == kTypes.end()) bad << "dtype must be float32, float64, complex64 or complex128";
  else if (c.a.size() != count || (c.op == "potrs" && c.b.size() != count))
    bad << "one a (and, for potrs, one b) per position run";
  for (size_t i = 0; bad.str().empty() && i < count; ++i) {
    if (c.positions[i] < 0 || c.positions[i] >= static_cast<int>(c.device_ids.size()))
      bad << "position " << c.positions[i] << " is not on the mesh axis";
    else if (c.a[i].size() != static_cast<size_t>(c.local * c.n) * esize)
      bad << "a[" << i << "] must hold L x N = " << c.local << " x " << c.n << " elements";
    else if (c.op == "potrs" && c.b[i].size() != static_cast<size_t>(c.nrhs * c.n) * esize)
      bad << "b[" << i << "] must hold nrhs x N = " << c.nrhs << " x " << c.n << " elements";
  }
  if (!bad.str().empty()) {
    *error = "RunCudaOnHost: " + bad.str();
    return false;
  }
  const Api* api = cuda::Load(error);
  if (api == nullptr) return false;
  out->a.assign(count, {});
  out->x.assign(count, {});
  out->w.assign(count, {});
  out->status.assign(count, -1);
  out->errors.assign(count, {});
  std::vector<std::thread> threads;
  for (size_t i = 0; i < count; ++i)
    threads.emplace_back(RunPositionOnHost, api, std::cref(c), type->second.first,
                         type->second.second, i, out);
  for (std::thread& t : threads) t.join();
  return true;
}

ffi::Error PotrsCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                     ffi::RunId run,
                     ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Buffer<ffi::S32> position,
                     ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::AnyBuffer> x,
                     ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                     ffi::Span<const int64_t> device_ids, int64_t call_id, int64_t job,
                     ffi::Span<const int64_t> pids, ffi::Span<const int64_t> to_cyclic,
                     ffi::Span<const int64_t> from_cyclic) {
  Operands o = PotrsOperands(a, b, position, a_out, x, status, tile, device_ids, call_id);
  return RunCuda(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run), stream,
                 ordinal, scratch);
}

ffi::Error PotriCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                     ffi::RunId run,
                     ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                     ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::Buffer<ffi::S32>> status,
                     int64_t tile, ffi::Span<const int64_t> device_ids, int64_t call_id,
                     int64_t job, ffi::Span<const int64_t> pids,
                     ffi::Span<const int64_t> to_cyclic, ffi::Span<const int64_t> from_cyclic) {
  Operands o = PotriOperands(a, position, a_out, status, tile, device_ids, call_id);
  return RunCuda(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run), stream,
                 ordinal, scratch);
}

ffi::Error SyevdCuda(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                     ffi::RunId run,
                     ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                     ffi::Result<ffi::AnyBuffer> v, ffi::Result<ffi::AnyBuffer> w,
                     ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                     ffi::Span<const int64_t> device_ids, int64_t call_id, bool vectors,
                     int64_t job, ffi::Span<const int64_t> pids,
                     ffi::Span<const int64_t> to_cyclic, ffi::Span<const int64_t> from_cyclic) {
  Operands o = SyevdOperands(a, position, v, w, status, tile, device_ids, call_id, vectors);
  return RunCuda(WithRun(WithAttrs(o, job, pids, to_cyclic, from_cyclic), run), stream,
                 ordinal, scratch);
}

}  // namespace jaxmg

namespace ffi = xla::ffi;

// Handlers. Never declare the command-buffer trait: they meet other devices' handlers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotrsCuda, jaxmg::PotrsCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // this GPU
                                  .Ctx<ffi::ScratchAllocator>()              // workspace
                                  .Ctx<ffi::RunId>()                         // the execution
                                  .Arg<ffi::AnyBuffer>()                     // a [L, N]
                                  .Arg<ffi::AnyBuffer>()                     // b [nrhs, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // position []
                                  .Ret<ffi::AnyBuffer>()                     // factor, aliases a
                                  .Ret<ffi::AnyBuffer>()                     // x, aliases b
                                  .Ret<ffi::Buffer<ffi::S32>>()              // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<int64_t>("job")
                                  .Attr<ffi::Span<const int64_t>>("pids")
                                  .Attr<ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<ffi::Span<const int64_t>>("from_cyclic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotriCuda, jaxmg::PotriCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // this GPU
                                  .Ctx<ffi::ScratchAllocator>()              // workspace
                                  .Ctx<ffi::RunId>()                         // the execution
                                  .Arg<ffi::AnyBuffer>()                     // a [L, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // position []
                                  .Ret<ffi::AnyBuffer>()                     // inverse, aliases a
                                  .Ret<ffi::Buffer<ffi::S32>>()              // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<int64_t>("job")
                                  .Attr<ffi::Span<const int64_t>>("pids")
                                  .Attr<ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<ffi::Span<const int64_t>>("from_cyclic"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgSyevdCuda, jaxmg::SyevdCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Ctx<ffi::DeviceOrdinal>()                 // this GPU
                                  .Ctx<ffi::ScratchAllocator>()              // workspace
                                  .Ctx<ffi::RunId>()                         // the execution
                                  .Arg<ffi::AnyBuffer>()                     // a [L, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // position []
                                  .Ret<ffi::AnyBuffer>()                     // vectors, aliases a
                                  .Ret<ffi::AnyBuffer>()                     // w [N] real
                                  .Ret<ffi::Buffer<ffi::S32>>()              // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<bool>("vectors")
                                  .Attr<int64_t>("job")
                                  .Attr<ffi::Span<const int64_t>>("pids")
                                  .Attr<ffi::Span<const int64_t>>("to_cyclic")
                                  .Attr<ffi::Span<const int64_t>>("from_cyclic"));
