//! The faithful clone of PyTorch's CUDA caching allocator. Being written: see issue 3.
