// What fake_cusolvermp.cc needs of fake_cuda.cc's state: the emulated devices, allocations and
// streams, and the violation list. Functions named ...Locked expect the caller to hold the lock
// that LockState returns (every other fakecuda function takes it itself).
#ifndef JAXMG_TESTS_FAKE_CUDA_H_
#define JAXMG_TESTS_FAKE_CUDA_H_

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace fakecuda {

// The lock guarding allocations and streams.
std::unique_lock<std::mutex> LockState();

// Records and prints a violation (with or without the state lock held).
void RecordViolation(const char* fn, const std::string& what);

// Bytes of one element of a cudaDataType (0 for one the emulator does not know).
size_t ElementSizeOf(int type);

int CurrentDevice();  // cudaSetDevice's device of the calling thread
bool ValidDevice(int device);

// The device of the allocation holding p, or -1 for host memory.
int DeviceOfLocked(const void* p);
// Whether [p, p + bytes) lies inside one allocation.
bool InOneAllocationLocked(const void* p, size_t bytes);
// The device of a live stream; -1 for an unknown or destroyed one, or the null stream.
int StreamDeviceLocked(const void* stream);
// Runs the stream's queued operations (the stream must be live).
void SynchronizeStreamLocked(const void* stream);
// How many operations queued on streams other than `stream` touch [p, p + bytes).
long QueuedElsewhereLocked(const void* stream, const void* p, size_t bytes);  // NOLINT
// Queues a copy of `bytes` to device memory at dst on the stream: it lands at the stream's
// next synchronisation, like the output of any asynchronous work.
void EnqueueWriteLocked(const void* stream, void* dst, std::vector<char> bytes);

}  // namespace fakecuda

#endif  // JAXMG_TESTS_FAKE_CUDA_H_
