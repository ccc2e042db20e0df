"""Builds the optional C glue (``edgeport_xnnpack._glue``: per-call binding and invocation of XNNPACK runtimes) and
the optional host kernels (``edgeport_xnnpack._kernels``: GELU, which the 2022 libXNNPACK lacks; ``_gemm``: float32
products on the host BLAS tiled over XNNPACK's thread pool, for CPUs where the 2022 library's kernels are slow;
``_qd8``: dynamically quantized fully connected, qd8 x qc8w / qb4w, which the 2022 library lacks) and edgeport's
thread pool (``edgeport_xnnpack._pool``: the pthreadpool C ABI libXNNPACK imports, loaded in place of Debian's
2021 libpthreadpool; see ``edgeport_xnnpack._threadpool``).

The glue and kernels link against nothing but libc (the library functions are passed in as addresses from ctypes). When no C
compiler is available the build is skipped and the executor uses the equivalent pure-Python path
(``edgeport_xnnpack.native.glue_status()`` tells which one runs).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("edgeport_xnnpack._glue", ["src/edgeport_xnnpack/_glue.c",
                                                          "src/edgeport_xnnpack/_chain.c"],
                             depends=["src/edgeport_xnnpack/_step.h"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"]),
                   # elementwise kernels the 2022 library lacks (GELU), vectorized; optional like the glue
                   Extension("edgeport_xnnpack._kernels", ["src/edgeport_xnnpack/_kernels.c",
                                                             "src/edgeport_xnnpack/_kernels_bound.c"],
                             depends=["src/edgeport_xnnpack/_step.h", "src/edgeport_xnnpack/_kernels_bound.h"],
                             optional=True,
                             extra_compile_args=["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wall",
                                                 "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"]),
                   Extension("edgeport_xnnpack._gemm", ["src/edgeport_xnnpack/_gemm.c",
                                                          "src/edgeport_xnnpack/_gemm_qs8.c",
                                                          "src/edgeport_xnnpack/_gemm_conv.c",
                                                          "src/edgeport_xnnpack/_gemm_bmm.c",
                                                          "src/edgeport_xnnpack/_gemm_fc.c"],
                             depends=["src/edgeport_xnnpack/_gemm_common.h", "src/edgeport_xnnpack/_step.h"], optional=True,
                             extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"]),
                   # qd8 x qc8w / qb4w fully connected; no fused multiply-adds: the row quantization must round
                   # like XNNPACK's convert (and edgeport_xnnpack._dynamic_quant) step by step
                   Extension("edgeport_xnnpack._qd8", ["src/edgeport_xnnpack/_qd8.c", "src/edgeport_xnnpack/_qd8_b4.c"],
                             depends=["src/edgeport_xnnpack/_qd8.h"], optional=True,
                             extra_compile_args=["-O3", "-ffp-contract=off", "-Wall", "-Wextra",
                                                 "-Wno-unused-parameter", "-Wno-missing-field-initializers"]),
                   # the thread pool: a plain shared library (no Python API) that ctypes opens before libXNNPACK;
                   # its soname makes it satisfy libXNNPACK's libpthreadpool.so.0 dependency, -Bsymbolic keeps its
                   # own references local, hidden visibility exports only the pthreadpool_* / edgeport_pool_* ABI
                   Extension("edgeport_xnnpack._pool", ["src/edgeport_xnnpack/_pool.c"], optional=True,
                             libraries=["pthread", "dl"],
                             extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                                                 "-Wno-unused-parameter"],
                             extra_link_args=["-Wl,-Bsymbolic", "-Wl,-soname,libpthreadpool.so.0"])])
