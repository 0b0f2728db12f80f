/* Host run of verify.c against Debian's libmbedcrypto: correctness (the
 * Go-signed vector verifies, a flipped byte does not) and time per verify. */
#include <stdio.h>
#include <time.h>

int verify_once(int flip);

int main(void)
{
	struct timespec a, b;
	int i, n = 2000;

	if (verify_once(0) != 0 || verify_once(1) == 0) {
		fprintf(stderr, "vector: valid signature refused or forged one accepted\n");
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (i = 0; i < n; i++)
		if (verify_once(0) != 0)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("host mbedTLS ES256 verify: %.1f us/op (%d ops)\n",
	       ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n / 1e3, n);
	return 0;
}
