// The LAPACK twin of cuSolverMg: one function per library step (base/routines.h), on the whole
// matrix. The leader gathers every position's tiles into one column-major N x N matrix in
// position 0's workspace, runs the routine's steps on its lower triangle and scatters what
// changed back; pivots are spread over the positions like A's columns, as cuSolverMg keeps
// them. LAPACK itself is scipy's (cython_lapack capsules, registered at import).
#include "engines/lapack_twin.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "base/test_hooks.h"

namespace jaxmg {
namespace {

// --- LAPACK entry points, one table filled at import, typed per dtype once ---------------

std::map<std::string, void*>& LapackTable() {
  static auto* table = new std::map<std::string, void*>();
  return *table;
}

template <typename T>
struct Prefix;
template <>
struct Prefix<float> {
  static constexpr char value = 's';
};
template <>
struct Prefix<double> {
  static constexpr char value = 'd';
};
template <>
struct Prefix<std::complex<float>> {
  static constexpr char value = 'c';
};
template <>
struct Prefix<std::complex<double>> {
  static constexpr char value = 'z';
};

template <typename T>
struct RealOf {
  using type = T;
};
template <typename R>
struct RealOf<std::complex<R>> {
  using type = R;
};
template <typename T>
constexpr bool kIsComplex = !std::is_same_v<T, typename RealOf<T>::type>;

template <typename T>
struct Lapack {
  using R = typename RealOf<T>::type;
  using Potrf = void (*)(char*, int*, T*, int*, int*);  // also potri
  using Potrs = void (*)(char*, int*, int*, T*, int*, T*, int*, int*);
  using Getrf = void (*)(int*, int*, T*, int*, int*, int*);
  using Getrs = void (*)(char*, int*, int*, T*, int*, int*, T*, int*, int*);
  using Syevd = void (*)(char*, char*, int*, T*, int*, R*, T*, int*, int*, int*, int*);
  using Heevd = void (*)(char*, char*, int*, T*, int*, R*, T*, int*, R*, int*, int*, int*, int*);

  template <typename Fn>
  static Outcome Get(const char* stem, Fn* fn) {
    const std::string name = std::string(1, Prefix<T>::value) + stem;
    auto it = LapackTable().find(name);
    if (it == LapackTable().end() || it->second == nullptr)
      return Outcome::Fail("jaxmg: LAPACK routine " + name +
                           " is not registered (jaxmg_cuda registers scipy's LAPACK at import)");
    *fn = reinterpret_cast<Fn>(it->second);
    return {};
  }
};

// LAPACK's workspace for ?syevd / ?heevd, in elements of T, R and int.
struct EigWork {
  int lwork = 0, lrwork = 0, liwork = 0;
};

// A workspace size LAPACK's query returned as a floating-point number, rounded up (a float
// may round it down), plus one, narrowed to LAPACK's int.
template <typename R>
Outcome QueriedSize(R value, const std::string& what, int* out) {
  const double size = std::ceil(static_cast<double>(value)) + 1;
  if (size >= 0 && size < 9.2e18) return NarrowToInt(static_cast<int64_t>(size), what, out);
  // NaN, negative or beyond int64_t: no conversion is defined, say so directly.
  return Outcome::Fail(what + "=" + std::to_string(size) + " from LAPACK's workspace query " +
                       "does not fit the library's 32-bit int argument");
}

template <typename T>
Outcome QueryEig(int n, bool vectors, EigWork* out) {
  using L = Lapack<T>;
  using R = typename L::R;
  char jobz = vectors ? 'V' : 'N', uplo = 'L';
  int lda = std::max(n, 1), info = 0, lwork = -1, lrwork = -1, liwork = -1, iwork = 0;
  T work{};
  R rwork{};
  if constexpr (kIsComplex<T>) {
    typename L::Heevd heevd = nullptr;
    if (Outcome r = L::Get("heevd", &heevd); !r.ok) return r;
    heevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &lwork, &rwork, &lrwork, &iwork, &liwork,
          &info);
    if (Outcome r =
            QueriedSize(rwork, std::string(1, Prefix<T>::value) + "heevd lrwork", &out->lrwork);
        !r.ok)
      return r;
  } else {
    typename L::Syevd syevd = nullptr;
    if (Outcome r = L::Get("syevd", &syevd); !r.ok) return r;
    syevd(&jobz, &uplo, &n, nullptr, &lda, nullptr, &work, &lwork, &iwork, &liwork, &info);
  }
  if (info != 0)
    return Outcome::Fail("jaxmg: LAPACK workspace query failed, info " + std::to_string(info));
  const char* routine = kIsComplex<T> ? "heevd" : "syevd";
  if (Outcome r = QueriedSize(std::real(work), Prefix<T>::value + std::string(routine) + " lwork",
                              &out->lwork);
      !r.ok)
    return r;
  out->liwork = std::max(iwork, 1);
  return {};
}

constexpr size_t kAlign = 64;
size_t Aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Position 0's workspace: the gathered N x N matrix, LAPACK's eigensolver work arrays
// (syevd), the whole pivot vector (getrf, getrs).
template <typename T>
struct Workspace {
  using R = typename RealOf<T>::type;
  T* full = nullptr;
  T* work = nullptr;
  R* rwork = nullptr;
  int* iwork = nullptr;
  int* ipiv = nullptr;
  EigWork eig;
  size_t bytes = 0;

  static Outcome Layout(const MgCall& c, char* base, Workspace* w) {
    size_t at = Aligned(sizeof(T) * static_cast<size_t>(c.n) * c.n);
    w->full = reinterpret_cast<T*>(base);
    for (Step step : c.routine->steps) {
      if (step == Step::kSyevd) {
        if (Outcome r = QueryEig<T>(c.n, c.vectors, &w->eig); !r.ok) return r;
        w->work = reinterpret_cast<T*>(base + at);
        at += Aligned(sizeof(T) * w->eig.lwork);
        w->rwork = reinterpret_cast<R*>(base + at);
        at += Aligned(sizeof(R) * w->eig.lrwork);
        w->iwork = reinterpret_cast<int*>(base + at);
        at += Aligned(sizeof(int) * w->eig.liwork);
      }
      if (step == Step::kGetrf || step == Step::kGetrs) {
        w->ipiv = reinterpret_cast<int*>(base + at);
        at += Aligned(sizeof(int) * static_cast<size_t>(c.n));
      }
    }
    w->bytes = at;
    return {};
  }
};

template <typename T>
void Gather(const MgCall& c, T* full) {
  const int64_t ndev = static_cast<int64_t>(c.a.size());
  for (int64_t d = 0; d < ndev; ++d) {
    const T* local = static_cast<const T*>(c.a[d]);
    ForEachTile(c.n, c.tile, ndev, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(full + g * c.lda, local + l * c.lda, sizeof(T) * w * c.lda);
    });
  }
}

template <typename T>
void Scatter(const MgCall& c, const T* full) {
  const int64_t ndev = static_cast<int64_t>(c.a.size());
  for (int64_t d = 0; d < ndev; ++d) {
    T* local = static_cast<T*>(c.a[d]);
    ForEachTile(c.n, c.tile, ndev, d, [&](int64_t g, int64_t l, int64_t w) {
      std::memcpy(local + l * c.lda, full + g * c.lda, sizeof(T) * w * c.lda);
    });
  }
}

// LAPACK's info < 0: argument -info of the routine was illegal. That is a fault of jaxmg's
// call, not of the user's matrix, so it is an error on every participant, never a status.
template <typename T>
Outcome IllegalArgument(const char* routine, int info) {
  return Outcome::Fail("jaxmg: LAPACK " + std::string(1, Prefix<T>::value) + routine +
                       " rejected argument " + std::to_string(-info) + " as illegal (info=" +
                       std::to_string(info) + "): a bug in jaxmg, please report it");
}

// What a step needs besides the call: the gathered matrix and its workspace.
template <typename T>
struct Args {
  const MgCall& c;
  Workspace<T>& w;
  int n;
  int lda;  // the library's leading dimension (illegal when a test asks for it)
};

// --- the steps ------------------------------------------------------------------------------

template <typename T>
Outcome Potrf(const Args<T>& s, int* info) {
  typename Lapack<T>::Potrf potrf = nullptr;
  if (Outcome r = Lapack<T>::Get("potrf", &potrf); !r.ok) return r;
  char uplo = 'L';
  int n = s.n, lda = s.lda;
  potrf(&uplo, &n, s.w.full, &lda, info);
  return *info < 0 ? IllegalArgument<T>("potrf", *info) : Outcome{};
}

template <typename T>
Outcome Potrs(const Args<T>& s, int* info) {
  if (s.c.nrhs == 0) return {};
  typename Lapack<T>::Potrs potrs = nullptr;
  if (Outcome r = Lapack<T>::Get("potrs", &potrs); !r.ok) return r;
  char uplo = 'L';
  int n = s.n, lda = s.lda, ldb = s.c.lda, nrhs = s.c.nrhs;
  potrs(&uplo, &n, &nrhs, s.w.full, &lda, static_cast<T*>(s.c.b[0]), &ldb, info);
  return *info < 0 ? IllegalArgument<T>("potrs", *info) : Outcome{};
}

template <typename T>
Outcome Potri(const Args<T>& s, int* info) {
  typename Lapack<T>::Potrf potri = nullptr;
  if (Outcome r = Lapack<T>::Get("potri", &potri); !r.ok) return r;
  char uplo = 'L';
  int n = s.n, lda = s.lda;
  potri(&uplo, &n, s.w.full, &lda, info);
  return *info < 0 ? IllegalArgument<T>("potri", *info) : Outcome{};
}

template <typename T>
Outcome Syevd(const Args<T>& s, int* info) {
  using L = Lapack<T>;
  using R = typename L::R;
  char jobz = s.c.vectors ? 'V' : 'N', uplo = 'L';
  int n = s.n, lda = s.lda;
  EigWork& eig = s.w.eig;
  R* w = static_cast<R*>(s.c.w);
  if constexpr (kIsComplex<T>) {
    typename L::Heevd heevd = nullptr;
    if (Outcome r = L::Get("heevd", &heevd); !r.ok) return r;
    heevd(&jobz, &uplo, &n, s.w.full, &lda, w, s.w.work, &eig.lwork, s.w.rwork, &eig.lrwork,
          s.w.iwork, &eig.liwork, info);
  } else {
    typename L::Syevd syevd = nullptr;
    if (Outcome r = L::Get("syevd", &syevd); !r.ok) return r;
    syevd(&jobz, &uplo, &n, s.w.full, &lda, w, s.w.work, &eig.lwork, s.w.iwork, &eig.liwork, info);
  }
  return *info < 0 ? IllegalArgument<T>(kIsComplex<T> ? "heevd" : "syevd", *info) : Outcome{};
}

// The pivots of global columns [g, g + w) live at local entries [l, l + w) of their position.
template <typename Fn>
void ForEachPivotRange(const MgCall& c, Fn&& fn) {
  const int64_t ndev = static_cast<int64_t>(c.a.size());
  for (int64_t d = 0; d < ndev; ++d)
    ForEachTile(c.n, c.tile, ndev, d, [&](int64_t g, int64_t l, int64_t w) { fn(d, g, l, w); });
}

template <typename T>
Outcome Getrf(const Args<T>& s, int* info) {
  typename Lapack<T>::Getrf getrf = nullptr;
  if (Outcome r = Lapack<T>::Get("getrf", &getrf); !r.ok) return r;
  int n = s.n, lda = s.lda;
  getrf(&n, &n, s.w.full, &lda, s.w.ipiv, info);
  if (*info < 0) return IllegalArgument<T>("getrf", *info);
  ForEachPivotRange(s.c, [&](int64_t d, int64_t g, int64_t l, int64_t w) {
    std::memcpy(s.c.ipiv[d] + l, s.w.ipiv + g, sizeof(int32_t) * w);
  });
  return {};
}

template <typename T>
Outcome Getrs(const Args<T>& s, int* info) {
  if (s.c.nrhs == 0) return {};
  typename Lapack<T>::Getrs getrs = nullptr;
  if (Outcome r = Lapack<T>::Get("getrs", &getrs); !r.ok) return r;
  ForEachPivotRange(s.c, [&](int64_t d, int64_t g, int64_t l, int64_t w) {
    std::memcpy(s.w.ipiv + g, s.c.ipiv[d] + l, sizeof(int32_t) * w);
  });
  char trans = 'N';  // as cuSolverMg's getrs, which takes CUBLAS_OP_N alone (meeting/protocol.cc)
  int n = s.n, lda = s.lda, ldb = s.c.lda, nrhs = s.c.nrhs;
  getrs(&trans, &n, &nrhs, s.w.full, &lda, s.w.ipiv, static_cast<T*>(s.c.b[0]), &ldb, info);
  return *info < 0 ? IllegalArgument<T>("getrs", *info) : Outcome{};
}

template <typename T>
Outcome RunStep(Step step, const Args<T>& s, int* info) {
  switch (step) {
    case Step::kPotrf: return Potrf<T>(s, info);
    case Step::kPotrs: return Potrs<T>(s, info);
    case Step::kPotri: return Potri<T>(s, info);
    case Step::kSyevd: return Syevd<T>(s, info);
    case Step::kGetrf: return Getrf<T>(s, info);
    case Step::kGetrs: return Getrs<T>(s, info);
  }
  return Outcome::Fail("jaxmg: unknown library step");
}

// The routine's steps for all positions, typed once.
template <typename T>
Outcome Run(const MgCall& c, int* info) {
  Workspace<T> w;
  if (Outcome r = Workspace<T>::Layout(c, static_cast<char*>(c.work[0]), &w); !r.ok) return r;
  Args<T> s{c, w, c.n, IllegalLeadingDimensionForTests() ? 0 : c.lda};
  *info = 0;
  Gather<T>(c, w.full);
  for (Step step : c.routine->steps) {
    if (Outcome r = RunStep<T>(step, s, info); !r.ok) return r;
    if (*info != 0) break;  // the protocol fills what the caller gets with NaN
  }
  // What changed: the factor, the inverse (lower triangle), the eigenvectors.
  const bool values_only = c.routine->eigenvalues && !c.vectors;
  if (c.routine->result != Result::kUnchanged && !values_only) Scatter<T>(c, w.full);
  return {};
}

template <typename T>
Outcome Bytes(const MgCall& c, int64_t* bytes) {
  Workspace<T> w;
  Outcome r = Workspace<T>::Layout(c, nullptr, &w);
  *bytes = static_cast<int64_t>(w.bytes);
  return r;
}

}  // namespace

void RegisterLapack(const std::string& name, void* fn) { LapackTable()[name] = fn; }

Outcome LapackWorkspaceBytes(const MgCall& c, int64_t* bytes) {
  switch (c.dtype) {
    case Dtype::kF32: return Bytes<float>(c, bytes);
    case Dtype::kF64: return Bytes<double>(c, bytes);
    case Dtype::kC64: return Bytes<std::complex<float>>(c, bytes);
    case Dtype::kC128: return Bytes<std::complex<double>>(c, bytes);
  }
  return Outcome::Fail("jaxmg: unknown dtype");
}

Outcome LapackRun(const MgCall& c, int* info) {
  switch (c.dtype) {
    case Dtype::kF32: return Run<float>(c, info);
    case Dtype::kF64: return Run<double>(c, info);
    case Dtype::kC64: return Run<std::complex<float>>(c, info);
    case Dtype::kC128: return Run<std::complex<double>>(c, info);
  }
  return Outcome::Fail("jaxmg: unknown dtype");
}

}  // namespace jaxmg
