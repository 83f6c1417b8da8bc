"""Issue 49 item 4: the allocator settings read from the environment as PyTorch reads them.
PyTorch 2.12 and later also read PYTORCH_ALLOC_CONF, the device-generic name, but only when
PYTORCH_CUDA_ALLOC_CONF is unset (c10/cuda/CUDAAllocatorConfig.h; docs/pytorch-versions.md).
Needs neither torch nor the native module."""
import importlib.util
import pathlib

# allocsim.capture by path: importing the package would load the native module.
_spec = importlib.util.spec_from_file_location(
    "allocsim_capture", pathlib.Path(__file__).parents[1] / "allocsim" / "capture.py")
capture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(capture)


def test_cuda_name_wins_over_the_generic_one():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    assert capture.alloc_conf_from_env(env) == ("expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF")


def test_generic_name_alone_is_read():
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "OTHER": "x"}
    assert capture.alloc_conf_from_env(env) == ("max_split_size_mb:64", "PYTORCH_ALLOC_CONF")


def test_an_empty_cuda_setting_still_shadows_the_generic_one():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    assert capture.alloc_conf_from_env(env) == ("", "PYTORCH_CUDA_ALLOC_CONF")


def test_none_set_is_the_defaults():
    assert capture.alloc_conf_from_env({}) == ("", None)
