//! The replay engine: drives ops through an allocator on a device, with observers, metrics and checking.
