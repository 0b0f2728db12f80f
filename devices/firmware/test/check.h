/*
 * What the host runners share (test/host.c, test/fw_host.c): the CHECK
 * counter and the CBOR heads they write their commands with.
 */
#ifndef EFS_TEST_CHECK_H
#define EFS_TEST_CHECK_H

#include <stdio.h>
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
