// Installs liballocsim_torch.so as PyTorch's CUDA allocator from C++, where PyTorch's
// CUDAPluggableAllocator takes more than the `alloc` and `free` its Python API passes:
// - a failed request throws c10::OutOfMemoryError with allocsim's explanation, so Python sees
//   torch.OutOfMemoryError (a null block from `alloc` would reach a kernel and fault the GPU);
// - torch.cuda.empty_cache(), set_per_process_memory_fraction() and Tensor.record_stream()
//   reach the policy;
// - private pools (CUDA graph capture, torch.cuda.MemPool) reach it: PyTorch hands
//   beginAllocateToPool a filter, a C++ closure over a stream or a thread, which is evaluated
//   here for each request, and the request names the pool it chose.
// Built by allocsim_torch.py with torch.utils.cpp_extension against the PyTorch in use.
#include <torch/extension.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <dlfcn.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using malloc_fn = void* (*)(ssize_t, int, void*);
using free_fn = void (*)(void*, ssize_t, int, void*);
using text_fn = char* (*)(int);
using error_fn = char* (*)();
using string_free_fn = void (*)(char*);
using empty_cache_fn = void (*)();
using fraction_fn = int (*)(double, int);
using record_stream_fn = void (*)(void*, void*);
using malloc_in_pool_fn = void* (*)(ssize_t, int, void*, unsigned long long, unsigned long long);
using begin_pool_fn = int (*)(int);
using pool_fn = void (*)(int, unsigned long long, unsigned long long);

struct Library {
  malloc_fn malloc;
  free_fn free;
  text_fn last_oom;
  error_fn last_error;
  string_free_fn string_free;
  empty_cache_fn empty_cache;
  fraction_fn set_memory_fraction;
  record_stream_fn record_stream;
  malloc_in_pool_fn malloc_in_pool;
  begin_pool_fn begin_pool;
  pool_fn end_pool;
  pool_fn release_pool;
};

Library lib;

// The private pools requests may go to, per device, as PyTorch's native allocator keeps them:
// the first whose filter takes a request's stream gets it.
struct Capture {
  c10::cuda::MempoolId_t id;
  std::function<bool(cudaStream_t)> filter;
};
std::mutex captures_mutex;
std::unordered_map<int, std::vector<Capture>> captures;
std::atomic<int> captures_open{0};  // so that requests outside any capture take no lock

c10::cuda::MempoolId_t pool_for(int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> guard(captures_mutex);
  for (const Capture& c : captures[device]) {
    if (c.filter(stream)) {
      return c.id;
    }
  }
  return {0, 0};
}

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
  void* p;
  if (captures_open.load(std::memory_order_acquire) == 0) {
    p = lib.malloc(static_cast<ssize_t>(size), device, stream);
  } else {
    c10::cuda::MempoolId_t pool = pool_for(device, stream);
    p = lib.malloc_in_pool(static_cast<ssize_t>(size), device, stream, pool.first, pool.second);
  }
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
      symbol<malloc_in_pool_fn>(handle, "allocsim_malloc_in_pool"),
      symbol<begin_pool_fn>(handle, "allocsim_begin_pool"),
      symbol<pool_fn>(handle, "allocsim_end_pool"),
      symbol<pool_fn>(handle, "allocsim_release_pool"),
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
  hooks->set_begin_allocate_to_pool(
      [](int device, c10::cuda::MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
        if (lib.begin_pool(device) != 0) {
          TORCH_CHECK(false, take(lib.last_error(), "allocsim refused the private pool"));
        }
        std::lock_guard<std::mutex> guard(captures_mutex);
        captures[device].push_back(Capture{id, std::move(filter)});
        captures_open.fetch_add(1, std::memory_order_release);
      });
  hooks->set_end_allocate_to_pool_fn([](int device, c10::cuda::MempoolId_t id) {
    {
      std::lock_guard<std::mutex> guard(captures_mutex);
      auto& open = captures[device];
      for (auto it = open.begin(); it != open.end();) {
        if (it->id == id) {
          it = open.erase(it);
          captures_open.fetch_sub(1, std::memory_order_release);
        } else {
          ++it;
        }
      }
    }
    lib.end_pool(device, id.first, id.second);
  });
  hooks->set_release_pool([](int device, c10::cuda::MempoolId_t id) {
    lib.release_pool(device, id.first, id.second);
  });
  pluggable::changeCurrentAllocator(allocator);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install, "Make liballocsim_torch.so at PATH PyTorch's CUDA allocator");
}
