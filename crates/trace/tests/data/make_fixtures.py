"""Regenerate the pickle fixtures: python3 make_fixtures.py (from this folder)."""
import pickle

shared_frames = [{"name": "f", "filename": "a.py", "line": 3}]


def fixture(with_bytes):
    obj = {
        "none": None,
        "t": True,
        "f": False,
        "small": 7,
        "u16": 40000,
        "neg": -5,
        "i32": -2_000_000_000,
        "big": 140045260423168,
        "min": -(2**63),
        "max": 2**63 - 1,
        "float": 0.5,
        "text": "héllo ✓",
        "long_text": "x" * 300,
        "tuple": (1, 2),
        "tuple5": (1, 2, 3, 4, 5),
        "empty": [],
        "nested": [[1, [2, [3]]], {"k": (4,)}],
        "a": {"frames": shared_frames},
        "b": {"frames": shared_frames},
        "many": list(range(2500)),
    }
    if with_bytes:
        obj["bytes"] = b"\x00\x01\xff"
    return obj


for proto in (2, 3, 4, 5):
    with open(f"proto{proto}.pickle", "wb") as f:
        # Protocol 2 writes bytes through _codecs.encode (GLOBAL + REDUCE): leave them out.
        pickle.dump(fixture(proto >= 3), f, protocol=proto)
