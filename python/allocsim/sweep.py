"""Sweeps: traces x policies x settings, on this machine or on a Ray cluster, as one table.

Each cell is one `allocsim compare` of one trace under one column (a policy under settings),
so a sweep's numbers are `compare`'s. A cell that fails (an unreadable trace, a setting the
policy refuses) is a row with its `error`, never lost.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

Settings = Union[Sequence[str], Mapping[str, Sequence[str]]]


def columns(policies: Sequence[str], settings: Settings) -> list[str]:
    """The compare columns: each policy under each of its settings (`""`: its defaults).
    `settings` is one list for every policy, or a list per policy name. From one list shared
    by every policy, a policy takes only the settings it has (`expandable_segments:True` is
    PyTorch's, not `bfc`'s): the others are no cell, not an error row, and a policy that has
    none of them runs under its defaults. Settings named for a policy are its cells whatever
    they are (one it refuses is a row with its `error`)."""
    from . import _allocsim

    out = []
    for policy in policies:
        if isinstance(settings, Mapping):
            mine = list(settings.get(policy, [""]) or [""])
        else:
            shared = list(settings) or [""]
            if policy in _allocsim.policies():
                refused = _allocsim.settings_refused
                mine = [s for s in shared if not s or refused(policy, s) is None] or [""]
            else:
                mine = shared  # no such policy: its cells are rows with their error
        for s in mine:
            out.append(f"{policy}[{s}]" if s else policy)
    return out


def _cell(trace: str, column: str) -> list[dict[str, Any]]:
    """One trace under one column; failures become a row with `error`."""
    import allocsim

    try:
        rows = allocsim.compare([trace], [column])
    except allocsim.AllocsimError as e:
        rows = [{"trace": trace, "column": column, "error": str(e)}]
    for row in rows:
        row.setdefault("column", column)
        row["path"] = trace
    return rows


def sweep(
    traces: Iterable[Union[str, "os.PathLike[str]"]],
    settings: Settings = ("",),
    policies: Sequence[str] = ("pytorch",),
    engine: str = "local",
    address: Optional[str] = None,
) -> Any:
    """Run every trace under every policy and setting; one row per cell, as `allocsim
    compare --json` gives it, plus `column` (the `policy[settings]` it ran) and `path`.

    `engine="local"` runs the cells here one after another (each `compare` already uses every
    core); `engine="ray"` runs them as Ray tasks, on the cluster at `address` if given
    (`"auto"`, `"ray://host:10001"`; the trace paths must be readable on every node, as on a
    shared file system), else on a local Ray instance started for the sweep. The
    table is a pandas DataFrame if pandas is installed (nullable dtypes: a failed cell's
    figures are `<NA>`), else a list of dicts."""
    paths = [os.fspath(t) for t in traces]
    cells = [(t, c) for t in paths for c in columns(policies, settings)]
    if engine == "local":
        results = [_cell(t, c) for t, c in cells]
    elif engine == "ray":
        results = _on_ray(cells, address)
    else:
        raise ValueError(f"engine must be 'local' or 'ray', not {engine!r}")
    rows = [row for cell in results for row in cell]
    try:
        import pandas as pd
    except ImportError:
        return rows
    # Nullable dtypes: a failed cell leaves its figures missing without turning every other
    # cell's integers into floats.
    return pd.DataFrame(rows).convert_dtypes()


def _on_ray(cells: list[tuple[str, str]], address: Optional[str]) -> list[list[dict[str, Any]]]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(_cell)
        futures = [remote.remote(t, c) for t, c in cells]
        out = []
        for (trace, column), future in zip(cells, futures):
            try:
                out.append(ray.get(future))
            except Exception as e:  # a worker that died: the cell is reported, not lost
                out.append([{"trace": trace, "column": column, "path": trace, "error": repr(e)}])
        return out
    finally:
        if started:
            ray.shutdown()
