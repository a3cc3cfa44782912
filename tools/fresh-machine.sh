#!/usr/bin/env bash
# The README's test command on a fresh machine, simulated here: a Debian 12 root made by
# debootstrap with only what a new build machine has before herd's own installs (g++, cmake, make,
# git, python3 and pip, the CUDA toolkit of /usr/local/cuda-* bound in with its ld.so entry, this
# machine's CA certificates and /etc/hosts), and the committed HEAD cloned into it. Then .ci/run
# (tools/test.sh) runs there, installs included, and the time of each phase is printed.
#
#   sudo tools/fresh-machine.sh [ROOT]     # ROOT: where the Debian root lives (default /var/tmp/herd-fresh-root)
#
# The root is made once (about 5 minutes, 600 MB) and kept; before each run, what herd's install
# script added to it the last time is purged, so that every run starts without those packages and
# without the PyTorch 2.x environment. Needs root, debootstrap and the network to Debian's mirror
# and PyPI. Log: ROOT.log.
set -euo pipefail
root="${1:-/var/tmp/herd-fresh-root}"
top="$(cd "$(dirname "$0")/.." && pwd)"
[[ $(id -u) -eq 0 ]] || { echo "fresh-machine: run as root" >&2; exit 2; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap

if [[ ! -x "$root/usr/bin/g++" ]]; then
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
  cp /etc/resolv.conf "$root/etc/"
  chroot "$root" apt-get update -qq
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    g++ cmake make git python3 python3-pip ca-certificates procps iproute2 util-linux file
  chroot "$root" dpkg-query -W -f='${Package}\n' > "$root/var/lib/herd-base-packages"
fi

# What the machine itself has: certificates of its network, names, the CUDA toolkit.
cp /etc/hosts /etc/resolv.conf "$root/etc/"
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
chroot "$root" update-ca-certificates >/dev/null
# The root is a mount point of its own, so that unshare --mount-proc (the PID namespace tests)
# can make it private; /proc, /sys and /dev as the machine's. First: a bind of the root made after
# the others would hide them (a plain bind does not carry the mounts below it).
mountpoint -q "$root" || { mount --bind "$root" "$root" && mount --make-private "$root"; }
for m in proc sys; do mountpoint -q "$root/$m" || mount --bind "/$m" "$root/$m"; done
mountpoint -q "$root/dev" || { mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"; }
cuda="$(readlink -f /usr/local/cuda || true)"
if [[ -d "$cuda" ]]; then
  mkdir -p "$root$cuda"
  mountpoint -q "$root$cuda" || mount --bind "$cuda" "$root$cuda"
  ln -sfn "$cuda" "$root/usr/local/cuda"
  cp /etc/ld.so.conf.d/*cuda* "$root/etc/ld.so.conf.d/" 2>/dev/null || true
  chroot "$root" ldconfig
  # A run without the toolkit would skip the CUDA tests and the PyTorch 2.x run, and time less.
  [[ -x "$root/usr/local/cuda/bin/nvcc" ]] || { echo "fresh-machine: the CUDA toolkit is not visible in $root" >&2; exit 1; }
fi

# Back to a machine without herd's packages and environment.
chroot "$root" dpkg-query -W -f='${Package}\n' | grep -vxF -f "$root/var/lib/herd-base-packages" > "$root/tmp/added" || true
if [[ -s "$root/tmp/added" ]]; then
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $(cat "$root/tmp/added") >/dev/null
fi
chroot "$root" apt-get clean
rm -rf "$root/root/.cache" "$root/root/herd"
git clone -q "$top" "$root/root/herd"

log="$root.log"
start=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb CI=true \
  PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
  bash -c 'cd /root/herd && bash .ci/run </dev/null' 2>&1 |
  while IFS= read -r line; do printf '%6d %s\n' $(( $(date +%s) - start )) "$line"; done > "$log"
rc=${PIPESTATUS[0]}
set -e
echo "fresh-machine: .ci/run exited $rc after $(( $(date +%s) - start )) s; log (seconds since the start on each line): $log"
grep -E "herd: (installing|making|.* is ready)|Build files have been written|^ *[0-9]+ Test project|tests passed|Total Test time" "$log" || true
exit "$rc"
