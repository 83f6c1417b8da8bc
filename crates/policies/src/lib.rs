//! Allocation policies: the faithful PyTorch caching allocator clone and the policy zoo.
