// Loading the CUDA runtime and cuSolverMg with dlopen at first GPU use (cuda_api.h), and
// what their status codes mean.
#include "vendor/cuda_api.h"

#include <dlfcn.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "vendor/loader.h"

namespace jaxmg {
namespace cuda {
namespace {

std::mutex load_mu;
std::vector<std::string>* library_dirs = new std::vector<std::string>();

// One library by soname: the first of the candidate folders, else the loader's own search path.
// A file that is there but does not load is reported with the loader's reason, apart from the
// libraries not found at all.
void* Open(const std::string& name, OpenFailures* failures) {
  bool found = false;
  for (const std::string& dir : *library_dirs) {
    const std::string path = dir + "/" + name;
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
    const char* why = dlerror();
    if (access(path.c_str(), F_OK) == 0) {
      found = true;
      failures->unloadable += "\n  " + path + ": " + (why != nullptr ? why : "?");
    }
  }
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  const char* why = dlerror();
  const std::string reason = why != nullptr ? why : "not found";
  // The loader names the library itself when it finds no file for it; any other reason (a
  // dependency, an undefined symbol) is about a file it found.
  if (why != nullptr && reason.rfind(name + ": cannot open shared object file", 0) != 0)
    failures->unloadable += "\n  " + name + " (on the loader's path): " + reason;
  else if (!found)
    failures->not_found += "\n  " + name + ": " + reason;
  return nullptr;
}

// A loading error: what was found but could not be loaded (with the loader's reasons), then
// what was not found.
std::string Describe(const OpenFailures& f) {
  std::string out;
  if (!f.unloadable.empty())
    out += "\nFound, but the dynamic loader could not load them:" + f.unloadable;
  if (!f.not_found.empty()) out += "\nNot found:" + f.not_found;
  return out;
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
  OpenFailures tried;
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
             ") could not be opened." + Describe(tried) + "\nInstall it (pip install " + v.wheels +
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
  *error =
      "jaxmg: could not load the CUDA runtime and cuSolverMg (CUDA 13: libcudart.so.13 + "
      "libcusolverMg.so.12; CUDA 12: libcudart.so.12 + libcusolverMg.so.11). Looked in" +
      dirs + " and on the loader's path." + Describe(tried) +
      "\nInstall NVIDIA's wheels (e.g. pip install nvidia-cusolver-cu12 "
      "nvidia-cuda-runtime-cu12, or the CUDA 13 set) or add the folder to LD_LIBRARY_PATH.";
  return false;
}

}  // namespace

void* OpenLibrary(const std::string& name, OpenFailures* failures) {
  std::lock_guard<std::mutex> lock(load_mu);
  return Open(name, failures);
}

std::string DescribeFailures(const OpenFailures& failures) { return Describe(failures); }

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
#define JAXMG_BIND_RT(ret, name, params) Bind(rt, #name, table->name, &missing);
#define JAXMG_BIND_MG(ret, name, params) Bind(mg, #name, table->name, &missing);
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
  OpenFailures unused;
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

std::string VendorMessage(const cuda::Api* api, Library lib, int status) {
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

}  // namespace jaxmg
