"""The native module: the allocsim command-line tool's library, in-process."""

from typing import Optional

__version__: str

def run(argv: list[str]) -> tuple[int, str, Optional[tuple[str, str]]]:
    """Run `allocsim ARGV...`: (exit status, what it printed, None), or on failure
    (1, "", (kind, message)) with kind `trace`, `settings`, `usage`, `io` or `error`."""

def policies() -> list[str]:
    """Every policy name, in the order reports list them."""
