"""Build the compiled core: Cython glue in aprfast/_*.pyx over C kernels in csrc/."""

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup


def c_flags():
    if sys.platform == "win32":
        return ["/O2"]
    return ["-O3", "-std=c99", "-D_GNU_SOURCE", "-fno-strict-aliasing"]


def link_flags():
    return [] if sys.platform == "win32" else ["-pthread"]


def extension(name, sources):
    return Extension(
        f"aprfast.{name}",
        sources=[f"aprfast/{name}.pyx"] + [f"csrc/{src}" for src in sources],
        include_dirs=["csrc"],
        extra_compile_args=c_flags(),
        extra_link_args=link_flags(),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


EXTENSIONS = [
    extension("_crc", ["crc32.c"]),
    extension("_memory", ["buffers.c", "pio.c", "crc32.c", "lz4block.c"]),
    extension("_index", []),
    extension("_inputs", []),
    extension("_quant", ["quant.c"]),
    extension("_half", ["half.c"]),
    extension("_metascan", ["metascan.c"]),
    extension("_blocks", ["blockdec.c", "lz4block.c"]),
    extension("_stats", ["stats.c", "half.c", "quant.c"]),
]
# libzstd is loaded with dlopen (csrc/blockdec.c), which glibc before 2.34 keeps in libdl.
if sys.platform.startswith("linux"):
    next(e for e in EXTENSIONS if e.name == "aprfast._blocks").libraries.append("dl")

setup(ext_modules=cythonize(EXTENSIONS, compiler_directives={"language_level": "3"}))
