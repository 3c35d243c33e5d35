// The test entry point of the CUDA path (cuda_testing.h): the handler's body on host arrays
// (RunCudaOnHost).
#include "testing/cuda_testing.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/common.h"
#include "engines/cuda_internal.h"
#include "engines/cusolvermg.h"
#include "engines/cusolvermp.h"
#include "meeting/protocol.h"
#include "platforms/cuda_targets.h"

namespace jaxmg {
namespace {

// The routine named `op` (base/routines.h, Routine::name): "potrs", "potrs_factored", "getrs", ...
const Routine* RoutineNamed(const std::string& op) {
  for (const Routine& r : Routines())
    if (op == r.name) return &r;
  return nullptr;
}

}  // namespace

namespace {

// --- RunCudaOnHost (cuda_testing.h): the handler's body on host arrays, for tests -----------

// The dtypes a test names, as XLA's and jaxmg's types.
const std::map<std::string, std::pair<ffi::DataType, Dtype>>& HostTypes() {
  static const auto* types = new std::map<std::string, std::pair<ffi::DataType, Dtype>>{
      {"float32", {ffi::DataType::F32, Dtype::kF32}},
      {"float64", {ffi::DataType::F64, Dtype::kF64}},
      {"complex64", {ffi::DataType::C64, Dtype::kC64}},
      {"complex128", {ffi::DataType::C128, Dtype::kC128}}};
  return *types;
}

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
  // Scratch memory on this GPU, freed with the position: the handler's ScratchAllocator, with
  // XLA's contract (XLA_FFI_DeviceMemory_Allocate, xla/ffi/ffi_api.cc): an alignment that is
  // not a power of two or exceeds 16 (its kMaxAlignment) is refused, as XLA refused jaxmg's 256
  // on the first H100 run. What it returns is 16-aligned and deliberately never 32-aligned
  // (16 bytes past cudaMalloc's base), so nothing can rely on more than was asked.
  std::optional<void*> XlaAllocate(size_t bytes, size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kXlaMaxAlignment)
      return std::nullopt;
    DeviceGuard guard(api_);
    void* m = nullptr;
    if (api_->cudaSetDevice(ordinal_) != cuda::cudaSuccess ||
        api_->cudaMalloc(&m, bytes + kXlaMaxAlignment) != cuda::cudaSuccess)
      return std::nullopt;
    scratch_.push_back(m);
    return static_cast<char*>(m) + kXlaMaxAlignment;
  }
  ScratchFn Scratch() {
    return AlignedScratch(
        [this](size_t bytes, size_t alignment) { return XlaAllocate(bytes, alignment); });
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

// What runs a position's staged operands: the handler's body, on the position's stream.
using HandlerBody = std::function<ffi::Error(const Operands&, StagedPosition&, int ordinal)>;

// Position i of `c` (mesh position c.positions[i]) on its own thread; fills result slot i.
void RunPositionOnHost(const Api* api, const HostCall& c, ffi::DataType type, Dtype dtype, size_t i,
                       HostResult* out, const HandlerBody& body) {
  const int position = c.positions[i];
  const int ordinal = static_cast<int>(c.device_ids[c.grid.empty() ? position : 0]);
  const size_t esize = ElementSize(dtype);
  const Routine& routine = *RoutineNamed(c.op);
  const bool rhs = routine.rhs, syevd = routine.eigenvalues;
  const int64_t width = c.lld > 0 ? c.lld : c.n;  // a's second dimension
  const size_t a_bytes = static_cast<size_t>(c.local * width) * esize;
  const size_t b_bytes = rhs ? static_cast<size_t>(c.nrhs * c.n) * esize : 0;
  const size_t w_bytes = syevd ? static_cast<size_t>(c.n) * RealElementSize(dtype) : 0;
  const size_t pivots = static_cast<size_t>(c.ipiv_len > 0 ? c.ipiv_len : c.local);
  const size_t ipiv_bytes = routine.pivots != Pivots::kNone ? pivots * sizeof(int32_t) : 0;

  StagedPosition staged(api, ordinal);
  const size_t a_in = staged.Reserve(a_bytes), a_out = c.aliased ? a_in : staged.Reserve(a_bytes);
  const size_t b_in = staged.Reserve(b_bytes), x_out = c.aliased ? b_in : staged.Reserve(b_bytes);
  const size_t w_out = staged.Reserve(w_bytes);
  const size_t ipiv_at = staged.Reserve(ipiv_bytes);
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
    if (rhs) {
      if (Outcome o = up(b_in, c.b[i].data(), b_bytes); !o.ok) return o;
    }
    if (routine.pivots == Pivots::kIn) {
      if (Outcome o = up(ipiv_at, c.ipiv[i].data(), ipiv_bytes); !o.ok) return o;
    }
    if (Outcome o = up(pos_at, &position32, sizeof(position32)); !o.ok) return o;
    return up(status_at, &unset, sizeof(unset));
  }();
  if (!staging.ok) {  // the other positions fail at their deadline
    out->errors[i] = "staging mesh position " + std::to_string(position) + ": " + staging.message;
    return;
  }

  int64_t a_dims[2] = {c.local, width}, b_dims[2] = {c.nrhs, c.n}, w_dims[1] = {c.n};
  XLA_FFI_Buffer a_buffer{XLA_FFI_Buffer_STRUCT_SIZE,
                          nullptr,
                          static_cast<XLA_FFI_DataType>(type),
                          staged.at(a_in),
                          2,
                          a_dims};
  XLA_FFI_Buffer b_buffer{XLA_FFI_Buffer_STRUCT_SIZE,
                          nullptr,
                          static_cast<XLA_FFI_DataType>(type),
                          staged.at(b_in),
                          2,
                          b_dims};
  ffi::AnyBuffer a(&a_buffer), b(&b_buffer);
  Operands o;
  o.routine = &routine;
  o.target = routine.target.c_str();
  o.a = &a;
  o.a_out = routine.result == Result::kUnchanged ? staged.at(a_in) : staged.at(a_out);
  o.position = reinterpret_cast<const int32_t*>(staged.at(pos_at));
  o.position_count = 1;
  o.status_out = reinterpret_cast<int32_t*>(staged.at(status_at));
  o.status_count = 1;
  o.tile = c.tile;
  o.device_ids = ffi::Span<const int64_t>(c.device_ids);
  o.call_id = c.call_id;
  if (routine.pivots != Pivots::kNone) {
    o.ipiv = reinterpret_cast<int32_t*>(staged.at(ipiv_at));
    o.ipiv_count = pivots;
  }
  o.trans = c.trans;
  if (rhs) {
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

  ffi::Error e = body(o, staged, ordinal);
  if (e.failure()) out->errors[i] = e.message();

  Outcome back = [&]() -> Outcome {
    JAXMG_CUDART(api, cudaStreamSynchronize(staged.stream()));
    if (Outcome r = Download(api, staged.at(a_out), a_bytes, &out->a[i]); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(x_out), b_bytes, &out->x[i]); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(w_out), w_bytes, &out->w[i]); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(ipiv_at), ipiv_bytes, &out->ipiv[i]); !r.ok) return r;
    JAXMG_CUDART(api, cudaMemcpy(&out->status[i], staged.at(status_at), sizeof(int32_t),
                                 cuda::cudaMemcpyDeviceToHost));
    return {};
  }();
  if (!back.ok && out->errors[i].empty()) out->errors[i] = back.message;
}

}  // namespace

bool RunCudaOnHost(const HostCall& c, HostResult* out, std::string* error) {
  const auto& kTypes = HostTypes();
  const auto type = kTypes.find(c.dtype);
  const size_t count = c.positions.size();
  const size_t esize = type != kTypes.end() ? ElementSize(type->second.second) : 0;
  std::ostringstream bad;
  const Routine* routine = RoutineNamed(c.op);
  if (routine == nullptr)
    bad << "op must name a routine (potrs, potri, syevd, potrf, potrs_factored, "
           "potri_factored, getrf, getrs)";
  else if (type == kTypes.end())
    bad << "dtype must be float32, float64, complex64 or complex128";
  else if (c.a.size() != count || (routine->rhs && c.b.size() != count) ||
           (routine->pivots == Pivots::kIn && c.ipiv.size() != count))
    bad << "one a (and b, pivots where the routine takes them) per position run";
  const int64_t width = c.lld > 0 ? c.lld : c.n;
  const size_t pivots = static_cast<size_t>(c.ipiv_len > 0 ? c.ipiv_len : c.local);
  if (bad.str().empty() && !c.grid.empty() &&
      (c.grid.size() != 2 || count != 1 || c.nccl_id.size() != 16 || c.device_ids.size() != 1))
    bad << "with a grid (cuSOLVERMp): grid (rows, cols), one position (this process's), its one "
           "device id and the NCCL id as 16 int64";
  for (size_t i = 0; bad.str().empty() && i < count; ++i) {
    const int64_t span =
        c.grid.empty() ? static_cast<int64_t>(c.device_ids.size()) : c.grid[0] * c.grid[1];
    if (c.positions[i] < 0 || c.positions[i] >= span)
      bad << "position " << c.positions[i] << " is not on the mesh axis or grid";
    else if (c.a[i].size() != static_cast<size_t>(c.local * width) * esize)
      bad << "a[" << i << "] must hold " << c.local << " x " << width << " elements";
    else if (routine->pivots == Pivots::kIn && c.ipiv[i].size() != pivots * sizeof(int32_t))
      bad << "ipiv[" << i << "] must hold " << pivots << " int32";
    else if (routine->rhs && c.b[i].size() != static_cast<size_t>(c.nrhs * c.n) * esize)
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
  out->ipiv.assign(count, {});
  out->status.assign(count, -1);
  out->errors.assign(count, {});
  HandlerBody body;
  if (c.grid.empty()) {  // cuSolverMg: the protocol, with the leader's library
    body = [api](const Operands& o, StagedPosition& staged, int ordinal) {
      std::unique_ptr<Device> device =
          MakeCudaDevice(api, "", staged.stream(), ordinal, staged.Scratch());
      std::unique_ptr<Backend> backend = MakeCudaBackend(api);
      return Participate(o, *device, *backend, kMaxCudaDevices);
    };
  } else {  // cuSOLVERMp: this process's one position
    MpGrid grid{c.n, c.grid[0], c.grid[1]};
    body = [grid, &c](const Operands& o, StagedPosition& staged, int ordinal) {
      return RunOnCusolverMp(o, grid, ffi::Span<const int64_t>(c.nccl_id), staged.stream(), ordinal,
                             staged.Scratch());
    };
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < count; ++i)
    threads.emplace_back(RunPositionOnHost, api, std::cref(c), type->second.first,
                         type->second.second, i, out, std::cref(body));
  for (std::thread& t : threads) t.join();
  return true;
}

bool RunRectCudaOnHost(const HostRectCall& c, HostRectResult* out, std::string* error) {
  const auto& kTypes = HostTypes();
  const auto type = kTypes.find(c.dtype);
  const bool gels = c.op == "gels";
  std::ostringstream bad;
  if (c.op != "qr" && !gels)
    bad << "op must be qr or gels";
  else if (type == kTypes.end())
    bad << "dtype must be float32, float64, complex64 or complex128";
  else if (c.grid.size() != 2 || c.nccl_id.size() != 16 || c.m < 1 || c.n < 1)
    bad << "grid (rows, cols), M, N >= 1 and the NCCL id as 16 int64";
  const size_t esize = type != kTypes.end() ? ElementSize(type->second.second) : 0;
  if (bad.str().empty() && c.a.size() != static_cast<size_t>(c.local_cols * c.lld) * esize)
    bad << "a must hold local_cols x lld elements";
  if (bad.str().empty() && gels && c.b.size() != static_cast<size_t>(c.m * c.nrhs) * esize)
    bad << "b must hold M x nrhs elements";
  if (!bad.str().empty()) {
    *error = "RunRectCudaOnHost: " + bad.str();
    return false;
  }
  const Api* api = cuda::Load(error);
  if (api == nullptr) return false;
  RectOperands o;
  o.m = c.m;
  o.n = c.n;
  o.rows = c.grid[0];
  o.cols = c.grid[1];
  o.tile = c.tile;
  o.blocks = c.blocks;
  const int64_t k = std::min(c.m, c.n);
  const std::vector<int64_t> out0_dims =
      gels ? std::vector<int64_t>{c.n, c.nrhs} : CusolverMpResultDims(o, c.m, k);
  const std::vector<int64_t> out1_dims =
      gels ? std::vector<int64_t>{0, 0} : CusolverMpResultDims(o, k, c.n);
  const size_t out0_bytes = static_cast<size_t>(out0_dims[0] * out0_dims[1]) * esize;
  const size_t out1_bytes = static_cast<size_t>(out1_dims[0] * out1_dims[1]) * esize;
  StagedPosition staged(api, static_cast<int>(c.device_id));
  const size_t a_at = staged.Reserve(c.a.size()), b_at = staged.Reserve(c.b.size());
  const size_t out0_at = staged.Reserve(out0_bytes), out1_at = staged.Reserve(out1_bytes);
  const size_t pos_at = staged.Reserve(sizeof(int32_t)), status_at = staged.Reserve(4);
  const int32_t position32 = c.position;
  Outcome staging = [&]() -> Outcome {
    if (Outcome o = staged.Allocate(); !o.ok) return o;
    auto up = [&](size_t offset, const void* host, size_t bytes) -> Outcome {
      if (bytes > 0)
        JAXMG_CUDART(api, cudaMemcpy(staged.at(offset), host, bytes, cuda::cudaMemcpyHostToDevice));
      return {};
    };
    if (Outcome o = up(a_at, c.a.data(), c.a.size()); !o.ok) return o;
    if (Outcome o = up(b_at, c.b.data(), c.b.size()); !o.ok) return o;
    return up(pos_at, &position32, sizeof(position32));
  }();
  if (!staging.ok) {
    *error = "RunRectCudaOnHost: staging: " + staging.message;
    return false;
  }
  int64_t a_dims[2] = {c.local_cols, c.lld}, b_dims[2] = {c.m, c.nrhs};
  const auto xla_type = static_cast<XLA_FFI_DataType>(type->second.first);
  XLA_FFI_Buffer a_buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, xla_type, staged.at(a_at), 2,
                          a_dims};
  XLA_FFI_Buffer b_buffer{XLA_FFI_Buffer_STRUCT_SIZE, nullptr, xla_type, staged.at(b_at), 2,
                          b_dims};
  ffi::AnyBuffer a(&a_buffer), b(&b_buffer);
  o.op = gels ? RectOp::kGels : RectOp::kQr;
  o.target = gels ? "jaxmg_mp_gels" : "jaxmg_mp_qr";
  o.a = &a;
  if (gels) o.b = &b;
  o.position = reinterpret_cast<const int32_t*>(staged.at(pos_at));
  o.position_count = 1;
  o.out0 = staged.at(out0_at);
  o.out0_dims = ffi::AnyBuffer::Dimensions(out0_dims.data(), out0_dims.size());
  o.out1 = staged.at(out1_at);
  o.out1_dims = ffi::AnyBuffer::Dimensions(out1_dims.data(), out1_dims.size());
  o.status = reinterpret_cast<int32_t*>(staged.at(status_at));
  ffi::Error e = RunRectOnCusolverMp(o, ffi::Span<const int64_t>(c.nccl_id), staged.stream(),
                                     static_cast<int32_t>(c.device_id), staged.Scratch());
  if (e.failure()) out->error = e.message();
  Outcome back = [&]() -> Outcome {
    JAXMG_CUDART(api, cudaStreamSynchronize(staged.stream()));
    if (Outcome r = Download(api, staged.at(out0_at), out0_bytes, &out->out0); !r.ok) return r;
    if (Outcome r = Download(api, staged.at(out1_at), out1_bytes, &out->out1); !r.ok) return r;
    JAXMG_CUDART(api, cudaMemcpy(&out->status, staged.at(status_at), sizeof(int32_t),
                                 cuda::cudaMemcpyDeviceToHost));
    return {};
  }();
  if (!back.ok && out->error.empty()) out->error = back.message;
  return true;
}

}  // namespace jaxmg
