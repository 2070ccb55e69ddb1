# shellcheck shell=bash
# sshd for the scp and rsync contenders (sourced by bench/transfer.sh and bench/file-peers.sh):
# a host key and a client key of our own in $1 (the run's work folder), sshd_config there for
# port 2222 (the caller starts /usr/sbin/sshd -f "$1/sshd_config" in the receiver's namespace;
# its pid lands in "$1/sshd.pid"), and SSH_OPTS for ssh, scp and rsync -e.
bench_sshd_setup() {
    local work=$1
    ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
    cat >"$work/sshd_config" <<CONFIG
Port 2222
HostKey $work/host_key
AuthorizedKeysFile $work/client_key.pub
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
UsePAM no
PidFile $work/sshd.pid
Subsystem sftp internal-sftp
CONFIG
    # AES-128-GCM: the fastest cipher OpenSSH has on these CPUs (AES-NI), as DESIGN.md's scp figure.
    SSH_OPTS=(-i "$work/client_key" -c aes128-gcm@openssh.com -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o Port=2222)
    mkdir -p /run/sshd
}
