"""Run MLIR's recursive parts (parser, verifier, passes, printer) on a large stack.

MLIR recurses once per nesting level of the IR. On the main thread's 8 MiB stack a
few thousand levels overflow it and the process dies of SIGSEGV; text input is bounded
before parsing (api.MAX_NESTING), but bytecode cannot be measured without parsing it.
A thread with a 256 MiB stack (address space, touched only as deep as the input goes)
raises the depth MLIR survives about 32-fold.

The caller waits for the thread in short joins: Python runs signal handlers on the main
thread, and a signal the kernel hands to another thread does not wake a main thread
blocked in one long join (overlap-opt's SIGTERM handler then waited for the pass).
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

STACK_BYTES = 256 << 20
JOIN_POLL_S = 0.1
T = TypeVar("T")
_inside = threading.local()


def on_large_stack(fn: Callable[[], T]) -> T:
    """`fn()` on a thread with a STACK_BYTES stack (inline when already on one, or
    when no such thread can be started, e.g. under a tight address-space limit)."""
    if getattr(_inside, "active", False):
        return fn()
    outcome: dict = {}

    def target():
        _inside.active = True
        try:
            outcome["value"] = fn()
        except BaseException as err:   # re-raised on the caller's thread
            outcome["error"] = err

    previous = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
        thread = threading.Thread(target=target, name="overlap-hlo-mlir", daemon=True)
        thread.start()
    except (RuntimeError, ValueError, MemoryError):
        return fn()
    finally:
        threading.stack_size(previous)
    while thread.is_alive():
        thread.join(JOIN_POLL_S)   # each return runs the pending signal handlers
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
