#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests of `shardwise sweep --scheduler slurm`
# (tests/measure/test_sweep_slurm.py): Debian's slurm-wlm and munge, run as root, no cgroups or accounting.
# Installs them where missing; starts munged, slurmctld and slurmd unless running; waits until the node is up.
set -euo pipefail
if ! command -v slurmctld >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
host=$(hostname -s)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=shardwise-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
chown munge:munge /run/munge 2>/dev/null || true
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then exit 0; fi
  sleep 1
done
echo "Slurm did not come up: $(sinfo 2>&1 | tail -1)" >&2
exit 1
