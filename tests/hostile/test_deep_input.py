"""Deeply nested bytecode: parsed on a large stack, then refused above the nesting
bound with one diagnostic (text input is refused before parsing, test_cli_*)."""
import io
import subprocess
import sys

import pytest
from jaxlib.mlir import ir

import overlap_hlo
from overlap_hlo.ir import compat
from overlap_hlo.ir.large_stack import on_large_stack


def nested_bytecode(depth: int) -> bytes:
    def build():
        module = ir.Module.parse("module {" * depth + "}" * depth, context=compat.make_context())
        buffer = io.BytesIO()
        module.operation.write_bytecode(buffer)
        return buffer.getvalue()

    return on_large_stack(build)


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    path = tmp_path_factory.mktemp("deep") / "deep.mlirbc"
    path.write_bytes(nested_bytecode(5000))
    return path


def test_deep_bytecode_is_one_diagnostic(deep, tmp_path):
    """5000 nested modules crash MLIR's reader on an 8 MiB stack (SIGSEGV)."""
    out = tmp_path / "out.mlir"
    done = subprocess.run([sys.executable, "-m", "overlap_hlo.tools.overlap_opt", str(deep),
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"{deep}: error: regions nested deeper than 256 levels"
    assert not out.exists()


def test_deep_bytecode_through_the_api(deep):
    with pytest.raises(overlap_hlo.InputError, match="nested deeper than 256"):
        overlap_hlo.parse(deep.read_bytes())


def test_bytecode_within_the_bound_is_rewritten():
    module = overlap_hlo.parse(nested_bytecode(200))
    assert overlap_hlo.rewrite_module(module) == []


def test_errors_cross_the_large_stack():
    def fail():
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        on_large_stack(fail)
    assert on_large_stack(lambda: on_large_stack(lambda: 7)) == 7


# A signal another thread receives sets Python's flag but does not wake a main thread
# blocked in one long join; on_large_stack's short joins let the handler run.
HANDLED_WHILE_ON_LARGE_STACK = """
import os, signal, sys, threading, time
from overlap_hlo.ir.large_stack import on_large_stack
signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
bystander = threading.Thread(target=lambda: time.sleep(600), daemon=True)
bystander.start()
def work():
    time.sleep(0.5)   # the main thread is in its join by now
    signal.pthread_kill(bystander.ident, signal.SIGTERM)
    signal.pause()
on_large_stack(work)
"""


def test_a_signal_another_thread_gets_runs_the_handler():
    done = subprocess.run([sys.executable, "-c", HANDLED_WHILE_ON_LARGE_STACK],
                          capture_output=True, timeout=60)
    assert done.returncode == 7, done.stderr.decode()
