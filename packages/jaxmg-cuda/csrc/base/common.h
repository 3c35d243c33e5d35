// What the CPU twin and the CUDA targets share above the library line: the call's geometry,
// its checks, the meeting key, and status/NaN conventions.
#ifndef JAXMG_COMMON_H_
#define JAXMG_COMMON_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <xla/ffi/api/ffi.h>

#include "base/outcome.h"

namespace jaxmg {

namespace ffi = xla::ffi;

constexpr int kMaxCudaDevices = 16;

// Plain string formatting for what every call builds (meeting keys, signatures, checks):
// strings, characters and integers, appended without std::ostream.
inline void AppendTo(std::string* s, const std::string& x) { *s += x; }
inline void AppendTo(std::string* s, const char* x) { *s += x; }
inline void AppendTo(std::string* s, char x) { *s += x; }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void AppendTo(std::string* s, T x) {
  *s += std::to_string(x);
}
template <typename... A>
std::string Cat(const A&... parts) {
  std::string s;
  (AppendTo(&s, parts), ...);
  return s;
}

enum class Dtype { kF32, kF64, kC64, kC128 };

// The 1D block-cyclic geometry of one call, as seen by one participant.
struct Problem {
  int64_t n = 0;         // global matrix size N
  int64_t tile = 0;      // T_A
  int64_t ndev = 0;      // participants (len(device_ids))
  int64_t local = 0;     // L: local columns per device (multiple of tile)
  int64_t nrhs = 0;      // potrs only
  int64_t position = 0;  // this participant's mesh position
  int64_t staging = 0;   // columns of staging every position provides for the relayout
  Dtype dtype = Dtype::kF32;
  int64_t num_tiles() const { return (n + tile - 1) / tile; }
};

inline size_t ElementSize(Dtype d) {
  switch (d) {
    case Dtype::kF32: return 4;
    case Dtype::kF64: return 8;
    case Dtype::kC64: return 8;
    case Dtype::kC128: return 16;
  }
  return 0;
}

inline size_t RealElementSize(Dtype d) {
  return (d == Dtype::kF32 || d == Dtype::kC64) ? 4 : 8;
}

inline std::optional<Dtype> DtypeOf(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return Dtype::kF32;
    case ffi::DataType::F64: return Dtype::kF64;
    case ffi::DataType::C64: return Dtype::kC64;
    case ffi::DataType::C128: return Dtype::kC128;
    default: return std::nullopt;
  }
}

inline ffi::DataType RealTypeOf(Dtype d) {
  return RealElementSize(d) == 4 ? ffi::DataType::F32 : ffi::DataType::F64;
}

// Narrows `value`, the quantity `what` (e.g. "N", "lwork of dsyevd"), to one of the vendor
// library's `int` arguments (LAPACK, cuSolverMg), or says why it does not fit. Every such
// argument goes through here; byte counts stay size_t / int64_t and are not limited by it.
inline Outcome NarrowToInt(int64_t value, const std::string& what, int* out) {
  if (value < 0 || value > std::numeric_limits<int>::max()) {
    return Outcome::Fail(what + "=" + std::to_string(value) + " does not fit the library's " +
                         "32-bit int argument (at most " +
                         std::to_string(std::numeric_limits<int>::max()) + ")");
  }
  if (out != nullptr) *out = static_cast<int>(value);
  return {};
}

// The sizes of a call that reach the library as `int`: N (also the leading dimension), the
// local width L, T_A, and nrhs (potrs; 0 otherwise). "" when all fit, else what does not.
// No product of them is an argument: B is N x nrhs with leading dimension N, each an int.
inline std::string CheckLibrarySizes(int64_t n, int64_t local, int64_t tile, int64_t nrhs) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"N", n}, {"the local width L", local}, {"T_A", tile}, {"nrhs", nrhs}};
  for (const auto& [what, value] : sizes) {
    if (Outcome r = NarrowToInt(value, what, nullptr); !r.ok) return r.message;
  }
  return "";
}

// The key of a call's meeting: its device ids in mesh order, the trace-time call id and the
// instance, which of the HLO instructions of that call id this is (ffi/instance.h), and XLA's
// RunId of the execution when the handler binds it (meeting/rendezvous.h).
inline std::string MeetingKey(const char* target, ffi::Span<const int64_t> device_ids,
                              int64_t call_id, int64_t instance,
                              std::optional<int64_t> run_id = std::nullopt) {
  std::string key = Cat(target, "#", call_id, ".", instance, "[");
  for (size_t i = 0; i < device_ids.size(); ++i) key += Cat(i ? "," : "", device_ids[i]);
  key += "]";
  if (run_id) key += Cat("@run", *run_id);
  return key;
}

// Checks the local operand `a` ([L, N] row-major = column-major N x L) against the
// attributes. Returns an error message, or "" when the call is well formed.
inline std::string CheckMatrix(const char* target, ffi::AnyBuffer::Dimensions dims,
                               ffi::DataType type, int64_t tile,
                               ffi::Span<const int64_t> device_ids, int64_t position,
                               Problem* p) {
  const std::string err = Cat(target, ": ");
  auto dtype = DtypeOf(type);
  if (!dtype) return err + "unsupported dtype; expected float32, float64, complex64 or complex128";
  if (dims.size() != 2)
    return err + Cat("the local matrix block must have rank 2 ([L, N]), got rank ", dims.size());
  p->dtype = *dtype;
  p->local = dims[0];
  p->n = dims[1];
  p->tile = tile;
  p->ndev = static_cast<int64_t>(device_ids.size());
  p->position = position;
  if (p->ndev < 1) return err + "device_ids is empty";
  if (tile < 1) return err + Cat("T_A must be positive, got ", tile);
  if (p->n < 1) return err + "N must be positive";
  if (p->local % tile != 0)
    return err + Cat("the local width L=", p->local, " is not a multiple of T_A=", tile);
  if (position < 0 || position >= p->ndev)
    return err + Cat("mesh position ", position, " is outside [0, ", p->ndev, ")");
  if (std::string sizes = CheckLibrarySizes(p->n, p->local, tile, 0); !sizes.empty())
    return err + sizes;
  // Tiles of this position: position, position + ndev, ... below num_tiles.
  int64_t mine =
      p->num_tiles() > position ? (p->num_tiles() - position + p->ndev - 1) / p->ndev : 0;
  if (mine * tile > p->local)
    return err + Cat("position ", position, " owns ", mine, " tiles of width ", tile,
                     " but its block has only ", p->local, " columns");
  return "";
}

inline ffi::Error Fail(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInternal, message);
}

template <typename T>
struct NaNOf {
  static T Value() { return std::numeric_limits<T>::quiet_NaN(); }
};
template <typename R>
struct NaNOf<std::complex<R>> {
  static std::complex<R> Value() {
    return {std::numeric_limits<R>::quiet_NaN(), std::numeric_limits<R>::quiet_NaN()};
  }
};

// The column tiles of mesh position `position`, in local order: fn(global column, local
// column, width). With leading dimension N a tile of w columns is one contiguous run of w*N
// elements; the last real tile may be partial, padding tiles are skipped.
template <typename Fn>
void ForEachTile(int64_t n, int64_t tile, int64_t ndev, int64_t position, Fn&& fn) {
  const int64_t tiles = (n + tile - 1) / tile;
  for (int64_t k = position, m = 0; k < tiles; k += ndev, ++m) {
    fn(k * tile, m * tile, std::min(tile, n - k * tile));
  }
}

}  // namespace jaxmg

#endif  // JAXMG_COMMON_H_
