"""The `vit-deploy` group: commands found by name and imported only when run (or listed
by --help), as click's examples/complex does; and the one place where errors become exit
codes (`VitDeployError.exit_code`).

A command module imports click, cli.options and the torch-free runtime at import time and
everything heavy (torch, FastAPI, matplotlib, ORT's quantiser) inside its function, so
`vit-deploy --help` and `vit-deploy predict` import neither torch nor the server
(tests/cli/test_cli_lazy.py)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

# Each is the module vit_deploy/cli/<name>.py, whose command object has the same name.
COMMANDS = ("bench", "check", "embed", "export", "info", "predict", "providers", "quantize",
            "search", "serve", "sweep", "target", "triton", "web")


class Main(click.Group):
    """Every failure ends with a one-line message, never a traceback. vit-deploy's own
    errors exit with their class's `exit_code` (runtime/errors.py): 2 for input we refuse
    (a bundle, image, checkpoint, flag or output path), 1 for a failed check or an
    environment that cannot do the work (a busy bundle, a provider, the quantiser).
    Built-in errors keep their meaning: OSError and MemoryError exit 1 (disk full, ...);
    ValueError, OverflowError and ImportError exit 2; ONNX Runtime's own errors exit 1.
    A path named on the command line that does not exist or cannot be read is refused as
    it is parsed (params.InputPath: exit 2, one line); an unknown option that is another
    tool's word for one of ours is answered with ours (suggest_our_spelling)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"{__package__}.{name}")
        return getattr(module, name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """click's main, and a reader that went away (`vit-deploy ... | head -1`) ends the
        command quietly: exit 1 as click itself exits then, no 'Error: Broken pipe' and no
        'Exception ignored' from the interpreter's last flush."""
        try:
            try:
                return super().main(*args, **kwargs)
            finally:
                sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()

    def invoke(self, ctx: click.Context) -> Any:
        from vit_deploy.runtime.errors import VitDeployError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _reader_gone()
        except click.NoSuchOption as e:
            suggest_our_spelling(e)
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except VitDeployError as e:
            details = e.details()
            if details is not None:  # the failing report, with the error: on stderr
                from vit_deploy.cli.options import console

                console(stderr=True).print(details)
            fail(e.exit_code, e.message())
        except OSError as e:
            fail(1, f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        except MemoryError:
            fail(1, "out of memory; try a smaller size or batch")
        except (ValueError, OverflowError, ImportError) as e:
            fail(2, _first_line(e))
        except Exception as e:
            if type(e).__module__.startswith("onnxruntime"):  # ORT refusing a file or a run
                fail(1, _first_line(e))
            raise


def suggest_our_spelling(e: click.NoSuchOption) -> None:
    """An unknown option that is another tool's word for one of ours (--resolution, --size,
    --providers, --output, ...: vocabulary.SYNONYMS) is answered with our spelling where the
    command has it, not click's nearest string ("--resolution": "Did you mean
    '--precision'?")."""
    from vit_deploy.cli.vocabulary import SYNONYMS

    name, _, _ = e.option_name.partition("=")
    ours = SYNONYMS.get(name)
    command = e.ctx.command if e.ctx is not None else None
    if ours is None or command is None:
        return
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    if ours in known:
        e.possibilities = [ours]  # type: ignore[misc]  (click's own attribute)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _reader_gone() -> None:
    """stdout's reader closed it: what is left unwritten goes nowhere (Python's own advice:
    docs.python.org/3/library/signal.html#note-on-sigpipe); exit 1, as click's own."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(1)


def fail(code: int, message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)
