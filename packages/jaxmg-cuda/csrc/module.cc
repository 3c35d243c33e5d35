// Python bindings: handler capsules for jax.ffi.register_ffi_target, LAPACK registration,
// and small introspection hooks for the tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cpu_twin.h"
#include "rendezvous.h"
#ifdef JAXMG_WITH_CUDA
#include "cuda_targets.h"
#endif

namespace py = pybind11;

namespace {

template <typename Fn>
py::capsule Capsule(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

PYBIND11_MODULE(_jaxmg_cuda, m) {
  m.doc() = "jaxmg native targets: cuSolverMg (CUDA) and its LAPACK twin (CPU)";
  m.def("cpu_targets", [] {
    py::dict d;
    d["jaxmg_potrs"] = Capsule(JaxmgPotrsCpu);
    d["jaxmg_potri"] = Capsule(JaxmgPotriCpu);
    d["jaxmg_syevd"] = Capsule(JaxmgSyevdCpu);
    d["jaxmg_probe"] = Capsule(JaxmgProbeCpu);
    return d;
  });
  m.def("cuda_targets", [] {
    py::dict d;
#ifdef JAXMG_WITH_CUDA
    d["jaxmg_potrs"] = Capsule(JaxmgPotrsCuda);
    d["jaxmg_potri"] = Capsule(JaxmgPotriCuda);
    d["jaxmg_syevd"] = Capsule(JaxmgSyevdCuda);
#endif
    return d;
  });
  m.def("has_cuda", [] {
#ifdef JAXMG_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def(
      "register_lapack",
      [](const std::string& name, py::capsule fn) { jaxmg::RegisterLapack(name, fn.get_pointer()); },
      py::arg("name"), py::arg("capsule"));
  m.def(
      "set_cuda_library_dirs",
      [](const std::vector<std::string>& dirs) {
#ifdef JAXMG_WITH_CUDA
        jaxmg::SetCudaLibraryDirs(dirs);
#else
        (void)dirs;
#endif
      },
      py::arg("dirs"));
  m.def(
      "load_cuda_libraries",
      [] {
#ifdef JAXMG_WITH_CUDA
        std::string error;
        return jaxmg::LoadCudaLibraries(&error) ? std::string() : error;
#else
        return std::string("jaxmg_cuda was built without CUDA support");
#endif
      },
      "Open the CUDA runtime and cuSolverMg now (normally done at the first GPU call); "
      "returns '' on success, else why not.");
  m.def(
      "probe_repeated_gpu",
      [](int device) {
#ifdef JAXMG_WITH_CUDA
        py::gil_scoped_release release;
        return jaxmg::ProbeRepeatedGpu(device);
#else
        (void)device;
        return std::string("jaxmg_cuda was built without CUDA support");
#endif
      },
      py::arg("device") = 0,
      "What cuSolverMg does with a device list that names one GPU twice: a report line. For "
      "the GPU validation run; not yet run on GPU hardware.");
  m.def("open_meetings", [] { return jaxmg::Registry::Get().open_meetings(); },
        "Calls waiting for participants right now (0 between calls).");
}
