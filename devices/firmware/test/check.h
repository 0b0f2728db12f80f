/*
 * What the host runners share (test/host.c, test/fw_host.c): the CHECK
 * counter and the CBOR heads they write their commands with.
 */
#ifndef EFS_TEST_CHECK_H
#define EFS_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static int checks;

#define CHECK(cond, ...)                                   \
	do {                                               \
		checks++;                                  \
		if (!(cond)) {                             \
			failures++;                        \
			printf("FAIL %s:%d: ", __FILE__, __LINE__); \
			printf(__VA_ARGS__);               \
			printf("\n");                      \
		}                                          \
	} while (0)

/* make_blob returns a heap copy of a generated vector's blob (pre, fill_n
 * bytes of fill, post) of exactly its size, so that a read past it is
 * caught; its size in *n. Freed by the caller. */
static inline uint8_t *make_blob(const uint8_t *pre, size_t pre_n, uint8_t fill, size_t fill_n, const uint8_t *post,
	size_t post_n, size_t *n)
{
	uint8_t *p;

	*n = pre_n + fill_n + post_n;
	if ((p = malloc(*n ? *n : 1)) == NULL) {
		abort();
	}
	if (pre_n) {
		memcpy(p, pre, pre_n);
	}
	memset(p + pre_n, fill, fill_n);
	if (post_n) {
		memcpy(p + pre_n + fill_n, post, post_n);
	}
	return p;
}

/* put_head writes a CBOR head (shortest form) to p; its length. */
static inline size_t put_head(uint8_t *p, unsigned major, uint64_t v)
{
	size_t n = v < 24 ? 1 : v <= 0xff ? 2 : v <= 0xffff ? 3 : v <= 0xffffffffu ? 5 : 9;

	p[0] = (uint8_t)(major << 5 | (n == 1 ? v : n == 2 ? 24 : n == 3 ? 25 : n == 5 ? 26 : 27));
	for (size_t k = 1; k < n; k++) {
		p[k] = (uint8_t)(v >> (8 * (n - 1 - k)));
	}
	return n;
}

/* put_str writes a byte (major 2) or text (3) string. */
static inline size_t put_str(uint8_t *p, unsigned major, const void *s, size_t n)
{
	size_t h = put_head(p, major, n);

	memcpy(p + h, s, n);
	return h + n;
}

static inline size_t put_text(uint8_t *p, const char *s)
{
	return put_str(p, 3, s, strlen(s));
}

#endif
