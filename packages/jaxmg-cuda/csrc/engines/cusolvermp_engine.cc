// Backend "mp"'s GPU engine, what its files share (cusolvermp_engine.h): loading cuSOLVERMp and
// NCCL, and the process's communicators, handle and grids.
#include "engines/cusolvermp_engine.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace jaxmg::cusolvermp {
namespace {

std::atomic<int> loaded_version{0};

// One NCCL communicator per unique id, one cuSOLVERMp handle per GPU, one grid per
// communicator and shape.
struct State {
  std::map<std::string, cuda::ncclComm_t> comms;
  std::map<int, cuda::cusolverMpHandle_t> handles;
  std::map<std::tuple<cuda::ncclComm_t, int64_t, int64_t>, cuda::cusolverMpGrid_t> grids;
};
State& TheState() {
  static auto* state = new State();
  return *state;
}

}  // namespace

std::string VersionName(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 100) + "." +
         std::to_string(version % 100);
}

int LoadedVersion() { return loaded_version; }

std::mutex& StateMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::mutex load_mu;

const Libraries* Load(std::string* error) {
  std::lock_guard<std::mutex> lock(load_mu);
  static Libraries* libs = nullptr;
  static std::string failure;
  if (libs != nullptr) return libs;
  if (!failure.empty()) {
    *error = failure;
    return nullptr;
  }
  auto loaded = std::make_unique<Libraries>();
  loaded->rt = cuda::Load(&failure);
  if (loaded->rt == nullptr) {
    *error = failure;
    return nullptr;
  }
  // The handles stay open for the life of the process.
  cuda::OpenFailures tried;
  void* nccl = cuda::OpenLibrary(cuda::kNcclLibrary, &tried);
  void* solver = cuda::OpenLibrary(cuda::kCusolverMpLibrary, &tried);
  if (nccl == nullptr || solver == nullptr) {
    // Found but not loadable is a version mismatch far more often than a missing file
    // (docs/gpu.md has the table of what loads with which NCCL).
    failure =
        "jaxmg: backend 'mp' on GPUs needs NCCL (libnccl.so.2) and cuSOLVERMp "
        "(libcusolverMp.so.0, with cuBLASMp)" +
        std::string(tried.unloadable.empty() ? ", which were not found."
                                             : ", which were found but could not all be "
                                               "loaded.") +
        cuda::DescribeFailures(tried);
    if (!tried.unloadable.empty())
      failure +=
          "\nThe versions must match. cuSOLVERMp 0.9.x loads cuBLASMp (0.9.1 needs cuBLASMp "
          "0.10), and every cuBLASMp from 0.8 needs NCCL >= 2.29.2: with an older NCCL it fails "
          "on an undefined symbol of libnccl.so.2 (ncclCommQueryProperties, ncclPutSignal, "
          "ncclWaitSignal). cuSOLVERMp 0.8.0 needs no cuBLASMp and runs with NCCL 2.28 "
          "(pip install --no-deps 'nvidia-cusolvermp-cu13==0.8.0.*', or -cu12); or upgrade "
          "NCCL (pip install 'nvidia-nccl-cu13>=2.29.2', or -cu12). Each library needs the CUDA "
          "major it was built for; LD_LIBRARY_PATH picks among installed ones.";
    else
      failure +=
          "\nInstall NVIDIA's wheels (pip install nvidia-cusolvermp-cu12 nvidia-nccl-cu12, or "
          "the -cu13 pair) or add their folders to LD_LIBRARY_PATH.";
    *error = failure;
    return nullptr;
  }
  std::string missing;
#define JAXMG_BIND_NCCL(ret, name, params) cuda::Bind(nccl, #name, loaded->mp.name, &missing);
#define JAXMG_BIND_MP(ret, name, params) cuda::Bind(solver, #name, loaded->mp.name, &missing);
  JAXMG_NCCL_FUNCTIONS(JAXMG_BIND_NCCL)
  JAXMG_CUSOLVERMP_FUNCTIONS(JAXMG_BIND_MP)
  std::string later;  // what releases before kCusolverMpGesvdSince lack: not an error
#define JAXMG_BIND_LATER(ret, name, params) cuda::Bind(solver, #name, loaded->mp.name, &later);
  JAXMG_CUSOLVERMP_GESVD_FUNCTIONS(JAXMG_BIND_LATER)
#undef JAXMG_BIND_NCCL
#undef JAXMG_BIND_MP
#undef JAXMG_BIND_LATER
  loaded->gesvd = later.empty();
  if (!missing.empty()) {
    failure = "jaxmg: the loaded NCCL and cuSOLVERMp lack symbols jaxmg needs:" + missing +
              "\njaxmg binds cuSOLVERMp " + VersionName(cuda::kCusolverMpOldest) +
              " to 0.9.1 (0.7.x lacks cusolverMpSetStream) and NCCL 2.x.";
    *error = failure;
    return nullptr;
  }
  libs = loaded.release();
  return libs;
}

Outcome Connect(const Libraries* libs, const std::string& nccl_id, int64_t rows, int64_t cols,
                int32_t position, int32_t ordinal, cudaStream_t stream, Connection* out) {
  State& s = TheState();
  cuda::ncclComm_t& comm = s.comms[nccl_id];
  if (comm == nullptr) {
    cuda::ncclUniqueId id;
    std::memcpy(id.internal, nccl_id.data(), sizeof(id.internal));
    const int count = static_cast<int>(rows * cols);
    const cuda::ncclResult_t made = libs->mp.ncclCommInitRank(&comm, count, id, position);
    if (made != cuda::ncclSuccess) {
      comm = nullptr;
      s.comms.erase(nccl_id);
      return Outcome::Fail(std::string("ncclCommInitRank failed: ") +
                           libs->mp.ncclGetErrorString(made));
    }
  }
  out->comm = comm;
  cuda::cusolverMpHandle_t& handle = s.handles[ordinal];
  if (handle == nullptr) {
    const int made = libs->mp.cusolverMpCreate(&handle, ordinal, stream);
    if (made != 0) {
      handle = nullptr;
      s.handles.erase(ordinal);
      return Outcome::Fail(std::string("cusolverMpCreate failed: ") + CusolverStatusName(made));
    }
    int version = 0;
    JAXMG_CUSOLVERMP(libs, cusolverMpGetVersion(handle, &version));
    loaded_version = version;
  }
  out->handle = handle;
  if (loaded_version < cuda::kCusolverMpOldest)
    return Outcome::Fail("the loaded cuSOLVERMp is " + VersionName(loaded_version) +
                         "; jaxmg binds " + VersionName(cuda::kCusolverMpOldest) + " to 0.9.1");
  JAXMG_CUSOLVERMP(libs, cusolverMpSetStream(handle, stream));
  cuda::cusolverMpGrid_t& grid = s.grids[{comm, rows, cols}];
  if (grid == nullptr) {
    const int made = libs->mp.cusolverMpCreateDeviceGrid(
        handle, &grid, comm, static_cast<int32_t>(rows), static_cast<int32_t>(cols),
        cuda::CUSOLVERMP_GRID_MAPPING_ROW_MAJOR);
    if (made != 0) {
      s.grids.erase({comm, rows, cols});
      return Outcome::Fail(std::string("cusolverMpCreateDeviceGrid failed: ") +
                           CusolverStatusName(made));
    }
  }
  out->grid = grid;
  return {};
}

Outcome CallMemory::Allocate(size_t bytes, void** out) {
  std::optional<void*> memory = scratch_(std::max<size_t>(bytes, 1));
  if (!memory.has_value())
    return Outcome::Fail("XLA's scratch allocator could not provide " + std::to_string(bytes) +
                         " bytes on GPU " + std::to_string(ordinal_));
  *out = *memory;
  return {};
}

Outcome CallMemory::Info(int** out) {
  if (info_ == nullptr) {
    void* memory = nullptr;
    if (Outcome r = Allocate(sizeof(int), &memory); !r.ok) return r;
    info_ = static_cast<int*>(memory);
  }
  JAXMG_CUDART(rt_, cudaMemsetAsync(info_, 0, sizeof(int), stream_));
  *out = info_;
  return {};
}

Outcome CallMemory::ReadInfo(int* info) {
  JAXMG_CUDART(rt_,
               cudaMemcpyAsync(info, info_, sizeof(int), cuda::cudaMemcpyDeviceToHost, stream_));
  JAXMG_CUDART(rt_, cudaStreamSynchronize(stream_));
  return {};
}

Outcome Begin(ffi::Span<const int64_t> nccl_id, const Libraries** libs, std::string* id) {
  std::string error;
  *libs = Load(&error);
  if (*libs == nullptr) return Outcome::Fail(error);
  if (nccl_id.size() * sizeof(int64_t) != cuda::kNcclUniqueIdBytes)
    return Outcome::Fail("nccl_id must be the 128 bytes of an NCCL unique id as 16 int64, got " +
                         std::to_string(nccl_id.size()));
  id->assign(reinterpret_cast<const char*>(nccl_id.begin()), cuda::kNcclUniqueIdBytes);
  return {};
}

Outcome Finish(const Libraries* libs, int info,
               const std::vector<std::pair<void*, size_t>>& outputs, int32_t* status_out,
               cudaStream_t stream) {
  if (info < 0)
    return Outcome::Fail("cuSOLVERMp reported illegal argument " + std::to_string(-info));
  const Api* rt = libs->rt;
  int failed = 0;
  if (info != 0)
    for (const auto& [data, bytes] : outputs)
      failed |= rt->cudaMemsetAsync(data, 0xFF, bytes, stream);
  const int32_t status = info;
  failed |= rt->cudaMemcpyAsync(status_out, &status, sizeof(status), cuda::cudaMemcpyHostToDevice,
                                stream);
  failed |= rt->cudaStreamSynchronize(stream);  // `status` goes out of scope
  if (failed != 0)
    return Outcome::Fail(std::string("writing the outputs failed: ") +
                         rt->cudaGetErrorString(rt->cudaGetLastError()));
  return {};
}

Outcome ReadPosition(const Api* rt, const int32_t* position, size_t count, cudaStream_t stream,
                     int32_t* out) {
  *out = -1;
  if (position == nullptr || count != 1)
    return Outcome::Fail("position must be an int32 scalar (the flat grid position)");
  JAXMG_CUDART(rt,
               cudaMemcpyAsync(out, position, sizeof(*out), cuda::cudaMemcpyDeviceToHost, stream));
  JAXMG_CUDART(rt, cudaStreamSynchronize(stream));
  return {};
}

Outcome SumOverGrid(const Libraries* libs, void* data, size_t bytes, Dtype dtype,
                    cuda::ncclComm_t comm, cudaStream_t stream) {
  const size_t real = RealElementSize(dtype);
  const auto type = real == 4 ? cuda::ncclFloat32 : cuda::ncclFloat64;
  JAXMG_NCCL(libs, ncclAllReduce(data, data, bytes / real, type, cuda::ncclSum, comm, stream));
  return {};
}

}  // namespace jaxmg::cusolvermp

namespace jaxmg {

int CusolverMpVersion() { return cusolvermp::LoadedVersion(); }

bool CusolverMpHasGesvd(std::string* error) {
  const cusolvermp::Libraries* libs = cusolvermp::Load(error);
  return libs != nullptr && libs->gesvd;
}

bool NcclUniqueId(std::string* id, std::string* error) {
  const cusolvermp::Libraries* libs = cusolvermp::Load(error);
  if (libs == nullptr) return false;
  cuda::ncclUniqueId unique;
  const cuda::ncclResult_t made = libs->mp.ncclGetUniqueId(&unique);
  if (made != cuda::ncclSuccess) {
    *error = std::string("ncclGetUniqueId failed: ") + libs->mp.ncclGetErrorString(made);
    return false;
  }
  id->assign(unique.internal, sizeof(unique.internal));
  return true;
}

}  // namespace jaxmg
