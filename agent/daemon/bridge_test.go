package daemon

import (
	"testing"

	"github.com/edgefence/edgefence/agent"
	"github.com/edgefence/edgefence/agent/bridge"
)

// The bridge maps the twin reconciler's commands through device profiles:
// its kind must be the agent's.
func TestTwinSetKindMatches(t *testing.T) {
	if bridge.KindTwinSet != agent.KindTwinSet {
		t.Fatalf("bridge.KindTwinSet %q, agent.KindTwinSet %q", bridge.KindTwinSet, agent.KindTwinSet)
	}
}
