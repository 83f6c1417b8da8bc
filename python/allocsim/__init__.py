"""allocsim from Python: replay PyTorch memory snapshots (and RMM logs, native traces, live
workloads) through GPU allocator policies.

    import allocsim
    trace = allocsim.load("run.pickle.gz")
    result = allocsim.replay(trace, alloc_conf="expandable_segments:True")
    result.memory_stats["reserved_bytes.all.peak"]

Every function calls the `allocsim` library (the native module) with typed arguments, the GIL
released, so threads run calls side by side; a result here and the CLI's `--json` are the same
numbers, key for key. Importing allocsim needs no torch; `capture` does.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

# `python -m allocsim.capture` imports this package, which imports the module it then runs as
# `__main__`: runpy's warning about that says nothing the user can act on.
warnings.filterwarnings(
    "ignore", message="'allocsim.capture' found in sys.modules", category=RuntimeWarning
)

from . import _allocsim  # noqa: E402
from .capture import capture  # noqa: E402
from .estimate import DataDependentError, EstimateResult, estimate
from .sweep import sweep

__version__ = _allocsim.__version__

__all__ = [
    "AllocsimError",
    "TraceError",
    "SettingsError",
    "UsageError",
    "FileError",
    "Trace",
    "ReplayResult",
    "load",
    "replay",
    "compare",
    "capacity",
    "advise",
    "bound",
    "explain_oom",
    "diff",
    "fidelity",
    "report",
    "convert",
    "workloads",
    "policies",
    "capture",
    "estimate",
    "EstimateResult",
    "DataDependentError",
    "sweep",
]


class AllocsimError(Exception):
    """Something allocsim refused or could not do; the message says what, naming the file and
    the place where there is one."""


class TraceError(AllocsimError, ValueError):
    """A file that cannot be read as a trace (a hostile or damaged pickle included: nothing in
    it is ever executed)."""


class SettingsError(AllocsimError, ValueError):
    """A policy or an allocator setting that was refused."""


class UsageError(AllocsimError, ValueError):
    """Arguments allocsim does not take (an unknown policy name, a malformed size, ...)."""


class FileError(AllocsimError, OSError):
    """A file that could not be opened, read or written."""


_ERRORS = {
    "trace": TraceError,
    "settings": SettingsError,
    "usage": UsageError,
    "io": FileError,
}

PathLike = Union[str, "os.PathLike[str]"]
Size = Union[int, float, str]


def _native(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a native call, raising its failure as the package's exception for its kind."""
    try:
        return call(*args, **kwargs)
    except _allocsim.Failure as e:
        kind, message = e.args
        raise _ERRORS.get(kind, AllocsimError)(message) from None


class Trace:
    """A trace read once (`allocsim.load`): every call given it uses it as it is, with what
    `allocsim info` says of it. Its ops and stacks are reachable: `trace.ops` (their number,
    also `len(trace)`), `trace.op_list(start, stop)`, `trace.stack(op_index)`."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.info: Mapping[str, Any] = json.loads(_native(native.info))

    @property
    def path(self) -> str:
        return os.fspath(self._native.path)

    @property
    def format(self) -> str:
        return self.info["format"]

    @property
    def ops(self) -> int:
        """Operations replayed: allocations, frees, `empty_cache` calls, ..."""
        return self.info["ops"]

    def op_list(self, start: int = 0, stop: Optional[int] = None) -> list[dict[str, Any]]:
        """The ops from `start` to `stop`, each a dict: `action` and its fields."""
        return self._native.ops(start, stop)

    def stack(self, op_index: int) -> list[tuple[str, int, str]]:
        """The (filename, line, name) frames of the entry op `op_index` came from, innermost
        first; empty when the recording kept none."""
        return self._native.stack(op_index)

    def __len__(self) -> int:
        return len(self._native)

    @property
    def peak_live_bytes(self) -> int:
        return self.info["peak_live_bytes"]

    @property
    def alloc_conf(self) -> str:
        """The `PYTORCH_CUDA_ALLOC_CONF` the recording was made under, as far as it says."""
        return self.info["alloc_conf"]

    @property
    def streams(self) -> list[int]:
        return list(self.info["streams"])

    @property
    def warnings(self) -> list[str]:
        return list(self.info["warnings"])

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Trace(path={self.path!r}, format={self.format!r}, ops={self.ops})"

    def _repr_html_(self) -> str:
        from ._html import trace_html

        return trace_html(self)


TraceLike = Union[Trace, PathLike]


def _trace(trace: TraceLike) -> Any:
    """What the native calls take: a loaded trace, or a path."""
    if isinstance(trace, Trace):
        return trace._native
    if isinstance(trace, (str, os.PathLike)):
        return os.fspath(trace)
    raise TypeError(f"expected an allocsim.Trace or a path, not {type(trace).__name__}")


def _traces(trace: Union[TraceLike, Sequence[TraceLike]]) -> Any:
    """A trace, or a job's: a list of traces, one per rank."""
    if isinstance(trace, (list, tuple)):
        return [_trace(t) for t in trace]
    return _trace(trace)


def _json(returned: tuple[Optional[str], str, bool]) -> Any:
    return json.loads(returned[0])


def load(
    path: PathLike, cuda_device: Optional[int] = None, max_reader_memory: Optional[Size] = None
) -> Trace:
    """Read a trace (a PyTorch snapshot `.pickle`/`.pickle.gz`, an RMM log `.csv`, a native
    `.allocsim`/`.allocsim.json`, or `workload:NAME?key=value` for a live workload) once, for
    every later call. Raises `TraceError` naming the file and the place if it cannot, and
    `FileError` if it cannot be opened."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, not {type(path).__name__}")
    return Trace(_native(_allocsim.load, os.fspath(path), cuda_device, max_reader_memory))


@dataclass(frozen=True)
class ReplayResult:
    """One replay: `memory_stats` under PyTorch's key names, peaks, OOMs with the figures that
    explain them, fragmentation, and the timeline. `raw` is `allocsim replay --json` whole;
    `summary` the text `allocsim replay` prints, `torch.cuda.memory_summary()`'s table last."""

    raw: Mapping[str, Any] = field(repr=False)
    summary: str = field(default="", repr=False)

    @property
    def memory_stats(self) -> dict[str, int]:
        return dict(self.raw["memory_stats"])

    @property
    def peak_reserved_bytes(self) -> int:
        return self.raw["peak_reserved_bytes"]

    @property
    def peak_allocated_bytes(self) -> int:
        return self.raw["peak_allocated_bytes"]

    @property
    def ooms(self) -> list[dict[str, Any]]:
        """One dict per OOM: the op, the rounded request, free memory on the device, allocated,
        reserved, reserved but unallocated, and the largest free block of each pool."""
        return [dict(o) for o in self.raw["ooms"]]

    @property
    def fragmentation_at_peak(self) -> float:
        return self.raw["fragmentation_at_peak"]

    @property
    def timeline(self) -> dict[str, Any]:
        """Allocated and reserved bytes after sampled ops (up to 2,000 points, the peaks
        kept), as NumPy arrays: `op`, `allocated_bytes`, `reserved_bytes`."""
        import numpy as np

        t = self.raw["timeline"]
        return {k: np.asarray(v, dtype=np.int64) for k, v in t.items()}

    def timeline_frame(self) -> Any:
        """The timeline as a pandas DataFrame (pandas needed)."""
        import pandas as pd

        return pd.DataFrame(self.timeline)

    def __getattr__(self, name: str) -> Any:
        raw = self.__dict__.get("raw", {})
        if name in raw:
            return raw[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        r = self.raw
        return (
            f"ReplayResult(trace={r['trace']!r}, policy={r['policy']!r}, "
            f"alloc_conf={r['alloc_conf']!r}, peak_reserved_bytes={r['peak_reserved_bytes']}, "
            f"ooms={len(r['ooms'])})"
        )

    def _repr_html_(self) -> str:
        from ._html import replay_html

        return replay_html(self)


def replay(
    trace: TraceLike,
    policy: str = "pytorch",
    alloc_conf: Optional[str] = None,
    device_free: Optional[Size] = None,
    device_total: Optional[Size] = None,
    memory_fraction: Optional[float] = None,
    device: str = "auto",
    check: bool = False,
    seed: int = 0,
) -> ReplayResult:
    """Replay `trace` through `policy` (`allocsim.policies()` lists them) under `alloc_conf`
    (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string; for the others their own settings), on
    the modelled device with `device_free`/`device_total` (bytes, or `"40GiB"`). `check` runs
    the independent checker over every event (violations: `checker_violations`). The same
    numbers as `allocsim replay ... --json`."""
    raw, text, _failed = _native(
        _allocsim.replay,
        _trace(trace),
        policy=policy,
        alloc_conf=alloc_conf,
        device_free=device_free,
        device_total=device_total,
        memory_fraction=memory_fraction,
        device=device,
        check=check,
        seed=seed,
    )
    return ReplayResult(json.loads(raw), text)


def compare(
    traces: Union[TraceLike, Sequence[TraceLike]],
    policies: Union[str, Sequence[str]] = "all",
    memory_fraction: Optional[float] = None,
    device_total: Optional[Size] = None,
    capacity: bool = True,
    html: Optional[PathLike] = None,
    jobs: Optional[int] = None,
) -> list[dict[str, Any]]:
    """Every column on every trace: peaks, fragmentation, OOMs, device calls, minimum feasible
    capacity, checker violations, one dict per (trace, column). A column is a policy or a
    policy under settings, `"pytorch[expandable_segments:True]"`. `html` also writes the
    comparison page there. As `allocsim compare`."""
    if isinstance(traces, (str, os.PathLike, Trace)):
        traces = [traces]
    columns = policies if isinstance(policies, str) else ",".join(policies)
    return _json(
        _native(
            _allocsim.compare,
            [_trace(t) for t in traces],
            policies=columns,
            memory_fraction=memory_fraction,
            device_total=device_total,
            capacity=capacity,
            html=None if html is None else os.fspath(html),
            jobs=jobs,
        )
    )


def capacity(
    trace: Union[TraceLike, Sequence[TraceLike]],
    alloc_conf: Optional[str] = None,
    policy: str = "pytorch",
    outside: Optional[Size] = None,
) -> dict[str, Any]:
    """The smallest free memory at the start (as `torch.cuda.mem_get_info()` reports it once
    the context exists) on which the recorded program runs without an OOM: `capacity_bytes`,
    the band `capacity_low_bytes`..`capacity_high_bytes`, and how it was found. As `allocsim
    capacity`. A list of traces is a job (one per rank): each rank's answer (`["ranks"]`) and
    the job's (`["job"]`): it fits when every rank fits, so the rank needing most decides
    (`deciding_rank`)."""
    return _json(
        _native(_allocsim.capacity, _traces(trace), alloc_conf=alloc_conf, policy=policy, outside=outside)
    )


def bound(trace: TraceLike, policy: str = "pytorch", alloc_conf: Optional[str] = None) -> dict[str, Any]:
    """How far from the best possible: `bound_bytes` (the most bytes live at once, in whole
    pages: no allocator needs less), `offline_bytes` (a placement that knows every lifetime in
    advance), the policy's `policy_peak_reserved_bytes` and its headroom over both. As
    `allocsim bound`."""
    return _json(_native(_allocsim.bound, _trace(trace), policy=policy, alloc_conf=alloc_conf))


def advise(
    trace: Union[TraceLike, Sequence[TraceLike]],
    device_free: Optional[Size] = None,
    outside: Optional[Size] = None,
) -> dict[str, Any]:
    """The `PYTORCH_CUDA_ALLOC_CONF` settings people try, ranked by the memory each needs, with
    peak reserved, OOMs on a card with `device_free` free, and fragmentation. A list of traces
    is a job (one per rank): the settings ranked by what the rank needing most needs
    (`["job"]["settings"]`, each with its `deciding_rank`), and each rank's own (`["ranks"]`).
    As `allocsim advise`."""
    return _json(_native(_allocsim.advise, _traces(trace), device_free=device_free, outside=outside))


def explain_oom(
    trace: Union[TraceLike, Sequence[TraceLike]],
    policy: str = "pytorch",
    alloc_conf: Optional[str] = None,
    device_total: Optional[Size] = None,
    limit: int = 20,
) -> Any:
    """Why each OOM happened (free memory, largest free block per pool, the live blocks
    fencing the largest free region with their stacks), and which settings would have avoided
    it. As `allocsim explain-oom --json`; a list of traces is a job, each rank explained."""
    return _json(
        _native(
            _allocsim.explain_oom,
            _traces(trace),
            policy=policy,
            alloc_conf=alloc_conf,
            device_total=device_total,
            limit=limit,
        )
    )


def diff(
    a: TraceLike,
    b: Optional[TraceLike] = None,
    policy: str = "pytorch",
    alloc_conf: Optional[str] = None,
    b_policy: Optional[str] = None,
    b_alloc_conf: Optional[str] = None,
    device_total: Optional[Size] = None,
    capacity: bool = True,
    html: Optional[PathLike] = None,
) -> dict[str, Any]:
    """Two runs side by side: `a` and `b` (default: `a` again, a what-if under `b_alloc_conf`
    or `b_policy`; `policy` and `alloc_conf` are both runs' unless those say otherwise). Each
    run's peaks, fragmentation, OOMs, capacity (`capacity=False` skips the search) and
    segments at its reserved peak, the `change`, the `stack_groups` whose live bytes at the
    peaks changed most, and the `first_parting_op` of the two op streams. `html` also writes
    the diff's page there. As `allocsim diff --json`."""
    return _json(
        _native(
            _allocsim.diff,
            _trace(a),
            None if b is None else _trace(b),
            policy=policy,
            alloc_conf=alloc_conf,
            b_policy=b_policy,
            b_alloc_conf=b_alloc_conf,
            device_total=device_total,
            capacity=capacity,
            html=None if html is None else os.fspath(html),
        )
    )


def fidelity(trace: Union[TraceLike, Sequence[TraceLike]]) -> str:
    """Replay a PyTorch recording in lockstep with itself: the report, ending in `exact` or
    saying where simulation and recording part. As `allocsim fidelity`; a list of traces is a
    job, exact when every rank is."""
    return _native(_allocsim.fidelity, _traces(trace))[1]


def report(
    trace: Union[TraceLike, Sequence[TraceLike]],
    out: Optional[PathLike] = None,
    policy: str = "pytorch",
    alloc_conf: Optional[str] = None,
    device_total: Optional[Size] = None,
    advice: bool = True,
) -> str:
    """Write the trace's report page (the memory timeline, segment maps, OOMs, the settings
    ranked) to `out` (default: the trace's name with `.html`, here) and return its path. A list
    of traces is a job (one per rank): its page shows each rank's peaks and need, the rank that
    decides the card and the ranks' timelines one under the other (default: the first rank's
    name with `_job.html`). As `allocsim report`."""
    return os.fspath(
        _native(
            _allocsim.report,
            _traces(trace),
            out=None if out is None else os.fspath(out),
            policy=policy,
            alloc_conf=alloc_conf,
            device_total=device_total,
            advice=advice,
        )
    )


def convert(trace: TraceLike, out: PathLike) -> None:
    """Write `trace` to `out` in the format its extension names (`.pickle[.gz]`, `.csv`,
    `.allocsim`, `.allocsim.json`); an existing file is replaced only once the new one is
    whole. As `allocsim convert`."""
    _native(_allocsim.convert, _trace(trace), os.fspath(out))


def workloads() -> dict[str, dict[str, Any]]:
    """The live workloads `load("workload:NAME?key=value")` builds: for each name, what it is
    and its parameters with their defaults."""
    return {
        name: {"description": what, "parameters": dict(params)}
        for name, what, params in _allocsim.workloads()
    }


def policies() -> list[str]:
    """The policy names `replay(policy=...)` takes, in the order reports list them. `replay`
    and `compare` also take `"offline"`: the placement of `bound` (every lifetime known in
    advance) replayed as a baseline, which is built from the whole trace, so it is no policy."""
    return list(_allocsim.policies())


