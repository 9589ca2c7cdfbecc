"""`eval.cli_support.signals_as_exceptions`: a signal becomes `Interrupted`, even one that lands in a finalizer."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from eval.cli_support import Interrupted, signals_as_exceptions


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
