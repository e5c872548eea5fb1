#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian/Ubuntu, as root), for testing the slurm profile:
#   scripts/slurm_cluster.sh start   # apt install slurmctld slurmd slurm-client munge, configure, start
#   scripts/slurm_cluster.sh stop    # stop the three daemons by their PID files
# Exit status 3: SLURM is missing and apt-get cannot install it.
# Partition "debug" holds the node; two fake GPUs (character devices made with mknod) are declared as
# GRES so that `--gpus=1` jobs are scheduled and see CUDA_VISIBLE_DEVICES. No accounting daemon: use
# `--slurm-status-command squeue` (profiles/slurm does).
# It never overwrites an /etc/slurm/slurm.conf it did not write (exit 4): a machine's own cluster
# configuration is left alone. The tests start it only with COMERA_BENCH_SLURM_TESTS=1.
set -euo pipefail

FAKE_GPU_DIR=${FAKE_GPU_DIR:-/run/comera-bench-fake-gpus}
MARK="# written by comera-bench scripts/slurm_cluster.sh"
SLURM_PID_FILES=(/run/slurmd.pid /run/slurmctld.pid)
PID_FILES=("${SLURM_PID_FILES[@]}" /run/munge/munged.pid)

# kill_daemons PID_FILE...: stop each daemon whose PID file is given and not empty.
kill_daemons() {
    for f in "$@"; do
        if [ -s "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
}

# may_write FILE CONTENT: FILE is absent, carries this script's mark, or already holds CONTENT (written
# by an earlier version of this script, before the mark); else say so and fail.
may_write() {
    if [ -e "$1" ] && ! grep -qxF "$MARK" "$1" \
        && [ "$(grep -v '^#' "$1")" != "$(printf '%s\n' "$2" | grep -v '^#')" ]; then
        echo "slurm_cluster.sh: $1 exists and was not written by this script; not overwriting it" >&2
        return 1
    fi
}

start() {
    [ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: needs root" >&2; exit 2; }
    if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ] \
        || ! command -v sbatch >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        command -v apt-get >/dev/null || { echo "slurm_cluster.sh: no apt-get to install SLURM" >&2; exit 3; }
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client munge >/dev/null; } \
            || { echo "slurm_cluster.sh: apt-get could not install SLURM" >&2; exit 3; }
    fi
    [ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create; chown munge:munge /etc/munge/munge.key; }
    install -d -o munge -g munge -m 755 /run/munge
    [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null \
        || runuser -u munge -- /usr/sbin/munged
    local host
    host=$(hostname -s)
    mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /etc/slurm "$FAKE_GPU_DIR"
    for i in 0 1; do [ -c "$FAKE_GPU_DIR/gpu$i" ] || mknod "$FAKE_GPU_DIR/gpu$i" c 1 3; done
    local conf  # CPUs: the machine's online CPUs (`nproc` follows OMP_NUM_THREADS, which the tests set to 1)
    conf=$(cat <<CONF
$MARK
ClusterName=ci
SlurmctldHost=${host}
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
MinJobAge=300
GresTypes=gpu
NodeName=${host} NodeAddr=127.0.0.1 CPUs=$(getconf _NPROCESSORS_ONLN) RealMemory=4000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)
    may_write /etc/slurm/slurm.conf "$conf" || exit 4
    if command -v sinfo >/dev/null && timeout 10 sinfo -h -o %t 2>/dev/null | grep -q idle; then
        if [ "$(cat /etc/slurm/slurm.conf)" = "$conf" ]; then echo "slurm: already running"; return 0; fi
        echo "slurm: running with another slurm.conf; restarting it with this one"
        kill_daemons "${SLURM_PID_FILES[@]}"
        sleep 2
    fi
    printf '%s\n' "$conf" > /etc/slurm/slurm.conf
    echo "NodeName=${host} Name=gpu File=${FAKE_GPU_DIR}/gpu[0-1]" > /etc/slurm/gres.conf
    /usr/sbin/slurmctld
    /usr/sbin/slurmd
    for _ in $(seq 60); do
        sinfo -h -o %t 2>/dev/null | grep -q idle && { echo "slurm: node ${host} idle"; return 0; }
        sleep 1
    done
    echo "slurm_cluster.sh: node did not become idle; see /var/log/slurm/" >&2
    exit 1
}

stop() {
    kill_daemons "${PID_FILES[@]}"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    may-write) may_write "$2" "$(cat "$3")" || exit 4 ;;   # for the tests
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
