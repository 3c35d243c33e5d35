// Checks csrc/cuda_api.h against NVIDIA's own headers, at compile time only (nothing here is
// linked into the module). Compiled by `nox -s cuda_abi` once per CUDA major version (12 and
// 13, headers from NVIDIA's wheels) and by CMake when it finds the headers of one CUDA version
// that compile on their own.
//
// What it proves, for the headers it is compiled against:
//  1. Every function of the three X-macro lists has exactly NVIDIA's prototype. Two ways:
//     a. the list entry, read with NVIDIA's types (the names in the lists resolve to the global
//        ones of the real headers here), is the type of &::name;
//     b. the member of jaxmg::cuda::Api that the loader fills is the type of &::name with each
//        NVIDIA type replaced by our mirror of it (OursOf below, through pointers, const,
//        arrays and function types), and the function returns its library's status type.
//     A changed qualifier, pointer level or parameter type fails; so does a header that renames
//     the function with a macro (the loader would dlsym the old name).
//  2. Every mirrored type has NVIDIA's size, alignment and kind (enum, struct, pointer).
//  3. Every enumerator and constant of cuda_api.h has NVIDIA's value.
// What it cannot prove: that the libraries export the names (the nox session reads their
// symbol tables) or that calls behave as documented (only a GPU run shows that).
#include "cuda_api.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cusolverMg.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if CUDART_VERSION < 12000
#error "cuda_api_check.cc: the CUDA headers found are older than CUDA 12"
#endif
#if CUDART_VERSION / 1000 != CUDA_VERSION / 1000 || CUBLAS_VER_MAJOR != CUDART_VERSION / 1000 || \
    CUSOLVER_VER_MAJOR + 1 != CUDART_VERSION / 1000
#error "cuda_api_check.cc: the CUDA headers found are of different CUDA versions"
#endif

namespace c = jaxmg::cuda;

namespace jaxmg_abi {

// --- OursOf<T>: NVIDIA's type T with every type we mirror replaced by our mirror. -----------

template <typename T>
struct OursOf {
  using type = T;
};
template <typename T>
using Ours = typename OursOf<T>::type;

template <typename T>
struct OursOf<T*> {
  using type = Ours<T>*;
};
template <typename T>
struct OursOf<const T> {
  using type = const Ours<T>;
};
template <typename T>
struct OursOf<volatile T> {
  using type = volatile Ours<T>;
};
template <typename T>
struct OursOf<const volatile T> {
  using type = const volatile Ours<T>;
};
template <typename T, std::size_t N>
struct OursOf<T[N]> {
  using type = Ours<T>[N];
};
template <typename T, std::size_t N>
struct OursOf<const T[N]> {
  using type = const Ours<T>[N];
};
template <typename T>
struct OursOf<T[]> {
  using type = Ours<T>[];
};
template <typename T>
struct OursOf<const T[]> {
  using type = const Ours<T>[];
};
template <typename R, typename... A>
struct OursOf<R(A...)> {
  using type = Ours<R>(Ours<A>...);
};
template <typename R, typename... A>
struct OursOf<R(A...) noexcept> {
  using type = Ours<R>(Ours<A>...) noexcept;
};

// Every NVIDIA type that cuda_api.h mirrors: M(ours, NVIDIA's). Each pair gets an OursOf
// specialization and the layout checks of CheckMirror.
#define JAXMG_MIRRORED_TYPES(M)                                          \
  M(c::cudaError_t, ::cudaError_t)                                       \
  M(c::cusolverStatus_t, ::cusolverStatus_t)                             \
  M(c::CUresult, ::CUresult)                                             \
  M(c::cudaDataType, ::cudaDataType)                                     \
  M(c::cublasFillMode_t, ::cublasFillMode_t)                             \
  M(c::cublasOperation_t, ::cublasOperation_t)                           \
  M(c::cusolverEigMode_t, ::cusolverEigMode_t)                           \
  M(c::cusolverMgGridMapping_t, ::cusolverMgGridMapping_t)               \
  M(c::cudaMemcpyKind, ::cudaMemcpyKind)                                 \
  M(c::CUpointer_attribute, ::CUpointer_attribute)                       \
  M(c::cudaIpcMemHandle_t, ::cudaIpcMemHandle_t)                         \
  M(std::remove_pointer_t<c::cusolverMgHandle_t>,                        \
    std::remove_pointer_t<::cusolverMgHandle_t>)

#define JAXMG_OURS_OF(ours, theirs) \
  template <>                       \
  struct OursOf<theirs> {           \
    using type = ours;              \
  };
JAXMG_MIRRORED_TYPES(JAXMG_OURS_OF)
#undef JAXMG_OURS_OF

// --- 2. Layout of each mirrored type. ----------------------------------------------------------

template <typename O, typename T, typename = void>
struct IsComplete : std::false_type {};
template <typename O, typename T>
struct IsComplete<O, T, std::void_t<decltype(sizeof(O) + sizeof(T))>> : std::true_type {};

template <typename O, typename T>
constexpr bool SameLayout() {
  if constexpr (IsComplete<O, T>::value) {
    return sizeof(O) == sizeof(T) && alignof(O) == alignof(T);
  } else {
    // Opaque handle structs: both incomplete, only ever used through pointers.
    return !IsComplete<O, O>::value && !IsComplete<T, T>::value;
  }
}

template <typename O, typename T>
constexpr bool SameKind() {
  if constexpr (std::is_enum_v<T> && std::is_enum_v<O>) {
    return std::is_same_v<std::underlying_type_t<O>, std::underlying_type_t<T>>;
  } else if constexpr (std::is_enum_v<T>) {
    // Our status codes: an integer of the enum's size.
    return std::is_integral_v<O> && sizeof(O) == sizeof(std::underlying_type_t<T>);
  } else if constexpr (std::is_class_v<T> && IsComplete<O, T>::value) {
    // Passed by value (the IPC handle): the same plain bytes.
    return std::is_class_v<O> && std::is_trivially_copyable_v<O> &&
           std::is_trivially_copyable_v<T> && std::is_standard_layout_v<O> &&
           std::is_standard_layout_v<T>;
  } else {
    return std::is_class_v<T> == std::is_class_v<O>;
  }
}

#define JAXMG_CHECK_MIRROR(ours, theirs)                                                   \
  static_assert(SameLayout<ours, theirs>(),                                                \
                "cuda_api.h: " #ours " has not the size/alignment of NVIDIA's " #theirs); \
  static_assert(SameKind<ours, theirs>(),                                                  \
                "cuda_api.h: " #ours " is not the same kind of type as NVIDIA's " #theirs);
JAXMG_MIRRORED_TYPES(JAXMG_CHECK_MIRROR)
#undef JAXMG_CHECK_MIRROR

// Types we take over as they are, not mirrored.
static_assert(std::is_same_v<::cudaStream_t, cudaStream_t>);
static_assert(std::is_same_v<c::cudaLibMgGrid_t, ::cudaLibMgGrid_t>);
static_assert(std::is_same_v<c::cudaLibMgMatrixDesc_t, ::cudaLibMgMatrixDesc_t>);
static_assert(std::is_same_v<c::CUdeviceptr, ::CUdeviceptr>);
static_assert(std::is_same_v<Ours<::cusolverMgHandle_t>, c::cusolverMgHandle_t>);

// --- 1. Prototypes. --------------------------------------------------------------------------

// Whether the name NVIDIA's headers give the function is the one the loader passes to dlsym.
constexpr bool SameName(const char* a, const char* b) {
  for (; *a != '\0' && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}
#define JAXMG_STRINGIFY(x) #x
#define JAXMG_EXPANDED_NAME(x) JAXMG_STRINGIFY(x)

// Our status types are `int` aliases; a function that returns one must return its library's
// own status enum in NVIDIA's header.
template <typename Status, typename OurRet, typename TheirRet>
constexpr bool ReturnsStatus() {
  return !std::is_same_v<OurRet, int> || std::is_same_v<TheirRet, Status>;
}
template <typename F>
struct ReturnOf;
template <typename R, typename... A>
struct ReturnOf<R (*)(A...)> {
  using type = R;
};
template <typename R, typename... A>
struct ReturnOf<R (*)(A...) noexcept> {
  using type = R;
};

template <typename F>
using TheirReturn = typename ReturnOf<F>::type;

#define JAXMG_CHECK_FUNCTION(status, ret, name, params, spelled)                              \
  static_assert(jaxmg_abi::SameName(spelled, JAXMG_EXPANDED_NAME(name)),                      \
                spelled ": NVIDIA's header renames it with a macro; the loader's dlsym(\""     \
                spelled "\") would bind another entry point");                                \
  static_assert(std::is_same_v<ret(*) params, decltype(&::name)>,                             \
                #name ": the prototype in cuda_api.h, read with NVIDIA's types, is not "      \
                "NVIDIA's");                                                                  \
  static_assert(std::is_same_v<decltype(c::Api::name), jaxmg_abi::Ours<decltype(&::name)>>, \
                #name ": jaxmg::cuda::Api::" #name " is not NVIDIA's prototype with our "     \
                "mirrored types");                                                            \
  static_assert(                                                                              \
      jaxmg_abi::ReturnsStatus<status, ret, jaxmg_abi::TheirReturn<decltype(&::name)>>(),     \
      #name ": NVIDIA's function does not return its library's status type");

}  // namespace jaxmg_abi

// At global scope, so that the type names in the lists are NVIDIA's.
// (#name here, before `name` is macro-expanded on its way into JAXMG_CHECK_FUNCTION, is the
// spelling the loader passes to dlsym.)
#define JAXMG_CHECK_CUDART(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::cudaError_t, ret, name, params, #name)
#define JAXMG_CHECK_DRIVER(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::CUresult, ret, name, params, #name)
#define JAXMG_CHECK_CUSOLVERMG(ret, name, params) \
  JAXMG_CHECK_FUNCTION(::cusolverStatus_t, ret, name, params, #name)
JAXMG_CUDART_FUNCTIONS(JAXMG_CHECK_CUDART)
JAXMG_DRIVER_FUNCTIONS(JAXMG_CHECK_DRIVER)
JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_CHECK_CUSOLVERMG)

// --- 3. Values. ------------------------------------------------------------------------------

#define JAXMG_SAME_VALUE(name)                                                        \
  static_assert(static_cast<long long>(c::name) == static_cast<long long>(::name), \
                #name ": cuda_api.h's value is not NVIDIA's")

JAXMG_SAME_VALUE(CUDA_R_32F);
JAXMG_SAME_VALUE(CUDA_R_64F);
JAXMG_SAME_VALUE(CUDA_C_32F);
JAXMG_SAME_VALUE(CUDA_C_64F);
JAXMG_SAME_VALUE(CUBLAS_FILL_MODE_LOWER);
JAXMG_SAME_VALUE(CUBLAS_FILL_MODE_UPPER);
JAXMG_SAME_VALUE(CUBLAS_OP_N);
JAXMG_SAME_VALUE(CUBLAS_OP_T);
JAXMG_SAME_VALUE(CUBLAS_OP_C);
JAXMG_SAME_VALUE(CUSOLVER_EIG_MODE_NOVECTOR);
JAXMG_SAME_VALUE(CUSOLVER_EIG_MODE_VECTOR);
JAXMG_SAME_VALUE(CUDALIBMG_GRID_MAPPING_ROW_MAJOR);
JAXMG_SAME_VALUE(CUDALIBMG_GRID_MAPPING_COL_MAJOR);
JAXMG_SAME_VALUE(cudaMemcpyHostToDevice);
JAXMG_SAME_VALUE(cudaMemcpyDeviceToHost);
JAXMG_SAME_VALUE(cudaMemcpyDefault);
JAXMG_SAME_VALUE(cudaSuccess);
JAXMG_SAME_VALUE(cudaErrorPeerAccessAlreadyEnabled);
JAXMG_SAME_VALUE(CUSOLVER_STATUS_SUCCESS);
JAXMG_SAME_VALUE(CUSOLVER_STATUS_INTERNAL_ERROR);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
JAXMG_SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_SIZE);
static_assert(c::kIpcHandleSize == CUDA_IPC_HANDLE_SIZE,
              "kIpcHandleSize: cuda_api.h's value is not NVIDIA's CUDA_IPC_HANDLE_SIZE");
static_assert(sizeof(c::cudaIpcMemHandle_t::reserved) == sizeof(::cudaIpcMemHandle_t::reserved));
static_assert(c::kIpcMemLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess,
              "kIpcMemLazyEnablePeerAccess: cuda_api.h's value is not NVIDIA's "
              "cudaIpcMemLazyEnablePeerAccess");

// Error codes that cuda_api.h may or may not declare: checked when it does. Qualified lookup
// of c::name finds the fallback below only when jaxmg::cuda itself declares no such name.
namespace jaxmg::cuda {
namespace abi_check_fallback {
struct NotDeclared {};
inline constexpr NotDeclared cudaErrorPeerAccessUnsupported{};
inline constexpr NotDeclared cudaErrorPeerAccessNotEnabled{};
inline constexpr NotDeclared cudaErrorTooManyPeers{};
}  // namespace abi_check_fallback
using namespace abi_check_fallback;  // NOLINT(build/namespaces): see above
}  // namespace jaxmg::cuda

#define JAXMG_SAME_VALUE_IF_DECLARED(name)                                      \
  static_assert(                                                                \
      [](auto ours) {                                                           \
        if constexpr (std::is_same_v<decltype(ours),                            \
                                     c::abi_check_fallback::NotDeclared>) {     \
          return true;                                                          \
        } else {                                                                \
          return static_cast<long long>(ours) == static_cast<long long>(::name); \
        }                                                                       \
      }(c::name),                                                               \
      #name ": cuda_api.h's value is not NVIDIA's")

JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorPeerAccessUnsupported);
JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorPeerAccessNotEnabled);
JAXMG_SAME_VALUE_IF_DECLARED(cudaErrorTooManyPeers);

// The names cuda_targets.cc's CusolverStatusName gives to the codes 1..9.
static_assert(::CUSOLVER_STATUS_NOT_INITIALIZED == 1);
static_assert(::CUSOLVER_STATUS_ALLOC_FAILED == 2);
static_assert(::CUSOLVER_STATUS_INVALID_VALUE == 3);
static_assert(::CUSOLVER_STATUS_ARCH_MISMATCH == 4);
static_assert(::CUSOLVER_STATUS_MAPPING_ERROR == 5);
static_assert(::CUSOLVER_STATUS_EXECUTION_FAILED == 6);
static_assert(::CUSOLVER_STATUS_INTERNAL_ERROR == 7);
static_assert(::CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED == 8);
static_assert(::CUSOLVER_STATUS_NOT_SUPPORTED == 9);
