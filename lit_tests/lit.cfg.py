# lit configuration for overlap-hlo: `lit -v lit_tests` from the repository root.
import os
import sys

import lit.formats

config.name = "overlap-hlo"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)

# The tool runs with the Python that runs lit, from this checkout; FileCheck is the
# PyPI `filecheck` package, installed next to that Python.
bin_dir = os.path.dirname(sys.executable)
filecheck = os.path.join(bin_dir, "filecheck")
tools = {
    "overlap-opt": f'"{sys.executable}" -m overlap_hlo.tools.overlap_opt',
    "FileCheck": f'"{filecheck}"' if os.path.exists(filecheck) else "filecheck",
}
for name, command in tools.items():
    # Whole words only, so that paths such as %s are never rewritten.
    config.substitutions.append((rf"(?<![\w./-]){name}(?![\w.-])", command))
