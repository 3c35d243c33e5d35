// How long any wait for a peer may last: a meeting's arrivals (meeting/rendezvous.h), the
// segments of a multi-process call (meeting/crossprocess.h), backend "mp"'s agreement on the
// order of calls (engines/scalapack.cc).
#ifndef JAXMG_TIMEOUT_H_
#define JAXMG_TIMEOUT_H_

#include <cstdlib>

namespace jaxmg {

// JAXMG_TIMEOUT_S, default 60; read at every call.
inline double TimeoutSeconds() {
  const char* text = std::getenv("JAXMG_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return 60.0;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  return (end != text && value > 0) ? value : 60.0;
}

}  // namespace jaxmg

#endif  // JAXMG_TIMEOUT_H_
