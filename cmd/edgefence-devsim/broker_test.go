package main

import (
	"testing"

	"github.com/edgefence/edgefence/internal/sandbox"
)

// startBroker runs an in-process MQTT v5 broker (sandbox, mochi) on a free
// local port until the test ends and returns its URL.
func startBroker(tb testing.TB) string {
	tb.Helper()
	b, err := sandbox.StartBroker(sandbox.BrokerConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	return b.URL()
}
