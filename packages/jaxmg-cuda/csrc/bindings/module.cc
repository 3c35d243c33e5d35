// Python bindings: handler capsules for jax.ffi.register_ffi_target, LAPACK registration,
// and small introspection hooks for the tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include "base/common.h"
#include "engines/lapack_twin.h"
#include "engines/scalapack.h"
#include "ffi/handlers.h"
#include "ffi/instance.h"
#include "meeting/crossprocess.h"
#include "meeting/rendezvous.h"
#include "testing/probe.h"
#ifdef JAXMG_WITH_CUDA
#include "engines/cusolvermp.h"
#include "platforms/cuda_targets.h"
#include "testing/cuda_testing.h"
#endif

namespace py = pybind11;

namespace {

template <typename Fn>
py::capsule Capsule(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

// jax.ffi.register_ffi_target's handler: a dict of each stage's capsule.
py::dict Stages(const jaxmg::Target& t) {
  py::dict d;
  if (t.instantiate != nullptr) d["instantiate"] = Capsule(t.instantiate);
  d["execute"] = Capsule(t.execute);
  return d;
}

py::dict TargetDict(const std::vector<jaxmg::Target>& targets) {
  py::dict d;
  for (const jaxmg::Target& t : targets) d[t.name.c_str()] = Stages(t);
  return d;
}

// jax.ffi.register_ffi_type's registration of a state type.
template <typename T>
py::dict TypeRegistration() {
  static XLA_FFI_TypeInfo info = xla::ffi::MakeTypeInfo<T>();
  py::dict d;
  d["type_id"] = py::capsule(static_cast<void*>(&T::id));
  d["type_info"] = py::capsule(static_cast<void*>(&info));
  return d;
}

}  // namespace

PYBIND11_MODULE(_jaxmg_cuda, m) {
  m.doc() = "jaxmg native targets: cuSolverMg (CUDA) and its LAPACK twin (CPU)";
  m.def(
      "cpu_targets",
      [] {
        py::dict d = TargetDict(jaxmg::Targets(/*cuda=*/false));
        d["jaxmg_probe"] = Capsule(JaxmgProbeCpu);
        return d;
      },
      "The CPU twin's targets: name -> {stage: capsule} for jax.ffi.register_ffi_target.");
  m.def(
      "cuda_targets", [] { return TargetDict(jaxmg::Targets(/*cuda=*/true)); },
      "The cuSolverMg targets (none without CUDA), as cpu_targets.");
  m.def(
      "mp_targets", [](bool cuda) { return TargetDict(jaxmg::MpTargets(cuda)); },
      py::arg("cuda") = false,
      "Backend 'mp' targets: ScaLAPACK's (CPU) or cuSOLVERMp's (cuda=True; none without CUDA).");
  m.def(
      "state_types",
      [] {
        py::dict d;
        d["jaxmg.CpuInstance"] = TypeRegistration<jaxmg::CpuInstance>();
        return d;
      },
      "The CPU targets' state type (instance.h): name -> registration for "
      "jax.ffi.register_ffi_type on the CPU platform.");
  m.def(
      "scalapack_missing", [] { return jaxmg::ScalapackMissing(); },
      "'' when ScaLAPACK and BLACS are loaded in this process, else the missing symbols.");
  m.def(
      "mp_step_backs", [] { return jaxmg::ScalapackStepBacks(); },
      "How many times a backend 'mp' call of this process stepped back for a smaller one.");
  m.def("has_cuda", [] {
#ifdef JAXMG_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def(
      "register_lapack",
      [](const std::string& name, py::capsule fn) {
        jaxmg::RegisterLapack(name, fn.get_pointer());
      },
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
#ifdef JAXMG_WITH_CUDA
  m.def(
      "run_cuda_on_host",
      [](const std::string& op, const std::string& dtype, int64_t n, int64_t local, int64_t nrhs,
         int64_t tile, bool vectors, bool aliased, std::vector<int64_t> device_ids,
         std::vector<int> positions, const std::vector<py::bytes>& a,
         const std::vector<py::bytes>& b, int64_t call_id, int64_t job, std::vector<int64_t> pids,
         std::vector<int64_t> to_cyclic, std::vector<int64_t> from_cyclic,
         const std::vector<py::bytes>& ipiv, const std::string& trans, std::vector<int64_t> grid,
         int64_t lld, int64_t ipiv_len, std::vector<int64_t> nccl_id) {
        jaxmg::HostCall call;
        call.grid = std::move(grid);
        call.lld = lld;
        call.ipiv_len = ipiv_len;
        call.nccl_id = std::move(nccl_id);
        for (const py::bytes& x : ipiv) call.ipiv.push_back(x);
        if (trans.size() != 1) throw std::invalid_argument("trans must be 'N', 'T' or 'C'");
        call.trans = trans[0];
        call.op = op;
        call.dtype = dtype;
        call.n = n;
        call.local = local;
        call.nrhs = nrhs;
        call.tile = tile;
        call.vectors = vectors;
        call.aliased = aliased;
        call.device_ids = std::move(device_ids);
        call.positions = std::move(positions);
        for (const py::bytes& x : a) call.a.push_back(x);
        for (const py::bytes& x : b) call.b.push_back(x);
        call.call_id = call_id;
        call.job = job;
        call.pids = std::move(pids);
        call.to_cyclic = std::move(to_cyclic);
        call.from_cyclic = std::move(from_cyclic);
        jaxmg::HostResult result;
        std::string error;
        bool staged;
        {
          py::gil_scoped_release release;
          staged = jaxmg::RunCudaOnHost(call, &result, &error);
        }
        if (!staged) throw std::invalid_argument(error);
        auto as_bytes = [](const std::vector<std::string>& v) {
          py::list out;
          for (const std::string& x : v) out.append(py::bytes(x));
          return out;
        };
        py::dict d;
        d["a"] = as_bytes(result.a);
        d["x"] = as_bytes(result.x);
        d["w"] = as_bytes(result.w);
        d["ipiv"] = as_bytes(result.ipiv);
        d["status"] = result.status;
        d["errors"] = result.errors;
        return d;
      },
      py::arg("op"), py::arg("dtype"), py::arg("n"), py::arg("local"), py::arg("nrhs"),
      py::arg("tile"), py::arg("vectors"), py::arg("aliased"), py::arg("device_ids"),
      py::arg("positions"), py::arg("a"), py::arg("b"), py::arg("call_id"), py::arg("job"),
      py::arg("pids"), py::arg("to_cyclic") = std::vector<int64_t>{},
      py::arg("from_cyclic") = std::vector<int64_t>{}, py::arg("ipiv") = std::vector<py::bytes>{},
      py::arg("trans") = std::string("N"), py::arg("grid") = std::vector<int64_t>{},
      py::arg("lld") = 0, py::arg("ipiv_len") = 0, py::arg("nccl_id") = std::vector<int64_t>{},
      "Test hook: one call of the CUDA path outside XLA on host bytes (cuda_testing.h, "
      "RunCudaOnHost), on cuSolverMg or, with a grid, on cuSOLVERMp; a dict of per-position "
      "outputs and errors.");
  m.def(
      "nccl_unique_id",
      [] {
        std::string id, error;
        bool made;
        {
          py::gil_scoped_release release;
          made = jaxmg::NcclUniqueId(&id, &error);
        }
        if (!made) throw std::runtime_error(error);
        return py::bytes(id);
      },
      "ncclGetUniqueId's 128 bytes (loads the CUDA runtime, NCCL and cuSOLVERMp on first use).");
  m.def(
      "run_rect_cuda_on_host",
      [](const std::string& op, const std::string& dtype, int64_t m, int64_t n, int64_t tile,
         int64_t nrhs, std::vector<int64_t> grid, int position, int64_t device_id,
         int64_t local_cols, int64_t lld, const py::bytes& a, const py::bytes& b,
         std::vector<int64_t> nccl_id, bool blocks) {
        jaxmg::HostRectCall call;
        call.blocks = blocks;
        call.op = op;
        call.dtype = dtype;
        call.m = m;
        call.n = n;
        call.tile = tile;
        call.nrhs = nrhs;
        call.grid = std::move(grid);
        call.position = position;
        call.device_id = device_id;
        call.local_cols = local_cols;
        call.lld = lld;
        call.a = a;
        call.b = b;
        call.nccl_id = std::move(nccl_id);
        jaxmg::HostRectResult result;
        std::string error;
        bool ran;
        {
          py::gil_scoped_release release;
          ran = jaxmg::RunRectCudaOnHost(call, &result, &error);
        }
        if (!ran) throw std::invalid_argument(error);
        py::dict out;
        out["out0"] = py::bytes(result.out0);
        out["out1"] = py::bytes(result.out1);
        out["status"] = result.status;
        out["error"] = result.error;
        return out;
      },
      py::arg("op"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("tile"),
      py::arg("nrhs"), py::arg("grid"), py::arg("position"), py::arg("device_id"),
      py::arg("local_cols"), py::arg("lld"), py::arg("a"), py::arg("b"), py::arg("nccl_id"),
      py::arg("blocks") = false,
      "Test hook: one call of backend 'mp''s rectangular routines on cuSOLVERMp outside XLA "
      "(cuda_testing.h, RunRectCudaOnHost); a dict of out0, out1, status and error.");
  m.def(
      "cusolvermp_version",
      [] {
        std::string error;
        const bool gesvd = jaxmg::CusolverMpHasGesvd(&error);
        if (!error.empty()) throw std::runtime_error(error);
        return py::make_tuple(jaxmg::CusolverMpVersion(), gesvd);
      },
      "(version, has_gesvd) of the loaded cuSOLVERMp: cusolverMpGetVersion's number (0.9.1 is "
      "901; 0 until a backend 'mp' call on a GPU has made this process's handle), and whether "
      "it has cusolverMpGesvd (0.9.0 on). Loads the libraries on first use.");
#endif
  m.def("check_library_sizes", &jaxmg::CheckLibrarySizes, py::arg("n"), py::arg("local"),
        py::arg("tile"), py::arg("nrhs"),
        "Test hook: \"\" when N, L, T_A and nrhs fit the library's int arguments, else why not.");
  m.def(
      "open_meetings", [] { return jaxmg::Registry::Get().open_meetings(); },
      "Calls waiting for participants right now (0 between calls).");
  m.def(
      "create_shared_memory",
      [](uint64_t bytes) {
        const std::string call = "create_shared_memory";
        const std::string name = jaxmg::SegmentName(getpid(), call, jaxmg::NextSequence(call), 0);
        const uint64_t sizes[jaxmg::kOperands] = {bytes, 0, 0, 0};
        std::unique_ptr<jaxmg::Segment> segment;
        jaxmg::Outcome r;
        {
          py::gil_scoped_release release;
          r = jaxmg::Segment::Create(name, sizes, &segment);
          if (segment) segment->Unlink();
        }
        return r.ok ? std::string() : r.message;
      },
      py::arg("bytes"),
      "Test hook: creates (and removes) a cross-process segment with room for `bytes` of "
      "operands, as a participant of a multi-process call does; '' on success, else why not.");
  m.def(
      "rendezvous_join",
      [](const std::string& key, int participants, int position, int tag, bool exact) {
        // One participant of a call without a library: join, claim `position` with a slot that
        // carries `tag`, and meet at phase 0. The tags of the slots seen afterwards tell which
        // meeting this participant was in and with whom.
        jaxmg::Outcome r;
        bool claimed = false;
        std::vector<jaxmg::Slot> slots;
        {
          py::gil_scoped_release release;
          std::shared_ptr<jaxmg::Meeting> meeting =
              jaxmg::Registry::Get().Join(key, participants, exact);
          jaxmg::Slot slot;
          slot.device = tag;
          claimed = meeting->Claim(position, slot);
          jaxmg::Outcome own;
          if (!claimed) {
            own = jaxmg::Outcome::Fail("two participants claim mesh position " +
                                       std::to_string(position) + " of call " + meeting->key());
          }
          r = meeting->Phase(0, own, [] { return jaxmg::Outcome{}; });
          slots = meeting->Slots();
        }
        py::list tags;
        for (const jaxmg::Slot& s : slots) {
          if (s.arrived) {
            tags.append(s.device);
          } else {
            tags.append(py::none());
          }
        }
        py::dict d;
        d["ok"] = r.ok;
        d["message"] = r.message;
        d["claimed"] = claimed;
        d["tags"] = tags;
        return d;
      },
      py::arg("key"), py::arg("participants"), py::arg("position"), py::arg("tag"),
      py::arg("exact") = true,
      "Test hook: one participant of a meeting (rendezvous.h) at phase 0, outside XLA, with the "
      "deadline of JAXMG_TIMEOUT_S; a dict: ok, message, claimed (its position), tags (per "
      "position, the tag of the slot there, None where nobody arrived).");
}
