// The compile-time machinery shared by the checks of our hand-written declarations against
// NVIDIA's headers (cuda_api_check.cc, cusolvermp_api_check.cc). Nothing here is linked into
// the module; a check file includes its declarations, NVIDIA's headers, then this.
//
// A check file, for one declaration header:
//  - lists its mirrored types, M(ours, NVIDIA's), and gives each an OursOf specialization
//    (JAXMG_ABI_OURS_OF, inside namespace jaxmg_abi) and the layout checks
//    (JAXMG_ABI_CHECK_MIRROR);
//  - runs JAXMG_ABI_CHECK_FUNCTION over each X-macro list at global scope, where the type names
//    of the lists are NVIDIA's;
//  - asserts each constant with JAXMG_ABI_SAME_VALUE.
#ifndef JAXMG_ABI_CHECK_H_
#define JAXMG_ABI_CHECK_H_

#include <cstddef>
#include <type_traits>

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

// Inside namespace jaxmg_abi: NVIDIA's `theirs` reads as our `ours`.
#define JAXMG_ABI_OURS_OF(ours, theirs) \
  template <>                           \
  struct OursOf<theirs> {               \
    using type = ours;                  \
  };

// --- Layout of a mirrored type. ----------------------------------------------------------------

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
    // Passed by value (the IPC handle, NCCL's unique id): the same plain bytes.
    return std::is_class_v<O> && std::is_trivially_copyable_v<O> &&
           std::is_trivially_copyable_v<T> && std::is_standard_layout_v<O> &&
           std::is_standard_layout_v<T>;
  } else {
    return std::is_class_v<T> == std::is_class_v<O>;
  }
}

// `header` names our declaration file in the failure message.
#define JAXMG_ABI_CHECK_MIRROR(header, ours, theirs)                                   \
  static_assert(jaxmg_abi::SameLayout<ours, theirs>(),                                 \
                header ": " #ours " has not the size/alignment of NVIDIA's " #theirs); \
  static_assert(jaxmg_abi::SameKind<ours, theirs>(),                                   \
                header ": " #ours " is not the same kind of type as NVIDIA's " #theirs);

// --- Prototypes. -------------------------------------------------------------------------------

// Whether the name NVIDIA's headers give the function is the one the loader passes to dlsym.
constexpr bool SameName(const char* a, const char* b) {
  for (; *a != '\0' && *a == *b; ++a, ++b) {
  }
  return *a == *b;
}
#define JAXMG_ABI_STRINGIFY(x) #x
#define JAXMG_ABI_EXPANDED_NAME(x) JAXMG_ABI_STRINGIFY(x)

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

// At global scope, so that the type names in the lists are NVIDIA's. `table` is the struct of
// function pointers the loader fills (its member `name` holds our prototype with our types);
// `spelled` is #name taken before `name` is macro-expanded, the spelling passed to dlsym.
#define JAXMG_ABI_CHECK_FUNCTION(header, table, status, ret, name, params, spelled)                \
  static_assert(jaxmg_abi::SameName(spelled, JAXMG_ABI_EXPANDED_NAME(name)), spelled               \
                ": NVIDIA's header renames it with a macro; the loader's dlsym would bind "        \
                "another entry point");                                                            \
  static_assert(std::is_same_v<ret(*) params, decltype(&::name)>,                                  \
                #name ": the prototype in " header ", read with NVIDIA's types, is not NVIDIA's"); \
  static_assert(std::is_same_v<decltype(table::name), jaxmg_abi::Ours<decltype(&::name)>>, #name   \
                ": " #table "::" #name ", with our mirrored types, is not NVIDIA's prototype");    \
  static_assert(                                                                                   \
      jaxmg_abi::ReturnsStatus<status, ret, jaxmg_abi::TheirReturn<decltype(&::name)>>(),          \
      #name ": NVIDIA's function does not return its library's status type");

// --- Values. -----------------------------------------------------------------------------------

// `ns` is the namespace of our declaration of `name`.
#define JAXMG_ABI_SAME_VALUE(header, ns, name)                                      \
  static_assert(static_cast<long long>(ns::name) == static_cast<long long>(::name), \
                #name ": " header "'s value is not NVIDIA's")

}  // namespace jaxmg_abi

#endif  // JAXMG_ABI_CHECK_H_
