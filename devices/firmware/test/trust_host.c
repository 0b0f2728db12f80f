/*
 * The trust runner: every trust update of testdata/trust_vectors.h (made
 * and decided by the Go side) through efsdev's trust.c
 * (efsdev_trust_update, on a fresh store holding the vectors' root), its
 * verdict and the fleet epoch it leaves compared with Go's. Built and run by TestTrustConformance under
 * AddressSanitizer and UBSan; each input in a heap buffer of its size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "efsdev.h"
#include "../testdata/trust_vectors.h"

#include "check.h"

int main(void)
{
	static efsdev_trust t;

	for (size_t i = 0; i < EFS_TUPDATES_N; i++) {
		const efs_tupdate *v = &efs_tupdates[i];
		efsdev_trust_counts c;
		const char *why = "";
		size_t n;
		uint8_t *in = make_blob(v->in.pre, v->in.pre_n, v->in.fill, v->in.fill_n, v->in.post, v->in.post_n, &n);
		int rc;

		CHECK(efsdev_trust_init_point(&t, efs_troot_point, efs_troot_kid, "") == 0, "root");
		rc = efsdev_trust_update(&t, in, n, 0, &c, &why);
		CHECK((rc == 0) == v->ok, "trust %s: Go %s, C %s (%s)", v->name, v->ok ? "takes it" : "refuses it",
			rc == 0 ? "takes it" : "refuses it", why);
		CHECK(t.epoch == (rc == 0 ? v->epoch : 0), "trust %s: epoch %llu, Go %llu", v->name, (unsigned long long)t.epoch,
			(unsigned long long)v->epoch);
		efsdev_trust_free(&t);
		free(in);
	}
	printf("%d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
