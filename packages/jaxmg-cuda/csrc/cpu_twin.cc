// The CPU twin: the same targets, operands and meeting protocol as the cuSolverMg path, with
// LAPACK (from scipy's cython_lapack capsules) as the library. The leader gathers the tiles
// of every participant into one column-major N x N matrix, calls LAPACK (lower triangle) and
// scatters the results back, so CI exercises the whole multi-device machinery on CPU.
#include <algorithm>
#include <complex>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common.h"
#include "cpu_twin.h"

namespace jaxmg {
namespace {

std::map<std::string, void*>& LapackTable() {
  static auto* table = new std::map<std::string, void*>();
  return *table;
}

template <typename T>
struct Names;
template <> struct Names<float> { static constexpr char p = 's'; };
template <> struct Names<double> { static constexpr char p = 'd'; };
template <> struct Names<std::complex<float>> { static constexpr char p = 'c'; };
template <> struct Names<std::complex<double>> { static constexpr char p = 'z'; };

template <typename T>
struct RealOf { using type = T; };
template <typename R>
struct RealOf<std::complex<R>> { using type = R; };

template <typename T>
constexpr bool kIsComplex = !std::is_same_v<T, typename RealOf<T>::type>;

template <typename Fn, typename T>
Fn Lookup(const char* stem) {
  std::string name = std::string(1, Names<T>::p) + stem;
  auto it = LapackTable().find(name);
  return it == LapackTable().end() ? nullptr : reinterpret_cast<Fn>(it->second);
}

template <typename T>
using PotrfFn = void (*)(char*, int*, T*, int*, int*);
template <typename T>
using PotrsFn = void (*)(char*, int*, int*, T*, int*, T*, int*, int*);
template <typename T>
using SyevdFn = void (*)(char*, char*, int*, T*, int*, T*, T*, int*, int*, int*, int*);
template <typename T, typename R>
using HeevdFn = void (*)(char*, char*, int*, T*, int*, R*, T*, int*, R*, int*, int*, int*, int*);

std::string Missing(const char* routine) {
  return std::string("jaxmg: LAPACK routine ") + routine +
         " is not registered (jaxmg_cuda registers scipy's LAPACK at import)";
}

template <typename T>
void Gather(const Problem& p, const std::vector<Slot>& slots, int which, std::vector<T>& full) {
  full.assign(static_cast<size_t>(p.n) * p.n, T(0));
  for (int64_t d = 0; d < p.ndev; ++d) {
    const T* local = static_cast<const T*>(slots[d].ptr[which]);
    ForEachTile(p, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(full.data() + g * p.n, local + l * p.n, sizeof(T) * w * p.n);
    });
  }
}

template <typename T>
void Scatter(const Problem& p, const std::vector<Slot>& slots, int which,
             const std::vector<T>& full) {
  for (int64_t d = 0; d < p.ndev; ++d) {
    T* local = static_cast<T*>(slots[d].ptr[which]);
    ForEachTile(p, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(local + l * p.n, full.data() + g * p.n, sizeof(T) * w * p.n);
    });
  }
}

template <typename T>
void FillNaN(void* data, size_t count) {
  std::fill_n(static_cast<T*>(data), count, NaNOf<T>::Value());
}

void SetStatus(const std::vector<Slot>& slots, int which, int status) {
  for (const Slot& s : slots) *static_cast<int32_t*>(s.ptr[which]) = status;
}

// potrs slots: ptr[0] = A (factor out), ptr[1] = X (holds b on entry), ptr[2] = status.
template <typename T>
Outcome PotrsLeader(const Problem& p, const std::vector<Slot>& slots) {
  auto potrf = Lookup<PotrfFn<T>, T>("potrf");
  auto potrs = Lookup<PotrsFn<T>, T>("potrs");
  if (!potrf || !potrs) return Outcome::Fail(Missing("potrf/potrs"));
  std::vector<T> full;
  Gather<T>(p, slots, 0, full);
  char uplo = 'L';
  int n = static_cast<int>(p.n), nrhs = static_cast<int>(p.nrhs), info = 0;
  potrf(&uplo, &n, full.data(), &n, &info);
  T* x0 = static_cast<T*>(slots[0].ptr[1]);
  const size_t xcount = static_cast<size_t>(p.n) * p.nrhs;
  if (info == 0 && nrhs > 0) potrs(&uplo, &n, &nrhs, full.data(), &n, x0, &n, &info);
  if (info != 0) FillNaN<T>(x0, xcount);
  for (size_t d = 1; d < slots.size(); ++d) std::memcpy(slots[d].ptr[1], x0, sizeof(T) * xcount);
  Scatter<T>(p, slots, 0, full);
  SetStatus(slots, 2, info);
  return {};
}

// potri slots: ptr[0] = A (inverse out), ptr[1] = status.
template <typename T>
Outcome PotriLeader(const Problem& p, const std::vector<Slot>& slots) {
  auto potrf = Lookup<PotrfFn<T>, T>("potrf");
  auto potri = Lookup<PotrfFn<T>, T>("potri");
  if (!potrf || !potri) return Outcome::Fail(Missing("potrf/potri"));
  std::vector<T> full;
  Gather<T>(p, slots, 0, full);
  char uplo = 'L';
  int n = static_cast<int>(p.n), info = 0;
  potrf(&uplo, &n, full.data(), &n, &info);
  if (info == 0) potri(&uplo, &n, full.data(), &n, &info);
  if (info != 0) std::fill(full.begin(), full.end(), NaNOf<T>::Value());
  Scatter<T>(p, slots, 0, full);
  SetStatus(slots, 1, info);
  return {};
}

// syevd slots: ptr[0] = A (eigenvectors out), ptr[1] = W, ptr[2] = status. vectors in
// p.nrhs (1: compute eigenvectors).
template <typename T>
Outcome SyevdLeader(const Problem& p, const std::vector<Slot>& slots) {
  using R = typename RealOf<T>::type;
  std::vector<T> full;
  Gather<T>(p, slots, 0, full);
  char jobz = p.nrhs ? 'V' : 'N', uplo = 'L';
  int n = static_cast<int>(p.n), info = 0, lwork = -1, liwork = -1, lrwork = -1;
  std::vector<R> w(p.n);
  T work_query{};
  int iwork_query = 0;
  R rwork_query{};
  if constexpr (kIsComplex<T>) {
    auto heevd = Lookup<HeevdFn<T, R>, T>("heevd");
    if (!heevd) return Outcome::Fail(Missing("heevd"));
    heevd(&jobz, &uplo, &n, full.data(), &n, w.data(), &work_query, &lwork, &rwork_query,
          &lrwork, &iwork_query, &liwork, &info);
    lwork = static_cast<int>(std::real(work_query)) + 1;
    lrwork = static_cast<int>(rwork_query) + 1;
    liwork = iwork_query;
    std::vector<T> work(lwork);
    std::vector<R> rwork(lrwork);
    std::vector<int> iwork(std::max(liwork, 1));
    if (info == 0)
      heevd(&jobz, &uplo, &n, full.data(), &n, w.data(), work.data(), &lwork, rwork.data(),
            &lrwork, iwork.data(), &liwork, &info);
  } else {
    auto syevd = Lookup<SyevdFn<T>, T>("syevd");
    if (!syevd) return Outcome::Fail(Missing("syevd"));
    syevd(&jobz, &uplo, &n, full.data(), &n, w.data(), &work_query, &lwork, &iwork_query,
          &liwork, &info);
    lwork = static_cast<int>(work_query) + 1;
    liwork = iwork_query;
    std::vector<T> work(lwork);
    std::vector<int> iwork(std::max(liwork, 1));
    if (info == 0)
      syevd(&jobz, &uplo, &n, full.data(), &n, w.data(), work.data(), &lwork, iwork.data(),
            &liwork, &info);
  }
  if (info != 0) {
    std::fill(full.begin(), full.end(), NaNOf<T>::Value());
    std::fill(w.begin(), w.end(), NaNOf<R>::Value());
  }
  if (p.nrhs || info != 0) Scatter<T>(p, slots, 0, full);
  for (const Slot& s : slots) std::memcpy(s.ptr[1], w.data(), sizeof(R) * p.n);
  SetStatus(slots, 2, info);
  return {};
}

template <template <typename> class Leader>
Outcome Dispatch(const Problem& p, const std::vector<Slot>& slots) {
  switch (p.dtype) {
    case Dtype::kF32: return Leader<float>::Run(p, slots);
    case Dtype::kF64: return Leader<double>::Run(p, slots);
    case Dtype::kC64: return Leader<std::complex<float>>::Run(p, slots);
    case Dtype::kC128: return Leader<std::complex<double>>::Run(p, slots);
  }
  return Outcome::Fail("jaxmg: unknown dtype");
}

template <typename T> struct PotrsOp { static Outcome Run(const Problem& p, const std::vector<Slot>& s) { return PotrsLeader<T>(p, s); } };
template <typename T> struct PotriOp { static Outcome Run(const Problem& p, const std::vector<Slot>& s) { return PotriLeader<T>(p, s); } };
template <typename T> struct SyevdOp { static Outcome Run(const Problem& p, const std::vector<Slot>& s) { return SyevdLeader<T>(p, s); } };

// Copy an input into its result buffer when XLA did not alias them.
void CopyIfDistinct(const ffi::AnyBuffer& in, ffi::Result<ffi::AnyBuffer>& out) {
  if (in.untyped_data() != out->untyped_data())
    std::memcpy(out->untyped_data(), in.untyped_data(), in.size_bytes());
}

// Join the call's meeting, publish `slot`, and let the leader run `leader`.
ffi::Error Meet(const char* target, ffi::Span<const int64_t> device_ids, int64_t call_id,
                const Problem& p, const std::string& own_error, Slot slot,
                const std::function<Outcome(const std::vector<Slot>&)>& leader) {
  int64_t ndev = std::max<int64_t>(static_cast<int64_t>(device_ids.size()), 1);
  auto meeting = Registry::Get().Join(MeetingKey(target, device_ids, call_id), ndev);
  Outcome own;
  if (!own_error.empty()) {
    own = Outcome::Fail(own_error);
  } else if (meeting->Get(p.position).arrived) {
    own = Outcome::Fail(std::string(target) + ": two participants claim mesh position " +
                        std::to_string(p.position));
  } else {
    meeting->Publish(p.position, slot);
  }
  Outcome result = meeting->Phase(0, own, [&] { return leader(meeting->Slots()); });
  return result.ok ? ffi::Error::Success() : Fail(result.message);
}

int64_t PositionOf(ffi::Buffer<ffi::S32>& position) {
  return position.element_count() == 1 ? position.typed_data()[0] : -1;
}

}  // namespace

void RegisterLapack(const std::string& name, void* fn) { LapackTable()[name] = fn; }

ffi::Error PotrsCpuImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Buffer<ffi::S32> position,
                        ffi::Result<ffi::AnyBuffer> a_out, ffi::Result<ffi::AnyBuffer> x,
                        ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                        ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Problem p;
  std::string error = CheckMatrix("jaxmg_potrs", a.dimensions(), a.element_type(), tile,
                                  device_ids, PositionOf(position), &p);
  auto bdims = b.dimensions();
  if (error.empty() && (bdims.size() != 2 || bdims[1] != p.n || b.element_type() != a.element_type()))
    error = "jaxmg_potrs: b must be [nrhs, N] with A's dtype";
  if (error.empty()) {
    p.nrhs = bdims[0];
    CopyIfDistinct(a, a_out);
    CopyIfDistinct(b, x);
  }
  Slot slot;
  slot.ptr = {a_out->untyped_data(), x->untyped_data(), status->typed_data()};
  return Meet("jaxmg_potrs", device_ids, call_id, p, error, slot,
              [&](const std::vector<Slot>& s) { return Dispatch<PotrsOp>(p, s); });
}

ffi::Error PotriCpuImpl(ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                        ffi::Result<ffi::AnyBuffer> a_out,
                        ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                        ffi::Span<const int64_t> device_ids, int64_t call_id) {
  Problem p;
  std::string error = CheckMatrix("jaxmg_potri", a.dimensions(), a.element_type(), tile,
                                  device_ids, PositionOf(position), &p);
  if (error.empty()) CopyIfDistinct(a, a_out);
  Slot slot;
  slot.ptr = {a_out->untyped_data(), status->typed_data()};
  return Meet("jaxmg_potri", device_ids, call_id, p, error, slot,
              [&](const std::vector<Slot>& s) { return Dispatch<PotriOp>(p, s); });
}

ffi::Error SyevdCpuImpl(ffi::AnyBuffer a, ffi::Buffer<ffi::S32> position,
                        ffi::Result<ffi::AnyBuffer> v, ffi::Result<ffi::AnyBuffer> w,
                        ffi::Result<ffi::Buffer<ffi::S32>> status, int64_t tile,
                        ffi::Span<const int64_t> device_ids, int64_t call_id, bool vectors) {
  Problem p;
  std::string error = CheckMatrix("jaxmg_syevd", a.dimensions(), a.element_type(), tile,
                                  device_ids, PositionOf(position), &p);
  if (error.empty() && (w->element_count() != static_cast<size_t>(p.n) ||
                        w->element_type() != RealTypeOf(p.dtype)))
    error = "jaxmg_syevd: w must be [N] of A's real dtype";
  if (error.empty()) {
    p.nrhs = vectors ? 1 : 0;
    CopyIfDistinct(a, v);
  }
  Slot slot;
  slot.ptr = {v->untyped_data(), w->untyped_data(), status->typed_data()};
  return Meet("jaxmg_syevd", device_ids, call_id, p, error, slot,
              [&](const std::vector<Slot>& s) { return Dispatch<SyevdOp>(p, s); });
}

}  // namespace jaxmg

// Handler symbols: operands in the order the Python wrappers pass them.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotrsCpu, jaxmg::PotrsCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                   // a [L, N]
                                  .Arg<xla::ffi::AnyBuffer>()                   // b [nrhs, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()       // position
                                  .Ret<xla::ffi::AnyBuffer>()                   // factor (a)
                                  .Ret<xla::ffi::AnyBuffer>()                   // x (b)
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgPotriCpu, jaxmg::PotriCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                   // a [L, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()       // position
                                  .Ret<xla::ffi::AnyBuffer>()                   // inverse (a)
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxmgSyevdCpu, jaxmg::SyevdCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()                   // a [L, N]
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()       // position
                                  .Ret<xla::ffi::AnyBuffer>()                   // vectors (a)
                                  .Ret<xla::ffi::AnyBuffer>()                   // w [N]
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()       // status [1]
                                  .Attr<int64_t>("T_A")
                                  .Attr<xla::ffi::Span<const int64_t>>("device_ids")
                                  .Attr<int64_t>("call_id")
                                  .Attr<bool>("vectors"));
