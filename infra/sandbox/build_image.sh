#!/usr/bin/env bash
# Build the sandbox image without a registry: debootstrap a minimal Debian with Python and the
# libraries snippets commonly use into a folder, then `docker import` it.  Skipped when the image
# already exists (FORCE=1 rebuilds).  Needs root, debootstrap, a Debian mirror and a Docker engine.
# Usage: infra/sandbox/build_image.sh [TAG]   (env: SUITE, MIRROR, PACKAGES, FORCE, WORKDIR)
# The executor itself is not baked in: the docker backend mounts sandbox/executor/ read-only,
# so the image never goes stale when the executor changes.
set -euo pipefail
TAG="${1:-${SANDBOX_IMAGE:-cleaner-sandbox:latest}}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
PACKAGES="${PACKAGES:-python3,python3-numpy,python3-sympy,python3-mpmath,python3-scipy,python3-networkx,ca-certificates}"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "build_image: $TAG already exists; skipping (FORCE=1 rebuilds)"
    exit 0
fi
for tool in debootstrap docker tar; do
    command -v "$tool" >/dev/null || { echo "build_image: $tool not found (apt-get install -y debootstrap docker.io)" >&2; exit 1; }
done
ROOTFS="$(mktemp -d "${WORKDIR:-/tmp}/cleaner-rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT

echo "build_image: debootstrap $SUITE ($PACKAGES) into $ROOTFS"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

# Slim the tree: package caches, docs, man pages, locales, and the C/C++ toolchain that
# python3-scipy pulls in through pythran (headers, gcc, binutils, sanitizers: ~0.4 GB that
# snippets do not need and should not have); then add the unprivileged user.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
       "$ROOTFS"/usr/share/locale/* "$ROOTFS"/usr/include "$ROOTFS"/usr/lib/gcc \
       "$ROOTFS"/usr/lib/x86_64-linux-gnu/lib{a,t,l,ub,hwa}san* "$ROOTFS"/usr/lib/x86_64-linux-gnu/*.a \
       "$ROOTFS"/usr/bin/x86_64-linux-gnu-* "$ROOTFS"/usr/bin/{gcc,g++,cpp}-* \
       "$ROOTFS"/usr/bin/{gcc,g++,cpp,c++,cc,ld,ld.bfd,ld.gold,as}
echo "sandbox:x:10001:10001:sandbox:/work:/usr/sbin/nologin" >>"$ROOTFS/etc/passwd"
echo "sandbox:x:10001:" >>"$ROOTFS/etc/group"
mkdir -p "$ROOTFS/work" "$ROOTFS/opt/cleaner" && chmod 1777 "$ROOTFS/work"
chroot "$ROOTFS" python3 -c "import numpy, sympy, scipy; print('build_image: python ok', numpy.__version__, sympy.__version__)"

tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1' \
    --change 'USER 10001:10001' --change 'WORKDIR /work' \
    --change 'CMD ["python3", "-I", "-B", "-c", "import sys; sys.path.insert(0, \"/opt/cleaner\"); from cleaner_executor.server import main; main()"]' \
    --message "CLEANER sandbox ($SUITE minbase + python3)" - "$TAG"
docker image inspect "$TAG" --format 'build_image: built {{.RepoTags}} {{.Size}} bytes'
