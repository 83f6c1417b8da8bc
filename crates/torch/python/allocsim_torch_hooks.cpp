// Installs liballocsim_torch.so as PyTorch's CUDA allocator from C++, where PyTorch's
// CUDAPluggableAllocator takes more than the `alloc` and `free` its Python API passes:
// - a failed request throws c10::OutOfMemoryError with allocsim's explanation, so Python sees
//   torch.OutOfMemoryError (a null block from `alloc` would reach a kernel and fault the GPU);
// - torch.cuda.empty_cache(), set_per_process_memory_fraction() and Tensor.record_stream()
//   reach the policy.
// Built by allocsim_torch.py with torch.utils.cpp_extension against the PyTorch in use.
#include <torch/extension.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <dlfcn.h>

#include <string>

namespace {

using malloc_fn = void* (*)(ssize_t, int, void*);
using free_fn = void (*)(void*, ssize_t, int, void*);
using text_fn = char* (*)(int);
using error_fn = char* (*)();
using string_free_fn = void (*)(char*);
using empty_cache_fn = void (*)();
using fraction_fn = int (*)(double, int);
using record_stream_fn = void (*)(void*, void*);

struct Library {
  malloc_fn malloc;
  free_fn free;
  text_fn last_oom;
  error_fn last_error;
  string_free_fn string_free;
  empty_cache_fn empty_cache;
  fraction_fn set_memory_fraction;
  record_stream_fn record_stream;
};

Library lib;

template <class T>
T symbol(void* handle, const char* name) {
  void* s = dlsym(handle, name);
  TORCH_CHECK(s != nullptr, "allocsim: ", name, " is missing from the library");
  return reinterpret_cast<T>(s);
}

std::string take(char* text, const char* otherwise) {
  if (text == nullptr) {
    return otherwise;
  }
  std::string s(text);
  lib.string_free(text);
  return s;
}

void* alloc(size_t size, int device, cudaStream_t stream) {
  void* p = lib.malloc(static_cast<ssize_t>(size), device, stream);
  if (p == nullptr && size != 0) {
    std::string why = take(lib.last_oom(device), "");
    if (why.empty()) {
      why = take(lib.last_error(), "allocsim could not allocate");
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, why);
  }
  return p;
}

void release(void* p, size_t size, int device, cudaStream_t stream) {
  lib.free(p, static_cast<ssize_t>(size), device, stream);
}

}  // namespace

void install(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(handle != nullptr, "allocsim: cannot load ", path, ": ", dlerror());
  lib = Library{
      symbol<malloc_fn>(handle, "allocsim_malloc"),
      symbol<free_fn>(handle, "allocsim_free"),
      symbol<text_fn>(handle, "allocsim_last_oom"),
      symbol<error_fn>(handle, "allocsim_last_error"),
      symbol<string_free_fn>(handle, "allocsim_string_free"),
      symbol<empty_cache_fn>(handle, "allocsim_empty_cache"),
      symbol<fraction_fn>(handle, "allocsim_set_memory_fraction"),
      symbol<record_stream_fn>(handle, "allocsim_record_stream"),
  };
  namespace pluggable = torch::cuda::CUDAPluggableAllocator;
  auto allocator = pluggable::createCustomAllocator(alloc, release);
  auto hooks = std::static_pointer_cast<pluggable::CUDAPluggableAllocator>(allocator);
  hooks->set_reset_fn([] { lib.empty_cache(); });
  hooks->set_memory_fraction_fn([](double fraction, int device) {
    if (lib.set_memory_fraction(fraction, device) != 0) {
      TORCH_CHECK(false, take(lib.last_error(), "allocsim refused the memory fraction"));
    }
  });
  hooks->set_record_stream_fn(
      [](void* ptr, cudaStream_t stream) { lib.record_stream(ptr, stream); });
  pluggable::changeCurrentAllocator(allocator);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "Make liballocsim_torch.so at PATH PyTorch's CUDA allocator");
}
