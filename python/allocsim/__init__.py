"""allocsim from Python: replay PyTorch memory snapshots (and RMM logs, native traces, live
workloads) through GPU allocator policies.

    import allocsim
    trace = allocsim.load("run.pickle.gz")
    result = allocsim.replay(trace, alloc_conf="expandable_segments:True")
    result.memory_stats["reserved_bytes.all.peak"]

Every function runs the `allocsim` command of the same name in-process (the native module is
the command-line tool's library) and reads the JSON it prints, so a result here and the CLI's
`--json` are the same numbers, key for key. Importing allocsim needs no torch; `capture` does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from . import _allocsim
from .capture import capture
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
    "fidelity",
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


def _cli(command: str, paths: Sequence[str], **options: Any) -> str:
    """Run `allocsim COMMAND --OPTION=VALUE... -- PATH...` in-process and return what it
    printed; raise on failure. Each option is one `--flag=value` word and the paths come after
    `--`, so no spelling of a path or a value is read as another option: `load("--help")`
    looks for a file of that name, and a path `--html=x` writes nothing. (A replay whose
    checker found violations exits 1 and still prints its report: the result says so in
    `checker_violations`.)"""
    argv = [command, *_options(**options), "--", *paths]
    _status, out, error = _allocsim.run(argv)
    if error is not None:
        kind, message = error
        raise _ERRORS.get(kind, AllocsimError)(message)
    return out


def _json(command: str, paths: Sequence[str], **options: Any) -> Any:
    return json.loads(_cli(command, paths, json=True, **options))


def _size(value: Size) -> str:
    """A size as the CLI takes it: bytes, `40GiB`, `40GB` or `4e10`."""
    if isinstance(value, bool):
        raise UsageError(f"a size, not {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _options(**named: Any) -> list[str]:
    """`--flag=value` for each named option that is set (`--flag` alone for a switch): one
    word each, so a value that starts with `-` is still the value."""
    argv: list[str] = []
    for name, value in named.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        argv.append(flag if value is True else f"{flag}={value}")
    return argv


@dataclass(frozen=True)
class Trace:
    """A trace file allocsim can read, with what `allocsim info` says of it."""

    path: str
    info: Mapping[str, Any] = field(repr=False)

    @property
    def format(self) -> str:
        return self.info["format"]

    @property
    def ops(self) -> int:
        """Operations replayed: allocations, frees, `empty_cache` calls, ..."""
        return self.info["ops"]

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

    def _repr_html_(self) -> str:
        from ._html import trace_html

        return trace_html(self)


TraceLike = Union[Trace, PathLike]


def _path(trace: TraceLike) -> str:
    return os.fspath(trace)


def load(path: PathLike) -> Trace:
    """Read a trace (a PyTorch snapshot `.pickle`/`.pickle.gz`, an RMM log `.csv`, a native
    `.allocsim`/`.allocsim.json`, or `workload:NAME?key=value` for a live workload) and say
    what it holds. Raises `TraceError` naming the file and the place if it cannot."""
    path = os.fspath(path)
    return Trace(path, _json("info", [path]))


@dataclass(frozen=True)
class ReplayResult:
    """One replay: `memory_stats` under PyTorch's key names, peaks, OOMs with the figures that
    explain them, fragmentation, and the timeline. `raw` is `allocsim replay --json` whole."""

    raw: Mapping[str, Any] = field(repr=False)

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
) -> ReplayResult:
    """Replay `trace` through `policy` (`allocsim.policies()` lists them) under `alloc_conf`
    (for `pytorch`, a `PYTORCH_CUDA_ALLOC_CONF` string; for the others their own settings), on
    the modelled device with `device_free`/`device_total` (bytes or `"40GiB"`). `check` runs
    the independent checker over every event. The same as `allocsim replay ... --json`."""
    return ReplayResult(
        _json(
            "replay",
            [_path(trace)],
            policy=policy,
            device=device,
            alloc_conf=alloc_conf,
            device_free=None if device_free is None else _size(device_free),
            device_total=None if device_total is None else _size(device_total),
            memory_fraction=memory_fraction,
            check=check,
        )
    )


def compare(
    traces: Union[TraceLike, Sequence[TraceLike]],
    policies: Union[str, Sequence[str]] = "all",
    memory_fraction: Optional[float] = None,
) -> list[dict[str, Any]]:
    """Every column on every trace: peaks, fragmentation, OOMs, device calls, minimum feasible
    capacity, checker violations, one dict per (trace, column). A column is a policy or a
    policy under settings, `"pytorch[expandable_segments:True]"`. As `allocsim compare`."""
    if isinstance(traces, (str, os.PathLike, Trace)):
        traces = [traces]
    columns = policies if isinstance(policies, str) else ",".join(policies)
    paths = [_path(t) for t in traces]
    return _json("compare", paths, policy=columns, memory_fraction=memory_fraction)


def capacity(
    trace: TraceLike,
    alloc_conf: Optional[str] = None,
    policy: Optional[str] = None,
    outside: Optional[Size] = None,
) -> dict[str, Any]:
    """The smallest free memory at the start (as `torch.cuda.mem_get_info()` reports it once
    the context exists) on which the recorded program runs without an OOM: `capacity_bytes`,
    the band `capacity_low_bytes`..`capacity_high_bytes`, and how it was found. As `allocsim
    capacity`."""
    return _json(
        "capacity",
        [_path(trace)],
        alloc_conf=alloc_conf,
        policy=policy,
        outside=None if outside is None else _size(outside),
    )


def bound(trace: TraceLike, policy: Optional[str] = None, alloc_conf: Optional[str] = None) -> dict[str, Any]:
    """How far from the best possible: `bound_bytes` (the most bytes live at once, in whole
    pages: no allocator needs less), `offline_bytes` (a placement that knows every lifetime in
    advance), the policy's `policy_peak_reserved_bytes` and its headroom over both. As
    `allocsim bound`."""
    return _json("bound", [_path(trace)], policy=policy, alloc_conf=alloc_conf)


def advise(
    trace: TraceLike,
    device_free: Optional[Size] = None,
    outside: Optional[Size] = None,
) -> dict[str, Any]:
    """The `PYTORCH_CUDA_ALLOC_CONF` settings people try, ranked by the memory each needs, with
    peak reserved, OOMs on a card with `device_free` free, and fragmentation. As `allocsim
    advise`."""
    return _json(
        "advise",
        [_path(trace)],
        device_free=None if device_free is None else _size(device_free),
        outside=None if outside is None else _size(outside),
    )


def explain_oom(
    trace: TraceLike,
    policy: Optional[str] = None,
    alloc_conf: Optional[str] = None,
    device_total: Optional[Size] = None,
    limit: Optional[int] = None,
) -> Any:
    """Why each OOM happened (free memory, largest free block per pool, the live blocks
    fencing the largest free region with their stacks), and which settings would have avoided
    it. As `allocsim explain-oom --json`."""
    return _json(
        "explain-oom",
        [_path(trace)],
        policy=policy,
        alloc_conf=alloc_conf,
        device_total=None if device_total is None else _size(device_total),
        limit=limit,
    )


def fidelity(trace: TraceLike) -> str:
    """Replay a PyTorch recording in lockstep with itself: the report, ending in `exact` or
    saying where simulation and recording part. As `allocsim fidelity`."""
    return _cli("fidelity", [_path(trace)])


def policies() -> list[str]:
    """The policy names `replay(policy=...)` takes, in the order reports list them."""
    return list(_allocsim.policies())


