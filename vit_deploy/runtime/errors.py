"""One base class for the errors vit-deploy raises on purpose, and the exit code each means.

The command line maps an error to its exit status by `exit_code` alone (cli/group.py):
2 for input we refuse (a bundle, image, checkpoint, flag or output path), 1 for a failed
check or an environment that cannot do the work (a busy bundle, a provider that does not
run, a quantiser or exporter that fails). Each error also keeps the built-in class it
always was (ValueError, RuntimeError, FileExistsError), so `except ValueError` in an app
still catches a BundleError.

Lives in the runtime (a leaf) because most of these errors are raised there.
"""

from __future__ import annotations

from typing import Any

BAD_INPUT = 2  # what the user gave us is refused
FAILED = 1  # a check failed, or the machine / a tool could not do the work


class VitDeployError(Exception):
    """Base of vit-deploy's own errors; `exit_code` is what the CLI exits with."""

    exit_code: int = FAILED

    def message(self) -> str:
        """The one line the CLI prints after 'Error: '."""
        text = str(self)
        return text.splitlines()[0] if text else type(self).__name__

    def details(self) -> Any:
        """Something to print before the message (a report that renders itself), or None."""
        return None


def require_arg(where: str, value: Any, types: type | tuple[type, ...], expected: str) -> None:
    """TypeError naming the argument, what it takes and what was given, unless `value` is
    one of `types` (bool is not an int here). The check at the public API's door, so a
    wrong type never surfaces as an internal TypeError / AttributeError."""
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,))):
        return
    shown = repr(value)
    raise TypeError(f"{where} must be {expected}, got {type(value).__name__} "
                    f"{shown[:60]}{'...' if len(shown) > 60 else ''}")


__all__ = ["BAD_INPUT", "FAILED", "VitDeployError", "require_arg"]
