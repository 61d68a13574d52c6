"""Build hook: compiles pypool's hot path with mypyc (pypool/compiled.py says which and why).

Everything else about the package is in pyproject.toml. With PYPOOL_PURE=1, or where mypyc
is not importable, nothing is compiled; a failed C build leaves pypool as plain Python too.
"""

import os
import runpy

from setuptools import setup


def ext_modules() -> list:
    if os.environ.get("PYPOOL_PURE") == "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    compiled = runpy.run_path(os.path.join("pypool", "compiled.py"))
    paths = [os.path.relpath(compiled["source_path"](name)) for name in compiled["HOT_MODULES"]]
    extensions = mypycify(paths, opt_level="3")
    for extension in extensions:
        extension.optional = True  # no C compiler: install as plain Python, not fail
    return extensions


setup(ext_modules=ext_modules())
