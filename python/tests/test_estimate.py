"""allocsim.estimate on a machine without a GPU: real programs on the simulated device. Needs
PyTorch (CI installs it); without it every test here is reported as skipped."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="allocsim.estimate needs PyTorch (pip install torch)")
import allocsim  # noqa: E402
from allocsim.estimate import parse_size  # noqa: E402

GIB = 1 << 30


def train_mlp(report=None):
    """A small model trained for two steps with bf16 autocast and AdamW, on the GPU."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        x = torch.randn(64, 512, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if report:
        props = torch.cuda.get_device_properties(0)
        with open(report, "w") as f:
            json.dump({"available": torch.cuda.is_available(), "total": props.total_memory,
                       "cc": list(torch.cuda.get_device_capability()), "is_cuda": x.is_cuda,
                       "allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                       "free": torch.cuda.mem_get_info()[0], "grad": model[0].weight.grad is None}, f)


def catch_oom(report):
    try:
        torch.empty(3 * GIB, dtype=torch.uint8, device="cuda")
        caught = None
    except torch.OutOfMemoryError as e:
        caught = str(e)
    small = torch.empty(1 << 20, device="cuda")  # the program goes on after it
    with open(report, "w") as f:
        json.dump({"caught": caught, "ooms": torch.cuda.memory_stats()["num_ooms"], "small": small.numel()}, f)


def uncaught_oom():
    keep = [torch.empty(GIB // 2, dtype=torch.uint8, device="cuda") for _ in range(4)]
    return keep


def needs_values():
    x = torch.randn(8, device="cuda")
    return x.sum().item()


def tied_and_scaled(report, tie=True):
    """A language model whose output layer shares the embedding's weight (unless not `tie`),
    trained in fp16 with a GradScaler."""
    emb = torch.nn.Embedding(4096, 1024)
    head = torch.nn.Linear(1024, 4096, bias=False)
    if tie:
        head.weight = emb.weight
    model = torch.nn.Sequential(emb, head).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for _ in range(2):
        idx = torch.randint(0, 4096, (8, 16), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(idx).view(-1, 4096).float(), idx.view(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    with open(report, "w") as f:
        json.dump({"params": len(list(model.parameters())), "allocated": torch.cuda.memory_allocated()}, f)


def test_tied_weights_stay_tied_and_the_gradscalers_check_is_an_assumption_said(tmp_path):
    tied = allocsim.estimate(tied_and_scaled, str(tmp_path / "tied.json"), total_memory="H200")
    assert tied.fits, tied.error
    assert tied.assumed == ["GradScaler: gradients finite at every step (2 times)"]
    untied = allocsim.estimate(tied_and_scaled, str(tmp_path / "untied.json"), False, total_memory="H200")
    tied, untied = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("tied", "untied"))
    # Moved to the GPU once, the tied weight stays one parameter of 16 MiB; untied, two.
    assert (tied["params"], untied["params"]) == (1, 2)
    assert untied["allocated"] - tied["allocated"] == 4096 * 1024 * 4


def test_a_training_program_runs_on_the_simulated_card_and_sees_it(tmp_path):
    report = tmp_path / "seen.json"
    result = allocsim.estimate(train_mlp, str(report), total_memory="H100-80GB")
    seen = json.loads(report.read_text())
    assert seen["available"] and seen["is_cuda"] and seen["cc"] == [9, 0]
    assert seen["total"] == 85017493504
    assert seen["grad"], "zero_grad(set_to_none=True) left no gradient"
    assert 0 < seen["allocated"] <= seen["reserved"]
    assert seen["free"] == 85017493504 - 552402944 - seen["reserved"]
    assert result.fits and result.error is None
    # The result is the replay of the estimated op stream: the same peaks as the live run.
    assert result.replay.peak_reserved_bytes == result.peak_reserved_bytes > 0
    assert result.replay.memory_stats["allocated_bytes.all.peak"] == result.peak_allocated_bytes
    # Adam's two states, the parameters and their gradients are all alive at the peak.
    params = (512 * 2048 * 2 + 2048 + 512) * 4
    assert result.peak_allocated_bytes >= 4 * params


def test_an_oom_in_the_simulation_is_torchs_oom_in_the_program(tmp_path):
    report = tmp_path / "oom.json"
    result = allocsim.estimate(catch_oom, str(report), total_memory="2GiB")
    seen = json.loads(report.read_text())
    assert seen["caught"] and "out of memory" in seen["caught"] and "3.00 GiB" in seen["caught"]
    assert seen["ooms"] == 1 and seen["small"] == 1 << 20
    assert result.fits, "the program caught its OOM and finished"
    assert result.memory_stats["num_ooms"] == 1


def test_an_uncaught_oom_ends_the_run_and_says_so():
    result = allocsim.estimate(uncaught_oom, total_memory="1.5GiB", free_memory="1.5GiB")
    assert not result.fits
    assert "OutOfMemoryError" in result.error and "Tried to allocate 512.00 MiB" in result.error
    assert result.peak_allocated_bytes == 3 * (GIB // 2), "three fit, the fourth does not"


def test_a_program_that_needs_tensor_values_stops_naming_the_op_and_the_line():
    with pytest.raises(allocsim.DataDependentError) as e:
        allocsim.estimate(needs_values)
    text = str(e.value)
    assert "_local_scalar_dense" in text and "test_estimate.py" in text and "in needs_values" in text


def test_the_command_runs_a_script_and_writes_a_snapshot_that_allocsim_reads(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.randn(1024, 1024, device='cuda')\ny = x @ x\n"
                      "z = torch.nn.functional.linear(x, x, torch.zeros(1024, device='cuda'))\nprint('done')\n")
    out = tmp_path / "run.pickle.gz"
    run = subprocess.run([sys.executable, "-m", "allocsim.estimate", "--total-memory", "H200", "--out", str(out),
                          "--json", "--", str(script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout[run.stdout.index("{\n"):])
    # x, the product and cuBLAS's workspace (32 MiB); then the bias, the linear layer's output
    # and, as a product with a bias goes through cuBLASLt, cuBLASLt's workspace (1 MiB).
    assert summary["peak_allocated_bytes"] == 3 * (4 << 20) + (32 << 20) + 4096 + (1 << 20)
    sidecar = json.loads((tmp_path / "run.json").read_text())
    assert sidecar["meta"]["estimated"] and sidecar["meta"]["card"] == "H200"
    replayed = allocsim.replay(str(out))
    assert replayed.peak_allocated_bytes == summary["peak_allocated_bytes"]


def test_bad_sizes_are_refused_clearly():
    assert parse_size("80GiB") == 80 << 30 and parse_size("H100") == 85017493504 and parse_size(4e10) == 40_000_000_000
    for bad in ("lots", "-1GiB", "80 parsecs"):
        with pytest.raises(ValueError, match="neither a size"):
            parse_size(bad)
    with pytest.raises(TypeError):
        parse_size([1])
    with pytest.raises(ValueError, match="more than total_memory"):
        allocsim.estimate(train_mlp, total_memory="1GiB", free_memory="2GiB")
    run = subprocess.run([sys.executable, "-m", "allocsim.estimate", "--total-memory", "huge", "--", "x.py"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "neither a size" in run.stderr
