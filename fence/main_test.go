package fence_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. A Table starts
// none of its own; bbolt runs each group commit on a goroutine that ends
// with the commit.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
