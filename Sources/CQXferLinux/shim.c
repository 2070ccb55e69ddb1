// Checks, at compile time, that CQXferLinux.h agrees with the kernel's headers.
#define _GNU_SOURCE  // fallocate, SEEK_DATA, SEEK_HOLE
#include <fcntl.h>
#include <unistd.h>
#include "CQXferLinux.h"
#include <stddef.h>
#include <linux/tcp.h>

_Static_assert(sizeof(cqxfer_tcp_info) == sizeof(struct tcp_info), "tcp_info size");
_Static_assert(offsetof(cqxfer_tcp_info, tcpi_rtt) == offsetof(struct tcp_info, tcpi_rtt), "tcpi_rtt");
_Static_assert(offsetof(cqxfer_tcp_info, tcpi_delivery_rate) == offsetof(struct tcp_info, tcpi_delivery_rate), "delivery_rate");
_Static_assert(offsetof(cqxfer_tcp_info, tcpi_bytes_received) == offsetof(struct tcp_info, tcpi_bytes_received), "bytes_received");
_Static_assert(TCP_NODELAY == 1 && TCP_KEEPIDLE == 4 && TCP_KEEPINTVL == 5 && TCP_KEEPCNT == 6, "keepalive options");
_Static_assert(TCP_INFO == 11 && TCP_CONGESTION == 13 && TCP_NOTSENT_LOWAT == 25, "tcp options");
_Static_assert(TCP_USER_TIMEOUT == 18, "user timeout option");

int cqxfer_punch_hole(int fd, int64_t offset, int64_t length) {
	return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}

int64_t cqxfer_seek_data(int fd, int64_t offset) { return lseek(fd, offset, SEEK_DATA); }
int64_t cqxfer_seek_hole(int fd, int64_t offset) { return lseek(fd, offset, SEEK_HOLE); }
