# kvbroker image: kvbrokerd (PID 1) and kvbrokerctl on Debian 12, as a
# non-root user, with no CUDA toolkit: on a GPU node the NVIDIA container
# runtime mounts the driver library (libcuda.so.1) and --backend=auto finds
# it; without one the daemon says so and serves the host backend.
#
# The same image carries kvbroker-extender, the scheduler extender
# (deploy/extender/ runs it with `command: [/usr/local/bin/kvbroker-extender]`).
# One image rather than a second target: the three binaries share the build
# and nearly all their runtime libraries (gRPC, protobuf, Abseil), the
# extender must speak the brokers' protocol at the brokers' version, and one
# tag deploys both; the extender adds about 9 MB to the image (its binary,
# libmicrohttpd, libcurl and their libraries: 163 to 172 MB).
#
# Build (the CUDA toolkit's include directory provides cuda.h, the only CUDA
# file the build reads; the CUDA driver is loaded at run time):
#   podman build --build-context cuda=/usr/local/cuda/include -t kvbroker .
#   docker buildx build --build-context cuda=/usr/local/cuda/include -t kvbroker .
# deploy/README.md has the details, the image size and the build times.

ARG DEBIAN=debian:bookworm

# ---------------------------------------------------------------------------
# Build: the project's own Bazel setup against Debian's packages.
FROM ${DEBIAN} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The package list first, so that this layer survives source changes.
COPY tools/deps tools/deps
RUN tools/deps && rm -rf /var/lib/apt/lists/*
# cuda.h from the `cuda` build context. Without it the CUDA backend reports
# itself unavailable at run time, which is useless on a GPU node: the build
# refuses unless REQUIRE_CUDA=0 (tests on machines without a toolkit).
ARG REQUIRE_CUDA=1
COPY --from=cuda . /tmp/cuda-include/
RUN if [ -f /tmp/cuda-include/cuda.h ]; then \
      install -D -m 0644 /tmp/cuda-include/cuda.h /usr/local/cuda/include/cuda.h; \
    elif [ "$REQUIRE_CUDA" = 1 ]; then \
      echo "no cuda.h in the cuda build context (--build-context cuda=/usr/local/cuda/include)" >&2; \
      exit 1; \
    fi; \
    rm -rf /tmp/cuda-include
COPY . .
RUN bazel --batch --host_jvm_args=-Xmx1g build -c opt \
      --spawn_strategy=standalone --show_progress_rate_limit=30 \
      //server:kvbrokerd //client:kvbrokerctl //extender:kvbroker-extender \
 && install -D -m 0755 bazel-bin/server/kvbrokerd /out/usr/local/bin/kvbrokerd \
 && install -D -m 0755 bazel-bin/client/kvbrokerctl /out/usr/local/bin/kvbrokerctl \
 && install -D -m 0755 bazel-bin/extender/kvbroker-extender \
      /out/usr/local/bin/kvbroker-extender \
 && bazel --batch clean --expunge
# The runtime stage installs exactly the Debian packages that own the shared
# libraries the binaries load, at the versions they were linked against,
# so the list follows the code instead of being kept by hand.
RUN set -eu; \
    for lib in $(ldd /out/usr/local/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do \
      real=$(readlink -f "$lib"); \
      owner=""; \
      for p in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do \
        owner=$(dpkg-query -S "$p" 2>/dev/null | head -n1 | cut -d: -f1) && [ -n "$owner" ] && break; \
      done; \
      [ -n "$owner" ] || { echo "no Debian package owns $lib" >&2; exit 1; }; \
      echo "$owner"; \
    done | sort -u | xargs dpkg-query -W -f='${Package}=${Version}\n' > /out/runtime-packages; \
    cat /out/runtime-packages

# ---------------------------------------------------------------------------
# Runtime: the libraries, the three binaries, a user. Nothing else.
FROM ${DEBIAN}
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="kvbroker" \
      org.opencontainers.image.description="kvbrokerd: brokers GPU memory for LLM KV caches over gRPC" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build /out/runtime-packages /usr/share/kvbroker/runtime-packages
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(cat /usr/share/kvbroker/runtime-packages) \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
# A fixed uid and gid, so that manifests can name them (runAsUser, the
# socket directory's owner) and engine pods can share the group.
RUN groupadd --system --gid 65532 kvbroker \
 && useradd --system --uid 65532 --gid 65532 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin kvbroker \
 && install -d -o 65532 -g 65532 -m 0770 /run/kvbroker \
 && ldd /usr/local/bin/* | (! grep 'not found')
USER 65532:65532
# gRPC (schedulers, operators) and Prometheus metrics; 8888 is
# kvbroker-extender's HTTP(S) endpoint when the image runs it.
EXPOSE 50051 9400 8888
# The shell only sets the umask (the Unix socket becomes srwxrwx---, so that
# engines in the kvbroker group can connect) and replaces itself: kvbrokerd
# is PID 1 and takes SIGTERM itself (health goes NOT_SERVING, calls drain,
# exit 0).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/bin/sh", "-c", "umask 0007 && exec /usr/local/bin/kvbrokerd \"$@\"", "kvbrokerd"]
CMD ["--listen=0.0.0.0:50051", "--unix_socket=/run/kvbroker/kvbroker.sock", \
     "--metrics_listen=0.0.0.0:9400", "--backend=auto"]
