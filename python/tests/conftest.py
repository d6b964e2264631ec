"""
conftest.py - pytest over python/tests. The attnkit under test is the one
`import attnkit` finds (the installed package, pip install .); only where no
attnkit is importable, in a source checkout, it is python/attnkit (with the
library of `make build`). The run's header says which, and which library.
"""
import importlib.util
import os
import sys

if importlib.util.find_spec("attnkit") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import attnkit  # noqa: E402


def pytest_report_header(config):
    return (f"attnkit {attnkit.__version__} from {os.path.dirname(attnkit.__file__)}, "
            f"library {attnkit.library_path}")
