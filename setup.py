"""Build hook for the optional compiled launch path (``attnrt.runtime._launchc``).

Everything else is in pyproject.toml. The extension uses only the stable ABI (one binary
for Python >= 3.10) and links nothing; ``optional=True`` means a machine without a C
compiler still installs attnrt, and ``CudaRuntime.launch`` then runs its ctypes path.
The wheel is tagged ``cp310-abi3`` to match, so one wheel installs on every CPython >= 3.10.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "attnrt.runtime._launchc",
            ["attnrt/runtime/_launchc.c"],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            py_limited_api=True,
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
