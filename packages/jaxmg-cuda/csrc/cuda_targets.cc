// The cuSolverMg targets. NOT YET RUN ON GPU HARDWARE: this layer compiles in CI (no GPU
// there) and its lowering is tested on CPU, but no GPU has executed it yet.
//
// Protocol per call (see rendezvous.h): every participant synchronises its stream and
// publishes its buffers (phase 0); the leader sets up the cuSolverMg handle, grid and
// descriptors (cached per device list, N, T_A, dtype) and queries the workspace size; every
// participant allocates that workspace from XLA's scratch allocator on its own thread and
// publishes it (phase 1); the leader runs the factorisation/solve and writes every device's
// outputs with synchronous copies; then all return.
#include "cuda_targets.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "common.h"
#include "cuda_api.h"

namespace jaxmg {
namespace cuda {
namespace {

std::mutex load_mu;
std::vector<std::string>* library_dirs = new std::vector<std::string>();

void* OpenFirst(const std::vector<std::string>& names, std::string* tried) {
  for (const std::string& name : names) {
    for (const std::string& dir : *library_dirs) {
      std::string path = dir + "/" + name;
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    }
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    *tried += " " + name;
  }
  return nullptr;
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
  std::string tried;
  // CUDA 13 first (the runtime of jax's cuda13 plugin), then CUDA 12.
  void* rt = OpenFirst({"libcudart.so.13", "libcudart.so.12"}, &tried);
  void* mg = OpenFirst({"libcusolverMg.so.12", "libcusolverMg.so.11"}, &tried);
  if (rt == nullptr || mg == nullptr) {
    failure = "jaxmg: could not load the CUDA runtime and cuSolverMg (tried" + tried +
              "); install NVIDIA's wheels (pip install nvidia-cusolver-cu12 or the cu13 set) "
              "or put the libraries on LD_LIBRARY_PATH";
    *error = failure;
    return nullptr;
  }
  auto* table = new Api();
  bool ok = true;
  auto bind = [&](void* lib, const char* name, auto& slot) {
    void* sym = dlsym(lib, name);
    if (sym == nullptr) {
      ok = false;
      failure += std::string(" ") + name;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(sym);
  };
#define JAXMG_BIND(lib, name) bind(lib, #name, table->name)
  JAXMG_BIND(rt, cudaGetDevice);
  JAXMG_BIND(rt, cudaSetDevice);
  JAXMG_BIND(rt, cudaStreamSynchronize);
  JAXMG_BIND(rt, cudaDeviceSynchronize);
  JAXMG_BIND(rt, cudaMemcpy);
  JAXMG_BIND(rt, cudaMemcpyAsync);
  JAXMG_BIND(rt, cudaMemset);
  JAXMG_BIND(rt, cudaDeviceCanAccessPeer);
  JAXMG_BIND(rt, cudaDeviceEnablePeerAccess);
  JAXMG_BIND(rt, cudaGetErrorString);
  JAXMG_BIND(rt, cudaGetLastError);
  JAXMG_BIND(mg, cusolverMgCreate);
  JAXMG_BIND(mg, cusolverMgDestroy);
  JAXMG_BIND(mg, cusolverMgDeviceSelect);
  JAXMG_BIND(mg, cusolverMgCreateDeviceGrid);
  JAXMG_BIND(mg, cusolverMgDestroyGrid);
  JAXMG_BIND(mg, cusolverMgCreateMatrixDesc);
  JAXMG_BIND(mg, cusolverMgDestroyMatrixDesc);
  JAXMG_BIND(mg, cusolverMgPotrf_bufferSize);
  JAXMG_BIND(mg, cusolverMgPotrf);
  JAXMG_BIND(mg, cusolverMgPotrs_bufferSize);
  JAXMG_BIND(mg, cusolverMgPotrs);
  JAXMG_BIND(mg, cusolverMgPotri_bufferSize);
  JAXMG_BIND(mg, cusolverMgPotri);
  JAXMG_BIND(mg, cusolverMgSyevd_bufferSize);
  JAXMG_BIND(mg, cusolverMgSyevd);
#undef JAXMG_BIND
  if (!ok) {
    failure = "jaxmg: the CUDA libraries lack symbols:" + failure;
    *error = failure;
    delete table;
    return nullptr;
  }
  api = table;
  return api;
}

}  // namespace cuda

void SetCudaLibraryDirs(const std::vector<std::string>& dirs) { cuda::SetLibraryDirs(dirs); }

namespace {

using cuda::Api;

// Every vendor call goes through these: a failure becomes an Outcome naming file, line, the
// call's text and the vendor's message.
#define JAXMG_CUDART(api, expr)                                                             \
  do {                                                                                      \
    int _err = (api)->expr;                                                                 \
    if (_err != cuda::cudaSuccess) {                                                        \
      std::ostringstream _m;                                                                \
      _m << __FILE__ << ":" << __LINE__ << ": " << #expr << " failed: "                    \
         << (api)->cudaGetErrorString(_err);                                                \
      return Outcome::Fail(_m.str());                                                       \
    }                                                                                       \
  } while (0)

#define JAXMG_MG(api, expr)                                                                 \
  do {                                                                                      \
    int _status = (api)->expr;                                                              \
    if (_status != cuda::CUSOLVER_STATUS_SUCCESS) {                                         \
      std::ostringstream _m;                                                                \
      _m << __FILE__ << ":" << __LINE__ << ": " << #expr << " failed with cusolverStatus "  \
         << _status;                                                                        \
      return Outcome::Fail(_m.str());                                                       \
    }                                                                                       \
  } while (0)

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

// Restores the calling thread's current device when the leader is done.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Api* api) : api_(api) { api_->cudaGetDevice(&device_); }
  ~DeviceGuard() { api_->cudaSetDevice(device_); }

 private:
  const Api* api_;
  int device_ = 0;
};

// A cuSolverMg handle and grid for one device list (RAII), plus descriptors per shape.
class MgContext {
 public:
  ~MgContext() {
    for (auto& [key, desc] : descs_) api_->cusolverMgDestroyMatrixDesc(desc);
    if (grid_) api_->cusolverMgDestroyGrid(grid_);
    if (handle_) api_->cusolverMgDestroy(handle_);
  }
  static Outcome Make(const Api* api, std::vector<int> devices, std::unique_ptr<MgContext>* out) {
    auto ctx = std::unique_ptr<MgContext>(new MgContext(api));
    JAXMG_MG(api, cusolverMgCreate(&ctx->handle_));
    JAXMG_MG(api, cusolverMgDeviceSelect(ctx->handle_, static_cast<int>(devices.size()),
                                         devices.data()));
    std::vector<int32_t> ids(devices.begin(), devices.end());
    JAXMG_MG(api, cusolverMgCreateDeviceGrid(&ctx->grid_, 1, static_cast<int32_t>(ids.size()),
                                             ids.data(), cuda::CUDALIBMG_GRID_MAPPING_COL_MAJOR));
    *out = std::move(ctx);
    return {};
  }
  // Column-major rows x cols matrix, row block = rows (leading dimension), column tile `tile`.
  Outcome Desc(int64_t rows, int64_t cols, int64_t tile, cuda::cudaDataType type,
               cuda::cudaLibMgMatrixDesc_t* desc) {
    std::ostringstream key;
    key << rows << "x" << cols << "/" << tile << "/" << type;
    auto it = descs_.find(key.str());
    if (it == descs_.end()) {
      cuda::cudaLibMgMatrixDesc_t d = nullptr;
      JAXMG_MG(api_, cusolverMgCreateMatrixDesc(&d, rows, cols, rows, tile, type, grid_));
      it = descs_.emplace(key.str(), d).first;
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
  std::map<std::string, cuda::cudaLibMgMatrixDesc_t> descs_;
  std::mutex mu_;  // one leader at a time per device list
};

std::mutex contexts_mu;
std::map<std::vector<int>, std::unique_ptr<MgContext>>* contexts =
    new std::map<std::vector<int>, std::unique_ptr<MgContext>>();
std::set<std::pair<int, int>>* peers = new std::set<std::pair<int, int>>();

// Peer access between every pair of the call's devices, once per pair (as NVIDIA's samples).
Outcome EnablePeers(const Api* api, const std::vector<int>& devices) {
  for (int i : devices) {
    for (int j : devices) {
      if (i == j || peers->count({i, j})) continue;
      int can = 0;
      JAXMG_CUDART(api, cudaDeviceCanAccessPeer(&can, i, j));
      if (can) {
        JAXMG_CUDART(api, cudaSetDevice(i));
        int err = api->cudaDeviceEnablePeerAccess(j, 0);
        if (err != cuda::cudaSuccess && err != cuda::cudaErrorPeerAccessAlreadyEnabled) {
          return Outcome::Fail(std::string("cudaDeviceEnablePeerAccess failed: ") +
                               api->cudaGetErrorString(err));
        }
        api->cudaGetLastError();  // clear "already enabled"
      }
      peers->insert({i, j});
    }
  }
  return {};
}

// The device list in mesh order, validated; the context for it.
Outcome ContextFor(const Api* api, const std::vector<Slot>& slots, MgContext** ctx,
                   std::vector<int>* devices) {
  devices->clear();
  for (const Slot& s : slots) devices->push_back(s.device);
  if (static_cast<int>(devices->size()) > kMaxCudaDevices)
    return Outcome::Fail("jaxmg: cuSolverMg accepts at most 16 GPUs, the call has " +
                         std::to_string(devices->size()));
  std::set<int> unique(devices->begin(), devices->end());
  if (unique.size() != devices->size())
    return Outcome::Fail("jaxmg: a device appears twice in the call's mesh axis; cuSolverMg "
                         "needs distinct GPUs");
  std::lock_guard<std::mutex> lock(contexts_mu);
  DeviceGuard guard(api);
  if (Outcome o = EnablePeers(api, *devices); !o.ok) return o;
  auto& slot = (*contexts)[*devices];
  if (!slot) {
    if (Outcome o = MgContext::Make(api, *devices, &slot); !o.ok) return o;
  }
  *ctx = slot.get();
  return {};
}

std::vector<void*> Pointers(const std::vector<Slot>& slots, int which) {
  std::vector<void*> out;
  for (const Slot& s : slots) out.push_back(s.ptr[which]);
  return out;
}

std::vector<void*> Workspaces(const std::vector<Slot>& slots) {
  std::vector<void*> out;
  for (const Slot& s : slots) out.push_back(s.workspace);
  return out;
}

enum class Op { kPotrs, kPotri, kSyevd };

constexpr int64_t kMaxRhsChunk = 256;

int64_t RhsChunk(const Problem& p) {
  return std::max<int64_t>(1, std::min({p.tile, kMaxRhsChunk, std::max<int64_t>(p.nrhs, 1)}));
}

// Phase 0 leader: workspace size in elements (the maximum over the routines the op runs).
Outcome QueryWorkspace(const Api* api, Op op, const Problem& p, const std::vector<Slot>& slots,
                       bool vectors, int64_t* lwork) {
  MgContext* ctx = nullptr;
  std::vector<int> devices;
  if (Outcome o = ContextFor(api, slots, &ctx, &devices); !o.ok) return o;
  std::lock_guard<std::mutex> lock(ctx->mu());
  DeviceGuard guard(api);
  auto type = MgType(p.dtype);
  cuda::cudaLibMgMatrixDesc_t desc_a;
  if (Outcome o = ctx->Desc(p.n, p.n, p.tile, type, &desc_a); !o.ok) return o;
  std::vector<void*> a = Pointers(slots, 0);
  int n = static_cast<int>(p.n);
  int64_t need = 0, size = 0;
  if (op == Op::kPotrs || op == Op::kPotri) {
    JAXMG_MG(api, cusolverMgPotrf_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n,
                                             a.data(), 1, 1, desc_a, type, &size));
    need = std::max(need, size);
  }
  if (op == Op::kPotrs && p.nrhs > 0) {
    int64_t chunk = RhsChunk(p);
    cuda::cudaLibMgMatrixDesc_t desc_b;
    if (Outcome o = ctx->Desc(p.n, chunk, chunk, type, &desc_b); !o.ok) return o;
    std::vector<void*> b = Pointers(slots, 1);
    JAXMG_MG(api, cusolverMgPotrs_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n,
                                             static_cast<int>(chunk), a.data(), 1, 1, desc_a,
                                             b.data(), 1, 1, desc_b, type, &size));
    need = std::max(need, size);
  }
  if (op == Op::kPotri) {
    JAXMG_MG(api, cusolverMgPotri_bufferSize(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n,
                                             a.data(), 1, 1, desc_a, type, &size));
    need = std::max(need, size);
  }
  if (op == Op::kSyevd) {
    std::vector<char> w(p.n * RealElementSize(p.dtype));
    JAXMG_MG(api, cusolverMgSyevd_bufferSize(
                      ctx->handle(),
                      vectors ? cuda::CUSOLVER_EIG_MODE_VECTOR : cuda::CUSOLVER_EIG_MODE_NOVECTOR,
                      cuda::CUBLAS_FILL_MODE_LOWER, n, a.data(), 1, 1, desc_a, w.data(),
                      MgRealType(p.dtype), type, &size));
    need = std::max(need, size);
  }
  *lwork = need;
  return {};
}

// Fill every real column of every device's block with NaN (all bits set).
Outcome NaNBlocks(const Api* api, const Problem& p, const std::vector<Slot>& slots, int which) {
  for (size_t d = 0; d < slots.size(); ++d) {
    JAXMG_CUDART(api, cudaSetDevice(slots[d].device));
    JAXMG_CUDART(api, cudaMemset(slots[d].ptr[which], 0xFF,
                                 static_cast<size_t>(p.local) * p.n * ElementSize(p.dtype)));
  }
  return {};
}

Outcome WriteStatus(const Api* api, const std::vector<Slot>& slots, int which, int32_t info) {
  for (const Slot& s : slots) {
    JAXMG_CUDART(api, cudaSetDevice(s.device));
    JAXMG_CUDART(api, cudaMemcpy(s.ptr[which], &info, sizeof(info), cuda::cudaMemcpyHostToDevice));
  }
  return {};
}

// Phase 1 leader: the library call, NaN fill, outputs to every device.
Outcome Run(const Api* api, Op op, const Problem& p, const std::vector<Slot>& slots,
            bool vectors, int64_t lwork) {
  MgContext* ctx = nullptr;
  std::vector<int> devices;
  if (Outcome o = ContextFor(api, slots, &ctx, &devices); !o.ok) return o;
  std::lock_guard<std::mutex> lock(ctx->mu());
  DeviceGuard guard(api);
  auto type = MgType(p.dtype);
  cuda::cudaLibMgMatrixDesc_t desc_a;
  if (Outcome o = ctx->Desc(p.n, p.n, p.tile, type, &desc_a); !o.ok) return o;
  std::vector<void*> a = Pointers(slots, 0);
  std::vector<void*> work = Workspaces(slots);
  int n = static_cast<int>(p.n);
  int info = 0;
  const size_t esize = ElementSize(p.dtype);
  if (op == Op::kPotrs || op == Op::kPotri) {
    JAXMG_MG(api, cusolverMgPotrf(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n, a.data(), 1,
                                  1, desc_a, type, work.data(), lwork, &info));
  }
  if (op == Op::kPotrs) {
    const size_t x_bytes = static_cast<size_t>(p.n) * p.nrhs * esize;
    if (info == 0) {
      // B lives on mesh position 0 as one tile per chunk of right-hand sides.
      int64_t chunk = RhsChunk(p);
      for (int64_t c0 = 0; c0 < p.nrhs && info == 0; c0 += chunk) {
        int64_t width = std::min(chunk, p.nrhs - c0);
        cuda::cudaLibMgMatrixDesc_t desc_b;
        if (Outcome o = ctx->Desc(p.n, width, width, type, &desc_b); !o.ok) return o;
        std::vector<void*> b;
        for (const Slot& s : slots)
          b.push_back(static_cast<char*>(s.ptr[1]) + static_cast<size_t>(c0) * p.n * esize);
        JAXMG_MG(api, cusolverMgPotrs(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n,
                                      static_cast<int>(width), a.data(), 1, 1, desc_a,
                                      b.data(), 1, 1, desc_b, type, work.data(), lwork, &info));
      }
    }
    if (info != 0) {
      JAXMG_CUDART(api, cudaSetDevice(slots[0].device));
      JAXMG_CUDART(api, cudaMemset(slots[0].ptr[1], 0xFF, x_bytes));
    }
    for (size_t d = 1; d < slots.size(); ++d) {
      JAXMG_CUDART(api, cudaMemcpy(slots[d].ptr[1], slots[0].ptr[1], x_bytes,
                                   cuda::cudaMemcpyDefault));
    }
    return WriteStatus(api, slots, 2, info);
  }
  if (op == Op::kPotri) {
    if (info == 0) {
      JAXMG_MG(api, cusolverMgPotri(ctx->handle(), cuda::CUBLAS_FILL_MODE_LOWER, n, a.data(), 1,
                                    1, desc_a, type, work.data(), lwork, &info));
    }
    if (info != 0) {
      if (Outcome o = NaNBlocks(api, p, slots, 0); !o.ok) return o;
    }
    return WriteStatus(api, slots, 1, info);
  }
  // syevd
  const size_t w_bytes = static_cast<size_t>(p.n) * RealElementSize(p.dtype);
  std::vector<char> w(w_bytes);
  JAXMG_MG(api, cusolverMgSyevd(
                    ctx->handle(),
                    vectors ? cuda::CUSOLVER_EIG_MODE_VECTOR : cuda::CUSOLVER_EIG_MODE_NOVECTOR,
                    cuda::CUBLAS_FILL_MODE_LOWER, n, a.data(), 1, 1, desc_a, w.data(),
                    MgRealType(p.dtype), type, work.data(), lwork, &info));
  if (info != 0) {
    if (Outcome o = NaNBlocks(api, p, slots, 0); !o.ok) return o;
    std::fill(w.begin(), w.end(), static_cast<char>(0xFF));
  }
  for (const Slot& s : slots) {
    JAXMG_CUDART(api, cudaSetDevice(s.device));
    JAXMG_CUDART(api, cudaMemcpy(s.ptr[1], w.data(), w_bytes, cuda::cudaMemcpyHostToDevice));
  }
  return WriteStatus(api, slots, 2, info);
}

// What every CUDA participant does; `slot.ptr` already holds its result buffers.
ffi::Error Participate(Op op, const char* target, cudaStream_t stream, int32_t ordinal,
                       ffi::ScratchAllocator& scratch, ffi::Buffer<ffi::S32>& position_buf,
                       const ffi::AnyBuffer& a, ffi::AnyBuffer::Dimensions dims,
                       ffi::DataType type, int64_t tile, ffi::Span<const int64_t> device_ids,
                       int64_t call_id, Problem p, std::string error, Slot slot,
                       bool vectors, const std::function<void(const Api*)>& copy_inputs) {
  std::string load_error;
  const Api* api = cuda::Load(&load_error);
  int64_t ndev = std::max<int64_t>(static_cast<int64_t>(device_ids.size()), 1);
  auto meeting = Registry::Get().Join(MeetingKey(target, device_ids, call_id), ndev);
  int32_t position = -1;
  if (api == nullptr) {
    error = load_error;
  } else if (api->cudaMemcpyAsync(&position, position_buf.typed_data(), sizeof(position),
                                  cuda::cudaMemcpyDeviceToHost, stream) != cuda::cudaSuccess ||
             api->cudaStreamSynchronize(stream) != cuda::cudaSuccess) {
    error = std::string(target) + ": reading the mesh position failed";
  }
  if (error.empty())
    error = CheckMatrix(target, dims, type, tile, device_ids, position, &p);
  if (error.empty() && static_cast<int64_t>(device_ids.size()) > kMaxCudaDevices)
    error = std::string(target) + ": cuSolverMg accepts at most 16 GPUs, the call has " +
            std::to_string(device_ids.size());
  if (error.empty()) {
    copy_inputs(api);  // only when XLA did not alias inputs and results
    if (api->cudaStreamSynchronize(stream) != cuda::cudaSuccess)
      error = std::string(target) + ": cudaStreamSynchronize failed";
  }
  Outcome own = error.empty() ? Outcome{} : Outcome::Fail(error);
  if (own.ok) {
    if (meeting->Get(p.position).arrived) {
      own = Outcome::Fail(std::string(target) + ": two participants claim mesh position " +
                          std::to_string(p.position));
    } else {
      slot.device = ordinal;
      meeting->Publish(p.position, slot);
    }
  }
  // Phase 0: everyone published; the leader sizes the workspace.
  Outcome r = meeting->Phase(0, own, [&] {
    int64_t lwork = 0;
    Outcome o = QueryWorkspace(api, op, p, meeting->Slots(), vectors, &lwork);
    meeting->shared[0] = lwork;
    return o;
  });
  if (!r.ok) return Fail(r.message);
  // Each participant allocates its own workspace on its own thread.
  const int64_t lwork = meeting->shared[0];
  Outcome mine;
  auto memory = scratch.Allocate(std::max<size_t>(1, static_cast<size_t>(lwork) * ElementSize(p.dtype)), 256);
  if (!memory.has_value()) {
    mine = Outcome::Fail(std::string(target) + ": could not allocate " +
                         std::to_string(lwork * ElementSize(p.dtype)) +
                         " bytes of cuSolverMg workspace on device " + std::to_string(ordinal));
  } else {
    slot.device = ordinal;
    slot.workspace = *memory;
    meeting->Publish(p.position, slot);
  }
  // Phase 1: the leader runs the library for all devices.
  r = meeting->Phase(1, mine, [&] { return Run(api, op, p, meeting->Slots(), vectors, lwork); });
  return r.ok ? ffi::Error::Success() : Fail(r.message);
}

void CopyIfDistinct(const Api* api, const ffi::AnyBuffer& in, void* out, cudaStream_t stream) {
  if (in.untyped_data() != out)
    api->cudaMemcpyAsync(out, in.untyped_data(), in.size_bytes(), cuda::cudaMemcpyDefault,
                         stream);
}

ffi::Error PotrsCudaImpl(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                         ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Buffer<ffi::S32> position,
                         ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::AnyBuffer> x,
                         ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                         ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Problem p;
  std::string error;
  auto bdims = b.dimensions();
  if (bdims.size() != 2 || b.element_type() != a.element_type() ||
      (a.dimensions().size() == 2 && bdims[1] != a.dimensions()[1]))
    error = "jaxmg_potrs: b must be [nrhs, N] with A's dtype";
  else
    p.nrhs = bdims[0];
  Slot slot;
  slot.ptr = {a_out->untyped_data(), x->untyped_data(), status->typed_data()};
  void* a_dst = a_out->untyped_data();
  void* x_dst = x->untyped_data();
  return Participate(Op::kPotrs, "jaxmg_potrs", stream, ordinal, scratch, position, a,
                     a.dimensions(), a.element_type(), tile, device_ids, call_id, p, error, slot,
                     false, [&](const Api* api) {
                       CopyIfDistinct(api, a, a_dst, stream);
                       CopyIfDistinct(api, b, x_dst, stream);
                     });
}

ffi::Error PotriCudaImpl(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                         ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                         ffi::Result<ffi::AnyBuffer> a_out,
                         ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                         ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Slot slot;
  slot.ptr = {a_out->untyped_data(), status->typed_data()};
  void* a_dst = a_out->untyped_data();
  return Participate(Op::kPotri, "jaxmg_potri", stream, ordinal, scratch, position, a,
                     a.dimensions(), a.element_type(), tile, device_ids, call_id, Problem{}, "",
                     slot, false,
                     [&](const Api* api) { CopyIfDistinct(api, a, a_dst, stream); });
}

ffi::Error SyevdCudaImpl(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                         ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                         ffi::Result<ffi::AnyBuffer> v, ffi::Result<ffi::AnyBuffer> w,
                         ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                         ffi::Span<const int64_t> device_ids, int64_t call_id, bool vectors) {
  std::string error;
  auto dtype = DtypeOf(a.element_type());
  if (a.dimensions().size() == 2 && dtype &&
      (w->element_count() != static_cast<size_t>(a.dimensions()[1]) ||
       w->element_type() != RealTypeOf(*dtype)))
    error = "jaxmg_syevd: w must be [N] of A's real dtype";
  Slot slot;
  slot.ptr = {v->untyped_data(), w->untyped_data(), status->typed_data()};
  void* v_dst = v->untyped_data();
  return Participate(Op::kSyevd, "jaxmg_syevd", stream, ordinal, scratch, position, a,
                     a.dimensions(), a.element_type(), tile, device_ids, call_id, Problem{},
                     error, slot, vectors,
                     [&](const Api* api) { CopyIfDistinct(api, a, v_dst, stream); });
}

}  // namespace
}  // namespace jaxmg

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotrsCuda, jaxmg::PotrsCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<ffi::AnyBuffer>()              // b [nrhs, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()       // position
                                  .Ret<ffi::AnyBuffer>()              // factor (a)
                                  .Ret<ffi::AnyBuffer>()              // x (b)
                                  .Ret<ffi::Buffer<ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotriCuda, jaxmg::PotriCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()       // position
                                  .Ret<ffi::AnyBuffer>()              // inverse (a)
                                  .Ret<ffi::Buffer<ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgSyevdCuda, jaxmg::SyevdCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<ffi::AnyBuffer>()              // a [L, N]
                                  .Arg<ffi::Buffer<ffi::S32>>()       // position
                                  .Ret<ffi::AnyBuffer>()              // vectors (a)
                                  .Ret<ffi::AnyBuffer>()              // w [N]
                                  .Ret<ffi::Buffer<ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<bool>("vectors"));
