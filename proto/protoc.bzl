"""C++ code generation from .proto files with Debian's protoc, offline.

Native proto_library/cc_proto_library want an @com_google_protobuf
repository, which an offline build does not have; a genrule running
/usr/bin/protoc (and /usr/bin/grpc_cpp_plugin for services) does the same job.
"""

def cc_proto(name, srcs, grpc = False, deps = [], visibility = None, alwayslink = True,
             messages = None):
    """Generates and compiles C++ for `srcs` (paths relative to this package).

    Generated headers are included by their path from this package, e.g.
    "proto/kvbroker/v1/kvbroker.pb.h" (the workspace path) or
    "kvbroker/v1/kvbroker.pb.h" (the path protoc's own includes use).

    Args:
      name: the cc_library.
      srcs: .proto files of this package; imports resolve against this
        package's root and /usr/include (google/protobuf/*).
      grpc: also generate service stubs (*.grpc.pb.{h,cc}).
      deps: cc_proto libraries whose .proto files `srcs` import.
      visibility: of the cc_library.
      alwayslink: keep every descriptor in binaries, so that server
        reflection can resolve types no code references.
      messages: with grpc, a cc_proto of the same `srcs` that already holds
        their messages; this target then generates only the service stubs
        and depends on it (so code that needs the messages alone does not
        link gRPC).
    """
    pkg = native.package_name()
    stems = [src[:-len(".proto")] for src in srcs]
    hdrs = [] if messages else [s + ".pb.h" for s in stems]
    cc_srcs = [] if messages else [s + ".pb.cc" for s in stems]
    if messages:
        deps = deps + [messages]
    if grpc:
        hdrs += [s + ".grpc.pb.h" for s in stems]
        cc_srcs += [s + ".grpc.pb.cc" for s in stems]
    grpc_flags = ""
    if grpc:
        grpc_flags = ("--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin " +
                      "--grpc_out=$(GENDIR)/" + pkg + " ")
    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = hdrs + cc_srcs,
        cmd = ("/usr/bin/protoc -I" + pkg + " -I/usr/include " +
               ("" if messages else "--cpp_out=$(GENDIR)/" + pkg + " ") +
               grpc_flags +
               " ".join([pkg + "/" + s for s in srcs])),
        message = "protoc " + " ".join(srcs),
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        includes = ["."],
        alwayslink = alwayslink,
        visibility = visibility,
        deps = deps + (["@system//:grpc++"] if grpc else ["@system//:protobuf"]),
    )
