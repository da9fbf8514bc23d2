#!/usr/bin/env bash
# Device check for the local sandbox on a bare (GPU) host, as root: which limits hold, through which path.
# Usage (repository root, bubblewrap's .deb next to it or bwrap installed):
#   bash tests/sandbox/root_hosts_device.sh [path/to/bubblewrap_*.deb]
# (wheels of gymnasium, cloudpickle and farama-notifications in ./device-wheels when the host lacks them)
# Prints the host's cgroup layout, then `python -m agentrl.sandbox` under four configurations:
# default (host uids + cgroups), cgroups only (uids off), host uids only (cgroups hidden), neither (must FAIL).
set -u
REPO=$(pwd)
PY=${PYTHON:-$(command -v python3.12 || command -v python3)}
DEB=${1:-$(ls "$REPO"/bubblewrap_*.deb 2>/dev/null | head -1)}
if ! command -v bwrap >/dev/null && [ -z "${AGENTRL_BWRAP:-}" ] && [ -n "$DEB" ]; then
  rm -rf /tmp/agentrl-bw && dpkg -x "$DEB" /tmp/agentrl-bw && export AGENTRL_BWRAP=/tmp/agentrl-bw/usr/bin/bwrap
fi
# An importable agentrl without installing it: the package-dir mapping of pyproject.toml, by copying.
PP=/tmp/agentrl-pp; rm -rf "$PP"; mkdir -p "$PP"
cp -r "$REPO/agentrl" "$PP/agentrl"
for pair in envs:envs tools:tools sandbox:sandbox trainers:trainers; do cp -r "$REPO/${pair%%:*}" "$PP/agentrl/${pair##*:}"; done
# gymnasium (which `import agentrl` needs) from carried wheels, when the host lacks it.
WHEELS=${WHEELS:-$REPO/device-wheels}
if ! "$PY" -c "import gymnasium" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --target "$PP" "$WHEELS"/*.whl
fi
export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
cd /tmp  # so that `python -m` does not import the checkout's unmapped folders
echo "== host"; id; uname -r; "$PY" --version; echo "bwrap: ${AGENTRL_BWRAP:-$(command -v bwrap)}"
echo "own cgroup: $(cat /proc/self/cgroup | tr '\n' ' ')"; mount | grep cgroup
own=$(sed -n 's/^0:://p' /proc/self/cgroup)
for d in /sys/fs/cgroup "/sys/fs/cgroup$own" "$(dirname "/sys/fs/cgroup$own")"; do
  echo "$d: controllers=[$(cat "$d/cgroup.controllers" 2>/dev/null)] subtree=[$(cat "$d/cgroup.subtree_control" 2>/dev/null)] procs=$(wc -w < "$d/cgroup.procs" 2>/dev/null)"
done
cat /proc/sys/user/max_user_namespaces /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null
run() { echo; echo "== $1"; shift; timeout 60 "$@"; echo "exit status: $?"; }
run "default: host uids + whatever cgroup is writable" "$PY" -m agentrl.sandbox
run "cgroups only (AGENTRL_SANDBOX_UIDS=off)" env AGENTRL_SANDBOX_UIDS=off "$PY" -m agentrl.sandbox
run "host uids only (cgroup hierarchy hidden)" unshare -m sh -c "mount -t tmpfs none /sys/fs/cgroup && exec $PY -m agentrl.sandbox"
run "neither (must FAIL, exit 1)" unshare -m sh -c "mount -t tmpfs none /sys/fs/cgroup && AGENTRL_SANDBOX_UIDS=off exec $PY -m agentrl.sandbox"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  # cgroup v2: a process alone in a cgroup of its own moves into a leaf so the group can delegate controllers.
  T=/sys/fs/cgroup/agentrl-leaf-test
  run "cgroup v2, alone in a fresh cgroup (moves into a leaf), uids off" env AGENTRL_SANDBOX_UIDS=off "$PY" -c "
import os, runpy, sys
os.makedirs('$T', exist_ok=True)
with open('$T/cgroup.procs', 'w') as f: f.write(str(os.getpid()))
sys.argv = ['agentrl.sandbox']
runpy.run_module('agentrl.sandbox', run_name='__main__')"
  find "$T" -depth -type d -exec rmdir {} \; 2>/dev/null; ls -d "$T" 2>/dev/null && echo "left behind: $T"
fi
cat > /tmp/agentrl-forkbomb.py <<'PYEOF'
import asyncio, time
from agentrl.sandbox import LocalSandbox, Limits
async def main():
    async with LocalSandbox(Limits(wall_s=5, max_processes=32)) as sb:
        t = time.perf_counter()
        r = await sb.run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=3)
        print("fork bomb:", r.status, f"{time.perf_counter() - t:.2f} s")
        r = await sb.run("import os; print(os.getuid(), open('/proc/self/uid_map').read().split())")
        print("after:", r.status, r.stdout.strip())
asyncio.run(main())
PYEOF
run "fork bomb, default configuration" "$PY" /tmp/agentrl-forkbomb.py
run "fork bomb, cgroup hierarchy hidden" unshare -m sh -c "mount -t tmpfs none /sys/fs/cgroup && exec $PY /tmp/agentrl-forkbomb.py"
echo; echo "== start cost of host uids (one-shot sandboxes, serial)"
# Copied out of the checkout: the script puts its checkout first on sys.path, which holds the unmapped folders.
cp "$REPO/benchmarks/sandbox_host_uids.py" /tmp/agentrl-bench-uids.py
timeout 120 "$PY" /tmp/agentrl-bench-uids.py --n 30
