//! The simulated device: capacity, address space, VMM pages, a calibrated cost model, fault injection, and a device that follows a recording.
