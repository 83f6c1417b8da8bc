"""The Python package against the CLI it wraps: same numbers, key for key; errors as exceptions
that name the file and the place; sweeps on a local Ray instance equal to `allocsim compare`.

Needs the `allocsim` binary of the same checkout (`cargo build --release -p allocsim-cli`, or
ALLOCSIM_BIN): the CLI is the reference the package is held to.
"""

import gzip
import json
import os
import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import allocsim
from allocsim.sweep import columns as sweep_columns

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "traces"
GPT2 = TRACES / "pytorch-2.11-h100" / "gpt2_train.pickle.gz"
OOM = TRACES / "pytorch-2.11-h100-user" / "c_train_oom.pickle.gz"


def cli_json(*argv):
    binary = os.environ.get("ALLOCSIM_BIN", str(ROOT / "target" / "release" / "allocsim"))
    if not Path(binary).exists():
        pytest.fail(f"no allocsim binary at {binary}: cargo build --release -p allocsim-cli")
    out = subprocess.run([binary, *map(str, argv), "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_replay_is_the_cli_key_for_key():
    for conf in ["", "expandable_segments:True"]:
        result = allocsim.replay(str(GPT2), alloc_conf=conf or None, check=True)
        argv = ["replay", GPT2, "--check"] + (["--alloc-conf", conf] if conf else [])
        expected = cli_json(*argv)
        assert result.raw == expected
        assert result.memory_stats == expected["memory_stats"]
        assert len(result.memory_stats) == 122
        assert result.memory_stats["reserved_bytes.all.peak"] == result.peak_reserved_bytes


def test_a_replay_with_ooms_explains_them():
    result = allocsim.replay(allocsim.load(OOM))
    assert result.ooms, "the recording ran out of memory"
    first = result.ooms[0]
    for key in ["rounded_bytes", "device_free_bytes", "reserved_but_unallocated_bytes"]:
        assert key in first
    explained = allocsim.explain_oom(OOM)
    assert explained == cli_json("explain-oom", OOM)


def test_timeline_and_html():
    result = allocsim.replay(GPT2, policy="bfc")
    t = result.timeline
    assert t["op"].dtype.kind == "i" and len(t["op"]) == len(t["reserved_bytes"]) > 100
    assert t["reserved_bytes"].max() == result.peak_reserved_bytes
    assert (t["allocated_bytes"] <= t["reserved_bytes"]).all()
    page = result._repr_html_()
    assert "bfc" in page
    svg = ET.fromstring(page[page.index("<svg"):])  # well-formed: the plot draws
    assert [c.tag.split("}")[1] for c in svg] == ["title", "polygon", "polyline"]
    assert "gpt2_train" in allocsim.load(GPT2)._repr_html_()


def test_load_says_what_info_says():
    trace = allocsim.load(GPT2)
    assert dict(trace.info) == cli_json("info", GPT2)
    assert trace.format == "pytorch-snapshot" and trace.ops == 12355
    assert os.fspath(trace) == str(GPT2)


def test_capacity_and_advise_are_the_cli():
    small = TRACES / "pytorch-2.11-h100" / "resnet50_train.pickle.gz"
    assert allocsim.capacity(small) == cli_json("capacity", small)
    got = allocsim.advise(small, device_free="3GiB")
    assert got == cli_json("advise", small, "--device-free", "3GiB")


def test_advise_and_report_take_a_job(tmp_path):
    """A list of traces is a job of per-rank recordings, as several paths are to the CLI."""
    ranks = sorted((TRACES / "pytorch-2.11-h200-ranks").glob("ddp_rank*.pickle.gz"))
    assert len(ranks) >= 2
    got = allocsim.advise([allocsim.load(ranks[0]), *ranks[1:]])
    assert got == cli_json("advise", *ranks)
    assert all("deciding_rank" in s for s in got["job"]["settings"])
    page = Path(allocsim.report(ranks, out=tmp_path / "job.html")).read_text()
    assert 'id="timelines"' in page and all(r.name in page for r in ranks)
    with pytest.raises(allocsim.UsageError):
        allocsim.advise([])


def test_capacity_explain_oom_and_fidelity_take_a_job():
    ranks = sorted((TRACES / "pytorch-2.11-h200-ranks").glob("fsdp2_rank*.pickle.gz"))
    got = allocsim.capacity(ranks)
    assert got == cli_json("capacity", *ranks)
    needs = {r["rank"]: r["capacity_bytes"] for r in got["ranks"]}
    assert got["job"]["capacity_bytes"] == max(needs.values())
    assert needs[got["job"]["deciding_rank"]] == max(needs.values())
    assert allocsim.explain_oom(ranks) == cli_json("explain-oom", *ranks)
    assert allocsim.fidelity(ranks).rstrip().endswith("exact")


def test_bound_is_the_cli_and_below_every_policy():
    got = allocsim.bound(GPT2)
    assert got == cli_json("bound", GPT2)
    assert got["bound_bytes"] <= got["offline_bytes"] <= got["policy_peak_reserved_bytes"]
    expandable = allocsim.bound(GPT2, alloc_conf="expandable_segments:True")
    assert expandable["bound_bytes"] == got["bound_bytes"], "the bound is the trace's, not the policy's"


def test_diff_is_the_cli(tmp_path):
    conf = "expandable_segments:True"
    what_if = allocsim.diff(GPT2, b_alloc_conf=conf)
    assert what_if == cli_json("diff", GPT2, "--b-alloc-conf", conf)
    assert what_if["b"]["peak_reserved_bytes"] == allocsim.replay(GPT2, alloc_conf=conf).peak_reserved_bytes
    assert what_if["first_parting_op"] is None and what_if["stack_groups"]
    # A loaded trace, and two traces: the same as paths.
    trace = allocsim.load(GPT2)
    assert allocsim.diff(trace, b_alloc_conf=conf) == what_if
    two = allocsim.diff(trace, OOM, capacity=False)
    assert two == cli_json("diff", GPT2, OOM, "--no-capacity")
    assert two["first_parting_op"]["op"] == 0 and two["a"]["capacity"] is None
    page = tmp_path / "diff.html"
    assert allocsim.diff(GPT2, OOM, capacity=False, html=page) == two
    assert "<title>allocsim diff: gpt2_train vs c_train_oom</title>" in page.read_text()
    with pytest.raises(allocsim.FileError, match="nowhere.pickle.gz"):
        allocsim.diff(GPT2, "/nonexistent/nowhere.pickle.gz", capacity=False)
    with pytest.raises(allocsim.SettingsError):
        allocsim.diff(GPT2, b_alloc_conf="expandable_segments:Maybe", capacity=False)


def test_compare_is_the_cli():
    cols = ["pytorch", "bfc[allow_growth:false]"]
    assert allocsim.compare([GPT2], cols) == cli_json("compare", GPT2, "--policy", ",".join(cols))


def test_errors_are_exceptions_naming_the_file_and_place(tmp_path):
    damaged = tmp_path / "damaged.pickle.gz"
    good = gzip.open(GPT2).read()
    damaged.write_bytes(gzip.compress(good[: len(good) // 2]))
    with pytest.raises(allocsim.TraceError) as e:
        allocsim.load(damaged)
    assert str(damaged) in str(e.value) and "byte" in str(e.value)

    with pytest.raises(allocsim.FileError):
        allocsim.load(tmp_path / "missing.pickle")
    with pytest.raises(allocsim.SettingsError) as e:
        allocsim.replay(GPT2, alloc_conf="max_split_size_mb:banana")
    assert "max_split_size_mb" in str(e.value)
    with pytest.raises(allocsim.SettingsError) as e:
        allocsim.replay(GPT2, policy="no_such_policy")
    assert "known policies: pytorch" in str(e.value)
    with pytest.raises(allocsim.UsageError) as e:
        allocsim.replay(GPT2, device_free="lots")
    assert "lots" in str(e.value)
    assert issubclass(allocsim.TraceError, allocsim.AllocsimError)


class Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_raises_and_never_executes(tmp_path):
    marker = tmp_path / "executed"
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "device_traces": [[Boom(marker)]]}))
    with pytest.raises(allocsim.TraceError):
        allocsim.replay(hostile)
    assert not marker.exists()


def test_no_spelling_of_a_path_or_value_is_read_as_an_option(tmp_path, monkeypatch):
    """Issue 50: paths went on the command line with no `--` before them, so
    `compare(["t.pickle.gz", "--html=/some/file"])` wrote that file and `load("--help")`
    returned the help text. Every function that takes a path is tried with paths and values
    spelled as options; each must look for a file of that name, and write nothing."""
    monkeypatch.chdir(tmp_path)
    written = tmp_path / "written.html"
    as_option = f"--html={written}"
    for path in ["--help", as_option, "-h", "--version"]:
        calls = {
            "load": lambda: allocsim.load(path),
            "replay": lambda: allocsim.replay(path),
            "compare": lambda: allocsim.compare([GPT2, path]),
            "capacity": lambda: allocsim.capacity(path),
            "advise": lambda: allocsim.advise(path),
            "explain_oom": lambda: allocsim.explain_oom(path),
            "fidelity": lambda: allocsim.fidelity(path),
        }
        for name, call in calls.items():
            with pytest.raises(allocsim.FileError) as error:
                call()
            assert path in str(error.value), (name, path, str(error.value))
            assert not written.exists(), (name, path)
    # A value is a value, whatever it starts with.
    with pytest.raises(allocsim.SettingsError, match="unknown policy"):
        allocsim.replay(GPT2, policy=as_option)
    with pytest.raises(allocsim.SettingsError, match="PYTORCH_CUDA_ALLOC_CONF \"--help\""):
        allocsim.replay(GPT2, alloc_conf="--help")
    with pytest.raises(allocsim.SettingsError, match="unknown policy"):
        allocsim.compare(GPT2, policies=["--help"])
    assert not written.exists()
    assert sorted(os.listdir(tmp_path)) == []


def test_a_replay_runs_in_a_thread_with_a_small_stack():
    """Issue 50: `replay` in a Python thread of 64 KiB of stack (`threading.stack_size`)
    crashed the interpreter (a segfault: it runs in a child here). Commands now run on a
    thread of their own."""
    script = (
        "import threading, allocsim\n"
        "threading.stack_size(64 * 1024)\n"
        "out = []\n"
        f"t = threading.Thread(target=lambda: out.append(allocsim.replay({str(GPT2)!r})))\n"
        "t.start(); t.join()\n"
        "print(out[0].peak_reserved_bytes)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert int(child.stdout) == allocsim.replay(GPT2).peak_reserved_bytes


def every_function(trace, **named):
    """Every function that takes a trace, called on `trace` with `named` where it takes them."""
    takes = {
        "load": lambda t, **k: allocsim.load(t),
        "replay": allocsim.replay,
        "compare": lambda t, **k: allocsim.compare([t], policies="pytorch", capacity=False, **k),
        "capacity": allocsim.capacity,
        "advise": allocsim.advise,
        "bound": allocsim.bound,
        "explain_oom": allocsim.explain_oom,
        "fidelity": lambda t, **k: allocsim.fidelity(t),
        "report": lambda t, **k: allocsim.report(t, out="never.html", **k),
        "convert": lambda t, **k: allocsim.convert(t, "never.allocsim"),
    }
    import inspect

    for name, f in takes.items():
        params = inspect.signature(getattr(allocsim, name)).parameters
        yield name, (lambda f=f, params=params: f(trace, **{k: v for k, v in named.items() if k in params}))


def test_wrong_types_bad_sizes_missing_and_hostile_files_are_python_exceptions(tmp_path, monkeypatch):
    """Issue 48: every function, given what it cannot take, raises the package's exception
    with a message written for Python: the keyword's name, never a flag or clap's help."""
    monkeypatch.chdir(tmp_path)
    for name, call in every_function(42):
        with pytest.raises(TypeError, match="expected an allocsim.Trace or a path|expected a str"):
            call()
    missing = tmp_path / "missing.pickle.gz"
    for name, call in every_function(missing):
        with pytest.raises(allocsim.FileError) as e:
            call()
        assert str(missing) in str(e.value), name
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(b"\x80\x04\x95" + bytes(range(256)) * 4)
    for name, call in every_function(hostile):
        with pytest.raises(allocsim.TraceError) as e:
            call()
        assert str(hostile) in str(e.value), name
    trace = allocsim.load(GPT2)
    sized = {"replay": "device_free", "capacity": "outside", "advise": "device_free",
             "explain_oom": "device_total", "compare": "device_total", "report": "device_total"}
    for name, keyword in sized.items():
        f = dict(every_function(trace, **{keyword: "lots"}))[name]
        with pytest.raises(allocsim.UsageError) as e:
            f()
        message = str(e.value)
        assert message.startswith(f"{keyword}:") and "lots" in message, (name, message)
        assert "--" not in message and "help" not in message, (name, message)
        for bad, error in [(-1, allocsim.UsageError), (2**64, allocsim.UsageError),
                           (1.5, allocsim.UsageError), (True, TypeError), ([1], TypeError)]:
            with pytest.raises(error, match=keyword):
                dict(every_function(trace, **{keyword: bad}))[name]()
    assert issubclass(allocsim.UsageError, ValueError)
    with pytest.raises(allocsim.UsageError, match="memory_fraction=2"):
        allocsim.replay(trace, memory_fraction=2.0)
    with pytest.raises(allocsim.UsageError, match="device="):
        allocsim.replay(trace, device="tpu")
    with pytest.raises(TypeError):
        allocsim.replay(trace, check="yes please", seed="zero")
    # Sizes as ints, floats of whole bytes and strings are one size.
    as_int = allocsim.replay(trace, device_free=40 * 2**30).raw
    assert allocsim.replay(trace, device_free="40GiB").raw == as_int
    assert allocsim.replay(trace, device_free=float(40 * 2**30)).raw == as_int
    assert sorted(os.listdir(tmp_path)) == ["hostile.pickle"]


def test_a_loaded_trace_is_read_once_and_gives_what_a_path_gives(tmp_path):
    trace = allocsim.load(GPT2)
    assert len(trace) == trace.ops == trace.info["ops"]
    first = trace.op_list(0, 3)
    assert [op["action"] for op in first][0] == "alloc" and "size" in first[0]
    assert trace.op_list(len(trace) - 1) == trace.op_list()[-1:]
    frames = trace.stack(0)
    assert frames and all(isinstance(f, tuple) and len(f) == 3 for f in frames)
    assert allocsim.replay(trace, check=True).raw == allocsim.replay(GPT2, check=True).raw
    assert allocsim.bound(trace) == allocsim.bound(GPT2)
    assert "exact" in allocsim.fidelity(trace)
    out = tmp_path / "gpt2.allocsim"
    allocsim.convert(trace, out)
    assert allocsim.load(out).ops == trace.ops + 0
    page = allocsim.report(trace, out=tmp_path / "page.html", advice=False)
    assert Path(page).read_text().startswith("<!DOCTYPE html>")
    assert set(allocsim.workloads()) >= {"transformer-train"}


def test_threads_run_calls_side_by_side():
    """Issue 48: the GIL is released while a call runs (Python code runs beside it), and two
    threads replaying two traces at once give what one after the other gives. How much
    sooner they finish on two cores is measured in benches/README.md, not here."""
    import threading

    traces = [allocsim.load(GPT2), allocsim.load(OOM)]
    one_by_one = [allocsim.replay(t, check=True).raw for t in traces]
    results = [None, None]

    def run(i):
        results[i] = allocsim.replay(traces[i], check=True).raw

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    beside = 0
    while any(t.is_alive() for t in threads):
        beside += 1
    for t in threads:
        t.join()
    assert results == one_by_one
    assert beside > 1000, "Python ran while the replays ran"


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Issue 50: a FIFO named `*.pickle` blocked forever; it is refused by name."""
    fifo = tmp_path / "t.pickle"
    os.mkfifo(fifo)
    with pytest.raises(allocsim.FileError, match="t.pickle: not a regular file \\(a FIFO\\)"):
        allocsim.load(fifo)


def test_the_readme_names_what_the_package_has():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    listed = section.split("prints with `--json`:", 1)[1].split(".\n", 1)[0]
    names = [n for n in listed.replace("`", " ").replace(",", " ").split() if n.isidentifier()]
    functions = [n for n in names if n in allocsim.__all__ or hasattr(allocsim, n)]
    calls = {n for n in allocsim.__all__ if n[0].islower()} - {"sweep", "capture", "estimate", "policies"}
    assert calls <= set(functions), calls - set(functions)
    for error in ["TraceError", "SettingsError", "UsageError", "FileError", "AllocsimError"]:
        assert f"`{error}`" in section or f"`allocsim.{error}`" in section
        assert error in allocsim.__all__
    for name in ["sweep", "capture"]:
        assert f"allocsim.{name}" in readme and callable(getattr(allocsim, name))


def test_importing_allocsim_needs_no_torch():
    code = "import sys, allocsim; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


SETTINGS = {
    "pytorch": ["", "expandable_segments:True", "max_split_size_mb:128"],
    "bfc": ["", "allow_growth:false", "garbage_collection:false"],
    "allocsim": ["", "headroom:0", "headroom:max"],
}
KEYS = ["peak_reserved_bytes", "peak_allocated_bytes", "ooms", "min_feasible_capacity_bytes",
        "device_calls", "fragmentation_at_peak", "checker_violations"]


def table(rows):
    """(path, column) -> row, without the figures a cell does not have (pandas: <NA>)."""
    if hasattr(rows, "to_dict"):
        import pandas as pd

        assert rows["peak_reserved_bytes"].dtype == "Int64", "integers stay integers"
        rows = [{k: v for k, v in r.items() if not pd.isna(v)} for r in rows.to_dict("records")]
    return {(r["path"], r["column"]): r for r in rows}


def test_sweep_on_local_ray_equals_compare():
    pytest.importorskip("ray", reason="ray is not installed (pip install ./python[test])")
    traces = sorted(str(p) for p in TRACES.glob("*/*.pickle.gz"))
    assert len(traces) >= 38
    columns = sweep_columns(list(SETTINGS), SETTINGS)
    assert len(columns) == 9
    got = table(allocsim.sweep(traces, SETTINGS, list(SETTINGS), engine="ray"))
    assert len(got) == len(traces) * 9
    expected = cli_json("compare", *traces, "--policy", ",".join(columns))
    assert len(expected) == len(got)
    by_cell = {}
    for row in expected:
        by_cell.setdefault(row["trace"], []).append(row)
    for t in traces:
        name = Path(t).name.removesuffix(".pickle.gz")
        for column, want in zip(columns, by_cell[name]):
            have = got[(t, column)]
            assert "error" not in have, have
            for key in KEYS:
                assert have.get(key) == want[key], (t, column, key)


def test_a_failed_cell_is_reported_not_lost():
    rows = table(allocsim.sweep([GPT2, "/no/such.pickle"], {"bfc": ["", "nonsense:1"]}, ["bfc"]))
    assert len(rows) == 4
    assert "error" not in rows[(str(GPT2), "bfc")]
    assert "nonsense" in rows[(str(GPT2), "bfc[nonsense:1]")]["error"]
    assert "/no/such.pickle" in rows[("/no/such.pickle", "bfc")]["error"]


def test_shared_settings_go_only_to_the_policies_that_have_them():
    """Issue 49: one list of settings for every policy gave error rows for the settings a
    policy does not have; now those are no cell, and a policy with none runs its defaults."""
    cols = sweep_columns(["pytorch", "bfc"], ["", "expandable_segments:True"])
    assert cols == ["pytorch", "pytorch[expandable_segments:True]", "bfc"]
    assert sweep_columns(["bfc"], ["expandable_segments:True"]) == ["bfc"]
    assert sweep_columns(["no_such"], ["x:1"]) == ["no_such[x:1]"]
    rows = allocsim.sweep([GPT2], ["expandable_segments:True"], ["pytorch", "bfc"])
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert [r["column"] for r in rows] == ["pytorch[expandable_segments:True]", "bfc"]
    assert not any(isinstance(r.get("error"), str) for r in rows), rows


def test_capture_command_helps_and_says_what_it_needs(tmp_path):
    """Issue 49: `python -m allocsim.capture --help` warned and exited 1; capture without torch
    gave a bare traceback."""
    run = lambda *argv, pre="": subprocess.run(  # noqa: E731
        [sys.executable, "-c", pre + "import runpy, sys; sys.argv = ['capture', *sys.argv[1:]]; "
         "runpy.run_module('allocsim.capture', run_name='__main__', alter_sys=True)", *argv],
        capture_output=True, text=True, cwd=tmp_path)
    helped = subprocess.run([sys.executable, "-m", "allocsim.capture", "--help"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0 and "OUT.pickle.gz -- SCRIPT.py" in helped.stdout, helped
    assert helped.stderr == "", helped.stderr
    (tmp_path / "s.py").write_text("print('ran')\n")
    no_torch = run("out.pickle.gz", "--", "s.py", pre="import sys; sys.modules['torch'] = None; ")
    assert no_torch.returncode == 2, no_torch
    assert "PyTorch, which is not installed here" in no_torch.stderr, no_torch.stderr
    assert "Traceback" not in no_torch.stderr
    bad = subprocess.run([sys.executable, "-m", "allocsim.capture", "out.pickle.gz"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "expected OUT.pickle.gz -- SCRIPT.py" in bad.stderr, bad


def test_capture_reproduces_exactly_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch", reason="capture needs torch: run on the GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("capture needs a CUDA GPU: run on the GPU machine")
    out = tmp_path / "captured.pickle.gz"
    with allocsim.capture(out, max_entries=100_000):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(5):
            loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        del model, opt, loss
        torch.cuda.empty_cache()
    assert (tmp_path / "captured.json").exists()
    result = allocsim.replay(out)
    assert result.recorded_stats_match is True, result.recorded_stats_differences
    assert allocsim.fidelity(out).strip().endswith("exact")


def test_capture_names_each_rank_and_records_the_calls_a_snapshot_cannot_show():
    """Issues 51 and 49: under torchrun each rank writes its own snapshot; `empty_cache()` and
    `set_per_process_memory_fraction()` are recorded with their place (allocations and frees
    so far), on a stand-in for torch.cuda (no GPU here)."""
    from types import SimpleNamespace
    from allocsim.capture import _Calls, rank_from_env, rank_path

    assert rank_from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}) == (3, 1, 4)
    assert rank_from_env({}) == (None, None, None)
    assert rank_path("out/run.pickle.gz", 1) == "out/run_rank1.pickle.gz"
    assert rank_path("run.pickle", 0) == "run_rank0.pickle"
    assert rank_path("r{rank}/run.pickle.gz", 2) == "r2/run.pickle.gz"
    assert rank_path("run.pickle.gz", None) == "run.pickle.gz"

    done, counts = [], {"allocation.all.allocated": 5, "allocation.all.freed": 2}
    memory = SimpleNamespace(
        empty_cache=lambda: done.append("empty"),
        set_per_process_memory_fraction=lambda f, d=None: done.append(("fraction", f, d)))
    cuda = SimpleNamespace(
        memory=memory, memory_stats=lambda device: dict(counts),
        empty_cache=memory.empty_cache,
        set_per_process_memory_fraction=memory.set_per_process_memory_fraction,
        _utils=SimpleNamespace(_get_device_index=lambda d, optional=False: 0 if d is None else d))
    destroyed = []
    dist = SimpleNamespace(destroy_process_group=lambda: destroyed.append(True))
    cuda.mem_get_info = lambda device: (100, 1000)
    cuda.memory_reserved = lambda device: 40
    fake = SimpleNamespace(cuda=cuda, distributed=dist)
    with _Calls(fake, 0) as calls:
        fake.distributed.destroy_process_group()
        fake.cuda.empty_cache()
        counts["allocation.all.allocated"] = 9
        fake.cuda.memory.set_per_process_memory_fraction(0.5)
        fake.cuda.set_per_process_memory_fraction(0.25, 1)  # another GPU: not this trace's
    assert done == ["empty", ("fraction", 0.5, None), ("fraction", 0.25, 1)]
    assert calls.calls == [
        {"call": "empty_cache", "allocations": 5, "frees": 2},
        {"call": "set_per_process_memory_fraction", "fraction": 0.5, "allocations": 9, "frees": 2},
    ]
    assert fake.cuda.empty_cache is memory.empty_cache is not None and done  # restored
    assert cuda.memory.empty_cache.__name__ == "<lambda>"
    # NCCL's buffers go with the process group: free memory is measured before they do.
    assert destroyed == [True] and calls.before_destroy == (100, 40)
    assert dist.destroy_process_group.__name__ == "<lambda>"


def test_the_offline_placement_replays_as_a_baseline():
    """Issue 53: `replay(policy="offline")` gives the offline placement's run: its peak is the
    placement `bound` computes, and the independent checker finds nothing."""
    result = allocsim.replay(GPT2, policy="offline", check=True)
    assert result.peak_reserved_bytes == allocsim.bound(GPT2)["offline_bytes"]
    assert result.checker_violations == 0
    assert "offline" not in allocsim.policies()
