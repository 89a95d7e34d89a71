# A Swift build image for machines that cannot pull swift:6.3-bookworm: the Debian base made by
# scripts/image-test.sh, the packages the toolchain needs, and the host's toolchain mounted at
# /opt/swift when the build runs (buildah bud --volume /opt/swift:/opt/swift:ro), not copied in.
ARG BASE_IMAGE=localhost/debian:bookworm-slim
FROM ${BASE_IMAGE}
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils ca-certificates git libc6-dev libgcc-12-dev \
       libstdc++-12-dev libncurses6 libcurl4 libxml2 tzdata zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/swift/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
