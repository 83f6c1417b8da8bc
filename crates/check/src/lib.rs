//! The independent checker: verifies an allocator's event stream and statistics, never its internals.
