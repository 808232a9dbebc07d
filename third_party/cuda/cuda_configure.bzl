"""Finds cuda.h at fetch time so the cuda backend builds where a toolkit exists.

Without a toolkit the repository still exists, with `has_cuda` false, and the
cuda backend compiles to a stub that reports itself unavailable.
"""

_CANDIDATES = ["/usr/local/cuda/include", "/usr/include"]

def _impl(ctx):
    found = ""
    for d in _CANDIDATES:
        if ctx.path(d + "/cuda.h").exists:
            found = d
            break
    if found:
        ctx.symlink(found + "/cuda.h", "include/cuda.h")
        for extra in ["cuda_stdint.h"]:
            if ctx.path(found + "/" + extra).exists:
                ctx.symlink(found + "/" + extra, "include/" + extra)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_h",
    hdrs = glob(["include/*.h"]),
    includes = ["include"],
    defines = {defines},
)
""".format(defines = '["KVB_HAVE_CUDA_H=1"]' if found else "[]"))

cuda_headers_repository = repository_rule(
    implementation = _impl,
    local = True,
    environ = ["CUDA_PATH"],
)
