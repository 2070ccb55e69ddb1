// Linux facts (sockets, malloc) the Glibc module does not expose.
#ifndef CQXFERLINUX_H
#define CQXFERLINUX_H

#include <malloc.h>
#include <stdint.h>

/// The kernel's `struct tcp_info` (linux/tcp.h, kernel 6.x layout), which is newer than
/// glibc's copy in netinet/tcp.h and carries `tcpi_delivery_rate`. Declared here because
/// linux/tcp.h clashes with glibc's header inside one Clang module; shim.c checks the layout
/// against the kernel header at compile time. Older kernels fill a prefix; the rest stays 0.
typedef struct cqxfer_tcp_info {
	uint8_t	tcpi_state;
	uint8_t	tcpi_ca_state;
	uint8_t	tcpi_retransmits;
	uint8_t	tcpi_probes;
	uint8_t	tcpi_backoff;
	uint8_t	tcpi_options;
	uint8_t	tcpi_snd_wscale : 4, tcpi_rcv_wscale : 4;
	uint8_t	tcpi_delivery_rate_app_limited:1, tcpi_fastopen_client_fail:2;

	uint32_t	tcpi_rto;
	uint32_t	tcpi_ato;
	uint32_t	tcpi_snd_mss;
	uint32_t	tcpi_rcv_mss;

	uint32_t	tcpi_unacked;
	uint32_t	tcpi_sacked;
	uint32_t	tcpi_lost;
	uint32_t	tcpi_retrans;
	uint32_t	tcpi_fackets;

	/* Times. */
	uint32_t	tcpi_last_data_sent;
	uint32_t	tcpi_last_ack_sent;     /* Not remembered, sorry. */
	uint32_t	tcpi_last_data_recv;
	uint32_t	tcpi_last_ack_recv;

	/* Metrics. */
	uint32_t	tcpi_pmtu;
	uint32_t	tcpi_rcv_ssthresh;
	uint32_t	tcpi_rtt;
	uint32_t	tcpi_rttvar;
	uint32_t	tcpi_snd_ssthresh;
	uint32_t	tcpi_snd_cwnd;
	uint32_t	tcpi_advmss;
	uint32_t	tcpi_reordering;

	uint32_t	tcpi_rcv_rtt;
	uint32_t	tcpi_rcv_space;

	uint32_t	tcpi_total_retrans;

	uint64_t	tcpi_pacing_rate;
	uint64_t	tcpi_max_pacing_rate;
	uint64_t	tcpi_bytes_acked;    /* RFC4898 tcpEStatsAppHCThruOctetsAcked */
	uint64_t	tcpi_bytes_received; /* RFC4898 tcpEStatsAppHCThruOctetsReceived */
	uint32_t	tcpi_segs_out;	     /* RFC4898 tcpEStatsPerfSegsOut */
	uint32_t	tcpi_segs_in;	     /* RFC4898 tcpEStatsPerfSegsIn */

	uint32_t	tcpi_notsent_bytes;
	uint32_t	tcpi_min_rtt;
	uint32_t	tcpi_data_segs_in;	/* RFC4898 tcpEStatsDataSegsIn */
	uint32_t	tcpi_data_segs_out;	/* RFC4898 tcpEStatsDataSegsOut */

	uint64_t   tcpi_delivery_rate;

	uint64_t	tcpi_busy_time;      /* Time (usec) busy sending data */
	uint64_t	tcpi_rwnd_limited;   /* Time (usec) limited by receive window */
	uint64_t	tcpi_sndbuf_limited; /* Time (usec) limited by send buffer */

	uint32_t	tcpi_delivered;
	uint32_t	tcpi_delivered_ce;

	uint64_t	tcpi_bytes_sent;     /* RFC4898 tcpEStatsPerfHCDataOctetsOut */
	uint64_t	tcpi_bytes_retrans;  /* RFC4898 tcpEStatsPerfOctetsRetrans */
	uint32_t	tcpi_dsack_dups;     /* RFC4898 tcpEStatsStackDSACKDups */
	uint32_t	tcpi_reord_seen;     /* reordering events seen */

	uint32_t	tcpi_rcv_ooopack;    /* Out-of-order packets received */

	uint32_t	tcpi_snd_wnd;	     /* peer's advertised receive window after
				      * scaling (bytes)
				      */
} cqxfer_tcp_info;

/// Congestion-control names are at most this long, NUL included (TCP_CA_NAME_MAX).
#define CQXFER_TCP_CA_NAME_MAX 16

// Socket option numbers from linux/tcp.h (stable kernel ABI).
static inline int cqxfer_opt_tcp_nodelay(void) { return 1; }
static inline int cqxfer_opt_tcp_keepidle(void) { return 4; }
static inline int cqxfer_opt_tcp_keepintvl(void) { return 5; }
static inline int cqxfer_opt_tcp_keepcnt(void) { return 6; }
static inline int cqxfer_opt_tcp_info(void) { return 11; }
static inline int cqxfer_opt_tcp_user_timeout(void) { return 18; }
static inline int cqxfer_opt_tcp_congestion(void) { return 13; }
static inline int cqxfer_opt_tcp_notsent_lowat(void) { return 25; }

/// Gives the free pages of every malloc arena back to the system (`malloc_trim(0)`); 1 if any went.
static inline int cqxfer_malloc_trim(void) { return malloc_trim(0); }

/// Caps glibc's malloc arenas (`mallopt(M_ARENA_MAX, count)`); 1 on success.
static inline int cqxfer_limit_malloc_arenas(int count) { return mallopt(M_ARENA_MAX, count); }

/// Serves blocks below `mmap_threshold` bytes from the heap and returns freed heap memory to the
/// system only past `trim_threshold` (`mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD)`); 1 on success.
static inline int cqxfer_keep_freed_blocks(int mmap_threshold, int trim_threshold) {
    return mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 && mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1;
}

/// Frees the blocks of `[offset, offset + length)` of a file and keeps its size
/// (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`, a GNU extension); 0 on success.
int cqxfer_punch_hole(int fd, int64_t offset, int64_t length);

/// The offset of the first data (`lseek(SEEK_DATA)`) or hole (`lseek(SEEK_HOLE)`, GNU
/// extensions) at or after `offset`; -1 with errno set (ENXIO: none past `offset`).
int64_t cqxfer_seek_data(int fd, int64_t offset);
int64_t cqxfer_seek_hole(int fd, int64_t offset);

#endif
