"""`eval.cli_support.signals_as_exceptions`: a signal becomes `Interrupted`, even one that lands in a finalizer."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from eval.cli_support import Interrupted, run_main, signals_as_exceptions
from eval.errors import EXIT_INTERNAL


class _SignalsInDel:
    """An object whose finalizer sends SIGTERM to this process: the handler runs inside ``__del__``, where Python
    drops exceptions."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # give the handler bytecodes to run on, inside the finalizer
            pass


def test_a_signal_landing_in_a_finalizer_still_interrupts_the_block():
    hook = sys.unraisablehook
    with pytest.raises(Interrupted) as e, signals_as_exceptions():
        x = _SignalsInDel()
        del x  # the finalizer runs here; its Interrupted is dropped by Python and sent again
        gc.collect()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:  # the signal tripped again is raised in this code
            pass
        raise AssertionError("the signal was lost")
    assert e.value.signum == signal.SIGTERM
    assert sys.unraisablehook is hook  # restored, as are the handlers
    assert signal.getsignal(signal.SIGTERM) is not None and signal.getsignal(signal.SIGTERM) != signal.SIG_IGN


def test_other_unraisable_exceptions_reach_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(type(u.exc_value)))

    class Bad:
        def __del__(self):
            raise ValueError("in del")

    with signals_as_exceptions():
        b = Bad()
        del b
    assert seen == [ValueError]


class _SignalsInSetName:
    """A descriptor whose ``__set_name__`` sends SIGINT: Python's class creation wraps the `Interrupted` raised
    there in ``RuntimeError`` (3.11), as importing a module with a dataclass does when Ctrl-C lands in it."""

    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass


def _wrapped_interrupt(keep_chain: bool) -> None:
    try:
        type("Made", (), {"field": _SignalsInSetName()})
    except Exception as e:  # as datasets does with an error in a generator
        if keep_chain:
            raise ValueError("An error occurred while generating the dataset") from e
        raise ValueError("An error occurred while generating the dataset") from None
    raise AssertionError("the signal was lost")


@pytest.mark.parametrize("keep_chain", [True, False], ids=["chained", "chain-dropped"])
def test_an_interrupt_wrapped_by_library_code_is_still_an_interrupt(keep_chain, capsys):
    before = signal.getsignal(signal.SIGINT)
    assert run_main(lambda _argv: _wrapped_interrupt(keep_chain), []) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "interrupted by SIGINT" in err and "internal error" not in err
    assert signal.getsignal(signal.SIGINT) == before  # restored once the command ended


def test_an_error_without_a_signal_is_still_a_bug(capsys):
    def main(_argv):
        raise ValueError("plain")

    assert run_main(main, []) == EXIT_INTERNAL
    assert "internal error: ValueError: plain" in capsys.readouterr().err
    # a signal delivered in an earlier block does not make a later error an interruption
    assert run_main(lambda _argv: _wrapped_interrupt(False), []) == 128 + signal.SIGINT
    assert run_main(main, []) == EXIT_INTERNAL


def test_a_typer_command_whose_interrupt_was_wrapped_exits_130(capsys):
    import typer

    from eval.cli_support import install, run_typer

    app = typer.Typer()
    install(app)

    @app.command()
    def go() -> None:
        _wrapped_interrupt(True)

    @app.command()
    def other() -> None:
        pass

    assert run_typer(app, ["go"]) == 128 + signal.SIGINT
    assert "interrupted by SIGINT" in capsys.readouterr().err
