"""kvb_server_test: a gRPC daemon test, declared once per server threading.

`name` runs the test's daemons with --server_threading=callback and
`name + "_poller"` with --server_threading=poller (daemon.h), through
$KVB_TEST_SERVER_THREADING (tests/grpc_test_util.h, tests/daemon_process.h).
The sources compile once, into `name + "_lib"`.
"""

def kvb_server_test(name, srcs, deps, data = [], size = "small", tags = [], **kwargs):
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    for suffix, threading in [("", "callback"), ("_poller", "poller")]:
        native.cc_test(
            name = name + suffix,
            size = size,
            data = data,
            tags = tags,
            env = {"KVB_TEST_SERVER_THREADING": threading},
            deps = [":" + name + "_lib"],
            **kwargs
        )
