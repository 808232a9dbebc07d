"""kvb_fuzz_test: one libFuzzer driver, built two ways, and its CI test.

Under --config=fuzz (which sets --define=kvb_fuzz=1) the driver links with
libFuzzer and the test fuzzes for KVB_FUZZ_SECONDS (default 20) from the
committed seed corpus. In every other configuration the driver links with
replay_main.cc and the test runs each seed once, so the seeds stay
regression inputs of the ordinary test run.
"""

def kvb_fuzz_test(name, srcs, deps = [], data = [], fuzzer_args = [], env = {}):
    """Declares NAME_fuzzer (cc_binary) and NAME (sh_test).

    Args:
      name: the test's name; the seeds live in fuzz/corpus/NAME/.
      srcs: the driver, defining LLVMFuzzerTestOneInput.
      deps: what the driver calls.
      data: run-time files of the driver.
      fuzzer_args: extra libFuzzer flags (-max_len=..., -dict=...).
      env: environment of the test.
    """
    fuzzer = name + "_fuzzer"
    native.cc_binary(
        name = fuzzer,
        testonly = True,
        srcs = srcs,
        data = data,
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
    )
    native.sh_test(
        name = name,
        size = "medium",
        srcs = ["//fuzz:run_fuzzer.sh"],
        args = ["$(location :%s)" % fuzzer, "fuzz/corpus/" + name] + fuzzer_args,
        data = [":" + fuzzer] + native.glob(["corpus/%s/**" % name]) + data,
        env = env,
    )
