package modbus

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Bus's goroutines (its owner, a serial reader, a connection's
// reader) end with Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
