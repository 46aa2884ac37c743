# Sourced by the bench scripts, through bench/common.sh or alone.

# free_ports N: the first of N consecutive ports that no TCP socket on this machine listens
# on, picked at random below the kernel's range for outgoing connections: a port in that
# range may be an outgoing connection's (the load's, the broker links') when a server binds
# it, and a fixed range of our own would hold the broker's (RabbitMQ listens on 25672).
free_ports() {
    local n=$1 low base
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    for _ in $(seq 1 100); do
        base=$((10000 + RANDOM % (low - n - 10000)))
        if [[ -z $(ss -Htln "sport >= :$base and sport < :$((base + n))") ]]; then
            echo "$base"
            return 0
        fi
    done
    echo "no $n free ports in a row below $low" >&2
    return 1
}
