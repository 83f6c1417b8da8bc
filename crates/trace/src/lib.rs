//! Every trace format: PyTorch snapshots (safe pickle reader), RMM logs, allocsim's native format.
